#!/usr/bin/env python3
"""arm64 under emulation against amd64 native, measured in the same run (issue 14).

- toolchain: recipes/cuda-toolchain-multiarch.toml built cold for both platforms (lock-labelled images
  removed, builder cache and uv cache mount pruned): per platform the base, build, smoke seconds and
  image size, and arm64 / amd64 ratios. amd64 is the baseline: the same recipe built natively.
- --flagship: the flagship recipe for arm64 only (DGX Spark, sm_121a), locked and built under emulation
  without its x86_64 [[prune]] globs, from an empty builder cache, with a time limit: how long the
  lock, each build step and the smoke test take, and where it stood when the limit came. It says
  whether the full stack is practical to emulate on this machine.

Usage: .venv/bin/python bench/platforms.py [--flagship] [--limit SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")


def cold(engine, recipe: Path) -> None:
    """Nothing of an earlier build of this recipe left: its images, the builder cache, the uv cache mount."""
    from imagebuild.lock import read_locks
    from imagebuild.lock.lockfile import default_lock_path
    from imagebuild.recipe.model import load_recipe
    from imagebuild.render import LABEL_PREFIX
    locks = read_locks(default_lock_path(load_recipe(recipe)))
    for one in getattr(locks, "locks", {"": locks}).values():
        while found := engine.find_labelled(f"{LABEL_PREFIX}.lock.sha256", one.sha256):
            subprocess.run([DOCKER, "rmi", "-f", found], capture_output=True)
    subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)


def toolchain(engine) -> dict:
    from imagebuild import flows
    recipe = REPO / "recipes" / "cuda-toolchain-multiarch.toml"
    cold(engine, recipe)
    started = time.monotonic()
    report = flows.build(recipe, engine, flows.BuildOptions(rebuild=True))
    total = time.monotonic() - started
    rows = {arch: {"seconds": {k: round(v, 1) for k, v in one.seconds.items()}, "gb": round(one.size / 1e9, 3),
                   "deep_gemm": next((c["detail"] for c in one.smoke.report["checks"]
                                      if c["name"] == "deep-gemm-sm120"), "")}
            for arch, one in report.platforms.items()}
    ratio = {step: round(rows["arm64"]["seconds"][step] / rows["amd64"]["seconds"][step], 2)
             for step in ("build", "smoke") if rows["amd64"]["seconds"].get(step)}
    return {"total_s": round(total, 1), "platforms": rows, "arm64_over_amd64": ratio}


def flagship(limit: float) -> dict:
    """The flagship for arm64 alone, locked, then built and smoke-tested until `limit` seconds."""
    source = (REPO / "recipes" / "sglang-blackwell.toml").read_text()
    source = source.replace('file = "patches/', f'file = "{REPO}/recipes/patches/')
    source = re.sub(r'(?m)^name = "([^"]+)"', r'name = "imagebuild-bench/sglang-arm64"', source, count=1)
    # The flagship's sglang-kernel [[prune]] globs name x86_64-only files (the aarch64 wheel has no
    # flash_ops.abi3.so or flashmla_ops.abi3.so): the arm64 image keeps that wheel whole.
    source = re.sub(r'(?ms)^\[\[prune\]\]\npackage = "sglang-kernel".*?(?=^\[|\Z)', "", source)
    source += '\n[platforms.arm64]\ncuda_archs = ["sm_121a"]  # DGX Spark\n'
    folder = Path(tempfile.mkdtemp(prefix="bench-arm64-"))
    (folder / "recipes").mkdir()
    recipe = folder / "recipes" / "sglang-arm64.toml"
    recipe.write_text(source)
    out: dict = {}
    imagebuild = [sys.executable, "-m", "imagebuild"]
    started = time.monotonic()
    locked = subprocess.run([*imagebuild, "lock", str(recipe), "--json"], capture_output=True, text=True)
    out["lock_s"] = round(time.monotonic() - started, 1)
    if locked.returncode != 0:
        out["lock_error"] = (json.loads(locked.stdout or "{}").get("message") or locked.stderr)[-1500:]
        return out
    report = json.loads(locked.stdout)
    out["wheels"] = report["packages"]
    steps, started = [], time.monotonic()
    subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)  # cold: nothing cached
    proc = subprocess.Popen([*imagebuild, "build", str(recipe)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "IMAGEBUILD_DOCKER_CLI": DOCKER})
    starts: list[tuple[float, str]] = []  # when each build step was first named, and its name
    tail: list[str] = []
    try:
        for text in proc.stderr:
            now = time.monotonic() - started
            tail = (tail + [text.rstrip()[:300]])[-40:]
            if now > limit:
                proc.kill()
                out["stopped_at_s"] = round(now, 1)
                break
            if "smoke test: running the probe" in text:
                starts.append((now, "smoke"))
                out.setdefault("names", {})["smoke"] = "the probe, emulated"
            if (m := re.search(r"\[stage-0\s+(\d+/\d+)\] (.{0,70})", text)) and m.group(1) not in {n for _, n in starts}:
                starts.append((now, m.group(1)))
                out.setdefault("names", {})[m.group(1)] = m.group(2).strip()
    finally:
        proc.wait()
    ends = [t for t, _ in starts[1:]] + [time.monotonic() - started]
    steps = [{"step": f"{n} {out['names'][n][:50]}", "s": round(end - t, 1)} for (t, n), end in zip(starts, ends)]
    out.pop("names", None)
    out["build_s"] = round(time.monotonic() - started, 1)
    out["build_exit"] = proc.returncode
    out["last_words"] = [line for line in tail if line.strip(" ›\n")][-6:]
    out["steps"] = steps
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flagship", action="store_true", help="also try the flagship for arm64")
    parser.add_argument("--limit", type=float, default=1500, help="seconds the flagship build may take")
    parser.add_argument("--skip-toolchain", action="store_true")
    args = parser.parse_args()
    from imagebuild.engine.docker import DockerEngine
    results = {}
    if not args.skip_toolchain:
        results["toolchain"] = toolchain(DockerEngine())
    if args.flagship:
        results["flagship_arm64"] = flagship(args.limit)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
