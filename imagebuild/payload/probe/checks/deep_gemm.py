"""The deep-gemm-sm120 check: compile deep_gemm's SM120 kernels the way its JIT would, without a GPU.

What is compiled and how comes from the installed release (deep_gemm_release.py): kernel headers and
template parameters by name, nvcc flags from its DeepJIT options. Each cubin's ELF header must name the
target SM and hold the kernel. A release this probe cannot read gives `unknown` with the reason.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time

from concurrent.futures import ThreadPoolExecutor

from .deep_gemm_release import SM120_KERNELS, NoKernel, Unreadable, jit_command, jit_generators, kernel_plan, sm_targets
from ..report import FAIL, PASS, SKIP, UNKNOWN, make_check
from ..system import deep_gemm_cuda_home, package_dir, run_command

EM_CUDA = 190  # ELF e_machine of a cubin
COMPILE_TIMEOUT_S = 600

def parse_cubin_header(data) -> dict | None:
    """Machine, flags and SM arch (e_flags bits 8-15) of a 64-bit little-endian ELF; None otherwise."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 64 or data[:4] != b"\x7fELF":
        return None
    if data[4] != 2 or data[5] != 1:
        return None
    (machine,) = struct.unpack_from("<H", data, 18)
    (flags,) = struct.unpack_from("<I", data, 48)
    return {"machine": machine, "e_flags": hex(flags), "arch": (flags >> 8) & 0xFF, "abi_version": data[8]}


def compile_kernel(plan: dict, nvcc: str, command: dict, sm: int, workdir: str) -> dict:
    """Compile one kernel instantiation to a cubin with deep_gemm's own command line; read its ELF header."""
    stem = os.path.join(workdir, f"{plan['kernel']}.sm{sm}")
    source, cubin = stem + ".cu", stem + ".cubin"
    with open(source, "w") as out:
        out.write(f"#include <{plan['header']}>\n\nusing namespace deep_gemm;\n\n"
                  f"static void __instantiate_kernel() {{\n"
                  f"    auto ptr = reinterpret_cast<void*>(&{plan['kernel']}<{', '.join(plan['template_args'])}>);\n"
                  f"}}\n")
    argv = [nvcc, source, *command["output"], cubin, *(flag["flag"] for flag in command["flags"]),
            command["include_option"], command["include"]]
    started = time.monotonic()
    status, output = run_command(argv, timeout=COMPILE_TIMEOUT_S)
    result = {key: plan[key] for key in ("kernel", "header", "template_args", "args_source", "jit_passes")}
    result.update(sm=sm, arch=command["arch"], seconds=round(time.monotonic() - started, 2), error=None)
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
    result.update(cubin_bytes=len(data), elf=header, kernel_symbol=plan["kernel"].encode() in data)
    if header is None or header["machine"] != EM_CUDA:
        result["error"] = "output is not a CUDA ELF cubin"
    elif header["arch"] != sm:
        result["error"] = f"cubin is for sm_{header['arch']}, not sm_{sm}"
    elif not result["kernel_symbol"]:
        result["error"] = "cubin does not contain the kernel"
    return result


def plan_compiles(package: str, targets: list, environ=None) -> tuple:
    """([(plan, command, sm)], {"sm_120": command without the library bytes, ...}); raises Unreadable."""
    jobs, commands = [], {}
    for sm in targets:
        command = jit_command(package, sm, environ)
        generators = jit_generators(command.pop("library"))
        commands[f"sm_{sm}"] = command
        jobs += [(kernel_plan(spec, command["include"], generators), command, sm) for spec in SM120_KERNELS]
    return jobs, commands


def deep_gemm_distribution() -> tuple:
    """(name, version) of the installed distribution whose RECORD holds deep_gemm/__init__.py, whatever
    it is called; ("?", "?") when none does."""
    import importlib.metadata
    for dist in importlib.metadata.distributions():
        try:
            if any(str(path) == "deep_gemm/__init__.py" for path in dist.files or ()):
                return dist.metadata["Name"] or "?", dist.version
        except Exception:  # a broken dist-info must not stop the probe
            continue
    return "?", "?"


def check_deep_gemm_sm120(expect: dict, workdir: str | None = None, skip_compile: bool = False) -> dict:
    name = "deep-gemm-sm120"
    if not (expect.get("deep_gemm") or {}).get("compile"):
        return make_check(name, SKIP, "no deep_gemm compile expected")
    if skip_compile:
        return make_check(name, SKIP, "--skip-compile")
    archs = (expect.get("cuda") or {}).get("archs") or []
    targets = sm_targets(archs)
    if not targets:
        return make_check(name, SKIP, f"the recipe's archs ({', '.join(archs) or 'none'}) hold no SM12x GPU: "
                                      "deep_gemm's SM120 kernels do not apply", archs=archs)
    package = package_dir("deep_gemm")
    if package is None:
        return make_check(name, FAIL, "deep_gemm is not installed")
    owner, version = deep_gemm_distribution()
    evidence = {"package": package, "distribution": owner, "version": version,
                "targets": [f"sm_{sm}" for sm in targets]}
    try:
        jobs, evidence["jit"] = plan_compiles(package, targets)
    except NoKernel as error:
        return make_check(name, FAIL, f"deep_gemm {version} at {package}: {error}", **evidence)
    except Unreadable as error:
        return make_check(name, UNKNOWN, f"cannot tell what deep_gemm {version} compiles: {error}", **evidence)
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
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            kernels = list(pool.map(lambda job: compile_kernel(job[0], nvcc, job[1], job[2], scratch), jobs))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    evidence["kernels"] = kernels
    failed = [kernel for kernel in kernels if kernel["error"]]
    if failed:
        return make_check(name, FAIL, "; ".join(f"{k['kernel']} for sm_{k['arch']}: {k['error']}" for k in failed),
                          **evidence)
    times = ", ".join(f"{k['kernel']} {k['seconds']} s" for k in kernels)
    archs_done = ", ".join(f"sm_{command['arch']}" for command in evidence["jit"].values())
    return make_check(name, PASS, f"deep_gemm {version}: compiled {len(kernels)} kernels to {archs_done} cubins "
                                  f"({times})", **evidence)
