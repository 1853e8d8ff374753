"""The findings every flow gathers before it does anything: the facts the rules need (a lock's stale reasons,
its patches checked, the base's updates, what its wheels declare) gathered and handed to knowledge's rules
(knowledge/rules/), and how several platforms' findings are said once.

    stop_on_errors(findings, recipe)  an error stops the flow (FindingsFailed), each finding located
    located(recipe, findings)         each finding about a recipe key gets that key's file and line
    merged(before, after)             one problem two rules saw, said once
    across_platforms({arch: [...]})   every platform's findings once, those of only some named by platform
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from imagebuild.knowledge import has_errors, rules
from imagebuild.knowledge.facts import debian_suite
from imagebuild.base.identity import BaseIdentity
from imagebuild.bootstrap import pending_updates
from imagebuild.common import Progress, cache_dir, host_arch, platform_name, quiet
from imagebuild.errors import FindingsFailed, ImagebuildError, RecipeError
from imagebuild.lock import Lock, stale_reasons
from imagebuild.recipe.model import DebianBase, Recipe
from imagebuild.render.templates import template_sha256


def base_glibc(recipe: Recipe) -> str:
    """The base's glibc without bootstrapping it: from the suite's facts or the recipe."""
    if isinstance(recipe.base, DebianBase):
        return debian_suite(recipe.base.suite).glibc
    return recipe.base.glibc


def recipe_findings(recipe: Recipe) -> list:
    """The rules knowable before resolving; errors stop the flow here."""
    findings = rules.check_recipe(recipe, base_glibc(recipe))
    stop_on_errors(findings, recipe)
    return findings


def lock_findings(recipe: Recipe, locked: Lock, path: Path, progress: Progress = quiet) -> list:
    """What `check` says of a lock: fresh or stale (and why), its patches, and security fixes waiting."""
    where = f"{platform_name(locked.base.arch)}: " if recipe.platforms or locked.base.arch != host_arch() else ""
    reasons = stale_reasons(locked, recipe, template_sha256=template_sha256())
    findings = rules.check_freshness(recipe, path, reasons, locked.sha256, where)
    if recipe.patches:
        findings += patch_findings(recipe, locked)
    if isinstance(recipe.base, DebianBase) and locked.base.kind == "debian":
        findings += base_update_findings(recipe, locked.base, where, progress)
    return findings


def base_update_findings(recipe: Recipe, locked: BaseIdentity, where: str = "", progress: Progress = quiet) -> list:
    """The base's suites read for newer versions of locked packages (rules.check_base_updates judges them)."""
    try:
        waiting = pending_updates(locked, recipe.base, progress)
    except ImagebuildError as err:
        return rules.base_updates_unknown(str(err), where)
    return rules.check_base_updates(recipe, waiting, where)


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
    return findings + rules.check_unread(artifacts.unread), artifacts.layout()


def patch_findings(recipe: Recipe, locked: Lock) -> list:
    """Each recipe patch checked against the wheel the lock installs (rules.check_patches judges them)."""
    from imagebuild.lock.patches import check_locked_patches
    return rules.check_patches(recipe, check_locked_patches(recipe, locked))


def locked_findings(recipe: Recipe, locked: Lock, *, patches: bool) -> list:
    """The rules over one platform's fresh lock (and its patches against the locked wheels, unless a
    relock has just checked them)."""
    findings = rules.check_resolved(recipe, locked.packages, locked.base.glibc)
    return findings + patch_findings(recipe, locked) if patches and recipe.patches else findings


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


def across_platforms(found: dict[str, list]) -> list:
    """Findings of every platform, once: one that every platform has is said plainly, one that only
    some have names them. One platform's findings are said as they are."""
    if len(found) == 1:
        return next(iter(found.values()))
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
                out.append(replace(finding, message=f"{platform_name(arch)}: {finding.message}"))
    return out


def stop_on_errors(findings: list, recipe: Recipe | None = None) -> None:
    if has_errors(findings):
        raise FindingsFailed(located(recipe, findings) if recipe is not None else findings)
