"""Doctor findings on prebuilt kernels: will deep_gemm's JIT cache miss here, and does the image's
[aot] kernel manifest still match what is installed?

deep_gemm's cache key and generated code come from the GPU it runs on, so no image can prebuild it
without that GPU: a cache is either warmed once on the GPU model and shipped or mounted, or SGLang's
use of deep_gemm is turned off (SGLANG_ENABLE_JIT_DEEPGEMM=0, fine for bf16 serving on SM120).
"""

from __future__ import annotations

import json
import os

from .deep_gemm import EM_CUDA, parse_cubin_header
from .report import FAIL, PASS, SKIP, WARN, make_finding, shell_fix
from .waste import elf_sections, fatbin_code

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
