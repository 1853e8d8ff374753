#!/usr/bin/env python3
"""What [aot] costs at build time and saves at first use, measured in the same run (issue 15).

For a recipe with [aot] (default: the flagship), on this machine, without a GPU:
- build: `imagebuild build` as it stands (the kernel step cached or not: the report says which), then
  again with nothing changed (an unchanged lock must pay nothing);
- the kernels: each artifact of the image's manifest with its bytes and the seconds its compile took in
  that image's build (FlashInfer's JIT, the same work a fresh node does on first use), and the size of
  the kernel layer;
- first use with the kernels prebuilt: a fresh container loads every declared module through FlashInfer's
  and SGLang's own loaders with JIT disabled; the baseline is the compile those loads replace, measured by
  the build of the same image. The ratio is prebuilt load / JIT compile.

Usage: .venv/bin/python bench/aot.py [RECIPE]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")
IMAGEBUILD = [sys.executable, "-m", "imagebuild"]
# Imports first (a server pays them anyway), then the loads, the negative control included.
LOAD = ("import json, sys, time; t0 = time.monotonic(); sys.path.insert(0, '/opt/imagebuild/probe.pyz'); "
        "import torch, flashinfer.prefill, flashinfer.decode, flashinfer.cascade, flashinfer.sampling; "
        "import sglang.srt.layers.attention.flashinfer_backend, sglang.kernels.ops.attention.rope; "
        "from imagebuild_probe import kernels_aot; spec = json.load(open('/opt/imagebuild/expect.json'))['aot']; "
        "manifest = json.load(open(spec['manifest'])); t = time.monotonic(); "
        "proof = kernels_aot.prove(spec, manifest); "
        "print(json.dumps({'seconds': time.monotonic() - t, 'imports': t - t0, "
        "'flashinfer': len(proof['flashinfer']['loaded']), "
        "'misses': len(proof['flashinfer']['misses']) + len(proof.get('sglang', {}).get('misses', [])), "
        "'sglang': len(proof.get('sglang', {}).get('hits', []))}))")


def run(command: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - started, done.stdout


def main() -> None:
    recipe = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "recipes" / "sglang-blackwell.toml"
    first_s, out = run(IMAGEBUILD + ["build", str(recipe), "--json"])
    report = json.loads(out)
    image = report["image"]
    again_s, out = run(IMAGEBUILD + ["build", str(recipe), "--json"])
    again = json.loads(out)
    _, text = run([DOCKER, "run", "--rm", "--network", "none", image, "cat", "/opt/imagebuild/aot-manifest.json"])
    manifest = json.loads(text)
    _, history = run([DOCKER, "history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image])
    kernel_layer = next((line.split("\t")[0] for line in history.splitlines() if "kernels_aot.py build" in line), "?")
    load_wall, out = run([DOCKER, "run", "--rm", "--network", "none", "-e", "FLASHINFER_DISABLE_JIT=1",
                          "-e", "SGLANG_CRASH_ON_JIT_COMPILE=1", "-e", "FLASHINFER_WORKSPACE_BASE=/tmp/fi",
                          image, "python", "-c", LOAD])
    load = json.loads(out.strip().splitlines()[-1])
    artifacts = manifest["artifacts"]
    flashinfer_s = sum(a.get("seconds", 0) for a in artifacts if a["kind"] == "flashinfer")
    compile_s = flashinfer_s + (manifest.get("sglang_seconds") or 0)
    print(f"recipe {recipe.name}: image {image}")
    print(f"  build as it stood: {first_s:.1f} s ({'reused' if report.get('reused') else 'built'}); "
          f"again, nothing changed: {again_s:.2f} s ({'reused' if again.get('reused') else 'built'})")
    print(f"  kernel layer: {kernel_layer}; {len(artifacts)} artifacts, "
          f"{sum(a['bytes'] for a in artifacts) / 1e6:.1f} MB")
    for a in sorted(artifacts, key=lambda a: (a["kind"], a["name"])):
        seconds = f"{a['seconds']:.1f} s" if "seconds" in a else "-"
        print(f"    {a['kind']:10} {a['bytes'] / 1e6:6.2f} MB  {seconds:>8}  sass={a['sass']}  {a['name']}")
    print(f"  compile in the build: FlashInfer {flashinfer_s:.1f} s + SGLang {manifest.get('sglang_seconds') or 0:.1f} s"
          f" = {compile_s:.1f} s ({compile_s / 60:.1f} min)")
    print(f"  first use, prebuilt: {load['flashinfer']} FlashInfer loads and {load['sglang']} SGLang kernels in "
          f"{load['seconds']:.1f} s after {load['imports']:.1f} s of imports (container {load_wall:.1f} s), "
          f"{load['misses']} misses")
    print(f"  ratio prebuilt load / JIT compile: {load['seconds'] / compile_s:.3f}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
