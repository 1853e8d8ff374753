"""What the [aot] kernel step did in a build, read from the build's output: how many kernels it compiled,
how many it took from the kernel cache, and the seconds its compiles took. The step prints one line
(kernels_aot.STATS_MARK and a JSON object); a step the engine took from its builder cache prints nothing,
and then nothing compiled and every kernel of the image came with the cached layer. While it runs, it prints
a line per module reused, and per module compiling each time its finished objects change
(compile_resume.PROGRESS_MARK): the build shows each as a line of its own, and its report keeps the last.
Also the seed build's one line of counts (seed.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from imagebuild.common import Progress, announce, quiet
from imagebuild.payload.probe.kernels import kernel_cache
from imagebuild.payload.probe.kernels.compile_resume import PROGRESS_MARK
from imagebuild.payload.probe.kernels.kernels_aot import STATS_MARK

COUNTS = ("compiled", "reused", "jobs")
STATES = ("reused", "compiling", "compiled")
KINDS = ("flashinfer", "sglang")
SEED_COUNTS = ("flashinfer", "sglang", "present", "refused")


def _marked_object(line: str, mark: str) -> dict | None:
    """The JSON object after `mark` in a line of build output (BuildKit prefixes `#N 12.3 `), or None."""
    at = line.find(mark)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(mark):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _marked_counts(line: str, mark: str, counts: tuple) -> dict | None:
    """The JSON object after `mark` in a line of build output, when each of `counts` is a count; else None."""
    value = _marked_object(line, mark)
    if value is None or not all(_count(value.get(k)) for k in counts):
        return None
    return value


def parse_stats(line: str) -> dict | None:
    """The step's stats from one line of build output (BuildKit prefixes `#N 12.3 `), or None."""
    value = _marked_counts(line, STATS_MARK, COUNTS)
    if value is None:
        return None
    seconds = value.get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
        return None
    stats = {"compiled": value["compiled"], "reused": value["reused"], "seconds": float(seconds),
             "jobs": value["jobs"], "step": "ran"}
    times = _compile_times(value.get("compile_times"))
    if times:
        stats["compile_times"] = times
    listed = value.get("rejected") if isinstance(value.get("rejected"), list) else []
    rejected = [entry for entry in listed if isinstance(entry, dict)
                and all(isinstance(entry.get(k), str) for k in ("kind", "name", "problem"))]
    if rejected:
        stats["rejected"] = [{k: entry[k] for k in ("kind", "name", "problem")} for entry in rejected]
    resumed = value.get("resumed_objects")
    if isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0:
        stats["resumed_objects"] = resumed
    triton = value.get("triton")  # the forward's Triton kernels compiled into Triton's cache (kernels_triton.py)
    if isinstance(triton, dict) and _count(triton.get("kernels")) and isinstance(triton.get("seconds"), (int, float)) \
            and not isinstance(triton["seconds"], bool) and triton["seconds"] >= 0:
        stats["triton"] = {"kernels": triton["kernels"], "seconds": float(triton["seconds"])}
    return stats


def _compile_times(value) -> dict:
    """The step's per-module compile times (kernels_aot.compile_times), the well-formed entries only."""
    if not isinstance(value, dict):
        return {}
    kept = {}
    for name, entry in value.items():
        numbers = [entry.get(k) for k in ("objects", "cpu_s", "longest_s")] if isinstance(entry, dict) else [None]
        if isinstance(name, str) and all(isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 0
                                         for n in numbers):
            kept[name] = dict(zip(("objects", "cpu_s", "longest_s"), numbers))
    return kept


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_progress(line: str) -> dict | None:
    """One module's progress from a line of build output (compile_resume.say): kind, name, state, and where known
    objects_done, objects and seconds; None when the line is not one."""
    value = _marked_object(line, PROGRESS_MARK)
    if value is None or value.get("kind") not in KINDS or value.get("state") not in STATES or \
            not isinstance(value.get("name"), str) or not value["name"]:
        return None
    event = {"kind": value["kind"], "name": value["name"][:300], "state": value["state"]}
    if _count(value.get("objects_done")) and _count(value.get("objects")):
        event["objects_done"], event["objects"] = value["objects_done"], value["objects"]
    seconds = value.get("seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
        event["seconds"] = float(seconds)
    return event


def progress_text(event: dict) -> str:
    """A module's progress as the build shows it: name, what happened, objects done of total, seconds."""
    text = f"kernel {event['name']} ({event['kind']}): "
    text += "reused from the kernel cache" if event["state"] == "reused" else event["state"]
    if "objects" in event:
        text += f", {event['objects_done']} of {event['objects']} objects"
    if event["state"] != "reused" and "seconds" in event:
        text += f", {event['seconds']:.0f} s"
    return text


class KernelStepWatch:
    """Wraps a build's progress callback: passes every line on, says each module's progress as its own line, and
    keeps the kernel step's stats and each module's last progress."""

    def __init__(self, progress: Progress):
        self.progress, self.stats, self.modules = progress, None, {}

    def __call__(self, line: str) -> None:
        self.stats = parse_stats(line) or self.stats
        event = parse_progress(line)
        if event is not None:
            self.modules[(event["kind"], event["name"])] = event
            announce(self.progress, "kernel", event, progress_text(event))
        self.progress(line)

    def report(self, cached_artifacts: Callable[[], int | None]) -> dict:
        """What the step did; when it did not run, how many kernels the cached layer holds."""
        if self.stats is not None:
            return dict(self.stats, **({"modules": list(self.modules.values())} if self.modules else {}))
        return {"compiled": 0, "reused": cached_artifacts(), "seconds": 0.0, "jobs": None, "step": "cached"}


def summary(kernels: dict) -> str:
    if kernels["step"] == "cached":
        text = (f"kernels: the step was in the builder cache, nothing compiled "
                f"({kernels['reused'] if kernels['reused'] is not None else 'all'} kernels came with the layer)")
    else:
        text = (f"kernels: {kernels['compiled']} compiled, {kernels['reused']} reused from the kernel cache, "
                f"{kernels['seconds']:.1f} s compiling ({kernels['jobs']} jobs)")
        times = kernels.get("compile_times") or {}
        if times:
            objects = sum(entry["objects"] for entry in times.values())
            text += (f"; {objects} objects, {sum(entry['cpu_s'] for entry in times.values()) / 60:.1f} CPU-minutes, "
                     f"the longest {max(entry['longest_s'] for entry in times.values()):.0f} s")
        if kernels.get("rejected"):
            text += (f"; {len(kernels['rejected'])} cached kernels were not the bytes their entries record and were "
                     "compiled again: " + ", ".join(f"{e['kind']} {e['name']} ({e['problem']})" for e in kernels["rejected"]))
        if kernels.get("resumed_objects"):
            text += f"; {kernels['resumed_objects']} objects came from an interrupted compile of the same kernels"
        if kernels.get("triton"):
            text += (f"; {kernels['triton']['kernels']} Triton kernels of the forward compiled into Triton's cache "
                     f"({kernels['triton']['seconds']:.1f} s)")
    seeded = kernels.get("seeded")
    if seeded and seeded.get("added"):
        added = seeded["added"]
        sources = ", ".join(taken["source"] for taken in seeded["taken"])
        text += (f"; the kernel cache took {added['flashinfer']} FlashInfer and {added['sglang']} SGLang entries "
                 f"({added['present']} already there) from the kernel layer{'s' if len(seeded['taken']) > 1 else ''}"
                 f" of {sources}")
    return text


def parse_seeded(line: str) -> dict | None:
    """The seed build's counts from one line of its output, or None."""
    value = _marked_counts(line, kernel_cache.SEED_MARK, SEED_COUNTS)
    return {k: value[k] for k in SEED_COUNTS} if value is not None else None
