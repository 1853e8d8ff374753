"""What the probe compiles for deep_gemm, read from the installed release (payload/probe/checks/deep_gemm_release.py).

Pure parts on examples and arbitrary text; then the four real sgl-deep-gemm releases on PyPI (0.2.2,
0.2.3, 0.2.3.post2 pinned, 0.2.5 newest): what is read from each, and a real nvcc compile of each in a
venv with the pip CUDA 13.0 toolchain. Negative controls: a parameter the probe has no value for, an
unreadable DeepJIT, removed CUDA headers and an arch nvcc cannot target.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import missing_tool
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.payload import probe
from imagebuild.payload.probe.checks import cxx_source, deep_gemm_release as release

RELEASES = ("0.2.2", "0.2.3", "0.2.3.post2", "0.2.5")
PAYLOAD = Path(probe.__file__).resolve().parent.parent
TOOLKIT = "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0"


# ---------------------------------------------------------------- C++ reading

HEADER = """
// a comment with template <int X> f( in it
template <uint32_t SHAPE_M, /* inline */ uint32_t BLOCK_M,
          GemmType kGemmType, bool kFlag,
          typename cd_t,
          typename epi_t = epilogue::Identity,
          uint32_t kEpiSubM = BLOCK_M,
          bool kLast = false>
CUTLASS_GLOBAL __launch_bounds__(BLOCK_M + 1, 1) void
kernel_impl(cd_t* d, int n) {
    const char* s = "template <x> kernel_impl(";
}
"""
VALUES = {"SHAPE_M": "0", "BLOCK_M": "128", "kGemmType": "GemmType::Normal", "kFlag": "false",
          "cd_t": "float", "kEpiSubM": "64"}


def test_template_parameters_are_read_by_name_with_kinds_and_defaults():
    parameters = cxx_source.template_parameters(HEADER, "kernel_impl")
    assert [(p["kind"], p["name"], p["default"]) for p in parameters] == [
        ("uint32_t", "SHAPE_M", None), ("uint32_t", "BLOCK_M", None), ("GemmType", "kGemmType", None),
        ("bool", "kFlag", None), ("typename", "cd_t", None), ("typename", "epi_t", "epilogue::Identity"),
        ("uint32_t", "kEpiSubM", "BLOCK_M"), ("bool", "kLast", "false")]
    assert cxx_source.template_parameters(HEADER, "other_impl") is None


def test_arguments_follow_the_header_order_keep_defaults_between_and_drop_trailing_ones():
    arguments = release.kernel_arguments(cxx_source.template_parameters(HEADER, "kernel_impl"), VALUES)
    assert [a["value"] for a in arguments] == ["0", "128", "GemmType::Normal", "false", "float",
                                               "epilogue::Identity", "64"]
    assert [a["from"] for a in arguments][5:] == ["default", "chosen"]
    # A default that names an earlier parameter gets that parameter's value.
    without = {k: v for k, v in VALUES.items() if k != "kEpiSubM"}
    assert [a["value"] for a in release.kernel_arguments(
        cxx_source.template_parameters(HEADER, "kernel_impl") + [
            {"kind": "uint32_t", "name": "kMore", "default": None, "text": "uint32_t kMore"}],
        dict(without, kMore="1"))][6] == "128"


def test_a_parameter_the_probe_has_no_value_for_is_unreadable_not_guessed():
    renamed = HEADER.replace("uint32_t BLOCK_M,", "uint32_t BLOCK_ROWS,")
    with pytest.raises(release.Unreadable, match="`uint32_t BLOCK_ROWS` is new to this probe"):
        release.kernel_arguments(cxx_source.template_parameters(renamed, "kernel_impl"), VALUES)
    retyped = HEADER.replace("bool kFlag,", "uint32_t kFlag,")
    with pytest.raises(release.Unreadable, match="`uint32_t kFlag` does not take false"):
        release.kernel_arguments(cxx_source.template_parameters(retyped, "kernel_impl"), VALUES)
    enum = HEADER.replace("GemmType kGemmType", "KernelKind kGemmType")
    with pytest.raises(release.Unreadable, match="its kind changed"):
        release.kernel_arguments(cxx_source.template_parameters(enum, "kernel_impl"), VALUES)


OPTIONS = """
struct CompilerOptions {
    static CompilerOptions default_options(const Env& env, Device& device) {
        const bool debug = env.get<bool>("JIT_DEBUG", false);
        return {
            .optimize_level = "3",
            .fast_math = false,
            .ptxas_verbose = debug or env.get<bool>("JIT_PTXAS_VERBOSE", false),
            .arch = device.get_arch(),
            .nvcc_flags = std::vector<std::string> {
                std::format("-std=c++{}", env.get<int>("JIT_CPP_STANDARD", 20)),
                "--expt-relaxed-constexpr",   // CUTLASS needs it
            },
            .post_hook = std::nullopt
        };
    }
    [[nodiscard]] std::vector<std::string> get_flags() const {
        DJ_HOST_ASSERT(arch.has_value(), "CUDA architecture must be specified");
        std::vector flags = {"--gpu-architecture=sm_" + *arch};
        flags.emplace_back("-O" + *optimize_level);
        if (fast_math.value_or(false))
            flags.emplace_back("--use_fast_math");
        if (ptxas_verbose.value_or(false))
            flags.emplace_back("--ptxas-options=--verbose");
        if (nvcc_flags)
            flags.insert(flags.end(), nvcc_flags->begin(), nvcc_flags->end());
        flags.insert(flags.end(), extra_nvcc_flags.begin(), extra_nvcc_flags.end());
        return flags;
    }
};
"""


def flags_for(environ, text=OPTIONS, arch="120f"):
    return release.option_flags(text, release.default_options(text, environ, arch))


def test_deepjit_options_are_evaluated_in_their_order_with_the_environment():
    assert flags_for({}) == ["--gpu-architecture=sm_120f", "-O3", "-std=c++20", "--expt-relaxed-constexpr"]
    assert flags_for({"DG_JIT_CPP_STANDARD": "17", "DG_JIT_DEBUG": "yes"}) == [
        "--gpu-architecture=sm_120f", "-O3", "--ptxas-options=--verbose", "-std=c++17", "--expt-relaxed-constexpr"]
    assert "-std=c++23" in flags_for({"DJ_JIT_CPP_STANDARD": "23"})  # DeepJIT's global prefix, after DG_
    assert "-std=c++20" in flags_for({"DG_JIT_CPP_STANDARD": "20", "DJ_JIT_CPP_STANDARD": "23"})


@pytest.mark.parametrize("change, reason", [
    (('"-O" + *optimize_level', '"-O" + optimize_level.value()'), "cannot evaluate"),
    (("if (fast_math.value_or(false))", "if (fast_math.value_or(false) and debug)"), "cannot evaluate the condition"),
    (("flags.emplace_back(\"-O\"", "flags.append_range(\"-O\""), "cannot follow"),
    ((".fast_math = false,", ".fast_math = compute_fast_math(env),"), "cannot evaluate"),
    (("default_options(", "defaults("), "no CompilerOptions::default_options"),
    (("get_flags()", "flags()"), "no CompilerOptions::get_flags"),
])
def test_deepjit_code_this_reader_does_not_follow_is_unreadable(change, reason):
    with pytest.raises(release.Unreadable, match=reason):
        flags_for({}, OPTIONS.replace(*change))


def test_an_environment_value_deep_gemm_would_refuse_is_unreadable():
    with pytest.raises(release.Unreadable, match="DG_JIT_CPP_STANDARD='twenty'"):
        flags_for({"DG_JIT_CPP_STANDARD": "twenty"})


DEVICE = """
    std::string get_arch(const bool use_arch_family = true, const bool number_only = false) {
        const auto [major, minor] = get_arch_pair();
        const auto arch = std::to_string(major * 10 + minor);
        if (number_only or major < 9)
            return arch;
        if (major > 9)
            return arch + (use_arch_family ? "f" : "a");
        return arch + "a";
    }
"""


@pytest.mark.parametrize("sm, arch", [(120, "120f"), (121, "121f"), (100, "100f"), (90, "90a"), (80, "80")])
def test_device_arch_follows_get_arch(sm, arch):
    assert release.device_arch(DEVICE, sm) == arch
    assert release.device_arch(DEVICE.replace("use_arch_family = true", "use_arch_family = false"), 120) == "120a"


def test_sm_targets_take_the_sm12x_spellings_of_a_recipe():
    assert release.sm_targets(["sm_120a", "12.0f", "sm_121", "sm_90a", "10.0", None, 7]) == [120, 121]
    assert release.sm_targets("sm_120a") == []


@given(st.text(max_size=400), st.text(max_size=30))
def test_cxx_readers_never_raise(text, name):
    cxx_source.strip_comments(text)
    cxx_source.split_top_level(text, ",", angles=True)
    parameters = cxx_source.template_parameters(text, name or "f")
    assert parameters is None or isinstance(parameters, list)


@given(st.text(max_size=300), st.dictionaries(st.sampled_from(["DG_JIT_DEBUG", "DG_JIT_CPP_STANDARD"]),
                                              st.text(max_size=5)), st.integers(0, 200))
def test_deepjit_readers_raise_only_unreadable(text, environ, sm):
    for call in (lambda: flags_for(environ, OPTIONS + text), lambda: flags_for(environ, text),
                 lambda: release.device_arch(DEVICE + text, sm), lambda: release.device_arch(text, sm),
                 lambda: release.kernel_arguments(cxx_source.template_parameters(text, "f") or [], VALUES)):
        try:
            call()
        except release.Unreadable:
            pass


@given(st.binary(max_size=512))
def test_generator_reader_never_raises(data):
    assert isinstance(release.jit_generators(b"#include <a.cuh>\n&k<{}, {}" + data + b"\x00"), dict)


# ---------------------------------------------------------------- the real releases

def _uv() -> str:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        missing_tool("uv")
    return uv


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Each release's deep_gemm package, unpacked by uv (its cache makes reruns take a second)."""
    root, found = tmp_path_factory.mktemp("deep-gemm"), {}
    for version in RELEASES:
        target = root / version
        done = subprocess.run([_uv(), "pip", "install", "-q", "--no-deps", "--target", str(target),
                               f"sgl-deep-gemm=={version}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"uv cannot install sgl-deep-gemm {version}: {done.stderr.strip()[-300:]}")
        found[version] = target / "deep_gemm"
    return found


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_yields_deep_gemms_own_command_line(releases, version):
    command = release.jit_command(str(releases[version]), 120, environ={})
    flags = [flag["flag"] for flag in command["flags"]]
    assert command["arch"] == "120f"
    assert flags[:4] == ["--gpu-architecture=sm_120f", "-O3", "--compiler-options=-O3",
                         "--ptxas-options=--register-usage-level=10"]
    assert {"-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda", "--compiler-options=-fconcepts",
            "--diag-suppress=39,161,174,177,186,940"} <= set(flags)
    assert all(flag["from"] for flag in command["flags"])
    assert command["output"] == ["--cubin", "--output-file"] and command["include_option"] == "--include-path"


def test_the_old_string_scrape_loses_a_flag_that_the_options_header_keeps(releases):
    """Why the flags come from DeepJIT's source: 0.2.2's _C.so holds --expt-relaxed-constexpr only in pieces."""
    literals = release.scan_strings((releases["0.2.2"] / "_C.so").read_bytes())
    assert "--expt-relaxed-constexpr" not in literals
    assert "--expt-relaxed-constexpr" in release.scan_strings((releases["0.2.3.post2"] / "_C.so").read_bytes())
    flags = [flag["flag"] for flag in release.jit_command(str(releases["0.2.2"]), 120, environ={})["flags"]]
    assert "--expt-relaxed-constexpr" in flags


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_yields_both_kernels_by_parameter_name(releases, version):
    package = releases[version]
    generators = release.jit_generators((package / "_C.so").read_bytes())
    for spec in release.SM120_KERNELS:
        plan = release.kernel_plan(spec, str(package / "include"), generators)
        assert plan["header"] == f"deep_gemm/impls/{spec['kernel'].removesuffix('_impl')}.cuh"
        assert plan["jit_passes"] == plan["header_parameters"]  # the JIT fills every parameter the header has
        names = [argument["name"] for argument in plan["arguments"]]
        assert set(spec["values"]) <= set(names)


def test_the_epilogue_parameter_that_0_2_5_dropped_is_not_passed_to_it(releases):
    """The positional list fitted to 0.2.3.post2 passed an epilogue type to 0.2.5, which has none."""
    def arguments(version):
        generators = release.jit_generators((releases[version] / "_C.so").read_bytes())
        return release.kernel_plan(release.SM120_KERNELS[0], str(releases[version] / "include"), generators)
    old, new = arguments("0.2.3.post2"), arguments("0.2.5")
    assert (old["header_parameters"], new["header_parameters"]) == (20, 19)
    assert old["template_args"] == new["template_args"]  # the same values, matched by name in both headers
    assert "epilogue::transform::EpilogueIdentity" not in new["template_args"]


def test_a_release_without_deepjit_sources_is_unreadable(releases, tmp_path):
    copy = tmp_path / "deep_gemm"
    shutil.copytree(releases["0.2.5"], copy)
    (copy / "include" / "deep_jit" / "backend" / "cuda" / "options.hpp").unlink()
    with pytest.raises(release.Unreadable, match="ships no DeepJIT deep_jit/backend/cuda/options.hpp"):
        release.jit_command(str(copy), 120, environ={})


# ---------------------------------------------------------------- compiled for real, each release

@pytest.fixture(scope="module")
def toolchain_venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("dg-venv") / "venv"
    subprocess.run([_uv(), "venv", "-q", "--python", sys.executable, str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    done = subprocess.run([_uv(), "pip", "install", "-q", "--python", str(python), TOOLKIT],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"uv cannot install the CUDA toolchain: {done.stderr.strip()[-300:]}")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    home = site / "nvidia" / "cu13"
    (home / "lib64").symlink_to("lib")  # as the renderer links them in an image
    return SimpleNamespace(root=root, python=python, home=home, site=site)


def run_deep_gemm_check(venv, tmp_path, version, archs=("sm_120a", "12.0f")) -> dict:
    done = subprocess.run([_uv(), "pip", "install", "-q", "--no-deps", "--python", str(venv.python),
                           f"sgl-deep-gemm=={version}"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    expect = tmp_path / f"expect-{version}.json"
    expect.write_text(json.dumps({
        "python": {"executable": str(venv.python), "version": "%d.%d" % sys.version_info[:2]},
        "packages": {}, "cuda": {"toolkit": "13.0", "archs": list(archs), "home": str(venv.home)},
        "deep_gemm": {"compile": True}}))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DG_", "DJ_", "CUDA_"))}
    env.update(PATH=os.pathsep.join([str(venv.root / "bin"), str(venv.home / "bin"), env.get("PATH", "")]),
               CUDA_HOME=str(venv.home), VIRTUAL_ENV=str(venv.root), PYTHONPATH=str(PAYLOAD))
    done = subprocess.run([str(venv.python), "-m", "probe", "--expect", str(expect), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=PAYLOAD)
    report = json.loads(done.stdout)
    return next(check for check in report["checks"] if check["name"] == "deep-gemm-sm120")


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_compiles_its_sm120_kernels(toolchain_venv, tmp_path, version):
    check = run_deep_gemm_check(toolchain_venv, tmp_path, version)
    assert check["status"] == "pass", check["detail"]
    assert check["evidence"]["version"] == version
    kernels = check["evidence"]["kernels"]
    assert {k["kernel"] for k in kernels} == {"sm120_bf16_gemm_impl", "sm120_fp8_fp4_gemm_1d1d_impl"}
    assert all(k["elf"]["arch"] == 120 and k["kernel_symbol"] for k in kernels)


def test_dgx_spark_sm121_is_compiled_for_its_own_arch(toolchain_venv, tmp_path):
    check = run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.3.post2", archs=("sm_121a",))
    assert check["status"] == "pass", check["detail"]
    assert {k["elf"]["arch"] for k in check["evidence"]["kernels"]} == {121}


def test_an_arch_nvcc_cannot_target_fails_for_that_reason(toolchain_venv, tmp_path):
    check = run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.5", archs=("sm_129",))
    assert check["status"] == "fail"
    assert "Unsupported gpu architecture 'sm_129f'" in check["detail"]


def test_removed_cuda_headers_fail_the_compile_for_that_reason(toolchain_venv, tmp_path):
    header = toolchain_venv.home / "include" / "cuda_runtime.h"
    moved = header.with_name("cuda_runtime.h.moved")
    header.rename(moved)
    try:
        check = run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.5")
    finally:
        moved.rename(header)
    assert check["status"] == "fail"
    assert "cuda_runtime.h: No such file or directory" in check["detail"]


def test_a_recipe_without_an_sm12x_arch_skips_with_the_reason(toolchain_venv, tmp_path):
    check = run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.5", archs=("sm_90a",))
    assert check["status"] == "skip" and "sm_90a" in check["detail"]


def test_a_release_the_probe_cannot_read_is_unknown_with_the_reason_not_a_verdict(toolchain_venv, tmp_path):
    run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.5")
    options = toolchain_venv.site / "deep_gemm" / "include" / "deep_jit" / "backend" / "cuda" / "options.hpp"
    moved = options.with_name("options.hpp.moved")
    options.rename(moved)
    try:
        check = run_deep_gemm_check(toolchain_venv, tmp_path, "0.2.5")
    finally:
        moved.rename(options)
    assert check["status"] == "unknown"
    assert "cannot tell what deep_gemm 0.2.5 compiles" in check["detail"] and "options.hpp" in check["detail"]
