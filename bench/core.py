#!/usr/bin/env python3
"""Core pipeline speed, as ratios against baselines measured in the same run (issue 2).

- lock: `imagebuild lock` (base cached) vs a raw `uv pip compile` of the same requirements and target;
- no-op build: `imagebuild build` of an unchanged recipe (image and smoke result already there);
- cold-ish build: after removing the image (BuildKit's layer cache kept), and after pruning it too;
- peak memory of the imagebuild process during a build (a 10 GB image must stream, not sit in memory).

Usage: .venv/bin/python bench/core.py [RECIPE] [--prune]   (default recipes/cuda-toolchain.toml)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGEBUILD = [sys.executable, "-m", "imagebuild"]


def timed(command: list[str], **kwargs) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - start, done


def best_of(n: int, command: list[str]) -> float:
    return min(timed(command)[0] for _ in range(n))


def raw_compile_command(recipe_path: Path, workdir: Path) -> list[str]:
    from imagebuild.bootstrap import identify
    from imagebuild.lock import compile_command, uv_binary
    from imagebuild.recipe.model import load_recipe
    recipe = load_recipe(recipe_path)
    base = identify(recipe.base)
    return compile_command(recipe, base, workdir, uv_binary())


def peak_child_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", nargs="?", default=str(REPO / "recipes" / "cuda-toolchain.toml"))
    parser.add_argument("--prune", action="store_true", help="also time a build after `docker builder prune -af`")
    args = parser.parse_args()
    recipe = Path(args.recipe).resolve()
    results: dict[str, float] = {}

    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_compile_command(recipe, Path(tmp))
        subprocess.run(raw, cwd=tmp, capture_output=True)  # warm uv's index cache for both sides
        results["uv_pip_compile_s"] = min(timed(raw, cwd=tmp)[0] for _ in range(5))
    with tempfile.TemporaryDirectory() as tmp:
        lock_cmd = IMAGEBUILD + ["lock", str(recipe), "--lock", str(Path(tmp) / "x.lock")]
        results["imagebuild_lock_s"] = best_of(5, lock_cmd)

    build = IMAGEBUILD + ["build", str(recipe), "--json"]
    timed(build)  # make sure the image and its smoke result exist
    noop = [timed(build)[0] for _ in range(5)]
    results["noop_build_s"] = statistics.median(noop)
    report = json.loads(timed(build)[1].stdout)
    image = report["image"]

    subprocess.run(["/usr/bin/docker", "rmi", "-f", image], capture_output=True)
    results["rebuild_after_rmi_s"], done = timed(build)
    if args.prune:
        subprocess.run(["/usr/bin/docker", "rmi", "-f", image], capture_output=True)
        subprocess.run(["/usr/bin/docker", "builder", "prune", "-af"], capture_output=True)
        results["cold_build_after_prune_s"], done = timed(build)
    results["image_size_gb"] = json.loads(done.stdout)["size_bytes"] / 1e9
    results["peak_rss_of_imagebuild_mb"] = peak_child_rss_mb()

    print(f"recipe: {recipe.relative_to(REPO) if recipe.is_relative_to(REPO) else recipe}")
    for key, value in results.items():
        print(f"  {key:32s} {value:8.2f}")
    print(f"  lock / raw uv pip compile        {results['imagebuild_lock_s'] / results['uv_pip_compile_s']:8.2f}x"
          "  (target <= 2x)")
    print(f"  no-op build                      {results['noop_build_s']:8.2f} s  (target <= 5 s)")


if __name__ == "__main__":
    main()
