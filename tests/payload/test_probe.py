"""The in-image probe: its parsers on examples and arbitrary input, then the whole probe run for real
against a venv holding the pip CUDA 13.0 toolchain and sgl-deep-gemm (no Docker, no GPU needed)."""

from __future__ import annotations

import base64
import ast
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from hypothesis import given
from hypothesis import strategies as st

from imagebuild.payload import probe
from imagebuild.payload.probe import bundle
from tests.test_architecture import STACK_DRIVERS, function_import_lines
from tests.conftest import cannot_run, missing_tool

# The zipapp, as images carry it (/opt/imagebuild/probe.pyz): the CLI tests below run this file.
_BUILT = tempfile.TemporaryDirectory(prefix="imagebuild-probe-test-")
PROBE = bundle.write_zipapp(Path(_BUILT.name) / "probe.pyz")
CUDA_WHEELS = ["cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0", "sgl-deep-gemm==0.2.3.post2"]
# What those two pins resolve to (FACTS.md, PyPI CUDA toolchain wheels): the lock the probe checks.
LOCKED = {
    "cuda-toolkit": "13.0.3.0",
    "nvidia-cuda-nvcc": "13.0.88",
    "nvidia-cuda-cccl": "13.0.85",
    "nvidia-cuda-crt": "13.0.88",
    "nvidia-nvvm": "13.0.88",
    "nvidia-cuda-runtime": "13.0.96",
    "sgl-deep-gemm": "0.2.3.post2",
}
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def elf_header(machine=probe.EM_CUDA, flags=0x6007802, elf_class=2, data=1) -> bytes:
    ident = b"\x7fELF" + bytes([elf_class, data, 1, 0x41, 8]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 64, 0, flags, 64, 56, 0, 64, 0, 0)


# ---- parsers, on examples ----

def test_nvcc_release_is_read_from_version_output():
    assert probe.parse_nvcc_release(NVCC_VERSION) == "13.0"
    assert probe.parse_nvcc_release("Cuda compilation tools, release 12.9, V12.9.86") == "12.9"
    assert probe.parse_nvcc_release("command not found") is None
    assert probe.parse_nvcc_release(None) is None


def test_cubin_header_gives_machine_and_sm_arch():
    header = probe.parse_cubin_header(elf_header())
    assert header == {"machine": 190, "e_flags": "0x6007802", "arch": 120, "abi_version": 8}
    assert probe.parse_cubin_header(elf_header(flags=0x6005a02))["arch"] == 90


@pytest.mark.parametrize("data", [b"", b"\x7fELF", elf_header(elf_class=1), elf_header(data=2),
                                  b"MZ" + bytes(100), "not bytes", None])
def test_cubin_header_rejects_what_is_not_a_64_bit_little_endian_elf(data):
    assert probe.parse_cubin_header(data) is None


def test_string_scan_finds_nul_terminated_printable_runs():
    data = b"\x01\x02-std=c++{}\x00--cubin\x00ab\x00\xffnot terminated"
    assert probe.scan_strings(data) == ["-std=c++{}", "--cubin"]
    assert probe.scan_strings(None) == []


VALID_EXPECT = {
    "python": {"executable": "/opt/venv/bin/python", "version": "3.11"},
    "packages": {"Sgl_Deep.GEMM": "0.2.3.post2", "nvidia-cuda-nvcc": "13.0.88"},
    "cuda": {"toolkit": "13.0", "archs": ["sm_120a", "12.0f"], "home": "/opt/venv/nvidia/cu13"},
    "deep_gemm": {"compile": True},
}


def test_valid_expect_is_normalised():
    expect, errors = probe.validate_expect(VALID_EXPECT)
    assert errors == []
    assert expect["packages"] == {"sgl-deep-gemm": "0.2.3.post2", "nvidia-cuda-nvcc": "13.0.88"}
    without_cuda, errors = probe.validate_expect({**VALID_EXPECT, "cuda": None, "deep_gemm": None})
    assert errors == [] and without_cuda["deep_gemm"] == {"compile": False}


@pytest.mark.parametrize("change", [
    {"python": "/usr/bin/python3"},
    {"packages": {"torch": 2.14}},
    {"cuda": {"toolkit": "thirteen", "archs": [], "home": "/x"}},
    {"cuda": {"toolkit": "13.0", "archs": "sm_120a", "home": "/x"}},
    {"deep_gemm": {"compile": "yes"}},
])
def test_invalid_expect_is_refused_with_a_reason(change):
    expect, errors = probe.validate_expect({**VALID_EXPECT, **change})
    assert expect is None and errors and all(isinstance(error, str) for error in errors)


# ---- parsers, on arbitrary input: never an exception ----

@given(st.text())
def test_nvcc_release_parser_never_raises(text):
    release = probe.parse_nvcc_release(text)
    assert release is None or re.fullmatch(r"[0-9]+\.[0-9]+", release)


@given(st.binary(max_size=256) | st.binary(max_size=200).map(lambda tail: b"\x7fELF\x02\x01" + tail))
def test_cubin_parser_never_raises(data):
    header = probe.parse_cubin_header(data)
    assert header is None or 0 <= header["arch"] <= 255


@given(st.binary(max_size=2048))
def test_string_scanner_never_raises(data):
    assert all(text.isprintable() and len(text) >= 3 for text in probe.scan_strings(data))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=15,
)
near_expect = st.fixed_dictionaries({
    "python": json_values | st.fixed_dictionaries({"executable": json_values | st.text(), "version": st.text()}),
    "packages": json_values | st.dictionaries(st.text(max_size=10), st.text(max_size=10) | json_values, max_size=4),
    "cuda": json_values | st.fixed_dictionaries(
        {"toolkit": st.text(max_size=8) | json_values, "archs": json_values, "home": st.text() | json_values}),
    "deep_gemm": json_values | st.fixed_dictionaries({"compile": json_values}),
    "aot": json_values | st.fixed_dictionaries(
        {"manifest": st.text(max_size=8) | json_values, "archs": json_values, "sglang": json_values,
         "shapes": json_values | st.lists(json_values, max_size=2)}),
})


@given(json_values | near_expect)
def test_expect_validation_never_raises(raw):
    expect, errors = probe.validate_expect(raw)
    assert (expect is None) == bool(errors)


# ---- checks and CLI on this host, without the CUDA venv ----

def test_probe_is_stdlib_only_and_imports_itself_relatively():
    imported = set()
    for path in sorted(Path(probe.__file__).parent.glob("*.py")):
        lazy = function_import_lines(path) if path.name in STACK_DRIVERS else set()  # the image's stack, in functions
        for node in ast.walk(ast.parse(path.read_text(), feature_version=(3, 9))):
            if getattr(node, "lineno", None) in lazy:
                continue
            if isinstance(node, ast.Import):  # a sibling imported by name: kernels_aot.py run as a script
                imported |= {top for top in (alias.name.split(".")[0] for alias in node.names)
                             if not (path.parent / f"{top}.py").is_file()}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:  # level > 0: a sibling module
                top = (node.module or "").split(".")[0]
                if not (path.parent / f"{top}.py").is_file():  # kernels_aot.py run as a script: `from waste import`
                    imported.add(top)
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


def test_zipapp_bytes_depend_on_the_source_alone(tmp_path):
    """Same source, other file times and modes: the same bytes (the image layer stays reproducible)."""
    copy = tmp_path / "probe"
    copy.mkdir()
    for path in Path(bundle.SOURCE).rglob("*.py"):
        target = copy / path.relative_to(bundle.SOURCE)
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes())
        target.chmod(0o600)
        os.utime(target, (1_800_000_000, 1_800_000_000))
    built = bundle.zipapp_bytes()
    assert built == bundle.zipapp_bytes(str(copy)) == PROBE.read_bytes()
    with zipfile.ZipFile(PROBE) as archive:
        entries = archive.infolist()
    names = [entry.filename for entry in entries]
    assert names[0] == "__main__.py" and names[1:] == sorted(names[1:])
    assert f"{bundle.PACKAGE}/cli.py" in names and f"{bundle.PACKAGE}/__init__.py" in names
    assert f"{bundle.PACKAGE}/checks/zero_jit.py" in names and f"{bundle.PACKAGE}/kernels/__init__.py" in names
    assert {entry.date_time for entry in entries} == {bundle.ZIP_EPOCH}
    assert {entry.compress_type for entry in entries} == {zipfile.ZIP_STORED}


def test_bootstrap_runs_the_inline_zipapp_without_a_file_of_ours(tmp_path):
    """How doctor ships it to another interpreter: `python -c BOOTSTRAP PAYLOAD ARGS`; a module in the
    working folder named like a stdlib one does not shadow it, and the temporary zip is removed."""
    for name in ("json", "zlib"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('shadowed')\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, "-c", bundle.BOOTSTRAP, *bundle.inline_args(), "--expect",
                           str(tmp_path / "absent.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and "cannot read" in json.loads(done.stdout)["checks"][0]["detail"]
    assert list(scratch.iterdir()) == []


def test_bootstrap_takes_the_zipapp_in_several_arguments(tmp_path):
    """Linux takes one argument of at most 128 KiB: a probe that compresses to several chunks still runs,
    every chunk under the limit, and the probe's own arguments come after them."""
    folder = tmp_path / "probe"
    shutil.copytree(bundle.SOURCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "ballast.py").write_text(f"DATA = {base64.b64encode(os.urandom(250_000)).decode()!r}\n")
    args = bundle.inline_args(str(folder))
    assert int(args[0]) == len(args) - 1 >= 3, f"{args[0]} chunks"
    assert all(0 < len(chunk) <= bundle.ARG_CHUNK for chunk in args[1:])
    assert "".join(args[1:]) == bundle.inline_payload(str(folder))
    done = subprocess.run([sys.executable, "-c", bundle.BOOTSTRAP, *args, "--expect", str(tmp_path / "absent.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "cannot read" in json.loads(done.stdout)["checks"][0]["detail"], done.stderr


def test_a_probe_past_the_command_line_is_refused_before_it_runs(monkeypatch):
    """The negative control: past MAX_INLINE characters in all, one ValueError naming the size."""
    size = len(bundle.inline_payload())
    monkeypatch.setattr(bundle, "MAX_INLINE", size - 1)
    with pytest.raises(ValueError, match=f"grown to {size} characters"):
        bundle.inline_args()


def fake_toolkit(root: Path, release: str = "13.0", lib64: bool = True) -> Path:
    """A toolkit folder laid out like the pip wheels' nvidia/cu13, with an nvcc that only reports its release."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    nvcc.chmod(0o755)
    (root / "include" / "cccl").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("")
    (root / "lib" / "libcudart.so").symlink_to("libcudart.so.13")
    if lib64:
        (root / "lib64").symlink_to("lib")
    return root


def toolkit_expect(home: Path, toolkit: str = "13.0") -> dict:
    return {"cuda": {"toolkit": toolkit, "archs": ["12.0f"], "home": str(home)}}


def test_toolchain_check_passes_on_a_complete_layout(tmp_path):
    result = probe.check_cuda_toolchain(toolkit_expect(fake_toolkit(tmp_path / "cu13")))
    assert result["status"] == "pass", result["detail"]


def test_toolchain_check_names_each_missing_piece(tmp_path):
    home = fake_toolkit(tmp_path / "cu13", release="13.2", lib64=False)
    (home / "include" / "cccl").rmdir()
    result = probe.check_cuda_toolchain(toolkit_expect(home))
    assert result["status"] == "fail"
    for words in ("release 13.2, expected 13.0", "CCCL", "lib64 is missing", "libcudart.so"):
        assert words in result["detail"]


def test_gpu_check_skips_or_reports():
    result = probe.check_gpu()
    assert result["status"] in ("pass", "skip", "warn") and result["detail"]


def run_cli(python, *args, env=None) -> tuple:
    done = subprocess.run([str(python), str(PROBE), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=900)
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("content", ["{not json", '{"python": 3}', "[]"])
def test_bad_expect_file_exits_2_with_a_json_report(tmp_path, content):
    path = tmp_path / "expect.json"
    path.write_text(content)
    status, report = run_cli(sys.executable, "--expect", path)
    assert status == 2 and report["ok"] is False
    assert report["checks"][0]["name"] == "expect" and report["checks"][0]["status"] == "fail"


def test_missing_expect_file_exits_2(tmp_path):
    status, report = run_cli(sys.executable, "--expect", tmp_path / "absent.json")
    assert status == 2 and "cannot read" in report["checks"][0]["detail"]


def test_only_runs_the_named_checks_and_the_report_says_so():
    status, report = run_cli(sys.executable, "--only", "interpreter", "--only", "gpu")
    assert [c["name"] for c in report["checks"]] == ["interpreter", "gpu"] and report["only"] == ["gpu", "interpreter"]
    status, report = run_cli(sys.executable)
    assert "only" not in report and len(report["checks"]) == 11
    done = subprocess.run([sys.executable, str(PROBE), "--only", "nope"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "invalid choice: 'nope'" in done.stderr


def test_probe_runs_under_python_3_9():
    candidates = glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3")) + [shutil.which("python3.9")]
    python39 = next((c for c in candidates if c and subprocess.run([c, "-c", ""]).returncode == 0), None)
    if python39 is None:
        cannot_run("no working Python 3.9 on this host", "pyenv install 3.9")
    status, report = run_cli(python39, "--skip-compile")
    assert status in (0, 1) and report["host"]["python"].startswith("3.9")
    assert [check["name"] for check in report["checks"]] == [
        "interpreter", "packages", "cuda-toolchain", "cuda-home", "deep-gemm-sm120", "imports", "torch-cuda",
        "flashinfer-dynamo", "gpu", "gpu-kernels", "zero-jit"]


# ---- the real thing: a venv with the pip CUDA toolchain and sgl-deep-gemm ----

_OFFLINE_HINTS = ("failed to fetch", "dns", "connect", "network", "timed out", "timeout", "certificate", "tls",
                  "offline")


@pytest.fixture(scope="module")
def cuda_venv(tmp_path_factory):
    """uv installs the wheels (its cache, ~/.cache/uv by default, makes reruns take seconds)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        missing_tool("uv")
    root = tmp_path_factory.mktemp("probe") / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    install = subprocess.run([uv, "pip", "install", "-q", "--python", str(python), *CUDA_WHEELS],
                             capture_output=True, text=True, timeout=900)
    if install.returncode != 0:
        tail = " | ".join(install.stderr.strip().splitlines()[-3:])
        if any(hint in install.stderr.lower() for hint in _OFFLINE_HINTS):
            cannot_run(f"uv cannot reach PyPI for the CUDA wheels: {tail}", "a reachable PyPI")
        pytest.fail(f"uv pip install failed: {tail}")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    home = Path(site) / "nvidia" / "cu13"
    # The renderer makes these two links in the image (the wheels ship neither): linking looks in lib64,
    # and -lcudart needs the unversioned libcudart.so. Mirrored here so the venv matches an image.
    (home / "lib64").symlink_to("lib")
    (home / "lib" / "libcudart.so").symlink_to("libcudart.so.13")
    return SimpleNamespace(root=root, python=python, home=home, site=Path(site))


def venv_env(venv, **overrides) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CUDA_HOME", "CUDA_PATH")}
    env.update(PATH=os.pathsep.join([str(venv.root / "bin"), str(venv.home / "bin"), os.environ.get("PATH", "")]),
               CUDA_HOME=str(venv.home), VIRTUAL_ENV=str(venv.root))
    env.update(overrides)
    return env


def write_expect(venv, tmp_path, toolkit="13.0", packages=None) -> Path:
    path = tmp_path / "expect.json"
    path.write_text(json.dumps({
        "python": {"executable": str(venv.root / "bin" / "python"), "version": "%d.%d" % sys.version_info[:2]},
        "packages": LOCKED if packages is None else packages,
        "cuda": {"toolkit": toolkit, "archs": ["sm_120a", "12.0f"], "home": str(venv.home)},
        "deep_gemm": {"compile": True},
    }))
    return path


def statuses(report) -> dict:
    return {check["name"]: check["status"] for check in report["checks"]}


def check_named(report, name) -> dict:
    return next(check for check in report["checks"] if check["name"] == name)


@pytest.fixture(scope="module")
def passing_run(cuda_venv, tmp_path_factory):
    """One full run, compiles included, that several tests read."""
    tmp = tmp_path_factory.mktemp("passing")
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp), "--workdir", tmp / "work",
                             env=venv_env(cuda_venv))
    return SimpleNamespace(status=status, report=report, workdir=tmp / "work")


def test_probe_passes_in_the_locked_venv(passing_run):
    report = passing_run.report
    failures = [check["detail"] for check in report["checks"] if check["status"] == "fail"]
    assert passing_run.status == 0 and report["ok"] is True, failures
    found = statuses(report)
    assert found.pop("gpu") in ("pass", "skip") and found.pop("gpu-kernels") in ("pass", "skip")
    assert found == {"interpreter": "pass", "packages": "pass", "cuda-toolchain": "pass",
                     "cuda-home": "pass", "deep-gemm-sm120": "pass",
                     # no torch in this venv: the stack tiers have nothing to check
                     "imports": "skip", "torch-cuda": "skip", "flashinfer-dynamo": "skip",
                     "zero-jit": "skip"}  # no [aot] in this expect file


def test_deep_gemm_kernels_compile_to_sm120_cubins(passing_run):
    evidence = check_named(passing_run.report, "deep-gemm-sm120")["evidence"]
    kernels = {kernel["kernel"]: kernel for kernel in evidence["kernels"]}
    assert set(kernels) == {"sm120_bf16_gemm_impl", "sm120_fp8_fp4_gemm_1d1d_impl"}
    for kernel in kernels.values():
        assert kernel["elf"]["machine"] == 190 and kernel["elf"]["arch"] == 120
        assert kernel["kernel_symbol"] and kernel["seconds"] > 0
    flags = [flag["flag"] for flag in evidence["jit"]["sm_120"]["flags"]]
    assert {"--gpu-architecture=sm_120f", "-std=c++20", "--expt-relaxed-constexpr"} <= set(flags)


def test_compile_scratch_is_removed_but_workdir_kept(passing_run):
    assert passing_run.workdir.is_dir() and list(passing_run.workdir.iterdir()) == []


def test_wrong_toolkit_fails_the_toolchain_check(cuda_venv, tmp_path):
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path, toolkit="13.2"),
                             "--skip-compile", env=venv_env(cuda_venv))
    toolchain = check_named(report, "cuda-toolchain")
    assert status == 1 and toolchain["status"] == "fail"
    assert "nvcc is release 13.0, expected 13.2" in toolchain["detail"]
    assert "nvidia-cuda-nvcc 13.0.88 is not CUDA 13.2" in toolchain["detail"]


def test_package_version_mismatch_fails_the_packages_check(cuda_venv, tmp_path):
    packages = {**LOCKED, "sgl-deep-gemm": "0.2.5", "flashinfer-python": "0.7.2"}
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path, packages=packages),
                             "--skip-compile", env=venv_env(cuda_venv))
    check = check_named(report, "packages")
    assert status == 1 and check["status"] == "fail"
    assert check["evidence"]["missing"] == ["flashinfer-python"]
    assert check["evidence"]["wrong_version"] == {"sgl-deep-gemm": {"expected": "0.2.5", "installed": ["0.2.3.post2"]}}


def test_unlocked_extra_distribution_only_warns(cuda_venv, tmp_path):
    packages = {name: version for name, version in LOCKED.items() if name != "cuda-toolkit"}
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path, packages=packages),
                             "--skip-compile", env=venv_env(cuda_venv))
    assert status == 0 and check_named(report, "packages")["status"] == "warn"


def test_cuda_home_elsewhere_fails_the_cuda_home_check(cuda_venv, tmp_path):
    elsewhere = tmp_path / "cuda-elsewhere"
    elsewhere.mkdir()
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path), "--skip-compile",
                             env=venv_env(cuda_venv, CUDA_HOME=str(elsewhere)))
    check = check_named(report, "cuda-home")
    assert status == 1 and check["status"] == "fail"
    assert check["evidence"]["found"]["deep_gemm"]["home"] == str(elsewhere)
    assert check["evidence"]["found"]["deep_gemm"]["how"].endswith("deep_gemm/cuda_helpers.py")


@pytest.mark.parametrize("outsider", ["test runner's venv", "base interpreter"])
def test_probe_run_outside_the_venv_fails_the_interpreter_check(cuda_venv, tmp_path, outsider):
    python = sys.executable if outsider == "test runner's venv" else os.path.join(sys.base_prefix, "bin", "python3")
    status, report = run_cli(python, "--expect", write_expect(cuda_venv, tmp_path), "--skip-compile",
                             env=venv_env(cuda_venv))
    assert status == 1 and check_named(report, "interpreter")["status"] == "fail"
    assert "expected " + str(cuda_venv.root / "bin" / "python") in check_named(report, "interpreter")["detail"]


def test_python3_on_path_outside_the_venv_fails_the_interpreter_check(cuda_venv, tmp_path):
    path = os.pathsep.join([str(cuda_venv.home / "bin"), os.path.join(sys.base_prefix, "bin"), "/usr/bin", "/bin"])
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path), "--skip-compile",
                             env=venv_env(cuda_venv, PATH=path))
    check = check_named(report, "interpreter")
    assert status == 1 and check["status"] == "fail"
    assert "`python3` on PATH is" in check["detail"]


def test_deep_gemm_without_sm120_kernels_fails_clearly(cuda_venv, tmp_path):
    """A deep_gemm whose JIT has no SM120 kernels (its _C.so's source templates renamed to SM100), found first."""
    real = cuda_venv.site / "deep_gemm"
    fake = tmp_path / "shadow" / "deep_gemm"
    fake.mkdir(parents=True)
    for name in ("__init__.py", "cuda_helpers.py"):
        shutil.copy(real / name, fake / name)
    (fake / "include").symlink_to(real / "include")
    library = (real / "_C.so").read_bytes()
    assert b"&sm120_bf16_gemm_impl<" in library
    (fake / "_C.so").write_bytes(library.replace(b"&sm120_", b"&sm100_"))
    status, report = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path),
                             env=venv_env(cuda_venv, PYTHONPATH=str(fake.parent)))
    check = check_named(report, "deep-gemm-sm120")
    assert status == 1 and check["status"] == "fail"
    assert "no source template for sm120_bf16_gemm_impl" in check["detail"] and str(fake) in check["detail"]


# ---- the ML stack tiers (the real torch / FlashInfer runs are in tests/slow/test_flagship.py) ----

def test_imports_check_imports_each_module_in_its_own_process():
    passed = probe.check_imports({"imports": ["json", "email.mime.text"]})
    assert passed["status"] == probe.PASS and set(passed["evidence"]["imported"]) == {"json", "email.mime.text"}
    failed = probe.check_imports({"imports": ["json", "no_such_module_here"]})
    assert failed["status"] == probe.FAIL and "no_such_module_here" in failed["detail"]
    assert "ModuleNotFoundError" in failed["evidence"]["failed"]["no_such_module_here"]
    assert probe.check_imports({"imports": []})["status"] == probe.SKIP


def test_imports_run_side_by_side_keep_the_recipe_order_and_each_failure():
    modules = ["json", "no_such_module_a", "email.mime.text", "sqlite3", "no_such_module_b", "decimal"]
    serial = probe.check_imports({"imports": modules}, jobs=1)
    parallel = probe.check_imports({"imports": modules}, jobs=4)
    for check in (serial, parallel):
        assert check["status"] == probe.FAIL
        assert list(check["evidence"]["imported"]) == ["json", "email.mime.text", "sqlite3", "decimal"]
        assert list(check["evidence"]["failed"]) == ["no_such_module_a", "no_such_module_b"]
    assert serial["detail"].split("; ")[0].startswith("no_such_module_a: ModuleNotFoundError")


def test_checks_run_at_once_give_the_report_one_at_a_time_gives(cuda_venv, tmp_path, passing_run):
    """The same venv probed with --jobs 1: every check has the status it has when they run at once."""
    status, serial = run_cli(cuda_venv.python, "--expect", write_expect(cuda_venv, tmp_path), "--jobs", "1",
                             env=venv_env(cuda_venv))
    assert serial["jobs"] == 1 and passing_run.report["jobs"] >= 1
    assert [c["name"] for c in serial["checks"]] == [c["name"] for c in passing_run.report["checks"]]
    assert statuses(serial) == statuses(passing_run.report) and status == passing_run.status


def test_stack_tiers_skip_when_the_lock_has_no_torch():
    assert probe.check_torch_cuda({"torch_cuda": None})["status"] == probe.SKIP
    assert probe.check_flashinfer_dynamo({"flashinfer_dynamo": False})["status"] == probe.SKIP


@pytest.mark.parametrize("key, value", [("imports", "torch"), ("imports", [1]), ("torch_cuda", "thirteen"),
                                        ("flashinfer_dynamo", "yes")])
def test_expect_rejects_malformed_stack_keys(key, value):
    raw = {"python": {"executable": "/opt/venv/bin/python", "version": "3.11"}, "packages": {}, key: value}
    expect, errors = probe.validate_expect(raw)
    assert expect is None and any(key in error for error in errors)


def test_gpu_kernels_check_skips_without_a_gpu_or_without_torch():
    """It runs only where a GPU is visible (the task's device checks); here it must say why not."""
    from imagebuild.payload.probe.checks.gpu_kernels import check_gpu_kernels
    assert check_gpu_kernels({"torch_cuda": "13.0"}, gpu_visible=False)["detail"] == "no GPU visible"
    assert check_gpu_kernels({"torch_cuda": None}, gpu_visible=True)["detail"] == "no torch in the lock"


# Triton's get_ptxas as three releases wrote it (triton/backends/nvidia/compiler.py): 3.4+ takes the arch
# and answers a knob with .path; 3.3 takes nothing; 3.2 takes the arch and answers (path, version).
TRITON_GET_PTXAS = {
    "3.4": "class _Tool:\n    def __init__(self, path):\n        self.path = path\n"
           "def get_ptxas(arch):\n    return _Tool(PTXAS + ('-blackwell' if arch >= 100 else ''))\n",
    "3.3": "class _Tool:\n    def __init__(self, path):\n        self.path = path\n"
           "def get_ptxas():\n    return _Tool(PTXAS)\n",
    "3.2": "def get_ptxas(arch):\n    return (PTXAS + ('-blackwell' if arch >= 100 else ''), '12.8')\n",
}


@pytest.mark.parametrize("release", sorted(TRITON_GET_PTXAS))
def test_cuda_home_reads_tritons_ptxas_choice_in_each_signature_stand_in_triton(release, tmp_path, monkeypatch):
    """A stand-in triton package (the test's own, named so), since Triton itself needs torch here."""
    from imagebuild.payload.probe.checks import toolchain
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.parent.mkdir()
    for path in (ptxas, tmp_path / "bin" / "ptxas-blackwell"):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    package = tmp_path / "site" / "triton" / "backends" / "nvidia"
    package.mkdir(parents=True)
    for folder in (package.parent.parent, package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "compiler.py").write_text(f"PTXAS = {str(ptxas)!r}\n" + TRITON_GET_PTXAS[release])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    answers, problem = toolchain.ask_consumers(120)
    expected = str(ptxas) + ("" if release == "3.3" else "-blackwell")
    assert problem is None and answers["triton"] == {"ptxas": expected}
    (tmp_path / "bin" / "ptxas-blackwell").unlink()  # the negative control: the chosen ptxas is gone
    check = toolchain.check_cuda_home({"cuda": {"archs": ["sm_120a"]}})
    if release == "3.3":
        assert check["status"] == "pass" and f"Triton runs {ptxas} for sm_120" in check["detail"]
    else:
        assert check["status"] == "fail" and "Triton's ptxas for sm_120" in check["detail"]
