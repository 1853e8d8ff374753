"""The rules over a recipe and its locked versions: the facts beside it -> Findings; errors stop the build.

CUDA toolkit, driver, GPU targets, torch, glibc and the pip CUDA toolchain. The facts live in
compat.toml, each with its source, read through facts.py's public lookups. Every rule is a small
pure function over them that returns Findings (finding.py); none raises on an odd version string.
`check_recipe` runs what is knowable before resolving; `check_resolved` runs on the locked versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from imagebuild.knowledge.facts import (DATA_FILE, load_facts, native_toolkit, parse_version, release_cuda, torch_cuda,
                                        without_cuda)
from imagebuild.knowledge.finding import Finding
from imagebuild.recipe.cuda import Arch, CudaVersion, parse_driver
from imagebuild.recipe.model import ImageBase, PythonSpec, Recipe


# --- rules ------------------------------------------------------------------------------------

def check_driver(toolkit: CudaVersion, min_driver: str) -> list[Finding]:
    """The oldest host driver against the toolkit: below the major's floor nothing runs."""
    facts = load_facts()
    evidence = f"[cuda].toolkit = {toolkit}, [cuda].min_driver = {min_driver}"
    try:
        driver = parse_driver(min_driver)
    except (ValueError, AttributeError):
        return [Finding("warning", "driver-unknown", f"{min_driver!r} is not a Linux driver version, "
                        "so the driver was not checked.", evidence,
                        'set [cuda].min_driver to the hosts\' driver, like "595.71.05"', DATA_FILE.name)]
    floor = facts.floors.get(toolkit.major)
    known = facts.drivers.get(toolkit)
    if floor is None:
        return [Finding("warning", "cuda-unknown", f"imagebuild has no driver facts for CUDA {toolkit}, "
                        "so the driver was not checked.", evidence,
                        f"pick a toolkit listed in {DATA_FILE.name}, or add CUDA {toolkit} there",
                        f"{DATA_FILE.name}: no entry for CUDA {toolkit.major}.x")]
    native = native_toolkit(driver)
    native_fix = f'set [cuda].toolkit = "{native}" (the newest CUDA driver {min_driver} runs natively), or ' \
        if native and native < toolkit else ""
    if driver[0] < floor.floor:
        need = known.ga if known and known.ga else f"{floor.floor}"
        return [Finding(
            "error", "driver-too-old",
            f"Driver {min_driver} cannot run CUDA {toolkit} at all: every CUDA {toolkit.major}.x "
            f"needs driver {floor.floor} or newer, even under minor-version compatibility.",
            f"{evidence}; CUDA {toolkit.major}.x floor {floor.floor}",
            f"{native_fix}update the hosts' driver to {need} or newer and raise [cuda].min_driver to it",
            floor.source)]
    if known is None or known.ga is None:
        return [Finding(
            "warning", "cuda-unknown",
            f"The minimum driver for CUDA {toolkit} is not known; driver {min_driver} meets the "
            f"{toolkit.major}.x floor ({floor.floor}), so prebuilt SASS runs but PTX JIT may not.",
            evidence, f"{native_fix}check NVIDIA's CUDA {toolkit} release notes and add it to {DATA_FILE.name}",
            known.source if known else floor.source)]
    if driver < parse_driver(known.ga):
        return [Finding(
            "warning", "driver-minor-compat",
            f"Driver {min_driver} is older than CUDA {toolkit}'s minimum {known.ga}: it runs only "
            "under minor-version compatibility, where prebuilt SASS runs but JIT-compiling PTX "
            "(and some new APIs) needs the newer driver.",
            f"{evidence}; CUDA {toolkit} needs {known.ga}, {toolkit.major}.x floor {floor.floor}",
            f"{native_fix}update the hosts' driver to {known.ga} or newer and raise [cuda].min_driver to it",
            known.source)]
    return []


def _as_arch(value) -> Arch | None:
    if isinstance(value, Arch):
        return value
    try:
        return Arch.parse(value)
    except (ValueError, AttributeError, TypeError):
        return None


def check_archs(toolkit: CudaVersion, archs: Iterable[Arch | str], where: str = "[cuda].archs") -> list[Finding]:
    """Each GPU target against the toolkit: too new to target, or dropped from it. `where` names the
    recipe key the targets come from ([platforms.arm64].cuda_archs for one platform's own)."""
    facts = load_facts()
    findings = []
    for given in archs:
        arch = _as_arch(given)
        fact = facts.archs.get(arch.sm) if arch else None
        evidence = f"[cuda].toolkit = {toolkit}, {where} has {given}"
        if fact is None:
            findings.append(Finding(
                "warning", "arch-unknown", f"imagebuild does not know GPU target {given}, so "
                f"whether CUDA {toolkit} can compile for it was not checked.",
                evidence, f"use a target like sm_120a or 12.0f, or add {given} to {DATA_FILE.name}",
                f"{DATA_FILE.name}: no entry for {given}"))
        elif fact.first_cuda > toolkit:
            fix = f'set [cuda].toolkit = "{fact.first_cuda}" or newer'
            arch_only = facts.archs.get(fact.target[:-1] + "a") if arch.suffix == "f" else None
            if arch_only and arch_only.first_cuda <= toolkit:
                fix += f", or target {arch_only.target} instead (it runs on that exact GPU only)"
            findings.append(Finding(
                "error", "arch-needs-newer-cuda",
                f"CUDA {toolkit} cannot compile for {fact.target}: that target first appeared in "
                f"CUDA {fact.first_cuda}.", evidence, fix, fact.source))
        elif fact.last_cuda and toolkit > fact.last_cuda:
            findings.append(Finding(
                "error", "arch-dropped",
                f"CUDA {toolkit} can no longer compile for {fact.target}: "
                f"{fact.note or f'the last CUDA for it is {fact.last_cuda}'}.",
                evidence, f'set [cuda].toolkit = "{fact.last_cuda}", or drop {fact.target} from '
                f"{where}", fact.source))
    return findings


def check_glibc(glibc: str, nvcc: CudaVersion) -> list[Finding]:
    """A new glibc's math headers against the nvcc (and crt headers) that will compile with them."""
    rule = load_facts().glibc_nvcc
    evidence = f"glibc {glibc}, nvcc {nvcc}"
    parsed = parse_version(glibc)
    if parsed is None:
        return [Finding("warning", "glibc-unknown", f"{glibc!r} is not a glibc version, so nvcc "
                        "was not checked against it.", evidence,
                        'give the base\'s glibc as major.minor, like "2.36"', rule.source)]
    if parsed < rule.glibc_from or nvcc >= rule.nvcc_from:
        return []
    older = [s for s in load_facts().suites.values() if Version(s.glibc) < rule.glibc_from]
    base = max(older, key=lambda s: Version(s.glibc), default=None)
    return [Finding(
        "error", "glibc-breaks-nvcc",
        f"glibc {glibc} declares rsqrt/sinpi/cospi noexcept, which breaks nvcc {nvcc}'s "
        f"crt/math_functions.h: CUDA code will not compile before CUDA {rule.nvcc_from}.",
        evidence,
        f'set [cuda].toolkit = "{rule.nvcc_from}" or newer'
        + (f', or use a base with glibc {base.glibc}: [base].debian = "{base.suite}"' if base else ""),
        rule.source)]


def check_torch(torch_version: str, toolkit: CudaVersion) -> list[Finding]:
    """A torch pin whose version says its CUDA (+cuXYZ, +cpu, +rocm... from PyTorch's own indexes)
    against the toolkit. A plain pin says nothing: lock reads its wheel (check_artifacts)."""
    parsed = parse_version(torch_version)
    if parsed is None or not parsed.local:
        return []
    evidence = f"torch {torch_version}, [cuda].toolkit = {toolkit}"
    source = f"torch's local version +{parsed.local} (PyTorch's own indexes)"
    wanted = f"torch=={parsed.public}+cu{toolkit.major}{toolkit.minor} (PyTorch's CUDA {toolkit} index)"
    if without_cuda(parsed.local):
        return [Finding("error", "torch-cuda-mismatch",
                        f"torch {torch_version} is a build without CUDA in a CUDA {toolkit} image.",
                        evidence, f"pin {wanted}", source)]
    cuda = torch_cuda(torch_version)
    if cuda is None or cuda == toolkit:
        return []
    return [Finding("error", "torch-cuda-mismatch",
                    f"torch {torch_version} is built for CUDA {cuda}, not the image's CUDA {toolkit}.",
                    evidence, f'set [cuda].toolkit = "{cuda}", or pin {wanted}', source)]


def check_toolchain(packages: Mapping[str, str], toolkit: CudaVersion) -> list[Finding]:
    """Locked CUDA toolchain distributions must all carry the toolkit's major.minor; torch too."""
    facts = load_facts()
    locked = {canonicalize_name(str(name)): str(version) for name, version in packages.items()}
    present = [(d, locked[d.name]) for d in facts.toolchain.values()
               if d.name in locked and d.major in (None, toolkit.major)]
    in_step = [f"{d.name} {v}" for d, v in present if release_cuda(v) == toolkit]
    findings = []
    for dist, version in present:
        cuda = release_cuda(version)
        evidence = f"{dist.name} {version} in the lock, [cuda].toolkit = {toolkit}" + (
            f"; in step: {', '.join(in_step)}" if in_step else "")
        if cuda is None:
            findings.append(Finding(
                "warning", "toolchain-version-unknown",
                f"{dist.name} {version} does not start with a CUDA major.minor, so it was not "
                "checked against the toolkit.", evidence,
                f'add "{dist.name}=={toolkit}.*" to [python].constraints, then relock', dist.source))
        elif cuda != toolkit:
            findings.append(Finding(
                "error", "toolchain-skew",
                f"{dist.name} {version} is from CUDA {cuda}, but the rest of the CUDA toolchain "
                f"must be CUDA {toolkit}: code it builds or JIT-compiles will not match.",
                evidence, f'add "{dist.name}=={toolkit}.*" to [python].constraints, then relock',
                dist.source))
    if "torch" in locked:
        findings += check_torch(locked["torch"], toolkit)
    return findings


# --- whole recipes ----------------------------------------------------------------------------

def _base_glibc(recipe: Recipe) -> str | None:
    """glibc of the recipe's base: an image base states it, a Debian suite comes from the facts."""
    if isinstance(recipe.base, ImageBase):
        return recipe.base.glibc
    suite = load_facts().suites.get(recipe.base.suite)
    return suite.glibc if suite else None  # an unknown suite is the recipe parser's error


def _torch_pins(python: PythonSpec) -> list[str]:
    """Versions pinned as `torch==X` in requirements or constraints, in order, once each."""
    pins = []
    for text in (*python.requirements, *python.constraints):
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != "torch":
            continue
        for spec in requirement.specifier:
            if spec.operator in ("==", "===") and "*" not in spec.version and spec.version not in pins:
                pins.append(spec.version)
    return pins


def check_recipe(recipe: Recipe, glibc: str | None = None) -> list[Finding]:
    """Everything knowable before resolving: driver, GPU targets, glibc vs nvcc, torch pins."""
    if recipe.cuda is None:
        return []
    toolkit = recipe.cuda.toolkit
    findings = [f.at("cuda.min_driver") for f in check_driver(toolkit, recipe.cuda.min_driver)]
    for key, archs in gpu_targets(recipe):
        findings += [f.at(key) for f in check_archs(toolkit, archs, f"[{key.rpartition('.')[0]}].{key.rpartition('.')[2]}")]
    glibc = glibc or _base_glibc(recipe)
    if glibc:  # the nvcc installed is the toolkit's
        findings += [f.at(_base_key(recipe)) for f in check_glibc(glibc, toolkit)]
    for pin in _torch_pins(recipe.python):
        findings += [f.at("python.requirements") for f in check_torch(pin, toolkit)]
    return findings + check_aot_quantization(recipe)


# The quantizations whose kernels the [aot] step reads and prebuilds (payload/probe/kernels/kernels_moe.py READ)
PREBUILT_QUANTIZATIONS = ("none", "nvfp4")


def check_aot_quantization(recipe: Recipe) -> list[Finding]:
    """A shape of a quantization whose kernels the [aot] step does not read yet: its build step would stop."""
    shapes = recipe.aot.shapes if recipe.aot else ()
    return [Finding("error", "aot-quantization-not-prebuilt",
                    f"[aot] shape {shape.name!r} declares quantization {shape.quantization!r}, whose kernels the "
                    "kernel step does not read yet: the build would stop there",
                    f"aot.shapes[{index}].quantization = {shape.quantization!r}",
                    "serve it without [aot] (its kernels compile on first use), or declare an nvfp4 shape",
                    "imagebuild (docs/zero-jit.md, Limits)").at(f"aot.shapes[{index}].quantization")
            for index, shape in enumerate(shapes) if shape.quantization not in PREBUILT_QUANTIZATIONS]


def gpu_targets(recipe: Recipe) -> list[tuple[str, tuple]]:
    """(recipe key, GPU targets) for each distinct target list: [cuda].archs, and each platform's
    own [platforms.<arch>].cuda_archs where it sets one."""
    if recipe.cuda is None:
        return []
    if not recipe.platforms or any(p.cuda_archs is None for p in recipe.platforms):
        targets = [("cuda.archs", recipe.cuda.archs)]
    else:
        targets = []
    return targets + [(f"platforms.{p.arch}.cuda_archs", p.cuda_archs) for p in recipe.platforms
                      if p.cuda_archs is not None]


def _base_key(recipe: Recipe) -> str:
    return "base.glibc" if isinstance(recipe.base, ImageBase) else "base.debian"


def check_resolved(recipe: Recipe, packages: Mapping[str, str], glibc: str | None = None) -> list[Finding]:
    """On the lock: toolchain skew, torch, and glibc against the nvcc that was actually resolved."""
    if recipe.cuda is None:
        return []
    findings = [f.at("python.constraints") for f in check_toolchain(packages, recipe.cuda.toolkit)]
    glibc = glibc or _base_glibc(recipe)
    locked = {canonicalize_name(str(name)): str(version) for name, version in packages.items()}
    carriers = [release_cuda(locked[n]) for n in load_facts().glibc_nvcc.carried_by if n in locked]
    nvcc = min((c for c in carriers if c), default=None)
    if glibc and nvcc:
        findings += [f.at(_base_key(recipe)) for f in check_glibc(glibc, nvcc)]
    return findings
