"""The deep-gemm-sm120 check: compile two SM120 kernels the way deep_gemm's JIT would.

The nvcc flags come from the string literals of the installed deep_gemm/_C.so (its JIT builds the
command line in C++), so the check follows the installed version; each cubin's ELF header must say
sm_120 and hold the kernel. No GPU is needed.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import tempfile
import time

from .report import FAIL, PASS, SKIP, make_check
from .system import deep_gemm_cuda_home, package_dir, run_command

EM_CUDA = 190  # ELF e_machine of a cubin
SM120 = 120
COMPILE_TIMEOUT_S = 600

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
