"""diff-lock judged by the recipe (imagebuild/flows/lockdiff.py): the findings a lock move makes appear
or clear (the rules over versions, and where wheels moved, the rules that read the wheels' files), and the
patches that no longer apply to a moved wheel or whose package left, on the committed flagship lock moved
as users move it. The patch check reads real FlashInfer wheels from the index (the locked 0.7.2 and 0.6.0,
which the patch was not made for); the file rules read real torchvision releases. A move to a made-up
wheel (sha256 f...f) is named as unread, never judged as if seen."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from imagebuild.cli.app import main
from imagebuild.flows.lockdiff import judged_diff
from imagebuild.lock.lockfile import read_lock, write_locks
from imagebuild.lock.patches import download_wheel
from imagebuild.recipe.model import load_recipe
from tests.lock.test_diff import move as moved

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "lockfiles" / "sglang-blackwell.lock"
RECIPE = REPO / "recipes" / "sglang-blackwell.toml"


@pytest.fixture(scope="module")
def lock():
    return read_lock(FLAGSHIP)


def test_a_move_that_skews_the_toolchain_makes_its_finding_appear_and_moving_back_clears_it(lock):
    skewed = moved(lock, "nvidia-nvjitlink", "13.5.0")
    report = judged_diff(lock, skewed, "old", "new", load_recipe(RECIPE))
    (diff,) = report.platforms
    (appeared,) = diff.findings["appeared"]
    assert appeared["rule"] == "toolchain-skew" and appeared["severity"] == "error" and "13.5" in appeared["message"]
    assert diff.findings["cleared"] == [] and report.judged_by == str(RECIPE)
    (back,) = judged_diff(skewed, lock, "new", "old", load_recipe(RECIPE)).platforms
    assert back.findings["appeared"] == [] and [f["rule"] for f in back.findings["cleared"]] == ["toolchain-skew"]


def test_a_move_the_rules_do_not_mind_says_nothing_appeared(lock):
    """The negative control: a library moved, the toolchain untouched."""
    (diff,) = judged_diff(lock, moved(lock, "jinja2", "3.1.7"), "old", "new", load_recipe(RECIPE)).platforms
    assert diff.findings == {"appeared": [], "cleared": [], "unread": ["jinja2 3.1.7"]} and diff.patches_broken == []


def test_without_a_recipe_nothing_is_judged_and_the_report_says_so(lock):
    report = judged_diff(lock, moved(lock, "nvidia-nvjitlink", "13.5.0"), "old", "new", None)
    assert report.judged_by is None and report.platforms[0].findings is None
    assert report.to_dict()["platforms"][0]["patches_broken"] is None


def real_wheel_entry(lock, tmp_path: Path, name: str, version: str, platform: str | None = None):
    """The lock's entries with `name` at a real release from the index (its file, hash and size)."""
    wheel = download_wheel(name, version, lock.base.python, platform or lock.python_platform, tmp_path)
    data = wheel.read_bytes()
    return tuple(dataclasses.replace(w, version=version, filename=wheel.name, sha256=hashlib.sha256(data).hexdigest(),
                                     size=len(data)) if w.name == name else w for w in lock.wheels)


def test_flashinfer_moved_to_a_release_the_patch_was_not_made_for_is_a_patch_that_no_longer_applies(lock, tmp_path):
    old_release = dataclasses.replace(lock, wheels=real_wheel_entry(lock, tmp_path, "flashinfer-python", "0.6.0"))
    (diff,) = judged_diff(lock, old_release, "old", "new", load_recipe(RECIPE)).platforms
    (broken,) = diff.patches_broken
    assert broken["package"] == "flashinfer-python" and (broken["old"], broken["new"]) == ("0.7.2", "0.6.0")
    assert broken["patch"].endswith("flashinfer-cuda-version.patch")
    assert "flashinfer/jit/cpp_ext.py: hunk 1 of 1" in broken["problems"][0]
    # The negative control: moved back to the locked release, the patch is checked again and applies.
    (back,) = judged_diff(old_release, lock, "new", "old", load_recipe(RECIPE)).platforms
    assert back.patches_broken == []


def test_the_command_prints_what_appeared_and_json_carries_it(lock, tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "lockfiles").mkdir(parents=True)
    (root / "recipes").mkdir()
    (root / "recipes" / "sglang-blackwell.toml").write_text(RECIPE.read_text())
    (root / "recipes" / "patches").symlink_to(REPO / "recipes" / "patches")
    new = root / "lockfiles" / "sglang-blackwell.lock"
    write_locks(moved(lock, "nvidia-nvjitlink", "13.5.0"), new)
    assert main(["diff-lock", str(FLAGSHIP), str(new)]) == 0
    said = capsys.readouterr().out
    assert "finding +" in said and "toolchain-skew" in said and "not judged" not in said
    assert main(["diff-lock", str(FLAGSHIP), str(new), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["judged_by"] == str(root / "recipes" / "sglang-blackwell.toml")
    assert [f["rule"] for f in data["platforms"][0]["findings"]["appeared"]] == ["toolchain-skew"]


def test_with_no_recipe_beside_the_lock_the_command_says_it_did_not_judge(lock, tmp_path, capsys):
    (tmp_path / "lockfiles").mkdir()
    new = tmp_path / "lockfiles" / "sglang-blackwell.lock"
    write_locks(moved(lock, "nvidia-nvjitlink", "13.5.0"), new)
    assert main(["diff-lock", str(FLAGSHIP), str(new)]) == 0
    said = capsys.readouterr().out
    assert "not judged" in said and "--recipe" in said and "finding +" not in said
    assert main(["diff-lock", str(FLAGSHIP), str(new), "--recipe", str(RECIPE)]) == 0
    assert "toolchain-skew" in capsys.readouterr().out


def test_a_companion_moved_to_a_release_built_for_another_torch_is_seen_by_the_rules_that_read_wheels(lock, tmp_path):
    """torchvision 0.28.0's METADATA requires torch==2.13.0; the lock holds torch 2.14.1. No rule over names and
    versions sees it: only torch-companion-mismatch, which reads the wheel's METADATA (as `lock` does)."""
    older = dataclasses.replace(lock, wheels=real_wheel_entry(lock, tmp_path, "torchvision", "0.28.0",
                                                               "x86_64-manylinux_2_28"))
    (diff,) = judged_diff(lock, older, "old", "new", load_recipe(RECIPE)).platforms
    assert [(f["rule"], f["message"]) for f in diff.findings["appeared"]] == [
        ("torch-companion-mismatch", "torchvision 0.28.0 is built for torch==2.13.0, but the lock holds torch 2.14.1.")]
    assert diff.findings["cleared"] == [] and diff.findings["unread"] == []
    # The negative control: moved back, it clears.
    (back,) = judged_diff(older, lock, "new", "old", load_recipe(RECIPE)).platforms
    assert back.findings["appeared"] == [] and [f["rule"] for f in back.findings["cleared"]] == ["torch-companion-mismatch"]


def test_a_patch_whose_package_left_the_lock_is_broken(lock):
    without = dataclasses.replace(lock, wheels=tuple(w for w in lock.wheels if w.name != "flashinfer-python"))
    (diff,) = judged_diff(lock, without, "old", "new", load_recipe(RECIPE)).platforms
    (broken,) = diff.patches_broken
    assert broken["package"] == "flashinfer-python" and (broken["old"], broken["new"]) == ("0.7.2", None)
    assert broken["patch"].endswith("flashinfer-cuda-version.patch") and "not in the new lock" in broken["problems"][0]
    # The negative control: the package kept, nothing is broken.
    (same,) = judged_diff(lock, lock, "old", "new", load_recipe(RECIPE)).platforms
    assert same.patches_broken == [] and "unread" not in same.findings
