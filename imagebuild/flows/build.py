"""The build flow: each platform of a recipe, from its fresh lock to a smoke-tested, tagged image.

    check ─▶ locks (fresh, or refused) ─▶ per platform: [reuse] ─▶ base ─▶ [kernel seed] ─▶ render
          ─▶ engine.build, held ─▶ smoke ─▶ tag [─▶ cache push] ─▶ (one platform: [registry push])

A recipe without [platforms.*] is one platform, tagged NAME:TAG; with several, each platform's image is
tagged NAME:TAG-<arch> (Docker 20.10 keeps one platform per tag) and this machine's own also NAME:TAG; an
image built on a platform's own engine endpoint is copied back into the default engine, so export-oci and
push see them all. A registry (build by lock) and a build cache take one platform's image.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from imagebuild.common import Progress, cache_dir, host_arch, platform_name, quiet
from imagebuild.engine import BuildCache, Engine
from imagebuild.engine.contract import split_ref
from imagebuild.errors import BuildFailed, ImageNotFound, ImagebuildError
import imagebuild.flows.built as built  # not via the package's face, which imports this module
from imagebuild.flows.build_cache import push_build_cache
from imagebuild.flows.by_lock import RegistryTarget, push_by_lock, reuse_by_lock, said_checks
from imagebuild.render.markers import explain as explain_build_failure
from imagebuild.flows.findings import across_platforms, located, locked_findings, merged, recipe_findings, \
    stop_on_errors
from imagebuild.flows.kernels import KernelStepWatch, merge_entries, read_kernel_layer, seed_engine
from imagebuild.flows.kernels import summary as kernel_summary
from imagebuild.flows.lock import fresh_locks
from imagebuild.flows.options import BuildOptions
from imagebuild.flows.platforms import copy_image, each_platform, engine_for, platform_ref
from imagebuild.flows.reports import BuildReport, PlatformsBuildReport
from imagebuild.flows.smoke import Hold, holding, smoke_and_tag
from imagebuild.lock import Lock, default_lock_path, uv_binary_for
from imagebuild.bootstrap import ensure_base_image
from imagebuild.recipe.model import Recipe, load_recipe
from imagebuild.registry import Connection

# Where users behind a TLS-intercepting proxy keep the roots that proxy signs with (Debian's path).
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def build(recipe_path: str | Path, engine: Engine, options: BuildOptions = BuildOptions()):
    """Every platform's image: a BuildReport for a recipe without [platforms.*], else a
    PlatformsBuildReport. An image built from this very lock is reused, not rebuilt (the lock's digest
    covers everything that decides the image): with `options.registry`, a manifest tagged lock-<sha256>
    there is found by a HEAD and given the recipe's tag (no layer moves, no engine needed), otherwise the
    smoke-tested image is pushed under both tags; the engine is asked next (its io.imagebuild.lock.sha256
    label); `options.rebuild` builds anyway. With `options.cache`, the build takes unchanged layers from its
    sources and, once built (and smoke-tested when asked), leaves its own at its target for the next runner."""
    clock = time.monotonic()
    progress = options.progress
    recipe = load_recipe(recipe_path)
    several = bool(recipe.platforms)
    if several and (options.registry is not None or options.cache is not None):
        raise ImagebuildError("--registry, --cache-from and --cache-to take one platform's image: for several, "
                              "build, then `imagebuild export-oci` every platform's image into one index and "
                              "`imagebuild push` it")
    findings = recipe_findings(recipe)
    path = Path(options.lock_path) if options.lock_path else default_lock_path(recipe)
    locks = fresh_locks(recipe, path, options.relock, progress)
    targets = each_platform(recipe) if several else {arch: recipe for arch in locks}
    found = {arch: locked_findings(one, locks[arch], patches=not options.relock)  # a relock has just checked them
             for arch, one in targets.items()}
    findings = merged(findings, across_platforms(found))
    stop_on_errors(findings, recipe)
    lock_seconds = time.monotonic() - clock
    ref = options.tag or f"{recipe.name}:{recipe.tag}"
    if not several:
        [(arch, one)] = targets.items()
        return build_single(one, locks[arch], path, engine, replace(options, tag=ref), findings,
                            {"lock": lock_seconds})
    reports: dict[str, BuildReport] = {}
    for spec in recipe.platforms:
        own = engine_for(spec, engine)
        where = f" on {spec.engine}" if spec.engine else ("" if spec.arch == host_arch() else " under emulation")
        progress(f"{spec.name}: building{where}")
        platform_options = replace(options, tag=platform_ref(ref, spec.arch),
                                   gpus=options.gpus if spec.arch == host_arch() else False)
        report = build_one(targets[spec.arch], locks[spec.arch], path, own, platform_options, findings=[],
                           timings={"lock": lock_seconds}, lock_text=locks[spec.arch].to_json(),
                           platform=spec.name, context=f"{recipe.stem}-{spec.arch}")
        if own is not engine:
            clock = time.monotonic()
            copy_image(own, engine, report.image, progress)
            report.seconds["copy"] = time.monotonic() - clock
        reports[spec.arch] = report
    native = host_arch() if host_arch() in reports else None
    if native:
        engine.tag(platform_ref(ref, native), ref)
    return PlatformsBuildReport(str(recipe.path), ref, str(path), reports, located(recipe, findings), native)


def build_single(recipe: Recipe, current: Lock, path: Path, engine: Engine, options: BuildOptions,
                 findings: list, timings: dict) -> BuildReport:
    """The one platform of a recipe without [platforms.*]: reused or pushed by lock when a registry is
    named, else built as any platform is."""
    registry = options.registry
    if registry is not None and not options.run_smoke:
        raise ImagebuildError("--registry pushes only smoke-tested images (its lock tag stands for one): "
                              "drop --no-smoke")
    if registry is not None and not options.rebuild:
        clock = time.monotonic()
        hit = reuse_by_lock(registry, current.sha256, split_ref(options.tag)[1], options.progress,
                            expected=built.pushed_digest(current.sha256, repository(registry),
                                                         registry.compression))
        if hit:
            timings["registry"] = time.monotonic() - clock
            options.progress(f"reusing {hit.reference}: the registry holds the image built from this lock "
                             f"({hit.lock_reference}), and the smoke report that passed for it "
                             f"({hit.smoke['artifact']}: {said_checks(hit.smoke)})")
            return BuildReport(str(recipe.path), hit.reference, hit.digest, 0, timings, None, str(path), findings,
                               reused=True, registry={**asdict(hit), "pushed": False})
    platform = None if current.base.arch == host_arch() else platform_name(current.base.arch)
    report = build_one(recipe, current, path, engine, options, findings=findings, timings=timings,
                       lock_text=path.read_text(), platform=platform)
    return pushed(report, registry, current, engine, options)


def build_one(recipe: Recipe, current: Lock, path: Path, engine: Engine, options: BuildOptions, *,
              findings: list, timings: dict, lock_text: str, platform: str | None = None,
              context: str | None = None) -> BuildReport:
    """One image from one platform's fresh lock: reuse by lock label, or base -> render -> build
    under a hold name (for `platform` when given) -> smoke -> tag [-> cache]."""
    engine.check()
    with holding(engine, current.sha256) as hold:
        return held_build(recipe, current, path, engine, options, hold, findings=findings, timings=timings,
                          lock_text=lock_text, platform=platform, context=context)


def held_build(recipe: Recipe, current: Lock, path: Path, engine: Engine, options: BuildOptions, hold: Hold, *,
               findings: list, timings: dict, lock_text: str, platform: str | None, context: str | None) -> BuildReport:
    """build_one under `hold`, the name the image has from the build (or the reuse) to its tag."""
    from imagebuild.render import LABEL_PREFIX, render_context
    progress = options.progress
    label = (f"{LABEL_PREFIX}.lock.sha256", current.sha256)
    reused = None if options.rebuild else engine.find_labelled(*label, only=built.images_built(current.sha256))
    if reused:
        try:
            engine.tag(reused, hold.ref)
        except ImageNotFound:
            progress(f"{reused} went from the engine as it was found: building")
            reused = None
    if reused:
        progress(f"reusing {reused}: the engine holds the image built here from this lock ({current.sha256[:12]}…)")
        return smoke_and_tag(reused, recipe, path, findings, timings, engine, options, reused=True, hold=hold)

    if not options.rebuild and engine.find_labelled(*label):
        progress("an image carries this lock's label but is not one built here from it (an image made FROM it, "
                 "or committed from it, inherits the label): building")
    clock = time.monotonic()
    ensure_base_image(current.base, recipe.base, engine, progress)
    timings["base"] = time.monotonic() - clock
    seeded = None
    if recipe.aot and options.cache is not None and options.cache.sources:
        clock = time.monotonic()
        seeded = seed_kernels(current, options.cache, engine, platform, progress, connection=options.connection)
        timings["kernel_seed"] = time.monotonic() - clock

    clock = time.monotonic()
    # The lock's hash in the name: two recipes of one file name (a test's copy of a gallery recipe, a second
    # checkout) never render into each other's folder; one lock renders the same bytes.
    folder = cache_dir() / "contexts" / f"{context or recipe.stem}-{current.sha256[:12]}"
    context_dir = render_context(current, recipe, folder, uv_path=uv_binary_for(current.base.arch, progress),
                                 lock_text=lock_text)
    bundle = ca_bundle(options.ca)
    watch = KernelStepWatch(progress)
    try:
        image_id = engine.build(context_dir, secrets={"ca": bundle} if bundle else {}, progress=watch,
                                cache=options.cache, platform=platform, hold=hold.ref)
    except BuildFailed as failure:
        raise explain_build_failure(failure, recipe, current) from None
    built.record_image(current.sha256, image_id)
    timings["build"] = time.monotonic() - clock
    kernels = watch.report(lambda: kernel_count(engine, image_id)) if recipe.aot else None
    if kernels is not None and seeded is not None:
        kernels["seeded"] = seeded
    if kernels:
        progress(kernel_summary(kernels))
    report = smoke_and_tag(image_id, recipe, path, findings, timings, engine, options, reused=False, hold=hold)
    report.kernels = kernels
    cached(report, options.cache, engine, options)
    return report


def ca_bundle(explicit: str | None = None) -> Path | None:
    """The CA roots handed to the build as a secret: --ca-bundle, then the usual variables, then Debian's."""
    for candidate in (explicit, os.environ.get("IMAGEBUILD_CA_BUNDLE"), os.environ.get("SSL_CERT_FILE"),
                      os.environ.get("REQUESTS_CA_BUNDLE"), DEFAULT_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def seed_kernels(current: Lock, cache: BuildCache, engine: Engine, platform: str | None,
                 progress: Progress = quiet, mount: tuple[str, str] | None = None, *,
                 connection: Connection = Connection()) -> dict:
    """A fresh runner's kernel cache: the union of the kernels in the [aot] layers of every --cache-from image
    that has one (reached by `connection`; a gallery names its other recipes' caches too), put into the engine's
    kernel cache mount (`mount`: id and folder, the [aot] step's by default) by one seed build before the build.
    Says what each source gave (`taken`: its layer, and the entries an earlier source gave already), what was
    added, and why a source gave nothing (`tried`)."""
    from imagebuild.render import AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID
    cache_id, cache_folder = mount or (KERNEL_CACHE_ID, KERNEL_CACHE_DIR)
    taken, tried = [], []
    with tempfile.TemporaryDirectory(prefix="imagebuild-kernel-layer-") as folder:
        union = Path(folder) / "union"
        for index, source in enumerate(cache.sources):
            entries = Path(folder) / str(index)
            layer = read_kernel_layer(source, entries, manifest_path=AOT_MANIFEST,
                                      platform=platform or platform_name(host_arch()), connection=connection,
                                      progress=progress)
            if layer.why:
                progress(f"kernel cache: nothing taken from {source}: {layer.why}")
                tried.append(layer.to_dict())
                continue
            taken.append({**layer.to_dict(), "given_already": len(merge_entries(entries, union))})
        if not taken:
            return {"taken": [], "added": None, "tried": tried}
        added = seed_engine(engine, union, base_ref=current.base.image_ref, python=current.base.python_path,
                            platform=platform, cache_id=cache_id, cache_dir=cache_folder, progress=progress)
    return {"taken": taken, "added": added, "tried": tried}


def kernel_count(engine: Engine, image_id: str) -> int | None:
    """How many kernels the image's [aot] manifest lists (None: it cannot be read)."""
    from imagebuild.render import AOT_MANIFEST
    try:
        return len(json.loads(engine.run(image_id, ["cat", AOT_MANIFEST]).stdout)["artifacts"])
    except (ImagebuildError, ValueError, KeyError, TypeError):
        return None


def cached(report: BuildReport, cache: BuildCache | None, engine: Engine, options: BuildOptions) -> None:
    """With a cache target: the built image, its cache metadata kept, pushed there for the next runner
    (an engine that wrote the cache during the build has done it already)."""
    if cache is None:
        return
    report.cache = {"from": list(cache.sources), "to": cache.target, "digest": None,
                    "written_by": (engine.name if engine.writes_cache else "imagebuild") if cache.target else None}
    if cache.target and not engine.writes_cache:
        clock = time.monotonic()
        report.cache["digest"] = push_build_cache(engine, report.image_id, cache, options.connection, options.progress)
        report.seconds["cache_push"] = time.monotonic() - clock


def repository(target: RegistryTarget) -> str:
    """HOST[:PORT]/REPOSITORY, however the target was written: how pushes for a lock are on record."""
    ref = target.reference("x")
    return f"{ref.registry}/{ref.repository}"


def pushed(report: BuildReport, registry: RegistryTarget | None, current: Lock, engine: Engine,
           options: BuildOptions) -> BuildReport:
    """With a registry: the smoke-tested image pushed under the recipe's tag and its lock tag."""
    if registry is None:
        return report
    clock = time.monotonic()
    if report.smoke is None or not report.smoke.ok:
        raise ImagebuildError(f"{report.image} has no smoke report that passed: it is not pushed under its lock tag")
    hit = push_by_lock(engine, report.image, registry, current.sha256, split_ref(report.image)[1],
                       report.smoke.report, options.progress, image_id=report.image_id)
    built.record_push(current.sha256, repository(registry), hit.digest, registry.compression)
    report.seconds["push"] = time.monotonic() - clock
    report.registry = {**asdict(hit), "pushed": True}
    return report
