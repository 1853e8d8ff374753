"""A recipe patch is checked against the wheel the lock installs before any build: `lock` refuses
one that does not apply, `check` reports it when a lock exists, naming the file and hunk as
`imagebuild patches` does. Real resolves and real wheels (requests 2.32.3, hash-checked)."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest

from imagebuild import flows
from imagebuild.errors import FindingsFailed, ImagebuildError
from imagebuild.lock import read_lock
from imagebuild.lock.patches import check_locked_patches, locked_wheel
from imagebuild.recipe import load_recipe
from tests.lock.test_lock import SMALL

RECIPE = SMALL + '\n[[patches]]\npackage = "requests"\nfile = "requests.patch"\n'


def good_patch(lock) -> str:
    """A real one-line change of requests/__version__.py, made from the locked wheel itself."""
    with zipfile.ZipFile(locked_wheel(lock, "requests")) as wheel:
        before = wheel.read("requests/__version__.py").decode().splitlines(keepends=True)
    after = [line.replace("HTTP for Humans.", "HTTP for Humans, patched.") for line in before]
    assert after != before
    return "".join(difflib.unified_diff(before, after, "a/requests/__version__.py", "b/requests/__version__.py"))


BAD_PATCH = ("--- a/requests/__version__.py\n+++ b/requests/__version__.py\n"
             "@@ -1,3 +1,3 @@\n-no such line one\n+changed\n no such line two\n no such line three\n")


@pytest.fixture
def locked(write_recipe, tmp_path):
    """The recipe locked with a patch that applies; its lock file path."""
    path = write_recipe(RECIPE)
    (path.parent / "requests.patch").write_text("--- a/requests/__init__.py\n+++ b/requests/__init__.py\n")
    # The first lock needs a patch that applies: take requests' wheel via a plain resolve first.
    from imagebuild.bootstrap import identify
    from imagebuild.lock import resolve_lock
    from imagebuild.render import template_sha256
    first = resolve_lock(load_recipe(path), identify(load_recipe(path).base), template_sha256=template_sha256())
    (path.parent / "requests.patch").write_text(good_patch(first))
    report = flows.lock(path)
    return path, report


def test_a_patch_that_applies_passes_lock_and_check(locked):
    path, report = locked
    assert not report.findings
    (result,) = check_locked_patches(load_recipe(path), read_lock(report.lock_path))
    assert result.applies and result.checked == "2.32.3"
    assert [(f.status, f.rule) for f in flows.check(path).findings] == [("note", "lock-fresh")]


def test_lock_refuses_a_patch_that_no_longer_applies_and_writes_nothing(write_recipe):
    path = write_recipe(RECIPE)
    (path.parent / "requests.patch").write_text(BAD_PATCH)
    with pytest.raises(FindingsFailed) as refused:
        flows.lock(path)
    (finding,) = refused.value.findings
    assert finding.rule == "patch-does-not-apply" and finding.status == "error"
    assert finding.message.startswith(f"the patch {path.parent / 'requests.patch'} does not apply to requests "
                                      "2.32.3: requests/__version__.py: hunk 1 of 1 (@@ -1,3 +1,3 @@)")
    assert "requests/__version__.py: hunk 1 of 1" in str(refused.value)  # the error lock prints names file and hunk
    assert finding.evidence.startswith("requests/__version__.py: hunk 1 of 1 (@@ -1,3 +1,3 @@)")
    assert "imagebuild patches" in finding.fix
    assert not (path.parent.parent / "lockfiles" / "test.lock").exists()


def test_check_with_a_lock_reports_a_broken_patch_in_text_and_json(locked):
    path, _ = locked
    (path.parent / "requests.patch").write_text(BAD_PATCH)
    for args in (["check", str(path)], ["check", str(path), "--json"]):
        proc = subprocess.run([sys.executable, "-m", "imagebuild", *args], capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    stale, finding = report["findings"]
    assert (stale["rule"], stale["evidence"]) == ("lock-stale", "a patch file changed since the lock was made")
    assert finding["rule"] == "patch-does-not-apply" and "hunk 1 of 1" in finding["evidence"]
    text = subprocess.run([sys.executable, "-m", "imagebuild", "check", str(path)], capture_output=True,
                          text=True).stdout
    assert "error patch-does-not-apply: the patch" in text and "requests/__version__.py: hunk 1 of 1" in text


def test_the_locked_wheel_is_checked_against_the_locks_sha256(locked, tmp_path, monkeypatch):
    _, report = locked
    lock = read_lock(report.lock_path)
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))  # nothing cached: a real download
    wrong = tuple(replace(w, sha256="0" * 64) if w.name == "requests" else w for w in lock.wheels)
    with pytest.raises(ImagebuildError, match="cannot download the locked wheel requests-2.32.3"):
        locked_wheel(replace(lock, wheels=wrong), "requests")
    assert locked_wheel(lock, "requests").name == "requests-2.32.3-py3-none-any.whl"
