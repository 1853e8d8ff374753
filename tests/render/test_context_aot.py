"""Render of [aot]: the kernel build step, its bind-mounted script and spec, its environment, and its errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from imagebuild.errors import RecipeError
from imagebuild.lock import LockedWheel
from imagebuild.recipe.aot import AotSpec, ServingShape
from imagebuild.recipe.cuda import Arch
from imagebuild.render import render_context, render_dockerfile, render_values
from tests.lock.test_lock import _lock
from tests.render.test_context import _app_wheels, _check_golden, _recipe

SHAPES = (ServingShape("llama3-8b-bf16", 128, 32, 8, hidden_size=4096),
          ServingShape("llama3-8b-fp8kv", 128, 32, 8, kv_dtype="fp8_e4m3", tp=(1, 2)))
AOT = AotSpec(archs=(Arch.parse("12.0f"),), shapes=SHAPES, deep_gemm="disabled")


def _stack_lock(*, sglang: bool = True):
    extra = [LockedWheel("flashinfer-python", "0.7.2", "flashinfer_python-0.7.2-py3-none-any.whl", "a" * 64, 9000000,
                         "application")]
    if sglang:
        extra.append(LockedWheel("sglang", "0.5.23", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "b" * 64,
                                 5000000, "application"))
    return _lock(_app_wheels() + tuple(extra))


def test_aot_dockerfile_matches_golden(tmp_path):
    _check_golden("aot.Dockerfile", render_dockerfile(render_values(_stack_lock(), _recipe(tmp_path, aot=AOT))))


# What the build step and the probe get for AOT, written out by hand (not the renderer's own call):
# every default of a shape filled in, the KV dtype "auto" resolved to the model dtype.
SHAPE = {"dtype": "bfloat16", "head_dim": 128, "kv_heads": 8, "logits_soft_cap": False, "prefix_cache": True,
         "q_heads": 32, "qk_norm": False, "rope": "neox", "sampling": True, "sliding_window": False}
SPEC = {"archs": ["12.0f"], "deep_gemm": "disabled", "sglang": True, "shapes": [
    dict(SHAPE, name="llama3-8b-bf16", hidden_size=4096, kv_dtype="bfloat16", tp=[1]),
    dict(SHAPE, name="llama3-8b-fp8kv", hidden_size=None, kv_dtype="fp8_e4m3", tp=[1, 2])]}


def test_the_step_gets_its_spec_and_script_by_bind_mount_and_the_probe_its_expectations(tmp_path):
    context = render_context(_stack_lock(), _recipe(tmp_path, aot=AOT), tmp_path / "ctx", uv_path=None)
    spec = json.loads((context / "aot" / "aot.json").read_text())
    assert spec == SPEC
    assert [shape["kv_dtype"] for shape in spec["shapes"]] == ["bfloat16", "fp8_e4m3"]  # auto resolved
    assert (context / "aot" / "kernels_aot.py").is_file() and (context / "aot" / "waste.py").is_file()
    dockerfile = (context / "Dockerfile").read_text()
    assert "--mount=type=bind,source=aot,target=/run/imagebuild/aot" in dockerfile
    assert "COPY aot" not in dockerfile and 'FLASHINFER_CUDA_ARCH_LIST="12.0f"' in dockerfile
    expect = json.loads((context / "imagebuild" / "expect.json").read_text())
    assert expect["aot"] == dict(SPEC, manifest="/opt/imagebuild/aot-manifest.json")


def test_no_aot_table_renders_no_step(tmp_path):
    values = render_values(_stack_lock(), _recipe(tmp_path))
    assert values.aot is None and values.expect["aot"] is None
    assert "kernels_aot" not in render_dockerfile(values)


def test_environment_seeded_cache_and_deep_gemm_switch(tmp_path):
    values = render_values(_stack_lock(), _recipe(tmp_path, aot=AOT))
    assert values.env_recipe["SGLANG_JIT_CACHE_DIR"] == "/var/cache/sglang/jit"
    assert values.env_recipe["TRITON_CACHE_DIR"] == "/var/cache/triton"  # the seeded Triton kernels' home
    assert values.env_recipe["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    moved = _recipe(tmp_path, aot=replace(AOT, deep_gemm="jit"), env={"SGLANG_JIT_CACHE_DIR": "/srv/sgl"})
    env = render_values(_stack_lock(), moved).env_recipe
    assert env["SGLANG_JIT_CACHE_DIR"] == "/srv/sgl" and "SGLANG_ENABLE_JIT_DEEPGEMM" not in env


def test_a_recipe_env_that_contradicts_deep_gemm_disabled_is_an_error(tmp_path):
    recipe = _recipe(tmp_path, aot=AOT, env={"SGLANG_ENABLE_JIT_DEEPGEMM": "1"})
    with pytest.raises(RecipeError) as caught:
        render_values(_stack_lock(), recipe)
    assert caught.value.key == "env.SGLANG_ENABLE_JIT_DEEPGEMM"


@pytest.mark.parametrize("lock, aot, key", [
    (lambda: _lock(_app_wheels()), AOT, "aot"),  # no flashinfer-python to ask
    (lambda: _stack_lock(sglang=False), AOT, "aot.sglang"),  # sglang = true without sglang
])
def test_aot_without_the_packages_it_asks_names_the_key(tmp_path, lock, aot, key):
    with pytest.raises(RecipeError) as caught:
        render_values(lock(), _recipe(tmp_path, aot=aot))
    assert caught.value.key == key


def test_sglang_off_needs_only_flashinfer(tmp_path):
    values = render_values(_stack_lock(sglang=False), _recipe(tmp_path, aot=replace(AOT, sglang=False)))
    assert values.aot["spec"]["sglang"] is False and "SGLANG_JIT_CACHE_DIR" not in values.env_recipe


def test_aot_without_a_pip_nvcc_is_an_error(tmp_path):
    wheels = tuple(w for w in _stack_lock().wheels if w.name != "nvidia-cuda-nvcc")
    lock = _lock(wheels)
    lock = replace(lock, cuda={k: v for k, v in lock.cuda.items() if k != "nvcc"})  # no RECORD names bin/nvcc
    with pytest.raises(RecipeError, match="no nvcc"):
        render_values(lock, _recipe(tmp_path, aot=AOT))


def test_changing_a_shape_leaves_every_step_above_the_kernel_step_unchanged(tmp_path):
    """The promise behind its place in the template: the wheel layers stay cached when shapes move."""
    before = render_dockerfile(render_values(_stack_lock(), _recipe(tmp_path, aot=AOT)))
    after = render_dockerfile(render_values(_stack_lock(), _recipe(tmp_path, aot=replace(AOT, shapes=SHAPES[:1]))))
    cut = before.index("# Kernels prebuilt")
    assert before[:cut] == after[:cut] and before != after
