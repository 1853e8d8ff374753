"""The recipe checksum a lock records is over what the recipe means, not its bytes: comments,
blank lines, spacing, quoting, key order and table style leave it alone; any changed value changes it."""

from __future__ import annotations

import random
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.recipe.reader import meaning_sha256

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted([*REPO.glob("recipes/*.toml"), *REPO.glob("tests/fixtures/recipes/*.toml")])
_KEY_LINE = re.compile(r'^(\s*[A-Za-z0-9_][A-Za-z0-9_.-]*)\s*=\s*(.*)$')
_SIMPLE_STRING = re.compile(r'"([^"\\\']*)"')


def digest(text: str) -> str:
    return meaning_sha256(tomllib.loads(text))


def reformat(text: str, seed: int) -> str:
    """The same recipe written differently: comments, blank lines, spacing around =, quoting."""
    rng = random.Random(seed)
    out = []
    for line in text.splitlines():
        if rng.random() < 0.3:
            out.append(rng.choice(["", "# a comment [x] = 1", "   ", "#"]))
        match = _KEY_LINE.match(line)
        if match and rng.random() < 0.5:
            line = f"{match.group(1)}{' ' * rng.randint(0, 3)}={' ' * rng.randint(0, 3)}{match.group(2)}"
        if rng.random() < 0.5:  # a basic string without escapes is the same as a literal one
            line = _SIMPLE_STRING.sub(lambda m: f"'{m.group(1)}'", line)
        if line.strip() and not line.rstrip().endswith(("=", "\\")) and rng.random() < 0.3:
            line += "   # trailing comment"
        out.append(line)
    return "\n".join(out) + "\n" * rng.randint(0, 2)


def shuffled(data, rng: random.Random):
    """The same tables with their keys in another order (arrays keep theirs: order is meaning)."""
    if isinstance(data, dict):
        keys = list(data)
        rng.shuffle(keys)
        return {key: shuffled(data[key], rng) for key in keys}
    if isinstance(data, list):
        return [shuffled(item, rng) for item in data]
    return data


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_formatting_leaves_the_checksum_alone(recipe, seed):
    text = recipe.read_text()
    changed = reformat(text, seed)
    assert tomllib.loads(changed) == tomllib.loads(text)  # the transformation itself keeps the meaning
    assert digest(changed) == digest(text)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_key_order_and_table_style_leave_the_checksum_alone(recipe, seed):
    data = tomllib.loads(recipe.read_text())
    rewritten = tomli_w.dumps(shuffled(data, random.Random(seed)), multiline_strings=False)
    assert digest(rewritten) == digest(recipe.read_text())


def leaves(data, path=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, path + (key,))
    elif isinstance(data, list) and data and not all(isinstance(item, dict) for item in data):
        yield path, data
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, path + (index,))
    else:
        yield path, data


def changed_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value[1:] if len(value) > 1 else value + ["x"]
    return "x"  # a date or datetime becomes a string: a change of type is a change of meaning


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_changed_value_changes_the_checksum(recipe):
    data = tomllib.loads(recipe.read_text())
    before = meaning_sha256(data)
    paths = list(leaves(data))
    assert len(paths) > 5
    for path, value in paths:
        copy = tomllib.loads(recipe.read_text())
        target = copy
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = changed_value(value)
        assert meaning_sha256(copy) != before, path


def test_array_order_and_types_are_meaning():
    assert digest('a = ["x", "y"]') != digest('a = ["y", "x"]')
    assert digest("a = 1") != digest("a = 1.0") != digest('a = "1"')
    assert digest("a = 0x10") == digest("a = 16") and digest("a = 1e2") == digest("a = 100.0")
    assert digest("t = 2026-11-20T00:00:00Z") == digest("t = 2026-11-20T01:00:00+01:00")
    assert digest("t = 2026-11-20T00:00:00Z") != digest("t = 2026-11-20T00:00:00")  # local time: no instant
    assert digest("[a]\nb = 1") == digest("a = { b = 1 }") == digest("a.b = 1")
