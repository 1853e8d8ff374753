"""Where a suite run's minutes go, per worker: a pytest plugin and its reader.

With IMAGEBUILD_TEST_TIMELINE=FILE, every test's worker (pytest-xdist's name), node id, start and end
(setup, call and teardown together) are appended to FILE as one JSON line. `python -m tests.timeline FILE`
prints, per worker, each test file it ran with when it started and ended in the run and its seconds, then
each worker's busy seconds and when it finished: .ci/run prints it after the summary, so a run that grows
says which file grew and whether the two workers ended together (one file too long for its worker) or the
whole suite did.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

ENV = "IMAGEBUILD_TEST_TIMELINE"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.time()
    yield
    line = json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid,
                       "start": started, "end": time.time()})
    with open(os.environ[ENV], "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def read(path: str) -> list[dict]:
    """The records of a timeline file; a line that is not one (a worker killed mid-write) is skipped."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                row = json.loads(line)
                rows.append({"worker": str(row["worker"]), "test": str(row["test"]),
                             "start": float(row["start"]), "end": float(row["end"])})
            except (ValueError, KeyError, TypeError):
                continue
    return rows


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
    print("\n".join(summary(read(sys.argv[1]))))
