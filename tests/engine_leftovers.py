"""What a test run leaves in the session's engine, said at the end of the run: the images that were not
there when it began (imagebuild's own bases named apart) and how much the builder cache grew. The suite's
tests remove the images they made; this names what is left anyway, so a run never grows the user's
engine unseen. No image is removed here: the engine may be shared, and an image another run made
meanwhile is listed too (the report says so).

The builder cache is the one thing a test cannot take back itself (BuildKit's records name no image or
test), and a whole run leaves tens of gigabytes of it: on a 100 GB disk the next run then fills the disk
(a CI run on 2026-12-05 failed so, the builder cache at 53 GB when it began). So at the end of the run the
records the engine did not hold when it began are removed, one by one, by id, children before their
parents (`IMAGEBUILD_TEST_KEEP_BUILD_CACHE=1` keeps them, for a warm rerun on a developer's machine);
a record in use, or one another build made meanwhile and still needs, stays. The disk the engine writes
to is sampled through the run, and its peak said at the end.

Registered by tests/conftest.py on the controlling process (not on xdist's workers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")
BASE_REPOSITORY = "imagebuild/base"
_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
KEEP_ENV = "IMAGEBUILD_TEST_KEEP_BUILD_CACHE"
# How far the suite's own runs grew the disk here from an emptied engine (docs/ci.md: 23 → 96 GB at
# c876433, 28 → 89 GB at d412ea0, 2026-12-02): with less free than this when a run begins, it is said.
SUITE_GROWTH = 70 * 10**9
SAMPLE_SECONDS = 10


def size_bytes(text: str) -> int | None:
    """Docker's human size (`10.34GB`, `0B`, `452MB`, SI units) as bytes; None for anything else."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(B|kB|KB|MB|GB|TB)\s*", text or "")
    return round(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


@dataclass
class EngineState:
    images: dict[str, list[str]] = field(default_factory=dict)  # image id -> its names
    sizes: dict[str, int | None] = field(default_factory=dict)  # image id -> bytes
    build_cache: int | None = None  # bytes, or None when the engine did not say


def read_state(docker: str = DOCKER) -> EngineState | None:
    """The engine's images and builder cache size now; None when it does not answer."""
    try:
        images = subprocess.run([docker, "images", "--no-trunc", "--format", "{{.ID}}|{{.Repository}}:{{.Tag}}|{{.Size}}"],
                                capture_output=True, text=True, timeout=120, check=False)
        usage = subprocess.run([docker, "system", "df", "--format", "{{.Type}}|{{.Size}}"],
                               capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if images.returncode != 0:
        return None
    return parse_state(images.stdout, usage.stdout if usage.returncode == 0 else "")


def parse_state(images: str, usage: str) -> EngineState:
    state = EngineState()
    for line in images.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0]:
            continue
        names = state.images.setdefault(parts[0], [])
        if parts[1] != "<none>:<none>":
            names.append(parts[1])
        state.sizes[parts[0]] = size_bytes(parts[2])
    for line in usage.splitlines():
        kind, _, size = line.partition("|")
        if kind == "Build Cache":
            state.build_cache = size_bytes(size)
    return state


def leftovers(before: EngineState, after: EngineState) -> list[str]:
    """Lines for the end of the run: each image not there before (imagebuild's bases marked), and the
    builder cache's growth; one line saying nothing was left when nothing was."""
    lines = []
    for image in sorted(set(after.images) - set(before.images)):
        names = ", ".join(after.images[image]) or "(untagged)"
        size = after.sizes.get(image)
        own = " (imagebuild's own base: `docker rmi` it, or keep it for the next build)" \
            if any(name.startswith(BASE_REPOSITORY + ":") for name in after.images[image]) else ""
        lines.append(f"image {image[:19]} {names}, {size / 1e9:.2f} GB{own}" if size is not None
                     else f"image {image[:19]} {names}{own}")
    if before.build_cache is not None and after.build_cache is not None:
        grown = after.build_cache - before.build_cache
        if grown > 0:
            lines.append(f"builder cache grew by {grown / 1e9:.2f} GB to {after.build_cache / 1e9:.2f} GB "
                         "(`docker builder prune` takes it back; it also holds what later builds reuse)")
    else:
        lines.append("builder cache: the engine did not say its size")
    return lines or ["nothing: the engine holds the images it held when the run began, and its builder cache "
                     "did not grow"]


@dataclass(frozen=True)
class CacheRecord:
    id: str
    parents: tuple[str, ...]
    in_use: bool
    size: int  # bytes; 0 when the engine did not say


def parse_records(text: str) -> list[CacheRecord] | None:
    """BuildKit's cache records from `docker system df -v --format '{{json .BuildCache}}'` (Size in
    Docker's human units, InUse as text, one Parent, or Parents in newer engines); None for anything that
    is not a list of records."""
    try:
        data = json.loads(text or "null")
    except ValueError:
        return None
    if not isinstance(data, list):
        return None
    records = []
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("ID"), str) or not entry["ID"]:
            continue
        parents = entry.get("Parents") if isinstance(entry.get("Parents"), list) else [entry.get("Parent")]
        in_use = entry.get("InUse")
        records.append(CacheRecord(
            id=entry["ID"], parents=tuple(p for p in parents if isinstance(p, str) and p),
            in_use=in_use is True or str(in_use).strip().lower() == "true",
            size=entry["Size"] if isinstance(entry.get("Size"), int) else size_bytes(str(entry.get("Size", ""))) or 0))
    return records


def read_records(docker: str = DOCKER) -> list[CacheRecord] | None:
    """The engine's builder cache records now; None when it does not answer."""
    try:
        done = subprocess.run([docker, "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                              capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_records(done.stdout) if done.returncode == 0 else None


def removal_order(before: set[str], records: list[CacheRecord]) -> list[CacheRecord]:
    """The records that were not there before, each after every new record that names it as its parent (a
    parent cannot go while a child holds it). A record in use stays, and so do its ancestors."""
    new = {record.id: record for record in records if record.id not in before}
    held = set()
    stack = [record for record in new.values() if record.in_use]
    while stack:  # an ancestor of a record in use is held by it
        record = stack.pop()
        if record.id in held:
            continue
        held.add(record.id)
        stack.extend(new[parent] for parent in record.parents if parent in new)
    left = {rid: record for rid, record in new.items() if rid not in held}
    order = []
    while left:
        children_of = {parent for record in left.values() for parent in record.parents}
        leaves = [record for rid, record in sorted(left.items()) if rid not in children_of]
        if not leaves:  # a cycle, which BuildKit never reports: nothing more is removed
            break
        for record in leaves:
            order.append(record)
            del left[record.id]
    return order


@dataclass
class Removal:
    removed: int = 0
    bytes: int = 0
    kept: list[str] = field(default_factory=list)  # ids the engine did not remove


def remove_records(order: list[CacheRecord], docker: str = DOCKER) -> Removal:
    """Each record pruned by its id (Docker 20.10 takes one id per call; `--all`, or a record whose layer an
    image shares is kept, though removing the record leaves the image's layer where it is), kept when the
    engine does not name it as deleted (another build took it meanwhile)."""
    removal = Removal()
    for record in order:
        try:
            done = subprocess.run([docker, "builder", "prune", "--force", "--all", "--filter", f"id={record.id}"],
                                  capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired):
            removal.kept.append(record.id)
            continue
        if done.returncode == 0 and record.id in done.stdout.split():
            removal.removed += 1
            removal.bytes += record.size
        else:
            removal.kept.append(record.id)
    return removal


def engine_root(docker: str = DOCKER) -> str | None:
    """The folder the engine writes its images and builder cache to (`docker info`)."""
    try:
        done = subprocess.run([docker, "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = done.stdout.strip()
    return root if done.returncode == 0 and root.startswith("/") else None


class DiskSampler:
    """The used bytes of one file system, sampled every `every` seconds on a thread of its own: the peak
    and when it came (seconds from the start)."""

    def __init__(self, path: str, every: float = SAMPLE_SECONDS):
        self.path, self.every = path, every
        self.started = time.monotonic()
        usage = shutil.disk_usage(path)
        self.first = usage.used
        self.peak, self.peak_at, self.peak_free = usage.used, 0.0, usage.free
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="imagebuild-disk-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> int | None:
        """One reading: the used bytes now (None when the file system did not answer), the peak kept."""
        try:
            usage = shutil.disk_usage(self.path)
        except OSError:
            return None
        if usage.used > self.peak:
            self.peak, self.peak_at, self.peak_free = usage.used, time.monotonic() - self.started, usage.free
        return usage.used

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(timeout=5)
        last = self._sample()
        end = "its end unread" if last is None else f"{last / 1e9:.1f} GB at its end"
        # Free, not the total: a file system's reserved blocks are in its total, and no build can have them.
        return (f"disk ({self.path}): {self.first / 1e9:.1f} GB used when the run began, peak {self.peak / 1e9:.1f} GB "
                f"at minute {self.peak_at / 60:.0f} with {self.peak_free / 1e9:.1f} GB free, {end} "
                f"(sampled every {self.every:.0f} s)")


def free_space_line(path: str) -> str | None:
    """A warning when the engine's file system has less free than the suite has needed; None otherwise."""
    free = shutil.disk_usage(path).free
    if free >= SUITE_GROWTH:
        return None
    return (f"warning: {free / 1e9:.1f} GB free on the engine's file system ({path}); the suite's runs here have "
            f"grown it by up to {SUITE_GROWTH / 1e9:.0f} GB (docs/ci.md): free space first (the engine's own "
            "`docker system df` says what it holds)")


class Reporter:
    """The pytest plugin: the state at the start; at the end, the builder cache records the run made
    removed and what is left said."""

    def __init__(self):
        self.before = None
        self.records = None
        self.sampler = None

    def pytest_sessionstart(self, session):
        self.before = read_state()
        self.records = read_records()
        root = engine_root()
        if root is None:
            return
        self.sampler = DiskSampler(root)
        warning = free_space_line(root)
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        if warning and terminal is not None:
            terminal.write_line(warning, yellow=True)

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.section("what this run left in the engine")
        if self.before is None:
            terminalreporter.write_line(f"the engine ({DOCKER}) did not answer: nothing measured")
            return
        if os.environ.get(KEEP_ENV) == "1":
            terminalreporter.write_line(f"builder cache: the records this run made are kept ({KEEP_ENV}=1)")
        elif self.records is not None:
            now = read_records()
            if now is None:
                terminalreporter.write_line("builder cache: the engine did not list its records: none removed")
            else:
                order = removal_order({record.id for record in self.records}, now)
                removal = remove_records(order)
                terminalreporter.write_line(
                    f"builder cache: removed {removal.removed} of the {len(order)} records this run made "
                    f"({removal.bytes / 1e9:.2f} GB); {len(removal.kept)} the engine kept (in use or taken "
                    f"meanwhile); {len(now) - len(order)} it held or uses are left alone")
        after = read_state()
        if after is None:
            terminalreporter.write_line(f"the engine ({DOCKER}) did not answer at the end: nothing measured")
        else:
            for line in leftovers(self.before, after):
                terminalreporter.write_line(line)
        if self.sampler is not None:
            terminalreporter.write_line(self.sampler.stop())
        terminalreporter.write_line("(an engine shared with other runs: what they made meanwhile is listed and "
                                    "their builder cache records removed too)")
