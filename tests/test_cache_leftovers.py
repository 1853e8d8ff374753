"""tests/cache_leftovers.py: what a run added to imagebuild's growing cache folders is removed at its end, and
nothing the cache held before, nor the pinned downloads beside them."""

from __future__ import annotations

import os

from tests import cache_leftovers


class Terminal:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line, **_):
        self.lines.append(line)


def fill(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            path.mkdir()
            (path / "Dockerfile").write_text("FROM scratch\n")
        else:
            path.write_bytes(b"x" * 10)


def test_the_entries_a_run_added_are_removed_and_what_the_cache_held_stays(tmp_path, monkeypatch):
    monkeypatch.delenv(cache_leftovers.KEEP_ENV, raising=False)
    fill(tmp_path, ["contexts/sglang-blackwell/", "smoke/old.json", "oci/layers/a-1.json", "oci/blobs/sha256/aa",
                    "bases/bookworm.tar", "wheels/w.whl"])
    reporter = cache_leftovers.Reporter(tmp_path)
    reporter.pytest_sessionstart(None)
    assert reporter.before == {"contexts/sglang-blackwell", "smoke/old.json", "oci/layers/a-1.json",
                               "oci/blobs/sha256/aa"}
    # the run: new entries in every growing folder, one held entry rewritten, a new download, a link to outside
    fill(tmp_path, ["contexts/bump-123/", "smoke/new.json", "built/lock.json", "oci/layers/b-1.json",
                    "oci/blobs/sha256/bb", "debs/new.deb"])
    (tmp_path / "contexts" / "sglang-blackwell" / "Dockerfile").write_text("FROM scratch\nCOPY x /x\n")
    outside = tmp_path / "outside"
    fill(tmp_path, ["outside/keep.txt"])
    os.symlink(outside, tmp_path / "contexts" / "link")
    terminal = Terminal()
    reporter.pytest_terminal_summary(terminal)
    left = cache_leftovers.snapshot(tmp_path)
    assert left == reporter.before
    assert (tmp_path / "debs" / "new.deb").exists() and (tmp_path / "bases" / "bookworm.tar").exists()
    assert (outside / "keep.txt").exists()  # the link was removed, not what it points at
    assert terminal.lines[0] == "== what this run left in imagebuild's cache"
    assert terminal.lines[1].startswith(f"{tmp_path}: removed 6 entries this run added to contexts, smoke, built, "
                                        "oci/layers, oci/blobs/sha256 (0.00 GB); the 4 it held are left alone")


def test_keep_keeps_everything_and_says_so(tmp_path, monkeypatch):
    reporter = cache_leftovers.Reporter(tmp_path)
    reporter.pytest_sessionstart(None)
    fill(tmp_path, ["contexts/bump-123/"])
    monkeypatch.setenv(cache_leftovers.KEEP_ENV, "1")
    terminal = Terminal()
    reporter.pytest_terminal_summary(terminal)
    assert (tmp_path / "contexts" / "bump-123").is_dir()
    assert terminal.lines[1] == f"{tmp_path}: the entries this run added are kept ({cache_leftovers.KEEP_ENV}=1)"


def test_a_cache_without_the_folders_is_an_empty_snapshot_and_nothing_to_remove(tmp_path, monkeypatch):
    monkeypatch.delenv(cache_leftovers.KEEP_ENV, raising=False)
    assert cache_leftovers.snapshot(tmp_path / "missing") == set()
    taken = cache_leftovers.take_back(tmp_path / "missing", set())
    assert (taken.removed, taken.bytes, taken.failed) == (0, 0, 0)
