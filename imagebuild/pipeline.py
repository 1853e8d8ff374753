"""The pipeline as a library API: check, lock, render, build, smoke. The CLI is a thin layer over these.

    recipe ─rules─▶ findings ─bases + lock─▶ Lock ─render─▶ context ─engine.build─▶ image ─smoke─▶ tag

Each function takes plain values and returns a report with `to_dict()` for `--json`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from imagebuild import built
from imagebuild.base.identity import BaseIdentity
from imagebuild.bootstrap import base_moves, ensure_base_image, identify, pending_updates
from imagebuild.common import Progress, cache_dir, host_arch, quiet
from imagebuild.engine import BuildCache, Engine, ImageInfo
from imagebuild.engine.contract import split_ref
from imagebuild.errors import BuildFailed, FindingsFailed, ImagebuildError, LockError, RecipeError, SmokeFailed
from imagebuild.kernels import KernelStepWatch, seed_engine
from imagebuild.kernels import summary as kernel_summary
from imagebuild.knowledge import Finding, has_errors, rules
from imagebuild.knowledge.facts import debian_suite
from imagebuild.lock import (Lock, PlatformLocks, default_lock_path, ensure_fresh, read_lock, read_locks, resolve_lock,
                             stale_reasons, uv_binary_for, write_locks)
from imagebuild.publish.build_cache import push_build_cache
from imagebuild.publish.kernel_layer import read_kernel_layer
from imagebuild.publish.by_lock import RegistryTarget, push_by_lock, reuse_by_lock
from imagebuild.recipe.model import DebianBase, Recipe, load_recipe

PROBE_COMMAND = ("python", "/opt/imagebuild/probe.pyz", "--expect", "/opt/imagebuild/expect.json")
# Where users behind a TLS-intercepting proxy keep the roots that proxy signs with (Debian's path).
# FlashInfer JIT-compiles on first use where a GPU is visible (tier 4): give the probe time.
SMOKE_TIMEOUT_S = 1800
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass
class CheckReport:
    recipe: str
    findings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "ok": self.ok,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class LockReport:
    recipe: str
    lock_path: str
    changed: bool
    packages: int
    seconds: float
    findings: list = field(default_factory=list)
    lock_sha256: str = ""
    platforms: dict | None = None  # a multi-platform lock: linux/<arch> -> its packages and lock_sha256
    base_moves: list = field(default_factory=list)  # what moved in the base: package, old, new, suite (and arch)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "lock": self.lock_path, "changed": self.changed,
                "packages": self.packages, "seconds": round(self.seconds, 2),
                "lock_sha256": self.lock_sha256, "findings": [f.to_dict() for f in self.findings],
                "base_moves": self.base_moves,
                **({"platforms": self.platforms} if self.platforms else {})}


@dataclass
class SmokeReport:
    image: str
    ok: bool
    report: dict
    cached: bool = False
    unknown: list = field(default_factory=list)  # checks that ended `unknown` and were not accepted

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "cached": self.cached, "unknown_refused": self.unknown,
                "probe": self.report}


@dataclass
class BuildReport:
    recipe: str
    image: str
    image_id: str
    size: int
    seconds: dict
    smoke: SmokeReport | None
    lock_path: str
    findings: list = field(default_factory=list)
    reused: bool = False  # an image built from this lock was already in the engine or registry: no build ran
    registry: dict | None = None  # with --registry: where the image is, and whether this run pushed it
    cache: dict | None = None  # with --cache-from/--cache-to: where layers came from and went
    accepted_unknown: list = field(default_factory=list)  # smoke checks that ended `unknown`, accepted by name
    kernels: dict | None = None  # with [aot], when a build ran: what its kernel step compiled and reused

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "image": self.image, "image_id": self.image_id, "reused": self.reused,
                "registry": self.registry, "cache": self.cache, "accepted_unknown": self.accepted_unknown,
                "kernels": self.kernels,
                "size_bytes": self.size, "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
                "lock": self.lock_path, "smoke": self.smoke.to_dict() if self.smoke else None,
                "findings": [f.to_dict() for f in self.findings]}


# ---------------------------------------------------------------- check

def base_glibc(recipe: Recipe) -> str:
    """The base's glibc without bootstrapping it: from the suite's facts or the recipe."""
    if isinstance(recipe.base, DebianBase):
        return debian_suite(recipe.base.suite).glibc
    return recipe.base.glibc


def check(recipe_path: str | Path, *, lock_path: Path | None = None, progress: Progress = quiet) -> CheckReport:
    """The rules knowable before resolving; with a lock beside the recipe, whether it is fresh, its
    patches against the locked wheels, and the base's packages that its suites have updated since."""
    recipe = load_recipe(recipe_path)
    findings = rules.check_recipe(recipe, base_glibc(recipe))
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    if not path.is_file():
        findings.append(Finding("note", "lock-missing", f"{path} does not exist yet",
                                "no lock beside the recipe", f"`imagebuild lock {recipe.path}` writes it",
                                "imagebuild"))
        return CheckReport(str(recipe.path), located(recipe, findings))
    locks = read_locks(path)
    for arch, one in ({None: locks} if isinstance(locks, Lock) else locks.locks).items():
        platform_recipe = recipe if arch is None or not recipe.platforms else recipe.for_platform(arch)
        findings += lock_findings(platform_recipe, one, path, progress)
    return CheckReport(str(recipe.path), located(recipe, findings))


def lock_findings(recipe: Recipe, locked: Lock, path: Path, progress: Progress = quiet) -> list:
    """What `check` says of a lock: fresh or stale (and why), its patches, and security fixes waiting."""
    where = f"linux/{locked.base.arch}: " if recipe.platforms or locked.base.arch != host_arch() else ""
    reasons = stale_reasons(locked, recipe)
    if reasons:
        findings = [Finding("warning", "lock-stale", f"{where}{path} is stale", "; ".join(reasons),
                            f"`imagebuild lock {recipe.path}` refreshes it", "imagebuild")]
    else:
        findings = [Finding("note", "lock-fresh", f"{where}{path} is fresh for {recipe.path.name}",
                            f"lock sha256 {locked.sha256}", "nothing to do", "imagebuild")]
    if recipe.patches:
        findings += patch_findings(recipe, locked)
    if isinstance(recipe.base, DebianBase) and locked.base.kind == "debian":
        findings += base_update_findings(recipe, locked.base, where, progress)
    return findings


def base_update_findings(recipe: Recipe, locked: BaseIdentity, where: str = "", progress: Progress = quiet) -> list:
    """One warning per suite that carries newer versions of locked packages (security fixes waiting)."""
    try:
        waiting = pending_updates(locked, recipe.base, progress)
    except ImagebuildError as err:
        return [Finding("warning", "base-updates-unknown", f"{where}could not read the base's suites to "
                        "look for updates", str(err), "check again when the mirror answers", "imagebuild",
                        key="base")]
    findings = []
    for suite in sorted({item["suite"] for item in waiting}):
        items = [item for item in waiting if item["suite"] == suite]
        kind = "security fixes waiting" if suite.endswith("-security") else "updates waiting"
        findings.append(Finding(
            "warning", "base-updates", f"{where}{suite} has newer versions of {len(items)} locked base "
            f"package(s) ({kind}): {', '.join(item['package'] for item in items)}",
            "; ".join(f"{item['package']} {item['locked']} -> {item['newest']}" for item in items),
            f"`imagebuild lock {recipe.path} --upgrade-base`, then rebuild", f"the {suite} Packages index",
            key="base"))
    return findings


def artifact_findings(recipe: Recipe, locked: Lock, progress: Progress = quiet) -> tuple[list, dict]:
    """What the locked wheels say of themselves (lock/artifacts.py), judged by rules.check_artifacts;
    and where their RECORDs put nvcc and deep_gemm (Artifacts.layout), for the lock's cuda facts."""
    from imagebuild.lock.artifacts import read_artifacts
    artifacts = read_artifacts(locked.wheels, cache_dir() / "wheel-files", progress)
    requirements = {name: found for name in artifacts.wheels if name != "torch"
                    for found in [artifacts.requires_of(name, "torch")] if found}
    findings = rules.check_artifacts(
        recipe.cuda.toolkit if recipe.cuda else None, locked.packages, torch_cuda=artifacts.torch_cuda(),
        nvcc=artifacts.nvcc_carriers(), torch_requirements=requirements,
        overlaps=artifacts.overlaps((w.name for w in locked.wheels),
                                    removed={e.package: e.remove for e in recipe.prune}),
        cuda12=artifacts.cuda12_builds())
    for name, why in sorted(artifacts.unread.items()):
        findings.append(Finding("warning", "wheel-unread", f"the file list of {name} could not be read, "
                                "so it was not checked for overlaps or CUDA builds", why,
                                "relock when the index answers", rules.ARTIFACT_SOURCE))
    return findings, artifacts.layout()


def patch_findings(recipe: Recipe, locked: Lock) -> list:
    """An error finding for each recipe patch that does not apply to the wheel the lock installs,
    naming the file and hunk (the same words as `imagebuild patches`)."""
    from imagebuild.lock.patches import check_locked_patches
    findings = []
    keys = {str(patch.path): f"patches[{index}].file" for index, patch in enumerate(recipe.patches)}
    for result in check_locked_patches(recipe, locked):
        if result.applies:
            continue
        findings.append(Finding(
            "error", "patch-does-not-apply",
            f"the patch {result.patch} does not apply to {result.package} {result.checked}: "
            + "; ".join(result.problems),
            "; ".join(result.problems),
            f"regenerate the patch against {result.package} {result.checked}, or pin the release it was "
            f"made for (`imagebuild patches {recipe.path} --version {result.package}==VERSION` checks one)",
            f"the locked wheel of {result.package} {result.checked}", key=keys.get(result.patch)))
    return findings


def located(recipe: Recipe, findings: list) -> list:
    """Each finding about a recipe key gets that key's file and line (what the human output shows)."""
    from imagebuild.recipe.reader import key_path, locate, read_source
    try:
        text = read_source(recipe.path)
    except RecipeError:
        return findings
    out = []
    for finding in findings:
        if finding.key and not finding.where:
            line = locate(text, key_path(finding.key))
            finding = replace(finding, where=f"{recipe.path}:{line}" if line else str(recipe.path))
        out.append(finding)
    return out


def merged(before: list, after: list) -> list:
    """Recipe-time and lock-time rules can both see one problem (glibc vs nvcc): report it once."""
    seen = {(f.rule, f.message) for f in before}
    return before + [f for f in after if (f.rule, f.message) not in seen]


def stop_on_errors(findings: list, recipe: Recipe | None = None) -> None:
    if has_errors(findings):
        raise FindingsFailed(located(recipe, findings) if recipe is not None else findings)


# ---------------------------------------------------------------- lock

def lock(recipe_path: str | Path, *, lock_path: Path | None = None, upgrade_base: bool = False,
         progress: Progress = quiet) -> LockReport:
    """Resolve the recipe into its lock. A base already locked for what the recipe asks of it is kept
    as it is; `upgrade_base` moves it to its suites' current state (and keeps the Python pins of a
    fresh lock), and the report says what moved."""
    started = time.monotonic()
    recipe = load_recipe(recipe_path)
    single_platform(recipe)
    findings = rules.check_recipe(recipe, base_glibc(recipe))
    stop_on_errors(findings, recipe)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    old = existing_locks(path).get(recipe.base.arch if isinstance(recipe.base, DebianBase) else "amd64")
    new, found = resolved(recipe, progress, old=old, upgrade_base=upgrade_base)
    findings = merged(findings, found)
    stop_on_errors(findings, recipe)
    changed = store_lock(new, path)
    moves = base_moves(old.base, new.base) if old is not None and old.base.kind == "debian" else []
    return LockReport(str(recipe.path), str(path), changed, len(new.wheels),
                      time.monotonic() - started, located(recipe, findings), new.sha256, base_moves=moves)


def existing_locks(path: Path) -> dict[str, Lock]:
    """The lock file's locks by platform, to keep what they pinned; {} when there is none to read
    (missing, or of another format: the relock starts afresh)."""
    try:
        locks = read_locks(path)
    except LockError:
        return {}
    return {locks.base.arch: locks} if isinstance(locks, Lock) else dict(locks.locks)


def single_platform(recipe: Recipe) -> None:
    if recipe.platforms:
        raise RecipeError(recipe.path, f"names {len(recipe.platforms)} platforms: imagebuild.platforms "
                          "locks and builds each of them (the CLI's lock and build do)",
                          key="platforms", hint="call imagebuild.platforms.lock / build")


def resolved(recipe: Recipe, progress: Progress = quiet, *, old: Lock | None = None,
             upgrade_base: bool = False) -> tuple[Lock, list]:
    """The single-platform recipe resolved into a Lock, with what the resolve and the locked wheels
    say against the rules (not yet judged). The old lock's base is kept unless the recipe asks another
    or `upgrade_base`; moving only the base of a fresh lock keeps its wheels as they are."""
    base = identify(recipe.base, old.base if old is not None else None, upgrade=upgrade_base, progress=progress)
    if (upgrade_base and old is not None and not stale_reasons(old, recipe)
            and (base.python, base.glibc) == (old.base.python, old.base.glibc)):
        progress(f"keeping the {len(old.wheels)} locked wheels: only the base moves")
        return replace(old, base=base), []
    progress(f"resolving {len(recipe.python.requirements)} requirements for Python {base.python} "
             f"on {base.uv_platform}")
    new = resolve_lock(recipe, base)
    findings = rules.check_resolved(recipe, new.packages, base.glibc)
    found, layout = artifact_findings(recipe, new, progress)
    if layout:
        new = replace(new, cuda={**new.cuda, **layout})
    findings = merged(findings, found)
    if recipe.patches:
        progress(f"checking {len(recipe.patches)} patch(es) against the locked wheels")
        findings += patch_findings(recipe, new)
    return new, findings


def store_lock(new: Lock | PlatformLocks, path: Path) -> bool:
    """Write the lock unless the file already says exactly this; whether it changed."""
    text = new.to_json()
    changed = not path.exists() or path.read_text() != text
    if changed:
        write_locks(new, path)
    return changed


def _fresh_lock(recipe: Recipe, path: Path, relock: bool, progress: Progress) -> Lock:
    if relock or not path.exists():
        lock(recipe.path, lock_path=path, progress=progress)
    current = read_lock(path)
    ensure_fresh(current, recipe, path)
    return current


# ---------------------------------------------------------------- render

def render(recipe_path: str | Path, out_dir: Path, *, lock_path: Path | None = None,
           relock: bool = False, platform: str | None = None, progress: Progress = quiet) -> Path:
    """The build context of a single-platform recipe, or of one `platform` (amd64, arm64) of a
    multi-platform recipe's lock (which must be there and fresh)."""
    from imagebuild.render import render_context  # jinja2: only the commands that render pay for it
    recipe = load_recipe(recipe_path)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    if recipe.platforms:
        named = [spec.arch for spec in recipe.platforms]
        if platform not in named:
            raise RecipeError(recipe.path, f"names the platforms {', '.join(named)}: render one of them",
                              key="platforms", hint=f"add --platform {named[0]}")
        recipe = recipe.for_platform(platform)
        current = read_lock(path, platform)
        ensure_fresh(current, recipe, path)
        return render_context(current, recipe, out_dir, uv_path=uv_binary_for(platform, progress),
                              lock_text=current.to_json())
    current = _fresh_lock(recipe, path, relock, progress)
    return render_context(current, recipe, out_dir, uv_path=uv_binary_for(current.base.arch, progress),
                          lock_text=path.read_text())


# ---------------------------------------------------------------- build and smoke

def ca_bundle(explicit: str | None = None) -> Path | None:
    """The CA roots handed to the build as a secret: --ca-bundle, then the usual variables, then Debian's."""
    for candidate in (explicit, os.environ.get("IMAGEBUILD_CA_BUNDLE"), os.environ.get("SSL_CERT_FILE"),
                      os.environ.get("REQUESTS_CA_BUNDLE"), DEFAULT_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _smoke_cache(image_id: str, gpus: bool) -> Path:
    """A pass on record is one image's, under this imagebuild's probe, with or without GPUs: a pass made
    without a GPU says nothing of the GPU tier."""
    from imagebuild import payload
    key = f"{image_id.replace(':', '-')}-probe-{payload.checksum()[:16]}-{'gpus' if gpus else 'no-gpus'}"
    return cache_dir() / "smoke" / f"{key}.json"


def smoke_passed(image_id: str) -> bool:
    """Whether a smoke pass of this image id, under this probe, is on record (with or without GPUs)."""
    return any(_smoke_cache(image_id, gpus).is_file() for gpus in (False, True))


def lock_built(info: ImageInfo) -> str | None:
    """The lock sha256 this engine image was built from here and passed its smoke test for, else None:
    the label alone is inherited by derived images, so it must be this very image on record."""
    from imagebuild.render import LABEL_PREFIX
    locked = info.labels.get(f"{LABEL_PREFIX}.lock.sha256")
    if locked and info.id in built.images_built(locked) and smoke_passed(info.id):
        return locked
    return None


def smoke(image: str, engine: Engine, *, use_cache: bool = False, gpus: bool | None = None,
          progress: Progress = quiet) -> SmokeReport:
    """Run the image's own probe against its own expectations, offline, in a throwaway container."""
    engine.check()
    info = engine.inspect(image)
    if info is None:
        raise SmokeFailed(f"no image {image!r} in the {engine.name} engine")
    gpus = os.path.exists("/dev/nvidiactl") if gpus is None else gpus
    cached = _smoke_cache(info.id, gpus)
    if use_cache and cached.is_file():
        return SmokeReport(image, True, json.loads(cached.read_text()), cached=True)
    progress(f"smoke test: running the probe in {image} (network off{', GPUs on' if gpus else ''})")
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


_LAYER_FILE = re.compile(r"requirements/\d+-([a-z]+)\.txt")


def explain_build_failure(failure: BuildFailed, recipe: Recipe, locked: Lock) -> BuildFailed:
    """A failed step of our own Dockerfile said in the recipe's words: which patch, prune or layer."""
    step = failure.step
    if step is None:
        return failure
    text = step.instruction
    layer = _LAYER_FILE.search(text)
    layer = layer.group(1) if layer else "?"
    if "apply_patch.py" in text and "--package" in text:
        package = re.search(r"--package (\S+)", text).group(1)
        patch = next((str(p.path) for p in recipe.patches if p.package == package), "the recipe's patch")
        what = f"the patch {patch} does not apply to {package} {locked.packages.get(package, '?')}"
        hint = f"`imagebuild patches {recipe.path}` names the file and hunk without building"
    elif "prune.py" in text:
        what = f"[[prune]] failed in the {layer} layer"
        hint = "a glob must match files the distribution installs (its RECORD); `imagebuild render` shows the step"
    elif "uv pip install" in text:
        what = f"installing the {layer} layer failed"
        hint = "the lock's wheels did not install on the base: relock (`imagebuild lock`) or check the base"
    else:
        what = f"build step {step.step} failed"
        hint = "`imagebuild render RECIPE -o DIR` writes the Dockerfile to read the step in"
    instruction = text if len(text) <= 200 else text[:197] + "..."
    return BuildFailed(f"{what}: {step.cause}\n  step {step.step}: {instruction}\n  hint: {hint}\n"
                       f"no image was tagged.", step=step)


def build(recipe_path: str | Path, engine: Engine, *, lock_path: Path | None = None,
          relock: bool = False, run_smoke: bool = True, ca: str | None = None,
          keep_failed: bool = False, gpus: bool | None = None, tag: str | None = None,
          rebuild: bool = False, registry: RegistryTarget | None = None, cache: BuildCache | None = None,
          accept_unknown: bool = False, progress: Progress = quiet) -> BuildReport:
    """check -> lock (fresh or refused) -> [reuse] -> base -> render -> build untagged -> smoke -> tag
    [-> push]. `tag` replaces the recipe's NAME:TAG (tests build under names of their own). An image
    built from this very lock is reused, not rebuilt: the lock's digest covers everything that decides
    the image. With `registry`, a manifest tagged lock-<sha256> there is found by a HEAD and given the
    recipe's tag (no layer moves, no engine needed); otherwise the smoke-tested image is pushed under
    both tags. The engine is asked next (its io.imagebuild.lock.sha256 label); `rebuild` builds anyway.
    With `cache`, the build takes unchanged layers from its sources and, once built (and smoke-tested
    when asked), leaves its own at its target for the next runner."""
    timings: dict[str, float] = {}
    clock = time.monotonic()
    recipe = load_recipe(recipe_path)
    single_platform(recipe)
    findings = rules.check_recipe(recipe, base_glibc(recipe))
    stop_on_errors(findings, recipe)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    current = _fresh_lock(recipe, path, relock, progress)
    findings = merged(findings, rules.check_resolved(recipe, current.packages, current.base.glibc))
    if recipe.patches and not relock:  # a relock has just checked them
        findings += patch_findings(recipe, current)
    stop_on_errors(findings, recipe)
    timings["lock"] = time.monotonic() - clock
    if registry is not None and not run_smoke:
        raise ImagebuildError("--registry pushes only smoke-tested images (its lock tag stands for one): "
                              "drop --no-smoke")
    if registry is not None and not rebuild:
        clock = time.monotonic()
        hit = reuse_by_lock(registry, current.sha256, split_ref(tag or f"{recipe.name}:{recipe.tag}")[1], progress,
                            expected=built.pushed_digest(current.sha256, _repository(registry)))
        if hit:
            timings["registry"] = time.monotonic() - clock
            progress(f"reusing {hit.reference}: the registry holds the image built from this lock "
                     f"({hit.lock_reference})")
            return BuildReport(str(recipe.path), hit.reference, hit.digest, 0, timings, None, str(path), findings,
                               reused=True, registry={**asdict(hit), "pushed": False})
    platform = None if current.base.arch == host_arch() else f"linux/{current.base.arch}"
    report = build_locked(recipe, current, path, engine, findings=findings, timings=timings,
                          lock_text=path.read_text(), tag=tag, run_smoke=run_smoke, ca=ca,
                          keep_failed=keep_failed, gpus=gpus, rebuild=rebuild, cache=cache,
                          platform=platform, accept_unknown=accept_unknown, progress=progress)
    return _pushed(report, registry, current, engine, progress)


def build_locked(recipe: Recipe, current: Lock, path: Path, engine: Engine, *, findings: list, timings: dict,
                 lock_text: str, tag: str | None, run_smoke: bool, ca: str | None, keep_failed: bool,
                 gpus: bool | None, rebuild: bool, cache: BuildCache | None = None, platform: str | None = None,
                 context: str | None = None, accept_unknown: bool = False, progress: Progress = quiet) -> BuildReport:
    """One image from a fresh single-platform lock: reuse by lock label, or base -> render -> build
    untagged (for `platform` when given) -> smoke -> tag [-> cache]."""
    from imagebuild.render import LABEL_PREFIX, render_context
    engine.check()
    label = (f"{LABEL_PREFIX}.lock.sha256", current.sha256)
    reused = None if rebuild else engine.find_labelled(*label, only=built.images_built(current.sha256))
    if reused:
        progress(f"reusing {reused}: the engine holds the image built here from this lock ({current.sha256[:12]}…)")
        return _smoke_and_tag(reused, recipe, path, tag, findings, timings, engine, run_smoke=run_smoke,
                              keep_failed=keep_failed, gpus=gpus, reused=True, accept_unknown=accept_unknown,
                              progress=progress)

    if not rebuild and engine.find_labelled(*label):
        progress("an image carries this lock's label but is not one built here from it (an image made FROM it, "
                 "or committed from it, inherits the label): building")
    clock = time.monotonic()
    ensure_base_image(current.base, recipe.base, engine, progress)
    timings["base"] = time.monotonic() - clock
    seeded = None
    if recipe.aot and cache is not None and cache.sources:
        clock = time.monotonic()
        seeded = seed_kernels(current, cache, engine, platform, progress)
        timings["kernel_seed"] = time.monotonic() - clock

    clock = time.monotonic()
    folder = cache_dir() / "contexts" / (context or recipe.stem)
    context_dir = render_context(current, recipe, folder, uv_path=uv_binary_for(current.base.arch, progress),
                                 lock_text=lock_text)
    bundle = ca_bundle(ca)
    watch = KernelStepWatch(progress)
    try:
        image_id = engine.build(context_dir, secrets={"ca": bundle} if bundle else {}, progress=watch,
                                cache=cache, platform=platform)
    except BuildFailed as failure:
        raise explain_build_failure(failure, recipe, current) from None
    built.record_image(current.sha256, image_id)
    timings["build"] = time.monotonic() - clock
    kernels = watch.report(lambda: _kernel_count(engine, image_id)) if recipe.aot else None
    if kernels is not None and seeded is not None:
        kernels["seeded"] = seeded
    if kernels:
        progress(kernel_summary(kernels))
    report = _smoke_and_tag(image_id, recipe, path, tag, findings, timings, engine, run_smoke=run_smoke,
                            keep_failed=keep_failed, gpus=gpus, reused=False, accept_unknown=accept_unknown,
                            smoke_cache=not rebuild, progress=progress)
    report.kernels = kernels
    _cached(report, cache, engine, progress)
    return report


def seed_kernels(current: Lock, cache: BuildCache, engine: Engine, platform: str | None,
                 progress: Progress = quiet, mount: tuple[str, str] | None = None) -> dict:
    """A fresh runner's kernel cache: the kernels in the [aot] layer of the first --cache-from image that has
    one, put into the engine's kernel cache mount (`mount`: id and folder, the [aot] step's by default) before
    the build. Says what it took, or why nothing."""
    from imagebuild.render import AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID
    cache_id, cache_dir = mount or (KERNEL_CACHE_ID, KERNEL_CACHE_DIR)
    tried = []
    with tempfile.TemporaryDirectory(prefix="imagebuild-kernel-layer-") as folder:
        for source in cache.sources:
            entries = Path(folder) / str(len(tried))
            layer = read_kernel_layer(source, entries, manifest_path=AOT_MANIFEST,
                                      platform=platform or f"linux/{host_arch()}", ca_cert=cache.ca_cert,
                                      insecure_http=cache.insecure_http, progress=progress)
            if layer.why:
                progress(f"kernel cache: nothing taken from {source}: {layer.why}")
                tried.append(layer.to_dict())
                continue
            added = seed_engine(engine, entries, base_ref=current.base.image_ref, python=current.base.python_path,
                                platform=platform, cache_id=cache_id, cache_dir=cache_dir, progress=progress)
            return {**layer.to_dict(), "added": added, "tried": tried}
    return {"source": None, "added": None, "tried": tried}


def _kernel_count(engine: Engine, image_id: str) -> int | None:
    """How many kernels the image's [aot] manifest lists (None: it cannot be read)."""
    from imagebuild.render import AOT_MANIFEST
    try:
        return len(json.loads(engine.run(image_id, ["cat", AOT_MANIFEST]).stdout)["artifacts"])
    except (ImagebuildError, ValueError, KeyError, TypeError):
        return None


def _cached(report: BuildReport, cache: BuildCache | None, engine: Engine, progress: Progress) -> None:
    """With a cache target: the built image, its cache metadata kept, pushed there for the next runner
    (an engine that wrote the cache during the build has done it already)."""
    if cache is None:
        return
    report.cache = {"from": list(cache.sources), "to": cache.target, "digest": None,
                    "written_by": (engine.name if engine.writes_cache else "imagebuild") if cache.target else None}
    if cache.target and not engine.writes_cache:
        clock = time.monotonic()
        report.cache["digest"] = push_build_cache(engine, report.image_id, cache, progress)
        report.seconds["cache_push"] = time.monotonic() - clock


def _repository(target: RegistryTarget) -> str:
    """HOST[:PORT]/REPOSITORY, however the target was written: how pushes for a lock are on record."""
    ref = target.reference("x")
    return f"{ref.registry}/{ref.repository}"


def _pushed(report: BuildReport, registry: RegistryTarget | None, current: Lock, engine: Engine,
            progress: Progress) -> BuildReport:
    """With a registry: the smoke-tested image pushed under the recipe's tag and its lock tag."""
    if registry is None:
        return report
    clock = time.monotonic()
    hit = push_by_lock(engine, report.image, registry, current.sha256, split_ref(report.image)[1], progress)
    built.record_push(current.sha256, _repository(registry), hit.digest)
    report.seconds["push"] = time.monotonic() - clock
    report.registry = {**asdict(hit), "pushed": True}
    return report


def _smoke_and_tag(image_id: str, recipe: Recipe, path: Path, tag: str | None, findings: list, timings: dict,
                   engine: Engine, *, run_smoke: bool, keep_failed: bool, gpus: bool | None, reused: bool,
                   accept_unknown: bool = False, smoke_cache: bool = True, progress: Progress) -> BuildReport:
    """Smoke (or its recorded result for this image id), then tag; a failed smoke tags nothing, and nor
    does a check that ended `unknown` unless the recipe ([smoke] accept_unknown) or the caller accepts it.
    A rebuild (`smoke_cache` off) runs the smoke test even when a pass for this image id is on record."""
    ref = tag or f"{recipe.name}:{recipe.tag}"
    report = None
    accepted: list[str] = []
    if run_smoke:
        clock = time.monotonic()
        report = smoke(image_id, engine, use_cache=smoke_cache, gpus=gpus, progress=progress)
        timings["smoke"] = time.monotonic() - clock
        unknown = [c.get("name") for c in report.report.get("checks", [])
                   if isinstance(c, dict) and c.get("status") == "unknown"]
        refused = [name for name in unknown if not accept_unknown and name not in recipe.smoke.accept_unknown]
        accepted = [name for name in unknown if name not in refused]
        if report.ok and refused:
            report = SmokeReport(report.image, False, report.report, report.cached, unknown=refused)
        if not report.ok:
            untagged = not (engine.inspect(image_id) or ImageInfo("", 0)).tags  # a cache hit can be a tagged image
            if not keep_failed and untagged:
                engine.remove(image_id)
            failed = [c["name"] for c in report.report.get("checks", []) if c.get("status") == "fail"]
            said = ", ".join(failed) or ("" if report.unknown else "no report")
            if report.unknown:
                said += (", " if said else "") + f"{', '.join(report.unknown)} ended unknown: nothing proved it; " \
                        f"accept it by name with [smoke] accept_unknown = {json.dumps(report.unknown)} " \
                        "or build with --accept-unknown"
            raise SmokeFailed(f"smoke test failed in the image built from {recipe.path} ({said}); {ref} was not "
                              "tagged" + (f"; the image is kept as {image_id}" if keep_failed else ""),
                              report.report)
    engine.tag(image_id, ref)
    info = engine.inspect(image_id)
    return BuildReport(str(recipe.path), ref, image_id, info.size if info else 0, timings, report,
                       str(path), findings, reused=reused, accepted_unknown=accepted)
