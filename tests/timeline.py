"""Where a suite run's minutes go, per worker: a pytest plugin and its reader.

With IMAGEBUILD_TEST_TIMELINE=FILE, every test's worker (pytest-xdist's name), node id, start and end
(setup, call and teardown together) are appended to FILE as one JSON line. `python -m tests.timeline FILE`
prints, per worker, each test file it ran with when it started and ended in the run and its seconds, then
each worker's busy seconds and when it finished: .ci/run prints it after the summary, so a run that grows
says which file grew and whether the two workers ended together (one file too long for its worker) or the
whole suite did.

Each `flows.build` a test calls is recorded too (its recipe, its wall time, the report's own step seconds:
lock, base, build, smoke; the kernel step's compiles), and the reader lists the builds of at least a minute
under the files: which step of which image a slower run spent its minutes in.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ENV = "IMAGEBUILD_TEST_TIMELINE"


_running = {"test": ""}  # the node id of the test this worker runs now, for the builds it calls


def _append(record: dict) -> None:
    with open(os.environ[ENV], "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def pytest_configure(config):
    """flows.build wrapped in this process: each call appends a build record (tests call it as flows.build)."""
    from imagebuild import flows
    if getattr(flows.build, "timeline_wrapped", False):
        return
    build = flows.build

    def recorded(recipe, *args, **kwargs):
        started, report, error = time.time(), None, None
        try:
            report = build(recipe, *args, **kwargs)
            return report
        except BaseException as failed:
            error = type(failed).__name__
            raise
        finally:
            _append({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": _running["test"],
                     "build": Path(str(recipe)).stem, "start": started, "end": time.time(), "error": error,
                     "steps": build_steps(report)})

    recorded.timeline_wrapped = True
    flows.build = recorded


def build_steps(report) -> dict:
    """A build report's own step seconds (each platform's, prefixed, for a several-platform build) and its
    kernel step's: {step: seconds}."""
    if report is None:
        return {}
    parts = getattr(report, "platforms", None) or {"": report}
    steps = {}
    for arch, one in parts.items():
        prefix = f"{arch}:" if arch else ""
        steps.update({prefix + str(name): round(float(seconds), 1)
                      for name, seconds in (getattr(one, "seconds", None) or {}).items()})
        kernels = getattr(one, "kernels", None) or {}
        if kernels.get("step") == "ran":
            steps[prefix + "kernels"] = round(float(kernels.get("seconds") or 0.0), 1)
            steps[prefix + "triton"] = round(float((kernels.get("triton") or {}).get("seconds") or 0.0), 1)
    return steps


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.time()
    _running["test"] = item.nodeid
    yield
    _append({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid,
             "start": started, "end": time.time()})


def read(path: str, builds: bool = False) -> list[dict]:
    """The test records of a timeline file (the build records with builds=True); a line that is not one (a
    worker killed mid-write) is skipped."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or ("build" in row) != builds:
                    continue
                kept = {"worker": str(row["worker"]), "test": str(row["test"]),
                        "start": float(row["start"]), "end": float(row["end"])}
                if builds:
                    steps = row.get("steps") if isinstance(row.get("steps"), dict) else {}
                    kept.update(build=str(row["build"]), error=None if row.get("error") is None else str(row["error"]),
                                steps={str(k): float(v) for k, v in steps.items()})
                rows.append(kept)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return rows


def build_summary(builds: list[dict], began: float, shortest: float = 60.0) -> list[str]:
    """The builds of at least `shortest` seconds in the order they started: worker, start in the run, wall
    seconds, the recipe and the test, then the report's step seconds."""
    lines = []
    for row in sorted(builds, key=lambda row: row["start"]):
        took = row["end"] - row["start"]
        if took < shortest:
            continue
        steps = ", ".join(f"{name} {seconds:.0f}" for name, seconds in row["steps"].items()) or "no report"
        failed = f" ({row['error']})" if row["error"] else ""
        lines.append(f"{row['worker']:8} {row['start'] - began:7.0f} {took:7.0f}  build {row['build']}{failed} "
                     f"in {row['test'].split('::')[-1] or 'no test'}: {steps}")
    return [f"{'worker':8} {'from s':>7} {'took s':>7}  builds of a minute or more (steps in s)"] + lines if lines else []


def summary(rows: list[dict], shortest: float = 20.0) -> list[str]:
    """Per worker, its files of at least `shortest` seconds (start, end, seconds, tests), then its totals."""
    if not rows:
        return ["no tests recorded"]
    began = min(row["start"] for row in rows)
    files: dict = {}
    for row in sorted(rows, key=lambda row: row["start"]):
        entry = files.setdefault((row["worker"], row["test"].split("::", 1)[0]), [row["start"], row["end"], 0.0, 0])
        entry[1] = max(entry[1], row["end"])
        entry[2] += row["end"] - row["start"]
        entry[3] += 1
    lines = [f"{'worker':8} {'from s':>7} {'to s':>7} {'took s':>7} {'tests':>5}  file"]
    for (worker, name), (start, end, took, count) in sorted(files.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        if took >= shortest:
            lines.append(f"{worker:8} {start - began:7.0f} {end - began:7.0f} {took:7.0f} {count:5d}  {name}")
    for worker in sorted({row["worker"] for row in rows}):
        own = [row for row in rows if row["worker"] == worker]
        lines.append(f"{worker}: busy {sum(r['end'] - r['start'] for r in own):.0f} s, "
                     f"done at {max(r['end'] for r in own) - began:.0f} s, {len(own)} tests")
    return lines


if __name__ == "__main__":
    tests = read(sys.argv[1])
    print("\n".join(summary(tests)))
    if tests:
        print("\n".join(build_summary(read(sys.argv[1], builds=True), min(row["start"] for row in tests))))
