#!/usr/bin/env python3
"""Check a built image, or a live host, against what its lock expects.

Stdlib only and Python >= 3.9: the renderer copies this one file into every image as
/opt/imagebuild/probe.py and the smoke stage runs it there; `imagebuild doctor` runs the same file on
live hosts. Each check is a small function returning a plain dict; the CLI sits at the bottom.

    probe.py [--expect PATH] [--workdir DIR] [--skip-compile]

prints one JSON report and exits 0 when no check failed, 1 when one did, and 2 when the expect file
is unreadable or invalid.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder heads sys.path: keep sibling modules from shadowing the stdlib.
if __name__ == "__main__" and sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
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


def deep_gemm_cuda_home() -> tuple:
    """(home, how): the installed deep_gemm/cuda_helpers.py's answer, loaded by path, else its rule."""
    package = package_dir("deep_gemm")
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
    problems = []
    nvcc = os.path.join(home, "bin", "nvcc")
    status, output = run_command([nvcc, "--version"])
    release = parse_nvcc_release(output) if status == 0 else None
    if release is None:
        problems.append(f"{nvcc} --version did not report a release ({output.strip()[-200:]})")
    elif release != toolkit:
        problems.append(f"nvcc is release {release}, expected {toolkit}")
    include = os.path.join(home, "include")
    if not os.path.isfile(os.path.join(include, "cuda_runtime.h")):
        problems.append("include/cuda_runtime.h is missing")
    if not (os.path.isdir(os.path.join(include, "cccl")) or os.path.isdir(os.path.join(include, "nv", "target"))):
        problems.append("CCCL headers (include/cccl or include/nv/target) are missing")
    lib64, lib = os.path.join(home, "lib64"), os.path.join(home, "lib")
    if not os.path.isdir(lib64):
        problems.append("lib64 is missing (linking against CUDA looks there)")
    elif os.path.isdir(lib) and not same_path(lib64, lib):
        problems.append(f"lib64 resolves to {os.path.realpath(lib64)}, not to lib")
    if not os.path.exists(os.path.join(lib64, "libcudart.so")):
        problems.append("lib64/libcudart.so is missing (linking with -lcudart needs it)")
    installed = installed_distributions()
    versions = {name: installed[name] for name in TOOLCHAIN_DISTRIBUTIONS if name in installed}
    for name, found in versions.items():
        if any(major_minor(version) != toolkit for version in found):
            problems.append(f"{name} {'/'.join(found)} is not CUDA {toolkit}")
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
    parser = argparse.ArgumentParser(description="Check this image or host against its lock.")
    parser.add_argument("--expect", help="expect.json written by the renderer")
    parser.add_argument("--workdir", help="scratch folder for kernel compiles (default: a temporary folder)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the deep_gemm SM120 compile")
    args = parser.parse_args(argv)
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
