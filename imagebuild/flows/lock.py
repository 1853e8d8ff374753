"""The lock flow: each platform of a recipe resolved into its Lock (one file: a Lock, or a
PlatformLocks of several), and the locks a build takes, refreshed or refused.

    lock(recipe)               resolve every platform and write the lock file unless it says exactly this
    fresh_locks(recipe, ...)   each platform's lock for a build, relocked first when asked or missing
    upgrade_packages(...)      `lock --upgrade-package`: pins moved in the recipe in place, relocked, diffed
                               and judged by the moved recipe (flows/lockdiff.py)
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from packaging.utils import canonicalize_name

from imagebuild.knowledge import rules
from imagebuild.bootstrap import base_moves, identify
from imagebuild.common import Progress, platform_name, quiet, write_atomic
from imagebuild.errors import LockError
from imagebuild.flows.findings import (across_platforms, artifact_findings, located, merged, patch_findings,
                                       recipe_findings, stop_on_errors)
from imagebuild.flows.lockdiff import judged_diff
from imagebuild.flows.platforms import each_platform
from imagebuild.flows.reports import LockReport
from imagebuild.lock import (Lock, PlatformLocks, default_lock_path, ensure_fresh, read_lock, read_locks, resolve_lock,
                             stale_reasons, write_locks)
from imagebuild.lock.lockfile import recipe_sha256
from imagebuild.recipe.model import Recipe, load_recipe, parse_recipe
from imagebuild.recipe.pins import set_pin
from imagebuild.recipe.reader import read_source
from imagebuild.render.templates import template_sha256


def lock(recipe_path: str | Path, *, lock_path: Path | None = None, upgrade_base: bool = False,
         upgrade: bool = False, progress: Progress = quiet) -> LockReport:
    """Resolve every platform of the recipe into its lock. A base already locked for what the recipe asks
    of it is kept as it is; `upgrade_base` moves it to its suites' current state (and keeps the Python pins
    of a fresh lock), and the report says what moved. The old lock's Python versions are kept wherever
    the recipe still allows them (as uv and pip-compile keep an output file's pins), unless `upgrade`;
    the report lists each package whose version moved. A package with no wheel for a platform stops the
    lock, naming the package and the platform."""
    started = time.monotonic()
    recipe = load_recipe(recipe_path)
    findings = recipe_findings(recipe)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    old = existing_locks(path)
    locks, found, moves, package_moves = {}, {}, [], []
    for arch, one in each_platform(recipe).items():
        if recipe.platforms:
            progress(f"{platform_name(arch)}: locking")
        locks[arch], found[arch] = resolved(one, progress, old=old.get(arch), upgrade_base=upgrade_base,
                                            upgrade=upgrade)
        if arch in old and old[arch].base.kind == "debian":
            moves += [{**move, "arch": arch} if recipe.platforms else move
                      for move in base_moves(old[arch].base, locks[arch].base)]
        if arch in old:
            package_moves += [{**move, "arch": arch} if recipe.platforms else move
                              for move in version_moves(old[arch].packages, locks[arch].packages)]
    findings = merged(findings, across_platforms(found))
    stop_on_errors(findings, recipe)
    new = PlatformLocks(recipe=recipe.stem, recipe_sha256=recipe_sha256(recipe), locks=locks) \
        if recipe.platforms else next(iter(locks.values()))
    changed = store_lock(new, path)
    report = LockReport(str(recipe.path), str(path), changed, sum(len(one.wheels) for one in locks.values()),
                        time.monotonic() - started, located(recipe, findings), new.sha256, base_moves=moves,
                        package_moves=package_moves)
    if recipe.platforms:
        report.platforms = {platform_name(arch): {"packages": len(one.wheels), "lock_sha256": one.sha256,
                                                  "python_platform": one.python_platform}
                            for arch, one in sorted(locks.items())}
    return report


def existing_locks(path: Path) -> dict[str, Lock]:
    """The lock file's locks by platform, to keep what they pinned; {} when there is none to read
    (missing, or of another format: the relock starts afresh)."""
    try:
        locks = read_locks(path)
    except LockError:
        return {}
    return {locks.base.arch: locks} if isinstance(locks, Lock) else dict(locks.locks)


def version_moves(old: dict[str, str], new: dict[str, str]) -> list[dict]:
    """Each package whose locked version moved, came or went: name, old, new (None where absent)."""
    return [{"name": name, "old": old.get(name), "new": new.get(name)}
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def resolved(recipe: Recipe, progress: Progress = quiet, *, old: Lock | None = None,
             upgrade_base: bool = False, upgrade: bool = False,
             upgrade_names: tuple[str, ...] = ()) -> tuple[Lock, list]:
    """One platform's recipe resolved into a Lock, with what the resolve and the locked wheels say
    against the rules (not yet judged). The old lock's base is kept unless the recipe asks another or
    `upgrade_base`; moving only the base of a fresh lock keeps its wheels as they are. The old lock's
    versions are preferred unless `upgrade` (all) or `upgrade_names` (those)."""
    base = identify(recipe.base, old.base if old is not None else None, upgrade=upgrade_base, progress=progress)
    if (upgrade_base and old is not None and not stale_reasons(old, recipe, template_sha256=template_sha256())
            and (base.python, base.glibc) == (old.base.python, old.base.glibc)):
        progress(f"keeping the {len(old.wheels)} locked wheels: only the base moves")
        return replace(old, base=base), []
    prefer = dict(old.packages) if old is not None and not upgrade else None
    progress(f"resolving {len(recipe.python.requirements)} requirements for Python {base.python} "
             f"on {base.uv_platform}" + (f", keeping the {len(prefer)} locked versions where they still fit"
                                         if prefer else ""))
    new = resolve_lock(recipe, base, template_sha256=template_sha256(), prefer=prefer, upgrade=upgrade_names)
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


def fresh_locks(recipe: Recipe, path: Path, relock: bool, progress: Progress = quiet) -> dict[str, Lock]:
    """Each platform's lock (by arch), relocked first when asked or missing; a stale one is refused,
    and so is a lock file for other platforms than the recipe's."""
    if relock or not path.exists():
        lock(recipe.path, lock_path=path, progress=progress)
    if not recipe.platforms:
        current = read_lock(path)
        ensure_fresh(current, recipe, path, template_sha256=template_sha256())
        return {current.base.arch: current}
    locks = read_locks(path)
    named = [spec.arch for spec in recipe.platforms]
    if isinstance(locks, Lock) or sorted(locks.locks) != sorted(named):
        held = locks.base.arch if isinstance(locks, Lock) else ", ".join(sorted(locks.locks))
        raise LockError(f"{path} holds a lock for {held}, the recipe names {', '.join(named)}: "
                        f"refresh it with `imagebuild lock {recipe.path}` or build with --relock")
    for arch, one in each_platform(recipe).items():
        ensure_fresh(locks.locks[arch], one, path, template_sha256=template_sha256())
    return dict(locks.locks)


def upgrade_packages(recipe_path: str | Path, upgrades: list[tuple[str, str | None]], *,
                     lock_path: Path | None = None, progress: Progress = quiet):
    """`lock --upgrade-package`: each (name, version) pin moved in the recipe in place (version None: the
    newest that resolves with the rest of the recipe, as uv picks it), then the recipe relocked. Returns
    (LockReport, the lock diff, the pins moved: name, old, new). The recipe is written atomically, and
    written back as it was when the relock fails, so a pin that does not resolve leaves nothing changed."""
    recipe = load_recipe(recipe_path)
    before = read_source(recipe.path)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    old = existing_locks(path)
    text, moved = before, []
    for name, version in upgrades:
        name = canonicalize_name(name)
        was = next((locked.packages[name] for locked in old.values() if name in locked.packages), None)
        if version is None:
            loose = parse_recipe(set_pin(text, recipe.path, name, None), recipe.path)
            arch, one = next(iter(each_platform(loose).items()))
            progress(f"{name}: finding the newest release that resolves with the rest of {recipe.path.name}")
            found, _ = resolved(one, progress, old=old.get(arch), upgrade_names=(name,))
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
    diff = judged_diff(old, existing_locks(path), f"{path} (before)", str(path), load_recipe(recipe.path)) \
        if old else None
    return report, diff, moved
