#!/usr/bin/env python3
"""A fresh CI runner and a pin bump in the application layer only, with and without --cache-from (issue 13).

Runner A (the session's engine) builds the flagship bench recipe with --cache-to a loopback
docker-registry. Runner B is a second dockerd with its own empty store, builder cache and uv cache
(tests/engine_daemon.py): it builds the same recipe with one more application package, first with
--cache-from (unchanged layers pulled from the registry), then, emptied again, without it. Prints
both, their ratio, what the cache push cost runner A, and the bytes the cache holds.

Usage: .venv/bin/python bench/cache.py [--json OUT]     (~10 minutes, ~25 GB of disk at the peak)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from flagship import _Results, bench_recipe, clock  # noqa: E402

from imagebuild import flows  # noqa: E402
from imagebuild.engine.contract import BuildCache  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402
from tests import engine_daemon, registry_server  # noqa: E402

APPLICATION_EXTRA = '"tomli-w==1.2.0",'  # a small pure-Python wheel: only the application layer moves


def bumped_recipe(recipe: Path) -> Path:
    text = recipe.read_text()
    text = text.replace('"sglang==0.5.23",', f'"sglang==0.5.23", {APPLICATION_EXTRA}', 1)
    assert APPLICATION_EXTRA in text, "the flagship's sglang pin moved: update bench/cache.py"
    path = recipe.with_name("sglang-bench-app.toml")
    path.write_text(text.replace('name = "imagebuild-bench/sglang"', 'name = "imagebuild-bench/sglang-app"'))
    return path


def fresh_build(daemon, recipe: Path, cache: BuildCache | None, ca: str) -> tuple[float, flows.BuildReport]:
    """Build on runner B, whose store holds nothing (the base is imported from the cached rootfs)."""
    daemon.docker("builder", "prune", "-af")
    images = daemon.docker("images", "-aq").stdout.split()
    if images:
        daemon.docker("rmi", "-f", *images)
    os.environ["DOCKER_HOST"] = daemon.host
    try:
        return clock(lambda: flows.build(recipe, DockerEngine(), flows.BuildOptions(ca=ca, cache=cache, rebuild=True)))
    finally:
        del os.environ["DOCKER_HOST"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ca = str(flows.ca_bundle())
    results = _Results()
    engine = DockerEngine()
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        folder = Path(tmp)
        registry = registry_server.start_registry(folder / "registry")
        daemon = engine_daemon.start_daemon()
        try:
            ref = f"{registry.host}/imagebuild-bench/cache:main"
            recipe = bench_recipe(folder, "0.5.23", "0.7.2", "0.2.3.post2")
            bumped = bumped_recipe(recipe)
            flows.lock(recipe)
            flows.lock(bumped)
            seconds, first = clock(lambda: flows.build(recipe, engine, flows.BuildOptions(ca=ca, rebuild=True, run_smoke=False,
                                                          cache=BuildCache(target=ref, insecure_http=True))))
            results["runner_a_build_s"] = first.seconds["build"]
            results["runner_a_cache_push_s"] = first.seconds["cache_push"]
            results["registry_bytes_gb"] = sum(f.stat().st_size for f in registry.storage.rglob("data")) / 1e9
            engine.remove(first.image)

            with_cache, hit = fresh_build(daemon, bumped, BuildCache(sources=(ref,), insecure_http=True), ca)
            results["fresh_with_cache_s"] = with_cache
            results["fresh_with_cache_build_s"] = hit.seconds["build"]
            results["fresh_with_cache_base_s"] = hit.seconds["base"]
            results["fresh_with_cache_smoke_s"] = hit.seconds["smoke"]
            without, cold = fresh_build(daemon, bumped, None, ca)
            results["fresh_without_cache_s"] = without
            results["fresh_without_cache_build_s"] = cold.seconds["build"]
            results["fresh_without_cache_smoke_s"] = cold.seconds["smoke"]
        finally:
            daemon.stop()
            registry.stop()
    print("\nfresh runner, application-layer pin bump, flagship (loopback registry, one run)")
    for key, value in results.items():
        print(f"  {key:34s} {value:10.2f}")
    print(f"  with --cache-from / without   {results['fresh_with_cache_s'] / results['fresh_without_cache_s']:.2f}x"
          f"  (build step alone {results['fresh_with_cache_build_s'] / results['fresh_without_cache_build_s']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
