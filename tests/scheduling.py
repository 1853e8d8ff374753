"""A background worker for the suite's quick files: pytest-xdist's --dist loadfile, plus one worker at low CPU
priority that takes only the files that use neither the engine nor the slow tier.

Why: the suite's two workers spend minutes waiting on the disk and the engine (layer commits, `docker save` of
multi-GB images, registry pushes), when the two cores sit idle or in iowait (a fifth of the run, measured
2026-12-07: docs/ci.md); the pure files (parsers, rules, hypothesis properties) need only the CPU. Run at
`nice` BACKGROUND_NICE on a third worker, they take the cores the two heavy workers leave, and the heavy
workers no longer run them at the end. The background worker gets no engine file, so the disk peak and the
locked mounts are as with two workers.

With IMAGEBUILD_TEST_BACKGROUND=1 (scripts/host.sh test sets it and adds the worker to -n), the last worker
(gw<N-1>) is the background one. Each worker writes the pure files it collected to IMAGEBUILD_TEST_PURE_FILES, a
file the controlling process named; the scheduler reads it once every worker has collected, before it hands out
any work. A plugin: tests/conftest.py registers it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

ENV = "IMAGEBUILD_TEST_BACKGROUND"
FILES_ENV = "IMAGEBUILD_TEST_PURE_FILES"
BACKGROUND_NICE = 10  # CFS weight 110 against 1024: about a tenth of a core a heavy worker wants, all of an idle one
HEAVY_MARKS = frozenset({"slow", "engine"})  # a file with a test marked so is not pure


def is_pure(marks: set[str]) -> bool:
    """A file whose tests carry these marks uses neither the engine nor the slow tier."""
    return not marks & HEAVY_MARKS


def wanted(config) -> bool:
    """On the controlling process: the background worker was asked for, with --dist loadfile over 2+ workers."""
    return (os.environ.get(ENV) == "1" and config.getoption("dist", "no") == "loadfile"
            and (config.getoption("numprocesses", 0) or 0) >= 2)


def background_id(count: int) -> str:
    return f"gw{count - 1}"


def is_background(workerinput: dict | None) -> bool:
    """On a worker: this worker is the background one."""
    return bool(workerinput) and os.environ.get(ENV) == "1" and \
        workerinput.get("workerid") == background_id(int(workerinput.get("workercount", 0)))


def write_pure_files(path: str, files: list[str]) -> None:
    """The files a worker ranked pure, as JSON (temp + rename: the scheduler never reads half of it)."""
    target = Path(path)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(handle, "w") as out:
        json.dump(sorted(files), out)
    os.replace(temp, target)


def read_pure_files(path: str | None) -> frozenset[str]:
    """What write_pure_files wrote; nothing (the background worker idles out) when it is missing or unreadable."""
    try:
        found = json.loads(Path(path).read_text()) if path else []
    except (OSError, ValueError):
        return frozenset()
    return frozenset(name for name in found if isinstance(name, str)) if isinstance(found, list) else frozenset()


def make_scheduler(config, log):
    """xdist's LoadFileScheduling, whose last worker takes pure files only."""
    from xdist.scheduler import LoadFileScheduling

    class BackgroundFileScheduling(LoadFileScheduling):
        """Heavy workers take files in the suite's order (longest first); the background worker takes the
        first pure file still queued, and is shut down when none is left."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.background = background_id(self.numnodes)
            self.pure: frozenset[str] | None = None

        def _is_background(self, node) -> bool:
            return node.gateway.id == self.background

        def _assign_work_unit(self, node) -> None:
            if not self._is_background(node):
                return super()._assign_work_unit(node)
            if self.pure is None:
                self.pure = read_pure_files(os.environ.get(FILES_ENV))
            scope = next((scope for scope in self.workqueue if scope in self.pure), None)
            if scope is None:
                node.shutdown()
                return None
            # LoadScopeScheduling._assign_work_unit takes the queue's first unit; this one the first pure unit.
            self.workqueue.move_to_end(scope, last=False)
            return super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if self._is_background(node) and not node.shutting_down and self.workqueue and \
                    self._pending_of(self.assigned_work[node]) <= 2:
                return self._assign_work_unit(node)  # shuts the node down when no pure unit is left
            return super()._reschedule(node)

    return BackgroundFileScheduling(config, log)


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None and wanted(config):
        handle, path = tempfile.mkstemp(prefix="imagebuild-pure-files.", suffix=".json")
        os.close(handle)
        os.environ[FILES_ENV] = config.imagebuild_pure_files = path
    elif is_background(workerinput):
        os.nice(BACKGROUND_NICE)
    if workerinput is not None:
        os.environ.pop(ENV, None)  # a pytest that a test starts is a suite of its own


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    path = os.environ.pop(FILES_ENV, None) if hasattr(config, "workerinput") else None
    if path:
        files: dict[str, set[str]] = {}
        for item in items:
            files.setdefault(item.nodeid.split("::", 1)[0], set()).update(mark.name for mark in item.iter_markers())
        write_pure_files(path, [name for name, marks in files.items() if is_pure(marks)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log) if wanted(config) else None


def pytest_unconfigure(config):
    path = getattr(config, "imagebuild_pure_files", None)
    if path:
        Path(path).unlink(missing_ok=True)
