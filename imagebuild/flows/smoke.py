"""The smoke flow: the image's own probe run against its own expectations, offline, in a throwaway
container; a pass on record per image id, under this probe, on the GPUs seen (names, compute
capabilities, driver) or none; and the gate a build passes before its image is tagged.

    smoke(image, engine)              run the probe (or take a pass on record with use_cache)
    holding(engine, lock_sha256)      the name a build owns for its image, from the build to its tag
    smoke_and_tag(image_id, ...)      smoke, then tag; a failed smoke or an unaccepted `unknown` tags nothing
    lock_built(info)                  the lock an engine image was built from here and passed its smoke for
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from imagebuild import payload
from imagebuild.common import Progress, cache_dir, quiet, write_atomic
from imagebuild.engine import Engine, ImageInfo
from imagebuild.errors import ImageNotFound, SmokeFailed
import imagebuild.flows.built as built  # not via the package's face, which imports this module
from imagebuild.flows.options import BuildOptions
from imagebuild.flows.reports import BuildReport, SmokeReport
from imagebuild.recipe.model import Recipe
from imagebuild.render.paths import PROBE_COMMAND

# FlashInfer JIT-compiles on first use where a GPU is visible (tier 4): give the probe time.
SMOKE_TIMEOUT_S = 1800


# What a smoke pass on record is keyed by besides the image and the probe: each GPU the run sees.
GPU_QUERY = ("nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version", "--format=csv,noheader")
NO_GPUS = "no-gpus"


def gpus_listed(answer: str) -> dict[str, str] | None:
    """The GPUs in nvidia-smi's answer to GPU_QUERY: index -> `name, compute capability, driver`, in its
    order; None when it lists none or is not that query's answer (then no pass is put on record)."""
    listed: dict[str, str] = {}
    for line in answer.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit() or not fields[1] or fields[0] in listed \
                or not re.fullmatch(r"\d+\.\d+", fields[2]) or not re.fullmatch(r"\d+(\.\d+)+", fields[3]):
            return None
        listed[fields[0]] = ", ".join(fields[1:])
    return listed or None


def _ask_nvidia_smi() -> str | None:
    try:
        proc = subprocess.run(GPU_QUERY, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def asked_in_container(engine: Engine, image: str, gpus) -> Callable[[], str | None]:
    """GPU_QUERY asked inside a throwaway container of the image, given `gpus`: on a remote engine the GPUs are
    the engine host's, which this host's nvidia-smi does not see. The answer lists the GPUs given, numbered
    from 0 (the NVIDIA runtime mounts nvidia-smi: its default capabilities hold `utility`)."""
    def ask() -> str | None:
        result = engine.run(image, GPU_QUERY, gpus=gpus, timeout=120)
        return result.stdout if result.exit_code == 0 else None
    return ask


def gpus_seen(gpus, ask: Callable[[], str | None] = _ask_nvidia_smi, *, inside: bool = False) -> str | None:
    """What a smoke run sees: NO_GPUS without GPUs; with them (True: all, or a tuple of GPU numbers), each
    of those GPUs as nvidia-smi lists it, one `name, compute capability, driver` line each: on this host
    (GPU numbers as the host numbers them), or `inside` the run's container (every GPU it lists, which must
    be as many as were given). None when they cannot be read (nvidia-smi missing, or a GPU number it does
    not list)."""
    if not gpus:
        return NO_GPUS
    answer = ask()
    listed = gpus_listed(answer) if answer is not None else None
    if listed is None:
        return None
    if inside:
        chosen = list(listed) if gpus is True or len(listed) == len(gpus) else ["given, not listed"]
    else:
        chosen = list(listed) if gpus is True else [str(number) for number in gpus]
    if any(number not in listed for number in chosen):
        return None
    return "\n".join(listed[number] for number in chosen)


def smoke_cache_key(image_id: str, probe_sha256: str, seen: str) -> str:
    """The file name of a pass on record: the image id, the probe's checksum and the GPUs seen."""
    gpus = NO_GPUS if seen == NO_GPUS else "gpus-" + hashlib.sha256(seen.encode()).hexdigest()[:16]
    return f"{image_id.replace(':', '-')}-probe-{probe_sha256[:16]}-{gpus}"


def smoke_cache_path(image_id: str, gpus, ask: Callable[[], str | None] = _ask_nvidia_smi, *,
                     inside: bool = False) -> Path | None:
    """Where a pass of this image, under this imagebuild's probe, with the GPUs the run sees (or none)
    is on record: a pass on one GPU, driver or none says nothing of another. None when GPUs are asked
    for but nvidia-smi does not say which: then nothing is put on record or taken from it."""
    seen = gpus_seen(gpus, ask, inside=inside)
    if seen is None:
        return None
    return cache_dir() / "smoke" / f"{smoke_cache_key(image_id, payload.checksum(), seen)}.json"


def read_pass(path: Path) -> dict | None:
    """The report on record at path when it is readable and says ok (true, the boolean); else None."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("ok") is True else None


def smoke_on_record(image_id: str) -> dict | None:
    """A report on record for this image id, under this probe, that says ok (with or without GPUs)."""
    pattern = f"{smoke_cache_key(image_id, payload.checksum(), NO_GPUS).removesuffix(NO_GPUS)}*.json"
    for path in sorted((cache_dir() / "smoke").glob(pattern)):
        report = read_pass(path)
        if report is not None:
            return report
    return None


def smoke_passed(image_id: str) -> bool:
    """Whether a smoke pass of this image id, under this probe, is on record (with or without GPUs)."""
    return smoke_on_record(image_id) is not None


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
    try:
        info = engine.require(image)
    except ImageNotFound as missing:  # a failed smoke test's type and exit code, the one message
        raise SmokeFailed(str(missing)) from None
    if gpus is None and not engine.local:
        progress(f"smoke test: the {engine.name} engine runs elsewhere, whose GPUs this host cannot see: without "
                 "--gpus the probe runs without GPUs")
    gpus = (os.path.exists("/dev/nvidiactl") and engine.local) if gpus is None else gpus
    if engine.local:
        cached = smoke_cache_path(info.id, gpus)
    else:  # the GPUs are the engine host's: asked in a container given them, as the probe will be
        cached = smoke_cache_path(info.id, gpus, asked_in_container(engine, info.id, gpus), inside=True)
    if cached is None:
        progress("smoke test: nvidia-smi does not say which GPUs the run sees: no pass is taken from record "
                 "or put on it")
    if use_cache and cached is not None and cached.is_file():
        recorded = read_pass(cached)
        if recorded is not None:
            return SmokeReport(image, True, recorded, cached=True)
        progress(f"smoke test: the report on record at {cached} is unreadable or does not say ok: running the probe")
    on = "" if not gpus else ", GPUs " + ("all" if gpus is True else ",".join(gpus))
    progress(f"smoke test: running the probe in {image} (network off{on})")
    result = engine.run(info.id, PROBE_COMMAND, network=False, gpus=gpus, timeout=SMOKE_TIMEOUT_S)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SmokeFailed(f"the probe in {image} printed no report (exit {result.exit_code}):\n"
                          f"{result.stderr[-3000:]}") from None
    if not isinstance(report, dict):
        raise SmokeFailed(f"the probe in {image} printed JSON that is not a report (exit {result.exit_code})")
    ok = result.exit_code == 0 and bool(report.get("ok"))
    if ok and cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, json.dumps(report, indent=2, sort_keys=True).encode())
    return SmokeReport(image, ok, report)


HOLD_REPOSITORY = "imagebuild-hold"


@dataclass
class Hold:
    """The name a build owns for its image, from the build to its tag. A reproducible build's image has the id
    of every other build of its lock, so on a shared engine an image no name holds goes while it is smoke-tested
    when another holder of that id removes its last name, or with `image prune`."""
    ref: str
    kept: bool = False  # the name of a failed image the caller keeps, to look into


@contextlib.contextmanager
def holding(engine: Engine, lock_sha256: str) -> Iterator[Hold]:
    """A hold name of this process (imagebuild-hold/<lock12>:<pid>-<random>), dropped at the end unless kept:
    the image stays under the names it has, or goes with the hold when nothing else names it."""
    hold = Hold(f"{HOLD_REPOSITORY}/{lock_sha256[:12]}:{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield hold
    finally:
        if not hold.kept:
            engine.remove(hold.ref)


def smoke_and_tag(image_id: str, recipe: Recipe, path: Path, findings: list, timings: dict, engine: Engine,
                  options: BuildOptions, *, reused: bool, hold: Hold) -> BuildReport:
    """Smoke (or its recorded result for this image id), then tag options.tag (else the recipe's NAME:TAG);
    a failed smoke tags nothing, and nor does a check that ended `unknown` unless the recipe ([smoke]
    accept_unknown) or the caller accepts it. A rebuild runs the smoke test even when a pass for this image
    id is on record. `hold` names the image meanwhile; a failed image the caller keeps stays under it."""
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
            hold.kept = options.keep_failed
            raise SmokeFailed(f"smoke test failed in the image built from {recipe.path} ({failed_checks(report)}); "
                              f"{ref} was not tagged" + (f"; the image is kept as {hold.ref} ({image_id})"
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
