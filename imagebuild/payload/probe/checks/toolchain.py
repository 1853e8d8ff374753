"""The checks of the interpreter, the locked packages and the CUDA toolchain they bring.

interpreter, packages, cuda-toolchain and cuda-home; inspect_toolkit reads a toolkit folder piece by
piece, and the doctor reuses it for every toolkit it finds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sys

from ..gpus import sm_number
from ..report import FAIL, PASS, SKIP, WARN, make_check
from ..system import (canonical_name, cuda_home_by_rule, deep_gemm_cuda_home, installed_distributions,
                     interpreter_prefix, major_minor, package_dir, parse_nvcc_release, read_text, run_command,
                     run_python_json, same_path)

TOOLCHAIN_DISTRIBUTIONS = (
    "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm",
)
_NVCC_IN_SCRIPT = re.compile(r"(/[^\s'\"]+)/bin/nvcc\b")


def check_interpreter(expect: dict) -> dict:
    """The probe runs under the locked interpreter, in its venv, and `python3`/`python` on PATH are it too."""
    wanted = expect.get("python") or {}
    executable = wanted.get("executable")
    wanted_prefix = os.path.dirname(os.path.dirname(executable)) if executable else sys.prefix
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    problems = []
    if executable and not same_path(sys.prefix, wanted_prefix):
        problems.append(f"running under {sys.executable} (prefix {sys.prefix}), expected {executable}")
    if not in_venv:
        problems.append(f"{sys.executable} is not inside a virtual environment")
    version = wanted.get("version")
    if version and major_minor(platform.python_version()) != major_minor(version):
        problems.append(f"Python {platform.python_version()}, expected {version}")
    on_path = {}
    for command in ("python3", "python"):
        found = shutil.which(command)
        prefix = interpreter_prefix(found) if found else None
        on_path[command] = {"path": found, "prefix": prefix}
        if not same_path(prefix, wanted_prefix):
            where = f"{found} (prefix {prefix})" if found else "missing"
            problems.append(f"`{command}` on PATH is {where}, not the interpreter at {wanted_prefix}")
    evidence = {"executable": sys.executable, "prefix": sys.prefix, "in_venv": in_venv,
                "base_prefix": getattr(sys, "base_prefix", None), "expected": executable, "on_path": on_path}
    if problems:  # without an expected interpreter, nothing says which one is right: warn only
        return make_check("interpreter", FAIL if executable else WARN, "; ".join(problems), **evidence)
    return make_check("interpreter", PASS, f"{sys.executable} in venv {sys.prefix}; python3 and python agree",
                      **evidence)


def check_packages(expect: dict, installed: dict | None = None, site: list | None = None) -> dict:
    """The locked distributions at their versions, and each patched one's files as its patches left them."""
    wanted = expect.get("packages") or {}
    if not wanted:
        return make_check("packages", SKIP, "no expected packages")
    installed = installed_distributions() if installed is None else installed
    missing = sorted(name for name in wanted if name not in installed)
    wrong = {name: {"expected": version, "installed": installed[name]}
             for name, version in sorted(wanted.items())
             if name in installed and [v.lower() for v in installed[name]] != [version.lower()]}
    unexpected = {name: versions for name, versions in sorted(installed.items()) if name not in wanted}
    unpatched, patched_files = patched_file_problems(expect.get("patches") or [], site)
    evidence = {"expected": len(wanted), "installed": len(installed), "missing": missing,
                "wrong_version": wrong, "unexpected": unexpected, "patched_files": patched_files,
                "patch_problems": unpatched}
    if missing or wrong or unpatched:
        parts = ["missing: " + ", ".join(missing)] if missing else []
        if wrong:
            parts.append("wrong version: " + ", ".join(f"{name} {'/'.join(found['installed'])} "
                                                         f"(expected {found['expected']})"
                                                         for name, found in wrong.items()))
        parts += unpatched
        return make_check("packages", FAIL, "; ".join(parts), **evidence)
    said = f"; {patched_files} patched files as their patches left them" if patched_files else ""
    if unexpected:
        return make_check("packages", WARN, f"{len(wanted)} as locked{said}; not in the lock: "
                          f"{', '.join(unexpected)}", **evidence)
    return make_check("packages", PASS, f"all {len(wanted)} distributions installed at the locked versions{said}",
                      **evidence)


# Written by payload/apply_patch.py at build time beside the patched distribution's RECORD: the patches
# applied, and the sha256 each file it changed was left with (null: deleted).
PATCHES_FILE, PATCHED_FILES = "IMAGEBUILD_PATCHES", "IMAGEBUILD_PATCHED_FILES.json"


def patched_file_problems(patches: list, site: list | None = None) -> tuple:
    """(problems, files checked): each distribution the lock patches lists the lock's patches, and every
    file they changed hashes as they left it at build time."""
    wanted: dict = {}
    for patch in patches:
        wanted.setdefault(canonical_name(patch["package"]), []).append(str(patch["sha256"]).lower())
    if not wanted:
        return [], 0
    found: dict = {}
    for dist in importlib.metadata.distributions(**({"path": site} if site is not None else {})):
        try:
            found.setdefault(canonical_name(dist.metadata["Name"]), dist)
        except Exception:  # a broken dist-info must not stop the probe
            continue
    problems, checked = [], 0
    for name, shas in sorted(wanted.items()):
        dist = found.get(name)
        if dist is None:
            problems.append(f"{name} is patched by the lock but not installed")
            continue
        listed = [line.split()[0] for line in (_dist_text(dist, PATCHES_FILE) or "").splitlines() if line.split()]
        if listed != shas:
            problems.append(f"{name}: {PATCHES_FILE} lists {' '.join(listed) or 'no patch'}, the lock "
                            f"{' '.join(shas)}")
            continue
        try:
            produced = json.loads(_dist_text(dist, PATCHED_FILES) or "null")
        except (ValueError, RecursionError):
            produced = None
        if not isinstance(produced, dict) or not produced:
            problems.append(f"{name}: no {PATCHED_FILES} says which files its patches left, and how")
            continue
        for path, digest in sorted(produced.items()):
            checked += 1
            actual = _sha256(str(dist.locate_file(path)))
            if actual != digest:
                problems.append(f"{name}: {path} is {'missing' if actual is None else 'sha256 ' + actual}, "
                                f"the patch left {'it deleted' if digest is None else 'sha256 ' + str(digest)}")
    return problems, checked


def _dist_text(dist, name: str) -> str | None:
    """A dist-info file's text, or None when it is missing or unreadable (it is the image's, not ours)."""
    try:
        return dist.read_text(name)
    except (OSError, ValueError):
        return None


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()
    except (OSError, ValueError):  # ValueError: a path with a NUL byte, which no file has
        return None


def check_cuda_toolchain(expect: dict, installed: dict | None = None) -> dict:
    cuda = expect.get("cuda")
    if not cuda:
        return make_check("cuda-toolchain", SKIP, "no CUDA toolkit expected")
    toolkit = major_minor(cuda["toolkit"])
    home = cuda.get("home") or cuda_home_by_rule() or ""
    found = inspect_toolkit(home)
    problems = []
    release = found["release"]
    if release is None:
        problems.append(f"{found['nvcc']} --version did not report a release ({found['nvcc_output']})")
    elif release != toolkit:
        problems.append(f"nvcc is release {release}, expected {toolkit}")
    if not found["runtime_header"]:
        problems.append("include/cuda_runtime.h is missing")
    if not found["cccl"]:
        problems.append("CCCL headers (include/cccl or include/nv/target) are missing")
    if found["lib64"] == "missing":
        problems.append("lib64 is missing (linking against CUDA looks there)")
    elif found["lib64"] == "elsewhere":
        problems.append(f"lib64 resolves to {found['lib64_real']}, not to lib")
    if not found["libcudart"]:
        problems.append("lib64/libcudart.so is missing (linking with -lcudart needs it)")
    installed = installed_distributions() if installed is None else installed
    # The toolchain the lock read from its artifacts (expect.json), else the pieces every toolchain has.
    wanted = cuda.get("toolchain") or TOOLCHAIN_DISTRIBUTIONS
    versions = {name: installed[name] for name in wanted if name in installed}
    absent = [name for name in cuda.get("toolchain") or () if name not in installed]
    if absent:
        problems.append(f"{', '.join(absent)} of the locked toolchain not installed")
    for name, found_versions in versions.items():
        if any(major_minor(version) != toolkit for version in found_versions):
            problems.append(f"{name} {'/'.join(found_versions)} is not CUDA {toolkit}")
    evidence = {"home": home, "expected": toolkit, "nvcc_release": release, "distributions": versions}
    if problems:
        return make_check("cuda-toolchain", FAIL, "; ".join(problems), **evidence)
    return make_check("cuda-toolchain", PASS, f"CUDA {toolkit} toolchain complete at {home}", **evidence)


# Each consumer's own lookup, called in a child (torch's and FlashInfer's import torch): torch's
# cpp_extension._find_cuda_home, FlashInfer's jit.cpp_ext.get_cuda_path, and the ptxas Triton runs for
# the recipe's SM (get_ptxas(arch) answers a knob with .path in Triton 3.4 onward, (path, version) before,
# and takes no arch in some releases).
_ASK_CONSUMERS = """
import importlib.util, inspect, json, sys
sm = int(sys.argv[1])
answers = {}
def torch_home():
    from torch.utils import cpp_extension
    return cpp_extension._find_cuda_home()
def flashinfer_home():
    from flashinfer.jit import cpp_ext
    return cpp_ext.get_cuda_path()
def triton_ptxas():
    from triton.backends.nvidia import compiler
    ask = compiler.get_ptxas
    found = ask(sm) if inspect.signature(ask).parameters else ask()
    return getattr(found, "path", None) or (found[0] if isinstance(found, tuple) else found)
for name, package, call in (("torch", "torch", torch_home), ("flashinfer", "flashinfer", flashinfer_home),
                            ("triton", "triton", triton_ptxas)):
    if importlib.util.find_spec(package) is None:
        continue
    try:
        answer = call()
        answers[name] = {"home" if name != "triton" else "ptxas": None if answer is None else str(answer)}
    except Exception as error:
        answers[name] = {"error": (type(error).__name__ + ": " + str(error))[:400]}
print(json.dumps(answers))
"""


def ask_consumers(sm: int) -> tuple:
    """({consumer: its own answer}, a problem running them or None)."""
    answers, status, errors = run_python_json(_ASK_CONSUMERS, str(sm))
    if answers is None:
        return {}, f"asking torch, FlashInfer and Triton failed (exit {status}): {errors[-600:]}"
    return answers, None


def check_cuda_home(expect: dict) -> dict:
    """Each consumer resolves CUDA_HOME its own way, and each is asked: deep_gemm's find_cuda_home,
    torch's _find_cuda_home, FlashInfer's get_cuda_path, each installed one landing on the expected
    toolkit; Triton's ptxas for the recipe's SM must be there to run."""
    found = {}
    if package_dir("deep_gemm"):
        dg_home, dg_how = deep_gemm_cuda_home()
        found["deep_gemm"] = {"home": dg_home, "how": dg_how}
    archs = (expect.get("cuda") or {}).get("archs") or []
    sm = max([sm_number(arch) or 80 for arch in archs] or [80])
    asked, problem = ask_consumers(sm)
    for name in ("torch", "flashinfer"):
        if name in asked:
            found[name] = dict(asked[name], how={"torch": "torch.utils.cpp_extension._find_cuda_home()",
                                                  "flashinfer": "flashinfer.jit.cpp_ext.get_cuda_path()"}[name])
    expected = (expect.get("cuda") or {}).get("home")
    evidence = {"expected": expected, "found": found, "triton": asked.get("triton"), "env": {
        key: os.environ.get(key) for key in ("CUDA_HOME", "CUDA_PATH")}, "which_nvcc": shutil.which("nvcc")}
    problems = [problem] if problem else []
    problems += [f"{name}: {answer['error']}" for name, answer in found.items() if answer.get("error")]
    triton = asked.get("triton")
    if triton and (triton.get("error") or not (triton.get("ptxas") and os.access(triton["ptxas"], os.X_OK))):
        problems.append(f"Triton's ptxas for sm_{sm}: {triton.get('error') or triton.get('ptxas')} is not there to run")
    homes = {consumer: result.get("home") for consumer, result in found.items() if not result.get("error")}
    if not found and not triton and not problems:
        return make_check("cuda-home", SKIP, "no consumer of a CUDA home (deep_gemm, torch, FlashInfer, Triton) is "
                          "installed", **evidence)
    if found and not any(homes.values()) and not problems:
        cause, fix = no_home_cause()
        return make_check("cuda-home", FAIL, f"no consumer finds a CUDA home: {cause}; fix: {fix}",
                          cause=cause, fix=fix, **evidence)
    want = expected or next((home for home in homes.values() if home), None)
    problems += [f"{consumer} finds {home}" + (f", expected {expected}" if expected else "")
                 for consumer, home in homes.items() if not same_path(home, want)]
    if problems:
        return make_check("cuda-home", FAIL, "; ".join(problems), **evidence)
    said = f"asked {', '.join(found)}: all find {want}" if found else "no CUDA home consumer installed"
    said += f"; Triton runs {triton['ptxas']} for sm_{sm}" if triton else ""
    return make_check("cuda-home", PASS, said, **evidence)


TOOLCHAIN_FIX = ("the CUDA 13 pip toolchain (cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.* with [cuda] toolkit = "
                 "\"13.0\"), or a CUDA devel base image pinned by digest")


def nvcc_wheels(distributions=None) -> list:
    """(name, version, the bin/nvcc it installs or None, whether it installs ptxas) of every
    nvidia-cuda-nvcc* distribution, read from its file list."""
    import importlib.metadata
    found = []
    for dist in distributions if distributions is not None else importlib.metadata.distributions():
        try:
            name = canonical_name(dist.metadata["Name"] or "")
            if not name.startswith("nvidia-cuda-nvcc"):
                continue
            files = [str(f) for f in dist.files or ()]
            nvcc = next((str(dist.locate_file(f)) for f in files if f.endswith("/bin/nvcc")), None)
            found.append((name, dist.version, nvcc, any(f.endswith("/bin/ptxas") for f in files)))
        except Exception:  # a broken dist-info must not stop the probe
            continue
    return sorted(found)


def no_home_cause(distributions=None) -> tuple:
    """(why no consumer finds a CUDA home, the fix), from the toolchain wheels that are installed."""
    wheels = nvcc_wheels(distributions)
    if not wheels:
        return ("no CUDA toolchain is installed (no nvidia-cuda-nvcc wheel, no nvcc on PATH, no CUDA_HOME, "
                "CUDA_PATH or /usr/local/cuda)", "ask for one: " + TOOLCHAIN_FIX)
    carriers = [(name, version, nvcc) for name, version, nvcc, _ in wheels if nvcc]
    if not carriers:
        names = ", ".join(f"{name} {version}" for name, version, _, _ in wheels)
        what = "ptxas only" if all(ptxas for *_, ptxas in wheels) else "no bin/nvcc"
        return f"{names} is installed but ships no nvcc binary ({what})", TOOLCHAIN_FIX
    name, version, nvcc = carriers[0]
    return (f"{name} {version} has nvcc at {nvcc}, but nothing points at it: no CUDA_HOME or CUDA_PATH, nvcc "
            "is not on PATH and /usr/local/cuda does not exist",
            f"set CUDA_HOME={os.path.dirname(os.path.dirname(nvcc))} (imagebuild's images link /usr/local/cuda "
            "to it when the recipe has a [cuda] table)")


def inspect_toolkit(home: str) -> dict:
    """Every piece of a CUDA toolkit folder that nvcc and JIT builds need; runs nvcc --version once."""
    home = home or ""
    nvcc = os.path.join(home, "bin", "nvcc")
    status, output = run_command([nvcc, "--version"])
    include, lib, lib64 = (os.path.join(home, name) for name in ("include", "lib", "lib64"))
    if not os.path.isdir(lib64):
        lib64_state = "missing"
    elif os.path.isdir(lib) and not same_path(lib64, lib):
        lib64_state = "elsewhere"
    else:
        lib64_state = "ok"
    sonames = sorted(entry for entry in _listdir(lib) + _listdir(lib64) if entry.startswith("libcudart.so."))
    return {
        "home": home, "real": os.path.realpath(home) if home else None, "nvcc": nvcc,
        "nvcc_output": output.strip()[-200:], "release": parse_nvcc_release(output) if status == 0 else None,
        "nvcc_script": nvcc_script_target(nvcc),
        "runtime_header": os.path.isfile(os.path.join(include, "cuda_runtime.h")),
        "cccl": os.path.isdir(os.path.join(include, "cccl")) or os.path.isdir(os.path.join(include, "nv", "target")),
        "crt": os.path.isfile(os.path.join(include, "crt", "math_functions.h")),
        "cicc": os.access(os.path.join(home, "nvvm", "bin", "cicc"), os.X_OK),
        "lib64": lib64_state, "lib64_real": os.path.realpath(lib64) if lib64_state != "missing" else None,
        "libcudart": os.path.exists(os.path.join(lib64, "libcudart.so")), "libcudart_sonames": sorted(set(sonames)),
    }


def _listdir(path: str) -> list:
    try:
        return os.listdir(path)
    except OSError:
        return []


def nvcc_script_target(nvcc: str) -> str | None:
    """The toolkit a wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`) hands over to."""
    text = read_text(nvcc, 4096) if os.path.isfile(nvcc) and not os.path.islink(nvcc) else None
    match = _NVCC_IN_SCRIPT.search(text) if text and text.startswith("#!") else None
    return match.group(1) if match else None


def missing_pieces(toolkit: dict) -> list:
    pieces = [piece for piece in ("nvcc", "runtime_header", "cccl", "crt", "cicc")
              if not (toolkit["release"] if piece == "nvcc" else toolkit[piece])
              and not (piece == "cicc" and toolkit["nvcc_script"])]  # a wrapper's nvcc finds its own cicc
    if toolkit["lib64"] == "missing":
        pieces.append("lib64")
    if not toolkit["libcudart"]:
        pieces.append("libcudart")
    return pieces
