"""Every command's --help ends with real examples (imagebuild/cli/examples.py): each parses with the real
parser as the command it is listed under, and the recipes, locks and recipe images it names exist here."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest

from imagebuild.cli.app import UsageError, _parser
from imagebuild.cli.examples import EPILOG_HEAD, EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def subcommands() -> dict:
    parser = _parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return action.choices


def recipe_images() -> set[str]:
    images = set()
    for recipe in (REPO / "recipes").glob("*.toml"):
        image = tomllib.loads(recipe.read_text())["image"]
        images |= {f"{image['name']}:{image['tag']}", *(f"{image['name']}:{image['tag']}-{arch}" for arch in ("amd64", "arm64"))}
    return images


def problems(command: str, line: str) -> list[str]:
    """Why an example is not real: it does not parse as that command, or names a missing recipe or lock,
    or an image no recipe here builds."""
    words = shlex.split(line)
    if words[:2] != ["imagebuild", command]:
        return [f"does not start with 'imagebuild {command}'"]
    try:
        args = _parser().parse_args(words[1:])
    except UsageError as err:
        return [str(err)]
    found = [] if args.command == command else [f"parses as {args.command}"]
    for before, word in zip(words[1:], words[2:]):
        written = before in ("-o", "--output") and command == "adopt"  # the recipe adopt writes is new
        if word.startswith(("recipes/", "lockfiles/")) and not written and not (REPO / word).is_file():
            found.append(f"{word} is not in the repository")
        if word.startswith("imagebuild/") and word not in recipe_images():
            found.append(f"{word} is no recipe's image")
    return found


def test_every_command_has_one_or_two_examples():
    assert set(subcommands()) == set(EXAMPLES) and len(EXAMPLES) >= 15
    assert all(1 <= len(examples) <= 2 for examples in EXAMPLES.values())


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_the_help_ends_with_the_examples_and_each_is_real(command):
    text = subcommands()[command].format_help().rstrip()
    block = text[text.rindex(EPILOG_HEAD):]
    for line, what in EXAMPLES[command]:
        assert f"  {line}\n      {what}" in block  # each command line whole, never re-wrapped
        assert problems(command, line) == [], line
    assert text.endswith(EXAMPLES[command][-1][1])


@pytest.mark.parametrize("command, line, why", [
    ("build", "imagebuild build recipes/sglang-blackwell.toml --no-such-flag", "unrecognized arguments"),
    ("build", "imagebuild build recipes/no-such.toml", "recipes/no-such.toml is not in the repository"),
    ("smoke", "imagebuild smoke imagebuild/no-such:1", "is no recipe's image"),
    ("check", "imagebuild lock recipes/cuda-toolchain.toml", "does not start with 'imagebuild check'"),
    ("verify", "imagebuild verify imagebuild/cuda-toolchain:13.0", "required: --lock"),
])
def test_an_example_that_is_not_real_is_caught(command, line, why):
    found = problems(command, line)
    assert found and why in found[0], found
