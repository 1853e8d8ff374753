"""What a test run leaves in imagebuild's own cache folder (IMAGEBUILD_CACHE, else ~/.cache/imagebuild), taken
back at the end of the run: the entries the run added to the folders that grow with every build (build contexts,
smoke results on record, built-image records, the OCI layer cache's records and blobs), each named by a test's
own recipe or a fresh image, so a run that keeps them grows the user's cache by about a gigabyte every time
(2026-12-07: 277 contexts, 761 MB; 734 layer records and 6.8 GB of blobs, 720 of them from one run).

Only entries that were not there when the run began are removed; what the user's cache held stays, the folders
that are pinned downloads (bases, .debs, wheels, releases read by the tests, tools) stay whole, and
IMAGEBUILD_TEST_KEEP_BUILD_CACHE=1 keeps everything, as it keeps the engine's builder cache. An entry another
process added meanwhile is removed too (the line says so); a layer record left pointing at a removed blob is a
miss the layer cache recomputes (image/export.py LayerCache.get). Registered by tests/conftest.py on the
controlling process, beside tests/engine_leftovers.py.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from imagebuild.flows.caches import entry_bytes
from tests.engine_leftovers import KEEP_ENV

# Folders under the cache root whose entries each build or test adds anew.
GROWING = ("contexts", "smoke", "built", "oci/layers", "oci/blobs/sha256")


def cache_root() -> Path:
    from imagebuild.common import cache_dir
    return cache_dir()


def snapshot(root: Path) -> set[str]:
    """Each entry of the growing folders, as its path under root."""
    found = set()
    for folder in GROWING:
        try:
            found |= {f"{folder}/{name}" for name in os.listdir(root / folder)}
        except OSError:
            continue
    return found


@dataclass
class Taken:
    removed: int = 0
    bytes: int = 0
    failed: int = 0


def take_back(root: Path, before: set[str]) -> Taken:
    """Remove the entries of the growing folders that `before` does not list; never follows a link."""
    taken = Taken()
    for entry in sorted(snapshot(root) - before):
        path = root / entry
        try:
            size = entry_bytes(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            taken.failed += 1
            continue
        taken.removed += 1
        taken.bytes += size
    return taken


class Reporter:
    """The pytest plugin: the cache's entries at the start; at the end, those the run added removed and said."""

    def __init__(self, root: Path | None = None):
        self.root = root
        self.before = None

    def pytest_sessionstart(self, session):
        self.root = self.root or cache_root()
        self.before = snapshot(self.root)

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.section("what this run left in imagebuild's cache")
        if self.before is None:
            return
        if os.environ.get(KEEP_ENV) == "1":
            terminalreporter.write_line(f"{self.root}: the entries this run added are kept ({KEEP_ENV}=1)")
            return
        taken = take_back(self.root, self.before)
        terminalreporter.write_line(
            f"{self.root}: removed {taken.removed} entries this run added to {', '.join(GROWING)} "
            f"({taken.bytes / 1e9:.2f} GB)" + (f"; {taken.failed} could not be removed" if taken.failed else "")
            + f"; the {len(self.before)} it held are left alone (another process's entries added meanwhile "
              "are removed too)")
