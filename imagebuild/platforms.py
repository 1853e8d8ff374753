"""Every platform of a recipe: lock and build a recipe that names [platforms.amd64] and [platforms.arm64].

    recipe ─for_platform(arch)─▶ one single-platform recipe per platform ─pipeline─▶ one Lock, one image each

Each platform is the single-platform pipeline run on `Recipe.for_platform(arch)`: its base is bootstrapped
for that architecture, uv resolves for that CPU, and the image is built (a foreign platform's RUN
steps under the host's binfmt emulator, or natively on the platform's own `engine` endpoint) and
smoke-tested in its own container. The lock file holds one lock per platform (PlatformLocks); Docker
20.10 keeps one platform per tag, so each image is tagged NAME:TAG-<arch> and the host's own
platform also NAME:TAG; `export-oci` joins them into one OCI image index and `push` pushes it as one tag.
A single-platform recipe goes straight to pipeline.lock / pipeline.build, unchanged.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from imagebuild import pipeline
from imagebuild.engine import BuildCache, Engine, default_engine, engine_names
from imagebuild.engine.contract import split_ref
from imagebuild.errors import ImagebuildError, LockError
from imagebuild.knowledge import rules
from imagebuild.lock import Lock, PlatformLocks, default_lock_path, ensure_fresh, read_locks
from imagebuild.lock.diff import diff_lock_files
from imagebuild.lock.lockfile import recipe_sha256
from imagebuild.bootstrap import base_moves
from imagebuild.common import Progress, host_arch, quiet, write_atomic
from imagebuild.recipe.model import PlatformSpec, Recipe, load_recipe, parse_recipe
from imagebuild.recipe.pins import set_pin
from imagebuild.recipe.reader import read_source



@dataclass
class PlatformsBuildReport:
    """What `build` of a multi-platform recipe did: one BuildReport per platform."""

    recipe: str
    image: str  # NAME:TAG; each platform's image is NAME:TAG-<arch>
    lock_path: str
    platforms: dict[str, pipeline.BuildReport]
    findings: list = field(default_factory=list)
    native: str | None = None  # the platform also tagged NAME:TAG (this machine's own), if built

    @property
    def seconds(self) -> dict:
        return {arch: sum(report.seconds.values()) for arch, report in self.platforms.items()}

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "image": self.image, "lock": self.lock_path, "native": self.native,
                "platforms": {f"linux/{arch}": report.to_dict() for arch, report in self.platforms.items()},
                "findings": [f.to_dict() for f in self.findings]}


def lock(recipe_path: str | Path, *, lock_path: Path | None = None, upgrade_base: bool = False,
         progress: Progress = quiet) -> pipeline.LockReport:
    """One lock per platform, in one file; a package with no wheel for a platform stops the lock,
    naming the package and the platform."""
    recipe = load_recipe(recipe_path)
    if not recipe.platforms:
        return pipeline.lock(recipe.path, lock_path=lock_path, upgrade_base=upgrade_base, progress=progress)
    started = time.monotonic()
    findings = rules.check_recipe(recipe, pipeline.base_glibc(recipe))
    pipeline.stop_on_errors(findings, recipe)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    locks, found, moves = {}, {}, []
    old = pipeline.existing_locks(path)
    for spec in recipe.platforms:
        progress(f"{spec.name}: locking")
        locks[spec.arch], found[spec.arch] = pipeline.resolved(recipe.for_platform(spec.arch), progress,
                                                               old=old.get(spec.arch), upgrade_base=upgrade_base)
        if spec.arch in old and old[spec.arch].base.kind == "debian":
            moves += [{**move, "arch": spec.arch} for move in base_moves(old[spec.arch].base, locks[spec.arch].base)]
    findings = pipeline.merged(findings, across_platforms(found))
    pipeline.stop_on_errors(findings, recipe)
    new = PlatformLocks(recipe=recipe.stem, recipe_sha256=recipe_sha256(recipe), locks=locks)
    changed = pipeline.store_lock(new, path)
    report = pipeline.LockReport(str(recipe.path), str(path), changed, sum(len(l.wheels) for l in locks.values()),
                                 time.monotonic() - started, pipeline.located(recipe, findings), new.sha256,
                                 base_moves=moves)
    report.platforms = {f"linux/{arch}": {"packages": len(one.wheels), "lock_sha256": one.sha256,
                                          "python_platform": one.python_platform}
                        for arch, one in sorted(locks.items())}
    return report


def across_platforms(found: dict[str, list]) -> list:
    """Findings of every platform, once: one that every platform has is said plainly, one that only
    some have names them."""
    keys = {arch: {(f.rule, f.message) for f in findings} for arch, findings in found.items()}
    everywhere = set.intersection(*keys.values()) if keys else set()
    out, seen = [], set()
    for arch, findings in found.items():
        for finding in findings:
            key = (finding.rule, finding.message)
            if key in everywhere:
                if key not in seen:
                    seen.add(key)
                    out.append(finding)
            else:
                out.append(dataclasses.replace(finding, message=f"linux/{arch}: {finding.message}"))
    return out


def fresh_locks(recipe: Recipe, path: Path, relock: bool, progress: Progress) -> dict[str, Lock]:
    """Each platform's lock, refreshed first when asked or missing; a stale one is refused."""
    if relock or not path.exists():
        lock(recipe.path, lock_path=path, progress=progress)
    locks = read_locks(path)
    named = [spec.arch for spec in recipe.platforms]
    if isinstance(locks, Lock) or sorted(locks.locks) != sorted(named):
        held = locks.base.arch if isinstance(locks, Lock) else ", ".join(sorted(locks.locks))
        raise LockError(f"{path} holds a lock for {held}, the recipe names {', '.join(named)}: "
                        f"refresh it with `imagebuild lock {recipe.path}` or build with --relock")
    for arch in named:
        ensure_fresh(locks.locks[arch], recipe.for_platform(arch), path)
    return locks.locks


def engine_for(spec: PlatformSpec, default: Engine) -> Engine:
    """The platform's own builder when the recipe names one (an endpoint of the default engine's kind),
    else the default."""
    if spec.engine is None:
        return default
    if not default.reaches_endpoints():
        able = [name for name in engine_names() if default_engine(name).reaches_endpoints()]
        raise ImagebuildError(f"[platforms.{spec.arch}] engine = {spec.engine!r} is another machine's endpoint, "
                              f"which the {default.name} engine cannot reach: build with "
                              f"{' or '.join(f'--engine {name}' for name in able)}")
    return default.at(spec.engine)


def build(recipe_path: str | Path, engine: Engine, *, lock_path: Path | None = None, relock: bool = False,
          run_smoke: bool = True, ca: str | None = None, keep_failed: bool = False, gpus: bool | None = None,
          accept_unknown: bool = False,
          tag: str | None = None, rebuild: bool = False, registry=None, cache: BuildCache | None = None,
          progress: Progress = quiet):
    """Every platform's image, built, smoke-tested in its own container, and tagged NAME:TAG-<arch>;
    the image for this machine's own platform is also tagged NAME:TAG. An image built on a
    platform's own engine is copied back into the default one, so export-oci and push see them all.
    A single-platform recipe is pipeline.build's."""
    recipe = load_recipe(recipe_path)
    if not recipe.platforms:
        return pipeline.build(recipe.path, engine, lock_path=lock_path, relock=relock, run_smoke=run_smoke, ca=ca,
                              keep_failed=keep_failed, gpus=gpus, tag=tag, rebuild=rebuild, registry=registry,
                              accept_unknown=accept_unknown,
                              cache=cache, progress=progress)
    if registry is not None or cache is not None:
        raise ImagebuildError("--registry, --cache-from and --cache-to take one platform's image: for several, "
                              "build, then `imagebuild export-oci` every platform's image into one index and "
                              "`imagebuild push` it")
    started = time.monotonic()
    findings = rules.check_recipe(recipe, pipeline.base_glibc(recipe))
    pipeline.stop_on_errors(findings, recipe)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    locks = fresh_locks(recipe, path, relock, progress)
    found = {}
    for spec in recipe.platforms:
        one = recipe.for_platform(spec.arch)
        found[spec.arch] = rules.check_resolved(one, locks[spec.arch].packages, locks[spec.arch].base.glibc)
        if recipe.patches and not relock:
            found[spec.arch] += pipeline.patch_findings(one, locks[spec.arch])
    findings = pipeline.merged(findings, across_platforms(found))
    pipeline.stop_on_errors(findings, recipe)
    lock_seconds = time.monotonic() - started
    ref = tag or f"{recipe.name}:{recipe.tag}"
    reports: dict[str, pipeline.BuildReport] = {}
    for spec in recipe.platforms:
        own = engine_for(spec, engine)
        where = f" on {spec.engine}" if spec.engine else ("" if spec.arch == host_arch() else " under emulation")
        progress(f"{spec.name}: building{where}")
        report = pipeline.build_locked(
            recipe.for_platform(spec.arch), locks[spec.arch], path, own, findings=[],
            timings={"lock": lock_seconds}, lock_text=locks[spec.arch].to_json(), tag=platform_ref(ref, spec.arch),
            run_smoke=run_smoke, ca=ca, keep_failed=keep_failed, gpus=gpus if spec.arch == host_arch() else False,
            accept_unknown=accept_unknown,
            rebuild=rebuild, platform=spec.name, context=f"{recipe.stem}-{spec.arch}", progress=progress)
        if own is not engine:
            clock = time.monotonic()
            copy_image(own, engine, report.image, progress)
            report.seconds["copy"] = time.monotonic() - clock
        reports[spec.arch] = report
    native = host_arch() if host_arch() in reports else None
    if native:
        engine.tag(platform_ref(ref, native), ref)
    return PlatformsBuildReport(str(recipe.path), ref, str(path), reports, pipeline.located(recipe, findings), native)


def platform_ref(ref: str, arch: str) -> str:
    """NAME:TAG -> NAME:TAG-arm64: one platform's image in an engine that holds one per tag."""
    name, tag = split_ref(ref)
    return f"{name}:{tag}-{arch}"


def copy_image(source: Engine, target: Engine, ref: str, progress: Progress) -> None:
    """`docker save` on the platform's builder into `docker load` here, streamed."""
    progress(f"copying {ref} from its builder into the local engine")
    with source.save(ref) as stream:
        target.load(lambda sink: shutil.copyfileobj(stream, sink, 1 << 20), f"{ref} from its builder")


def upgrade_packages(recipe_path: str | Path, upgrades: list[tuple[str, str | None]], *,
                     lock_path: Path | None = None, progress: Progress = quiet):
    """`lock --upgrade-package`: each (name, version) pin moved in the recipe in place (version None: the
    newest that resolves with the rest of the recipe, as uv picks it), then the recipe relocked. Returns
    (LockReport, the lock diff, the pins moved: name, old, new). The recipe is written atomically, and
    written back as it was when the relock fails, so a pin that does not resolve leaves nothing changed."""

    recipe = load_recipe(recipe_path)
    before = read_source(recipe.path)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    old = pipeline.existing_locks(path)
    text, moved = before, []
    for name, version in upgrades:
        name = canonicalize_name(name)
        was = next((lock.packages[name] for lock in old.values() if name in lock.packages), None)
        if version is None:
            loose = parse_recipe(set_pin(text, recipe.path, name, None), recipe.path)
            arch = loose.platforms[0].arch if loose.platforms else getattr(loose.base, "arch", "amd64")
            progress(f"{name}: finding the newest release that resolves with the rest of {recipe.path.name}")
            found, _ = pipeline.resolved(loose.for_platform(arch) if loose.platforms else loose, progress,
                                         old=old.get(arch))
            version = found.packages[name]
        text = set_pin(text, recipe.path, name, version)
        moved.append({"name": name, "old": was, "new": version})
    if text != before:
        write_atomic(recipe.path, text.encode("utf-8"))
    try:
        report = lock(recipe.path, lock_path=path, progress=progress)
    except BaseException:
        if text != before:
            write_atomic(recipe.path, before.encode("utf-8"))
        raise
    diff = diff_lock_files(old, pipeline.existing_locks(path), f"{path} (before)", str(path)) if old else None
    return report, diff, moved
