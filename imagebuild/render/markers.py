"""The marker each RUN step render writes carries, and a failed build step explained from it.

A marker is the step's first shell command, a no-op: `: imagebuild-step=install layer=framework && ...`.
The build tools print a failed step's instruction (engine/build_log.py reads it from their output), so
the marker says which step of ours failed and for what (a layer, a patch) without reading the
Dockerfile's text: marker() writes it and parse_marker() reads it, and nothing else does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from imagebuild.errors import BuildFailed
from imagebuild.lock import Lock
from imagebuild.recipe.model import Recipe

WORD = "imagebuild-step"
# The step kinds render writes, and the fields each carries.
VENV = "venv"  # the virtual environment made
INSTALL = "install"  # layer=NAME, prune=yes when the step also applies [[prune]]
LINKS = "links"  # layer=NAME: the toolchain's symlinks, the libraries' -lNAME names among them
PATCH = "patch"  # package=NAME file=FILE: one [[patches]] entry applied
AOT = "aot"  # the [aot] kernels built
KINDS = (VENV, INSTALL, LINKS, PATCH, AOT)

_KIND = r"[a-z][a-z0-9-]*"
_KEY = r"[a-z][a-z0-9_]*"
_VALUE = r"[A-Za-z0-9][A-Za-z0-9._+-]*"  # no shell metacharacter: the shell passes it to `:` as it is
_MARKER = re.compile(rf"(?:^|\s):[ \t]+{WORD}=({_KIND})((?:[ \t]+{_KEY}={_VALUE})*)(?=\s|$)")
_FIELD = re.compile(rf"({_KEY})=({_VALUE})")


@dataclass(frozen=True)
class Marker:
    kind: str
    fields: dict[str, str] = field(default_factory=dict)


def marker(kind: str, **fields: str) -> str:
    """The shell no-op that opens a step: `: imagebuild-step=KIND key=value ...`. A value must be one
    word without shell metacharacters (a layer, a package or a file name); anything else is refused."""
    if not re.fullmatch(_KIND, kind):
        raise ValueError(f"a step kind is a lower-case word: {kind!r}")
    words = [f"{WORD}={kind}"]
    for key, value in fields.items():
        if not re.fullmatch(_KEY, key) or not re.fullmatch(_VALUE, str(value)):
            raise ValueError(f"a marker field is key=word: {key}={value!r}")
        words.append(f"{key}={value}")
    return ": " + " ".join(words)


def parse_marker(text: str) -> Marker | None:
    """The marker in a step's instruction as a build tool printed it, or None when it carries none
    (a COPY, a step of someone else's). Never raises."""
    match = _MARKER.search(text) if isinstance(text, str) else None
    if match is None:
        return None
    return Marker(match.group(1), dict(_FIELD.findall(match.group(2))))


def explain(failure: BuildFailed, recipe: Recipe, locked: Lock) -> BuildFailed:
    """A failed step of our own Dockerfile said in the recipe's words: which patch, prune or layer."""
    step = failure.step
    if step is None:
        return failure
    found = parse_marker(step.instruction) or Marker("")
    layer = found.fields.get("layer", "?")
    if found.kind == PATCH:
        package = found.fields.get("package", "?")
        what = (f"the patch {_patch_file(found, recipe, locked)} does not apply to {package} "
                f"{locked.packages.get(package, '?')}")
        hint = f"`imagebuild patches {recipe.path}` names the file and hunk without building"
    elif found.kind == INSTALL and found.fields.get("prune") == "yes":
        what = f"[[prune]] failed in the {layer} layer"
        hint = "a glob must match files the distribution installs (its RECORD); `imagebuild render` shows the step"
    elif found.kind == INSTALL:
        what = f"installing the {layer} layer failed"
        hint = "the lock's wheels did not install on the base: relock (`imagebuild lock`) or check the base"
    else:
        what = f"build step {step.step} failed"
        hint = "`imagebuild render RECIPE -o DIR` writes the Dockerfile to read the step in"
    text = step.instruction
    instruction = text if len(text) <= 200 else text[:197] + "..."
    return BuildFailed(f"{what}: {step.cause}\n  step {step.step}: {instruction}\n  hint: {hint}\n"
                       f"no image was tagged.", step=step)


def _patch_file(found: Marker, recipe: Recipe, locked: Lock) -> str:
    """The recipe's patch file the step applied: the lock lists the recipe's patches in its order."""
    for source, patch in zip(recipe.patches, locked.patches):
        if patch.file == found.fields.get("file"):
            return str(source.path)
    package = found.fields.get("package")
    return next((str(p.path) for p in recipe.patches if p.package == package), "the recipe's patch")
