"""What the [aot] kernel step did in a build, read from the build's output: how many kernels it compiled,
how many it took from the kernel cache, and the seconds its compiles took. The step prints one line
(kernels_aot.STATS_MARK and a JSON object); a step the engine took from its builder cache prints nothing,
and then nothing compiled and every kernel of the image came with the cached layer.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from imagebuild.payload.probe.kernels_aot import STATS_MARK

COUNTS = ("compiled", "reused", "jobs")


def parse_stats(line: str) -> dict | None:
    """The step's stats from one line of build output (BuildKit prefixes `#N 12.3 `), or None."""
    at = line.find(STATS_MARK)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(STATS_MARK):])
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
                                              and value[k] >= 0 for k in COUNTS):
        return None
    seconds = value.get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
        return None
    return {"compiled": value["compiled"], "reused": value["reused"], "seconds": float(seconds),
            "jobs": value["jobs"], "step": "ran"}


class KernelStepWatch:
    """Wraps a build's progress callback: passes every line on, keeps the kernel step's stats."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress, self.stats = progress, None

    def __call__(self, line: str) -> None:
        self.stats = parse_stats(line) or self.stats
        self.progress(line)

    def report(self, cached_artifacts: Callable[[], int | None]) -> dict:
        """What the step did; when it did not run, how many kernels the cached layer holds."""
        if self.stats is not None:
            return dict(self.stats)
        return {"compiled": 0, "reused": cached_artifacts(), "seconds": 0.0, "jobs": None, "step": "cached"}


def summary(kernels: dict) -> str:
    if kernels["step"] == "cached":
        return (f"kernels: the step was in the builder cache, nothing compiled "
                f"({kernels['reused'] if kernels['reused'] is not None else 'all'} kernels came with the layer)")
    return (f"kernels: {kernels['compiled']} compiled, {kernels['reused']} reused from the kernel cache, "
            f"{kernels['seconds']:.1f} s compiling ({kernels['jobs']} jobs)")
