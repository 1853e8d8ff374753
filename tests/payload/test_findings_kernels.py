"""Doctor's deep_gemm cache finding and the cubin reader behind it. The GPUs are stand-ins (no GPU here):
each test that names one says so; the cache folders hold cubin headers as nvcc writes them."""

from __future__ import annotations

import shutil
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.payload.probe.doctor.findings_kernels import cached_archs, cubin_arch, finding_deep_gemm_cache


def write_cubin(path, sm: int) -> None:
    """A cubin-shaped ELF64 header of the test's own (machine EM_CUDA 190, the SM in e_flags bits 8..15),
    for the edge cases; what nvcc really writes is read in the real_nvcc tests below."""
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[4], head[5] = 2, 1
    struct.pack_into("<H", head, 18, 190)
    struct.pack_into("<I", head, 48, (sm << 8) | 0x5)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(head) + b"\0" * 64)


def facts(cache, *caps):
    return {"deep_gemm_jit": {"installed": True},
            "caches": [{"package": "deep_gemm", "path": str(cache)}],
            "driver": {"gpus": [{"compute_cap": cap} for cap in caps]}}


def test_cubin_arch_reads_the_sm(tmp_path):
    write_cubin(tmp_path / "k.cubin", 120)
    assert cubin_arch(str(tmp_path / "k.cubin")) == 120
    (tmp_path / "x.cubin").write_bytes(b"\x7fELF" + b"\0" * 60)  # not EM_CUDA
    assert cubin_arch(str(tmp_path / "x.cubin")) is None


@given(st.binary(max_size=128))
def test_cubin_arch_never_raises(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cubin") / "k.cubin"
    path.write_bytes(data)
    assert cubin_arch(str(path)) in (None, *range(1, 256))


def test_deep_gemm_switched_off_is_nothing_to_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_JIT_DEEPGEMM", "0")
    found = finding_deep_gemm_cache(facts(tmp_path / "dg", "12.0"), {"deep_gemm": "disabled"})
    assert found["status"] == "pass" and found["evidence"]["mode"] == "disabled"


def test_an_image_built_with_deep_gemm_disabled_but_switched_on_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_JIT_DEEPGEMM", "1")
    found = finding_deep_gemm_cache(facts(tmp_path / "dg"), {"deep_gemm": "disabled"})
    assert found["status"] == "fail" and found["fix"] == "export SGLANG_ENABLE_JIT_DEEPGEMM=0"


def test_an_empty_cache_will_miss(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_ENABLE_JIT_DEEPGEMM", raising=False)
    found = finding_deep_gemm_cache(facts(tmp_path / "dg", "12.0"))
    assert found["status"] == "warn" and "empty" in found["detail"]
    assert "SGLANG_ENABLE_JIT_DEEPGEMM=0" in found["fix"]


def test_mock_gpu_a_cache_for_this_gpu_hits_and_one_for_another_misses(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_ENABLE_JIT_DEEPGEMM", raising=False)
    write_cubin(tmp_path / "dg" / "cache" / "kernel.sm120_bf16_gemm" / "kernel.cubin", 120)
    assert cached_archs(str(tmp_path / "dg")) == (1, {120})
    hit = finding_deep_gemm_cache(facts(tmp_path / "dg", "12.0"))  # a stand-in RTX PRO 6000
    assert hit["status"] == "pass" and "sm_120" in hit["detail"]
    miss = finding_deep_gemm_cache(facts(tmp_path / "dg", "9.0"))  # a stand-in H100
    assert miss["status"] == "warn" and "none for sm_90" in miss["detail"]


def test_without_deep_gemm_there_is_nothing_to_report(tmp_path):
    assert finding_deep_gemm_cache({"deep_gemm_jit": {"installed": False}})["status"] == "skip"


@pytest.mark.parametrize("arch, sm", [("sm_90a", 90), ("sm_100a", 100), ("sm_120a", 120)])
def test_cubin_arch_reads_cubins_the_real_nvcc_wrote(real_nvcc, arch, sm):
    assert cubin_arch(str(real_nvcc.cubin(arch))) == sm


def test_a_host_object_nvcc_wrote_is_no_cubin(real_nvcc):
    """The negative control: an ELF nvcc made for the host (EM_X86_64, fat binary inside) is not a cubin."""
    assert cubin_arch(str(real_nvcc.library("host", (120,)))) is None


def test_mock_gpu_a_real_cubin_in_the_cache_hits_its_gpu_and_misses_another(real_nvcc, tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_ENABLE_JIT_DEEPGEMM", raising=False)
    target = tmp_path / "dg" / "cache" / "kernel.sm120_bf16_gemm" / "kernel.cubin"
    target.parent.mkdir(parents=True)
    shutil.copyfile(real_nvcc.cubin("sm_120a"), target)
    assert cached_archs(str(tmp_path / "dg")) == (1, {120})
    assert finding_deep_gemm_cache(facts(tmp_path / "dg", "12.0"))["status"] == "pass"  # a stand-in RTX PRO 6000
    assert finding_deep_gemm_cache(facts(tmp_path / "dg", "9.0"))["status"] == "warn"  # a stand-in H100
