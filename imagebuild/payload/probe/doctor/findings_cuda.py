"""Doctor findings about CUDA toolkits: which are complete, what each consumer finds, one CUDA version.

Each finding says what is wrong, the evidence, and the exact fix (a command to paste).
"""

from __future__ import annotations

import os
import re

from .environments import install_command
from ..report import FAIL, PASS, SKIP, WARN, make_finding, shell_fix
from ..system import cuda_home_rule, major_minor
from ..checks.toolchain import inspect_toolkit, missing_pieces

# Distributions whose version's major.minor is a CUDA version: compat.toml [[toolchain]], mirrored
# here because images do not carry that file (a test keeps the two in step).
CUDA_VERSIONED = ("cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                  "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-nvrtc", "nvidia-nvjitlink", "nvidia-cuda-cupti",
                  "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12",
                  "nvidia-nvjitlink-cu12", "nvidia-cuda-cupti-cu12")
# The wheel that ships each piece of the pip toolchain (FACTS.md: PyPI CUDA toolchain wheels).
PIECE_WHEEL = {"nvcc": "nvidia-cuda-nvcc", "runtime_header": "nvidia-cuda-runtime", "cccl": "nvidia-cuda-cccl",
               "crt": "nvidia-cuda-crt", "cicc": "nvidia-nvvm"}
PIECE_TEXT = {"nvcc": "bin/nvcc", "runtime_header": "include/cuda_runtime.h",
              "cccl": "CCCL headers (include/cccl; without them: nv/target: No such file)",
              "crt": "include/crt/math_functions.h", "cicc": "nvvm/bin/cicc (nvcc's front end)",
              "lib64": "lib64 (JIT builds link with -L$CUDA_HOME/lib64)",
              "libcudart": "lib64/libcudart.so (-lcudart needs the unversioned name)"}
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
                     + f" --reinstall-package torch --index-url <the PyTorch index of {tag} builds>")
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
