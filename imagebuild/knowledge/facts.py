"""Facts: the CUDA, driver, GPU-target, Debian and glibc table in compat.toml beside it, with sources.

Loaded once, validated (every entry needs a source), and looked up by the rules beside it (rules/).
The public API is `load_facts()` and its fact types, and the lookups at the end: `debian_suite`,
`torch_cuda`, `without_cuda`, `parse_version`, `release_cuda`, `native_toolkit`.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagebuild.errors import ImagebuildError
from imagebuild.recipe.cuda import Arch, CudaVersion, parse_driver

DATA_FILE = Path(__file__).parent / "compat.toml"
BASES = ("verified", "general")  # FACTS.md's [V] and [G]
_NOT_CUDA = re.compile(r"^(cpu|rocm.*|xpu.*)$")  # local tags of torch builds without CUDA: without_cuda()


@dataclass(frozen=True)
class SuiteFacts:
    suite: str  # "bookworm"
    python: str  # "3.11"
    glibc: str  # "2.36"
    manylinux: str  # "manylinux_2_36": the newest manylinux tag the suite can install
    source: str = ""


@dataclass(frozen=True)
class DriverFact:
    cuda: CudaVersion
    ga: str | None  # minimum driver for the first release; None when not known
    updates: tuple[str, ...]  # minimum driver for each update, in order
    source: str


@dataclass(frozen=True)
class FloorFact:
    major: int
    floor: int  # oldest driver branch that runs any <major>.x toolkit (SASS only)
    source: str


@dataclass(frozen=True)
class ArchFact:
    target: str  # "sm_120f"
    first_cuda: CudaVersion
    last_cuda: CudaVersion | None
    note: str
    source: str


@dataclass(frozen=True)
class GlibcNvccFact:
    glibc_from: Version
    nvcc_from: CudaVersion
    carried_by: tuple[str, ...]  # distributions that ship nvcc and crt/math_functions.h
    source: str


@dataclass(frozen=True)
class ToolchainDist:
    name: str  # canonical distribution name
    major: int | None  # only checked for toolkits of this major; None: always
    source: str


@dataclass(frozen=True)
class Facts:
    floors: Mapping[int, FloorFact]
    drivers: Mapping[CudaVersion, DriverFact]
    archs: Mapping[str, ArchFact]
    suites: Mapping[str, SuiteFacts]
    glibc_nvcc: GlibcNvccFact
    toolchain: Mapping[str, ToolchainDist]


# --- loading the data file --------------------------------------------------------------------

def load_facts(path: Path | None = None) -> Facts:
    """The facts in compat.toml, parsed and validated once; a malformed file is an ImagebuildError."""
    return _load_facts(Path(path) if path else DATA_FILE)


@functools.cache
def _load_facts(path: Path) -> Facts:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ImagebuildError(f"{path}: cannot read compatibility facts: {err}") from None
    read = _Reader(path)
    return Facts(
        floors=read.keyed(read.each(raw, "minor_version_compat", _floor), "major"),
        drivers=read.keyed(read.each(raw, "driver", _driver), "cuda"),
        archs=read.keyed(chain.from_iterable(read.each(raw, "arch", _archs)), "target"),
        suites=read.keyed(read.each(raw, "debian", _suite), "suite"),
        glibc_nvcc=read.parse(raw.get("glibc_nvcc"), "[glibc_nvcc]", _glibc_nvcc),
        toolchain=read.keyed(chain.from_iterable(read.each(raw, "toolchain", _toolchain)), "name"),
    )


class _Reader:
    """Walks the data file's tables, turning every missing key or bad value into one clear error."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str) -> ImagebuildError:
        return ImagebuildError(f"{self.path}: {where}: {problem}")

    def keyed(self, facts: Iterable, key: str) -> dict:
        """Facts by their key; the same key twice is a mistake in the file, not an override."""
        by_key = {}
        for fact in facts:
            value = getattr(fact, key)
            if value in by_key:
                raise self.fail(f"{key} {value}", "listed twice")
            by_key[value] = fact
        return by_key

    def each(self, raw: dict, table: str, parse) -> list:
        entries = raw.get(table)
        if not isinstance(entries, list) or not entries:
            raise self.fail(f"[[{table}]]", "missing or empty")
        return [self.parse(e, f"[[{table}]] entry {i + 1}", parse) for i, e in enumerate(entries)]

    def parse(self, entry, where: str, parse):
        if not isinstance(entry, dict):
            raise self.fail(where, "missing, or not a table")
        get = functools.partial(_get, entry)
        try:
            source = get("source", str)
            if not source.strip():
                raise ValueError("'source' is empty")
            if get("basis", str) not in BASES:
                raise ValueError(f"'basis' must be one of {', '.join(BASES)}")
            return parse(get, source)
        except (KeyError, TypeError, ValueError, AttributeError, InvalidVersion) as err:
            raise self.fail(where, err.args[0] if err.args else repr(err)) from None


_MISSING = object()


def _get(entry: dict, key: str, kind: type, default=_MISSING):
    value = entry.get(key, default)
    if value is _MISSING:
        raise KeyError(f"missing {key!r}")
    if value is not default and not isinstance(value, kind):
        raise TypeError(f"{key!r} must be of type {kind.__name__}, not {value!r}")
    return value


def _driver_text(text: str) -> str:
    parse_driver(text)  # validates, raises ValueError
    return text


def _floor(get, source: str) -> FloorFact:
    return FloorFact(get("major", int), get("floor", int), source)


def _driver(get, source: str) -> DriverFact:
    ga = get("ga", str)
    return DriverFact(
        CudaVersion.parse(get("cuda", str)),
        None if ga == "unknown" else _driver_text(ga),
        tuple(_driver_text(u) for u in get("updates", list, [])),
        source,
    )


def _archs(get, source: str) -> list[ArchFact]:
    first = CudaVersion.parse(get("first_cuda", str))
    last = get("last_cuda", str, None)
    last = CudaVersion.parse(last) if last else None
    return [ArchFact(Arch.parse(t).sm, first, last, get("note", str, ""), source)
            for t in get("targets", list)]


def _suite(get, source: str) -> SuiteFacts:
    glibc = get("glibc", str)
    major, minor = (int(part) for part in glibc.split("."))
    return SuiteFacts(get("suite", str), get("python", str), glibc,
                      f"manylinux_{major}_{minor}", source)


def _glibc_nvcc(get, source: str) -> GlibcNvccFact:
    return GlibcNvccFact(Version(get("glibc_from", str)), CudaVersion.parse(get("nvcc_from", str)),
                         tuple(canonicalize_name(n) for n in get("carried_by", list)), source)


def _toolchain(get, source: str) -> list[ToolchainDist]:
    major = get("major", int, None)
    return [ToolchainDist(canonicalize_name(name), major, source) for name in get("names", list)]


# --- lookups ----------------------------------------------------------------------------------

def debian_suite(suite: str) -> SuiteFacts:
    """Python and glibc of a Debian suite; an unknown suite names the known ones."""
    suites = load_facts().suites
    if suite not in suites:
        raise ImagebuildError(
            f"unknown Debian suite {suite!r}: imagebuild knows {', '.join(sorted(suites))}")
    return suites[suite]


def torch_cuda(version: str) -> CudaVersion | None:
    """CUDA of a torch build as its version says it (a `+cuXYZ` local tag); None when it does not say:
    the wheel's own METADATA says it at lock (lock/artifacts.py)."""
    parsed = parse_version(version)
    if parsed is None or not parsed.local:
        return None
    match = re.fullmatch(r"cu(\d{1,2})(\d)", parsed.local)
    return CudaVersion(int(match.group(1)), int(match.group(2))) if match else None


def without_cuda(local: str) -> bool:
    """Whether a torch version's local tag names a build without CUDA: +cpu, +rocm6.4, +xpu."""
    return bool(_NOT_CUDA.match(local))


def parse_version(text: str) -> Version | None:
    """A distribution's version as packaging reads it; None when it is not one."""
    try:
        return Version(text)
    except (InvalidVersion, TypeError):
        return None


def release_cuda(text: str) -> CudaVersion | None:
    """The CUDA major.minor that leads a distribution's version: 13.0.88 -> 13.0."""
    parsed = parse_version(text)
    if parsed is None or len(parsed.release) < 2:
        return None
    return CudaVersion(parsed.release[0], parsed.release[1])


def native_toolkit(driver: tuple[int, ...]) -> CudaVersion | None:
    """The newest known toolkit whose first release this driver runs natively."""
    native = [f.cuda for f in load_facts().drivers.values() if f.ga and parse_driver(f.ga) <= driver]
    return max(native, default=None)
