"""The GPU kernels check without a GPU: its verdict on recorded answers (mocked GPU runs: the answers are what
gpu_launch.py prints), and the calls gpu_launch.py makes, read from its source and held against the real
signatures of FlashInfer 0.7.1, 0.7.2 (pinned) and 0.7.4 (newest) and of SGLang 0.5.22 and 0.5.23 (pinned,
newest), each with a doctored release as the negative control. The launches themselves ran on an H200
(docs/zero-jit.md, "On a GPU")."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.payload.probe.checks import gpu_kernels, gpu_launch
from imagebuild.payload.probe.kernels import kernels_aot
from tests.json_fuzz import json_values, replace_one_field
from tests.releases import published_file, unpack_python

FLASHINFER = ("0.7.1", "0.7.2", "0.7.4")
SGLANG = ("0.5.22", "0.5.23")
FLASHINFER_MODULES = ("prefill", "decode", "cascade", "sampling")


# --- the verdict, on recorded answers -------------------------------------------------------------

@pytest.fixture
def manifest(tmp_path):
    artifacts = []
    for kind, name in (("flashinfer", "batch_prefill_fa2"), ("flashinfer", "sampling"), ("sglang", "rmsnorm")):
        path = tmp_path / kind / f"{name}.so"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"\x7fELF")
        artifacts.append({"kind": kind, "name": name, "path": str(path)})
    return {"artifacts": artifacts}


SPEC = {"archs": ["9.0a"], "deep_gemm": "disabled", "sglang": True, "shapes": []}


def answer(manifest, **changes) -> dict:
    """What gpu_launch.py printed on the H200 for a Hopper [aot] image, in miniature."""
    paths = [a["path"] for a in manifest["artifacts"]]
    launches = [
        {"shape": "bf16", "call": "prefill ragged tp1 (auto)", "relative_error": 0.0041, "ms": 0.05, "first_s": 0.4,
         "loaded": [paths[0]]},
        {"shape": "bf16", "call": "decode tp1 (tensor cores)", "relative_error": 0.0035, "ms": 0.03, "first_s": 0.1,
         "loaded": []},
        {"shape": "bf16", "call": "sampling top_k_top_p", "relative_error": 0.0, "loaded": [paths[1]]},
        {"shape": "bf16", "call": "sglang rmsnorm", "relative_error": 0.0023, "loaded": [paths[2]]}]
    found = {"device": "NVIDIA H200", "capability": "9.0", "gpus": [{"name": "NVIDIA H200", "capability": "9.0"}],
             "launches": launches, "deep_gemm": {"mode": "disabled", "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
                                                 "sglang_enabled": False}}
    found.update(changes)
    return found


def verdict(found, manifest, status=0, spec=SPEC, nvcc=()):
    return gpu_kernels.kernels_verdict(found, status, "Traceback ...\nRuntimeError: boom", manifest, spec, list(nvcc))


def test_all_right_passes_and_says_what_it_ran(manifest):
    check = verdict(answer(manifest), manifest)
    assert check["status"] == "pass", check["detail"]
    assert "NVIDIA H200 (compute capability 9.0)" in check["detail"] and "4 launches" in check["detail"]
    assert "all 3 prebuilt kernels" in check["detail"] and "0.0041" in check["detail"]
    assert "deep_gemm's JIT is off" in check["detail"]


def test_one_error_over_tolerance_fails_naming_the_call(manifest):
    found = answer(manifest)
    found["launches"][0]["relative_error"] = 0.31
    check = verdict(found, manifest)
    assert check["status"] == "fail" and "bf16 prefill ragged tp1 (auto): relative error 0.31" in check["detail"]


def test_a_failed_launch_fails_and_its_kernel_counts_as_never_launched(manifest):
    found = answer(manifest)
    found["launches"][2].update(error="MissingJITCacheError: sampling not in the AOT folder", relative_error=None)
    check = verdict(found, manifest)
    assert check["status"] == "fail"
    assert "MissingJITCacheError" in check["detail"] and "never launched: sampling (flashinfer)" in check["detail"]


def test_a_manifest_kernel_never_launched_fails_naming_it(manifest):
    found = answer(manifest)
    found["launches"] = [entry for entry in found["launches"] if entry["call"] != "sglang rmsnorm"]
    check = verdict(found, manifest)
    assert check["status"] == "fail" and "never launched: rmsnorm (sglang)" in check["detail"]


@pytest.mark.parametrize("found", [None, {}, {"launches": []}, "[]"])
def test_an_empty_answer_fails(manifest, found):
    check = verdict(found, manifest, status=0)
    assert check["status"] == "fail"
    assert "printed no result" in check["detail"] or "nothing was launched" in check["detail"]


def test_a_non_zero_exit_fails_even_with_an_answer(manifest):
    check = verdict(answer(manifest), manifest, status=139)
    assert check["status"] == "fail" and "exited 139: RuntimeError: boom" in check["detail"]


def test_a_gpu_the_archs_do_not_cover_fails_naming_both(manifest):
    spec = dict(SPEC, archs=["12.0f"])  # the flagship's kernels, on an H200
    check = verdict(answer(manifest), manifest, spec=spec)
    assert check["status"] == "fail"
    assert "NVIDIA H200 (compute capability 9.0): [aot].archs 12.0f holds no code" in check["detail"]
    assert verdict(answer(manifest, capability="12.0", gpus=[{"name": "RTX PRO 6000", "capability": "12.0"}]),
                   manifest, spec=spec)["status"] == "pass"


def test_an_sm90a_build_does_not_cover_an_sm90_family_neighbour(manifest):
    found = answer(manifest, gpus=[{"name": "NVIDIA H200", "capability": "9.0"},
                                   {"name": "RTX PRO 6000", "capability": "12.0"}])
    check = verdict(found, manifest)
    assert check["status"] == "fail" and "RTX PRO 6000 (compute capability 12.0)" in check["detail"]


def test_deep_gemm_disabled_must_be_off_where_sglang_reads_it(manifest):
    on = answer(manifest, deep_gemm={"mode": "disabled", "SGLANG_ENABLE_JIT_DEEPGEMM": None})
    assert "SGLANG_ENABLE_JIT_DEEPGEMM is None" in verdict(on, manifest)["detail"]
    sglang_on = answer(manifest, deep_gemm={"mode": "disabled", "SGLANG_ENABLE_JIT_DEEPGEMM": "0", "sglang_enabled": True})
    assert "SGLang reads it as on" in verdict(sglang_on, manifest)["detail"]


def test_deep_gemm_kept_must_be_launched(manifest):
    spec = dict(SPEC, deep_gemm="jit")
    check = verdict(answer(manifest), manifest, spec=spec)
    assert check["status"] == "fail" and "no deep_gemm GEMM was launched" in check["detail"]
    found = answer(manifest)
    found["launches"].append({"shape": "deep_gemm", "call": "deep_gemm fp8_gemm_nt (1x128 and 128x128 scales)",
                              "relative_error": 0.006, "first_s": 41.0, "loaded": []})
    assert verdict(found, manifest, spec=spec)["status"] == "pass"


def test_a_compile_attempt_fails(manifest):
    check = verdict(answer(manifest), manifest, nvcc=["-c sampling.cu"])
    assert check["status"] == "fail" and "nvcc was asked to compile 1 time(s)" in check["detail"]


def test_a_prebuilt_file_the_manifest_does_not_list_fails(manifest, tmp_path):
    found = answer(manifest)
    found["launches"][1]["loaded"] = [str(tmp_path / "flashinfer" / "stale.so")]
    assert "the manifest does not list" in verdict(found, manifest)["detail"]


# What gpu_launch.triton_launches printed on an H100 (Triton 3.6.0, torch 2.11.0+cu130; 2026-12-06) from a cache
# kernels_triton.seed wrote there under StubDriver for 9.0a, and from an empty cache (the control); keys as the
# run reported them, cut to 12 hex digits.
H100_SEEDED = [
    {"shape": "llama-3.1-8b", "call": "triton compute-position", "first_s": 1.395, "ms": 0.1219, "relative_error": 0.0,
     "entries_wrong": 0, "entries": 607, "loaded": [], "triton": [
         {"kernel": "compute_position_kernel", "hash": "2602201a941f", "hit": True}]},
    {"shape": "llama-3.1-8b", "call": "triton kv-indices", "first_s": 0.262, "ms": 3.7399, "relative_error": 0.0,
     "entries_wrong": 0, "entries": 1410, "loaded": [], "triton": [
         {"kernel": "create_flashinfer_kv_indices_triton", "hash": "010bc80457a5", "hit": True},
         {"kernel": "create_flashinfer_kv_indices_triton", "hash": "24e6328df4a6", "hit": True}]}]
H100_SEED = {"kernels": [{"kernel": e["kernel"], "target": 90, "hash": e["hash"]}
                         for entry in H100_SEEDED for e in entry["triton"]]}


def seeded(manifest, launches=None) -> tuple:
    """The miniature answer plus the H100's Triton launches, and a manifest that lists the H100 seed."""
    found = answer(manifest)
    found["launches"] += json.loads(json.dumps(H100_SEEDED if launches is None else launches))
    return found, dict(manifest, triton=H100_SEED)


def test_triton_kernels_served_from_the_seeded_cache_pass_and_are_named(manifest):
    found, with_seed = seeded(manifest)
    check = verdict(found, with_seed)
    assert check["status"] == "pass", check["detail"]
    assert "Triton served 2 seeded kernel(s) from the image's cache (compute_position_kernel, " \
           "create_flashinfer_kv_indices_triton)" in check["detail"]


def test_a_triton_kernel_compiled_on_the_gpu_fails_naming_it(manifest):
    found, with_seed = seeded(manifest)
    for entry in found["launches"][-2:]:  # the H100's control: the same launches from an empty cache
        for event in entry["triton"]:
            event["hit"] = False
    check = verdict(found, with_seed)
    assert check["status"] == "fail"
    assert "Triton compiled on this GPU what the image's cache did not serve: compute_position_kernel " \
           "(triton compute-position), create_flashinfer_kv_indices_triton (triton kv-indices)" in check["detail"]
    assert "seeded for sm_90 but not served from the cache here: compute_position_kernel 2602201a941f" in check["detail"]


def test_a_seeded_variant_no_launch_reached_fails(manifest):
    found, with_seed = seeded(manifest)
    found["launches"][-1]["triton"].pop()  # the int32-lengths variant never asked for
    check = verdict(found, with_seed)
    assert check["status"] == "fail" and "not served from the cache here: create_flashinfer_kv_indices_triton " \
                                         "24e6328df4a6" in check["detail"]


def test_a_wrong_index_fails_whatever_the_tolerance(manifest):
    found, with_seed = seeded(manifest)
    found["launches"][-1].update(relative_error=1.0, entries_wrong=1)
    assert "triton kv-indices: relative error 1 over" in verdict(found, with_seed)["detail"]


def test_a_seeded_cache_with_no_triton_launch_fails(manifest):
    found, with_seed = seeded(manifest, launches=[])
    check = verdict(found, with_seed)
    assert check["status"] == "fail" and "seeds Triton's cache but no Triton launch ran" in check["detail"]


def test_a_seed_for_another_target_is_not_this_gpus(manifest):
    found, with_seed = seeded(manifest)
    with_seed["triton"] = {"kernels": [dict(k, target=120) for k in H100_SEED["kernels"]]}
    assert verdict(found, with_seed)["status"] == "pass"  # nothing seeded for sm_90, and nothing compiled
    assert [gpu_kernels.triton_target(c) for c in ("9.0", "12.0", "10.3", "x", None, "9.")] == [90, 120, 103, None, None, 90]


@settings(max_examples=200)
@given(launches=json_values, seed=json_values, capability=json_values)
def test_any_triton_answer_or_seed_gets_problems_not_a_traceback(launches, seed, capability):
    problems = gpu_kernels.triton_problems(launches if isinstance(launches, list) else [], {"triton": seed},
                                           capability)
    assert isinstance(problems, list) and all(isinstance(problem, str) for problem in problems)


def test_an_empty_manifest_is_no_pass(manifest):
    assert verdict(answer(manifest), {"artifacts": []})["status"] == "fail"


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(found=json_values, status=st.one_of(st.none(), st.integers(-9, 300)))
def test_any_answer_gets_a_verdict_and_never_a_pass_without_launches(manifest, found, status):
    check = verdict(found, manifest, status=status)
    assert check["status"] in ("pass", "fail")
    assert check["status"] == "fail" or (status == 0 and isinstance(found, dict))


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_real_answer_with_any_field_replaced_gets_a_verdict(manifest, data):
    found = answer(manifest)
    replace_one_field(found, data)
    check = verdict(found, manifest)
    assert check["status"] in ("pass", "fail") and isinstance(check["detail"], str)


def test_without_aot_the_jit_verdict_says_it_compiled_and_checks_the_arch_list():
    ran = {"device": "NVIDIA H200", "capability": "9.0", "flashinfer_arch_list": "9.0a",
           "launches": [{"call": "flashinfer norm.rmsnorm 64x1024", "relative_error": 0.002, "first_s": 31.0}]}
    check = gpu_kernels.jit_verdict(ran, 0, "")
    assert check["status"] == "pass" and "no [aot] table" in check["detail"] and "31.0 s" in check["detail"]
    wrong = gpu_kernels.jit_verdict(dict(ran, flashinfer_arch_list="12.0f"), 0, "")
    assert wrong["status"] == "fail" and "FLASHINFER_CUDA_ARCH_LIST 12.0f" in wrong["detail"]
    assert gpu_kernels.jit_verdict(dict(ran, launches=[]), 0, "")["status"] == "fail"
    assert gpu_kernels.jit_verdict(ran, 1, "Segmentation fault")["status"] == "fail"
    assert gpu_kernels.jit_verdict(None, None, "timed out")["status"] == "fail"


# --- the calls gpu_launch.py makes, against each release's signatures -----------------------------

def launch_calls() -> list:
    """(file in the release, name, positional count, keywords) of every FlashInfer and SGLang call in gpu_launch.py:
    `prefill.Class(...)`, a method on what it returned, `cascade.function(...)`, an op imported from sglang."""
    tree = ast.parse(Path(gpu_launch.__file__).read_text())
    calls = []
    for function in (node for node in tree.body if isinstance(node, ast.FunctionDef)):
        made, imported = {}, {}
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang."):
                imported.update({alias.asname or alias.name: node.module.replace(".", "/") + ".py" for alias in node.names})
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _library(node.value.func) \
                    and _library(node.value.func)[1][:1].isupper():  # a wrapper object, whose methods are called
                made.update({target.id: _library(node.value.func) for target in node.targets if isinstance(target, ast.Name)})
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            shape = (len(node.args), tuple(sorted(k.arg for k in node.keywords if k.arg)))
            func = node.func
            if _library(func):
                calls.append((*_library(func), *shape))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in made:
                file, owner = made[func.value.id]
                calls.append((file, f"{owner}.{func.attr}", *shape))
            elif isinstance(func, ast.Name) and func.id in imported:
                calls.append((imported[func.id], func.id, *shape))
    return sorted(set(calls))


def _library(func) -> tuple | None:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in FLASHINFER_MODULES:
        return f"flashinfer/{func.value.id}.py", func.attr
    return None


def signature_problems(root: Path, calls: list) -> list:
    """What each call gives that the release's definition does not take, or leaves out that it needs."""
    problems = []
    for file, name, positional, keywords in calls:
        definitions = _definitions(root / file, name)
        if not definitions:
            problems.append(f"{file}: no {name}")
            continue
        found = [_misfit(d, positional, keywords) for d in definitions]
        if all(found):
            problems.append(f"{file} {name}: {found[-1]}")
    return problems


def _definitions(path: Path, name: str) -> list:
    """(definition, the other methods of its class) for each definition of name in the file."""
    if not path.is_file():
        return []
    tree = ast.parse(path.read_text())
    owner, _, method = name.rpartition(".")
    if owner or name[:1].isupper():
        owner, method = (owner, method) if owner else (name, "__init__")
        scopes = [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner]
    else:
        scopes = [tree.body]
    return [(n, {m.name: m for m in body if isinstance(m, ast.FunctionDef)})
            for body in scopes for n in body if isinstance(n, ast.FunctionDef) and n.name == method]


def _accepted(definition: ast.FunctionDef, methods: dict, depth: int = 2) -> set:
    """What a **kwargs takes: the names its body reads as strings, and the parameters of the methods of its
    class it hands **kwargs (or a dict made from them) to, as decode's plan hands them to _plan_impl."""
    read = {n.value for n in ast.walk(definition) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for call in (n for n in ast.walk(definition) if isinstance(n, ast.Call)):
        target = call.func
        if depth and any(k.arg is None for k in call.keywords) and isinstance(target, ast.Attribute) \
                and isinstance(target.value, ast.Name) and target.value.id == "self" and target.attr in methods:
            called = methods[target.attr]
            read |= {a.arg for a in called.args.args + called.args.kwonlyargs}
            if called.args.kwarg:
                read |= _accepted(called, methods, depth - 1)
    return read


def _misfit(found: tuple, positional: int, keywords: tuple) -> str:
    definition, methods = found
    arguments = definition.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    names = names[1:] if names[:1] == ["self"] else names
    required = names[: len(names) - len(arguments.defaults)]
    kwonly = {a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)}
    read = _accepted(definition, methods) if arguments.kwarg else set()
    if positional > len(names) and arguments.vararg is None:
        return f"takes {len(names)} positional arguments, the call gives {positional}"
    for keyword in keywords:
        if keyword in names[:positional]:
            return f"{keyword} given twice"
        if keyword not in names[positional:] and keyword not in kwonly and keyword not in read:
            return f"takes no {keyword}"
    missing = [n for n in required[positional:] if n not in keywords] + \
              [n for n, default in kwonly.items() if default is None and n not in keywords]
    return f"needs {', '.join(missing)}" if missing else ""


def test_the_call_reader_sees_every_library_call():
    names = {name for _, name, _, _ in launch_calls()}
    assert {"BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper.plan",
            "BatchPrefillWithRaggedKVCacheWrapper.run", "BatchPrefillWithPagedKVCacheWrapper.plan",
            "BatchDecodeWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper.plan", "merge_state",
            "top_k_top_p_sampling_from_probs", "silu_and_mul", "apply_rope_inplace", "fused_inplace_qknorm",
            "rmsnorm", "fused_add_rmsnorm", "store_cache"} <= names


@pytest.fixture(scope="module")
def flashinfer_releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("flashinfer")
    return {v: unpack_python(published_file("flashinfer-python", v), root / v).parent for v in FLASHINFER}


@pytest.fixture(scope="module")
def sglang_releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang")
    return {v: unpack_python(published_file("sglang", v), root / v, "sglang").parent for v in SGLANG}


@pytest.mark.parametrize("version", FLASHINFER)
def test_flashinfer_calls_fit_each_release(flashinfer_releases, version):
    calls = [call for call in launch_calls() if call[0].startswith("flashinfer/")]
    assert len(calls) >= 10 and signature_problems(flashinfer_releases[version], calls) == []


@pytest.mark.parametrize("version", SGLANG)
def test_sglang_op_calls_fit_each_release(sglang_releases, version):
    calls = [call for call in launch_calls() if call[0].startswith("sglang/")]
    assert len(calls) >= 6 and signature_problems(sglang_releases[version], calls) == []


def test_a_renamed_plan_argument_is_caught(flashinfer_releases, tmp_path):
    copy = tmp_path / "flashinfer"
    shutil.copytree(flashinfer_releases["0.7.2"] / "flashinfer", copy)
    prefill = copy / "prefill.py"
    prefill.write_text(prefill.read_text().replace("        q_data_type: Union[str, torch.dtype] = \"float16\",",
                                                   "        dtype_q: Union[str, torch.dtype] = \"float16\","))
    problems = signature_problems(tmp_path, [c for c in launch_calls() if c[0] == "flashinfer/prefill.py"])
    assert any("plan: takes no q_data_type" in problem for problem in problems), problems


def test_a_dropped_op_argument_is_caught(sglang_releases, tmp_path):
    copy = tmp_path / "sglang"
    shutil.copytree(sglang_releases["0.5.23"] / "sglang" / "kernels", copy / "kernels")
    norm = copy / "kernels" / "ops" / "layernorm" / "norm.py"
    norm.write_text(norm.read_text().replace("    *,\n    cast_x_before_out_mul: bool = False,\n", ""))
    problems = signature_problems(tmp_path, [c for c in launch_calls() if c[0].endswith("layernorm/norm.py")])
    assert problems == ["sglang/kernels/ops/layernorm/norm.py fused_add_rmsnorm: takes no cast_x_before_out_mul"]


def test_the_manifest_fields_the_launches_read_are_the_builders(tmp_path):
    """The launches read the roots the build writes into the manifest (kernels_aot.build)."""
    source = Path(gpu_launch.__file__).read_text()
    build = Path(kernels_aot.__file__).read_text()
    for key in ("flashinfer_aot_dir", "sglang_jit_cache_dir"):
        assert f'"{key}"' in source and f'"{key}"' in build
    json.dumps(SPEC)
