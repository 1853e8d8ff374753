"""Facts read from the locked wheels themselves, at lock time, without downloading whole wheels.

For every locked wheel its file list (RECORD) and METADATA are read with ranged requests
(remote_wheel.py; cached by the lock's sha256, so a relock of the same wheels reads nothing). From
them come the facts no hand table should hold:

    overlaps       paths two distributions both install (the later install silently wins)
    torch_cuda     the CUDA a torch wheel was built for: its nvidia-cuda-runtime requirement
    nvcc_carriers  which toolchain wheels really ship an nvcc binary (cu12 nvcc wheels ship ptxas only)
    requires       what each wheel requires of the locked torch (torchvision, torchaudio)

knowledge/rules/lock.py turns them into findings; nothing here judges.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from requests.adapters import HTTPAdapter

from imagebuild.common import Progress, quiet
from imagebuild.lock.lockfile import LockedWheel
from imagebuild.lock.remote_wheel import WheelError, wheel_files
from imagebuild.payload.prune import matches
from imagebuild.recipe.cuda import CudaVersion

# libNAME.so.MAJOR[.MINOR...]: group 1 is the name -lNAME looks for
_VERSIONED_LIBRARY = re.compile(r"(lib[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*?\.so)\.[0-9]+(?:\.[0-9]+)*")

METADATA, RECORD = "*.dist-info/METADATA", "*.dist-info/RECORD"
_CUDA_RUNTIME = re.compile(r"nvidia-cuda-runtime(?:-cu(\d+))?")
READERS = 16  # wheels read at once


@dataclass(frozen=True)
class Overlap:
    path: str  # relative to site-packages, as RECORD writes it
    owners: tuple[str, ...]  # distribution names, in install order
    same: bool  # every owner's copy has the same sha256
    deleted_by: str = ""  # a [[prune]] of this distribution deletes the file another owner keeps

    def to_dict(self) -> dict:
        return {"path": self.path, "owners": list(self.owners), "same": self.same, "deleted_by": self.deleted_by}


@dataclass(frozen=True)
class WheelFacts:
    name: str
    version: str
    files: dict[str, str]  # RECORD path -> "sha256=..." ("" when RECORD gives none)
    requires: tuple[str, ...]  # Requires-Dist lines as written


@dataclass
class Artifacts:
    wheels: dict[str, WheelFacts] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)  # name -> why it could not be read

    def torch_cuda(self) -> tuple[CudaVersion, str] | None:
        """The CUDA torch's wheel asks for (its nvidia-cuda-runtime requirement), and the requirement."""
        torch = self.wheels.get("torch")
        return runtime_cuda(torch.requires) if torch else None

    def nvcc_carriers(self) -> dict[str, bool]:
        """nvidia-cuda-nvcc* distribution -> whether its files hold an nvcc binary (bin/nvcc)."""
        return {name: any(path.endswith("/bin/nvcc") for path in facts.files)
                for name, facts in self.wheels.items() if name.startswith("nvidia-cuda-nvcc")}

    def cuda12_builds(self) -> dict[str, str]:
        """distribution -> what says it is a CUDA 12 build: a RECORD path in a `cu12` folder or with a
        `.cu12.` extension tag (nvidia_cutlass_dsl/cu12/lib/…, _cutlass_ir.cu12.cpython-…so), or a
        METADATA requirement of the CUDA 12 runtime or of another `-cu12` distribution."""
        found = {}
        for name, facts in sorted(self.wheels.items()):
            path = next((p for p in sorted(facts.files) if "/cu12/" in f"/{p}" or ".cu12." in p.rsplit("/", 1)[-1]), None)
            if path:
                found[name] = f"its RECORD installs {path}"
                continue
            runtime = runtime_cuda(facts.requires)
            if runtime and runtime[0].major == 12:
                found[name] = f"its METADATA requires {runtime[1]}"
                continue
            needs = next((r for r in _requirements(facts.requires) if applies(r)
                          and canonicalize_name(r.name).endswith("-cu12")), None)
            if needs is not None:
                found[name] = f"its METADATA requires {needs}"
        return found

    def toolchain(self) -> list[str]:
        """The distributions that make the CUDA toolchain, as its artifacts say: the distributions whose
        RECORD installs bin/nvcc, and those the locked cuda-toolkit metapackage's METADATA pins exactly
        (any of its extras, on Linux) at its own release's major.minor (the toolkit's components:
        nvcc, crt, nvvm, cudart, nvrtc, cupti...; its libraries, cuBLAS 13.1 or cuFFT 12.0 in toolkit
        13.0, carry versions of their own)."""
        names = {name for name, facts in self.wheels.items() if any(p.endswith("/bin/nvcc") for p in facts.files)}
        toolkit = self.wheels.get("cuda-toolkit")
        if toolkit is not None:
            names.add("cuda-toolkit")
            release = _major_minor(toolkit.version)
            for requirement in _requirements(toolkit.requires):
                pins = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
                if pins and _major_minor(pins[0]) == release and _applies_with_any_extra(requirement):
                    names.add(canonicalize_name(requirement.name))
        return sorted(name for name in names if name in self.wheels)

    def layout(self) -> dict:
        """Where the image's CUDA pieces land, as the wheels' RECORDs say: `nvcc` (the site-packages path
        of bin/nvcc, whose toolkit folder is the CUDA home), `deep_gemm` (the distribution that installs
        a top-level deep_gemm package), `toolchain` (Artifacts.toolchain) and `unversioned` (dev_names),
        each only when known."""
        found = {}
        toolchain = self.toolchain()
        if toolchain:
            found["toolchain"] = toolchain
        for name, facts in sorted(self.wheels.items()):
            nvcc = sorted(path for path in facts.files if path.endswith("/bin/nvcc") and path.count("/") >= 2)
            if nvcc and "nvcc" not in found:
                found["nvcc"] = nvcc[0]
            if "deep_gemm/__init__.py" in facts.files and "deep_gemm" not in found:
                found["deep_gemm"] = name
        if "nvcc" in found and (names := self.dev_names(found["nvcc"].rsplit("/", 2)[0] + "/lib/")):
            found["unversioned"] = names
        return found

    def dev_names(self, lib: str) -> dict[str, str]:
        """The shared libraries the wheels install in the CUDA home's lib folder under a versioned name only
        (nvidia/cu13/lib/libnvrtc.so.13, no libnvrtc.so): unversioned path -> the file it should name, the
        shortest version of each. A toolkit's dev packages ship these links; `-lnvrtc` finds nothing without
        one (FlashInfer's fused MoE links it). What any wheel installs under the plain name is left alone."""
        installed = {path for facts in self.wheels.values() for path in facts.files}
        found: dict[str, str] = {}
        for path in sorted(installed, key=lambda p: (len(p), p)):
            if not path.startswith(lib) or "/" in path[len(lib):]:
                continue
            match = _VERSIONED_LIBRARY.fullmatch(path[len(lib):])
            if match and lib + match.group(1) not in installed:
                found.setdefault(lib + match.group(1), path[len(lib):])
        return dict(sorted(found.items()))

    def requires_of(self, name: str, dependency: str) -> list[Requirement]:
        """What a wheel requires of a dependency in the image (Linux, no extras asked for)."""
        facts = self.wheels.get(name)
        return [r for r in _requirements(facts.requires if facts else ())
                if canonicalize_name(r.name) == dependency and applies(r)]

    def overlaps(self, order: Iterable[str], removed: Mapping[str, Sequence[str]] | None = None) -> list[Overlap]:
        """Paths installed by more than one distribution, in the order the image installs them.
        Each distribution's own dist-info folder is its own and never overlaps, and a path a recipe's
        [[prune]] removes from a distribution (`removed`: name -> globs) is no longer its."""
        removed = removed or {}
        owners: dict[str, list[tuple[str, str, bool]]] = {}  # path -> (name, digest, pruned), install order
        for name in order:
            facts = self.wheels.get(name)
            if facts is None:
                continue
            globs = removed.get(name, ())
            for path, digest in facts.files.items():
                if ".dist-info/" not in path:
                    owners.setdefault(path, []).append((name, digest, any(matches(g, path) for g in globs)))
        found = []
        for path, holders in sorted(owners.items()):
            if len(holders) < 2:
                continue
            # A prune deletes the file where it lies, whoever wrote it last: replay the installs.
            present, deleted_by = None, ""
            for name, _, pruned in holders:
                present, deleted_by = (None, name) if pruned else (name, "")
            kept = [(name, digest) for name, digest, pruned in holders if not pruned]
            if present is None and kept:
                found.append(Overlap(path, tuple(name for name, _ in kept), False, deleted_by))
            elif len(kept) > 1:
                digests = {digest for _, digest in kept}
                found.append(Overlap(path, tuple(name for name, _ in kept), len(digests) == 1 and "" not in digests))
        return found


def _requirements(lines: Iterable[str]) -> list[Requirement]:
    parsed = []
    for line in lines:
        try:
            parsed.append(Requirement(line))
        except InvalidRequirement:
            continue
    return parsed


IMAGE_MARKERS = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix", "extra": ""}


def applies(requirement: Requirement) -> bool:
    """Whether a Requires-Dist line applies in the image: Linux, and no extra asked for."""
    try:
        return requirement.marker is None or requirement.marker.evaluate(IMAGE_MARKERS)
    except Exception:  # a marker packaging cannot evaluate: not ours to judge
        return False


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _applies_with_any_extra(requirement: Requirement) -> bool:
    """Whether a Requires-Dist line applies on Linux for some extra (`extra == "nvcc"` and the like)."""
    import re
    extras = re.findall(r"""extra\s*==\s*["']([^"']+)["']""", str(requirement.marker or ""))
    try:
        return requirement.marker is None or any(requirement.marker.evaluate({**IMAGE_MARKERS, "extra": extra})
                                                 for extra in extras or [""])
    except Exception:
        return False


def runtime_cuda(requires: Iterable[str]) -> tuple[CudaVersion, str] | None:
    """The CUDA major.minor a wheel pins for Linux: its nvidia-cuda-runtime(-cuNN) requirement (torch up
    to 2.10), else its cuda-toolkit requirement (torch 2.11 on pins the toolkit metapackage instead)."""
    found = {}
    for requirement in _requirements(requires):
        name = canonicalize_name(requirement.name)
        kind = "runtime" if _CUDA_RUNTIME.fullmatch(name) else "toolkit" if name == "cuda-toolkit" else None
        if kind is None or kind in found or not applies(requirement):
            continue
        for spec in requirement.specifier:
            parts = spec.version.split(".")
            if spec.operator in ("==", "===", "~=", ">=") and len(parts) >= 2 and all(p.isdigit() for p in parts[:2]):
                found[kind] = CudaVersion(int(parts[0]), int(parts[1])), str(requirement)
                break
    return found.get("runtime") or found.get("toolkit")


def parse_record(text: str) -> dict[str, str]:
    """RECORD (CSV: path,hash,size) -> path -> hash; unreadable lines are skipped."""
    files = {}
    for row in csv.reader(text.splitlines()):
        if row and row[0]:
            files[row[0]] = row[1] if len(row) > 1 else ""
    return files


def parse_metadata(text: str) -> tuple[str, ...]:
    return tuple(HeaderParser().parsestr(text).get_all("Requires-Dist") or ())


def read_artifacts(wheels: Iterable[LockedWheel], cache: Path,
                   progress: Progress = quiet) -> Artifacts:
    """METADATA and RECORD of every locked wheel (from where the resolver found it); one that cannot
    be read is noted, never guessed at."""
    wheels = [w for w in wheels if w.url]  # a lock read back from disk has no URLs: nothing to read
    # One session for all readers, its pool as wide as they are: connections (and their TLS
    # handshakes) are reused across wheels. Measured on the flagship's 206 wheels, cold: 3.2 s
    # against 8.8 s with a connection per wheel.
    session = requests.Session()
    for scheme in ("https://", "http://"):
        session.mount(scheme, HTTPAdapter(pool_connections=READERS, pool_maxsize=READERS))

    def read(wheel: LockedWheel):
        try:
            got = wheel_files(wheel.url, wheel.sha256, cache=cache, members=(METADATA, RECORD), session=session)
        except WheelError as err:
            return wheel, None, str(err)
        record, metadata = got.members.get(RECORD), got.members.get(METADATA)
        if record is None or metadata is None:
            return wheel, None, "the wheel has no RECORD or METADATA"
        return wheel, WheelFacts(wheel.name, wheel.version, parse_record(_text(record)),
                                 parse_metadata(_text(metadata))), ""

    found = Artifacts()
    progress(f"reading the file lists of {len(wheels)} wheels")
    with session, ThreadPoolExecutor(READERS) as pool:
        for wheel, facts, why in pool.map(read, wheels):
            if facts is None:
                found.unread[wheel.name] = why
            else:
                found.wheels[wheel.name] = facts
    return found


def _text(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "replace")
