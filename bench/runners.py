"""Two runners of a gallery, each an empty engine: what the second takes from the first through a registry.

Two Docker engines of this run's own (tests/engine_daemon.py: each its own data root, so an empty image
store, builder cache, uv cache mount and kernel cache mount) and a loopback docker-registry between them, as
two CI jobs on two machines. Runner A builds RECIPE cold and writes its build cache (`--cache-to`). Runner B
builds a sibling recipe with the same kernels (RECIPE plus one pure-Python pin no kernel imports, six) with
`--cache-from` A's cache. The claim: B compiles no kernel (each is seeded from A's [aot] layer by its key)
and installs none of the layers below its change (BuildKit pulls them from the registry). The baseline,
measured in the same run: A's cold build. Both builds run their smoke tests.

    .venv/bin/python bench/runners.py [RECIPE] [--json]

What each runner did is read from `imagebuild build --json` (kernels compiled, reused, seeded) and from the
registry's access log (the blobs B pulled); a B that compiled a kernel or pulled nothing is an error, not a
number. Needs root, Debian's dockerd and docker-registry, and room for two images and their caches.
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
sys.path.insert(0, str(REPO / "bench"))

from bench.aot import LIBRARY_PIN as SIBLING_PIN, beside, with_library_pin  # noqa: E402
from node import ACCESS, PassError  # noqa: E402
from tests import engine_daemon, registry_server  # noqa: E402


def sibling(recipe: Path, folder: Path) -> Path:
    """RECIPE with one more pin no kernel imports, under a name of its own; its patches found where RECIPE's are,
    RECIPE's lock beside it, so its relock keeps every locked version: the pin is the only move."""
    text = recipe.read_text()
    if "requirements = [\n" not in text:
        raise SystemExit(f"{recipe}: no `requirements = [` line to add {SIBLING_PIN} to")
    text = re.sub(r'name = "([^"]+)"', r'name = "\1-sibling"', with_library_pin(text), count=1)
    return beside(recipe, folder, f"{recipe.stem}-sibling", text)


def build(daemon, recipe: Path, tag: str, cache_args: list[str], cache_dir: Path, log: Path) -> dict:
    """`imagebuild build --json` on the runner's engine, with an imagebuild cache folder of the runner's own."""
    env = {**os.environ, "DOCKER_HOST": daemon.host, "IMAGEBUILD_CACHE": str(cache_dir)}
    started = time.monotonic()
    with open(log, "w") as stderr:
        proc = subprocess.run([sys.executable, "-m", "imagebuild", "build", str(recipe), "--tag", tag, "--relock",
                               "--insecure-http", *cache_args, "--json"], stdout=subprocess.PIPE, stderr=stderr,
                              text=True, env=env)
    seconds = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise PassError(f"imagebuild build {recipe.name} printed no JSON (exit {proc.returncode}); see {log}")
    if proc.returncode != 0 or report.get("error"):
        raise PassError(f"imagebuild build {recipe.name} exited {proc.returncode}: {str(report)[:1500]}")
    return {"seconds": round(seconds, 1), "report": report}


def kernels_of(report: dict) -> dict:
    """What `build --json` says of the kernel step; what it does not say (or says in another shape) is None."""
    k = report.get("kernels") if isinstance(report, dict) else None
    k = k if isinstance(k, dict) else {}
    seeded = k.get("seeded") if isinstance(k.get("seeded"), dict) else {}
    taken = seeded.get("taken") if isinstance(seeded.get("taken"), list) else []
    return {"step": k.get("step"), "compiled": k.get("compiled"), "reused": k.get("reused"),
            "seeded_added": seeded.get("added"),
            "seeded_from": [t.get("source") for t in taken if isinstance(t, dict)]}


def pulled(log_text: str) -> tuple[int, int]:
    """Blobs and bytes the registry served whole (GET 200) in this stretch of its access log."""
    found = [(digest, int(size)) for digest, status, size in ACCESS.findall(log_text) if status == "200"]
    return len({digest for digest, _ in found}), sum(size for _, size in found)


def check_second(a: dict, b: dict, blobs: int) -> None:
    """B compiled nothing and reused as many kernels as A made; it pulled from the registry."""
    ka, kb = kernels_of(a["report"]), kernels_of(b["report"])
    count = lambda value: value if isinstance(value, int) and not isinstance(value, bool) else None
    if not count(ka["compiled"]):
        raise PassError(f"runner A compiled no kernel ({ka}): a cold runner must, or the engine was not empty")
    if count(kb["compiled"]) != 0 or count(kb["reused"]) != ka["compiled"] + (count(ka["reused"]) or 0):
        raise PassError(f"runner B compiled {kb['compiled']} and reused {kb['reused']} kernels; runner A made "
                        f"{ka['compiled']} (+{ka['reused']} reused): B did not take them all from A's cache")
    if not blobs:
        raise PassError("runner B pulled no blob from the registry: its layers did not come from A's cache")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", type=Path, default=REPO / "recipes" / "sglang-blackwell.toml")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    why = engine_daemon.why_not()
    if why:
        raise SystemExit(why)
    recipe = args.recipe.resolve()
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-runners-") as tmp:
        tmp = Path(tmp)
        other = sibling(recipe, tmp)
        server = registry_server.start_registry(tmp / "registry")
        cache_ref = f"{server.host}/bench/{recipe.stem}:buildcache-main"
        try:
            with engine_daemon.running() as runner_a:
                a = build(runner_a, recipe, f"bench/{recipe.stem}:a", ["--cache-to", cache_ref], tmp / "cache-a",
                          tmp / "a.log")
                print(f"runner A: {a['seconds']} s, kernels {kernels_of(a['report'])}", file=sys.stderr)
            offset = server.log.stat().st_size
            with engine_daemon.running() as runner_b:
                b = build(runner_b, other, f"bench/{recipe.stem}:b", ["--cache-from", cache_ref], tmp / "cache-b",
                          tmp / "b.log")
            with open(server.log, "rb") as f:
                f.seek(offset)
                blobs, size = pulled(f.read().decode(errors="replace"))
            print(f"runner B: {b['seconds']} s, kernels {kernels_of(b['report'])}, pulled {blobs} blobs, {size:,} B",
                  file=sys.stderr)
            check_second(a, b, blobs)
        finally:
            server.stop()
    out = {"recipe": str(recipe), "sibling_pin": SIBLING_PIN,
           "a": {"seconds": a["seconds"], "kernels": kernels_of(a["report"]), "timings": a["report"].get("seconds"),
                 "smoke": bool((a["report"].get("smoke") or {}).get("probe", {}).get("ok"))},
           "b": {"seconds": b["seconds"], "kernels": kernels_of(b["report"]), "timings": b["report"].get("seconds"),
                 "smoke": bool((b["report"].get("smoke") or {}).get("probe", {}).get("ok")),
                 "pulled_blobs": blobs, "pulled_bytes": size},
           "b_over_a": round(b["seconds"] / a["seconds"], 3)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"runner A (cold, the baseline): {a['seconds']} s; kernels {out['a']['kernels']}")
    print(f"runner B (sibling, --cache-from A): {b['seconds']} s = {out['b_over_a']}x; kernels {out['b']['kernels']}; "
          f"pulled {blobs} blobs, {size:,} B from the registry")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
