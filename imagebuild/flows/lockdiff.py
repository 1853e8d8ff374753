"""Two locks compared and judged by the recipe: what lock/diff.py says moved, plus what the move does
to the recipe's rules and patches, for `diff-lock` and `lock --upgrade-package`.

    judged_diff(old, new, ..., recipe)   LocksDiff whose platforms carry `findings` (appeared, cleared)
                                         and `patches_broken` (a patch whose package moved and that no
                                         longer applies to the new wheel, or whose package left the lock)
    diff_locks(old, new, recipe)         `diff-lock`: two lock files (or REV:PATH, read with git), the judging
                                         recipe found beside the new one unless named, then judged_diff

Both locks are judged by the same recipe (today's), so what appears or clears is what the lock move did,
not what an edit of the rules did. The rules over locked versions are pure (no network); where wheels
moved, the rules that read the wheels' own files (torch's CUDA, nvcc, companions, overlaps: the same
as `lock` runs) are run on both locks too, each wheel read by its URL (uv names it for the pins) and kept
by its sha256. A patch is checked only where its package's wheel moved, against that wheel (lock/patches.py
reads it once and keeps it by its sha256). With no recipe, nothing is judged, and the report says so
(`judged_by` is None).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tomllib
from pathlib import Path

from packaging.utils import canonicalize_name

from imagebuild.common import cache_dir
from imagebuild.errors import ImagebuildError, LockError
from imagebuild.flows.findings import artifact_findings
from imagebuild.knowledge import rules
from imagebuild.lock import Lock, PlatformLocks
from imagebuild.lock.diff import LocksDiff, diff_lock_files, per_platform
from imagebuild.lock.lockfile import parse_locks
from imagebuild.lock.patches import check_against_wheel, locked_wheel
from imagebuild.lock.resolve import unavailable_package, uv_binary
from imagebuild.recipe.model import Recipe, load_recipe


def judged_diff(old: Lock | PlatformLocks | dict[str, Lock], new: Lock | PlatformLocks | dict[str, Lock],
                old_name: str, new_name: str, recipe: Recipe | None) -> LocksDiff:
    report = diff_lock_files(old, new, old_name, new_name)
    if recipe is None:
        return report
    before, after = per_platform(old), per_platform(new)
    named = {spec.arch for spec in recipe.platforms}
    for diff in report.platforms:
        one = recipe.for_platform(diff.arch) if diff.arch in named else recipe
        diff.findings = findings_moved(one, before[diff.arch], after[diff.arch], files=bool(diff.wheel_changes))
        diff.patches_broken = patches_broken(one, before[diff.arch], after[diff.arch])
    report.judged_by = str(recipe.path)
    return report


def findings_moved(recipe: Recipe, old: Lock, new: Lock, *, files: bool = False) -> dict:
    """The rules' findings over each lock's versions (and, with files, over what its wheels' files say):
    those only the new lock has, and those it cleared."""
    unread: set[str] = set()

    def said(locked: Lock) -> dict[tuple[str, str], dict]:
        found = rules.check_resolved(recipe, locked.packages, locked.base.glibc)
        if files:
            located = with_urls(locked, recipe)
            unread.update(f"{w.name} {w.version}" for w in located.wheels if not w.url)  # never read, so said
            found += artifact_findings(recipe, located)[0]
        return {(f.rule, f.message): f.to_dict() for f in found}
    was, now = said(old), said(new)
    moved = {"appeared": [now[key] for key in now if key not in was],
             "cleared": [was[key] for key in was if key not in now]}
    return dict(moved, unread=sorted(unread)) if files else moved


def patches_broken(recipe: Recipe, old: Lock, new: Lock) -> list[dict]:
    """Each recipe patch whose package's wheel moved and that does not apply to the new wheel, with why."""
    was = {w.name: w for w in old.wheels}
    broken = []
    for patch in recipe.patches:
        name = canonicalize_name(patch.package)
        wheel = next((w for w in new.wheels if w.name == name), None)
        if wheel is None:  # the package left the lock: the patch has nothing to apply to, and a build fails on it
            before = was.get(name)
            broken.append({"patch": str(patch.path), "package": name, "old": before.version if before else None,
                           "new": None, "problems": [f"{name} is not in the new lock: the patch has nothing to "
                                                     "apply to (drop the patch, or keep the package)"]})
            continue
        if name in was and was[name].sha256 == wheel.sha256:
            continue
        problems = check_against_wheel(patch.path.read_text(), locked_wheel(new, name), patch.strip)
        if problems:
            before = was.get(name)
            broken.append({"patch": str(patch.path), "package": name,
                           "old": before.version if before else None, "new": wheel.version, "problems": problems})
    return broken


def with_urls(locked: Lock, recipe: Recipe) -> Lock:
    """The lock with each wheel's URL (a lock read from disk has none): the one its files were read from
    before (kept with them by sha256), else uv's answer for the pins alone (no dependencies) on the lock's
    target, taken for the wheel of the locked sha256 only. A pin no index has is left without one."""
    urls = {}
    for wheel in locked.wheels:
        try:
            urls[wheel.sha256] = wheel.url or str(json.loads((cache_dir() / "wheel-files" / f"{wheel.sha256}.json")
                                                              .read_text())["url"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    asked = {w.name: w.version for w in locked.wheels if not urls.get(w.sha256)}
    for _ in range(5):  # each round drops the one pin uv says no index has
        if not asked:
            break
        command = [uv_binary(), "pip", "compile", "-", "--no-deps", "--no-header", "--quiet", "--no-config",
                   "--python-version", locked.base.python, "--python-platform", locked.python_platform,
                   "--format", "pylock.toml"]
        for url in recipe.python.extra_index_urls:
            command += ["--extra-index-url", url]
        done = subprocess.run(command, input="".join(f"{n}=={v}\n" for n, v in asked.items()),
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            missing = unavailable_package(done.stderr)
            if missing not in asked:
                break
            del asked[missing]
            continue
        try:
            entries = tomllib.loads(done.stdout).get("packages", [])
        except tomllib.TOMLDecodeError:
            break  # uv's answer unread: the wheels stay without URLs, and are listed as unread
        for entry in entries if isinstance(entries, list) else []:
            for wheel in (entry.get("wheels") or []) if isinstance(entry, dict) else []:
                sha = (wheel.get("hashes") or {}).get("sha256") if isinstance(wheel, dict) else None
                if isinstance(sha, str) and wheel.get("url"):
                    urls.setdefault(sha, str(wheel["url"]))
        break
    return dataclasses.replace(locked, wheels=tuple(dataclasses.replace(w, url=urls.get(w.sha256, ""))
                                                   for w in locked.wheels))


def judging_recipe(explicit: Path | None, new_spec: str, stem: str) -> tuple[Recipe | None, str]:
    """The recipe that judges the two locks, and where it was looked for: --recipe, else recipes/NAME.toml
    beside the new lock's folder (for REV:PATH, that path in the current folder's tree)."""
    if explicit is not None:
        return load_recipe(explicit), str(explicit)
    spec = new_spec if Path(new_spec).is_file() else new_spec.partition(":")[2] or new_spec
    candidate = Path(spec).resolve().parent.parent / "recipes" / f"{stem}.toml"
    return (load_recipe(candidate) if candidate.is_file() else None), str(candidate)


def lock_text(spec: str) -> str:
    """A lock file's text: the file, else `git show REV:PATH` in the current folder."""
    path = Path(spec)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise LockError(f"{spec}: cannot be read ({err})") from None
    rev, sep, name = spec.partition(":")
    if not sep or not rev or not name:
        raise ImagebuildError(f"{spec}: no such lock file (a git revision of one is REV:PATH, e.g. HEAD~1:{spec})")
    try:
        proc = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ImagebuildError(f"{spec}: git could not be run ({err})") from None
    if proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ImagebuildError(f"{spec}: neither a lock file nor a git revision of one "
                              f"(git: {said[-1] if said else 'exit ' + str(proc.returncode)})")
    try:
        return proc.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise LockError(f"{spec}: not UTF-8 text, so not a lock") from None


def diff_locks(old_spec: str, new_spec: str, recipe_path: Path | None = None) -> tuple[LocksDiff, str]:
    """`diff-lock OLD NEW`: two locks (files, or REV:PATH) compared and judged by the recipe (recipe_path, else
    the one judging_recipe finds); with where the recipe was looked for, said when none was there."""
    old = parse_locks(lock_text(old_spec), old_spec)
    new = parse_locks(lock_text(new_spec), new_spec)
    recipe, looked = judging_recipe(recipe_path, new_spec, new.recipe)
    return judged_diff(old, new, old_spec, new_spec, recipe), looked
