"""Two locks compared and judged by the recipe: what lock/diff.py says moved, plus what the move does
to the recipe's rules and patches, for `diff-lock` and `lock --upgrade-package`.

    judged_diff(old, new, ..., recipe)   LocksDiff whose platforms carry `findings` (appeared, cleared)
                                         and `patches_broken` (a patch whose package moved and that no
                                         longer applies to the new wheel)

Both locks are judged by the same recipe (today's), so what appears or clears is what the lock move did,
not what an edit of the rules did. The rules over locked versions are pure (no network); a patch is
checked only where its package's wheel moved, against that wheel (lock/patches.py reads it once and keeps
it by its sha256). With no recipe, nothing is judged, and the report says so (`judged_by` is None).
"""

from __future__ import annotations

from packaging.utils import canonicalize_name

from imagebuild.knowledge import rules
from imagebuild.lock import Lock, PlatformLocks
from imagebuild.lock.diff import LocksDiff, diff_lock_files, per_platform
from imagebuild.lock.patches import check_against_wheel, locked_wheel
from imagebuild.recipe.model import Recipe


def judged_diff(old: Lock | PlatformLocks | dict[str, Lock], new: Lock | PlatformLocks | dict[str, Lock],
                old_name: str, new_name: str, recipe: Recipe | None) -> LocksDiff:
    report = diff_lock_files(old, new, old_name, new_name)
    if recipe is None:
        return report
    before, after = per_platform(old), per_platform(new)
    named = {spec.arch for spec in recipe.platforms}
    for diff in report.platforms:
        one = recipe.for_platform(diff.arch) if diff.arch in named else recipe
        diff.findings = findings_moved(one, before[diff.arch], after[diff.arch])
        diff.patches_broken = patches_broken(one, before[diff.arch], after[diff.arch])
    report.judged_by = str(recipe.path)
    return report


def findings_moved(recipe: Recipe, old: Lock, new: Lock) -> dict:
    """The rules' findings over each lock's versions: those only the new lock has, and those it cleared."""
    def said(locked: Lock) -> dict[tuple[str, str], dict]:
        return {(f.rule, f.message): f.to_dict()
                for f in rules.check_resolved(recipe, locked.packages, locked.base.glibc)}
    was, now = said(old), said(new)
    return {"appeared": [now[key] for key in now if key not in was],
            "cleared": [was[key] for key in was if key not in now]}


def patches_broken(recipe: Recipe, old: Lock, new: Lock) -> list[dict]:
    """Each recipe patch whose package's wheel moved and that does not apply to the new wheel, with why."""
    was = {w.name: w for w in old.wheels}
    broken = []
    for patch in recipe.patches:
        name = canonicalize_name(patch.package)
        wheel = next((w for w in new.wheels if w.name == name), None)
        if wheel is None or (name in was and was[name].sha256 == wheel.sha256):
            continue
        problems = check_against_wheel(patch.path.read_text(), locked_wheel(new, name), patch.strip)
        if problems:
            before = was.get(name)
            broken.append({"patch": str(patch.path), "package": name,
                           "old": before.version if before else None, "new": wheel.version, "problems": problems})
    return broken
