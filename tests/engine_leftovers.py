"""What a test run leaves in the session's engine, said at the end of the run: the images that were not
there when it began (imagebuild's own bases named apart) and how much the builder cache grew. The suite
removes what its tests made; this names what is left anyway, so a run never grows the user's engine
unseen. Nothing is removed here: the engine may be shared, and an image another run made meanwhile is
listed too (the report says so).

Registered by tests/conftest.py on the controlling process (not on xdist's workers).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")
BASE_REPOSITORY = "imagebuild/base"
_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


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


class Reporter:
    """The pytest plugin: the state at the start, the lines at the end."""

    def __init__(self):
        self.before = None

    def pytest_sessionstart(self, session):
        self.before = read_state()

    def pytest_terminal_summary(self, terminalreporter):
        after = read_state() if self.before is not None else None
        terminalreporter.section("what this run left in the engine")
        if self.before is None or after is None:
            terminalreporter.write_line(f"the engine ({DOCKER}) did not answer: nothing measured")
            return
        for line in leftovers(self.before, after):
            terminalreporter.write_line(line)
        terminalreporter.write_line("(an engine shared with other runs: what they made meanwhile is listed too)")
