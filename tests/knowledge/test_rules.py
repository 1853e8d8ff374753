"""The rules (knowledge/rules/recipe.py) over the facts in knowledge/compat.toml: each rule's error, warning and pass
cases, and that none raises on an odd version."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.knowledge import Finding, has_errors
from imagebuild.knowledge.facts import debian_suite, load_facts, torch_cuda
from imagebuild.knowledge.rules import (check_archs, check_driver, check_glibc, check_recipe, check_resolved,
                                        check_toolchain, check_torch)
from imagebuild.recipe.cuda import Arch, CudaVersion, parse_driver
from imagebuild.recipe.model import CudaSpec, DebianBase, ImageBase, PythonSpec, Recipe

CUDA_12_8 = CudaVersion(12, 8)
CUDA_13_0 = CudaVersion(13, 0)
CUDA_13_2 = CudaVersion(13, 2)

# The sglang 0.5.23 resolve for Python 3.11 / manylinux_2_36 (FACTS.md), toolchain part.
SGLANG_LOCK = {
    "torch": "2.14.1",
    "cuda-toolkit": "13.0.3.0",
    "nvidia-cuda-nvcc": "13.5.37",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cuda-cccl": "13.0.85",
    "nvidia-cuda-crt": "13.0.88",
    "nvidia-nvvm": "13.0.88",
    "nvidia-cublas": "13.1.0.3",  # its own versioning: never skew
    "triton": "3.8.0",
}


def rules(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.status, f.rule) for f in findings]


def recipe(*, toolkit="13.0", archs=("sm_120a",), min_driver="595.71.05", suite="bookworm",
           requirements=("sglang==0.5.23",), constraints=(), base=None, cuda=True) -> Recipe:
    spec = CudaSpec(CudaVersion.parse(toolkit), tuple(Arch.parse(a) for a in archs), min_driver)
    return Recipe(
        path=Path("/recipes/sglang.toml"), name="sglang", tag="test",
        base=base or DebianBase(suite), python=PythonSpec(tuple(requirements), tuple(constraints)),
        cuda=spec if cuda else None)


# --- check_driver -----------------------------------------------------------------------------

def test_driver_below_the_minor_version_floor_is_an_error():
    [finding] = check_driver(CUDA_13_0, "570.124.06")
    assert (finding.status, finding.rule) == ("error", "driver-too-old")
    assert "580" in finding.message and "570.124.06" in finding.evidence
    assert '[cuda].toolkit = "12.8"' in finding.fix  # the newest CUDA that driver runs natively
    assert "580.65.06" in finding.fix
    assert "minor version compatibility" in finding.source


def test_driver_at_the_toolkit_minimum_is_clean():
    assert check_driver(CUDA_13_0, "580.65.06") == []
    assert check_driver(CUDA_13_2, "595.71.05") == []
    assert check_driver(CUDA_12_8, "595.71.05") == []


def test_driver_under_minor_version_compat_is_a_warning_about_ptx():
    [finding] = check_driver(CUDA_13_2, "580.95.05")
    assert (finding.status, finding.rule) == ("warning", "driver-minor-compat")
    assert "PTX" in finding.message and "SASS" in finding.message
    assert "595.45.04" in finding.fix and '[cuda].toolkit = "13.0"' in finding.fix


def test_cuda_12_floor_is_525():
    assert rules(check_driver(CUDA_12_8, "470.82.01")) == [("error", "driver-too-old")]
    assert rules(check_driver(CUDA_12_8, "535.104.05")) == [("warning", "driver-minor-compat")]


@pytest.mark.parametrize("toolkit, driver, expected", [
    (CudaVersion(13, 4), "595.71.05", [("warning", "cuda-unknown")]),  # only the floor is known
    (CudaVersion(13, 4), "570.124.06", [("error", "driver-too-old")]),  # the floor still holds
    (CudaVersion(11, 8), "595.71.05", [("warning", "cuda-unknown")]),
    (CudaVersion(14, 0), "595.71.05", [("warning", "cuda-unknown")]),
])
def test_toolkits_without_a_known_minimum(toolkit, driver, expected):
    assert rules(check_driver(toolkit, driver)) == expected


# --- check_archs ------------------------------------------------------------------------------

def test_family_target_needs_cuda_12_9():
    [finding] = check_archs(CUDA_12_8, [Arch.parse("sm_120f")])
    assert (finding.status, finding.rule) == ("error", "arch-needs-newer-cuda")
    assert '[cuda].toolkit = "12.9"' in finding.fix and "sm_120a" in finding.fix


def test_dotted_and_string_targets_are_read_the_same():
    assert rules(check_archs(CUDA_12_8, ["12.0f"])) == [("error", "arch-needs-newer-cuda")]
    assert check_archs(CudaVersion(12, 9), ["12.0f", "sm_120f", Arch.parse("sm_100f")]) == []


@pytest.mark.parametrize("toolkit, arch", [
    (CUDA_12_8, "sm_120a"), (CUDA_12_8, "sm_100"), (CUDA_13_0, "sm_120f"), (CUDA_13_0, "sm_110a"),
    (CUDA_13_0, "sm_90a"), (CUDA_13_0, "sm_80"), (CudaVersion(11, 8), "sm_90"),
    (CudaVersion(12, 9), "sm_70"),
])
def test_targets_the_toolkit_knows_pass(toolkit, arch):
    assert check_archs(toolkit, [Arch.parse(arch)]) == []


@pytest.mark.parametrize("toolkit, arch, rule", [
    (CudaVersion(12, 9), "sm_110", "arch-needs-newer-cuda"),
    (CudaVersion(12, 4), "sm_120a", "arch-needs-newer-cuda"),
    (CUDA_13_0, "sm_70", "arch-dropped"),
    (CUDA_13_0, "sm_101a", "arch-dropped"),
])
def test_targets_outside_the_toolkit_are_errors(toolkit, arch, rule):
    assert rules(check_archs(toolkit, [arch])) == [("error", rule)]


def test_unknown_targets_are_warnings():
    assert rules(check_archs(CUDA_13_0, ["sm_80a", "sm_999", "garbage"])) == [
        ("warning", "arch-unknown")] * 3


# --- check_glibc ------------------------------------------------------------------------------

def test_trixie_glibc_breaks_nvcc_before_13_2():
    [finding] = check_glibc(debian_suite("trixie").glibc, CUDA_13_0)
    assert (finding.status, finding.rule) == ("error", "glibc-breaks-nvcc")
    assert '[cuda].toolkit = "13.2"' in finding.fix and '[base].debian = "bookworm"' in finding.fix
    assert "38516" in finding.source


@pytest.mark.parametrize("glibc, nvcc", [("2.41", CUDA_13_2), ("2.36", CUDA_13_0),
                                         ("2.43", CudaVersion(13, 5)), ("2.31", CUDA_12_8)])
def test_glibc_and_nvcc_that_agree(glibc, nvcc):
    assert check_glibc(glibc, nvcc) == []


def test_an_unreadable_glibc_is_a_warning():
    assert rules(check_glibc("two", CUDA_13_0)) == [("warning", "glibc-unknown")]


# --- check_torch ------------------------------------------------------------------------------

def test_torch_matching_the_toolkit_is_clean():
    assert check_torch("2.14.1", CUDA_13_0) == []
    assert check_torch("2.14.1+cu130", CUDA_13_0) == []
    assert check_torch("2.10.0", CUDA_12_8) == []


def test_torch_built_for_another_cuda_is_an_error():
    [finding] = check_torch("2.14.1+cu130", CUDA_12_8)
    assert (finding.status, finding.rule) == ("error", "torch-cuda-mismatch")
    assert '[cuda].toolkit = "13.0"' in finding.fix and "torch==2.14.1+cu128" in finding.fix
    assert "+cu130" in finding.source


@pytest.mark.parametrize("version", ["2.14.1+cu128", "2.14.1+cpu", "2.9.0+rocm6.4"])
def test_torch_builds_without_the_toolkit_are_errors(version):
    assert rules(check_torch(version, CUDA_13_0)) == [("error", "torch-cuda-mismatch")]


def test_a_plain_torch_pin_is_left_to_the_wheel_read_at_lock():
    """No per-release table: torch 2.9.1 (CUDA 12.8 on PyPI) is caught by lock from its METADATA
    (tests/lock/test_artifacts.py), not guessed here."""
    assert check_torch("2.99.0", CUDA_13_0) == [] and check_torch("2.9.1", CUDA_13_0) == []
    assert check_torch("2.14.1+cu130", CUDA_13_0) == []


# --- check_toolchain --------------------------------------------------------------------------

def test_sglang_nvcc_skew_is_an_error_with_the_constraint_to_add():
    [finding] = check_toolchain(SGLANG_LOCK, CUDA_13_0)
    assert (finding.status, finding.rule) == ("error", "toolchain-skew")
    assert "nvidia-cuda-nvcc" in finding.message and "13.5.37" in finding.evidence
    assert "nvidia-cuda-runtime 13.0.96" in finding.evidence
    assert finding.fix == 'add "nvidia-cuda-nvcc==13.0.*" to [python].constraints, then relock'


def test_a_toolchain_in_step_is_clean():
    assert check_toolchain({**SGLANG_LOCK, "nvidia-cuda-nvcc": "13.0.88"}, CUDA_13_0) == []


def test_names_are_canonicalized_and_torch_is_checked():
    lock = {"NVIDIA_CUDA_Runtime": "12.8.90", "torch": "2.9.0+cu128"}
    assert rules(check_toolchain(lock, CUDA_13_0)) == [("error", "toolchain-skew"),
                                                       ("error", "torch-cuda-mismatch")]


def test_cu12_names_are_checked_only_for_cuda_12():
    lock = {"nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-nvjitlink-cu12": "12.9.86"}
    assert rules(check_toolchain(lock, CUDA_12_8)) == [("error", "toolchain-skew")]
    assert check_toolchain(lock, CUDA_13_0) == []


def test_a_version_without_major_minor_is_a_warning():
    assert rules(check_toolchain({"nvidia-nvvm": "13"}, CUDA_13_0)) == [
        ("warning", "toolchain-version-unknown")]


# --- whole recipes ----------------------------------------------------------------------------

def test_a_good_recipe_is_clean():
    assert check_recipe(recipe(constraints=("torch==2.14.1",))) == []


def test_a_recipe_without_cuda_has_nothing_to_check():
    assert check_recipe(recipe(cuda=False, suite="trixie")) == []
    assert check_resolved(recipe(cuda=False), SGLANG_LOCK, None) == []


def test_recipe_collects_every_rule():
    findings = check_recipe(recipe(
        min_driver="560.35.03", archs=("sm_120a", "sm_110"), toolkit="12.8", suite="trixie",
        requirements=("sglang==0.5.23", "torch==2.14.1+cu130"), constraints=("torch==2.14.1+cu130",)))
    assert rules(findings) == [("warning", "driver-minor-compat"),
                               ("error", "arch-needs-newer-cuda"),
                               ("error", "glibc-breaks-nvcc"),
                               ("error", "torch-cuda-mismatch")]  # one pin, checked once
    assert has_errors(findings)


def test_recipe_glibc_comes_from_the_argument_then_the_base():
    trixie = recipe(suite="trixie")
    assert rules(check_recipe(trixie)) == [("error", "glibc-breaks-nvcc")]
    assert check_recipe(trixie, "2.36") == []
    assert check_recipe(recipe(toolkit="13.2", suite="trixie")) == []
    image = ImageBase("registry.example/x/y@sha256:" + "0" * 64, python="3.13", glibc="2.41")
    assert rules(check_recipe(recipe(base=image))) == [("error", "glibc-breaks-nvcc")]
    assert check_recipe(recipe(suite="sid")) == []  # an unknown suite is the parser's to report


def test_recipe_torch_pins_ignore_ranges_and_bad_lines():
    findings = check_recipe(recipe(requirements=(
        "torch>=2.9", "torch==2.14.*", "not a requirement ===", "torchvision==0.24.0",
        "torch[opt]==2.10.0+cu128; sys_platform == 'linux'")))
    assert rules(findings) == [("error", "torch-cuda-mismatch")]
    assert "2.10.0" in findings[0].evidence


def test_resolved_sglang_lock():
    findings = check_resolved(recipe(), SGLANG_LOCK, None)
    assert rules(findings) == [("error", "toolchain-skew")]


def test_resolved_nvcc_against_trixie_glibc():
    lock = {**SGLANG_LOCK, "nvidia-cuda-nvcc": "13.0.88"}
    assert rules(check_resolved(recipe(), lock, "2.41")) == [("error", "glibc-breaks-nvcc")]
    assert check_resolved(recipe(), lock, "2.36") == []
    assert check_resolved(recipe(), {}, "2.41") == []  # no pip nvcc: check_recipe covered it
    newer = {"cuda-toolkit": "13.2.1.0", "nvidia-cuda-nvcc": "13.2.51", "nvidia-cuda-crt": "13.2.51"}
    assert check_resolved(recipe(toolkit="13.2", suite="trixie"), newer, None) == []


def test_findings_serialize_and_has_errors():
    [finding] = check_driver(CUDA_13_2, "580.95.05")
    assert finding.to_dict() == {"severity": "warning", "rule": "driver-minor-compat",
                                 "message": finding.message, "evidence": finding.evidence,
                                 "fix": finding.fix, "source": finding.source}
    assert not has_errors([finding]) and not has_errors([])
    assert has_errors([finding, *check_driver(CUDA_13_0, "570.124.06")])


# --- nothing raises on odd versions -----------------------------------------------------------

version_ish = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,4}){0,4}(\.post[0-9]|rc[0-9]|\.dev[0-9])?"
                  r"(\+[a-z0-9.]{1,8})?\Z"),
    st.sampled_from(["13.0.88", "13.0.3.0", "2.14.1+cu130", "2.14.1+cpu", "1!2.0", "13.5.37.post1",
                     "0.0.1", "v13.0", "13.0.*", "", " ", "+cu130"]),
)
cuda_versions = st.builds(CudaVersion, st.integers(0, 99), st.integers(0, 99))
drivers = st.from_regex(r"\A\d{3}(\.\d{1,3}){1,2}\Z")
names = st.one_of(st.sampled_from(sorted(load_facts().toolchain) + ["torch", "Torch"]), st.text(max_size=12))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(names, version_ish, max_size=8), cuda_versions)
def test_check_toolchain_never_raises(packages, toolkit):
    assert all(isinstance(f, Finding) for f in check_toolchain(packages, toolkit))


@settings(max_examples=300, deadline=None)
@given(version_ish, cuda_versions)
def test_check_torch_never_raises(version, toolkit):
    findings = check_torch(version, toolkit)
    assert len(findings) <= 1
    assert torch_cuda(version) is None or isinstance(torch_cuda(version), CudaVersion)


@settings(max_examples=300, deadline=None)
@given(cuda_versions, drivers)
def test_check_driver_never_raises_on_valid_drivers(toolkit, driver):
    parse_driver(driver)
    findings = check_driver(toolkit, driver)
    assert len(findings) <= 1 and all(f.status in ("error", "warning") for f in findings)


@settings(max_examples=200, deadline=None)
@given(version_ish, cuda_versions)
def test_check_glibc_never_raises(glibc, nvcc):
    check_glibc(glibc, nvcc)
