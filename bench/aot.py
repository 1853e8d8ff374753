#!/usr/bin/env python3
"""What [aot]'s kernel step costs, and what the kernel cache saves, measured in one run (issue 23).

For a recipe with [aot] (default: the flagship), on this machine, without a GPU. The baseline is the
kernel step cold: the recipe's own context built with the kernel cache mount renamed to an empty one
of this run's own (every layer below from the builder cache, as after any change below the step before
the kernel cache existed). Against it, as ratios:
- library-only move: the recipe plus one pure-Python pin no kernel imports (six), relocked and built by
  `imagebuild build` (no smoke): the layers above the change and the kernel step rerun; kernels compiled?
- the pin move (--pin-move): sglang 0.5.23 -> 0.5.22 with FlashInfer 0.7.1, as bench/flagship.py moves it:
  which kernels' keys changed and were compiled, which were reused;
- jobs: the step's compile run again in a container of the built image on empty caches, with 1 job and
  with 2 (IMAGEBUILD_AOT_JOBS), and every artifact's sha256 compared across the three compiles (the cold
  build's, 1 job's, 2 jobs') — the kernels' byte-identity;
- first use: a fresh container loads every declared module with JIT disabled (prebuilt load vs compile);
- a fresh runner's kernel cache (--fresh-runner): the built image pushed as a build cache to a loopback
  docker-registry (what --cache-to does), then the library-only move built on an empty kernel cache mount of
  this run's own, seeded first from that registry image's kernel layer (what --cache-from does): how long
  the push, the seed and the build took, and how many kernels compiled (the claim: none). The layers below
  come from this engine's builder cache; pulling them from a registry is tests/slow/test_fresh_runner_cache.py's.

- identity: the cold step's image and the image built with the engine's kernel cache exported as OCI layouts,
  their layers (diff_ids) compared: the same bytes from two compiles give the same layers.

Usage: .venv/bin/python bench/aot.py [RECIPE] [--pin-move] [--skip-jobs | --jobs 1,2] [--fresh-runner]
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

from imagebuild import flows  # noqa: E402
from imagebuild.bootstrap import ensure_base_image  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402
from imagebuild.flows.kernels import KernelStepWatch  # noqa: E402
from imagebuild.lock import default_lock_path, read_lock, uv_binary  # noqa: E402
from imagebuild.payload.probe.kernels.kernels_aot import STATS_MARK  # noqa: E402
from imagebuild.flows import ca_bundle  # noqa: E402
from imagebuild.recipe.model import load_recipe  # noqa: E402
from imagebuild.render import AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID, render_context  # noqa: E402
from imagebuild.render.paths import OWN_STEP  # noqa: E402

DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")
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
# The step's compile in a container of the built image: no kernel cache, SGLang's cache emptied.
COMPILE = ("set -eu; export FLASHINFER_WORKSPACE_BASE=/tmp/imagebuild-aot HOME=/tmp/imagebuild-aot/home "
           "PYTHONDONTWRITEBYTECODE=1 SGLANG_JIT_CACHE_DIR=/tmp/sglang-jit; "
           "python -B /run/imagebuild/aot/kernels_aot.py build /run/imagebuild/aot/aot.json /tmp/manifest.json; "
           "python -c 'import json; print(\"MANIFEST \" + json.dumps(json.load(open(\"/tmp/manifest.json\"))))'")


def sh(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def manifest_of(image: str) -> dict:
    return json.loads(sh(DOCKER, "run", "--rm", "--network", "none", image, "cat", AOT_MANIFEST))


def by_name(manifest: dict) -> dict:
    return {(a["kind"], a.get("target", ""), a["name"]): a["sha256"] for a in manifest["artifacts"]}


def private_mount(name: str) -> tuple[str, str]:
    return f"imagebuild-bench-{name}-{os.getpid()}", f"{KERNEL_CACHE_DIR}-bench-{name}-{os.getpid()}"


def remove_mount(engine, mount: tuple[str, str]) -> None:
    for found in engine.cache_mounts(OWN_STEP):
        if f"cached mount {mount[1]} " in found["description"]:
            engine.remove_cache_mount(found["id"])


def build_on_mount(engine, recipe_path: Path, folder: Path, mount: tuple[str, str], progress=None) -> dict:
    """The recipe's context (its lock as it is), its kernel cache mount renamed to `mount`; `progress` sees
    each line of the build."""
    recipe, lock_path = load_recipe(recipe_path), default_lock_path(load_recipe(recipe_path))
    lock = read_lock(lock_path)
    ensure_base_image(lock.base, recipe.base, engine, progress or (lambda _: None))  # a fresh engine holds none
    context = render_context(lock, recipe, folder / "context", uv_path=uv_binary(),
                             lock_text=lock_path.read_text())
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(f"id={KERNEL_CACHE_ID},", f"id={mount[0]},")
                          .replace(KERNEL_CACHE_DIR, mount[1]))
    watch = KernelStepWatch(progress or (lambda _: None))
    bundle = ca_bundle()
    started = time.monotonic()
    image_id = engine.build(context, secrets={"ca": bundle} if bundle else {}, progress=watch)
    seconds = time.monotonic() - started
    return {"image": image_id, "seconds": seconds, "kernels": watch.report(lambda: None), "context": context}


def cold_kernel_step(engine, recipe_path: Path, folder: Path) -> dict:
    """The recipe's context on an empty kernel cache mount of this run's: the step compiles all."""
    mount = private_mount("cold")
    try:
        return build_on_mount(engine, recipe_path, folder, mount)
    finally:
        remove_mount(engine, mount)


def fresh_runner(engine, image: str, library: Path, folder: Path, base_s: float) -> str:
    """Push `image` as a build cache, seed an empty kernel mount from it, build the library-only move on it."""
    from imagebuild.engine import BuildCache
    from imagebuild.flows.build_cache import push_build_cache
    from imagebuild.registry import Connection
    from tests import registry_server
    server = registry_server.start_registry(folder / "registry")
    mount = private_mount("fresh")
    try:
        target = f"{server.host}/bench/aot:buildcache"
        started = time.monotonic()
        push_build_cache(engine, image, BuildCache(target=target, insecure_http=True), Connection(insecure_http=True))
        push_s = time.monotonic() - started
        started = time.monotonic()
        seeded = flows.seed_kernels(read_lock(default_lock_path(load_recipe(library))),
                                       BuildCache(sources=(target,), insecure_http=True), engine, None, mount=mount,
                                       connection=Connection(insecure_http=True))
        seed_s = time.monotonic() - started
        built = build_on_mount(engine, library, folder / "fresh", mount)
        engine.remove(built["image"])
        return (f"push as build cache {push_s:.1f} s; seed {seed_s:.1f} s ({seeded['bytes'] / 1e6:.1f} MB layer, "
                f"added {seeded['added']}); build on the seeded mount {built['seconds']:.1f} s = "
                f"{built['seconds'] / base_s:.2f}x of the baseline, seed + build "
                f"{(seed_s + built['seconds']) / base_s:.2f}x; {built['kernels']}")
    finally:
        server.stop()
        remove_mount(engine, mount)


LIBRARY_PIN = "six==1.17.0"  # pure Python, in the application layer: no kernel imports it


def with_library_pin(text: str) -> str:
    """A recipe's text with LIBRARY_PIN first among its requirements: the library-only move."""
    return text.replace("requirements = [\n", f'requirements = [\n  "{LIBRARY_PIN}",\n', 1)


def moved(recipe_path: Path, folder: Path, name: str, edit) -> Path:
    """The recipe edited, named for the bench, with this run's own value in [env] (below the kernel step), so an
    engine that built the same move before cannot take the step from its builder cache: the step runs."""
    text = edit(recipe_path.read_text())
    if "\n[env]\n" in text:
        text = text.replace("\n[env]\n", f'\n[env]\nIMAGEBUILD_BENCH_RUN = "{os.getpid()}"\n', 1)
    text = re.sub(r'name = "([^"]+)"', lambda m: f'name = "imagebuild-bench/{name}"', text, count=1)
    return beside(recipe_path, folder, name, text)


def beside(recipe_path: Path, folder: Path, name: str, text: str) -> Path:
    """text written as folder/recipes/NAME.toml, its patches found where recipe_path's are, and recipe_path's
    lock beside it, so its relock keeps every locked version the edit allows: the move is the edit."""
    text = text.replace('file = "patches/', f'file = "{recipe_path.parent}/patches/')
    path = folder / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    source_lock = default_lock_path(load_recipe(recipe_path))
    if source_lock.exists():
        (folder / "lockfiles").mkdir(exist_ok=True)
        (folder / "lockfiles" / f"{name}.lock").write_bytes(source_lock.read_bytes())
    return path


def timed_build(engine, recipe: Path) -> tuple[float, object]:
    started = time.monotonic()
    report = flows.build(recipe, engine, flows.BuildOptions(relock=True, rebuild=True, run_smoke=False))
    return time.monotonic() - started, report


def compile_in_container(image: str, aot: Path, jobs: int) -> tuple[float, dict, dict]:
    started = time.monotonic()
    out = sh(DOCKER, "run", "--rm", "--network", "none", "-e", f"IMAGEBUILD_AOT_JOBS={jobs}",
             "-v", f"{aot}:/run/imagebuild/aot:ro", image, "sh", "-c", COMPILE)
    seconds = time.monotonic() - started
    stats = json.loads(next(line[len(STATS_MARK):] for line in out.splitlines() if line.startswith(STATS_MARK)))
    manifest = json.loads(next(line[len("MANIFEST "):] for line in out.splitlines() if line.startswith("MANIFEST ")))
    return seconds, stats, manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(REPO / "recipes" / "sglang-blackwell.toml"))
    parser.add_argument("--pin-move", action="store_true", help="also the sglang 0.5.23 -> 0.5.22 move")
    parser.add_argument("--skip-jobs", action="store_true", help="skip the 1 vs 2 jobs compiles")
    parser.add_argument("--jobs", default="1,2", help="the job counts the step's compile is run again with (1,2)")
    parser.add_argument("--fresh-runner", action="store_true", help="also a fresh runner's kernel cache, seeded "
                                                                     "from a loopback registry's build cache")
    args = parser.parse_args()
    recipe = Path(args.recipe).resolve()
    engine = DockerEngine()
    made = []
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-aot-") as tmp:
        folder = Path(tmp)
        default = flows.build(recipe, engine, flows.BuildOptions(run_smoke=False))  # the default kernel cache holds this lock's kernels
        cold = cold_kernel_step(engine, recipe, folder)
        made.append(cold["image"])
        base_s = cold["seconds"]
        print(f"recipe {recipe.name}")
        print(f"  baseline, kernel step cold (layers below cached): {base_s:.1f} s; {cold['kernels']}")
        library = moved(recipe, folder, "aot-library-move", with_library_pin)
        library_s, report = timed_build(engine, library)
        made.append(report.image)
        print(f"  library-only move (+six): {library_s:.1f} s = {library_s / base_s:.2f}x of the baseline; "
              f"{report.kernels}")
        if args.fresh_runner:
            print(f"  fresh runner, library-only move: {fresh_runner(engine, cold['image'], library, folder, base_s)}")
        if args.pin_move:
            def pin_move(text: str) -> str:
                text = re.sub(r'"sglang==[^"]+"', '"sglang==0.5.22"', text)
                text = re.sub(r'"flashinfer-python==[^"]+"', '"flashinfer-python==0.7.1"', text)
                text = re.sub(r'"sgl-deep-gemm==[^"]+"', '"sgl-deep-gemm==0.2.2"', text)
                return text.replace('exclude = ["', 'exclude = ["cuda-tile", "', 1)
            move_s, report = timed_build(engine, moved(recipe, folder, "aot-pin-move", pin_move))
            made.append(report.image)
            print(f"  pin move sglang 0.5.22 / FlashInfer 0.7.1: {move_s:.1f} s = {move_s / base_s:.2f}x; "
                  f"{report.kernels}")
        built = by_name(manifest_of(cold["image"]))
        print(f"  kernels: {len(built)} artifacts")
        if not args.skip_jobs:
            results = {}
            for jobs in [int(n) for n in args.jobs.split(",")]:
                seconds, stats, manifest = compile_in_container(cold["image"], cold["context"] / "aot", jobs)
                results[jobs] = (seconds, stats, by_name(manifest))
                print(f"  compile with {jobs} job(s): {stats['seconds']:.1f} s compiling ({seconds:.1f} s in all), "
                      f"{stats['compiled']} compiled, peak compile RSS {stats['peak_compile_rss_mb']} MB")
            if {1, 2} <= set(results):
                print(f"  2 jobs / 1 job: {results[2][1]['seconds'] / results[1][1]['seconds']:.2f}x")
            for jobs, (_, _, found) in results.items():
                differ = sorted(f"{k[0]} {k[2]}" for k in built if found.get(k) != built[k])
                print(f"  bytes, cold build vs {jobs} job(s): "
                      + ("all identical" if not differ and set(found) == set(built) else f"DIFFER: {differ}"))
        from imagebuild.image import export
        started = time.monotonic()
        layouts = [export.export_layout(engine, image, folder / f"layout-{n}") for n, image in
                   enumerate((default.image_id, cold["image"]))]
        same = [a == b for a, b in zip(layouts[0].diff_ids, layouts[1].diff_ids)]
        print(f"  identity: the default build and the cold step's image, {len(same)} layers, "
              f"{sum(same)} identical ({'all' if all(same) else 'layers ' + str([i for i, x in enumerate(same) if not x]) + ' differ'}); "
              f"exported in {time.monotonic() - started:.1f} s")
        history = sh(DOCKER, "history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", cold["image"])
        layer = next((line.split("\t")[0] for line in history.splitlines() if "kernels_aot.py build" in line), "?")
        print(f"  kernel layer: {layer}")
        started = time.monotonic()
        out = sh(DOCKER, "run", "--rm", "--network", "none", "-e", "FLASHINFER_DISABLE_JIT=1",
                 "-e", "SGLANG_CRASH_ON_JIT_COMPILE=1", "-e", "FLASHINFER_WORKSPACE_BASE=/tmp/fi",
                 cold["image"], "python", "-c", LOAD)
        load = json.loads(out.strip().splitlines()[-1])
        print(f"  first use, prebuilt: {load['flashinfer']} FlashInfer loads, {load['sglang']} SGLang kernels in "
              f"{load['seconds']:.1f} s after {load['imports']:.1f} s of imports (container "
              f"{time.monotonic() - started:.1f} s), {load['misses']} misses; "
              f"ratio load / cold compile {load['seconds'] / max(cold['kernels']['seconds'], 0.1):.3f}")
    for image in made:
        engine.remove(image)


if __name__ == "__main__":
    main()
