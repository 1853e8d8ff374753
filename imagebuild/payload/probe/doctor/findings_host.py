"""Doctor findings about the rest of the host: the driver, the interpreter, Triton's ptxas, the GPU
arch, FlashInfer's CUDA version lookup and the JIT caches.

Each finding says what is wrong, the evidence, and the exact fix (a command to paste).
"""

from __future__ import annotations

import os

from .consumers import triton_ptxas_for
from .environments import STACK_DISTRIBUTIONS, install_command, stack_summary
from ..gpus import arch_number, runs_on
from ..report import FAIL, PASS, SKIP, UNKNOWN, WARN, make_finding, shell_fix
from ..system import same_path


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
        used = f"; for compute {caps[0]} it runs {triton_ptxas_for(triton['tools'], caps[0])}"
    if any(problem.startswith("no runnable") for problem in problems):
        return make_finding("triton-ptxas", FAIL, "; ".join(problems), "; ".join(fixes), **triton)
    if problems:
        return make_finding("triton-ptxas", WARN, "; ".join(problems + parts), "; ".join(fixes), **triton)
    return make_finding("triton-ptxas", PASS, "Triton compiles with " + ", ".join(parts) + used, **triton)


def finding_gpu_arch(facts: dict) -> dict:
    caps = sorted({gpu["compute_cap"] for gpu in facts["driver"]["gpus"]} - {None})
    torch, deep_gemm, flashinfer = facts["torch"], facts["deep_gemm_jit"], facts["flashinfer"]
    evidence = {"compute_caps": caps, "torch_archs": torch.get("archs"), "torch_archs_from": torch.get("archs_from"),
                "deep_gemm_arch": deep_gemm.get("arch"), "flashinfer_arch_list": flashinfer.get("arch_list")}
    if not caps:
        return make_finding("gpu-arch", SKIP, "no GPU compute capability known (needs nvidia-smi)", **evidence)
    problems, fixes, parts, unread = [], [], [], []
    if torch.get("installed") and torch.get("cuda") and not torch.get("archs"):
        unread.append(f"torch {torch.get('version')}'s arch list could not be read "
                      f"(from {torch.get('package')}/lib/libtorch_python.so)")
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
                reason = deep_gemm.get("unreadable") or "no SM120 kernels"
                problems.append(f"deep_gemm's JIT ({deep_gemm.get('library')}) cannot compile for {sm}: {reason}")
                fixes.append("install sgl-deep-gemm (its JIT compiles SM120 kernels), not upstream deep_gemm")
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
    if unread:  # what carries kernels but could not be read is not a pass, whatever else was seen
        return make_finding("gpu-arch", UNKNOWN, f"compute {', '.join(caps)}: " + "; ".join(unread + parts),
                            "python -c 'import torch; print(torch.cuda.get_arch_list())' shows the list torch "
                            "carries", **evidence)
    if not parts:
        return make_finding("gpu-arch", SKIP, f"compute {', '.join(caps)}: nothing here carries GPU kernels to compare "
                            "(no CUDA torch, no deep_gemm JIT, no FLASHINFER_CUDA_ARCH_LIST)", **evidence)
    return make_finding("gpu-arch", PASS, f"compute {', '.join(caps)}: " + "; ".join(parts), **evidence)


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
