"""A Plan written as recipe TOML, each value with a comment saying where it came from.

Strings are written as TOML basic strings (JSON's escapes are TOML's), and outside text in a comment
(a path, a GPU's name) is kept on its line: control characters become spaces. adopt parses what this
writes with the recipe's own parser before anything is written (imagebuild.recipe.parse_recipe).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from imagebuild.adopt.plan import Pin, Plan

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
WIDTH = 44  # where comments start after a value


@dataclass(frozen=True)
class PatchEntry:
    package: str
    file: str  # relative to the recipe's folder: patches/NAME-VERSION.patch
    files: tuple[str, ...]  # the installed files it changes


def comment(text: str) -> str:
    return _CONTROL.sub(" ", str(text)).strip()


def string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _line(assignment: str, why: str = "") -> str:
    why = comment(why)
    return f"{assignment.ljust(WIDTH)}  # {why}" if why else assignment


def _array(key: str, items: Sequence[tuple[str, str]], head: str = "") -> list[str]:
    """key = [ one string a line, each with its comment ]."""
    lines = [f"# {comment(head)}"] if head else []
    if not items:
        return lines + [f"{key} = []"]
    lines.append(f"{key} = [")
    for value, why in items:
        lines.append(_line(f"  {string(value)},", why))
    return lines + ["]"]


def _pins(pins: Sequence[Pin], fallback: str) -> list[tuple[str, str]]:
    return [(pin.requirement, pin.why or fallback) for pin in pins]


def render(plan: Plan, name: str, patches: Sequence[PatchEntry] = ()) -> str:
    it = plan.inventory.interpreter
    out = [f"# Adopted by `imagebuild adopt` at {plan.exclude_newer} from {comment(plan.inventory.where)}:",
           f"# {comment(it.describe())}.",
           "# Every pin is the version installed there; see adopt's report for what was left out.", "",
           "[image]", _line(f"name = {string(name)}", "the recipe's file name"), "",
           "[base]",
           _line(f"debian = {string(plan.suite)}",
                 f"its python3 is {plan.python}, the environment's; glibc {plan.glibc}"),
           _line(f"arch = {string(plan.arch)}", f"the interpreter's machine: {plan.machine}")]
    if plan.packages:
        out.append(_line("packages = [" + ", ".join(string(p) for p, _ in plan.packages) + "]",
                         "; ".join(why for _, why in plan.packages)))
    out += ["", "[python]"]
    out += _array("requirements", _pins(plan.requirements, "nothing installed requires it"),
                  "What no other installed distribution requires, as installed:")
    out += _array("constraints", _pins(plan.constraints, "installed"),
                  "Everything else installed, as installed (each comment: what requires it):")
    if plan.exclude:
        versions = {e.name: e for e in plan.left_out}
        out += _array("exclude", [(n, f"{versions[n].version}: {versions[n].why}") for n in plan.exclude],
                      "Installed, but no index gives it again: left out of the resolve "
                      "(adopt's report says what to do):")
    if plan.extra_index_urls:
        out += _array("extra_index_urls", [(u, "--extra-index-url") for u in plan.extra_index_urls])
    out.append(_line(f"exclude_newer = {string(plan.exclude_newer)}",
                     "the time of adoption: a relock ignores what the index gets later"))
    if plan.cuda is not None:
        cuda = plan.cuda
        out += ["", "[cuda]", _line(f"toolkit = {string(cuda.toolkit)}", cuda.toolkit_from),
                _line("archs = [" + ", ".join(string(a) for a in cuda.archs) + "]", cuda.archs_from),
                _line(f"min_driver = {string(cuda.min_driver)}", cuda.min_driver_from)]
    for entry in patches:
        out += ["", "[[patches]]", _line(f"package = {string(entry.package)}", "edited by hand in the environment"),
                _line(f"file = {string(entry.file)}", "the edits: " + ", ".join(entry.files))]
    return "\n".join(out) + "\n"
