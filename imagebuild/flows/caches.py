"""What imagebuild keeps, and trimming it to a size: the folders of its cache directory and the
BuildKit cache mounts its builds fill (uv's wheel cache), nothing else of the engine's or the user's.

Each folder is trimmed oldest entry first (an entry: a file or a folder directly inside it); the
records of what was built and pushed are never trimmed (they are what build by lock trusts), and
every trimmed entry is only a cost the next build pays again: a base re-bootstrapped, a .deb or wheel
fetched again, a smoke test re-run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from imagebuild.common import cache_dir
from imagebuild.errors import ImagebuildError
from imagebuild.render.paths import OWN_STEP

# folder -> what it holds (what a trim costs the next build)
FOLDERS = {
    "bases": "Debian rootfs tars bootstrapped from locks (bootstrapped again, ~35 s each)",
    "debs": "locked .debs by sha256 (fetched again from the mirror)",
    "debian-indices": "suites' Packages indices by sha256 (fetched again at lock and check)",
    "debian-resolved": "apt's picks for a base over indices by sha256 (resolved again at lock, 5-8 s)",
    "wheel-files": "locked wheels' METADATA and RECORD read by range requests (read again at lock)",
    "wheels": "wheels downloaded for patch checks (downloaded again)",
    "contexts": "rendered build contexts (rendered again)",
    "oci": "layer blobs of exported OCI layouts (exported again)",
    "smoke": "smoke passes on record per image id (the smoke test runs again)",
}
KEPT = ("built", "registry-blobs.json")  # records build by lock and pushes rely on: never trimmed


@dataclass
class Usage:
    name: str
    where: str
    bytes: int
    entries: int
    holds: str
    trimmed_bytes: int = 0
    trimmed_entries: int = 0


@dataclass
class CacheReport:
    root: str
    folders: list[Usage] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)  # the engine's BuildKit cache mounts imagebuild fills
    limit: int | None = None
    engine_silent: bool = False  # an engine was asked and did not answer: its mounts are not counted

    @property
    def total(self) -> int:
        return sum(u.bytes for u in self.folders) + sum(m["bytes"] for m in self.mounts)

    def to_dict(self) -> dict:
        return {"root": self.root, "total_bytes": self.total, "limit_bytes": self.limit,
                "folders": [asdict(u) for u in self.folders], "buildkit_mounts": self.mounts}


def entry_bytes(path: Path) -> int:
    """The bytes of one cache entry: a file, a link (not followed) or a folder's files."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _entries(folder: Path) -> list[tuple[float, int, Path]]:
    """(last modified, bytes, path) of each entry directly in folder, oldest first."""
    found = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        try:
            found.append((entry.lstat().st_mtime, entry_bytes(entry), entry))
        except OSError:
            continue
    return sorted(found)


def usage(engine=None) -> CacheReport:
    root = cache_dir()
    report = CacheReport(str(root))
    for name, holds in FOLDERS.items():
        entries = _entries(root / name)
        report.folders.append(Usage(name, str(root / name), sum(e[1] for e in entries), len(entries), holds))
    if engine is not None:
        report.mounts = engine.cache_mounts(OWN_STEP)
    return report


def trim(limit: int, engine=None) -> CacheReport:
    """Remove imagebuild's oldest cache entries until what it keeps is at most `limit` bytes: the
    folders' entries oldest first, then its BuildKit cache mounts."""
    report = usage(engine)
    report.limit = limit
    over = report.total - limit
    if over <= 0:
        return report
    candidates = sorted((mtime, size, path, usage_)
                        for usage_ in report.folders for mtime, size, path in _entries(Path(usage_.where)))
    for _, size, path, usage_ in candidates:
        if over <= 0:
            break
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        usage_.bytes -= size
        usage_.entries -= 1
        usage_.trimmed_bytes += size
        usage_.trimmed_entries += 1
        over -= size
    if over > 0 and engine is not None:
        for mount in sorted(report.mounts, key=lambda m: m.get("last_used", "")):
            if over <= 0:
                break
            engine.remove_cache_mount(mount["id"])
            mount["trimmed"] = True
            over -= mount["bytes"]
        report.mounts = [m for m in report.mounts if not m.get("trimmed")]
    return report


def kept(limit: int | None = None, engine=None) -> CacheReport:
    """`imagebuild cache`: what imagebuild keeps, trimmed to at most `limit` bytes when given. An engine
    that does not answer is left out (its mounts are not counted) and the report says so."""
    silent = False
    if engine is not None:
        try:
            engine.check()
        except ImagebuildError:
            engine, silent = None, True
    report = trim(limit, engine) if limit else usage(engine)
    report.engine_silent = silent
    return report
