"""The zero-JIT check's pure parts, on this host: arguments for a loader taken from its own signature, the
negative-control shape, the artifact checks and the verdict. The load proof itself needs the image's
FlashInfer and SGLang: tests/slow/test_flagship.py, test_gallery.py and test_zero_jit_releases.py run it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from imagebuild.payload.probe.checks import zero_jit
from imagebuild.payload.probe.kernels import kernels_aot

SHAPE = {"name": "a", "head_dim": 128, "q_heads": 32, "kv_heads": 8, "tp": [1, 2], "dtype": "bfloat16",
         "kv_dtype": "bfloat16", "sliding_window": False, "logits_soft_cap": False, "rope": "neox",
         "qk_norm": True, "hidden_size": 4096, "prefix_cache": True, "sampling": True}


def loader_072(backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
               use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction):
    """get_batch_prefill_uri's parameters in FlashInfer 0.7.2."""


def loader_074(backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
               use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction, use_token_head_sf=False):
    """0.7.4 added use_token_head_sf with a default: the default is taken."""


def loader_new(backend, dtype_q, head_dim_qk, page_layout):
    """A release whose loader wants a value no shape field gives."""


VALUES = {"dtype_q": "q", "dtype_kv": "kv", "dtype_o": "o", "dtype_idx": "i", "head_dim_qk": 128,
          "head_dim_vo": 128, "pos_encoding_mode": 0, "use_sliding_window": False, "use_logits_soft_cap": False,
          "use_fp16_qk_reduction": False}


def test_loader_arguments_follow_each_releases_signature():
    assert kernels_aot._positional(loader_072, VALUES, skip=1) == ["q", "kv", "o", "i", 128, 128, 0, False, False, False]
    assert kernels_aot._positional(loader_074, VALUES, skip=1)[-1] is False
    with pytest.raises(kernels_aot.AotError, match="page_layout"):
        kernels_aot._positional(loader_new, VALUES, skip=1)


def test_the_undeclared_shape_differs_from_every_declared_head_dim():
    shapes = [SHAPE, dict(SHAPE, name="b", head_dim=64)]
    control = kernels_aot.undeclared_shape(shapes)
    assert control["head_dim"] not in (64, 128) and control["tp"] == [1]
    assert not control["prefix_cache"] and not control["sampling"]


def test_the_undeclared_rope_differs_from_a_declared_partial_rotary_dim():
    """GLM-4.5 rotates 64 of its 128 head dims: a control at head dim 64 would ask SGLang for GLM's own RoPE
    kernel, hit the cache and prove nothing (seen on the gallery's GLM-4.5 image, 2026-12-04)."""
    glm = dict(SHAPE, rotary_dim=64, tp=[8])
    control = kernels_aot.undeclared_shape([glm])
    assert control["head_dim"] not in (64, 128)
    assert kernels_aot.undeclared_shape([SHAPE])["head_dim"] == 64  # the control: no partial rotary, 64 is free


@pytest.mark.parametrize("arch, parts, number", [("12.0f", (12, 0, "f"), 120), ("9.0a", (9, 0, "a"), 90),
                                                 ("10.3", (10, 3, None), 103)])
def test_arch_forms(arch, parts, number):
    assert kernels_aot._arch_parts(arch) == parts and zero_jit.arch_number(arch) == number


def test_artifact_checks_name_a_missing_file_a_changed_one_and_missing_sass(tmp_path):
    library = tmp_path / "m.so"
    library.write_bytes(b"not an ELF")
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    manifest = {"artifacts": [{"name": "m", "path": str(library), "sha256": digest},
                              {"name": "gone", "path": str(tmp_path / "gone.so"), "sha256": digest},
                              {"name": "changed", "path": str(library), "sha256": "0" * 64}]}
    problems = zero_jit.check_artifacts(manifest, ["12.0f"])
    assert problems[0] == "m: no SASS for sm_120 (it holds none)"
    assert "gone.so is missing" in problems[1]
    assert any(p.startswith("changed: sha256") for p in problems)


def test_describe_reads_hash_size_and_no_gpu_code_from_a_host_library(tmp_path):
    path = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6") if os.path.exists(p))
    found = kernels_aot.describe(path)
    assert found["bytes"] == os.path.getsize(path) and found["sass"] == [] and len(found["sha256"]) == 64


AOT_SO = "/opt/flashinfer-aot/cascade/cascade.so"
SGLANG_SO = "/var/cache/sglang/jit/sm120f/rope_x/rope_x.so"
MANIFEST = {"artifacts": [{"kind": "flashinfer", "name": "cascade", "path": AOT_SO},
                          {"kind": "sglang", "name": "rope_x", "target": "sm120f", "path": SGLANG_SO}]}
# SGLang 0.5.23's own words when SGLANG_CRASH_ON_JIT_COMPILE forbids a compile (kernels/jit/utils/compile/loader.py)
REFUSAL = ("RuntimeError: JIT module 'rope_y' has no usable cached build under /var/cache/sglang/jit/sm120f, and "
           "SGLANG_CRASH_ON_JIT_COMPILE forbids compiling at runtime.")


def proof(**changes) -> dict:
    base = {"flashinfer": {"loaded": [{"module": "cascade", "shape": "a", "load": "cascade"}], "misses": [],
                           "undeclared": {"missed": True, "module": "batch_prefill_x", "error": "MissingJITCacheError"},
                           "asked_nothing": [], "mapped": [AOT_SO]},
            "sglang": {"arch": "12.0f", "cache_dir": "/var/cache/sglang/jit", "mapped": [SGLANG_SO],
                       "hits": [["a", "rope", None]], "misses": [],
                       "undeclared": [["undeclared", "rope", REFUSAL]]}}
    for path, value in changes.items():
        part, key = path.split(".")
        base[part][key] = value
    return base


def verdict(result: dict, nvcc_calls=(), manifest=None) -> dict:
    return zero_jit._verdict(json.loads(json.dumps(result)), 0, "", [], list(nvcc_calls),
                             MANIFEST if manifest is None else manifest)


def test_a_clean_proof_passes():
    check = verdict(proof())
    assert check["status"] == "pass" and "1 FlashInfer modules" in check["detail"] and "spawned" not in check["detail"]


def test_nvcc_listing_its_archs_is_said_and_is_no_compile():
    check = zero_jit._verdict(proof(), 0, "", [], [], MANIFEST, ["--list-gpu-arch"])
    assert check["status"] == "pass" and check["evidence"]["nvcc_queries"] == ["--list-gpu-arch"]
    assert "nvcc was spawned 1 time(s) to list its archs" in check["detail"]


def test_what_still_compiles_at_first_use_is_listed_by_name():
    first = {"triton": ["position.compute_position_kernel", "kv_indices.create_flashinfer_kv_indices_triton"],
             "modules": ["sglang.srt.model_executor.forward_batch_info"], "errors": []}
    check = verdict(proof(**{"sglang.first_use": first}))
    assert check["status"] == "pass"
    assert ("still compiled at first use, by Triton with its own ptxas (not seeded): 2 kernel(s) of the ops "
            "sglang.srt.model_executor.forward_batch_info import: position.compute_position_kernel, "
            "kv_indices.create_flashinfer_kv_indices_triton") in check["detail"]
    none = verdict(proof(**{"sglang.first_use": {"triton": [], "modules": [], "errors": ["x: ImportError: gone"]}}))
    assert "no Triton kernel found in what no module import (unreadable: x: ImportError: gone)" in none["detail"]


def test_first_use_triton_reads_the_kernels_of_the_ops_a_module_imports(tmp_path, monkeypatch):
    """A package laid out as SGLang's (mocked: no Triton here): a forward module importing an op whose module
    defines a Triton kernel (an object of a class named JITFunction, as triton.runtime.jit's) and a plain one."""
    ops = tmp_path / "sglang" / "kernels" / "ops"
    ops.mkdir(parents=True)
    for folder in (tmp_path / "sglang", tmp_path / "sglang" / "kernels", ops):
        (folder / "__init__.py").write_text("")
    (ops / "position.py").write_text("class JITFunction:\n    pass\n\ncompute_position_kernel = JITFunction()\n"
                                     "def compute_position_triton():\n    return compute_position_kernel\n")
    (tmp_path / "sglang" / "forward.py").write_text("from sglang.kernels.ops.position import compute_position_triton\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in list(__import__("sys").modules) if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    found = kernels_aot.first_use_triton(("sglang.forward", "sglang.missing"))
    assert found["triton"] == ["position.compute_position_kernel"] and found["modules"] == ["sglang.forward"]
    assert found["errors"][0].startswith("sglang.missing: ModuleNotFoundError")


def test_a_moe_shape_lists_its_router_s_triton_kernels_and_a_dense_one_does_not(tmp_path, monkeypatch):
    """SGLang's TopK imports moe_fused_gate inside its functions, so the proof reads the op's module itself, and
    only for a shape with experts: a dense forward never routes (mocked package: no Triton here)."""
    dense, moe = {"name": "llama"}, {"name": "glm", "experts": 160, "top_k": 8}
    assert kernels_aot.forward_modules([dense]) == kernels_aot.FORWARD_MODULES
    assert kernels_aot.forward_modules([dense, moe]) == kernels_aot.FORWARD_MODULES + kernels_aot.MOE_MODULES
    ops = tmp_path / "sglang" / "kernels" / "ops" / "moe"
    ops.mkdir(parents=True)
    for folder in (tmp_path / "sglang", ops.parent.parent, ops.parent, ops):
        (folder / "__init__.py").write_text("")
    (ops / "moe_fused_gate.py").write_text("class JITFunction:\n    pass\n\n_router_triton_kernel = JITFunction()\n"
                                           "def moe_fused_gate():\n    return _router_triton_kernel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in list(__import__("sys").modules) if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    found = kernels_aot.first_use_triton(kernels_aot.MOE_MODULES)
    assert found == {"triton": ["moe_fused_gate._router_triton_kernel"], "modules": list(kernels_aot.MOE_MODULES),
                     "errors": []}


def test_hidden_nvcc_answers_version_and_archs_as_the_real_one_and_refuses_to_compile(real_nvcc, tmp_path):
    """On the pip toolchain's real nvcc (a copy of its own, moved aside and back): --version and
    --list-gpu-arch answer what the real one says, a compile is refused and logged, and the file comes back."""
    import subprocess
    nvcc = Path(real_nvcc.nvcc)
    real_archs = subprocess.run([str(nvcc), "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    assert "compute_120" in real_archs
    before = nvcc.read_bytes()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with zero_jit.HiddenNvcc(str(nvcc.parent.parent), "Cuda compilation tools, release 13.0\n", str(scratch)) as hidden:
        ask = lambda *args: subprocess.run([str(nvcc), *args], capture_output=True, text=True)  # noqa: E731
        assert ask("--version").stdout == "Cuda compilation tools, release 13.0\n"
        assert ask("--list-gpu-arch").stdout == real_archs
        compile_ = ask("-c", str(real_nvcc.root / "kernel.cu"))
        assert compile_.returncode == 1 and "hidden by imagebuild" in compile_.stderr
        assert ask("--list-gpu-arch", "-v").returncode == 1  # only the exact question is answered
    assert hidden.queries() == ["--list-gpu-arch"]
    assert len(hidden.calls()) == 2 and hidden.calls()[0].startswith("-c ")
    assert nvcc.read_bytes() == before


@pytest.mark.parametrize("changes, nvcc, says", [
    ({"flashinfer.undeclared": {"missed": False, "module": "x", "error": None}}, (), "did not miss"),
    ({"flashinfer.misses": [{"shape": "a", "load": "prefill", "module": "m", "error": "MissingJITCacheError"}]},
     (), "FlashInfer missed"),
    ({"sglang.misses": [["a", "rope", "RuntimeError"]]}, (), "SGLang missed"),
    ({"sglang.undeclared": [["undeclared", "rope", None]]}, (), "not armed"),
    ({}, ("-c kernel.cu",), "nvcc was asked"),
    # coverage: a pass must show what loaded, never an empty proof
    ({"flashinfer.loaded": []}, (), "no declared load asked for cascade"),
    ({"flashinfer.asked_nothing": [{"shape": "a", "load": "sampling"}]}, (), "sampling for a loaded no module"),
    ({"flashinfer.mapped": []}, (), "cascade: asked for, but the process never mapped its file"),
    ({"sglang.mapped": []}, (), "no SGLang kernel was loaded from its cache"),
    ({"sglang.mapped": [SGLANG_SO, "/var/cache/sglang/jit/sm120f/other/other.so"]}, (),
     "SGLang loaded kernels the manifest does not list"),
    ({"sglang.undeclared": [["undeclared", "rope", "TypeError: rope() missing 1 required argument"]]}, (),
     "did not end in SGLang's refusal to compile"),
    ({"sglang.undeclared": [["undeclared", "rope", "ImportError: no module sglang.kernels"]]}, (),
     "did not end in SGLang's refusal to compile"),
])
def test_each_way_the_proof_can_fail_fails(changes, nvcc, says):
    check = verdict(proof(**changes), nvcc)
    assert check["status"] == "fail" and says in check["detail"]


def test_an_empty_manifest_and_an_empty_proof_never_pass():
    empty = {"flashinfer": {"loaded": [], "misses": [], "asked_nothing": [], "mapped": [],
                            "undeclared": {"missed": True, "module": "x", "error": "MissingJITCacheError"}}}
    check = verdict(empty, manifest={"artifacts": []})
    assert check["status"] == "fail" and "nothing to prove" in check["detail"]


def test_a_manifest_kernel_of_sglang_no_builder_loaded_fails_naming_it():
    manifest = {"artifacts": MANIFEST["artifacts"] + [
        {"kind": "sglang", "name": "kv", "target": "sm120f", "path": "/var/cache/sglang/jit/sm120f/kv/kv.so"}]}
    check = verdict(proof(), manifest=manifest)
    assert check["status"] == "fail" and "kv/kv.so" in check["detail"] and "no declared builder loaded" in check["detail"]


def test_mapped_under_reads_this_processes_own_maps(tmp_path):
    import ctypes
    import shutil
    import sysconfig
    library = next(p for p in (sysconfig.get_config_var("LIBDIR") or "", "/usr/lib/x86_64-linux-gnu", "/lib")
                   if os.path.isfile(os.path.join(p, "libz.so.1")))
    copy = tmp_path / "aot" / "m" / "m.so"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(os.path.join(library, "libz.so.1"), copy)
    assert kernels_aot.mapped_under(str(tmp_path / "aot")) == set()
    ctypes.CDLL(str(copy))
    assert kernels_aot.mapped_under(str(tmp_path / "aot")) == {os.path.realpath(copy)}


def test_no_result_from_the_child_fails_with_its_output():
    check = zero_jit._verdict(None, 1, "Traceback: boom", [], [], {})
    assert check["status"] == "fail" and "boom" in check["detail"]


def test_no_aot_table_is_a_skip():
    assert zero_jit.check_aot({"aot": None})["status"] == "skip"


def test_an_unreadable_manifest_fails(tmp_path):
    check = zero_jit.check_aot({"aot": {"manifest": str(tmp_path / "none.json"), "archs": ["12.0f"]}})
    assert check["status"] == "fail" and "unreadable" in check["detail"]
