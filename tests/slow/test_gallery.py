"""The recipe gallery, proven end to end (slow): each recipe locks without errors, builds, passes its
smoke test, and is removed. The flagship itself is tests/slow/test_flagship.py; here are vLLM on SM120, the
SGLang stack for Hopper (sm_90a), and the flagship bench's pin move (sglang 0.5.22 with the FlashInfer
and deep_gemm releases it pairs with), whose smoke test used to fail on deep_gemm 0.2.2.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from imagebuild import flows

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"


def build_and_smoke(engine, recipe: Path, ref: str) -> dict:
    """A build that runs (never reused by lock) and a smoke test that runs (never replayed)."""
    report = flows.build(recipe, engine, flows.BuildOptions(tag=ref, relock=True, rebuild=True))
    try:
        assert not report.reused and report.smoke.ok and not report.smoke.cached
        return {c["name"]: c for c in report.smoke.report["checks"]}
    finally:
        engine.remove(report.image)


@pytest.mark.slow
@pytest.mark.engine
def test_vllm_on_sm120_builds_and_passes_its_smoke_test(engine, tmp_path):
    recipe = copy_recipe(tmp_path, "vllm-blackwell")
    checks = build_and_smoke(engine, recipe, f"imagebuild-test/vllm-blackwell:{os.getpid()}")
    assert checks["imports"]["status"] == "pass", checks["imports"]["detail"]
    assert {"vllm", "flashinfer", "torchaudio"} <= set(checks["imports"]["evidence"]["imported"])
    assert checks["flashinfer-dynamo"]["status"] == "pass", checks["flashinfer-dynamo"]["detail"]
    assert checks["torch-cuda"]["status"] == "pass"


@pytest.mark.slow
@pytest.mark.engine
def test_sglang_on_hopper_builds_and_passes_its_smoke_test(engine, tmp_path):
    recipe = copy_recipe(tmp_path, "sglang-hopper")
    checks = build_and_smoke(engine, recipe, f"imagebuild-test/sglang-hopper:{os.getpid()}")
    assert checks["imports"]["status"] == "pass", checks["imports"]["detail"]
    assert "sgl_kernel.flash_attn" in checks["imports"]["evidence"]["imported"]  # FA3 kept for sm_90a
    assert checks["flashinfer-dynamo"]["status"] == "pass"
    # The probe compiles deep_gemm's SM120 kernels only: for an sm_90a recipe it says so.
    assert checks["deep-gemm-sm120"]["status"] == "skip" and "sm_90a" in checks["deep-gemm-sm120"]["detail"]


@pytest.mark.slow
@pytest.mark.engine
def test_the_bench_pin_move_passes_its_smoke_test(engine, tmp_path):
    """sglang 0.5.22 pairs with flashinfer-python 0.7.1 and sgl-deep-gemm 0.2.2 (bench/flagship.py)."""
    text = (RECIPES / "sglang-blackwell.toml").read_text()
    text = re.sub(r'"sglang==[^"]+"', '"sglang==0.5.22"', text)
    text = re.sub(r'"flashinfer-python==[^"]+"', '"flashinfer-python==0.7.1"', text)
    text = re.sub(r'"sgl-deep-gemm==[^"]+"', '"sgl-deep-gemm==0.2.2"', text)
    text = text.replace('exclude = ["', 'exclude = ["cuda-tile", "')  # 0.5.22 pins a cuda-tile with no wheel
    # [aot] against the previous FlashInfer and SGLang: the bf16 shape alone, its prefill module and SGLang's
    # kernels, without sampling's and cascade's modules (minutes of compile on 2 cores): the flagship builds
    # both on 0.7.2, and tests/payload/test_kernel_inputs.py plans both on 0.7.1, 0.7.2 and 0.7.4.
    first, second = [m.start() for m in re.finditer(r"\[\[aot\.shapes\]\]", text)]
    text = text[:second] + text[text.index("\n[env]", second) + 1:]
    text = text.replace("[[aot.shapes]]\n", "[[aot.shapes]]\nsampling = false\nprefix_cache = false\n", 1)
    recipe = copy_recipe(tmp_path, "sglang-blackwell", text)
    checks = build_and_smoke(engine, recipe, f"imagebuild-test/sglang-pin-move:{os.getpid()}")
    deep_gemm = checks["deep-gemm-sm120"]
    assert deep_gemm["status"] == "pass" and deep_gemm["evidence"]["version"] == "0.2.2", deep_gemm["detail"]
    assert checks["flashinfer-dynamo"]["status"] == "pass"
    zero_jit = checks["zero-jit"]
    assert zero_jit["status"] == "pass", zero_jit["detail"]
    loaded = {entry["module"] for entry in zero_jit["evidence"]["proof"]["flashinfer"]["loaded"]}
    # The prefill module, named by 0.7.1's own loader; no sampling or cascade module was declared.
    assert len(loaded) == 1 and not any(name.startswith(("sampling", "cascade")) for name in loaded), loaded
    assert zero_jit["evidence"]["proof"]["sglang"]["hits"] and not zero_jit["evidence"]["proof"]["sglang"]["misses"]
    assert zero_jit["evidence"]["proof"]["flashinfer"]["undeclared"]["missed"]


def copy_recipe(tmp_path: Path, name: str, text: str | None = None) -> Path:
    """The recipe under tmp/recipes (its lock goes to tmp/lockfiles), named for tests, patches by path."""
    text = (RECIPES / f"{name}.toml").read_text() if text is None else text
    text = re.sub(r'name = "imagebuild/', 'name = "imagebuild-test/', text)
    text = text.replace('file = "patches/', f'file = "{RECIPES}/patches/')
    folder = tmp_path / "recipes"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path
