#!/usr/bin/env python3
"""Check a built image, or a live host, against what its lock expects.

Stdlib only and Python >= 3.9: the renderer copies this one file into every image as
/opt/imagebuild/probe.py and the smoke stage runs it there; `imagebuild doctor` runs the same file on
live hosts. Each check is a small function returning a plain dict; the CLI sits at the bottom.

    probe.py [--expect PATH] [--workdir DIR] [--skip-compile]
    probe.py --doctor [--driver-file PATH]

prints one JSON report and exits 0 when no check failed, 1 when one did, and 2 when the expect file
is unreadable or invalid. --doctor checks what is there instead of what a lock expects: driver and
GPUs, every CUDA toolkit and which one torch, deep_gemm, FlashInfer and Triton pick, CUDA versions,
the interpreter against the environments nearby, FlashInfer's Dynamo patch and the JIT caches.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder heads sys.path: keep sibling modules from shadowing the stdlib.
# (`imagebuild doctor --image` runs it as `python -c SOURCE`, where there is no __file__.)
if __name__ == "__main__" and "__file__" in globals() and sys.path \
        and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import ast  # noqa: E402
import glob  # noqa: E402
import importlib.machinery  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

REPORT_FORMAT = 1
PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"
EM_CUDA = 190  # ELF e_machine of a cubin
SM120 = 120
COMMAND_TIMEOUT_S = 60
COMPILE_TIMEOUT_S = 600
TOOLCHAIN_DISTRIBUTIONS = (
    "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm",
)
NO_EXPECTATIONS = {"python": {}, "packages": {}, "cuda": None, "deep_gemm": {"compile": False},
                   "imports": [], "torch_cuda": None, "flashinfer_dynamo": False}
IMPORT_TIMEOUT_S = 300

# SM120 kernels compiled the way deep_gemm's JIT would. The argument order is the one
# sgl-project/DeepGEMM csrc/jit_kernels/impls/sm120_{bf16_gemm,fp8_fp4_gemm_1d1d}.hpp generate; the
# values are what csrc/jit_kernels/heuristics/sm120.hpp (SM120ArchSpec) picks for M = N = K = 4096,
# BF16 output, 188 SMs (RTX PRO 6000 Blackwell), evaluated by hand. Shapes are 0 (run-time) because
# the Python API's compiled_dims defaults to ''. The FP8 kernel uses 1x128 scale granularity.
_HEURISTICS_SOURCE = ("sgl-project/DeepGEMM csrc/jit_kernels/heuristics/sm120.hpp, M=N=K=4096, "
                      "188 SMs; argument order from csrc/jit_kernels/impls/{}.hpp")
SM120_KERNELS = (
    {
        "kernel": "sm120_bf16_gemm_impl",
        "header": "deep_gemm/impls/sm120_bf16_gemm.cuh",
        "template_args": [
            "0", "0", "0", "1",                    # SHAPE_M/N/K, groups
            "128", "128", "32",                    # BLOCK_M/N/K
            "64", "64", "128",                     # swizzle A/B/CD
            "4", "128", "256", "188",              # stages, TMA threads, math threads, SMs
            "GemmType::Normal", "false", "cutlass::bfloat16_t",
            "epilogue::transform::EpilogueIdentity", "true", "1",  # epilogue, B K-major, kNWarps
        ],
        "args_source": _HEURISTICS_SOURCE.format("sm120_bf16_gemm"),
    },
    {
        "kernel": "sm120_fp8_fp4_gemm_1d1d_impl",
        "header": "deep_gemm/impls/sm120_fp8_fp4_gemm_1d1d.cuh",
        "template_args": [
            "0", "0", "0", "128", "128", "1",      # SHAPE_M/N/K, gran K of A/B, groups
            "128", "128", "64",                    # BLOCK_M/N/K
            "64", "64", "128",                     # swizzle A/B/CD
            "4", "128", "256", "188",              # stages, TMA threads, math threads, SMs
            "GemmType::Normal", "false", "cutlass::bfloat16_t",
            "epilogue::transform::EpilogueIdentity",
            "false", "false", "false", "true", "false",  # FP4, B FP4, A FP4, B K-major, const stride
            "64", "1", "false",                    # epilogue sub-M, split-K, skip padding store
        ],
        "args_source": _HEURISTICS_SOURCE.format("sm120_fp8_fp4_gemm_1d1d"),
    },
)

# nvcc options as string literals in deep_gemm/_C.so (its JIT, DeepJIT, builds the command line in C++).
_NVCC_FLAG = re.compile(
    r"(-std=c\+\+\{\}|--expt-[a-z-]+|--diag-suppress=[0-9,]+|--use_fast_math|--generate-line-info"
    r"|--compiler-options=[\w=,.+-]+|--ptxas-options=[\w=,.{}+-]+|--gpu-architecture=sm_(\{\})?"
    r"|-gencode=arch=compute_\w+,code=\w+|--cubin|--ptx)", re.ASCII)
# Off unless a kernel or DG_JIT_* asks (DeepJIT CompilerOptions: fast_math, ptxas_verbose, ... false).
_CONDITIONAL_FLAG = re.compile(
    r"(--use_fast_math|--generate-line-info|--ptx|--ptxas-options=--(verbose|warn-on-[a-z-]+))", re.ASCII)
_SM120_GENCODE = re.compile(r"-gencode=arch=compute_12[0-9][af]?,code=sm_(12[0-9][af]?)", re.ASCII)
_PRINTABLE_RUN = re.compile(rb"[\x20-\x7e]{3,}(?=\x00)")
# DeepJIT's defaults for the {} it leaves in literals (deepseek-ai/DeepJIT backend/cuda/options.hpp).
_PLACEHOLDER_DEFAULTS = {
    "-std=c++{}": ("DG_JIT_CPP_STANDARD", "20"),
    "--ptxas-options=--register-usage-level={}": (None, "10"),
}
_OPTIMIZE_LEVEL = "3"


# ---- pure helpers: outside input in, plain values out; they never raise ----

def make_check(name: str, status: str, detail: str, **evidence) -> dict:
    return {"name": name, "status": status, "detail": " ".join(detail.split()), "evidence": evidence}


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


def parse_cubin_header(data) -> dict | None:
    """Machine, flags and SM arch (e_flags bits 8-15) of a 64-bit little-endian ELF; None otherwise."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 64 or data[:4] != b"\x7fELF":
        return None
    if data[4] != 2 or data[5] != 1:
        return None
    (machine,) = struct.unpack_from("<H", data, 18)
    (flags,) = struct.unpack_from("<I", data, 48)
    return {"machine": machine, "e_flags": hex(flags), "arch": (flags >> 8) & 0xFF, "abi_version": data[8]}


def scan_strings(data) -> list:
    """NUL-terminated printable ASCII runs of three or more characters, as `strings` finds them."""
    if not isinstance(data, (bytes, bytearray)):
        return []
    return [match.group().decode("ascii") for match in _PRINTABLE_RUN.finditer(data)]


def select_jit_flags(strings, environ=None) -> dict:
    """The nvcc flags deep_gemm's JIT passes on every compile, from the string literals of its _C.so."""
    environ = os.environ if environ is None else environ
    found = []
    for text in strings if isinstance(strings, (list, tuple)) else []:
        tokens = text.split() if isinstance(text, str) else []
        if not tokens or any(not (token.startswith("-") or token == "{}") for token in tokens):
            continue  # not a list of options (messages, paths, ...)
        for token in tokens:
            if _NVCC_FLAG.fullmatch(token) and token not in found:
                found.append(token)
    gencode = next((flag for flag in found if _SM120_GENCODE.fullmatch(flag)), None)
    arch = _SM120_GENCODE.fullmatch(gencode).group(1) if gencode else None
    flags, conditional, filled, unfilled = [], [], {}, []
    for flag in found:
        if _CONDITIONAL_FLAG.fullmatch(flag) or (flag.startswith("-gencode=") and flag != gencode):
            conditional.append(flag)
        elif flag in ("--cubin", "--ptx"):
            continue  # the output kind; added to the command line below
        elif flag.startswith("--gpu-architecture=sm_"):
            if arch:
                flags.append("--gpu-architecture=sm_" + arch)
        elif flag == "--compiler-options=-O":  # DeepJIT: "-O" + level and "--compiler-options=-O" + level
            flags += ["-O" + _OPTIMIZE_LEVEL, flag + _OPTIMIZE_LEVEL]
        elif "{}" in flag:
            env_name, default = _PLACEHOLDER_DEFAULTS.get(flag, (None, None))
            value = (environ.get(env_name) if env_name else None) or default
            if value is None:
                unfilled.append(flag)
            else:
                filled[flag] = value
                flags.append(flag.replace("{}", value))
        else:
            flags.append(flag)
    return {"flags": flags, "gencode": gencode, "arch": arch, "conditional": conditional,
            "filled": filled, "unfilled": unfilled, "cubin_flag": "--cubin" if "--cubin" in found else "-cubin"}


def validate_expect(raw) -> tuple:
    """(expectations, []) for a valid expect document, (None, [problems]) otherwise."""
    if not isinstance(raw, dict):
        return None, ["the expect file must hold a JSON object"]
    errors = []
    python = raw.get("python")
    if not (isinstance(python, dict) and all(isinstance(python.get(key), str) for key in ("executable", "version"))):
        errors.append('"python" must be {"executable": "<path>", "version": "<major.minor>"}')
    packages = raw.get("packages")
    if not (isinstance(packages, dict)
            and all(isinstance(name, str) and isinstance(version, str) for name, version in packages.items())):
        errors.append('"packages" must map distribution names to exact version strings')
    cuda = raw.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, dict) and major_minor(cuda.get("toolkit")) is not None and isinstance(cuda.get("home"), str)
        and isinstance(cuda.get("archs", []), list) and all(isinstance(a, str) for a in cuda.get("archs", []))
    ):
        errors.append('"cuda" must be null or {"toolkit": "13.0", "archs": [...], "home": "<path>"}')
    deep_gemm = raw.get("deep_gemm")
    if deep_gemm is not None and not (
        isinstance(deep_gemm, dict) and isinstance(deep_gemm.get("compile", False), bool)
    ):
        errors.append('"deep_gemm" must be null or {"compile": true|false}')
    imports = raw.get("imports", [])
    if not (isinstance(imports, list) and all(isinstance(m, str) for m in imports)):
        errors.append('"imports" must be a list of module names')
    torch_cuda = raw.get("torch_cuda")
    if torch_cuda is not None and major_minor(torch_cuda) is None:
        errors.append('"torch_cuda" must be null or a CUDA version like "13.0"')
    if not isinstance(raw.get("flashinfer_dynamo", False), bool):
        errors.append('"flashinfer_dynamo" must be true or false')
    if errors:
        return None, errors
    return {
        "python": python,
        "packages": {canonical_name(name): version for name, version in packages.items()},
        "cuda": cuda,
        "deep_gemm": deep_gemm or {"compile": False},
        "imports": imports,
        "torch_cuda": torch_cuda,
        "flashinfer_dynamo": raw.get("flashinfer_dynamo", False),
    }, []


# ---- small readers of the running system ----

def run_command(argv: list, timeout: float = COMMAND_TIMEOUT_S) -> tuple:
    """(exit status, stdout and stderr together); status None when it could not run."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, str(error)
    return done.returncode, done.stdout.decode("utf-8", "replace")


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


# ---- the checks ----

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


def check_packages(expect: dict) -> dict:
    wanted = expect.get("packages") or {}
    if not wanted:
        return make_check("packages", SKIP, "no expected packages")
    installed = installed_distributions()
    missing = sorted(name for name in wanted if name not in installed)
    wrong = {name: {"expected": version, "installed": installed[name]}
             for name, version in sorted(wanted.items())
             if name in installed and [v.lower() for v in installed[name]] != [version.lower()]}
    unexpected = {name: versions for name, versions in sorted(installed.items()) if name not in wanted}
    evidence = {"expected": len(wanted), "installed": len(installed), "missing": missing,
                "wrong_version": wrong, "unexpected": unexpected}
    if missing or wrong:
        parts = ["missing: " + ", ".join(missing)] if missing else []
        if wrong:
            parts.append("wrong version: " + ", ".join(f"{name} {'/'.join(found['installed'])} "
                                                         f"(expected {found['expected']})"
                                                         for name, found in wrong.items()))
        return make_check("packages", FAIL, "; ".join(parts), **evidence)
    if unexpected:
        return make_check("packages", WARN, f"{len(wanted)} as locked; not in the lock: {', '.join(unexpected)}",
                          **evidence)
    return make_check("packages", PASS, f"all {len(wanted)} distributions installed at the locked versions", **evidence)


def check_cuda_toolchain(expect: dict) -> dict:
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
    installed = installed_distributions()
    versions = {name: installed[name] for name in TOOLCHAIN_DISTRIBUTIONS if name in installed}
    for name, found_versions in versions.items():
        if any(major_minor(version) != toolkit for version in found_versions):
            problems.append(f"{name} {'/'.join(found_versions)} is not CUDA {toolkit}")
    evidence = {"home": home, "expected": toolkit, "nvcc_release": release, "distributions": versions}
    if problems:
        return make_check("cuda-toolchain", FAIL, "; ".join(problems), **evidence)
    return make_check("cuda-toolchain", PASS, f"CUDA {toolkit} toolchain complete at {home}", **evidence)


def check_cuda_home(expect: dict) -> dict:
    """Each consumer resolves CUDA_HOME its own way; all of them must land on the expected toolkit."""
    dg_home, dg_how = deep_gemm_cuda_home()
    by_rule = cuda_home_by_rule()
    found = {
        "deep_gemm": {"home": dg_home, "how": dg_how},
        # flashinfer/jit/cpp_ext.py get_cuda_path and torch/utils/cpp_extension.py _find_cuda_home both
        # import torch, so their rule (the same as deep_gemm's) runs here instead of their code.
        "flashinfer": {"home": by_rule, "how": "rule of flashinfer.jit.cpp_ext.get_cuda_path"},
        "torch": {"home": by_rule, "how": "rule of torch.utils.cpp_extension._find_cuda_home"},
    }
    expected = (expect.get("cuda") or {}).get("home")
    evidence = {"expected": expected, "found": found, "env": {
        key: os.environ.get(key) for key in ("CUDA_HOME", "CUDA_PATH")}, "which_nvcc": shutil.which("nvcc")}
    homes = {consumer: result["home"] for consumer, result in found.items()}
    if expected:
        wrong = {consumer: home for consumer, home in homes.items() if not same_path(home, expected)}
        if wrong:
            return make_check("cuda-home", FAIL, f"expected {expected}; " + ", ".join(
                f"{consumer} finds {home}" for consumer, home in wrong.items()), **evidence)
        return make_check("cuda-home", PASS, f"deep_gemm, FlashInfer and torch all find {expected}", **evidence)
    first = next(iter(homes.values()))
    if first and all(same_path(home, first) for home in homes.values()):
        return make_check("cuda-home", PASS, f"deep_gemm, FlashInfer and torch all find {first}", **evidence)
    return make_check("cuda-home", FAIL, "consumers disagree: " + ", ".join(
        f"{consumer} finds {home}" for consumer, home in homes.items()), **evidence)


def compile_sm120_kernel(spec: dict, nvcc: str, include: str, jit: dict, workdir: str) -> dict:
    """Compile one kernel instantiation to a cubin and read its ELF header."""
    source = os.path.join(workdir, spec["kernel"] + ".cu")
    cubin = os.path.join(workdir, spec["kernel"] + ".cubin")
    with open(source, "w") as out:
        out.write(f"#include <{spec['header']}>\n\nusing namespace deep_gemm;\n\n"
                  f"static void __instantiate_kernel() {{\n"
                  f"    auto ptr = reinterpret_cast<void*>(&{spec['kernel']}<{', '.join(spec['template_args'])}>);\n"
                  f"}}\n")
    argv = [nvcc, source, jit["cubin_flag"], "--output-file", cubin, "-I" + include] + jit["flags"]
    started = time.monotonic()
    status, output = run_command(argv, timeout=COMPILE_TIMEOUT_S)
    result = {"kernel": spec["kernel"], "header": spec["header"], "template_args": spec["template_args"],
              "args_source": spec["args_source"], "seconds": round(time.monotonic() - started, 2), "error": None}
    if status != 0:
        result["error"] = f"nvcc exited {status}: " + " | ".join(output.strip().splitlines()[-15:])
        return result
    try:
        with open(cubin, "rb") as handle:
            data = handle.read()
    except OSError as error:
        result["error"] = f"no cubin: {error}"
        return result
    header = parse_cubin_header(data)
    result.update(cubin_bytes=len(data), elf=header, kernel_symbol=spec["kernel"].encode() in data)
    if header is None or header["machine"] != EM_CUDA:
        result["error"] = "output is not a CUDA ELF cubin"
    elif header["arch"] != SM120:
        result["error"] = f"cubin is for sm_{header['arch']}, not sm_{SM120}"
    elif not result["kernel_symbol"]:
        result["error"] = "cubin does not contain the kernel"
    return result


def check_deep_gemm_sm120(expect: dict, workdir: str | None = None, skip_compile: bool = False) -> dict:
    name = "deep-gemm-sm120"
    if not (expect.get("deep_gemm") or {}).get("compile"):
        return make_check(name, SKIP, "no deep_gemm compile expected")
    if skip_compile:
        return make_check(name, SKIP, "--skip-compile")
    package = package_dir("deep_gemm")
    if package is None:
        return make_check(name, FAIL, "deep_gemm is not installed")
    library = os.path.join(package, "_C.so")
    try:
        with open(library, "rb") as handle:
            jit = select_jit_flags(scan_strings(handle.read()))
    except OSError as error:
        return make_check(name, FAIL, f"cannot read deep_gemm's JIT library: {error}")
    evidence = {"library": library, "jit": jit}
    if not jit["gencode"]:
        return make_check(name, FAIL, f"{library} has no SM120 gencode (-gencode=arch=compute_120...): "
                                      "this deep_gemm does not JIT for SM120", **evidence)
    home, how = deep_gemm_cuda_home()
    home = home or (expect.get("cuda") or {}).get("home") or ""
    nvcc = os.environ.get("DG_JIT_NVCC_COMPILER") or os.path.join(home, "bin", "nvcc")
    host_compiler = shutil.which("g++") or shutil.which("c++")
    evidence.update(nvcc=nvcc, cuda_home=home, cuda_home_from=how, host_compiler=host_compiler)
    if not os.access(nvcc, os.X_OK):
        return make_check(name, FAIL, f"no nvcc at {nvcc}", **evidence)
    if host_compiler is None:
        return make_check(name, FAIL, "nvcc needs a host C++ compiler (g++) on PATH", **evidence)
    try:
        if workdir:
            os.makedirs(workdir, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="imagebuild-probe-", dir=workdir)
    except OSError as error:
        return make_check(name, FAIL, f"cannot make a scratch folder: {error}", **evidence)
    try:
        kernels = [compile_sm120_kernel(spec, nvcc, os.path.join(package, "include"), jit, scratch)
                   for spec in SM120_KERNELS]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    evidence["kernels"] = kernels
    failed = [kernel for kernel in kernels if kernel["error"]]
    if failed:
        return make_check(name, FAIL, "; ".join(f"{k['kernel']}: {k['error']}" for k in failed), **evidence)
    times = ", ".join(f"{k['kernel']} {k['seconds']} s" for k in kernels)
    return make_check(name, PASS, f"compiled {len(kernels)} kernels to sm_{SM120} cubins ({times})", **evidence)


# ---- the ML stack: imports, torch's CUDA, FlashInfer under Dynamo (each in its own process) ----

_IMPORT = ("import importlib, json, sys, time; t = time.time(); m = importlib.import_module(sys.argv[1]); "
           "print(json.dumps({'version': str(getattr(m, '__version__', '') or ''), "
           "'seconds': round(time.time() - t, 2)}))")
_TORCH_CUDA = "import json, torch; print(json.dumps({'cuda': torch.version.cuda, 'torch': torch.__version__}))"
# The seed bug (sglang issue 23386): FlashInfer's get_cuda_version() spawned nvcc, which Dynamo cannot
# trace, so piecewise CUDA graph capture died. fullgraph=True turns any graph break into an error.
_DYNAMO = """
import json, torch
from flashinfer.jit import cpp_ext
def uses_cuda_version(x):
    return x + cpp_ext.get_cuda_version().major
try:
    out = torch.compile(uses_cuda_version, fullgraph=True, backend="eager")(torch.ones(2))
    print(json.dumps({"ok": True, "value": out.tolist()}))
except Exception as error:
    print(json.dumps({"ok": False, "error": type(error).__name__ + ": " + str(error)[:600]}))
"""


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


CUDA_ERROR_NO_DEVICE = 100


def gpu_visible() -> bool:
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def driver_symbols(package_dir: str) -> list:
    """The CUDA driver API functions (cu*) that a package's shared libraries import."""
    nm = shutil.which("nm")
    symbols = set()
    for root, _, files in os.walk(package_dir) if nm else ():
        for name in files:
            if ".so" in name:
                status, output = run_command([nm, "-D", "--undefined-only", os.path.join(root, name)])
                symbols.update(re.findall(r"\bU (cu[A-Z]\w*)", output or "") if status == 0 else ())
    return sorted(symbols | {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount"})


def build_no_device_driver(package_dir: str, workdir: str) -> str | None:
    """A stand-in libcuda.so.1 whose every call answers CUDA_ERROR_NO_DEVICE, built in the probe's scratch
    folder and only put on the import's library path: what a host driver with no GPU would say. It never
    enters the image (the container must use the host's own driver)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    folder = os.path.join(workdir, "no-device-driver")
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(folder, "libcuda.c")
    with open(source, "w") as handle:
        handle.writelines(f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n"
                          for name in driver_symbols(package_dir))
    status, _ = run_command([cc, "-shared", "-fPIC", "-o", os.path.join(folder, "libcuda.so.1"), source])
    return folder if status == 0 else None


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][-300:]


def import_module(module: str, workdir: str) -> tuple:
    """(answer or None, error tail, how): import in a fresh process; without a GPU, retry a module whose
    native code links libcuda.so.1 directly against a no-device driver."""
    answer, status, tail = run_python_json(_IMPORT, module)
    if answer is not None and status == 0:
        return answer, None, "plain"
    top = package_dir(module.split(".")[0]) or ""
    if "libcuda.so.1" not in tail or gpu_visible() or not top:
        return None, last_line(tail) or f"exit {status}", "plain"
    stub = build_no_device_driver(top, workdir)
    if stub is None:
        return None, last_line(tail) + " (and no C compiler to build a no-device driver stand-in)", "plain"
    env = dict(os.environ, LD_LIBRARY_PATH=stub + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
    answer, status, tail = run_python_json(_IMPORT, module, env=env)
    if answer is not None and status == 0:
        return answer, None, "no-device driver"
    return None, last_line(tail) or f"exit {status}", "no-device driver"


def check_imports(expect: dict, workdir: str | None = None) -> dict:
    modules = expect.get("imports") or []
    if not modules:
        return make_check("imports", SKIP, "the recipe asks for no import checks")
    imported, failed, stubbed = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="probe-imports-", dir=workdir) as scratch:
        for module in modules:
            answer, error, how = import_module(module, scratch)
            if answer is None:
                failed[module] = error
            else:
                imported[module] = answer
            if how == "no-device driver":
                stubbed.append(module)
    if failed:
        return make_check("imports", FAIL, "; ".join(f"{m}: {e}" for m, e in failed.items()),
                          imported=imported, failed=failed, no_device_driver=stubbed)
    summary = ", ".join(f"{m} {a['version'] or ''} ({a['seconds']} s)".replace("  ", " ")
                        for m, a in imported.items())
    note = (f"; {', '.join(stubbed)} links libcuda.so.1 and was imported against a no-device driver "
            "stand-in (no GPU here)") if stubbed else ""
    return make_check("imports", PASS, f"imported without a GPU: {summary}{note}", imported=imported,
                      no_device_driver=stubbed)


def check_torch_cuda(expect: dict) -> dict:
    wanted = expect.get("torch_cuda")
    if not wanted:
        return make_check("torch-cuda", SKIP, "no torch in the lock")
    answer, status, tail = run_python_json(_TORCH_CUDA)
    if answer is None:
        return make_check("torch-cuda", FAIL, f"torch did not import: {last_line(tail)}")
    if major_minor(answer.get("cuda")) != major_minor(wanted):
        return make_check("torch-cuda", FAIL, f"torch {answer.get('torch')} is built for CUDA "
                          f"{answer.get('cuda')}, the recipe's toolkit is {wanted}", **answer)
    return make_check("torch-cuda", PASS, f"torch {answer['torch']} built for CUDA {answer['cuda']}", **answer)


def check_flashinfer_dynamo(expect: dict) -> dict:
    name = "flashinfer-dynamo"
    if not expect.get("flashinfer_dynamo"):
        return make_check(name, SKIP, "no FlashInfer with torch in the lock")
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_CUDA_VERSION"}
    answer, status, tail = run_python_json(_DYNAMO, env=env)
    if answer is None:
        return make_check(name, FAIL, f"the Dynamo probe did not run: {last_line(tail)}")
    if not answer.get("ok"):
        return make_check(name, FAIL, "torch.compile(fullgraph=True) of a function calling FlashInfer's "
                          f"get_cuda_version() failed: {answer.get('error')}", **answer)
    return make_check(name, PASS, "torch.compile(fullgraph=True) traces FlashInfer's get_cuda_version() "
                      "without a subprocess", **answer)


def check_gpu() -> dict:
    smi = shutil.which("nvidia-smi")
    if smi is None and not os.path.exists("/dev/nvidiactl"):
        return make_check("gpu", SKIP, "no GPU visible")
    if smi is None:
        return make_check("gpu", WARN, "/dev/nvidiactl exists but nvidia-smi is not on PATH")
    status, output = run_command([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
    if status != 0:
        return make_check("gpu", FAIL, f"nvidia-smi failed: {output.strip()[-200:]}", nvidia_smi=smi)
    gpus = [dict(zip(("name", "driver", "compute_cap"), (part.strip() for part in line.split(","))))
            for line in output.splitlines() if line.strip()]
    detail = "; ".join(f"{g.get('name')} (compute {g.get('compute_cap')}, driver {g.get('driver')})" for g in gpus)
    return make_check("gpu", PASS, detail or "nvidia-smi listed no GPU", nvidia_smi=smi, gpus=gpus)


# ---- doctor: the same probe pointed at a live host, venv or container ----
# Facts come from reading files and running small tools (nvidia-smi, nvcc/ptxas --version); no ML
# package is imported, so a full SGLang stack answers in about a second. Rules that need
# imagebuild/data/compat.toml (the driver's newest CUDA, glibc vs nvcc, GPU arch vs nvcc) run
# host-side in imagebuild/doctor.py over report["facts"]; everything here needs only these facts.

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY = {FAIL: ERROR, WARN: WARNING, PASS: INFO, SKIP: INFO}
# What makes an interpreter "hold the stack"; torch first, since it decides the CUDA version.
STACK_DISTRIBUTIONS = ("torch", "sglang", "vllm", "flashinfer-python", "sgl-deep-gemm", "sglang-kernel",
                       "triton", "cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime",
                       "nvidia-cuda-runtime-cu12")
# Distributions whose version's major.minor is a CUDA version: compat.toml [[toolchain]], mirrored
# here because images do not carry that file (a test keeps the two in step).
CUDA_VERSIONED = ("cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                  "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-nvrtc", "nvidia-nvjitlink", "nvidia-cuda-cupti",
                  "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12",
                  "nvidia-nvjitlink-cu12", "nvidia-cuda-cupti-cu12")
FLASHINFER_DISTRIBUTIONS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
# The wheel that ships each piece of the pip toolchain (FACTS.md: PyPI CUDA toolchain wheels).
PIECE_WHEEL = {"nvcc": "nvidia-cuda-nvcc", "runtime_header": "nvidia-cuda-runtime", "cccl": "nvidia-cuda-cccl",
               "crt": "nvidia-cuda-crt", "cicc": "nvidia-nvvm"}
PIECE_TEXT = {"nvcc": "bin/nvcc", "runtime_header": "include/cuda_runtime.h",
              "cccl": "CCCL headers (include/cccl; without them: nv/target: No such file)",
              "crt": "include/crt/math_functions.h", "cicc": "nvvm/bin/cicc (nvcc's front end)",
              "lib64": "lib64 (JIT builds link with -L$CUDA_HOME/lib64)",
              "libcudart": "lib64/libcudart.so (-lcudart needs the unversioned name)"}
# torch's arch list as one C string ("sm_75 sm_80 ... sm_120"); the literal `sm_` start lets the regex engine
# skip ahead, which makes scanning libtorch_python.so (34 MB) take 0.02 s instead of 1.7 s.
_ARCH_LIST = re.compile(rb"sm_[0-9]{2,3}[af]?(?: (?:sm|compute)_[0-9]{2,3}[af]?)+(?=\x00)")
_NVCC_IN_SCRIPT = re.compile(r"(/[^\s'\"]+)/bin/nvcc\b")
_SOURCE_MARKERS = {  # a consumer's CUDA lookup, as read in its source; checked so a changed rule shows
    "torch": ("torch/utils/cpp_extension.py", ("def _find_cuda_home", "CUDA_HOME", 'which("nvcc")')),
    "flashinfer": ("flashinfer/jit/cpp_ext.py", ("def get_cuda_path", "CUDA_HOME", '"which", "nvcc"')),
    "deep_gemm": ("deep_gemm/cuda_helpers.py", ("def find_cuda_home",)),
}


def make_finding(name: str, status: str, detail: str, fix: str = "", **evidence) -> dict:
    """A doctor finding: a probe check plus its severity and the exact fix (empty when none is needed)."""
    finding = make_check(name, status, detail, **evidence)
    finding.update(severity=SEVERITY[status], fix=" ".join(fix.split()))
    return finding


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


def parse_dist_dir(entry: str) -> tuple | None:
    """(canonical name, version) from `sgl_deep_gemm-0.2.3.post2.dist-info`; None for anything else."""
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix) and "-" in entry:
            name, _, version = entry[:-len(suffix)].rpartition("-")
            if name and version:
                return canonical_name(name), version
    return None


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


def cuda_version_is_patched(source) -> dict:
    """Whether FlashInfer's get_cuda_version() answers without a subprocess when torch knows its CUDA.
    Unpatched (0.7.2), its first statement runs `nvcc --version`, which torch Dynamo cannot trace."""
    try:
        tree = ast.parse(source) if isinstance(source, str) else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    function = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                     and node.name == "get_cuda_version"), None) if tree else None
    if function is None:
        return {"found": False, "patched": None, "line": None}

    def mentions(node, words) -> bool:
        text = ast.dump(node)
        return any(word in text for word in words)

    for statement in function.body:
        spawns = mentions(statement, ("'subprocess'", "'check_output'", "'Popen'"))
        answers_early = mentions(statement, ("'FLASHINFER_CUDA_VERSION'", "attr='cuda'")) and any(
            isinstance(node, ast.Return) for node in ast.walk(statement))
        if answers_early and not spawns:
            return {"found": True, "patched": True, "line": statement.lineno}
        if spawns:
            return {"found": True, "patched": False, "line": statement.lineno}
    return {"found": True, "patched": True, "line": function.lineno}


def glibc_version() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    match = re.search(r"([0-9]+\.[0-9]+)", text)
    return match.group(1) if match else None


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except (OSError, ValueError):
        return None


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
        else:
            facts["error"] = last_line(output) or f"nvidia-smi exited {status}"
    if facts["version"] is None and facts["file_version"]:
        facts["version"], facts["source"] = facts["file_version"], driver_file
    return facts


def interpreter_facts(executable: str) -> dict | None:
    """Prefix, version and sys.path of another interpreter (one short run of it)."""
    code = "import sys, json; print(json.dumps([sys.prefix, sys.version.split()[0], [p for p in sys.path if p]]))"
    status, output = run_command([executable, "-c", code], timeout=30)
    try:
        prefix, version, path = json.loads(output.strip().splitlines()[-1]) if status == 0 else (None,) * 3
    except (ValueError, IndexError, TypeError):
        prefix = version = path = None
    if prefix is None:
        return None
    return {"executable": executable, "real": os.path.realpath(executable), "prefix": prefix, "version": version,
            "stack": stack_in(distributions_in(path))}


def distributions_in(directories) -> dict:
    """Canonical name -> version of every distribution in these folders, first one wins (import order);
    from the .dist-info folder names alone, which is fast enough for a 200-package stack."""
    found = {}
    for directory in directories:
        try:
            entries = sorted(os.listdir(directory))
        except (OSError, TypeError):
            continue
        for entry in entries:
            parsed = parse_dist_dir(entry)
            if parsed and parsed[0] not in found:
                found[parsed[0]] = parsed[1]
    return found


def stack_in(distributions: dict) -> dict:
    return {name: distributions[name] for name in STACK_DISTRIBUTIONS if name in distributions}


def stack_summary(stack: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in stack.items()) or "nothing of the ML stack"


def is_environment(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg")) or os.path.isdir(os.path.join(path, "conda-meta"))


def venv_candidates(cwd: str, home: str) -> list:
    """Environments where people keep them: $VIRTUAL_ENV, $CONDA_PREFIX, cwd and its parents (and their
    .venv, venv, env), ~/, its folders and ~/.virtualenvs/*, /opt/*."""
    candidates = [os.environ.get("VIRTUAL_ENV"), os.environ.get("CONDA_PREFIX")]
    folder = os.path.abspath(cwd)
    while True:
        candidates += [folder] + [os.path.join(folder, name) for name in (".venv", "venv", "env")]
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for root, hidden in ((home, False), (os.path.join(home or "/nonexistent", ".virtualenvs"), True), ("/opt", True)):
        try:
            children = sorted(os.listdir(root))[:500] if root else []
        except OSError:
            children = []
        for child in children:
            if hidden or not child.startswith(".") or child == ".venv":
                base = os.path.join(root, child)
                candidates += [base, os.path.join(base, ".venv"), os.path.join(base, "venv")]
    seen, found = set(), []
    for path in candidates:
        if path and os.path.isdir(path) and is_environment(path):
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                found.append(os.path.normpath(path))
    return found


def venv_site_dirs(prefix: str) -> list:
    return sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")))


def venv_facts(prefix: str) -> dict:
    config = read_text(os.path.join(prefix, "pyvenv.cfg")) or ""
    match = re.search(r"^version(?:_info)?\s*=\s*([0-9.]+)", config, re.MULTILINE)
    dirs = venv_site_dirs(prefix)
    return {"path": prefix, "python": os.path.join(prefix, "bin", "python"),
            "version": match.group(1) if match else None, "site_dirs": dirs, "stack": stack_in(distributions_in(dirs))}


def choose_stack(running: dict, venvs: list) -> dict:
    """The interpreter whose packages the rest of the diagnosis inspects: the running one when it holds
    the stack, else the nearby environment holding the most of it (torch first)."""
    if running["stack"]:
        return dict(running, how="the interpreter running the probe")
    holders = [venv for venv in venvs if venv["stack"] and not same_path(venv["path"], running["prefix"])]
    best = max(holders, key=lambda venv: ("torch" in venv["stack"], len(venv["stack"])), default=None)
    if best is None:
        return dict(running, how="the interpreter running the probe (no stack found)")
    return {"executable": best["python"], "prefix": best["path"], "version": best["version"],
            "dirs": best["site_dirs"], "stack": best["stack"], "distributions": distributions_in(best["site_dirs"]),
            "how": "an environment nearby, not the interpreter running the probe"}


def locate_package(name: str, dirs: list) -> str | None:
    """A top-level package's folder in these directories, found without importing it."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, list(dirs))
    except (ImportError, ValueError, OSError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def shell_fix(commands, notes=()) -> str:
    """Commands to paste into a shell, one after the other, with notes as a trailing comment."""
    fix = " && ".join(dict.fromkeys(command for command in commands if command))
    notes = "; ".join(dict.fromkeys(note for note in notes if note))
    return f"{fix}  # {notes}" if fix and notes else fix or notes


def install_command(facts: dict, *requirements: str) -> str:
    """How to add requirements to the stack's environment: uv when it is on PATH or the environment has
    no pip (uv makes venvs without one), else that environment's pip."""
    python, wanted = facts["stack"]["executable"], " ".join(f"'{requirement}'" for requirement in requirements)
    if shutil.which("uv") or not locate_package("pip", facts["stack"]["dirs"]):
        return f"uv pip install --python {python} {wanted}"
    return f"{python} -m pip install {wanted}"


# ---- doctor: CUDA toolkits and who finds which ----

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


def pip_toolchain_dirs(site_dirs: list) -> list:
    return [path for site in site_dirs for path in sorted(glob.glob(os.path.join(site, "nvidia", "cu[0-9]*")))
            if os.path.isdir(path)]


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


def find_toolkits(site_dirs: list) -> list:
    """Every CUDA toolkit folder in sight, once each (by real path), with every way it was found."""
    nvcc = shutil.which("nvcc")
    candidates = [(os.environ.get("CUDA_HOME"), "$CUDA_HOME"), (os.environ.get("CUDA_PATH"), "$CUDA_PATH")]
    if nvcc:
        candidates.append((os.path.dirname(os.path.dirname(nvcc)), f"`which nvcc` = {nvcc}"))
        real_nvcc = os.path.realpath(nvcc)
        if real_nvcc != nvcc:
            candidates.append((os.path.dirname(os.path.dirname(real_nvcc)), f"{nvcc} links to {real_nvcc}"))
        script = nvcc_script_target(nvcc)
        if script:
            candidates.append((script, f"{nvcc} is a script that runs {script}/bin/nvcc"))
    candidates += [(path, "/usr/local/cuda*") for path in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"))]
    candidates += [(path, "pip toolchain in site-packages") for path in pip_toolchain_dirs(site_dirs)]
    by_real = {}
    for home, how in candidates:
        if not home or not os.path.isdir(home):
            continue
        real = os.path.realpath(home)
        if real in by_real:
            by_real[real]["found_as"].append({"path": home, "how": how})
        else:
            by_real[real] = dict(inspect_toolkit(home), found_as=[{"path": home, "how": how}])
    return list(by_real.values())


def consumer_homes(stack: dict) -> dict:
    """Which CUDA home torch.utils.cpp_extension, deep_gemm and FlashInfer would use, each by its own rule,
    and which ptxas Triton runs."""
    dirs = stack["dirs"]
    rule_home, rule_how = cuda_home_rule()
    consumers = {}
    for name, package in (("torch", "torch"), ("deep_gemm", "deep_gemm"), ("flashinfer", "flashinfer")):
        location = locate_package(package, dirs)
        relative, markers = _SOURCE_MARKERS[name]
        rule_file = os.path.join(os.path.dirname(location), relative) if location else None
        source = read_text(rule_file) if rule_file else None
        entry = {"installed": location is not None, "package": location, "rule_file": rule_file,
                 "rule_confirmed": bool(source) and all(marker in source for marker in markers)}
        if name == "deep_gemm" and location:
            entry["home"], answered_by = deep_gemm_cuda_home(location)
            entry["how"] = f"{rule_how}; answered by {answered_by}" if entry["home"] and same_path(
                entry["home"], rule_home) else answered_by
        elif name == "flashinfer" and rule_home is None:
            entry["home"] = None
            entry["how"] = "get_cuda_path() raises: Could not find nvcc and /usr/local/cuda doesn't exist"
        else:
            entry["home"], entry["how"] = rule_home, rule_how
        consumers[name] = entry
    consumers["triton"] = triton_ptxas(locate_package("triton", dirs))
    return consumers


def triton_ptxas(package: str | None) -> dict:
    """Triton compiles with its bundled ptxas (ptxas-blackwell for sm_100 and newer, since 3.5) unless
    TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH name one that runs (triton/knobs.py env_nvidia_tool)."""
    if package is None:
        return {"installed": False}
    knobs = read_text(os.path.join(package, "knobs.py")) or ""
    tools = {}
    for tool, key in (("ptxas", "TRITON_PTXAS_PATH"), ("ptxas-blackwell", "TRITON_PTXAS_BLACKWELL_PATH")):
        if tool == "ptxas-blackwell" and "ptxas-blackwell" not in knobs:
            continue
        bundled = os.path.join(package, "backends", "nvidia", "bin", tool)
        chosen, how = None, None
        for path, origin in ((os.environ.get(key), f"${key}"), (bundled, "bundled with triton")):
            if path:
                status, output = run_command([path, "--version"], timeout=30)
                release = parse_nvcc_release(output) if status == 0 else None
                if release:
                    chosen, how = {"path": path, "release": release}, origin
                    break
        tools[tool] = {"env": key, "env_value": os.environ.get(key), "bundled": bundled,
                       "chosen": chosen, "how": how}
    return {"installed": True, "package": package, "tools": tools}


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


def jit_caches(stack: dict) -> list:
    """The JIT cache folders the installed packages would write to, from the variables they read."""
    home = os.path.expanduser("~")
    env = os.environ.get
    caches = []
    if "sgl-deep-gemm" in stack["distributions"] or locate_package("deep_gemm", stack["dirs"]):
        caches.append({"package": "deep_gemm", "path": env("DG_JIT_CACHE_DIR") or os.path.join(home, ".deep_gemm"),
                       "variable": "DG_JIT_CACHE_DIR", "default": "~/.deep_gemm"})
        sglang = locate_package("sglang", stack["dirs"])
        redirect = read_text(os.path.join(sglang, "srt", "layers", "deep_gemm_wrapper", "compile_utils.py")) \
            if sglang else None
        if redirect and 'os.environ["DG_JIT_CACHE_DIR"] = envs.SGLANG_DG_CACHE_DIR' in redirect:
            base = env("SGLANG_CACHE_DIR") or os.path.join(home, ".cache", "sglang")
            caches.append({"package": "deep_gemm under sglang",
                           "path": env("SGLANG_DG_CACHE_DIR") or os.path.join(os.path.expanduser(base), "deep_gemm"),
                           "variable": "SGLANG_DG_CACHE_DIR", "default": "$SGLANG_CACHE_DIR/deep_gemm",
                           "note": "sglang overwrites DG_JIT_CACHE_DIR with this"})
    if locate_package("flashinfer", stack["dirs"]):
        caches.append({"package": "flashinfer", "variable": "FLASHINFER_WORKSPACE_BASE",
                       "default": "~/.cache/flashinfer",
                       "path": os.path.join(env("FLASHINFER_WORKSPACE_BASE") or home, ".cache", "flashinfer")})
    if locate_package("triton", stack["dirs"]):
        caches.append({"package": "triton", "variable": "TRITON_CACHE_DIR", "default": "~/.triton/cache",
                       "path": env("TRITON_CACHE_DIR") or os.path.join(env("TRITON_HOME") or home, ".triton", "cache")})
    for cache in caches:
        cache["writable"], cache["why"] = writable(cache["path"])
    return caches


def writable(path: str) -> tuple:
    """(True, how) when a file can be made there, or in the folder that would be created there."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return False, f"{folder} is a file, so {path} cannot be created"
    try:  # a real write: root passes every permission test, but not a read-only file system
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return False, f"cannot write in {folder}: {error.strerror or error}"
    return True, "exists and is writable" if folder == os.path.abspath(path) else f"can be created in {folder}"


def gather_facts(driver_file: str = DRIVER_VERSION_FILE) -> dict:
    """Everything the doctor findings look at; the stack is the running interpreter's or a venv nearby."""
    running = {"executable": sys.executable, "prefix": sys.prefix, "version": platform.python_version(),
               "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
               "dirs": [path for path in sys.path if path and os.path.isdir(path)]}
    running["distributions"] = distributions_in(running["dirs"])
    running["stack"] = stack_in(running["distributions"])
    venvs = [venv_facts(path) for path in venv_candidates(os.getcwd(), os.path.expanduser("~"))]
    stack = choose_stack(running, venvs)
    on_path = {}
    for command in ("python3", "python"):
        found = shutil.which(command)
        on_path[command] = interpreter_facts(found) if found else None
    return {"driver": read_driver(driver_file), "glibc": glibc_version(), "running": running, "venvs": venvs,
            "stack": stack, "on_path": on_path, "toolkits": find_toolkits(stack["dirs"]),
            "consumers": consumer_homes(stack), "torch": torch_facts(stack),
            "deep_gemm_jit": deep_gemm_jit_facts(stack), "caches": jit_caches(stack),
            "flashinfer": flashinfer_facts(stack)}


def deep_gemm_jit_facts(stack: dict) -> dict:
    package = locate_package("deep_gemm", stack["dirs"])
    library = os.path.join(package, "_C.so") if package else None
    try:
        with open(library, "rb") as handle:
            jit = select_jit_flags(scan_strings(handle.read()))
    except (OSError, TypeError):
        return {"installed": package is not None, "library": library, "gencode": None, "arch": None}
    return {"installed": True, "library": library, "gencode": jit["gencode"], "arch": jit["arch"]}


def flashinfer_facts(stack: dict) -> dict:
    package = locate_package("flashinfer", stack["dirs"])
    if package is None:
        return {"installed": False}
    source_file = os.path.join(package, "jit", "cpp_ext.py")
    dists = stack["distributions"]
    versions = {name: dists[name] for name in FLASHINFER_DISTRIBUTIONS if name in dists}
    return dict(cuda_version_is_patched(read_text(source_file)), installed=True, source=source_file,
                versions=versions, arch_list=os.environ.get("FLASHINFER_CUDA_ARCH_LIST"))


# ---- doctor: findings over the facts; each says what is wrong, the evidence and the exact fix ----

CONSUMER_LABELS = {"torch": "torch.utils.cpp_extension", "deep_gemm": "deep_gemm", "flashinfer": "FlashInfer"}


def reference_cuda(facts: dict) -> str | None:
    """The CUDA everything should agree on: torch's build, else the runtime wheel's, else the pip nvcc's."""
    dists = facts["stack"]["distributions"]
    for candidate in (facts["torch"].get("cuda"), dists.get("nvidia-cuda-runtime"), dists.get("cuda-toolkit"),
                      dists.get("nvidia-cuda-runtime-cu12"), dists.get("nvidia-cuda-nvcc")):
        if major_minor(candidate):
            return major_minor(candidate)
    return None


def is_pip_toolchain(home) -> bool:
    return bool(home) and re.search(r"/site-packages/nvidia/cu[0-9]+/?$", home) is not None


def toolkit_at(facts: dict, home) -> dict:
    real = os.path.realpath(home) if home else None
    found = next((toolkit for toolkit in facts["toolkits"] if toolkit["real"] == real), None)
    return found or inspect_toolkit(home or "")


def best_toolkit(facts: dict) -> dict | None:
    """A complete toolkit to point CUDA_HOME at: torch's CUDA first, then the stack's own pip toolchain."""
    wanted = reference_cuda(facts)
    site_dirs = [os.path.realpath(path) for path in facts["stack"]["dirs"]]
    complete = [toolkit for toolkit in facts["toolkits"] if not missing_pieces(toolkit)]
    return max(complete, default=None, key=lambda toolkit: (
        toolkit["release"] == wanted, any(toolkit["real"].startswith(site + os.sep) for site in site_dirs)))


def toolkit_fix(facts: dict, toolkit: dict | None) -> str:
    """Complete this toolkit if it is the stack's pip toolchain, else point CUDA_HOME at a complete one,
    else install the toolchain into the stack."""
    cuda = reference_cuda(facts) or (toolkit or {}).get("release")
    if toolkit and is_pip_toolchain(toolkit["home"]):
        wheels = [PIECE_WHEEL[piece] + (f"=={cuda}.*" if cuda else "")
                  for piece in missing_pieces(toolkit) if piece in PIECE_WHEEL]
        steps = [install_command(facts, *wheels)] if wheels else []
        if "lib64" in missing_pieces(toolkit):
            steps.append(f"ln -s lib {toolkit['home']}/lib64")
        if "libcudart" in missing_pieces(toolkit):
            soname = (toolkit["libcudart_sonames"] or ["libcudart.so." + (cuda or "13").split(".")[0]])[0]
            steps.append(f"ln -s {soname} {toolkit['home']}/lib/libcudart.so")
        if steps:
            return shell_fix(steps, ["in a recipe: require cuda-toolkit with the extras [nvcc,cccl,crt,nvvm,cudart]"]
                             if wheels else [])
    best = best_toolkit(facts)
    if best:
        return f"export CUDA_HOME={best['found_as'][0]['path']}"
    if cuda and cuda.startswith("12."):
        return (f"install NVIDIA's CUDA {cuda} toolkit (pip has no CUDA 12 nvcc) and export "
                f"CUDA_HOME=/usr/local/cuda-{cuda}")
    sites = facts["stack"]["dirs"]
    site = next((path for path in sites if path.endswith("site-packages")), sites[0] if sites else "<site-packages>")
    major = (cuda or "13.0").split(".")[0]
    pin = f"=={cuda}.*" if cuda else ""
    return shell_fix([install_command(facts, f"cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]{pin}"),
                      f"export CUDA_HOME={site}/nvidia/cu{major}"])


def finding_driver(facts: dict) -> dict:
    driver = facts["driver"]
    file_version, version = driver["file_version"], driver["version"]
    if driver["error"]:
        mismatch = "mismatch" in driver["error"].lower()
        return make_finding(
            "driver", FAIL, f"nvidia-smi failed: {driver['error']}"
            + (f"; the loaded kernel module is driver {file_version}" if file_version else ""),
            "reboot (or unload and reload the nvidia kernel modules) so the running driver matches its "
            "libraries" if mismatch else "load the NVIDIA kernel module (`lsmod | grep nvidia`); in a "
            "container, pass the GPUs in (`docker run --gpus all`)", **driver)
    if version is None:
        return make_finding("driver", SKIP, f"no NVIDIA driver visible (no nvidia-smi on PATH, no "
                            f"{driver['version_file']}): building needs none, running on a GPU does", **driver)
    if file_version and driver["source"] == "nvidia-smi" and file_version != version:
        return make_finding("driver", FAIL, f"nvidia-smi reports driver {version}, the loaded kernel module "
                            f"is {file_version}", "reboot so the kernel module and the driver libraries match",
                            **driver)
    if not driver["gpus"]:
        return make_finding("driver", WARN, f"driver {version} (from {driver['source']}); nvidia-smi is not on "
                            "PATH, so the GPUs and their compute capability are unknown",
                            "put nvidia-smi on PATH (in a container: `docker run --gpus all` mounts it)", **driver)
    gpus = "; ".join(f"{gpu['name']} (compute {gpu['compute_cap'] or 'capability unknown'})" for gpu in driver["gpus"])
    return make_finding("driver", PASS, f"driver {version} (nvidia-smi); {gpus}", **driver)


def finding_python(facts: dict) -> dict:
    running, stack, venvs, on_path = facts["running"], facts["stack"], facts["venvs"], facts["on_path"]
    holders = [f"{venv['path']} ({stack_summary(venv['stack'])})" for venv in venvs if venv["stack"]]
    evidence = {"running": {key: running[key] for key in ("executable", "prefix", "version", "in_venv", "stack")},
                "on_path": on_path, "stack_from": stack["how"],
                "venvs": [{key: venv[key] for key in ("path", "version", "stack")} for venv in venvs]}
    if not stack["stack"]:
        nearby = ", ".join(venv["path"] for venv in venvs) or "none"
        return make_finding("python", SKIP, f"no ML stack ({', '.join(STACK_DISTRIBUTIONS[:5])}, CUDA wheels) in "
                            f"{running['executable']} or the environments nearby ({nearby})", **evidence)
    if stack["how"].startswith("an environment nearby"):
        prefix = stack["prefix"]
        return make_finding(
            "python", FAIL, f"{running['executable']} (prefix {running['prefix']}) has no "
            f"{', '.join(name for name in STACK_DISTRIBUTIONS[:4])}: the stack ({stack_summary(stack['stack'])}) is in "
            f"{prefix}, which is not this interpreter (a virtual environment not activated); the rest of this "
            f"report inspects {prefix}" + (f"; other environments with the stack: {'; '.join(holders[1:])}"
                                          if len(holders) > 1 else ""),
            shell_fix([f"source {prefix}/bin/activate"], [f"or run {prefix}/bin/python; imagebuild doctor --python "
                                                          f"{prefix}/bin/python"]), **evidence)
    problems = []
    for command, found in on_path.items():
        if found is None:
            problems += [f"no `{command}` on PATH"] if command == "python3" else []
        elif not same_path(found["prefix"], stack["prefix"]):
            problems.append(f"`{command}` on PATH is {found['executable']} (prefix {found['prefix']}, "
                            f"{stack_summary(found['stack'])})")
    detail = f"{stack['executable']} holds the stack ({stack_summary(stack['stack'])})"
    if problems:
        return make_finding("python", WARN, f"{detail}; but {'; '.join(problems)}: scripts that call "
                            f"{'them' if len(problems) > 1 else 'it'} miss the stack",
                            shell_fix([f"source {stack['prefix']}/bin/activate"],
                                      [f"or export PATH={stack['prefix']}/bin:$PATH"]), **evidence)
    return make_finding("python", PASS, f"{detail}; python3 and python on PATH are it", **evidence)


def describe_toolkit(toolkit: dict) -> str:
    missing = missing_pieces(toolkit)
    release = f"nvcc {toolkit['release']}" if toolkit["release"] else "no working nvcc"
    state = "complete" if not missing else "lacks " + ", ".join(PIECE_TEXT[piece].split(" (")[0] for piece in missing)
    found = "; ".join(dict.fromkeys(entry["how"] for entry in toolkit["found_as"]))
    return f"{toolkit['home']} ({release}, {state}; found via {found})"


def finding_toolkits(facts: dict) -> dict:
    toolkits = facts["toolkits"]
    if not toolkits:
        return make_finding("toolkits", SKIP, "no CUDA toolkit found (CUDA_HOME, CUDA_PATH, nvcc on PATH, "
                            "/usr/local/cuda*, site-packages/nvidia/cu*)", toolkits=[])
    status = PASS if any(not missing_pieces(toolkit) for toolkit in toolkits) else WARN
    fix = "" if status == PASS else toolkit_fix(facts, next(
        (toolkit for toolkit in toolkits if is_pip_toolchain(toolkit["home"])), None))
    return make_finding("toolkits", status, f"{len(toolkits)} found: " + "; ".join(map(describe_toolkit, toolkits)),
                        fix, toolkits=toolkits)


def finding_consumer(facts: dict, name: str) -> dict:
    entry = facts["consumers"][name]
    label, check = CONSUMER_LABELS[name], f"cuda-home:{name}"
    if not entry["installed"]:
        return make_finding(check, SKIP, f"{label} is not installed", **entry)
    home, how = entry["home"], entry["how"]
    note = "" if entry["rule_confirmed"] else \
        f" (its lookup is assumed: {entry['rule_file']} does not read as expected)"
    if home is None:
        return make_finding(check, FAIL, f"{label} finds no CUDA toolkit: {how}{note}", toolkit_fix(facts, None),
                            **entry)
    toolkit = toolkit_at(facts, home)
    missing = missing_pieces(toolkit)
    if not os.path.isdir(home):
        return make_finding(check, FAIL, f"{label} uses {home} (from {how}), which does not exist{note}",
                            toolkit_fix(facts, None), toolkit=toolkit, **entry)
    if missing:
        script = f"; its bin/nvcc is a script running {toolkit['nvcc_script']}/bin/nvcc, so nvcc works but " \
                 f"-I{home}/include and -L{home}/lib64 do not" if toolkit["nvcc_script"] else ""
        return make_finding(check, FAIL, f"{label} uses {home} (from {how}), which lacks "
                            + ", ".join(PIECE_TEXT[piece] for piece in missing) + script + note,
                            toolkit_fix(facts, toolkit), toolkit=toolkit, **entry)
    return make_finding(check, PASS, f"{label} uses {home} (from {how}): nvcc {toolkit['release']}, headers, "
                        f"CCCL, lib64 and libcudart.so all there{note}", toolkit=toolkit, **entry)


def finding_cuda_home_rule(facts: dict) -> dict:
    """With none of the consumers installed: what any of them would find, as a warning at most."""
    home, how = cuda_home_rule()
    if home is None:
        return make_finding("cuda-home", SKIP, f"the usual CUDA lookup (torch, deep_gemm, FlashInfer) finds {how}")
    toolkit = toolkit_at(facts, home)
    missing = missing_pieces(toolkit)
    if not missing:
        return make_finding("cuda-home", PASS, f"the usual CUDA lookup (torch, deep_gemm, FlashInfer) finds "
                            f"{home} (from {how}), nvcc {toolkit['release']}, complete", toolkit=toolkit)
    script = f"; bin/nvcc there is a script running {toolkit['nvcc_script']}/bin/nvcc" if toolkit["nvcc_script"] else ""
    return make_finding("cuda-home", WARN, f"the usual CUDA lookup (torch, deep_gemm, FlashInfer) would use {home} "
                        f"(from {how}), which lacks " + ", ".join(PIECE_TEXT[piece] for piece in missing) + script,
                        toolkit_fix(facts, toolkit), toolkit=toolkit)


def finding_triton(facts: dict) -> dict:
    triton = facts["consumers"]["triton"]
    if not triton["installed"]:
        return make_finding("triton-ptxas", SKIP, "triton is not installed", **triton)
    problems, parts, fixes = [], [], []
    for tool, entry in triton["tools"].items():
        if entry["chosen"] is None:
            problems.append(f"no runnable {tool} ({entry['bundled']} or ${entry['env']}): Triton raises "
                            f"'Cannot find {tool}'")
            fixes.append(f"export {entry['env']}=<a CUDA toolkit>/bin/ptxas, or reinstall triton")
            continue
        parts.append(f"{tool} {entry['chosen']['release']} ({entry['how']}: {entry['chosen']['path']})")
        if entry["env_value"] and entry["how"] != f"${entry['env']}":
            problems.append(f"${entry['env']}={entry['env_value']} does not run, so Triton falls back to {tool} "
                            "bundled with it")
            fixes.append(f"unset {entry['env']} or point it at a working ptxas")
    used = ""
    caps = [gpu["compute_cap"] for gpu in facts["driver"]["gpus"] if gpu["compute_cap"]]
    if caps and "ptxas-blackwell" in triton["tools"]:
        major = arch_number(caps[0])[0]
        used = f"; for compute {caps[0]} it runs {'ptxas-blackwell' if major >= 10 else 'ptxas'}"
    if any(problem.startswith("no runnable") for problem in problems):
        return make_finding("triton-ptxas", FAIL, "; ".join(problems), "; ".join(fixes), **triton)
    if problems:
        return make_finding("triton-ptxas", WARN, "; ".join(problems + parts), "; ".join(fixes), **triton)
    return make_finding("triton-ptxas", PASS, "Triton compiles with " + ", ".join(parts) + used, **triton)


def finding_cuda_versions(facts: dict) -> dict:
    """torch's CUDA, the CUDA wheels and the nvcc each consumer finds must be one CUDA major.minor."""
    torch, dists = facts["torch"], facts["stack"]["distributions"]
    reference = reference_cuda(facts)
    wheels = {name: dists[name] for name in CUDA_VERSIONED if name in dists}
    nvccs, homes = {}, {}  # nvcc release -> who runs it, and from which homes
    for name in ("torch", "deep_gemm", "flashinfer"):
        entry = facts["consumers"][name]
        if entry["installed"] and entry["home"]:
            release = toolkit_at(facts, entry["home"])["release"]
            nvccs.setdefault(release, []).append(CONSUMER_LABELS[name])
            homes.setdefault(release, []).append(entry["home"])
    evidence = {"torch": {key: torch.get(key) for key in ("version", "cuda")}, "reference": reference,
                "wheels": wheels, "nvcc": {str(release): users for release, users in nvccs.items()}}
    problems, fixes, notes = [], [], []
    if torch.get("installed") and torch.get("cuda") is None and (wheels or facts["driver"]["gpus"]):
        tag = "cu" + reference.replace(".", "") if reference else "cu130"
        problems.append(f"torch {torch.get('version')} is a CPU-only build (torch.version.cuda is None) in an "
                        "environment with " + (f"CUDA {reference}" if reference else "GPUs"))
        fixes.append(install_command(facts, f"torch=={(torch.get('version') or '').split('+')[0]}")
                     + f" --reinstall-package torch --index-url https://download.pytorch.org/whl/{tag}")
    if reference is None and not problems:
        return make_finding("cuda-versions", SKIP, "no torch and no CUDA wheels: nothing to compare", **evidence)
    against = f"torch is built for CUDA {reference}" if torch.get("cuda") else f"the CUDA runtime is {reference}"
    skewed = [name for name, version in wheels.items() if reference and major_minor(version) != reference]
    if skewed:
        problems.append(", ".join(f"{name} {wheels[name]}" for name in skewed)
                        + f" {'is' if len(skewed) == 1 else 'are'} not CUDA {reference}: {against}")
        pins = [f"{name}=={reference}.*" for name in skewed]
        fixes.append(install_command(facts, *pins))
        notes.append("in a recipe: add " + ", ".join(f'"{pin}"' for pin in pins) + " to [python].constraints")
    for release, users in nvccs.items():
        if not release or not reference or release == reference:
            continue
        major = release.split(".")[0] != reference.split(".")[0]
        problems.append(f"nvcc {release} (used by {', '.join(users)}) is not CUDA {reference}"
                        + (": torch.utils.cpp_extension refuses a different CUDA major" if major else ""))
        if all(map(is_pip_toolchain, homes[release])) and "nvidia-cuda-nvcc" in skewed:
            continue  # the wheel pins above bring this nvcc to the reference
        matching = next((toolkit for toolkit in facts["toolkits"]
                         if toolkit["release"] == reference and not missing_pieces(toolkit)), None)
        fixes.append(f"export CUDA_HOME={matching['found_as'][0]['path']}" if matching
                     else toolkit_fix(dict(facts, toolkits=[]), None))
    if problems:
        return make_finding("cuda-versions", FAIL, "; ".join(problems), shell_fix(fixes, notes), **evidence)
    parts = [f"torch {torch.get('version')} is CUDA {torch.get('cuda')}"] if torch.get("cuda") else []
    parts += [f"nvcc {release} ({', '.join(users)})" for release, users in nvccs.items() if release]
    parts += [f"{len(wheels)} CUDA wheels at {reference}"] if wheels else []
    return make_finding("cuda-versions", PASS, f"all CUDA {reference}: " + ", ".join(parts), **evidence)


def finding_gpu_arch(facts: dict) -> dict:
    caps = sorted({gpu["compute_cap"] for gpu in facts["driver"]["gpus"]} - {None})
    torch, deep_gemm, flashinfer = facts["torch"], facts["deep_gemm_jit"], facts["flashinfer"]
    evidence = {"compute_caps": caps, "torch_archs": torch.get("archs"), "torch_archs_from": torch.get("archs_from"),
                "deep_gemm_gencode": deep_gemm.get("gencode"), "flashinfer_arch_list": flashinfer.get("arch_list")}
    if not caps:
        return make_finding("gpu-arch", SKIP, "no GPU compute capability known (needs nvidia-smi)", **evidence)
    problems, fixes, parts = [], [], []
    for cap in caps:
        sm = "sm_" + cap.replace(".", "")
        if torch.get("archs"):
            if runs_on(torch["archs"], cap):
                parts.append(f"torch has kernels for {sm}")
            else:
                problems.append(f"torch {torch.get('version')} carries {' '.join(torch['archs'])}: "
                                f"nothing runs on {sm}")
                fixes.append(f"install a torch whose arch list has {sm} (torch 2.14.1 from PyPI carries "
                             "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120)")
        if deep_gemm.get("installed") and arch_number(cap)[0] == 12:
            if deep_gemm.get("arch") and runs_on(["sm_" + deep_gemm["arch"]], cap):
                parts.append(f"deep_gemm JITs for sm_{deep_gemm['arch']}")
            else:
                problems.append(f"deep_gemm's JIT ({deep_gemm.get('library')}) has no SM120 gencode for {sm}")
                fixes.append("install sgl-deep-gemm (its JIT compiles for compute_120f), not upstream deep_gemm")
        if flashinfer.get("arch_list"):
            targets = flashinfer["arch_list"].split()
            if runs_on(targets, cap) or runs_on([target.rstrip("af") for target in targets], cap):
                parts.append(f"FLASHINFER_CUDA_ARCH_LIST={flashinfer['arch_list']} covers {sm}")
            else:
                problems.append(f"FLASHINFER_CUDA_ARCH_LIST={flashinfer['arch_list']} does not cover {sm}: "
                                "FlashInfer JIT-compiles kernels this GPU cannot run")
                fixes.append(f"export FLASHINFER_CUDA_ARCH_LIST={cap}")
    if problems:
        return make_finding("gpu-arch", FAIL, "; ".join(problems), "; ".join(dict.fromkeys(fixes)), **evidence)
    return make_finding("gpu-arch", PASS, f"compute {', '.join(caps)}: " + ("; ".join(parts) or "nothing to compare"),
                        **evidence)


def finding_flashinfer(facts: dict) -> dict:
    flashinfer = facts["flashinfer"]
    if not flashinfer["installed"]:
        return make_finding("flashinfer-cuda-version", SKIP, "FlashInfer is not installed", **flashinfer)
    versions = flashinfer["versions"]
    if len(set(versions.values())) > 1:
        wanted = versions.get("flashinfer-python")
        return make_finding("flashinfer-cuda-version", FAIL, "FlashInfer's packages must share one version: "
                            + ", ".join(f"{name} {version}" for name, version in versions.items()),
                            install_command(facts, *(f"{name}=={wanted}" for name, version in versions.items()
                                                     if version != wanted)), **flashinfer)
    if not flashinfer["found"]:
        return make_finding("flashinfer-cuda-version", WARN, f"no get_cuda_version() in {flashinfer['source']}: "
                            "this FlashInfer is laid out differently; the Dynamo check was not made", **flashinfer)
    if flashinfer["patched"]:
        return make_finding("flashinfer-cuda-version", PASS, f"get_cuda_version() ({flashinfer['source']}:"
                            f"{flashinfer['line']}) answers from FLASHINFER_CUDA_VERSION or torch.version.cuda before "
                            "any nvcc run: safe under torch Dynamo", **flashinfer)
    status = FAIL if {"torch", "sglang"} & set(facts["stack"]["stack"]) else WARN  # without torch it cannot run
    return make_finding(
        "flashinfer-cuda-version", status, f"get_cuda_version() ({flashinfer['source']}:{flashinfer['line']}) runs "
        "`nvcc --version` first: under torch.compile (SGLang's piecewise CUDA graphs) Dynamo cannot trace the "
        "subprocess and capture fails (sglang issue 23386)",
        "patch flashinfer/jit/cpp_ext.py so get_cuda_version() returns torch.version.cuda before asking nvcc "
        "(imagebuild's recipes/patches/flashinfer-cuda-version.patch; in a recipe: [[patches]] package = "
        "\"flashinfer-python\", file = \"patches/flashinfer-cuda-version.patch\")", **flashinfer)


def finding_jit_cache(cache: dict, facts: dict) -> dict:
    name = "jit-cache:" + cache["package"].replace(" under ", "@")
    slug = cache["package"].split()[0]
    if not cache["writable"]:
        return make_finding(name, FAIL, f"{cache['package']} JIT cache {cache['path']} is not writable: "
                            f"{cache['why']} (set by ${cache['variable']}, default {cache['default']})",
                            shell_fix([f"mkdir -p /var/tmp/{slug}", f"export {cache['variable']}=/var/tmp/{slug}"],
                                      ["or a mounted volume, so compiled kernels outlive the container"]), **cache)
    if cache.get("note") and os.environ.get("DG_JIT_CACHE_DIR") and not same_path(
            os.environ["DG_JIT_CACHE_DIR"], cache["path"]):
        return make_finding(name, WARN, f"DG_JIT_CACHE_DIR={os.environ['DG_JIT_CACHE_DIR']} is ignored under sglang: "
                            f"{cache['note']} ({cache['path']})",
                            f"export SGLANG_DG_CACHE_DIR={os.environ['DG_JIT_CACHE_DIR']}", **cache)
    return make_finding(name, PASS, f"{cache['package']} JIT cache {cache['path']}: {cache['why']}", **cache)


def doctor_findings(facts: dict) -> list:
    findings = [("driver", finding_driver), ("python", finding_python), ("toolkits", finding_toolkits)]
    installed = [name for name in CONSUMER_LABELS if facts["consumers"][name]["installed"]]
    findings += [(f"cuda-home:{name}", lambda facts, name=name: finding_consumer(facts, name)) for name in installed]
    if not installed:
        findings.append(("cuda-home", finding_cuda_home_rule))
    findings += [("triton-ptxas", finding_triton), ("cuda-versions", finding_cuda_versions),
                 ("gpu-arch", finding_gpu_arch), ("flashinfer-cuda-version", finding_flashinfer)]
    findings += [(f"jit-cache:{cache['package']}", lambda facts, cache=cache: finding_jit_cache(cache, facts))
                 for cache in facts["caches"]]
    results = []
    for name, run in findings:
        try:
            results.append(run(facts))
        except Exception as error:
            results.append(make_finding(name, FAIL, f"the probe itself failed: {type(error).__name__}: {error}"))
    return results


def public_facts(facts: dict) -> dict:
    """The facts without the full package listings (the report stays readable)."""
    keep = set(STACK_DISTRIBUTIONS + CUDA_VERSIONED + FLASHINFER_DISTRIBUTIONS)
    dists = facts["stack"]["distributions"]
    stack = dict(facts["stack"], distributions={name: version for name, version in dists.items() if name in keep})
    running = {key: value for key, value in facts["running"].items() if key != "distributions"}
    return dict(facts, stack=stack, running=running)


def run_doctor(driver_file: str = DRIVER_VERSION_FILE) -> dict:
    started = time.monotonic()
    try:
        facts = gather_facts(driver_file)
    except Exception as error:  # the report still comes back, with the reason
        report = make_report([make_finding("facts", FAIL, f"the probe could not gather facts: "
                                                         f"{type(error).__name__}: {error}")])
        return dict(report, mode="doctor", facts={})
    report = make_report(doctor_findings(facts))
    return dict(report, mode="doctor", facts=public_facts(facts), seconds=round(time.monotonic() - started, 2))


# ---- the report and the CLI ----

def host_facts() -> dict:
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        glibc = None
    return {"python": platform.python_version(), "executable": sys.executable,
            "platform": platform.platform(), "glibc": glibc}


def make_report(checks: list) -> dict:
    return {"probe": REPORT_FORMAT, "ok": all(check["status"] != FAIL for check in checks),
            "checks": checks, "host": host_facts()}


def run_probe(expect: dict, workdir: str | None = None, skip_compile: bool = False) -> dict:
    """Run every check; a check that crashes becomes a failed check, never a lost report."""
    checks = (
        ("interpreter", lambda: check_interpreter(expect)),
        ("packages", lambda: check_packages(expect)),
        ("cuda-toolchain", lambda: check_cuda_toolchain(expect)),
        ("cuda-home", lambda: check_cuda_home(expect)),
        ("deep-gemm-sm120", lambda: check_deep_gemm_sm120(expect, workdir, skip_compile)),
        ("imports", lambda: check_imports(expect, workdir)),
        ("torch-cuda", lambda: check_torch_cuda(expect)),
        ("flashinfer-dynamo", lambda: check_flashinfer_dynamo(expect)),
        ("gpu", check_gpu),
    )
    results = []
    for name, run in checks:
        try:
            results.append(run())
        except Exception as error:
            results.append(make_check(name, FAIL, f"the probe itself failed: {type(error).__name__}: {error}"))
    return make_report(results)


def load_expect(path: str) -> tuple:
    """(expectations, None) or (None, why not)."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        return None, f"cannot read expect file {path}: {type(error).__name__}: {error}"
    expect, errors = validate_expect(raw)
    return (expect, None) if expect is not None else (None, f"invalid expect file {path}: " + "; ".join(errors))


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check this image or host against its lock, or (--doctor) "
                                                 "diagnose a live host, venv or container.")
    parser.add_argument("--expect", help="expect.json written by the renderer")
    parser.add_argument("--workdir", help="scratch folder for kernel compiles (default: a temporary folder)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the deep_gemm SM120 compile")
    parser.add_argument("--doctor", action="store_true", help="diagnose driver, CUDA toolkits, interpreter and "
                        "the ML stack as they are, without an expect file")
    parser.add_argument("--driver-file", default=DRIVER_VERSION_FILE,
                        help=f"the kernel module's version file (default {DRIVER_VERSION_FILE})")
    args = parser.parse_args(argv)
    if args.doctor:
        report = run_doctor(args.driver_file)
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0 if report["ok"] else 1
    expect = NO_EXPECTATIONS
    if args.expect:
        expect, error = load_expect(args.expect)
        if error:
            report = make_report([make_check("expect", FAIL, error, path=args.expect)])
            print(json.dumps(report, indent=2, sort_keys=True))
            return 2
    report = run_probe(expect, args.workdir, args.skip_compile)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
