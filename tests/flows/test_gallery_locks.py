"""The recipe gallery's committed locks: fresh, and their recipes check clean (the images: tests/slow/test_gallery.py)."""

from __future__ import annotations

from pathlib import Path


from imagebuild import flows
from imagebuild.knowledge import has_errors
from imagebuild.lock import read_lock

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"


def test_gallery_locks_hold_no_errors_and_answer_their_findings():
    """Fast: the committed locks of the gallery are fresh and their recipes check clean."""
    for name in ("vllm-blackwell", "sglang-hopper", "sglang-blackwell-nvfp4"):
        report = flows.check(RECIPES / f"{name}.toml")
        assert not has_errors(report.findings), [f.message for f in report.findings]
        lock = read_lock(REPO / "lockfiles" / f"{name}.lock")
        assert "nvidia-cutlass-dsl-libs-cu12" not in lock.packages
        assert lock.packages["nvidia-nvjitlink"].startswith("13.0.")
    vllm = read_lock(REPO / "lockfiles" / "vllm-blackwell.lock")
    assert int(vllm.packages["cuda-python"].split(".")[0]) >= 13  # not the monolithic 12.x bindings
