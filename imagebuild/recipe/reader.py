"""TOML plumbing for recipes: read the source, parse it, and read typed values with located errors.

tomllib returns values without positions, so `locate` scans the source: it follows `[table]` and
`[[array]]` headers and `key = ` lines (bare, quoted and dotted keys), skipping the inside of
multi-line arrays and strings. A key it cannot find gets the line of its nearest enclosing key, or none.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tomllib
from collections.abc import Iterator, Sequence
from datetime import date, datetime, time, timezone
from pathlib import Path

from imagebuild.errors import RecipeError

Key = tuple[str | int, ...]  # ("patches", 0, "file"): table names, keys, and list indices

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = re.compile(r"""[ \t]*([A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')[ \t]*""")
_TOML_POSITION = re.compile(
    r"(?P<message>.*) \(at (?:line (?P<line>\d+), column (?P<column>\d+)|end of document)\)", re.DOTALL)


def read_source(path: Path) -> str:
    """The text of a recipe file; a missing file, a folder or bytes that are not UTF-8 raise RecipeError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(path, "no such recipe file") from None
    except IsADirectoryError:
        raise RecipeError(path, "is a directory, not a recipe file", hint="name the .toml file inside it") from None
    except (OSError, ValueError) as err:  # permissions, a NUL byte in the name, ...
        raise RecipeError(path, f"cannot read the recipe: {getattr(err, 'strerror', None) or err}") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - data.rfind(b"\n", 0, err.start)
        raise RecipeError(path, f"is not UTF-8 text (byte 0x{data[err.start]:02x})",
                          key=syntax_key(data.decode("utf-8", "replace"), line), line=line, column=column,
                          hint="save the recipe as UTF-8") from None


_SYNTAX_HINT = "docs/recipes.md shows a whole recipe; TOML strings need quotes, lists [...], tables [name]"
_SYNTAX_HINTS = (
    ("Illegal character '\\n'", "close the string's quote on the same line (or use triple quotes for several lines)"),
    ("Invalid value", 'give the key a value: "a string", a number, true or false, ["a", "list"] or { a = "table" }'),
    ("Cannot overwrite a value", "the key is set twice: keep one of the two"),
    ("Cannot declare", "the table is declared twice: merge the two into one"),
    ("Expected '=' after a key", 'write key = value; a key with spaces or dots in it needs quotes: "a.b" = 1'),
    ("Unclosed array", "close the list with ] (items are separated by commas)"),
)


def syntax_hint(message: str) -> str:
    return next((hint for start, hint in _SYNTAX_HINTS if message.startswith(start)), _SYNTAX_HINT)


def syntax_key(text: str, line: int) -> str | None:
    """The key a syntax error's line sets (under the table above it), when that line starts like
    `key = `; None when it does not (a header, a continued list)."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    match = re.match(r"\s*([A-Za-z0-9_-]+(?:\s*\.\s*[A-Za-z0-9_-]+)*)\s*=", lines[line - 1])
    if not match:
        header = re.match(r"\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]", lines[line - 1])
        return header.group(1) if header else None
    table = ""
    for previous in reversed(lines[:line - 1]):
        header = re.match(r"\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]", previous)
        if header:
            table = header.group(1) + "."
            break
    return table + re.sub(r"\s+", "", match.group(1))


def parse_toml(text: str, path: Path) -> dict:
    """tomllib.loads, with every failure turned into a RecipeError at the line tomllib names."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = _TOML_POSITION.fullmatch(str(err))
        if not match:
            raise RecipeError(path, f"invalid TOML: {err}", hint=_SYNTAX_HINT) from None
        if match["line"]:
            line, column = int(match["line"]), int(match["column"])
        else:
            line, column = text.count("\n") + 1, len(text) - text.rfind("\n")
        raise RecipeError(path, f"invalid TOML: {match['message']}", key=syntax_key(text, line), line=line,
                          column=column, hint=syntax_hint(match["message"])) from None
    except RecursionError:
        raise RecipeError(path, "invalid TOML: values nested too deeply to read") from None
    except ValueError as err:  # an integer longer than Python converts (4300 digits)
        raise RecipeError(path, f"invalid TOML: {str(err).split(':')[0]}") from None


class RecipeReader:
    """Reads typed values out of a parsed recipe; a failure is one RecipeError at the key's line."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.text = text

    def error(self, key: Key, message: str, hint: str | None = None) -> RecipeError:
        hint = hint or f"docs/recipes.md gives the type and rule of {dotted(key[:1]) or 'each table'}'s keys"
        return RecipeError(self.path, message, key=dotted(key) or None, line=locate(self.text, key), hint=hint)

    def known_keys(self, table: dict, key: Key, known: Sequence[str], what: str = "key") -> None:
        for name in table:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known {what}s: {', '.join(known)}"
                where = f" in [{dotted(key)}]" if key else ""
                raise self.error(key + (name,), f"unknown {what} {show(name)}{where}", hint)

    def table(self, parent: dict, key: Key, *, required: bool = False, example: str = "") -> dict | None:
        value = parent.get(key[-1])
        if value is None and required:
            raise self.error(key, f"missing required table [{dotted(key)}]", hint=f"add [{dotted(key)}] {example}")
        if value is not None and not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {toml_kind(value)}")
        return value

    def tables(self, parent: dict, name: str, known: Sequence[str]) -> Iterator[tuple[Key, dict]]:
        """Each table of the array of tables [[name]] with its key path, its keys checked against
        known; nothing when the array is absent."""
        items = parent.get(name)
        if items is None:
            return
        if not isinstance(items, list):
            raise self.error((name,), f"expected a list of tables ([[{name}]]), got {toml_kind(items)}")
        for index, item in enumerate(items):
            key = (name, index)
            if not isinstance(item, dict):
                raise self.error(key, f"expected a table, got {toml_kind(item)}")
            self.known_keys(item, key, known)
            yield key, item

    def string(self, parent: dict, key: Key, *, required: bool = False, example: str = "") -> str | None:
        value = self._value(parent, key, required, example)
        if value is None or isinstance(value, str):
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        raise self.error(key, f"expected a string, got {toml_kind(value)}",
                         hint="put the value in quotes" if number else None)

    def strings(self, parent: dict, key: Key, *, required: bool = False, example: str = "") -> list[str]:
        """A list of strings; `required` also means not empty."""
        value = self._value(parent, key, required, example)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of strings, got {toml_kind(value)}",
                             hint=f"write {key[-1]} = {example or '[' + chr(34) + '...' + chr(34) + ']'}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(key + (index,), f"expected a string, got {toml_kind(item)}",
                                 hint="put each item in quotes")
        if required and not value:
            raise self.error(key, "must not be empty", hint=f"e.g. {key[-1]} = {example}")
        return value

    def _value(self, parent: dict, key: Key, required: bool, example: str):
        if key[-1] not in parent and required:
            raise self.error(key, f"missing required key {key[-1]}", hint=f"add {key[-1]} = {example}")
        return parent.get(key[-1])


def key_path(text: str) -> Key:
    """"patches[0].file" -> ("patches", 0, "file"): the inverse of dotted() for bare keys."""
    parts: list[str | int] = []
    for piece in text.split("."):
        name, _, rest = piece.partition("[")
        if name:
            parts.append(name)
        for index in re.findall(r"(\d+)\]", "[" + rest if rest else ""):
            parts.append(int(index))
    return tuple(parts)


def toml_kind(value) -> str:
    """The TOML name of a value's type, for messages."""
    kinds = [(bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"), (datetime, "datetime"),
             (date, "date"), (time, "time"), (list, "list"), (dict, "table")]
    return next((kind for cls, kind in kinds if isinstance(value, cls)), type(value).__name__)


def show(value: str) -> str:
    """A value quoted for a message, cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:70] + "…" + text[-8:]


def dotted(key: Key) -> str:
    """("patches", 0, "file") -> "patches[0].file"; keys that are not bare get quotes."""
    text = ""
    for part in key:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else json.dumps(part, ensure_ascii=False)
            text += f".{name}" if text else name
    return text


def locate(text: str, key: Key) -> int | None:
    """The 1-based line that sets `key`, else that of its nearest enclosing key; None if neither."""
    statements = list(_statements(text))
    for end in range(len(key), 0, -1):
        target = key[:end]
        for line_no, path in statements:
            if path[:end] == target:
                return line_no
    return None


def _statements(text: str) -> Iterator[tuple[int, Key]]:
    """(line number, full key path) for each header and `key =` line, outside multi-line values."""
    table: Key = ()
    arrays: dict[Key, int] = {}  # array-of-tables path -> elements seen so far
    depth, quote = 0, None  # open brackets and open multi-line string carried from earlier lines
    for line_no, line in enumerate(text.split("\n"), start=1):
        if depth or quote:
            depth, quote = _carry(line, 0, depth, quote)
            continue
        stripped = line.lstrip(" \t")
        start = len(line) - len(stripped)
        if stripped.startswith("[["):
            parts, _ = _parse_key(line, start + 2, "]]")
            if parts:
                array = _with_indices(parts[:-1], arrays) + (parts[-1],)
                arrays[array] = arrays.get(array, 0) + 1
                table = array + (arrays[array] - 1,)
                yield line_no, table
        elif stripped.startswith("["):
            parts, _ = _parse_key(line, start + 1, "]")
            if parts:
                table = _with_indices(parts, arrays)
                yield line_no, table
        elif stripped and not stripped.startswith("#"):
            parts, value_start = _parse_key(line, start, "=")
            if parts:
                yield line_no, table + parts
                depth, quote = _carry(line, value_start, 0, None)


def _with_indices(parts: tuple[str, ...], arrays: dict[Key, int]) -> Key:
    """A header's path with the current index after each array of tables it passes through."""
    path: Key = ()
    for part in parts:
        path += (part,)
        if path in arrays:
            path += (arrays[path] - 1,)
    return path


def _parse_key(line: str, pos: int, end: str) -> tuple[tuple[str, ...] | None, int]:
    """The parts of the key starting at `pos` and the position after `end`; None if no such key."""
    parts = []
    while match := _KEY_PART.match(line, pos):
        parts.append(_unquote(match.group(1)))
        pos = match.end()
        if not line.startswith(".", pos):
            break
        pos += 1
    if parts and line.startswith(end, pos) and None not in parts:
        return tuple(parts), pos + len(end)
    return None, pos


def _unquote(part: str) -> str | None:
    if part.startswith("'"):
        return part[1:-1]
    if part.startswith('"'):
        try:
            return tomllib.loads(f"k = {part}")["k"]
        except tomllib.TOMLDecodeError:
            return None
    return part


def _carry(line: str, pos: int, depth: int, quote: str | None) -> tuple[int, str | None]:
    """Bracket depth and open multi-line string after reading `line` from `pos`."""
    while pos < len(line):
        if quote:
            if quote == '"""' and line[pos] == "\\":
                pos += 2
            elif line.startswith(quote, pos):
                pos += 3
                while pos < len(line) and line[pos] == quote[0]:  # up to two quotes may end it
                    pos += 1
                quote = None
            else:
                pos += 1
            continue
        char = line[pos]
        if char == "#":
            break
        if line.startswith('"""', pos) or line.startswith("'''", pos):
            quote, pos = line[pos:pos + 3], pos + 3
        elif char == '"':
            pos += 1
            while pos < len(line) and line[pos] != '"':
                pos += 2 if line[pos] == "\\" else 1
            pos += 1
        elif char == "'":
            close = line.find("'", pos + 1)
            pos = close + 1 if close >= 0 else len(line)
        else:
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth = max(depth - 1, 0)
            pos += 1
    return depth, quote


def _plain(value):
    """A parsed TOML value as JSON data that keeps TOML's types apart (1, 1.0, "1", a date)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, datetime):
        if value.tzinfo is not None:  # one instant, whatever offset it was written with
            return {"datetime": value.astimezone(timezone.utc).isoformat()}
        return {"local-datetime": value.isoformat()}
    if isinstance(value, date):
        return {"date": value.isoformat()}
    if isinstance(value, time):
        return {"time": value.isoformat()}
    if isinstance(value, float):
        return {"float": repr(value)}
    return value  # str, int, bool


def meaning_sha256(data: dict) -> str:
    """sha256 of what a parsed recipe means: comments, whitespace, quoting, key order and number
    spelling (0x10 vs 16) do not change it; any change of a value, key or array order does."""
    text = json.dumps(_plain(data), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
