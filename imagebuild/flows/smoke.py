"""The smoke flow: the image's own probe run against its own expectations, offline, in a throwaway
container; a pass on record per image id (under this probe, with or without GPUs); and the gate a
build passes before its image is tagged.

    smoke(image, engine)              run the probe (or take a pass on record with use_cache)
    smoke_and_tag(image_id, ...)      smoke, then tag; a failed smoke or an unaccepted `unknown` tags nothing
    lock_built(info)                  the lock an engine image was built from here and passed its smoke for
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from imagebuild import payload
from imagebuild.common import Progress, cache_dir, quiet
from imagebuild.engine import Engine, ImageInfo
from imagebuild.errors import SmokeFailed
from imagebuild.flows import built
from imagebuild.flows.options import BuildOptions
from imagebuild.flows.reports import BuildReport, SmokeReport
from imagebuild.recipe.model import Recipe
from imagebuild.render.paths import PROBE_COMMAND

# FlashInfer JIT-compiles on first use where a GPU is visible (tier 4): give the probe time.
SMOKE_TIMEOUT_S = 1800


def smoke_cache_path(image_id: str, gpus: bool) -> Path:
    """A pass on record is one image's, under this imagebuild's probe, with or without GPUs: a pass made
    without a GPU says nothing of the GPU tier."""
    key = f"{image_id.replace(':', '-')}-probe-{payload.checksum()[:16]}-{'gpus' if gpus else 'no-gpus'}"
    return cache_dir() / "smoke" / f"{key}.json"


def smoke_passed(image_id: str) -> bool:
    """Whether a smoke pass of this image id, under this probe, is on record (with or without GPUs)."""
    return any(smoke_cache_path(image_id, gpus).is_file() for gpus in (False, True))


def lock_built(info: ImageInfo) -> str | None:
    """The lock sha256 this engine image was built from here and passed its smoke test for, else None:
    the label alone is inherited by derived images, so it must be this very image on record."""
    from imagebuild.render import LABEL_PREFIX
    locked = info.labels.get(f"{LABEL_PREFIX}.lock.sha256")
    if locked and info.id in built.images_built(locked) and smoke_passed(info.id):
        return locked
    return None


def smoke(image: str, engine: Engine, *, use_cache: bool = False, gpus: bool | tuple | None = None,
          progress: Progress = quiet) -> SmokeReport:
    """Run the image's own probe against its own expectations, offline, in a throwaway container."""
    engine.check()
    info = engine.inspect(image)
    if info is None:
        raise SmokeFailed(f"no image {image!r} in the {engine.name} engine")
    gpus = os.path.exists("/dev/nvidiactl") if gpus is None else gpus
    cached = smoke_cache_path(info.id, gpus)
    if use_cache and cached.is_file():
        return SmokeReport(image, True, json.loads(cached.read_text()), cached=True)
    on = "" if not gpus else ", GPUs " + ("all" if gpus is True else ",".join(gpus))
    progress(f"smoke test: running the probe in {image} (network off{on})")
    result = engine.run(info.id, PROBE_COMMAND, network=False, gpus=gpus, timeout=SMOKE_TIMEOUT_S)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SmokeFailed(f"the probe in {image} printed no report (exit {result.exit_code}):\n"
                          f"{result.stderr[-3000:]}") from None
    ok = result.exit_code == 0 and bool(report.get("ok"))
    if ok:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(report, indent=2, sort_keys=True))
    return SmokeReport(image, ok, report)


def smoke_and_tag(image_id: str, recipe: Recipe, path: Path, findings: list, timings: dict, engine: Engine,
                  options: BuildOptions, *, reused: bool) -> BuildReport:
    """Smoke (or its recorded result for this image id), then tag options.tag (else the recipe's NAME:TAG);
    a failed smoke tags nothing, and nor does a check that ended `unknown` unless the recipe ([smoke]
    accept_unknown) or the caller accepts it. A rebuild runs the smoke test even when a pass for this image
    id is on record."""
    ref = options.tag or f"{recipe.name}:{recipe.tag}"
    report = None
    accepted: list[str] = []
    if options.run_smoke:
        clock = time.monotonic()
        report = smoke(image_id, engine, use_cache=not options.rebuild, gpus=options.gpus, progress=options.progress)
        timings["smoke"] = time.monotonic() - clock
        unknown = [c.get("name") for c in report.report.get("checks", [])
                   if isinstance(c, dict) and c.get("status") == "unknown"]
        refused = [name for name in unknown
                   if not options.accept_unknown and name not in recipe.smoke.accept_unknown]
        accepted = [name for name in unknown if name not in refused]
        if report.ok and refused:
            report = SmokeReport(report.image, False, report.report, report.cached, unknown=refused)
        if not report.ok:
            untagged = not (engine.inspect(image_id) or ImageInfo("", 0)).tags  # a cache hit can be a tagged image
            if not options.keep_failed and untagged:
                engine.remove(image_id)
            raise SmokeFailed(f"smoke test failed in the image built from {recipe.path} ({failed_checks(report)}); "
                              f"{ref} was not tagged" + (f"; the image is kept as {image_id}"
                                                         if options.keep_failed else ""), report.report)
    engine.tag(image_id, ref)
    info = engine.inspect(image_id)
    return BuildReport(str(recipe.path), ref, image_id, info.size if info else 0, timings, report,
                       str(path), findings, reused=reused, accepted_unknown=accepted)


def failed_checks(report: SmokeReport) -> str:
    """The checks that failed, and those that ended unknown with how to accept them."""
    failed = [c["name"] for c in report.report.get("checks", []) if c.get("status") == "fail"]
    said = ", ".join(failed) or ("" if report.unknown else "no report")
    if report.unknown:
        said += (", " if said else "") + f"{', '.join(report.unknown)} ended unknown: nothing proved it; " \
                f"accept it by name with [smoke] accept_unknown = {json.dumps(report.unknown)} " \
                "or build with --accept-unknown"
    return said
