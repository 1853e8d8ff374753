"""[aot] for a quantized shape, end to end on the real engine: the kernel step compiles the FP4 module FlashInfer's
own loader asks for, and the smoke proof loads it with JIT disabled and nvcc hidden, while the same loader for a
GPU no arch declares misses.

The suite's shape is the smallest NVFP4 one SGLang serves: a dense NVFP4 model whose linear layers run on cuDNN
(--fp4-gemm-backend flashinfer_cudnn), so FlashInfer's FP4 quantization module (about 75 s on 2 cores) is its
only quantized kernel. The gallery's GLM-4.5 shape (fused MoE, FP4 GEMM and quantization) takes far longer to
compile: bench/nvfp4.py builds it, and docs/benchmarks.md holds its figures. FlashInfer 0.7.4 is the newest
release on the index (test_zero_jit_releases builds it too, so the layers below the kernel step and the attention
module come from the engine's caches); the discovery is read from 0.7.1, 0.7.2 and 0.7.4 in
tests/payload/test_kernels_moe.py. Negative control: the same image with the FP4 module's file removed fails
the proof, naming the module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.render import AOT_MANIFEST
from imagebuild.render.paths import PROBE_COMMAND
from tests.slow.test_flagship import probe_only
from tests.slow.test_zero_jit_releases import NEWEST, recipe_text

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SHAPE = """
quantization = "nvfp4"                   # a ModelOpt NVFP4 checkpoint (--quantization modelopt_fp4)
fp4_gemm_backend = "flashinfer_cudnn"    # --fp4-gemm-backend flashinfer_cudnn: the linear layers on cuDNN
"""


def write(folder: Path, slug: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"flashinfer-{slug}.toml"
    text = recipe_text(slug)
    shape_end = text.index("sampling = false\n") + len("sampling = false\n")
    recipe.write_text(text[:shape_end].replace('name = "gqa4-bf16"', 'name = "gqa4-nvfp4-cudnn"') + SHAPE
                      + text[shape_end:])
    return recipe


@pytest.fixture(scope="module")
def nvfp4(engine, tmp_path_factory):
    """The quantized one-shape recipe on FlashInfer 0.7.4, built (never reused by lock), and its zero-JIT proof run
    by the image's own probe (a run of its own, never a pass on record). The smoke test's other tiers are left out:
    below its kernel step this image is test_zero_jit_releases' newest-FlashInfer one, layer for layer, whose smoke
    test runs them all (CUDA home, torch, FlashInfer under Dynamo). Yields (the build's report, the zero-jit check)."""
    slug = NEWEST.replace(".", "-") + f"-nvfp4-{os.getpid()}"
    recipe = write(tmp_path_factory.mktemp("nvfp4") / "recipes", slug)
    report = flows.build(recipe, engine, flows.BuildOptions(tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}",
                                                            relock=True, rebuild=True, run_smoke=False))
    try:
        yield report, probe_only(engine, report.image, "zero-jit")[0]["zero-jit"]
    finally:
        engine.remove(report.image)


def fp4_artifact(manifest: dict) -> dict:
    (artifact,) = [a for a in manifest["artifacts"] if any(": fp4-quantize" in load for load in a.get("loads", []))]
    return artifact


def test_the_fp4_module_is_prebuilt_and_found_with_jit_off(engine, nvfp4):
    nvfp4, check = nvfp4
    assert not nvfp4.reused and nvfp4.smoke is None  # built here; the proof above is the probe's own run
    assert check["status"] == "pass", check["detail"]
    manifest = json.loads(engine.run(nvfp4.image, ["cat", AOT_MANIFEST]).stdout)
    assert manifest["versions"]["flashinfer-python"] == NEWEST
    names = sorted(a["name"] for a in manifest["artifacts"])
    fp4 = fp4_artifact(manifest)
    # The attention module and the FP4 one, nothing else: cuDNN's GEMM and no experts load no other module.
    assert len(names) == 2 and any(name.startswith("batch_prefill_") for name in names), names
    assert fp4["name"].startswith("fp4_quantization_") and 120 in fp4["sass"], fp4
    assert fp4["loads"] == ["gqa4-nvfp4-cudnn: fp4-quantize sm_120"]
    proof = check["evidence"]["proof"]["flashinfer"]
    loaded = {e["module"]: e for e in proof["loaded"]}
    assert loaded[fp4["name"]]["aot"] and loaded[fp4["name"]]["in_manifest"]
    assert os.path.realpath(fp4["path"]) in proof["mapped"] or fp4["path"] in proof["mapped"]
    target = proof["undeclared_target"]
    assert target["missed"] and target["error"].startswith("MissingJITCacheError"), target
    assert target["module"] and target["module"] != fp4["name"]
    assert "an undeclared target missed" in check["detail"]
    assert nvfp4.kernels["compiled"] + nvfp4.kernels["reused"] == 2, nvfp4.kernels


def test_without_the_fp4_module_the_proof_fails_naming_it(engine, nvfp4):
    """The negative control: the image's own proof, run with the FP4 module's file removed."""
    nvfp4, _ = nvfp4
    manifest = json.loads(engine.run(nvfp4.image, ["cat", AOT_MANIFEST]).stdout)
    fp4 = fp4_artifact(manifest)
    script = f"rm -f '{fp4['path']}' && exec {' '.join(PROBE_COMMAND)} --only zero-jit"
    result = engine.run(nvfp4.image, ["sh", "-c", script], timeout=900)
    (check,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "zero-jit"]
    assert check["status"] == "fail"
    assert f"{fp4['name']}: {fp4['path']} is missing" in check["detail"]
    assert "FlashInfer missed: gqa4-nvfp4-cudnn fp4-quantize sm_120" in check["detail"], check["detail"]
