"""A failed step of our own Dockerfile said in the recipe's words: which patch, prune or layer."""

from __future__ import annotations

import re

from imagebuild.errors import BuildFailed
from imagebuild.lock import Lock
from imagebuild.recipe.model import Recipe

_LAYER_FILE = re.compile(r"requirements/\d+-([a-z]+)\.txt")


def explain_build_failure(failure: BuildFailed, recipe: Recipe, locked: Lock) -> BuildFailed:
    """A failed step of our own Dockerfile said in the recipe's words: which patch, prune or layer."""
    step = failure.step
    if step is None:
        return failure
    text = step.instruction
    layer = _LAYER_FILE.search(text)
    layer = layer.group(1) if layer else "?"
    if "apply_patch.py" in text and "--package" in text:
        package = re.search(r"--package (\S+)", text).group(1)
        patch = next((str(p.path) for p in recipe.patches if p.package == package), "the recipe's patch")
        what = f"the patch {patch} does not apply to {package} {locked.packages.get(package, '?')}"
        hint = f"`imagebuild patches {recipe.path}` names the file and hunk without building"
    elif "prune.py" in text:
        what = f"[[prune]] failed in the {layer} layer"
        hint = "a glob must match files the distribution installs (its RECORD); `imagebuild render` shows the step"
    elif "uv pip install" in text:
        what = f"installing the {layer} layer failed"
        hint = "the lock's wheels did not install on the base: relock (`imagebuild lock`) or check the base"
    else:
        what = f"build step {step.step} failed"
        hint = "`imagebuild render RECIPE -o DIR` writes the Dockerfile to read the step in"
    instruction = text if len(text) <= 200 else text[:197] + "..."
    return BuildFailed(f"{what}: {step.cause}\n  step {step.step}: {instruction}\n  hint: {hint}\n"
                       f"no image was tagged.", step=step)

