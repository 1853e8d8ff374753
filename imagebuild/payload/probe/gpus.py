"""Doctor: the driver and GPUs, and the GPU architectures torch carries kernels for.

The driver from nvidia-smi or the kernel module's version file; torch's version, CUDA and arch list
from its files (version.py, libtorch_python.so), without importing it.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil

from .system import last_line, locate_package, read_text, run_command

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"

# torch's arch list as one C string ("sm_75 sm_80 ... sm_120"); the literal `sm_` start lets the regex engine
# skip ahead, which makes scanning libtorch_python.so (34 MB) take 0.02 s instead of 1.7 s.
_ARCH_LIST = re.compile(rb"sm_[0-9]{2,3}[af]?(?: (?:sm|compute)_[0-9]{2,3}[af]?)+(?=\x00)")


def parse_driver_version_file(text) -> str | None:
    """`595.71.05` from /proc/driver/nvidia/version (proprietary or open kernel module)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)\s", text) \
        if isinstance(text, str) else None
    return match.group(1) if match else None


def parse_smi_gpus(text) -> list:
    """GPUs from `nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines() if isinstance(text, str) else []:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"[0-9]{3}\.[0-9.]+", parts[1]):
            known = re.fullmatch(r"[0-9]+\.[0-9]+", parts[2])
            gpus.append({"name": parts[0], "driver": parts[1], "compute_cap": parts[2] if known else None})
    return gpus


def read_driver(driver_file: str = DRIVER_VERSION_FILE) -> dict:
    """The driver version and GPUs: nvidia-smi when it is on PATH, else the kernel module's version file."""
    facts = {"version": None, "source": None, "gpus": [], "nvidia_smi": shutil.which("nvidia-smi"),
             "version_file": driver_file, "file_version": parse_driver_version_file(read_text(driver_file)),
             "error": None}
    if facts["nvidia_smi"]:
        status, output = run_command([facts["nvidia_smi"], "--query-gpu=name,driver_version,compute_cap",
                                      "--format=csv,noheader"], timeout=30)
        if status != 0 and "valid field" in output:  # drivers before compute_cap was a query field
            status, output = run_command([facts["nvidia_smi"], "--query-gpu=name,driver_version",
                                          "--format=csv,noheader"], timeout=30)
            output = "\n".join(line + ", ?" for line in output.splitlines() if line.strip())
        if status == 0:
            facts["gpus"] = parse_smi_gpus(output)
            versions = sorted({gpu["driver"] for gpu in facts["gpus"]})
            facts["version"], facts["source"] = (versions[0] if versions else None), "nvidia-smi"
            if not facts["gpus"]:  # it ran and named no device: an error, never "no driver" or a pass
                facts["error"] = "nvidia-smi listed no GPU" + (f" ({last_line(output)})" if output.strip() else "")
        else:
            facts["error"] = last_line(output) or f"nvidia-smi exited {status}"
    if facts["version"] is None and facts["file_version"]:
        facts["version"], facts["source"] = facts["file_version"], driver_file
    return facts


def parse_arch_list(data) -> list:
    """torch's compiled-in arch list (what torch.cuda.get_arch_list() answers) from its library's bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)) and not hasattr(data, "find"):
        return []
    longest = max((match.group() for match in _ARCH_LIST.finditer(data)), key=len, default=b"")
    return longest.decode("ascii").split() if longest else []


def arch_number(target: str) -> tuple | None:
    """(major, minor, suffix, kind) of `sm_120a`, `compute_90` or `12.0f`; None for anything else."""
    match = re.fullmatch(r"(sm|compute)_([0-9]{1,2})([0-9])([af]?)", target or "") or \
        re.fullmatch(r"()([0-9]{1,2})\.([0-9])([af]?)", target or "")
    if not match:
        return None
    return int(match.group(2)), int(match.group(3)), match.group(4), match.group(1) or "sm"


def sm_number(target: str) -> int | None:
    """`sm_120a` or `12.0f` -> 120, the number a fat binary's entry carries; None for anything else."""
    parts = arch_number(target)
    return parts[0] * 10 + parts[1] if parts else None


def runs_on(targets: list, compute_cap: str) -> bool:
    """Whether code built for these targets runs on a GPU: a cubin of the same major and a minor at or
    below the GPU's (an `a` cubin only on its exact GPU, `f` on its family), or PTX at or below it."""
    gpu = arch_number(compute_cap)
    if gpu is None:
        return False
    for target in targets:
        parsed = arch_number(target)
        if parsed is None:
            continue
        major, minor, suffix, kind = parsed
        if kind == "compute" and (major, minor) <= gpu[:2]:
            return True
        if kind == "sm" and major == gpu[0] and (minor == gpu[1] if suffix == "a" else minor <= gpu[1]):
            return True
    return False


def parse_torch_version_file(text) -> dict:
    """`__version__` and `cuda` from torch/version.py, read as text (importing torch takes seconds)."""
    found = {}
    for key, pattern in (("version", r"^__version__\s*=\s*['\"]([^'\"]+)['\"]"),
                         ("cuda", r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)")):
        match = re.search(pattern, text, re.MULTILINE) if isinstance(text, str) else None
        if match:
            found[key] = match.group(1)
    return found


def torch_facts(stack: dict) -> dict:
    """torch's version and CUDA from torch/version.py, its arch list from libtorch_python.so's bytes: what
    torch.version.cuda and torch.cuda.get_arch_list() answer, without importing torch."""
    location = locate_package("torch", stack["dirs"])
    if location is None:
        return {"installed": False}
    facts = dict(parse_torch_version_file(read_text(os.path.join(location, "version.py"))), installed=True,
                 package=location, archs=[], archs_from=None)
    facts.setdefault("version", stack["distributions"].get("torch"))
    facts.setdefault("cuda", None)
    library = os.path.join(location, "lib", "libtorch_python.so")
    if facts["cuda"] and os.path.isfile(library):
        try:
            with open(library, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                facts["archs"], facts["archs_from"] = parse_arch_list(data), library
        except (OSError, ValueError):
            pass
    return facts
