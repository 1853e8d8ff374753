"""Just enough C++ reading to take facts from the headers a wheel ships: comments out, balanced
brackets, top-level commas and statements, template parameter lists. Never raises on any text.
"""

from __future__ import annotations

import re

_OPEN, _CLOSE = "([{", ")]}"
_TEMPLATE_PARAMETER = re.compile(
    r"(?P<kind>typename|class|(?:const\s+)?[A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)\s+(?P<name>[A-Za-z_]\w*)"
    r"\s*(?:=\s*(?P<default>.+))?", re.S)


def strip_comments(text: str) -> str:
    """The text with // and /* */ comments blanked out; string and character literals kept whole."""
    out, i, n = [], 0, len(text)
    while i < n:
        char = text[i]
        if char in "\"'":
            end = _literal_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            out.append(" ")
            i = n if end < 0 else end + 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _literal_end(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote and text[i] != "\n":
        i += 2 if text[i] == "\\" else 1
    return min(i + 1, len(text))


def code_chars(text: str):
    """(index, char) of every character outside string and character literals."""
    i = 0
    while i < len(text):
        if text[i] in "\"'":
            i = _literal_end(text, i)
            continue
        yield i, text[i]
        i += 1


def matching(text: str, start: int, angles: bool = False) -> int:
    """Index just past the bracket that closes text[start] (one of ([{ or < with angles), or -1."""
    opening = _OPEN + ("<" if angles else "")
    closing = _CLOSE + (">" if angles else "")
    depth = 0
    for i, char in code_chars(text[start:]):
        if char in opening:
            depth += 1
        elif char in closing:
            depth -= 1
            if depth <= 0:
                return start + i + 1 if depth == 0 else -1
    return -1


def split_top_level(text: str, separator: str = ",", angles: bool = False) -> list:
    """text split at separators outside brackets and literals, each part stripped; empty parts dropped."""
    parts, depth, start = [], 0, 0
    opening, closing = _OPEN + ("<" if angles else ""), _CLOSE + (">" if angles else "")
    for i, char in code_chars(text):
        if char in opening:
            depth += 1
        elif char in closing:
            depth = max(depth - 1, 0)
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [" ".join(part.split()) for part in parts if part.strip()]


def function_body(text: str, signature: re.Pattern) -> str | None:
    """The text between the braces of the first function whose head matches signature."""
    match = signature.search(text)
    if match is None:
        return None
    brace = text.find("{", match.end())
    end = matching(text, brace) if brace >= 0 else -1
    return text[brace + 1:end - 1] if end > 0 else None


def template_parameters(text: str, function: str) -> list | None:
    """The template parameters of the function template named function, in order, as dicts of kind, name
    and default (None when it has none); None when no such template is declared in text."""
    text = strip_comments(text)
    for match in re.finditer(r"\b" + re.escape(function) + r"\s*\(", text):
        head = text[:match.start()]
        templates = list(re.finditer(r"\btemplate\s*<", head))
        opening = templates[-1].end() - 1 if templates else -1
        end = matching(head, opening, angles=True) if opening >= 0 else -1
        if end < 0 or re.search(r"[;{}]", head[end:]):
            continue
        parameters = []
        for part in split_top_level(head[opening + 1:end - 1], angles=True):
            found = _TEMPLATE_PARAMETER.fullmatch(part)
            if found is None or "..." in part:
                return [{"kind": None, "name": None, "default": None, "text": part}]
            parameters.append({"kind": " ".join(found["kind"].split()), "name": found["name"],
                               "default": found["default"].strip() if found["default"] else None, "text": part})
        return parameters
    return None
