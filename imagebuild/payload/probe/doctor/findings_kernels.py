"""Doctor findings on prebuilt kernels: will deep_gemm's JIT cache miss here, which of FlashInfer's
NVFP4 MoE kernels do the caches hold for this host's SM12x GPUs, and does the image's [aot] kernel
manifest still match what is installed?

deep_gemm's cache key and generated code come from the GPU it runs on, so no image can prebuild it
without that GPU: a cache is either warmed once on the GPU model and shipped or mounted, or SGLang's
use of deep_gemm is turned off (SGLANG_ENABLE_JIT_DEEPGEMM=0, fine for bf16 serving on SM120).
"""

from __future__ import annotations

import glob
import json
import os

from ..checks.deep_gemm import EM_CUDA, parse_cubin_header
from ..gpus import sm_number
from ..kernels.kernels_moe import family_for, moe_plan
from ..report import FAIL, PASS, SKIP, WARN, make_finding, shell_fix
from ..waste import elf_sections, fatbin_code

KERNEL_MANIFEST = "/opt/imagebuild/aot-manifest.json"
OFF = ("0", "false", "False", "no")


def read_manifest(path: str = KERNEL_MANIFEST) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def cubin_arch(path: str) -> int | None:
    """The SM a CUDA cubin was compiled for, from its ELF header (the deep_gemm tier's reader)."""
    try:
        with open(path, "rb") as handle:
            header = parse_cubin_header(handle.read(64))
    except OSError:
        return None
    return (header["arch"] or None) if header and header["machine"] == EM_CUDA else None


def cached_archs(folder: str) -> tuple[int, set]:
    """(compiled kernels, the SMs they are for) under a deep_gemm cache folder."""
    count, archs = 0, set()
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".cubin"):
                count += 1
                arch = cubin_arch(path)
                archs |= {arch} if arch else set()
            elif name.endswith(".so"):
                count += 1
                fatbin = elf_sections(path).get(".nv_fatbin")
                archs |= fatbin_code(path, *fatbin)[0] if fatbin else set()
    return count, archs


def finding_deep_gemm_cache(facts: dict, manifest: dict | None = None) -> dict:
    """Whether the first deep_gemm call on this host compiles, from the cache folder and the GPUs."""
    name = "deep-gemm-cache"
    deep_gemm = facts.get("deep_gemm_jit") or {}
    if not deep_gemm.get("installed"):
        return make_finding(name, SKIP, "deep_gemm is not installed")
    switch = os.environ.get("SGLANG_ENABLE_JIT_DEEPGEMM")
    wanted = (manifest or {}).get("deep_gemm")
    if wanted == "disabled" and switch not in OFF:
        return make_finding(name, FAIL, f"the image was built with [aot] deep_gemm = \"disabled\", but "
                            f"SGLANG_ENABLE_JIT_DEEPGEMM is {switch!r}: SGLang will JIT deep_gemm kernels on the GPU",
                            "export SGLANG_ENABLE_JIT_DEEPGEMM=0", mode=wanted, variable=switch)
    if switch in OFF:
        return make_finding(name, PASS, "SGLang's deep_gemm JIT is off (SGLANG_ENABLE_JIT_DEEPGEMM=0): "
                            "nothing to miss; FP8-block, MoE and DSA paths use other kernels", mode="disabled")
    caches = [c for c in facts.get("caches", []) if c["package"].startswith("deep_gemm")]
    cache = caches[-1] if caches else None  # under sglang, its own variable wins
    if cache is None:
        return make_finding(name, SKIP, "no deep_gemm cache folder known")
    count, archs = cached_archs(cache["path"])
    caps = sorted({gpu["compute_cap"] for gpu in (facts.get("driver") or {}).get("gpus", [])} - {None})
    evidence = {"path": cache["path"], "kernels": count, "archs": sorted(archs), "compute_caps": caps}
    fix = shell_fix(["export SGLANG_ENABLE_JIT_DEEPGEMM=0"],
                    [f"bf16 serving; or mount a cache warmed once on this GPU model at {cache['path']}"])
    if count == 0:
        return make_finding(name, WARN, f"deep_gemm's JIT cache {cache['path']} is empty: the first FP8-block, "
                            "MoE or DSA request compiles kernels on the GPU, in every fresh container", fix, **evidence)
    missing = [cap for cap in caps if int(cap.replace(".", "")) not in archs]
    if missing:
        return make_finding(name, WARN, f"deep_gemm's JIT cache {cache['path']} holds {count} kernels for "
                            f"{', '.join(f'sm_{a}' for a in sorted(archs)) or 'no readable SM'}, none for "
                            f"{', '.join('sm_' + c.replace('.', '') for c in missing)}: every call will miss and compile",
                            fix, **evidence)
    return make_finding(name, PASS, f"deep_gemm's JIT cache {cache['path']} holds {count} kernels"
                        + (f" for {', '.join(f'sm_{a}' for a in sorted(archs))}" if archs else ""), **evidence)


def _quantized_targets(facts: dict) -> tuple[list, str]:
    """The SM12x targets to report for, and whence: this host's GPUs, else FLASHINFER_CUDA_ARCH_LIST."""
    caps = sorted({gpu.get("compute_cap") for gpu in (facts.get("driver") or {}).get("gpus", [])} - {None})
    found = [cap for cap in caps if isinstance(cap, str) and cap.startswith("12.")]
    if found:
        return found, "this host's GPUs"
    listed = (facts.get("flashinfer") or {}).get("arch_list") or ""
    named = sorted({arch for arch in listed.replace(",", " ").split() if arch.startswith("12.")})
    return named, "FLASHINFER_CUDA_ARCH_LIST"


def _flashinfer_module_files(facts: dict, package: str, name: str) -> list:
    """Where FlashInfer would find module `name`: its AOT folder, and every workspace of its JIT cache."""
    places = [os.path.join(package, "data", "aot", name, f"{name}.so")]
    for cache in facts.get("caches", []):
        if cache.get("package") == "flashinfer":
            places += sorted(glob.glob(os.path.join(glob.escape(cache["path"]), "*", "*", "cached_ops", name,
                                                    f"{name}.so")))
    return [path for path in places if os.path.isfile(path)]


def finding_quantized_kernels(facts: dict) -> dict:
    """Which of FlashInfer's SM12x NVFP4 kernels (SGLang's modelopt_fp4 path: FP4 quantization, FP4 GEMM, the
    CUTLASS fused MoE) the caches hold, and for which SM: what is missing compiles on first use."""
    name = "nvfp4-kernels"
    flashinfer = facts.get("flashinfer") or {}
    if not flashinfer.get("installed"):
        return make_finding(name, SKIP, "flashinfer is not installed")
    targets, whence = _quantized_targets(facts)
    if not targets:
        return make_finding(name, SKIP, "no SM12x GPU here and FLASHINFER_CUDA_ARCH_LIST names none: the NVFP4 "
                                        "kernels this reads are SM12x's")
    package = os.path.dirname(os.path.dirname(flashinfer["source"]))
    plan = moe_plan({"archs": targets, "shapes": [{"name": "nvfp4-moe", "quantization": "nvfp4", "experts": 1}]},
                    package, family_variants=family_for((facts.get("torch") or {}).get("cuda")))
    if plan["missing"]:
        return make_finding(name, WARN, "this FlashInfer cannot serve SGLang's NVFP4 path on "
                            + ", ".join(f"{m['arch']} ({m['role']}: {m['reason']})" for m in plan["missing"]),
                            missing=plan["missing"], targets=targets)
    modules, absent = [], []
    for module in plan["modules"]:
        wanted = {sm_number(arch) for arch in module["archs"]}
        files = _flashinfer_module_files(facts, package, module["module"]) if module["module"] else []
        held = []
        for path in files:
            fatbin = elf_sections(path).get(".nv_fatbin")
            held.append({"path": path, "sass": sorted(fatbin_code(path, *fatbin)[0]) if fatbin else []})
        covered = set().union(*(set(h["sass"]) for h in held)) if held else set()
        modules.append({"role": module["role"], "module": module["module"], "generator": module["generator"],
                        "files": held, "for": sorted(wanted)})
        lacking = sorted(wanted - covered)
        if lacking or not module["module"]:
            absent.append(f"{module['role']} {module['module'] or module['generator']} for "
                          + ", ".join(f"sm_{sm}" for sm in lacking or sorted(wanted)))
    evidence = {"targets": targets, "whence": whence, "modules": modules}
    if absent:
        return make_finding(name, WARN, f"{len(absent)} of {len(modules)} NVFP4 MoE kernels for {', '.join(targets)} "
                            f"({whence}) are in no cache and compile on first use: " + "; ".join(absent),
                            "build them into the image with [aot] (docs/zero-jit.md), or keep FlashInfer's "
                            "workspace (FLASHINFER_WORKSPACE_BASE) on a volume", **evidence)
    return make_finding(name, PASS, f"the {len(modules)} NVFP4 MoE kernels for {', '.join(targets)} ({whence}) are "
                        "cached: " + "; ".join(f"{m['module']} at {m['files'][0]['path']} "
                                               f"(sm_{', sm_'.join(str(s) for s in m['files'][0]['sass'])})"
                                               for m in modules), **evidence)
