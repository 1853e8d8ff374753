"""The check flow: the rules knowable before resolving, and with a lock beside the recipe, for each
platform whether its lock is fresh, its patches against the locked wheels, and the base's updates."""

from __future__ import annotations

from pathlib import Path

from imagebuild.knowledge import Finding, rules
from imagebuild.common import Progress, quiet
from imagebuild.flows.findings import base_glibc, located, lock_findings
from imagebuild.flows.reports import CheckReport
from imagebuild.lock import Lock, default_lock_path, read_locks
from imagebuild.recipe.model import load_recipe


def check(recipe_path: str | Path, *, lock_path: Path | None = None, progress: Progress = quiet) -> CheckReport:
    recipe = load_recipe(recipe_path)
    findings = rules.check_recipe(recipe, base_glibc(recipe)) + model_config_notes(recipe)
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


def model_config_notes(recipe) -> list[Finding]:
    """One note per [[aot.shapes]] model_config: the values read from the model's config.json, each with its key."""
    notes = []
    for read in recipe.aot.model_configs if recipe.aot else ():
        said = ", ".join(f"{field} {read.dims.values[field]} ({source})" if field in read.dims.values
                         else f"{field}: {source}" for field, source in read.dims.sources.items())
        notes.append(Finding("note", "aot-model-config", f"shape {read.shape!r} read from {read.path}: {said}",
                             f"{read.file} (sha256 {read.dims.sha256})", "", "the model's config.json"))
    return notes
