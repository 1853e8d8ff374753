"""Stage: the flows, the library API the CLI is a thin layer over. Each walks the recipe's platforms
(flows/platforms.py: one single-platform recipe per platform, a recipe without [platforms.*] the N=1
case) and returns a report with `to_dict()` for `--json` (reports.py).

    check(recipe)              findings.py + check.py: the rules, and each platform's lock fresh or stale
    lock(recipe)               lock.py: each platform resolved, one lock file; `--upgrade-package`
    render(recipe, out)        context.py: one platform's build context
    build(recipe, engine, BuildOptions(...))
                               build.py: each platform's image, built (or reused by lock), smoke-tested, tagged;
                               by_lock.py and build_cache.py: reuse and push through a registry (what
                               to ask; registry/ says how);
                               kernels/: the [aot] kernel step and a fresh runner's seed;
                               built.py: what this machine built and pushed for each lock
    smoke(image, engine)       smoke.py: the image's own probe, offline, in a throwaway container
    diagnose(...)              doctor.py: the same probe and the knowledge rules on a host, a venv or an image
    patches(recipe)            patches.py: each recipe patch against the locked, a named or the newest release
    export_oci, verify_image, diff_images, image_sbom
                               repro.py: an image as an OCI layout, against its lock, against another, its SBOM
    kept(limit, engine)        caches.py: what imagebuild keeps, trimmed to a size
    publish(source, ref, ...)  publish.py: push a layout or an engine image, and an image built here from a
                               lock and smoke-tested under its lock tag too

May import every stage below it (base, bootstrap, engine, knowledge, lock, payload, recipe, render,
registry, image); only cli/ imports it.
"""

from imagebuild.flows.build import DEFAULT_CA_BUNDLE, build, ca_bundle, seed_kernels
from imagebuild.flows.check import check
from imagebuild.flows.context import render
from imagebuild.flows.findings import across_platforms, base_glibc, located, merged, stop_on_errors
from imagebuild.flows.lock import existing_locks, fresh_locks, lock, resolved, upgrade_packages
from imagebuild.flows.options import BuildOptions
from imagebuild.flows.platforms import each_platform, engine_for, platform_ref
from imagebuild.flows.reports import BuildReport, CheckReport, LockReport, PlatformsBuildReport, SmokeReport
from imagebuild.flows.smoke import PROBE_COMMAND, SMOKE_TIMEOUT_S, lock_built, smoke, smoke_cache_path, smoke_passed

__all__ = ["BuildOptions", "BuildReport", "CheckReport", "DEFAULT_CA_BUNDLE", "LockReport", "PROBE_COMMAND",
           "PlatformsBuildReport", "SMOKE_TIMEOUT_S", "SmokeReport", "across_platforms", "base_glibc", "build",
           "ca_bundle", "check", "each_platform", "engine_for", "existing_locks", "fresh_locks", "located", "lock",
           "lock_built", "merged", "platform_ref", "render", "resolved", "seed_kernels", "smoke",
           "smoke_cache_path", "smoke_passed", "stop_on_errors", "upgrade_packages"]
