"""Which FlashInfer modules a quantized MoE shape loads on SM12x, read from FlashInfer's source
(payload/probe/kernels/kernels_moe.py), never imported.

The real releases: 0.7.1 (previous), 0.7.2 (pinned by lockfiles/sglang-blackwell.lock), 0.7.4 (newest on
PyPI, 2026-12-03), each its published file from PyPI's simple index, checked against the index's sha256,
its .py files unpacked. Negative controls: 0.2.14, a real release from before FlashInfer's SM120 fused MoE,
reported as missing for each role; and doctored copies of the pinned release (a loader gone, a generator
that takes a shape parameter the probe has no value for).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.payload.probe.kernels import kernels_aot, kernels_moe
from tests.releases import published_file, unpack_python

RELEASES = {"0.7.1": "previous", "0.7.2": "pinned", "0.7.4": "newest"}
BEFORE_SM120 = "0.2.14"  # an sdist: PyPI holds no wheel of it

GLM = {"name": "glm-4.5-nvfp4-tp8", "quantization": "nvfp4", "experts": 160, "top_k": 8,
       "moe_intermediate_size": 1536, "hidden_size": 5120, "tp": [8], "ep": [1]}
DENSE_FP4 = {"name": "dense-nvfp4", "quantization": "nvfp4"}
SPEC = {"archs": ["12.0f"], "shapes": [GLM, DENSE_FP4, {"name": "bf16"}]}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("flashinfer")
    return {version: unpack_python(published_file("flashinfer-python", version), root / version)
            for version in [*RELEASES, BEFORE_SM120]}


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_names_the_sm120_moe_and_fp4_generators(releases, version):
    plan = kernels_moe.moe_plan(SPEC, str(releases[version]))
    assert plan["missing"] == [] and plan["not_read"] == []
    found = {m["role"]: m for m in plan["modules"]}
    assert {role: m["generator"] for role, m in found.items()} == {
        "fused-moe": "gen_cutlass_fused_moe_sm120_module",
        "fp4-quantize": "gen_fp4_quantization_sm120f_module",  # the family variant FlashInfer loads with CUDA 13
        "fp4-gemm": "gen_gemm_sm120_module_cutlass_fp4"}
    assert found["fused-moe"]["shapes"] == [GLM["name"]]  # a dense FP4 model runs no fused MoE
    assert found["fp4-gemm"]["shapes"] == [GLM["name"], DENSE_FP4["name"]]
    # No shape parameter: what decides the module is the target alone, so one module per target.
    assert [p["name"] for p in found["fused-moe"]["parameters"]] == ["use_fast_build"]
    assert found["fused-moe"]["loader"]["file"] == "flashinfer/fused_moe/core.py"
    for module in plan["modules"]:
        source = (releases[version].parent / module["file"]).read_text().splitlines()
        assert source[module["line"] - 1].startswith(f"def {module['generator']}(")


@pytest.mark.parametrize("version", RELEASES)
def test_each_modules_name_is_read_from_the_generator_it_returns_through(releases, version):
    """The name FlashInfer gives each JitSpec (its cache folder and .so), read through the generator's calls:
    what doctor looks for in a cache, and what the kernel step's loaders must ask for."""
    plan = kernels_moe.moe_plan(SPEC, str(releases[version]))
    assert {m["role"]: m["module"] for m in plan["modules"]} == {
        "fused-moe": "fused_moe_120", "fp4-quantize": "fp4_quantization_120f", "fp4-gemm": "fp4_gemm_cutlass_sm120"}


def test_a_name_not_written_from_literals_is_none_not_a_guess(tmp_path):
    folder = tmp_path / "flashinfer" / "jit"
    folder.mkdir(parents=True)
    (folder / "x.py").write_text(
        "def gen_a_sm120_module():\n    return gen_b(FLAGS, ARCH)\n"
        "def gen_b(flags, arch):\n    return gen_jit_spec(f'b_{arch}', [])\n"
        "def gen_c_sm120_module(n=3):\n    return gen_jit_spec(name_of(n), [])\n"
        "def gen_d_sm120_module(name=None):\n    return gen_jit_spec(name or 'd_' + '120', [])\n"
        "def gen_e_sm120_module(name=None):\n    return gen_jit_spec(name or f'e_{120}', [])\n")
    functions = kernels_moe.index_functions(str(tmp_path / "flashinfer"))
    assert [kernels_moe.module_name(functions, f"gen_{x}_sm120_module") for x in "acde"] == [None, None, None, "e_120"]


def test_the_fp4_variant_follows_the_runtime_dispatch_not_the_arch_list(releases):
    """FlashInfer loads the sm120f FP4 module on any SM120 GPU when torch's CUDA is >= 12.9, whatever the arch
    list; the generators set their own arch flags, so one module serves both targets."""
    spec = dict(SPEC, archs=["12.0a", "12.0f"])
    (quantize,) = [m for m in kernels_moe.moe_plan(spec, str(releases["0.7.2"]))["modules"] if m["role"] == "fp4-quantize"]
    assert quantize["generator"] == "gen_fp4_quantization_sm120f_module" and quantize["archs"] == ["12.0a", "12.0f"]
    older = kernels_moe.moe_plan(spec, str(releases["0.7.2"]), family_variants=False)["modules"]
    assert [m["generator"] for m in older if m["role"] == "fp4-quantize"] == ["gen_fp4_quantization_sm120_module"]


@pytest.mark.parametrize("version", RELEASES)
def test_a_cudnn_fp4_gemm_backend_needs_only_the_fp4_quantization_module(releases, version):
    """--fp4-gemm-backend flashinfer_cudnn runs the linear layers on cuDNN's graphs: a dense NVFP4 model then
    loads FlashInfer's FP4 quantization module alone; with experts, the fused MoE too."""
    cudnn = dict(DENSE_FP4, name="dense-nvfp4-cudnn", fp4_gemm_backend="flashinfer_cudnn")
    moe = dict(GLM, name="glm-cudnn", fp4_gemm_backend="flashinfer_cudnn")
    plan = kernels_moe.moe_plan({"archs": ["12.0f"], "shapes": [cudnn, moe]}, str(releases[version]))
    assert plan["missing"] == []
    assert {m["role"]: m["shapes"] for m in plan["modules"]} == {
        "fp4-quantize": ["dense-nvfp4-cudnn", "glm-cudnn"], "fused-moe": ["glm-cudnn"]}


def test_a_release_before_the_sm120_moe_generators_is_reported_missing_for_each_role(releases):
    plan = kernels_moe.moe_plan(SPEC, str(releases[BEFORE_SM120]))
    assert plan["modules"] == []
    reasons = {(m["shape"], m["role"]): m["reason"] for m in plan["missing"]}
    assert set(reasons) == {(GLM["name"], "fused-moe"), (GLM["name"], "fp4-quantize"), (GLM["name"], "fp4-gemm"),
                            (DENSE_FP4["name"], "fp4-quantize"), (DENSE_FP4["name"], "fp4-gemm")}
    assert reasons[(GLM["name"], "fused-moe")] == (
        "get_cutlass_fused_moe_module names no generator for sm_120 "
        "(it names gen_cutlass_fused_moe_sm100_module, gen_cutlass_fused_moe_sm90_module)")
    assert reasons[(GLM["name"], "fp4-gemm")] == "this FlashInfer has no get_gemm_sm120_module_cutlass_fp4"


@pytest.fixture
def doctored(releases, tmp_path) -> Path:
    copy = tmp_path / "flashinfer"
    shutil.copytree(releases["0.7.2"], copy)
    return copy


def test_a_generator_that_takes_a_shape_parameter_stops_the_plan(doctored):
    jit = doctored / "jit" / "fused_moe.py"
    jit.write_text(jit.read_text().replace("def gen_cutlass_fused_moe_sm120_module(use_fast_build: bool = False)",
                                           "def gen_cutlass_fused_moe_sm120_module(num_experts: int)"))
    (missing,) = kernels_moe.moe_plan(SPEC, str(doctored))["missing"]
    assert missing["role"] == "fused-moe" and "takes num_experts, which no [aot] shape field gives" in missing["reason"]


def test_a_loader_gone_is_missing_not_a_pass(doctored):
    core = doctored / "fused_moe" / "core.py"
    core.write_text(core.read_text().replace("def get_cutlass_fused_moe_module(", "def get_cutlass_moe_module("))
    (missing,) = kernels_moe.moe_plan(SPEC, str(doctored))["missing"]
    assert missing["reason"] == "this FlashInfer has no get_cutlass_fused_moe_module"


def test_a_quantization_the_probe_does_not_follow_is_listed_not_passed(tmp_path):
    plan = kernels_moe.moe_plan({"archs": ["12.0f"], "shapes": [{"name": "f8", "quantization": "fp8-block"}]},
                                str(tmp_path))
    assert plan["modules"] == [] and plan["not_read"][0]["shape"] == "f8"


def test_the_command_line_prints_the_plan_and_fails_on_a_missing_module(releases, tmp_path, capsys):
    spec = tmp_path / "aot.json"
    spec.write_text(json.dumps(SPEC))
    assert kernels_moe.main([str(spec), str(releases["0.7.2"])]) == 0
    assert len(json.loads(capsys.readouterr().out)["modules"]) == 3
    assert kernels_moe.main([str(spec), str(releases[BEFORE_SM120])]) == 1


@pytest.mark.parametrize("arch, target", [("12.0f", (120, True)), ("12.0a", (120, False)), ("12.1", (121, False)),
                                          ("9.0a", (90, False))])
def test_arch_targets(arch, target):
    assert kernels_moe.arch_target(arch) == target


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(["def gen_x_sm120_module(a=1):\n", "def get_x(", ""]))
def test_any_python_file_is_read_or_skipped_never_a_traceback(tmp_path_factory, data, prefix):
    folder = tmp_path_factory.mktemp("source") / "flashinfer"
    folder.mkdir()
    (folder / "a.py").write_bytes(prefix.encode() + data)
    functions = kernels_moe.index_functions(str(folder))
    assert kernels_moe.generator_for(functions, "get_x", 120, True).keys() <= {"missing", "generator", "file", "line",
                                                                               "parameters", "loader", "module"}


def test_a_quantization_the_reader_does_not_follow_is_a_problem_not_an_empty_load_list(releases):
    """fp8-block's SGLang path is not read yet: the build step gets a problem naming the shape (and stops with
    AotError), never zero loads that would let the proof pass on nothing."""
    shape = dict(GLM, name="glm-fp8", quantization="fp8-block")
    loads, problems = kernels_moe.quantized_loads(shape, ["12.0f"], str(releases["0.7.2"]))
    assert loads == [] and len(problems) == 1
    assert problems[0].startswith("glm-fp8: fp8-block: its SGLang path's kernels are not read")


def test_a_loader_missing_from_the_release_is_a_problem_naming_role_and_target(releases):
    """The negative control on the load list: FlashInfer 0.2.14 has no SM120 FP4 or MoE loaders."""
    loads, problems = kernels_moe.quantized_loads(dict(GLM), ["12.0f"], str(releases[BEFORE_SM120]), family=True)
    assert loads == []
    assert [p.split(":")[0] for p in problems] == [f"glm-4.5-nvfp4-tp8 {role} for 12.0f"
                                                    for role in ("fused-moe", "fp4-quantize", "fp4-gemm")]


# --- doctor: which of these kernels a live environment's caches hold ---------------------------------

def doctor_facts(package: Path, cache: Path, caps=("12.0",), arch_list=None) -> dict:
    """A hand-made environment's facts as the doctor gathers them. The GPUs are stand-ins (no GPU here)."""
    return {"flashinfer": {"installed": True, "source": str(package / "jit" / "cpp_ext.py"), "arch_list": arch_list},
            "caches": [{"package": "flashinfer", "path": str(cache)}], "torch": {"cuda": "13.0"},
            "driver": {"gpus": [{"compute_cap": cap} for cap in caps]}}


def cache_module(real_nvcc, cache: Path, name: str, sass=(120,)) -> Path:
    """A module FlashInfer's JIT wrote into its workspace, as a real nvcc-built library with that SASS."""
    target = cache / "0.7.2" / "120f" / "cached_ops" / name / f"{name}.so"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(real_nvcc.library("ops-" + "-".join(map(str, sass)), sass), target)
    return target


@pytest.mark.parametrize("version", RELEASES)
def test_mock_gpu_doctor_names_each_nvfp4_kernel_the_cache_holds_for_an_sm120_gpu(releases, real_nvcc, tmp_path,
                                                                                version):
    from imagebuild.payload.probe.doctor.findings_kernels import finding_quantized_kernels
    cache = tmp_path / "flashinfer-cache"
    paths = [cache_module(real_nvcc, cache, name) for name in
             ("fused_moe_120", "fp4_quantization_120f", "fp4_gemm_cutlass_sm120")]
    found = finding_quantized_kernels(doctor_facts(releases[version], cache))
    assert found["status"] == "pass", found["detail"]
    assert found["detail"].startswith("the 3 NVFP4 MoE kernels for 12.0 (this host's GPUs) are cached: ")
    assert {m["module"]: [f["path"] for f in m["files"]] for m in found["evidence"]["modules"]} == {
        path.parent.name: [str(path)] for path in paths}
    assert all(m["files"][0]["sass"] == [120] for m in found["evidence"]["modules"])


def test_mock_gpu_a_missing_kernel_and_one_for_another_sm_both_compile_on_first_use(releases, real_nvcc, tmp_path):
    """The negative controls: no fused MoE at all, and an FP4 GEMM whose file holds SASS for sm_90 only."""
    from imagebuild.payload.probe.doctor.findings_kernels import finding_quantized_kernels
    cache = tmp_path / "flashinfer-cache"
    cache_module(real_nvcc, cache, "fp4_quantization_120f")
    cache_module(real_nvcc, cache, "fp4_gemm_cutlass_sm120", sass=(90,))
    found = finding_quantized_kernels(doctor_facts(releases["0.7.2"], cache))
    assert found["status"] == "warn"
    assert found["detail"] == ("2 of 3 NVFP4 MoE kernels for 12.0 (this host's GPUs) are in no cache and compile on "
                               "first use: fused-moe fused_moe_120 for sm_120; fp4-gemm fp4_gemm_cutlass_sm120 for sm_120")
    assert "[aot]" in found["fix"]


def test_doctor_without_an_sm12x_target_says_so_and_takes_the_arch_list_when_there_is_no_gpu(releases, tmp_path):
    from imagebuild.payload.probe.doctor.findings_kernels import finding_quantized_kernels
    empty = tmp_path / "none"
    assert finding_quantized_kernels(doctor_facts(releases["0.7.2"], empty, caps=("9.0",)))["status"] == "skip"
    listed = finding_quantized_kernels(doctor_facts(releases["0.7.2"], empty, caps=(), arch_list="9.0a 12.0f"))
    assert listed["status"] == "warn" and "for 12.0f (FLASHINFER_CUDA_ARCH_LIST)" in listed["detail"]
    assert "3 of 3" in listed["detail"]
    old = finding_quantized_kernels(doctor_facts(releases[BEFORE_SM120], empty))
    assert old["status"] == "warn" and "cannot serve SGLang's NVFP4 path" in old["detail"]
    assert finding_quantized_kernels({"flashinfer": {"installed": False}})["status"] == "skip"
