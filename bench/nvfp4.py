#!/usr/bin/env python3
"""What the gallery's NVFP4 MoE recipe's kernels cost, and what the kernel cache saves (issue 26).

recipes/sglang-blackwell-nvfp4.toml (GLM-4.5 in NVFP4 at TP 8) on this machine, without a GPU:
- cold: the recipe's context built with its kernel cache mount renamed to an empty one of this run's own,
  so every kernel compiles (the layers below come from the builder cache when the engine holds them): the
  step's wall time, and per FlashInfer module the objects, their compile seconds summed (one core's time)
  and the longest object (ninja's log, kernels_aot.compile_times), from which the wall time on N cores is
  bounded below by max(sum / N, longest);
- the manifest: each module's bytes, SASS and the loads that asked for it;
- the proof: the image's own zero-JIT check (JIT disabled, nvcc hidden), its verdict and detail;
- warm: the recipe plus one pure-Python pin no kernel imports (six), built on the same mount: the kernel
  step reruns and takes every module from the kernel cache. Ratio warm / cold.
The baseline to beat is the one-line uv Dockerfile, which ships none of these: its first request on the GPU
node compiles the same modules there (the cold figure is that compile, on this machine's cores).

The compile takes hours on a few cores. With --mount NAME the kernel cache mount is one of that name, kept
until a run completes: a run stopped part-way (Ctrl-C, a session's end) leaves the objects it finished there
(compile_resume.py), and the next run with the same NAME resumes from them. Its per-module figures then come
from ninja's log of all the runs (each object once), and its step seconds are that run's alone: it says so.

--progress prints the builds' lines to stderr as they come (ninja's [N/M] counts among them).

Usage: .venv/bin/python bench/nvfp4.py [RECIPE] [--json FILE] [--mount NAME] [--progress]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.aot import build_on_mount, manifest_of, moved, private_mount, remove_mount, with_library_pin  # noqa: E402
from imagebuild import flows  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402
from imagebuild.render.paths import PROBE_COMMAND  # noqa: E402

CORES = (2, 8, 16, 32, 64)


def kept_mount(name: str) -> tuple[str, str]:
    """A kernel cache mount named by the user, not by this process: a later run finds it."""
    folder = private_mount(name)[1].rsplit("-", 1)[0]
    return f"imagebuild-bench-{name}", folder


def scaling(times: dict) -> dict:
    """Lower bounds of the compile's wall time on N cores, from the objects' own compile seconds."""
    total = sum(entry["cpu_s"] for entry in times.values())
    longest = max((entry["longest_s"] for entry in times.values()), default=0.0)
    return {n: max(total / n, longest) for n in CORES}


def zero_jit(engine, image: str) -> dict:
    started = time.monotonic()
    result = engine.run(image, ["sh", "-c", "exec " + " ".join(PROBE_COMMAND) + " --only zero-jit"], timeout=1800)
    checks = [c for c in json.loads(result.stdout or "{}").get("checks", []) if c.get("name") == "zero-jit"]
    if not checks:
        raise SystemExit(f"the zero-JIT check printed no result (exit {result.exit_code}):\n{result.stderr[-3000:]}")
    return dict(checks[0], seconds=time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(REPO / "recipes" / "sglang-blackwell-nvfp4.toml"))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--mount", help="a kernel cache mount kept across runs until one completes")
    parser.add_argument("--progress", action="store_true", help="print the builds' lines to stderr")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a file
    recipe = Path(args.recipe).resolve()
    engine = DockerEngine()
    mount = kept_mount(args.mount) if args.mount else private_mount("nvfp4")
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if args.progress else None
    made, figures, completed = [], {"recipe": recipe.name}, False

    def record() -> None:  # after each phase, so a run stopped later keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-nvfp4-") as tmp:
        folder = Path(tmp)
        try:
            cold = build_on_mount(engine, recipe, folder / "cold", mount, progress)
            made.append(cold["image"])
            kernels = cold["kernels"]
            times = kernels.get("compile_times") or {}
            figures["cold"] = {"build_s": cold["seconds"], "kernels": kernels}
            print(f"recipe {recipe.name}")
            print(f"  cold kernel step: build {cold['seconds']:.1f} s; {kernels['compiled']} compiled in "
                  f"{kernels['seconds']:.1f} s with {kernels['jobs']} jobs")
            if kernels.get("resumed_objects"):
                print(f"  (resumed: {kernels['resumed_objects']} objects were finished by earlier runs on mount "
                      f"{mount[0]}; the seconds above are this run's, the figures below all runs')")
            for name, entry in sorted(times.items(), key=lambda item: -item[1]["cpu_s"]):
                print(f"    {name}: {entry['objects']} objects, {entry['cpu_s'] / 60:.1f} CPU-minutes, "
                      f"longest object {entry['longest_s']:.0f} s")
            bounds = scaling(times)
            figures["cores_lower_bound_s"] = bounds
            record()
            print("  wall time on N cores, at least: " + ", ".join(f"{n}: {s / 60:.1f} min" for n, s in bounds.items()))
            manifest = manifest_of(cold["image"])
            artifacts = [{k: a.get(k) for k in ("kind", "name", "bytes", "sass", "loads", "target")}
                         for a in manifest["artifacts"]]
            figures["artifacts"] = artifacts
            record()
            print(f"  manifest: {len(artifacts)} artifacts, {sum(a['bytes'] for a in artifacts) / 1e6:.1f} MB")
            for artifact in artifacts:
                print(f"    {artifact['kind']:10} {artifact['bytes'] / 1e6:8.1f} MB sass={artifact['sass']} "
                      f"{artifact['name'][:90]}")
            proof = zero_jit(engine, cold["image"])
            figures["zero_jit"] = {"status": proof["status"], "detail": proof["detail"], "seconds": proof["seconds"]}
            record()
            print(f"  zero-JIT proof ({proof['seconds']:.0f} s): {proof['status']}: {proof['detail'][:1500]}")
            library = moved(recipe, folder, "nvfp4-library-move", lambda t: with_library_pin(t).replace(
                'model_config = "', f'model_config = "{recipe.parent}/'))
            flows.lock(library)
            warm = build_on_mount(engine, library, folder / "warm", mount, progress)
            made.append(warm["image"])
            figures["warm"] = {"build_s": warm["seconds"], "kernels": warm["kernels"]}
            record()
            print(f"  warm kernel cache, library-only move: build {warm['seconds']:.1f} s = "
                  f"{warm['seconds'] / cold['seconds']:.2f}x of cold; {warm['kernels']['compiled']} compiled, "
                  f"{warm['kernels']['reused']} reused, {warm['kernels']['seconds']:.1f} s compiling")
            completed = True
        finally:
            for image in made:
                engine.remove(image)
            if completed or not args.mount:
                remove_mount(engine, mount)
            else:
                print(f"  stopped before the end: mount {mount[0]} keeps the finished objects for a rerun")


if __name__ == "__main__":
    main()
