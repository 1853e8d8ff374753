"""The rules over a lock: whether it is fresh, its patches against the locked wheels, the base's updates
waiting, and what the locked wheels say of themselves -> Findings.

The flows gather the facts (lock.stale_reasons, lock/patches.py's checks, bootstrap.pending_updates,
lock/artifacts.py's reading of the wheels); these functions judge them, pure over plain values, so this
module imports nothing of lock/ (which imports knowledge).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from imagebuild.knowledge.finding import Finding
from imagebuild.recipe.cuda import CudaVersion
from imagebuild.recipe.model import Recipe


# --- the lock itself ---------------------------------------------------------------------------

def check_freshness(recipe: Recipe, path: Path, reasons: list[str], sha256: str, where: str = "") -> list[Finding]:
    """A lock stale for its recipe (lock.stale_reasons gave why) or fresh; `where` names its platform."""
    if reasons:
        return [Finding("warning", "lock-stale", f"{where}{path} is stale", "; ".join(reasons),
                        f"`imagebuild lock {recipe.path}` refreshes it", "imagebuild")]
    return [Finding("note", "lock-fresh", f"{where}{path} is fresh for {recipe.path.name}",
                    f"lock sha256 {sha256}", "nothing to do", "imagebuild")]


def check_patches(recipe: Recipe, results: Iterable) -> list[Finding]:
    """An error for each recipe patch that does not apply to the wheel the lock installs (the results of
    lock/patches.py's check_locked_patches), naming the file and hunk (the same words as `imagebuild patches`)."""
    findings = []
    keys = {str(patch.path): f"patches[{index}].file" for index, patch in enumerate(recipe.patches)}
    for result in results:
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


def check_base_updates(recipe: Recipe, waiting: list[dict], where: str = "") -> list[Finding]:
    """One warning per suite that carries newer versions of locked packages (security fixes waiting);
    `waiting` is bootstrap.pending_updates' answer."""
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


def base_updates_unknown(why: str, where: str = "") -> list[Finding]:
    """The base's suites could not be read, so whether updates wait is not known."""
    return [Finding("warning", "base-updates-unknown", f"{where}could not read the base's suites to "
                    "look for updates", why, "check again when the mirror answers", "imagebuild", key="base")]


# --- facts read from the locked wheels (lock/artifacts.py) ------------------------------------

ARTIFACT_SOURCE = "the locked wheels' own METADATA and RECORD, read at lock time"
TOOLCHAIN_FIX = ('the CUDA 13 pip toolchain: requirements "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.*" '
                 'with [cuda] toolkit = "13.0" (and torch built for cu130), or a CUDA devel base image '
                 'pinned by digest ([base] image = "...@sha256:...") that has nvcc and the headers')
SHOWN = 5  # paths named per overlap


def check_artifacts(toolkit: CudaVersion | None, packages: Mapping[str, str], *,
                    torch_cuda: tuple[CudaVersion, str] | None = None, nvcc: Mapping[str, bool] | None = None,
                    torch_requirements: Mapping[str, list] | None = None, overlaps: Iterable = (),
                    cuda12: Mapping[str, str] | None = None) -> list[Finding]:
    """Rules over what the locked wheels say of themselves: torch's CUDA, whether the pip toolchain
    has an nvcc, CUDA 12 builds in a CUDA 13 image, companions built for another torch, and paths
    two distributions both install."""
    findings: list[Finding] = []
    locked = {canonicalize_name(str(name)): str(version) for name, version in packages.items()}
    if toolkit is not None and torch_cuda is not None and torch_cuda[0] != toolkit:
        cuda, requirement = torch_cuda
        findings.append(Finding(
            "error", "torch-cuda-mismatch",
            f"torch {locked.get('torch', '?')} is built for CUDA {cuda}, not the image's CUDA {toolkit}.",
            f"the locked torch wheel requires {requirement}", f'set [cuda].toolkit = "{cuda}", or pin a torch '
            f"built for CUDA {toolkit} (a +cu{toolkit.major}{toolkit.minor} build from PyTorch's index)",
            ARTIFACT_SOURCE, key="python.requirements"))
    carriers = nvcc or {}
    if toolkit is not None and carriers and not any(carriers.values()):
        names = ", ".join(f"{name} {locked.get(name, '?')}" for name in sorted(carriers))
        findings.append(Finding(
            "error", "toolchain-without-nvcc",
            f"{names} ships no nvcc binary (ptxas only): deep_gemm's and FlashInfer's JIT find no CUDA home "
            "in the image and fail at their first kernel.", f"no bin/nvcc in the RECORD of {names}",
            TOOLCHAIN_FIX, ARTIFACT_SOURCE, key="python.requirements"))
    if toolkit is not None and toolkit.major >= 13:
        for name, evidence in sorted((cuda12 or {}).items()):
            findings.append(Finding(
                "warning", "cuda12-build",
                f"{name} {locked.get(name, '?')} is a CUDA 12 build in a CUDA {toolkit} image: it loads CUDA 12 "
                "libraries the image does not have.", f"{name} {locked.get(name, '?')}: {evidence}",
                f'leave it out with [python].exclude = ["{name}"], or constrain what pulls it in to its CUDA 13 '
                "build", ARTIFACT_SOURCE, key="python.exclude"))
    torch = locked.get("torch")
    for name, requirements in sorted((torch_requirements or {}).items()):
        wanted = [r for r in requirements if torch and not r.specifier.contains(torch, prereleases=True)]
        if torch and wanted:
            findings.append(Finding(
                "error", "torch-companion-mismatch",
                f"{name} {locked.get(name, '?')} is built for {wanted[0]}, but the lock holds torch {torch}.",
                f"{name}'s METADATA: Requires-Dist: {wanted[0]}",
                f"pin the {name} release built for torch {torch} (its Requires-Dist names it), or that torch",
                ARTIFACT_SOURCE, key="python.requirements"))
    findings += check_overlaps(overlaps)
    return findings


def check_overlaps(overlaps: Iterable) -> list[Finding]:
    """One finding per set of distributions sharing paths: an error where their copies differ (the
    later install silently wins), a note where they are the same bytes."""
    groups: dict[tuple[tuple[str, ...], bool], list[str]] = {}
    findings = []
    for overlap in overlaps:
        if overlap.deleted_by:
            keepers = " and ".join(overlap.owners)
            findings.append(Finding(
                "error", "prune-deletes-shared-file",
                f"[[prune]] of {overlap.deleted_by} deletes {overlap.path}, which {keepers} installs too: the "
                f"file is gone for both, and {keepers}'s RECORD names a file the image does not hold.",
                f"{overlap.path}: installed by {keepers}, then by {overlap.deleted_by}, whose prune removes it",
                f"prune it from {overlap.owners[0]} instead (installed first), so {overlap.deleted_by}'s copy stays",
                ARTIFACT_SOURCE, key="prune"))
            continue
        groups.setdefault((tuple(overlap.owners), overlap.same), []).append(overlap.path)
    for (owners, same), paths in sorted(groups.items()):
        shown = ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")
        who = " and ".join(owners)
        if same:
            findings.append(Finding(
                "note", "file-overlap-identical", f"{who} install {len(paths)} identical path(s)", shown,
                "nothing to do: the copies are the same bytes", ARTIFACT_SOURCE))
        else:
            findings.append(Finding(
                "error", "file-overlap",
                f"{who} install {len(paths)} path(s) with different contents: the one installed last "
                "silently replaces the other's files.", shown,
                f"keep one of them: a constraint that stops one being resolved, or [python].exclude = "
                f'["{owners[-1]}"] (e.g. opencv-python beside opencv-python-headless: keep the headless one); '
                f"or, where both must stay, a [[prune]] entry that removes the path from one of them",
                ARTIFACT_SOURCE, key="python.exclude"))
    return findings


def check_unread(unread: Mapping[str, str]) -> list[Finding]:
    """A warning for each locked wheel whose file list could not be read (name -> why)."""
    return [Finding("warning", "wheel-unread", f"the file list of {name} could not be read, "
                    "so it was not checked for overlaps or CUDA builds", why,
                    "relock when the index answers", ARTIFACT_SOURCE) for name, why in sorted(unread.items())]
