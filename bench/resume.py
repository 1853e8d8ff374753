#!/usr/bin/env python3
"""What an interrupted kernel step keeps: the same recipe's kernel step cold, killed part-way, and run again.

On private kernel cache mounts of this run's own (the layers below come from the builder cache when the engine
holds them):
- cold: the recipe's kernel step on an empty mount, uninterrupted: its compile seconds and each module's sha256;
- interrupted: the same build on a second empty mount, its client killed FRACTION of the cold compile's time
  after the compile began (the step is cancelled as a CI job's time limit cancels it);
- resumed: the build again on that mount: how many objects it took from the interrupted compile, its compile
  seconds, ratio resumed / cold, and whether every module is the cold build's bytes.
The baseline is the step as it was before compile_resume.py: an interrupted compile started again from nothing,
so the cold figure.

Usage: .venv/bin/python bench/resume.py RECIPE [--fraction 0.6] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.aot import build_on_mount, by_name, manifest_of, private_mount, remove_mount  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402

def interrupted(recipe: Path, folder: Path, mount: tuple, after_s: float) -> dict:
    """Build in a child process and kill it `after_s` seconds after the kernel step began."""
    child = subprocess.Popen([sys.executable, __file__, str(recipe), "--child", json.dumps([str(folder), *mount])],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    began = None
    for line in child.stdout:
        if began is None and "kernels_aot.py build" in line:
            began = time.monotonic()
            break
    if began is None:
        raise SystemExit(f"the build ended before its kernel step (exit {child.wait()})")
    time.sleep(max(0.0, after_s - (time.monotonic() - began)))
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    return {"killed_after_s": round(time.monotonic() - began, 1)}


def child(recipe: Path, folder: str, mount_id: str, mount_dir: str) -> None:
    build_on_mount(DockerEngine(), recipe, Path(folder), (mount_id, mount_dir),
                   progress=lambda line: print(line, flush=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe = Path(args.recipe).resolve()
    if args.child:
        child(recipe, *json.loads(args.child))
        return
    engine = DockerEngine()
    cold_mount, kept_mount = private_mount("resume-cold"), private_mount("resume-kept")
    made, figures = [], {"recipe": recipe.name, "fraction": args.fraction}
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-resume-") as tmp:
        try:
            cold = build_on_mount(engine, recipe, Path(tmp) / "cold", cold_mount)
            made.append(cold["image"])
            figures["cold"] = cold["kernels"]
            print(f"cold: {cold['kernels']['compiled']} modules compiled in {cold['kernels']['seconds']:.1f} s "
                  f"({cold['kernels']['jobs']} jobs)", flush=True)
            figures["interrupted"] = interrupted(recipe, Path(tmp) / "interrupted", kept_mount,
                                                 args.fraction * cold["kernels"]["seconds"])
            print(f"interrupted: killed {figures['interrupted']['killed_after_s']} s after the step began", flush=True)
            resumed = build_on_mount(engine, recipe, Path(tmp) / "resumed", kept_mount)
            made.append(resumed["image"])
            kernels = resumed["kernels"]
            same = by_name(manifest_of(resumed["image"])) == by_name(manifest_of(cold["image"]))
            figures["resumed"] = dict(kernels, same_bytes_as_cold=same,
                                      ratio=round(kernels["seconds"] / cold["kernels"]["seconds"], 3))
            print(f"resumed: {kernels.get('resumed_objects', 0)} objects from the interrupted compile, "
                  f"{kernels['compiled']} modules finished in {kernels['seconds']:.1f} s: "
                  f"{figures['resumed']['ratio']:.2f} x the cold compile; same bytes as cold: {same}")
            if not kernels.get("resumed_objects") or not same:
                raise SystemExit("the resumed build took nothing from the interrupted one, or its bytes differ")
        finally:
            for image in made:
                engine.remove(image)
            for mount in (cold_mount, kept_mount):
                remove_mount(engine, mount)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
