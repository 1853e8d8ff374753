"""An interrupted kernel compile resumes from the objects it finished (the [aot] step's compile of FlashInfer
modules, kernels_aot.build_flashinfer).

A fused-MoE module is ~100 CUTLASS objects and hours of one machine's cores; a step killed near its end (a CI
job's time limit, an OOM, Ctrl-C) would start again from nothing. Its objects are kept in the kernel cache
(kernel_cache.KernelCache.partial: ROOT/partial/<digest of the modules' keys>) while it runs, so the next build
of the same keys compiles only what was left. The keys hold everything that decides the bytes (sources,
flags, compilers, headers), so an object kept is the object that would be compiled; ninja's own log and
deps decide which are finished. `Watch` reads the same log to say, per module, how many of its objects are
done while the compile runs (one marked line each time a module advances: flows/kernels/step.py shows it). Standard
library only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time

PROGRESS_MARK = "imagebuild-kernel-progress: "  # a build output line: one module reused, compiling or compiled


class Resumable:
    """A compile that keeps what it finished in the cache while it runs .

    The compile runs where FlashInfer planned it (nvcc folds the source's real path into its symbols, so the
    workspace is never moved or linked). On entry the planned workspace is saved to the partial folder, or,
    when an earlier compile of the same keys left one, the folder is copied back over it: its generated
    sources (the same bytes, by the keys) with their old modification times, its finished objects, ninja's
    log and deps, so ninja rebuilds only what was not finished. While the compile runs, every `interval`
    seconds the objects ninja has logged since are copied into the folder, then the log and deps (each file
    through a temporary name). A clean end removes the folder (its modules are entries by then); a failure
    saves once more and keeps it. No cache or nothing to key: nothing is kept."""

    def __init__(self, cache, workspace: str, keys: list, interval: float = 20.0):
        self.workspace, self.interval = workspace.rstrip(os.sep), interval
        self.folder = cache.partial(keys)  # None: no cache, or a module without a key
        self.resumed = 0  # objects an earlier compile finished, found when this one began
        self._saved: set = set()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "Resumable":
        if self.folder is None:
            return self
        if os.path.isdir(self.folder):
            shutil.copytree(self.folder, self.workspace, dirs_exist_ok=True)  # copy2: times kept to the nanosecond
            self._saved = {os.path.relpath(path, self.folder) for path in objects_under(self.folder)}
            self.resumed = len(self._saved)
            os.utime(self.folder, None)
        else:
            os.makedirs(os.path.dirname(self.folder), exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(self.folder))
            shutil.copytree(self.workspace, staging, symlinks=True, dirs_exist_ok=True)
            os.rename(staging, self.folder)
        self._thread = threading.Thread(target=self._keep, name="imagebuild-kernel-checkpoint", daemon=True)
        self._thread.start()
        return self

    def _keep(self) -> None:
        while not self._stop.wait(self.interval):
            self.save()

    def save(self) -> int:
        """Copy the objects ninja logged since the last save, then its log and deps; returns how many objects."""
        ops = os.path.join(self.workspace, "cached_ops")
        added = 0
        for output in logged_outputs(os.path.join(ops, ".ninja_log")):
            relative = os.path.relpath(os.path.join(ops, output), self.workspace)
            if relative.endswith(".o") and relative not in self._saved and not relative.startswith(".."):
                if _copy_file(os.path.join(self.workspace, relative), os.path.join(self.folder, relative)):
                    self._saved.add(relative)
                    added += 1
        for name in (".ninja_log", ".ninja_deps"):  # after the objects: the saved log names only saved objects
            _copy_file(os.path.join(ops, name), os.path.join(self.folder, "cached_ops", name))
        return added

    def abandon(self) -> None:
        """Stop saving, as a killed step does."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __exit__(self, kind, value, traceback) -> None:
        if self.folder is None:
            return
        self.abandon()
        if kind is None:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            self.save()


def logged_outputs(log: str) -> list:
    """The outputs of ninja's log (`start end mtime output hash` per finished command), in its order."""
    try:
        with open(log, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return [fields[3] for fields in (line.split("\t") for line in lines) if len(fields) >= 5]


def _copy_file(source: str, target: str) -> bool:
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target + ".tmp")
        os.replace(target + ".tmp", target)
        return True
    except OSError:
        return False


def objects_under(folder: str) -> list:
    return sorted(os.path.join(root, name) for root, _, files in os.walk(folder) for name in files
                  if name.endswith(".o"))


def say(event: dict, out=None) -> None:
    """One progress line (PROGRESS_MARK and a JSON object: kind, name, state, objects_done, objects, seconds)."""
    print(PROGRESS_MARK + json.dumps(event, sort_keys=True), file=out or sys.stdout, flush=True)


def module_objects(ninja_path: str) -> list:
    """The objects a module's build.ninja compiles (its `build OUT: compile|cuda_compile IN` lines)."""
    try:
        with open(ninja_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read().replace("$\n", " ")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        outputs, colon, rest = line[6:].partition(":") if line.startswith("build ") else ("", "", "")
        if colon and rest.split()[:1] in (["compile"], ["cuda_compile"]):
            found += [os.path.normpath(o) for o in outputs.split()]
    return found


class Watch:
    """Says how a compile of FlashInfer modules advances: every `interval` seconds, for each module whose finished
    objects (ninja's log) changed, a line with objects done of its total and the seconds since the compile began;
    at the end, a line per module compiled. `specs`: FlashInfer JitSpecs (name, ninja_path, jit_library_path)."""

    def __init__(self, specs: list, interval: float = 10.0, out=None):
        self.interval, self.out, self.started = interval, out, time.monotonic()
        self.objects = {one.name: set(module_objects(str(one.ninja_path))) for one in specs}
        self.logs = sorted({os.path.join(os.path.dirname(os.path.dirname(str(one.jit_library_path))), ".ninja_log")
                            for one in specs})
        self.done = {name: -1 for name in self.objects}
        self._stop = threading.Event()
        self._thread = None

    def finished(self) -> dict:
        """Objects of each module ninja's logs name as built."""
        built = set()
        for log in self.logs:
            built |= {os.path.normpath(o if os.path.isabs(o) else os.path.join(os.path.dirname(log), o))
                      for o in logged_outputs(log)}
        return {name: len(objects & built) for name, objects in self.objects.items()}

    def poll(self, state: str = "compiling") -> None:
        for name, count in sorted(self.finished().items()):
            if count != self.done[name] or state != "compiling":
                self.done[name] = count
                say({"kind": "flashinfer", "name": name, "state": state, "objects_done": count,
                     "objects": len(self.objects[name]), "seconds": round(time.monotonic() - self.started, 1)},
                    self.out)

    def __enter__(self) -> "Watch":
        if self.objects:
            self._thread = threading.Thread(target=self._keep, name="imagebuild-kernel-progress", daemon=True)
            self._thread.start()
        return self

    def _keep(self) -> None:
        self.poll()
        while not self._stop.wait(self.interval):
            self.poll()

    def __exit__(self, kind, value, traceback) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if kind is None and self.objects:
            self.poll("compiled")
