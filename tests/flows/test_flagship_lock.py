"""The flagship's lock, recipes/sglang-blackwell.toml: free of the toolchain skew an unpinned resolve drags
in, and its patch still applies (the image itself: tests/slow/test_flagship.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.knowledge import has_errors, rules
from imagebuild.errors import FindingsFailed
from imagebuild.lock import read_lock
from imagebuild.lock.patches import check_patches
from imagebuild.recipe.model import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "sglang-blackwell.toml"
TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm",
             "nvidia-nvjitlink", "nvidia-cuda-nvrtc")


def test_flagship_lock_keeps_the_toolchain_on_torchs_cuda():
    lock = read_lock(REPO / "lockfiles" / "sglang-blackwell.lock")
    packages = lock.packages
    assert packages["sglang"] == "0.5.23" and packages["torch"].startswith("2.14.")
    assert packages["cuda-toolkit"].startswith("13.0.")  # what torch 2.14's wheel pins (tests/lock/test_artifacts.py)
    for name in TOOLCHAIN:
        assert packages[name].startswith("13.0."), (name, packages[name])
    assert not has_errors(rules.check_resolved(load_recipe(RECIPE), packages, lock.base.glibc))
    assert "nvidia-cutlass-dsl-libs-cu12" not in packages  # a CUDA 12 build the stack cannot use
    layers = {w.name: w.layer for w in lock.wheels}
    assert layers["torch"] == layers["nvidia-cublas"] == "framework"
    assert layers["flashinfer-python"] == layers["sglang-kernel"] == "kernels"
    assert layers["sglang"] == "application"


def without_aot(text: str) -> str:
    """The recipe with its [aot] table and shapes removed."""
    cut = re.sub(r"\n\[aot\]\n.*?(?=\n\[(?!\[aot))", "\n", text, flags=re.S)
    assert "[aot]" not in cut and "[env]" in cut
    return cut


UNPINNED = """\
[image]
name = "imagebuild-test/sglang-unpinned"

[base]
debian = "bookworm"
packages = ["g++"]

[python]
requirements = ["sglang==0.5.23"]
exclude_newer = "2026-11-20T00:00:00Z"

[cuda]
toolkit = "13.0"
archs = ["sm_120a"]
min_driver = "595.71.05"
"""


def test_an_unpinned_sglang_resolve_is_refused_for_its_nvcc_skew(write_recipe):
    """What users hit: sglang alone drags nvidia-cuda-nvcc 13.5 beside torch's 13.0 runtime."""
    with pytest.raises(FindingsFailed) as refused:
        flows.lock(write_recipe(UNPINNED, "unpinned"))
    skew = {f.message.split()[0]: f for f in refused.value.findings if f.rule == "toolchain-skew"}
    assert "13.5" in skew["nvidia-cuda-nvcc"].evidence
    assert "nvidia-cuda-nvcc==13.0.*" in skew["nvidia-cuda-nvcc"].fix
    assert not (Path(write_recipe(UNPINNED, "unpinned")).parent.parent / "lockfiles" / "unpinned.lock").exists()


def test_even_with_torchs_toolkit_pinned_nvjitlink_skews_without_the_recipes_constraints(write_recipe):
    text = re.sub(r"constraints = \[.*?\]\n", "", RECIPE.read_text(), flags=re.S)
    text = text.replace('file = "patches/', f'file = "{REPO}/recipes/patches/')
    with pytest.raises(FindingsFailed) as refused:
        flows.lock(write_recipe(text, "no-constraints"))
    (skew,) = [f for f in refused.value.findings if f.rule == "toolchain-skew"]
    assert skew.message.startswith("nvidia-nvjitlink 13.5") and "nvidia-nvjitlink==13.0.*" in skew.fix


def test_the_flashinfer_patch_applies_to_the_locked_release_and_not_to_an_old_one():
    (locked,) = check_patches(RECIPE)
    assert locked.applies and locked.checked == locked.locked == "0.7.2"
    (old,) = check_patches(RECIPE, versions={"flashinfer-python": "0.6.0"})
    assert not old.applies and "flashinfer/jit/cpp_ext.py: hunk 1 of 1" in old.problems[0]
