"""Nothing passes on nothing: a check that saw nothing says so (skip or unknown), never pass. Each case
below passed on main before issue 38: gpu-arch with torch's arch list unreadable, an nvidia-smi that
listed no GPU, a report of skips alone, zero-JIT's SGLang coverage of the first [aot] arch only, and
patched files no check read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from imagebuild.payload import apply_patch
from imagebuild.payload.probe import gpus, report
from imagebuild.payload.probe.checks import stack, toolchain, zero_jit
from imagebuild.payload.probe.doctor import findings_host
from tests.json_fuzz import json_values
from tests.payload.test_apply_patch import FIXTURES, apply, demo_site, unified, write_patch

BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


# ---- gpu-arch ----------------------------------------------------------------------------------

def arch_facts(torch: dict, flashinfer_list: str | None = None, deep_gemm: dict | None = None) -> dict:
    return {"driver": {"gpus": [{"name": BLACKWELL, "driver": "595.71.05", "compute_cap": "12.0"}]},
            "torch": torch, "deep_gemm_jit": deep_gemm or {"installed": False},
            "flashinfer": {"arch_list": flashinfer_list}}


CUDA_TORCH_UNREAD = {"installed": True, "version": "2.14.1+cu130", "cuda": "13.0", "archs": [], "archs_from": None,
                     "package": "/venv/lib/python3.11/site-packages/torch"}


def test_gpu_arch_with_torchs_arch_list_unreadable_is_unknown_not_a_pass():
    finding = findings_host.finding_gpu_arch(arch_facts(CUDA_TORCH_UNREAD))
    assert finding["status"] == "unknown" and "arch list could not be read" in finding["detail"]
    # what else was seen is said, and still no pass
    finding = findings_host.finding_gpu_arch(arch_facts(CUDA_TORCH_UNREAD, flashinfer_list="12.0f"))
    assert finding["status"] == "unknown" and "covers sm_120" in finding["detail"]


def test_gpu_arch_with_nothing_to_compare_is_a_skip():
    finding = findings_host.finding_gpu_arch(arch_facts({"installed": False}))
    assert finding["status"] == "skip" and "nothing here carries GPU kernels" in finding["detail"]
    cpu_torch = {"installed": True, "version": "2.13.0+cpu", "cuda": None, "archs": []}
    assert findings_host.finding_gpu_arch(arch_facts(cpu_torch))["status"] == "skip"


def test_gpu_arch_passes_saying_what_it_compared():
    torch = dict(CUDA_TORCH_UNREAD, archs=["sm_90", "sm_100", "sm_120"])
    finding = findings_host.finding_gpu_arch(arch_facts(torch))
    assert finding["status"] == "pass" and finding["detail"] == "compute 12.0: torch has kernels for sm_120"


# ---- nvidia-smi that lists no GPU (a fake nvidia-smi: this machine has no GPU) ----------------------

@pytest.fixture
def fake_smi_listing_nothing(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n# fake nvidia-smi: the driver answers, no device is visible\nexit 0\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return script


def test_fake_nvidia_smi_listing_no_gpu_fails_the_gpu_check(fake_smi_listing_nothing):
    check = stack.check_gpu()
    assert check["status"] == "fail" and "nvidia-smi listed no GPU" in check["detail"]


def test_fake_nvidia_smi_listing_no_gpu_is_a_driver_error_in_doctor(fake_smi_listing_nothing, tmp_path):
    driver = gpus.read_driver(str(tmp_path / "no-driver-file"))
    assert driver["error"] == "nvidia-smi listed no GPU" and driver["gpus"] == []
    finding = findings_host.finding_driver({"driver": driver})
    assert finding["status"] == "fail" and "listed no GPU" in finding["detail"] and "--gpus all" in finding["fix"]


def test_fake_nvidia_smi_listing_a_gpu_passes(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\n# fake nvidia-smi\necho '{BLACKWELL}, 595.71.05, 12.0'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    check = stack.check_gpu()
    assert check["status"] == "pass" and BLACKWELL in check["detail"]


# ---- a report of skips alone ---------------------------------------------------------------------

@pytest.mark.parametrize("statuses, ok", [
    (["skip", "skip"], False),
    ([], False),
    (["skip", "unknown"], False),
    (["skip", "pass", "warn"], True),
    (["pass", "fail"], False),
])
def test_a_report_is_ok_only_when_something_passed_and_nothing_failed(statuses, ok):
    checks = [report.make_check(f"c{i}", status, "seen") for i, status in enumerate(statuses)]
    assert report.make_report(checks)["ok"] is ok


# ---- zero-JIT: SGLang's kernels of every [aot] arch ------------------------------------------------

SGLANG_120 = "/var/cache/sglang/jit/sm120f/rope_x/rope_x.so"
SGLANG_100 = "/var/cache/sglang/jit/sm100f/rope_x/rope_x.so"
REFUSAL = ("RuntimeError: JIT module 'rope_y' has no usable cached build under /var/cache/sglang/jit/sm120f, and "
           "SGLANG_CRASH_ON_JIT_COMPILE forbids compiling at runtime.")


def two_arch_proof(mapped: list) -> dict:
    return {"flashinfer": {"loaded": [], "misses": [], "asked_nothing": [], "mapped": [],
                           "undeclared": {"missed": True, "module": "x", "error": "MissingJITCacheError"}},
            "sglang": {"arch": "12.0f, 10.0f", "archs": ["12.0f", "10.0f"], "cache_dir": "/var/cache/sglang/jit",
                       "mapped": mapped, "hits": [["a for 12.0f", "rope", None]], "misses": [],
                       "undeclared": [["undeclared for 12.0f", "rope", REFUSAL]]}}


TWO_ARCH_MANIFEST = {"artifacts": [{"kind": "sglang", "name": "rope_x", "target": "sm120f", "path": SGLANG_120},
                                   {"kind": "sglang", "name": "rope_x", "target": "sm100f", "path": SGLANG_100}]}


def test_sglang_kernels_of_a_second_arch_that_nothing_loaded_fail_the_coverage():
    problems = zero_jit.coverage_problems(two_arch_proof([SGLANG_120]), TWO_ARCH_MANIFEST)
    assert any("no declared builder loaded" in p and SGLANG_100 in p for p in problems), problems
    assert zero_jit.coverage_problems(two_arch_proof([SGLANG_120, SGLANG_100]), TWO_ARCH_MANIFEST) == []


# ---- patched files, checked against what the patch left at build time -------------------------------

def patched_demo(tmp_path: Path) -> tuple[Path, Path, dict]:
    site, info = demo_site(tmp_path)
    patch = FIXTURES / "demo.git.patch"
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    apply(site, patch, sha)
    expect = {"packages": {"demo-dist": "0.1"}, "patches": [{"package": "demo-dist", "sha256": sha}]}
    return site, info, expect


def packages(expect: dict, site: Path) -> dict:
    return toolchain.check_packages(expect, {"demo-dist": ["0.1"]}, site=[str(site)])


def test_apply_patch_records_what_each_file_was_left_as(tmp_path):
    site, info, _ = patched_demo(tmp_path)
    produced = json.loads((info / apply_patch.PATCHED_FILES).read_text())
    assert produced == {"demo/__init__.py": hashlib.sha256((site / "demo/__init__.py").read_bytes()).hexdigest(),
                        "demo/core.py": hashlib.sha256((site / "demo/core.py").read_bytes()).hexdigest(),
                        "demo/extra.py": hashlib.sha256((site / "demo/extra.py").read_bytes()).hexdigest(),
                        "demo/legacy.py": None}
    assert (toolchain.PATCHES_FILE, toolchain.PATCHED_FILES) == (apply_patch.PATCHES_FILE, apply_patch.PATCHED_FILES)


def test_a_second_patch_updates_the_record_of_its_files(tmp_path):
    site, info, expect = patched_demo(tmp_path)
    text = (site / "demo/extra.py").read_text()
    second, second_sha = write_patch(tmp_path, unified(text, text + "\nMORE = 1\n", "demo/extra.py"))
    apply(site, second, second_sha)
    produced = json.loads((info / apply_patch.PATCHED_FILES).read_text())
    assert produced["demo/extra.py"] == hashlib.sha256((site / "demo/extra.py").read_bytes()).hexdigest()
    expect["patches"].append({"package": "demo-dist", "sha256": second_sha})
    assert packages(expect, site)["status"] == "pass"


def test_patched_files_as_the_patch_left_them_pass_saying_how_many(tmp_path):
    site, _, expect = patched_demo(tmp_path)
    check = packages(expect, site)
    assert check["status"] == "pass" and "4 patched files as their patches left them" in check["detail"]
    assert check["evidence"]["patched_files"] == 4


def test_a_patched_file_changed_after_the_patch_fails_naming_it(tmp_path):
    site, _, expect = patched_demo(tmp_path)
    (site / "demo/core.py").write_text("# a later step put the unpatched file back\n")
    check = packages(expect, site)
    assert check["status"] == "fail" and "demo-dist: demo/core.py is sha256" in check["detail"]


@pytest.mark.parametrize("undo, says", [
    (lambda site, info: (info / apply_patch.PATCHED_FILES).unlink(), "no IMAGEBUILD_PATCHED_FILES.json"),
    (lambda site, info: (info / apply_patch.PATCHES_FILE).unlink(), "IMAGEBUILD_PATCHES lists no patch"),
    (lambda site, info: (site / "demo/legacy.py").write_text("back\n"), "demo/legacy.py is sha256"),
    (lambda site, info: (site / "demo/extra.py").unlink(), "demo/extra.py is missing"),
])
def test_each_way_a_patch_can_be_undone_fails(tmp_path, undo, says):
    site, info, expect = patched_demo(tmp_path)
    undo(site, info)
    check = packages(expect, site)
    assert check["status"] == "fail" and says in check["detail"], check["detail"]


def test_a_patched_package_not_installed_fails(tmp_path):
    site, _, expect = patched_demo(tmp_path)
    expect["patches"].append({"package": "other-dist", "sha256": "0" * 64})
    check = toolchain.check_packages(dict(expect, packages={"demo-dist": "0.1", "other-dist": "1"}),
                                     {"demo-dist": ["0.1"], "other-dist": ["1"]}, site=[str(site)])
    assert check["status"] == "fail" and "other-dist is patched by the lock but not installed" in check["detail"]


# ---- what the image holds is outside input: no content of the record ends in a traceback ------------

@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.one_of(json_values.map(json.dumps), st.text(max_size=40), st.binary(max_size=40)))
@example(record='{"\\u0000": null}')  # a path with a NUL byte: open() raises ValueError, not OSError (found by CI)
def test_any_record_of_patched_files_is_a_verdict_never_a_traceback(tmp_path_factory, record):
    site, info, expect = patched_demo(tmp_path_factory.mktemp("any"))
    path = info / apply_patch.PATCHED_FILES
    path.write_bytes(record if isinstance(record, bytes) else record.encode("utf-8", "surrogatepass"))
    check = packages(expect, site)
    assert check["status"] in ("pass", "fail") and check["detail"]
    if check["status"] == "pass":  # only a record naming real files with their real hashes passes
        assert json.loads(path.read_text()) and check["evidence"]["patched_files"] > 0
    # apply_patch reads the same record before a second patch: one PatchError or an update, never a traceback
    text = (site / "demo/core.py").read_text()
    second, second_sha = write_patch(tmp_path_factory.mktemp("patch"), unified(text, text + "\nMORE = 1\n",
                                                                                "demo/core.py"))
    try:
        apply(site, second, second_sha)
    except apply_patch.PatchError as refused:
        assert apply_patch.PATCHED_FILES in str(refused)
