#!/usr/bin/env python3
"""The flagship against the one-line uv Dockerfile people write instead, on the same base, in one run
(issue 13).

Baseline:  FROM <base>; RUN uv venv /opt/venv && uv pip install sglang==<same>   (one RUN, uv from
           the build context, no cache mount: what the one-liner is)
Ours:      imagebuild build of the flagship recipe (smoke test included: it gates the tag)

Prints, each against the baseline measured in this run: cold build with the smoke test and without it
(builder cache pruned before each, two rounds in opposite order), the real pin move 0.5.23 -> 0.5.22
against our cold build, the no-op with the builder cache kept and pruned, the smoke test with its
checks run at once against one at a time, and where our cold build's seconds go (BuildKit's own step
times: each layer's install, the layer export; the downloads from a cold build with uv's cache mount
kept). Takes ~20 minutes and prunes the builder cache.

Usage: .venv/bin/python bench/uvline.py [--rounds N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from assemble import BuildKitSteps  # noqa: E402
from flagship import DOCKER, _Results, baseline_build, bench_recipe, clock, locked_bench, prune, sh  # noqa: E402

from imagebuild import flows  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402
from imagebuild.lock import uv_binary  # noqa: E402

UV_LINE = """\
FROM {base}
RUN --mount=type=bind,source=uv,target=/usr/local/bin/uv --mount=type=secret,id=ca \\
    SSL_CERT_FILE=/run/secrets/ca uv venv /opt/venv && \\
    SSL_CERT_FILE=/run/secrets/ca uv pip install --no-cache --python /opt/venv/bin/python sglang=={version}
"""
LAYER_FILE = re.compile(r"requirements/\d+-([a-z]+)\.txt")


def step_times(lines: list[str]) -> dict[str, float]:
    """BuildKit's own seconds per step of a plain-progress log: each install RUN by its layer, the
    rest summed, and the layer export."""
    steps = BuildKitSteps.parse(line.strip() for line in lines)
    seconds: dict[str, float] = {}
    for step in steps.steps.values():
        instruction = step["instruction"]
        layer = LAYER_FILE.search(instruction)
        install = instruction.startswith("RUN") and layer and "uv pip install" in instruction
        key = f"install {layer.group(1)}" if install else "other steps"
        seconds[key] = seconds.get(key, 0.0) + (step["seconds"] or 0.0)
    seconds["layer export"] = steps.export_seconds or 0.0
    return seconds


def prune_layers_keep_downloads() -> None:
    """The builder's layer records go, uv's cache mount stays: a cold build without the downloads."""
    sh(DOCKER, "builder", "prune", "-af", "--filter", "type=regular")
    sh("sync")
    time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine = DockerEngine()
    ca = flows.ca_bundle()
    results = _Results()
    runs: dict[str, list[float]] = {"uv_cold": [], "ours_cold": [], "ours_cold_no_smoke": [], "ours_smoke": []}

    with tempfile.TemporaryDirectory(prefix="bench-uvline-") as tmp:
        folder = Path(tmp)
        recipe, base = locked_bench(folder, engine)
        line = folder / "uvline"
        line.mkdir()
        (line / "Dockerfile").write_text(UV_LINE.format(base=base, version="0.5.23"))
        shutil.copy2(uv_binary(), line / "uv")

        def uv_cold() -> float:
            seconds = baseline_build(line, "imagebuild-bench/uvline", ca)
            results["uv_size_gb"] = engine.inspect("imagebuild-bench/uvline").size / 1e9
            engine.remove("imagebuild-bench/uvline")
            return seconds

        log: list[str] = []

        def ours_cold():
            log.clear()
            seconds, built = clock(lambda: flows.build(recipe, engine, flows.BuildOptions(ca=str(ca), rebuild=True,
                                                          progress=log.append)))
            results["ours_size_gb"] = built.size / 1e9
            return seconds, built

        report = None
        orders = [("ours", "uv"), ("uv", "ours")]
        for number in range(args.rounds):
            for who in orders[number % 2]:
                if who == "ours" and report is not None:
                    engine.remove(report.image_id)
                prune()
                if who == "uv":
                    runs["uv_cold"].append(uv_cold())
                else:
                    seconds, report = ours_cold()
                    runs["ours_cold"].append(seconds)
                    runs["ours_smoke"].append(report.seconds["smoke"])
                    runs["ours_cold_no_smoke"].append(seconds - report.seconds["smoke"])
                    for step, value in step_times(log).items():
                        results[f"round{number + 1}_ours_{step.replace(' ', '_')}_s"] = value
                print(f"  .. round {number + 1}, {who} cold: {runs[who + '_cold'][-1]:.1f} s", flush=True)
        for key, values in runs.items():
            results[f"{key}_s"] = statistics.mean(values)

        # Downloads: the same cold build with uv's cache mount kept (only the layer records pruned).
        engine.remove(report.image_id)
        prune_layers_keep_downloads()
        warm, rebuilt = ours_cold()
        results["ours_cold_uv_cache_kept_s"] = warm
        results["ours_downloads_s"] = statistics.mean(runs["ours_cold"]) - warm
        report = rebuilt

        results["noop_cache_kept_s"], again = clock(lambda: flows.build(recipe, engine, flows.BuildOptions(ca=str(ca))))
        assert again.reused, "the no-op did not reuse the image"
        prune()
        results["noop_builder_pruned_s"], again = clock(lambda: flows.build(recipe, engine, flows.BuildOptions(ca=str(ca))))
        assert again.reused, "the no-op after a builder prune did not reuse the image"

        # The smoke test, same image: checks at once (the default) against one at a time (as before).
        for jobs in ("default", "1", "default", "1"):
            command = flows.PROBE_COMMAND + (() if jobs == "default" else ("--jobs", jobs))
            seconds, done = clock(lambda: engine.run(report.image_id, command, timeout=flows.SMOKE_TIMEOUT_S))
            assert done.exit_code == 0, done.stderr[-2000:]
            runs.setdefault(f"smoke_jobs_{jobs}", []).append(seconds)
        results["smoke_at_once_s"] = statistics.mean(runs["smoke_jobs_default"])
        results["smoke_in_turn_s"] = statistics.mean(runs["smoke_jobs_1"])

        # The real pin move: relock, build, smoke (what a pin bump costs before it is tagged).
        bumped = bench_recipe(folder, "0.5.22", "0.7.1", "0.2.2", exclude="cuda-tile")
        results["pin_move_s"], bump = clock(lambda: flows.build(bumped, engine, flows.BuildOptions(relock=True, ca=str(ca))))
        results["pin_move_smoke_s"] = bump.seconds["smoke"]
        for ref in {report.image, report.image_id, bump.image_id}:
            engine.remove(ref)

    cold_uv = results["uv_cold_s"]
    print("\nflagship against the one-RUN uv line (same base, same machine, one run)")
    for key, value in results.items():
        print(f"  {key:40s} {value:10.2f}")
    print(f"  cold, smoke included   ours/uv   {results['ours_cold_s'] / cold_uv:.2f}x (target <= 1.0x)")
    print(f"  cold, without smoke    ours/uv   {results['ours_cold_no_smoke_s'] / cold_uv:.2f}x (target <= 0.7x)")
    print(f"  pin move 0.5.23->0.5.22 / ours cold  {results['pin_move_s'] / results['ours_cold_s']:.2f}x "
          "(target <= 0.3x)")
    print(f"  no-op  {results['noop_cache_kept_s']:.2f} s cache kept, {results['noop_builder_pruned_s']:.2f} s "
          "builder pruned (target <= 3 s)")
    print(f"  smoke  at once / in turn  {results['smoke_at_once_s'] / results['smoke_in_turn_s']:.2f}x")
    print(f"  size   ours/uv   {results['ours_size_gb'] / results['uv_size_gb']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "runs": runs}, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
