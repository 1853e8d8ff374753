"""An inventory turned into what the recipe says, each value with where it came from. Pure: no I/O.

    plan_recipe(inventory, options, now) -> Plan
    without(plan, name, why, fix)          -> the plan with one more distribution left out

The requirements are what no other installed distribution requires (Requires-Dist, evaluated with the
environment's own markers), pinned `==` as installed; everything else installed is a constraint, so
the resolve installs exactly the same versions. A distribution that no index can give again (an
editable, path, VCS or URL install; no RECORD) is left out and excluded from the resolve, and what it
required is then required directly: LeftOut says why and what to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagebuild.adopt.inventory import AdoptError, Installed, Inventory
from imagebuild.adopt.requires import dependents, needs_of, reach, required, top_level
from imagebuild.common import MACHINES, host_arch
from imagebuild.knowledge.facts import load_facts
from imagebuild.recipe.cuda import Arch, CudaVersion, parse_driver

# What `python -m venv` (ensurepip) puts into every environment: left out when nothing requires them,
# since the image's venv has no installer inside.
SEED_TOOLS = ("pip", "setuptools", "wheel")
NAMED = 3  # dependents named in a constraint's comment


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    extras: tuple[str, ...] = ()
    why: str = ""  # the comment beside it

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}=={self.version}"


@dataclass(frozen=True)
class LeftOut:
    name: str
    version: str
    why: str
    fix: str
    excluded: bool = True  # named in [python].exclude, so the resolve takes no other copy of it

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "why": self.why, "fix": self.fix,
                "excluded": self.excluded}


@dataclass(frozen=True)
class CudaPlan:
    toolkit: str
    toolkit_from: str
    archs: tuple[str, ...]
    archs_from: str
    min_driver: str
    min_driver_from: str

    def to_dict(self) -> dict:
        return {"toolkit": self.toolkit, "toolkit_from": self.toolkit_from, "archs": list(self.archs),
                "archs_from": self.archs_from, "min_driver": self.min_driver, "min_driver_from": self.min_driver_from}


@dataclass(frozen=True)
class AdoptOptions:
    archs: tuple[str, ...] = ()  # --arch: the GPU targets, instead of the GPUs nvidia-smi names
    min_driver: str | None = None  # --min-driver, instead of this host's driver
    without_torch: bool = False  # --without-torch: an environment with no torch is meant
    exclude: tuple[str, ...] = ()  # --exclude: distributions left out on purpose
    extra_index_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    suite: str
    python: str
    glibc: str
    arch: str  # Debian's name
    machine: str  # uname -m's
    packages: tuple[tuple[str, str], ...]  # Debian package, why
    requirements: tuple[Pin, ...]
    constraints: tuple[Pin, ...]
    left_out: tuple[LeftOut, ...]
    cuda: CudaPlan | None
    exclude_newer: str
    extra_index_urls: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    inventory: Inventory | None = field(default=None, compare=False, repr=False)

    @property
    def exclude(self) -> tuple[str, ...]:
        return tuple(sorted({entry.name for entry in self.left_out if entry.excluded}))

    @property
    def pins(self) -> dict[str, str]:
        return {pin.name: pin.version for pin in self.requirements + self.constraints}


# ---- the recipe's values -------------------------------------------------------------------------

def _origin_left_out(dist: Installed) -> LeftOut:
    origin = dist.origin
    publish = ("build a wheel of it, publish it to an index the recipe names ([python].extra_index_urls) "
               f"and pin it in [python].requirements (\"{dist.name}=={dist.version}\")")
    why = {"editable": f"installed editable from {origin.url or 'a local folder'} (direct_url.json)",
           "vcs": f"installed from {origin.url or 'a VCS URL'} ({origin.detail}) (direct_url.json)",
           "path": f"installed from a local path, {origin.url or 'a folder or archive'} (direct_url.json)",
           "url": f"installed from {origin.url} (direct_url.json), not from an index",
           "unrecorded": "installed without a RECORD (by the system's package manager, conda, or by hand), "
                         "so neither its origin nor its files can be checked",
           }.get(origin.kind, origin.detail or "its origin cannot be read")
    return LeftOut(dist.name, dist.version, why, publish)


def _toolchain_cuda(inventory: Inventory) -> tuple[CudaVersion, str] | None:
    carriers = [(n, v) for n, v, nvcc in inventory.toolchain if nvcc] or \
        [(n, v) for n, v, _ in inventory.toolchain if n == "cuda-toolkit"]
    for name, version in carriers:
        try:
            return CudaVersion.parse(version), f"{name} {version}"
        except ValueError:
            continue
    return None


def _archs(inventory: Inventory, options: AdoptOptions) -> tuple[tuple[str, ...], str]:
    if options.archs:
        try:
            archs = [Arch.parse(a) for a in options.archs]
        except ValueError as err:
            raise AdoptError(f"--arch: {err}") from None
        return tuple(dict.fromkeys(a.sm for a in archs)), "--arch"
    known = load_facts().archs
    found, sources = [], []
    for index, gpu in enumerate(inventory.gpus):
        try:
            arch = Arch.parse(gpu.compute_cap or "")
        except ValueError:
            continue
        specific = f"{arch.sm}a"  # the GPU's own arch-specific features, where CUDA has them
        found.append(specific if specific in known else arch.sm)
        sources.append(f"GPU {index} {gpu.name} (compute capability {gpu.compute_cap}, {inventory.driver_source})")
    if not found:
        seen = f"the GPUs ({', '.join(g.name for g in inventory.gpus)}) gave no compute capability" if inventory.gpus \
            else "no GPU answered nvidia-smi"
        raise AdoptError(f"{inventory.where}: {seen}, and no --arch was given: [cuda] archs must name the GPUs "
                         "the image will run on. Pass them, e.g. --arch sm_120a (RTX PRO 6000 Blackwell) "
                         "--arch sm_90a (H100, H200); --arch is repeatable")
    return tuple(dict.fromkeys(found)), "; ".join(sources)


def _min_driver(inventory: Inventory, options: AdoptOptions, toolkit: CudaVersion) -> tuple[str, str]:
    if options.min_driver:
        try:
            parse_driver(options.min_driver)
        except ValueError as err:
            raise AdoptError(f"--min-driver: {err}") from None
        return options.min_driver, "--min-driver"
    if inventory.driver:
        return inventory.driver, f"the driver here ({inventory.driver_source})"
    fact = load_facts().drivers.get(toolkit)
    if fact is None or not fact.ga:
        raise AdoptError(f"{inventory.where}: no driver answered here and imagebuild knows no minimum driver for "
                         f"CUDA {toolkit}: pass the hosts' driver with --min-driver (as nvidia-smi prints it)")
    return fact.ga, f"no driver answered here: CUDA {toolkit}'s minimum (knowledge/compat.toml)"


def cuda_plan(inventory: Inventory, options: AdoptOptions) -> tuple[CudaPlan | None, list[str]]:
    notes = []
    toolchain = _toolchain_cuda(inventory)
    torch_cuda = None
    if inventory.torch_cuda:
        try:
            torch_cuda = CudaVersion.parse(inventory.torch_cuda)
        except ValueError:
            notes.append(f"torch/version.py says cuda = {inventory.torch_cuda!r}, which is no CUDA version")
    if torch_cuda is not None:
        toolkit = torch_cuda
        source = f"torch {inventory.torch_version}: torch/version.py cuda = {inventory.torch_cuda!r}"
        if toolchain and toolchain[0] != torch_cuda:
            notes.append(f"torch is built for CUDA {torch_cuda} but {toolchain[1]} is CUDA {toolchain[0]}: "
                         "[cuda] toolkit follows torch; the lock will say what the skew breaks")
    elif toolchain is not None:
        toolkit, source = toolchain[0], f"the CUDA toolchain wheels: {toolchain[1]}"
    else:
        return None, notes + ["no CUDA in the environment (no CUDA torch, no CUDA toolchain wheel): no [cuda] table"]
    archs, archs_from = _archs(inventory, options)
    driver, driver_from = _min_driver(inventory, options, toolkit)
    return CudaPlan(str(toolkit), source, archs, archs_from, driver, driver_from), notes


def base_of(inventory: Inventory) -> tuple[str, str, str, str]:
    """(suite, python, glibc, Debian arch) of the Debian base that has the environment's Python."""
    it = inventory.interpreter
    if it.implementation != "cpython":
        raise AdoptError(f"{inventory.where}: {it.implementation} is not CPython; imagebuild's images run "
                         "Debian's CPython, so adopt an environment made with CPython")
    arch = host_arch(it.machine)
    if arch not in MACHINES:
        raise AdoptError(f"{inventory.where}: machine {it.machine!r}: imagebuild builds linux/amd64 and linux/arm64 "
                         "only")
    suites = sorted(load_facts().suites.values(), key=lambda s: s.suite)
    suite = next((s for s in suites if s.python == it.python), None)
    if suite is None:
        known = ", ".join(f"{s.suite} (Python {s.python})" for s in suites)
        raise AdoptError(f"{inventory.where}: Python {it.python}: no Debian suite imagebuild knows has it "
                         f"({known}); the pins are for that Python, so recreate the environment with one of "
                         "those Pythons and adopt that")
    return suite.suite, suite.python, suite.glibc, arch


def plan_recipe(inventory: Inventory, options: AdoptOptions, now: str) -> Plan:
    """What the recipe says; `now` (RFC 3339, UTC) becomes exclude_newer."""
    installed = inventory.by_name
    if "torch" not in installed and not options.without_torch:
        raise AdoptError(f"no torch in the environment of {inventory.interpreter.describe()}: adopt reads the "
                         "image's CUDA from torch. Is this the interpreter of the working environment (a venv's is "
                         "VENV/bin/python)? For an environment without torch on purpose, pass --without-torch")
    for name in options.exclude:
        if canonicalize_name(name) not in installed:
            raise AdoptError(f"--exclude {name}: not installed in the environment of "
                             f"{inventory.interpreter.describe()}")
    suite, python, glibc, arch = base_of(inventory)
    left_out = [_origin_left_out(d) for d in inventory.distributions if not d.origin.reproducible]
    left_out += [LeftOut(d.name, d.version, f"its METADATA's name and version do not make a requirement: {why}",
                         "reinstall it from an index; a broken dist-info cannot be pinned", excluded=False)
                 for d in inventory.distributions if d.origin.reproducible and (why := _unpinnable(d))]
    excluded = {canonicalize_name(n) for n in options.exclude}
    left_out += [LeftOut(n, installed[n].version, "--exclude", "nothing: left out as asked") for n in sorted(excluded)
                 if installed[n].origin.reproducible]
    cuda, notes = cuda_plan(inventory, options)
    if not inventory.interpreter.in_venv:
        notes.append(f"{inventory.interpreter.executable} is not in a venv: is it the environment that works? "
                     "(a venv's interpreter is VENV/bin/python)")
    return _pins(inventory, left_out, (suite, python, glibc, arch), cuda, now, options.extra_index_urls, notes)


def _unpinnable(dist: Installed) -> str:
    """Why name==version is no requirement (an altered or broken METADATA), or ""."""
    try:
        Version(dist.version)
        requirement = Requirement(f"{dist.name}=={dist.version}")
    except (InvalidVersion, InvalidRequirement) as err:
        return str(err)
    return "" if requirement.name == dist.name else f"{dist.name!r} is not a distribution name"


def without(plan: Plan, name: str, why: str, fix: str) -> Plan:
    """The plan with one more distribution left out (no wheel of it on the index, say): pins again."""
    left_out = [e for e in plan.left_out if e.excluded or e.name not in SEED_TOOLS]
    left_out.append(LeftOut(name, plan.pins.get(name, "?"), why, fix))
    return _pins(plan.inventory, left_out, (plan.suite, plan.python, plan.glibc, plan.arch), plan.cuda,
                 plan.exclude_newer, plan.extra_index_urls, list(plan.notes))


def _pins(inventory: Inventory, left_out: list[LeftOut], base: tuple[str, str, str, str], cuda: CudaPlan | None,
          now: str, extra_index_urls: Iterable[str], notes: list[str]) -> Plan:
    installed = inventory.by_name
    gone = {entry.name for entry in left_out}
    keep = [d for d in inventory.distributions if d.name not in gone]
    graph = {}
    for dist in keep:
        graph[dist.name], unreadable = needs_of(dist, inventory.markers, [d.name for d in keep])
        notes += [f"{dist.name}: Requires-Dist {line!r} is not PEP 508; it was not followed" for line in unreadable]
    # A seed tool nothing requires is the venv's, unless the extras the roots are asked install it.
    seeds = [n for n in SEED_TOOLS if n in graph and n not in required(graph)]
    rest = {name: needs for name, needs in graph.items() if name not in seeds}
    reached = reach(top_level(rest), graph) if seeds and rest else {}
    for name in [n for n in seeds if n not in reached]:
        left_out.append(LeftOut(name, installed[name].version, "put there by `python -m venv`; nothing requires it",
                                f"add \"{name}=={installed[name].version}\" to [python].requirements if the image "
                                "needs it (the image's venv has no installer)", excluded=False))
        del graph[name]
    roots = top_level(graph) if graph else {}
    by = dependents(graph, roots)
    requirements = tuple(Pin(n, installed[n].version, tuple(sorted(e)), _root_why(installed[n], gone, inventory))
                         for n, e in sorted(roots.items()))
    constraints = tuple(Pin(n, installed[n].version, (), f"required by {_named(by.get(n, []))}")
                        for n in sorted(set(graph) - set(roots)))
    nvcc = [f"{n} {v}" for n, v, has in inventory.toolchain if has]
    packages = (("g++", f"nvcc's host compiler: {nvcc[0]} is in the environment"),) if nvcc else ()
    suite, python, glibc, arch = base
    first = {}
    for entry in left_out:  # one entry a distribution: the first reason found
        first.setdefault(entry.name, entry)
    return Plan(suite, python, glibc, arch, inventory.interpreter.machine, packages, requirements, constraints,
                tuple(first[name] for name in sorted(first)), cuda, now, tuple(extra_index_urls),
                tuple(dict.fromkeys(notes)), inventory)


def _root_why(dist: Installed, gone: set[str], inventory: Inventory) -> str:
    """Why a distribution is a requirement: nothing requires it, or only what was left out does."""
    for other in inventory.distributions:
        if other.name in gone:
            needs, _ = needs_of(other, inventory.markers, [dist.name])
            if needs.always or needs.by_extra:
                return f"required by {other.name}, which is left out"
    return ""


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED])
    return f"{shown} and {len(names) - NAMED} more" if len(names) > NAMED else shown


