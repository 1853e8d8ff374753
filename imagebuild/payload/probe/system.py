"""Small readers of the running system, and the text helpers they share.

The parsers take outside input and return plain values or None; they never raise. The readers run a
tool, read a file or look a package up without importing it, and report failure as a value too.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

COMMAND_TIMEOUT_S = 60
IMPORT_TIMEOUT_S = 300


def canonical_name(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. become one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def major_minor(version) -> str | None:
    """`13.0` from `13.0`, `13.0.88` or `13.0.3.0`; None for anything else."""
    match = re.match(r"([0-9]+)\.([0-9]+)", version) if isinstance(version, str) else None
    return f"{match.group(1)}.{match.group(2)}" if match else None


def parse_nvcc_release(text) -> str | None:
    """`13.0` from nvcc --version output (`Cuda compilation tools, release 13.0, V13.0.88`)."""
    match = re.search(r"release ([0-9]+)\.([0-9]+)", text) if isinstance(text, str) else None
    return f"{match.group(1)}.{match.group(2)}" if match else None


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except (OSError, ValueError):
        return None


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][-300:]


def glibc_version() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    match = re.search(r"([0-9]+\.[0-9]+)", text)
    return match.group(1) if match else None


def run_command(argv: list, timeout: float = COMMAND_TIMEOUT_S) -> tuple:
    """(exit status, stdout and stderr together); status None when it could not run."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, str(error)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def parallelism() -> int:
    """How many processes the probe runs at once: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_python_json(code: str, *args: str, timeout: float = IMPORT_TIMEOUT_S, env=None) -> tuple:
    """Run code with this interpreter; (its JSON answer or None, exit status, stderr's last 4000 chars)."""
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, None, str(error)
    tail = done.stderr.decode("utf-8", "replace").strip()[-4000:]
    for line in reversed(done.stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), done.returncode, tail
            except ValueError:
                break
    return None, done.returncode, tail


def same_path(a, b) -> bool:
    try:
        return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)
    except (TypeError, ValueError):  # a NUL byte in a path from the expect file
        return False


def interpreter_prefix(executable: str) -> str | None:
    status, output = run_command([executable, "-c", "import sys; print(sys.prefix)"])
    lines = output.strip().splitlines() if status == 0 else []
    return lines[-1] if lines else None


def installed_distributions() -> dict:
    """Canonical name -> sorted distinct versions, for every distribution this interpreter sees."""
    found = {}
    for dist in importlib.metadata.distributions():
        try:
            name, version = dist.metadata["Name"], dist.version
        except Exception:  # a broken dist-info must not stop the probe
            continue
        if isinstance(name, str) and isinstance(version, str):
            found.setdefault(canonical_name(name), set()).add(version)
    return {name: sorted(versions) for name, versions in found.items()}


def package_dir(name: str) -> str | None:
    """Where a package is installed, found without importing it (deep_gemm's __init__ needs torch)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def locate_package(name: str, dirs: list) -> str | None:
    """A top-level package's folder in these directories, found without importing it."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, list(dirs))
    except (ImportError, ValueError, OSError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def cuda_home_by_rule() -> str | None:
    """CUDA_HOME or CUDA_PATH, else the folder above `which nvcc`'s bin, else /usr/local/cuda if present."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        if nvcc is not None:
            home = os.path.dirname(os.path.dirname(nvcc))
        elif os.path.exists("/usr/local/cuda"):
            home = "/usr/local/cuda"
    return home


def cuda_home_rule(environ=None, which=None) -> tuple:
    """(home, how) by the rule torch, deep_gemm and FlashInfer share: CUDA_HOME, CUDA_PATH, the folder
    above `which nvcc`'s bin, /usr/local/cuda if present."""
    environ = os.environ if environ is None else environ
    which = shutil.which if which is None else which
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(key) is not None:
            return environ[key], f"${key}"
    nvcc = which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), f"`which nvcc` = {nvcc}"
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "/usr/local/cuda (no CUDA_HOME, CUDA_PATH or nvcc on PATH)"
    return None, "nothing: no CUDA_HOME, CUDA_PATH, nvcc on PATH or /usr/local/cuda"


def deep_gemm_cuda_home(package: str | None = None) -> tuple:
    """(home, how): the installed deep_gemm/cuda_helpers.py's answer, loaded by path, else its rule."""
    package = package or package_dir("deep_gemm")
    helpers = os.path.join(package, "cuda_helpers.py") if package else None
    if not (helpers and os.path.isfile(helpers)):
        return cuda_home_by_rule(), "rule (no deep_gemm/cuda_helpers.py installed)"
    try:
        spec = importlib.util.spec_from_file_location("_imagebuild_deep_gemm_cuda_helpers", helpers)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.find_cuda_home(), helpers
    except Exception as error:  # its find_cuda_home asserts when nothing is found
        return None, f"{helpers}: {type(error).__name__} {error}".strip()
