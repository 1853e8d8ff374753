"""Moving one pin of a recipe in place: `lock --upgrade-package NAME[==VERSION]` (uv's word).

    parse_upgrade("sglang==0.5.22")  -> ("sglang", "0.5.22"); "sglang" -> ("sglang", None): the newest that resolves
    set_pin(text, path, name, version) -> the recipe's text with [python].requirements' entry for name
                                        pinned ==version (None: unpinned), every other byte as it was

The edit replaces one TOML string and is checked by parsing both texts: the new recipe must mean
exactly the old one with that entry changed, so comments, order and layout are kept, and an edit
that would touch anything else (a comment holding the same text, say) is refused, never guessed at.
"""

from __future__ import annotations

import json
import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagebuild.errors import RecipeError
from imagebuild.recipe.reader import parse_toml

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:==(\S+))?$")


def parse_upgrade(spec: str) -> tuple[str, str | None]:
    """NAME or NAME==VERSION, as --upgrade-package takes it."""
    match = _NAME.match(spec.strip())
    if not match:
        raise ValueError(f"{spec!r} is not NAME or NAME==VERSION (e.g. sglang or sglang==0.5.22)")
    name, version = match.groups()
    if version is not None:
        try:
            Version(version)
        except InvalidVersion:
            raise ValueError(f"{spec!r}: {version!r} is not a version") from None
    return canonicalize_name(name), version


_HEAD = re.compile(r"^(\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[^\]]*\])?\s*)(.*?)(\s*)$", re.S)


def pinned(requirement: str, version: str | None) -> str:
    """The requirement with its version specifier replaced by ==version (None: none); its name, extras
    and markers kept as written."""
    req = Requirement(requirement)
    if req.url:
        raise ValueError(f"{requirement!r} names a URL, not a version")
    head, sep, marker = requirement.partition(";")
    match = _HEAD.match(head)
    if match:
        spec = f"=={version}" if version else ""
        text = match.group(1).rstrip() + spec + (match.group(3) if sep else "") + sep + marker
        try:
            again = Requirement(text)
            if (again.name, again.extras, str(again.specifier), str(again.marker)) == (
                    req.name, req.extras, spec, str(req.marker)):
                return text
        except InvalidRequirement:
            pass
    req.specifier = SpecifierSet(f"=={version}" if version else "")
    return str(req)


def _literals(text: str, value: str) -> list[tuple[int, int]]:
    """Where `value` is written as a TOML string (basic or literal) in text: (start, end) of each."""
    forms = [json.dumps(value, ensure_ascii=False)] + ([f"'{value}'"] if "'" not in value else [])
    found = []
    for written in forms:
        start = text.find(written)
        while start != -1:
            found.append((start, start + len(written)))
            start = text.find(written, start + 1)
    return sorted(found)


def set_pin(text: str, path, name: str, version: str | None) -> str:
    doc = parse_toml(text, path)
    python = doc.get("python") if isinstance(doc.get("python"), dict) else {}
    requirements = python.get("requirements") if isinstance(python.get("requirements"), list) else []
    target = canonicalize_name(name)
    index = None
    for i, entry in enumerate(requirements):
        try:
            if isinstance(entry, str) and canonicalize_name(Requirement(entry).name) == target:
                index = i
                break
        except InvalidRequirement:
            continue
    if index is None:
        raise RecipeError(path, f"{name} is not in [python].requirements", key="python.requirements",
                          hint=f"add it there (\"{name}==VERSION\") to pin it; a package that only another one "
                               "requires moves with that one")
    old = requirements[index]
    try:
        new = pinned(old, version)
    except ValueError as err:
        raise RecipeError(path, str(err), key=f"python.requirements[{index}]") from None
    if new == old:
        return text
    expected = dict(doc, python=dict(python, requirements=[*requirements[:index], new, *requirements[index + 1:]]))
    for start, end in _literals(text, old):
        quote = text[start]
        literal = f"'{new}'" if quote == "'" and "'" not in new else json.dumps(new, ensure_ascii=False)
        candidate = text[:start] + literal + text[end:]
        try:
            if parse_toml(candidate, path) == expected:
                return candidate
        except RecipeError:
            continue
    raise RecipeError(path, f"python.requirements[{index}] ({old!r}) is written in a form this edit does not "
                            "know, so it is left as it is", key=f"python.requirements[{index}]",
                      hint=f"write it as \"{new}\" by hand")
