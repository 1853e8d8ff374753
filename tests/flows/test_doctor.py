"""`imagebuild doctor` against real environments: venvs that reproduce each seed failure (the pip CUDA
toolchain with and without its headers, nvcc 13.5 beside runtime 13.0, FlashInfer patched and not, a CPU
torch in a CUDA venv, a venv not on PATH, an nvcc wrapper script), the cuda-toolchain image, and driver
states that cannot exist here (no GPU): a fake nvidia-smi on PATH and fake /proc driver version files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hypothesis import given
from hypothesis import strategies as st

from imagebuild.flows import doctor
from imagebuild.cli import app as cli
from imagebuild.errors import EXIT_FAILED, EXIT_OK
from imagebuild.knowledge.facts import load_facts
from imagebuild.knowledge.rules import host as host_rules
from imagebuild.payload import probe
from imagebuild.payload.probe import bundle
from tests.conftest import cannot_run, missing_tool

REPO = Path(__file__).resolve().parents[2]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
TOOLCHAIN = "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0"
NO_HEADERS = "cuda-toolkit[nvcc,cudart]==13.0.3.0"  # no cccl wheel: nv/target: No such file
DEEP_GEMM = "sgl-deep-gemm==0.2.3.post2"
FLASHINFER = "flashinfer-python==0.7.2"
FLASHINFER_PATCH = REPO / "recipes" / "patches" / "flashinfer-cuda-version.patch"
CPU_TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
IMAGE_CUDA_HOME = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13"
BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
OPEN_MODULE = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
               "(dvs-builder@U22-I3-AE18-23-3)  Thu Mar 19 21:47:03 UTC 2026\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")
PROPRIETARY_MODULE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Wed Feb 26 19:18:03 UTC 2025\n"


# ---- environments -----------------------------------------------------------------------------

def uv(*args: str, timeout: int = 900) -> None:
    if UV is None:
        missing_tool("uv")
    done = subprocess.run([UV, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        if any(hint in done.stderr.lower() for hint in ("failed to fetch", "dns", "connect", "timed out", "offline")):
            cannot_run(f"uv cannot reach the package index: {tail}", "a reachable PyPI")
        pytest.fail(f"uv {' '.join(args[:2])} failed: {tail}")


def make_venv(root: Path, *requirements: str, no_deps: tuple = (), image_links: bool = False) -> SimpleNamespace:
    """A uv venv (uv's cache makes reinstalls take seconds). image_links adds the two links the renderer makes
    in images (lib64 -> lib, libcudart.so -> libcudart.so.13): the wheels ship neither."""
    uv("venv", "-q", "--python", sys.executable, str(root))
    python = root / "bin" / "python"
    if requirements:
        uv("pip", "install", "-q", "--python", str(python), *requirements)
    if no_deps:
        uv("pip", "install", "-q", "--no-deps", "--python", str(python), *no_deps)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    home = site / "nvidia" / "cu13"
    if image_links:
        (home / "lib64").symlink_to("lib")
        (home / "lib" / "libcudart.so").symlink_to("libcudart.so.13")
    return SimpleNamespace(root=root, python=python, site=site, home=home)


def apply_flashinfer_patch(venv) -> None:
    sha = hashlib.sha256(FLASHINFER_PATCH.read_bytes()).hexdigest()
    subprocess.run([str(venv.python), str(REPO / "imagebuild" / "payload" / "apply_patch.py"), "--strip", "1", "--package",
                    "flashinfer-python", "--sha256", sha, str(venv.site), str(FLASHINFER_PATCH)], check=True,
                   capture_output=True)


def cpu_torch() -> tuple:
    if CPU_TORCH_WHEEL.is_file():
        return (str(CPU_TORCH_WHEEL),)
    # Not tried: CPU-only torch builds are published on PyTorch's own index alone (PyPI's torch carries
    # CUDA), and no machine of this project reaches that index; some have the wheel in a local folder.
    cannot_run(f"no CPU torch wheel at {CPU_TORCH_WHEEL} (a local folder of this machine's): PyPI has no "
               "CPU-only torch build and PyTorch's own index was not tried (unreachable from these machines)",
               f"put that wheel, from PyTorch's CPU index, in {CPU_TORCH_WHEEL.parent}")


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """Venvs shared by the read-only tests; every one is removed at the end."""
    root = tmp_path_factory.mktemp("doctor-envs")
    healthy = make_venv(root / "healthy", TOOLCHAIN, DEEP_GEMM, no_deps=(FLASHINFER,), image_links=True)
    apply_flashinfer_patch(healthy)
    # A project whose venv holds the stack, plus a CPU torch swapped in: the "no torch"/"swapped" seeds.
    swapped = make_venv(root / "project" / ".venv", TOOLCHAIN, DEEP_GEMM, no_deps=(FLASHINFER, *cpu_torch()),
                        image_links=True)
    tools = root / "tools"  # uv alone, so fixes can run without another python3 on PATH
    tools.mkdir()
    if UV:
        (tools / "uv").symlink_to(UV)
    yield SimpleNamespace(root=root, healthy=healthy, swapped=swapped, tools=tools)
    shutil.rmtree(root, ignore_errors=True)


def fake_nvidia_smi(folder: Path, line: str = f"{BLACKWELL}, 595.71.05, 12.0", status: int = 0,
                    body: str | None = None) -> Path:
    """A fake nvidia-smi (this machine has no GPU) answering the one query the probe makes."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    body = body or f"echo '{line}'\nexit {status}"
    script.write_text(f"#!/bin/sh\n# fake nvidia-smi for imagebuild's doctor tests\n{body}\n")
    script.chmod(0o755)
    return folder


def fake_driver_file(folder: Path, version: str = "595.71.05", template: str = OPEN_MODULE) -> Path:
    """A fake /proc/driver/nvidia/version."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fake-proc-driver-nvidia-version"
    path.write_text(template.format(version=version))
    return path


def env_for(venv, tmp_path: Path, *front: Path, cuda_home: bool = True, tools: Path | None = None, **extra) -> dict:
    """An activated-venv environment with a private HOME; PATH holds no host nvcc or python besides /usr/bin."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")
           and not key.startswith(("DG_JIT", "FLASHINFER_", "TRITON_", "SGLANG_"))}
    folders = [*front] + ([venv.root / "bin", venv.home / "bin"] if venv else []) + ([tools] if tools else [])
    env.update(PATH=os.pathsep.join([*map(str, folders), "/usr/bin", "/bin"]), HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir(exist_ok=True)
    if venv:
        env["VIRTUAL_ENV"] = str(venv.root)
        if cuda_home:
            env["CUDA_HOME"] = str(venv.home)
    env.update(extra)
    return env


def run_doctor(venv, tmp_path, *, python=None, env=None, driver_file=None) -> doctor.DoctorReport:
    env = env if env is not None else env_for(venv, tmp_path)
    driver_file = driver_file or tmp_path / "no-driver-here"
    return doctor.diagnose(str(python or venv.python), env=env, cwd=tmp_path, driver_file=str(driver_file))


def named(report, name: str) -> dict:
    return next(f.to_probe() for f in report.findings if f.rule == name)


def statuses(report) -> dict:
    return {f.rule: f.to_probe()["status"] for f in report.findings}


def apply_fix(fix: str, env: dict) -> None:
    """Run a finding's fix as a user would paste it (bash, so `source` works)."""
    done = subprocess.run(["bash", "-c", fix], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"the fix failed: {fix}\n{done.stderr[-2000:]}"


# ---- a healthy venv, then each driver state (fakes) --------------------------------------------

def test_healthy_venv_has_no_findings_and_answers_fast(envs, tmp_path):
    started = time.monotonic()
    report = run_doctor(envs.healthy, tmp_path)
    assert time.monotonic() - started < 5
    assert report.ok, [(f.rule, f.message) for f in report.errors]
    found = statuses(report)
    for name in ("python", "toolkits", "cuda-home:deep_gemm", "cuda-home:flashinfer", "cuda-versions",
                 "flashinfer-cuda-version", "jit-cache:deep_gemm", "jit-cache:flashinfer", "glibc-nvcc"):
        assert found[name] == "pass", (name, named(report, name)["detail"])
    assert found["driver"] == "skip" and "cuda-home:torch" not in found  # no driver file; no torch installed
    assert all({"severity", "fix", "evidence", "detail"} <= set(f.to_probe()) for f in report.findings)
    assert report.facts["consumers"]["deep_gemm"]["home"] == str(envs.healthy.home)
    assert report.facts["consumers"]["flashinfer"]["rule_confirmed"] is True


def test_fake_blackwell_driver_is_read_and_checked_against_the_compat_data(envs, tmp_path):
    smi = fake_nvidia_smi(tmp_path / "fake-nvidia-smi")
    report = run_doctor(envs.healthy, tmp_path, env=env_for(envs.healthy, tmp_path, smi))
    assert report.ok, [f.message for f in report.errors]
    assert named(report, "driver")["detail"] == f"driver 595.71.05 (nvidia-smi); {BLACKWELL} (compute 12.0)"
    assert named(report, "driver-cuda")["evidence"]["native_cuda"] == "13.2"
    assert "driver 595.71.05 runs CUDA 13.2 and older natively" in named(report, "driver-cuda")["detail"]
    assert "deep_gemm JITs for sm_120f" in named(report, "gpu-arch")["detail"]
    assert named(report, "gpu-targets")["status"] == "pass"


def test_fake_old_driver_cannot_run_the_cuda_13_toolchain(envs, tmp_path):
    smi = fake_nvidia_smi(tmp_path / "fake-nvidia-smi", f"{BLACKWELL}, 570.124.06, 12.0")
    report = run_doctor(envs.healthy, tmp_path, env=env_for(envs.healthy, tmp_path, smi))
    finding = named(report, "driver-cuda")
    assert not report.ok and finding["status"] == "fail" and finding["severity"] == "error"
    assert finding["evidence"]["rule"] == "driver-too-old" and "580" in finding["detail"]
    assert "update the hosts' driver to 580.65.06 or newer" in finding["fix"]


def test_fake_nvidia_smi_of_a_driver_before_compute_cap_queries(envs, tmp_path):
    """Old drivers refuse the compute_cap field: the probe asks again without it, and 470 is too old for 13.0."""
    smi = fake_nvidia_smi(tmp_path / "fake-nvidia-smi", body=(
        'case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; '
        "*) echo 'NVIDIA A100-SXM4-80GB, 470.82.01';; esac"))
    report = run_doctor(envs.healthy, tmp_path, env=env_for(envs.healthy, tmp_path, smi))
    assert named(report, "driver")["detail"] == "driver 470.82.01 (nvidia-smi); NVIDIA A100-SXM4-80GB (compute " \
                                                "capability unknown)"
    assert named(report, "driver-cuda")["status"] == "fail" and named(report, "gpu-arch")["status"] == "skip"


def test_fake_driver_file_without_nvidia_smi_gives_the_version_but_warns(envs, tmp_path):
    report = run_doctor(envs.healthy, tmp_path, driver_file=fake_driver_file(tmp_path))
    assert report.ok
    driver = named(report, "driver")
    assert driver["status"] == "warn" and "nvidia-smi is not on PATH" in driver["detail"]
    assert named(report, "driver-cuda")["evidence"]["native_cuda"] == "13.2"


def test_fake_driver_library_mismatch_is_an_error_with_the_reboot_fix(envs, tmp_path):
    smi = fake_nvidia_smi(tmp_path / "fake-nvidia-smi", "Failed to initialize NVML: Driver/library version mismatch",
                          status=18)
    report = run_doctor(envs.healthy, tmp_path, env=env_for(envs.healthy, tmp_path, smi),
                        driver_file=fake_driver_file(tmp_path, "590.48.01"))
    finding = named(report, "driver")
    assert finding["status"] == "fail" and "Driver/library version mismatch" in finding["detail"]
    assert "590.48.01" in finding["detail"] and finding["fix"].startswith("reboot")


def test_flashinfer_arch_list_that_misses_the_fake_gpu_is_an_error(envs, tmp_path):
    smi = fake_nvidia_smi(tmp_path / "fake-nvidia-smi")
    env = env_for(envs.healthy, tmp_path, smi, FLASHINFER_CUDA_ARCH_LIST="9.0a")
    finding = named(run_doctor(envs.healthy, tmp_path, env=env), "gpu-arch")
    assert finding["status"] == "fail" and "does not cover sm_120" in finding["detail"]
    assert finding["fix"] == "export FLASHINFER_CUDA_ARCH_LIST=12.0"


# ---- the seeds ----------------------------------------------------------------------------------

def test_venv_not_activated_is_found_and_named(envs, tmp_path):
    """The probe run by the system python while the stack sits in a project's .venv."""
    project = envs.swapped.root.parent
    system_python = os.path.join(sys.base_prefix, "bin", "python3")
    env = env_for(None, tmp_path, CUDA_HOME=str(envs.swapped.home))
    report = doctor.diagnose(system_python, env=env, cwd=project, driver_file=str(tmp_path / "none"))
    finding = named(report, "python")
    assert finding["status"] == "fail" and "has no torch" in finding["detail"]
    assert "the stack (torch 2.13.0+cpu" in finding["detail"] and str(envs.swapped.root) in finding["detail"]
    assert finding["fix"].startswith(f"source {envs.swapped.root}/bin/activate")
    # the rest of the report looked inside the venv, not at the system python
    assert report.facts["stack"]["prefix"] == str(envs.swapped.root)
    assert named(report, "cuda-home:deep_gemm")["status"] == "pass"
    # the fix: activate, and python3 on PATH is the venv's
    activated = env_for(envs.swapped, tmp_path)
    assert named(doctor.diagnose(env=activated, cwd=project, driver_file=str(tmp_path / "none")),
                 "python")["status"] == "pass"


def test_cpu_torch_swapped_into_a_cuda_venv_is_an_error(envs, tmp_path):
    finding = named(run_doctor(envs.swapped, tmp_path), "cuda-versions")
    assert finding["status"] == "fail"
    assert "torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None) in an environment with CUDA 13.0" \
        in finding["detail"]
    assert "torch==2.13.0" in finding["fix"] and "--index-url <the PyTorch index of cu130 builds>" in finding["fix"]


def test_unpatched_flashinfer_is_an_error_and_the_exact_fix_patches_it(tmp_path):
    venv = make_venv(tmp_path / "fi", no_deps=(FLASHINFER, *cpu_torch()))
    env = env_for(venv, tmp_path, cuda_home=False)
    finding = named(run_doctor(venv, tmp_path, env=env), "flashinfer-cuda-version")
    assert finding["status"] == "fail" and "runs `nvcc --version` first" in finding["detail"]
    assert finding["evidence"]["source"].endswith("flashinfer/jit/cpp_ext.py") and finding["evidence"]["line"]
    assert "--package flashinfer-python" in finding["fix"] and str(FLASHINFER_PATCH) in finding["fix"]
    apply_fix(finding["fix"], env)
    after = named(run_doctor(venv, tmp_path, env=env), "flashinfer-cuda-version")
    assert after["status"] == "pass" and "safe under torch Dynamo" in after["detail"]


def test_toolchain_without_headers_is_an_error_and_the_fix_completes_it(envs, tmp_path, monkeypatch, capsys):
    venv = make_venv(tmp_path / "nohdr", NO_HEADERS, DEEP_GEMM)
    env = env_for(venv, tmp_path, tools=envs.tools)
    finding = named(run_doctor(venv, tmp_path, env=env), "cuda-home:deep_gemm")
    assert finding["status"] == "fail"
    for words in ("CCCL headers", "nv/target: No such file", "lib64", "libcudart.so"):
        assert words in finding["detail"]
    assert "'nvidia-cuda-cccl==13.0.*'" in finding["fix"] and f"ln -s lib {venv.home}/lib64" in finding["fix"]
    # the CLI prints the fix as it is: brackets are text, not markup
    monkeypatch.setenv("CUDA_HOME", str(venv.home))
    status, out = run_cli(monkeypatch, capsys, "--python", str(venv.python), "--driver-file", str(tmp_path / "none"))
    assert status == EXIT_FAILED and "with the extras [nvcc,cccl,crt,nvvm,cudart]" in out.out
    apply_fix(finding["fix"], env)
    after = run_doctor(venv, tmp_path, env=env)
    assert named(after, "cuda-home:deep_gemm")["status"] == "pass" and after.ok


def test_nvcc_13_5_beside_runtime_13_0_is_an_error_and_the_pins_fix_it(envs, tmp_path):
    venv = make_venv(tmp_path / "skew", "nvidia-cuda-nvcc==13.5.*", "nvidia-cuda-runtime==13.0.*", DEEP_GEMM)
    env = env_for(venv, tmp_path, tools=envs.tools)
    finding = named(run_doctor(venv, tmp_path, env=env), "cuda-versions")
    assert finding["status"] == "fail"
    assert "nvidia-cuda-nvcc 13.5." in finding["detail"] and "the CUDA runtime is 13.0" in finding["detail"]
    assert "nvcc 13.5 (used by deep_gemm) is not CUDA 13.0" in finding["detail"]
    assert "'nvidia-cuda-nvcc==13.0.*'" in finding["fix"] and "[python].constraints" in finding["fix"]
    apply_fix(finding["fix"], env)
    assert named(run_doctor(venv, tmp_path, env=env), "cuda-versions")["status"] == "pass"


def test_nvcc_wrapper_script_on_path_gives_consumers_a_home_without_headers(envs, tmp_path):
    """`which nvcc` is a script in a folder that is not a toolkit (this machine's /usr/local/bin/nvcc)."""
    wrapper = tmp_path / "wrapper"
    (wrapper / "bin").mkdir(parents=True)
    (wrapper / "bin" / "nvcc").write_text(f'#!/bin/sh\nexec {envs.healthy.home}/bin/nvcc "$@"\n')
    (wrapper / "bin" / "nvcc").chmod(0o755)
    env = env_for(None, tmp_path, wrapper / "bin")
    report = run_doctor(envs.healthy, tmp_path, env=env)
    finding = named(report, "cuda-home:deep_gemm")
    assert finding["status"] == "fail" and f"uses {wrapper} (from `which nvcc`" in finding["detail"]
    assert f"script running {envs.healthy.home}/bin/nvcc" in finding["detail"]
    assert finding["fix"] == f"export CUDA_HOME={envs.healthy.home}"
    assert named(report, "cuda-home:flashinfer")["status"] == "fail"


def test_unwritable_jit_cache_is_an_error(envs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = env_for(envs.healthy, tmp_path, DG_JIT_CACHE_DIR=str(blocker / "deep_gemm"))
    finding = named(run_doctor(envs.healthy, tmp_path, env=env), "jit-cache:deep_gemm")
    assert finding["status"] == "fail" and "is a file" in finding["detail"]
    assert "export DG_JIT_CACHE_DIR=" in finding["fix"]


# ---- rules over gathered facts (pure functions: knowledge/rules/host.py), the probe's parsers --------------------------

@pytest.fixture(scope="module")
def healthy_facts(envs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("facts")
    smi = fake_nvidia_smi(tmp / "fake-nvidia-smi")
    return run_doctor(envs.healthy, tmp, env=env_for(envs.healthy, tmp, smi)).facts


def test_glibc_2_41_with_nvcc_13_0_is_an_error(healthy_facts):
    findings = {f.rule: f.to_probe() for f in host_rules.compat_findings(dict(healthy_facts, glibc="2.41"))}
    glibc = findings["glibc-nvcc"]
    assert glibc["status"] == "fail" and glibc["evidence"]["rule"] == "glibc-breaks-nvcc"


def test_torch_built_for_cu128_beside_nvcc_13_0_is_an_error(healthy_facts):
    facts = dict(healthy_facts, torch={"installed": True, "version": "2.10.0", "cuda": "12.8", "archs": []})
    facts["consumers"] = dict(facts["consumers"], torch=dict(facts["consumers"]["deep_gemm"], installed=True))
    finding = probe.finding_cuda_versions(facts)
    assert finding["status"] == "fail" and "torch is built for CUDA 12.8" in finding["detail"]
    assert "refuses a different CUDA major" in finding["detail"]


def test_gpu_older_than_what_torch_carries_is_an_error(healthy_facts):
    facts = dict(healthy_facts, torch={"installed": True, "version": "2.14.1+cu130", "cuda": "13.0",
                                       "archs": ["sm_75", "sm_80", "sm_86", "sm_90"]})
    assert probe.finding_gpu_arch(facts)["status"] == "fail"
    facts["torch"]["archs"].append("sm_120")
    assert probe.finding_gpu_arch(facts)["status"] == "pass"


def test_the_probe_knows_every_cuda_versioned_wheel_the_compat_data_knows():
    assert set(load_facts().toolchain) <= set(probe.CUDA_VERSIONED)


@pytest.mark.parametrize("text, version", [
    (OPEN_MODULE.format(version="595.71.05"), "595.71.05"),
    (PROPRIETARY_MODULE.format(version="570.124.06"), "570.124.06"),
    ("no module here", None), ("", None), (None, None)])
def test_driver_version_file_parser(text, version):
    assert probe.parse_driver_version_file(text) == version


def test_arch_list_is_read_from_library_bytes():
    data = b"\x00junk sm_1\x00sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\x00other\x00sm_90 sm_100\x00"
    assert probe.parse_arch_list(data) == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert probe.runs_on(["sm_75", "sm_120"], "12.0") and probe.runs_on(["sm_120"], "12.1")
    assert not probe.runs_on(["sm_120a"], "12.1") and probe.runs_on(["compute_90"], "12.0")
    assert not probe.runs_on(["sm_90", "sm_100"], "12.0")


def test_flashinfer_patch_detection_reads_the_source():
    assert probe.cuda_version_is_patched("def other():\n    pass\n") == {"found": False, "patched": None, "line": None}
    unpatched = ("import subprocess, torch\ndef get_cuda_version():\n    try:\n"
                 "        return subprocess.check_output(['nvcc', '--version'])\n    except OSError:\n"
                 "        return torch.version.cuda\n")
    patched = ("import os, subprocess, torch\ndef get_cuda_version():\n"
               "    override = os.environ.get('FLASHINFER_CUDA_VERSION')\n    if override:\n        return override\n"
               "    if torch.version.cuda is not None:\n        return torch.version.cuda\n"
               "    return subprocess.check_output(['nvcc', '--version'])\n")
    assert probe.cuda_version_is_patched(unpatched)["patched"] is False
    assert probe.cuda_version_is_patched(patched)["patched"] is True


@given(st.text())
def test_text_parsers_never_raise(text):
    probe.parse_driver_version_file(text)
    probe.parse_smi_gpus(text)
    probe.parse_dist_dir(text)
    probe.parse_torch_version_file(text)
    probe.arch_number(text)
    probe.cuda_version_is_patched(text)


@given(st.binary(max_size=512))
def test_arch_list_parser_never_raises(data):
    assert all(probe.arch_number(target) for target in probe.parse_arch_list(data))


# ---- interpreters, the image, this host, the CLI ----------------------------------------------

def test_doctor_probe_runs_under_python_3_9(envs, tmp_path):
    candidates = [shutil.which("python3.9"), *map(str, Path.home().glob(".pyenv/versions/3.9*/bin/python3"))]
    python39 = next((c for c in candidates if c and subprocess.run([c, "-c", ""], check=False).returncode == 0), None)
    if python39 is None:
        cannot_run("no working Python 3.9 on this host", "pyenv install 3.9")
    report = run_doctor(envs.healthy, tmp_path, python=python39)
    assert report.host["python"].startswith("3.9") and named(report, "python")["status"] == "fail"
    assert report.facts["stack"]["prefix"] == str(envs.healthy.root)


def test_doctor_probe_runs_from_its_inline_zipapp_alone(tmp_path):
    """How --image runs it: `python -c BOOTSTRAP PAYLOAD --doctor`, with no file of imagebuild's there."""
    done = subprocess.run([sys.executable, "-c", bundle.BOOTSTRAP, *bundle.inline_args(), "--doctor"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(done.stdout)
    assert report["mode"] == "doctor" and done.returncode == (0 if report["ok"] else 1)


def test_an_interpreter_too_old_for_the_probe_is_refused_clearly(tmp_path):
    python27 = next(iter(Path.home().glob(".pyenv/versions/2.7*/bin/python2")), None)
    if python27 is None:
        cannot_run("no Python 2.7 on this host", "pyenv install 2.7")
    with pytest.raises(doctor.DoctorFailed, match="needs Python 3.9 or newer"):
        doctor.diagnose(str(python27), cwd=tmp_path)


@pytest.fixture(scope="module")
def toolchain_image(engine):
    """The cuda-toolchain image under a name of this test run's own, removed at the end."""
    from imagebuild import flows
    report = flows.build(REPO / "recipes" / "cuda-toolchain.toml", engine,
                            flows.BuildOptions(tag=f"imagebuild-test/doctor-toolchain:{os.getpid()}"))
    yield report.image
    engine.remove(report.image)


def test_cuda_toolchain_image_is_healthy(engine, toolchain_image):
    report = doctor.diagnose_image(toolchain_image, engine)
    assert report.ok, [f.message for f in report.errors]
    assert report.python == "/opt/venv/bin/python3" and report.facts["stack"]["prefix"] == "/opt/venv"
    assert named(report, "cuda-home:deep_gemm")["evidence"]["home"] == IMAGE_CUDA_HOME
    assert named(report, "cuda-versions")["status"] == "pass"


def test_image_without_cuda_home_reproduces_deep_gemm_not_finding_cuda(engine, toolchain_image):
    """The seed: CUDA_HOME unset and nvcc not on PATH, so deep_gemm's find_cuda_home() asserts."""
    hidden = {"PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"}
    report = doctor.diagnose_image(toolchain_image, engine, env=hidden, unset=["CUDA_HOME"])
    finding = named(report, "cuda-home:deep_gemm")
    assert not report.ok and finding["status"] == "fail" and "finds no CUDA toolkit" in finding["detail"]
    assert "AssertionError" in finding["detail"] and finding["fix"] == f"export CUDA_HOME={IMAGE_CUDA_HOME}"
    fixed = doctor.diagnose_image(toolchain_image, engine, env={**hidden, "CUDA_HOME": IMAGE_CUDA_HOME})
    assert named(fixed, "cuda-home:deep_gemm")["status"] == "pass"


def test_this_host_is_diagnosed(tmp_path):
    report = doctor.diagnose(cwd=tmp_path)
    assert report.target == "host" and report.facts["glibc"] and report.findings
    assert {f.rule for f in report.findings} >= {"driver", "python", "toolkits", "driver-cuda", "glibc-nvcc"}


def run_cli(monkeypatch, capsys, *argv) -> tuple:
    if "imagebuild.cli.doctor" not in cli.EXTENSIONS:  # until cli.py registers it
        monkeypatch.setattr(cli, "EXTENSIONS", (*cli.EXTENSIONS, "imagebuild.cli.doctor"))
    status = cli.main(["doctor", *argv])
    return status, capsys.readouterr()


def test_cli_json_and_exit_codes(envs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_HOME", str(envs.healthy.home))
    status, out = run_cli(monkeypatch, capsys, "--python", str(envs.healthy.python), "--json",
                          "--driver-file", str(tmp_path / "none"))
    report = json.loads(out.out)
    assert status == EXIT_OK and report["ok"] is True and report["errors"] == 0
    status, out = run_cli(monkeypatch, capsys, "--python", str(envs.healthy.python), "--env", "CUDA_HOME=/nonexistent")
    assert status == EXIT_FAILED
    assert "FAIL cuda-home:deep_gemm" in out.out and "fix: export CUDA_HOME=" in out.out and "error(s)" in out.out


def test_cli_image(engine, toolchain_image, monkeypatch, capsys):
    status, out = run_cli(monkeypatch, capsys, "--image", toolchain_image, "--unset", "CUDA_HOME", "--json")
    report = json.loads(out.out)
    assert status == EXIT_OK and report["target"] == f"image {toolchain_image}"  # nvcc on PATH still finds it


def test_nvcc_in_use_reads_container_paths_as_the_probe_resolved_them():
    """Facts from an image: its /usr/local/cuda link does not exist on the host running doctor, so the
    probe's own resolution of it is what finds the toolkit."""
    facts = {"consumers": {"torch": {"installed": True, "home": "/nonexistent-in-host/cuda",
                                     "real": "/nonexistent-in-host/cuda-13.0"}},
             "toolkits": [{"real": "/nonexistent-in-host/cuda-13.0", "release": "13.0"}]}
    assert host_rules.nvcc_in_use(facts) == {"13.0": [probe.CONSUMER_LABELS["torch"]]}
