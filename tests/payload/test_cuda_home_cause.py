"""When no consumer finds a CUDA home, the probe says why, read from the installed toolchain wheels:
real releases of nvidia-cuda-nvcc-cu12 (12.8.93, 12.9.86: ptxas only) and nvidia-cuda-nvcc (13.0.88
as locked, 13.1.115, and the newest 13.5.37 as of this writing: nvcc included), installed with pip."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from imagebuild.payload.probe.checks.toolchain import no_home_cause, nvcc_wheels


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Real wheels, each installed (no deps) into a folder of its own."""
    folders = {}
    for pin in ("nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-nvcc-cu12==12.9.86", "nvidia-cuda-nvcc==13.0.88",
                "nvidia-cuda-nvcc==13.1.115", "nvidia-cuda-nvcc==13.5.37"):
        target = tmp_path_factory.mktemp("nvcc")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--target", str(target), pin], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        folders[pin] = target
    return folders


def dists(folder):
    return list(importlib.metadata.distributions(path=[str(folder)]))


@pytest.mark.parametrize("pin", ["nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-nvcc-cu12==12.9.86"])
def test_a_cu12_nvcc_wheel_without_nvcc_is_named_with_the_fix(installed, pin):
    name, version = pin.split("==")
    ((found_name, found_version, nvcc, ptxas),) = nvcc_wheels(dists(installed[pin]))
    assert (found_name, found_version, nvcc, ptxas) == (name, version, None, True)
    cause, fix = no_home_cause(dists(installed[pin]))
    assert cause == f"{name} {version} is installed but ships no nvcc binary (ptxas only)"
    assert "cuda-toolkit[nvcc" in fix and "pinned by digest" in fix


@pytest.mark.parametrize("pin", ["nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-nvcc==13.1.115",
                                 "nvidia-cuda-nvcc==13.5.37"])
def test_a_wheel_with_nvcc_that_nothing_points_at_names_the_home_to_set(installed, pin):
    ((_, _, nvcc, _),) = nvcc_wheels(dists(installed[pin]))
    assert nvcc is not None and nvcc.endswith("/bin/nvcc") and nvcc.startswith(str(installed[pin]))
    cause, fix = no_home_cause(dists(installed[pin]))
    assert "has nvcc at" in cause and "nothing points at it" in cause
    assert fix.startswith(f"set CUDA_HOME={nvcc.rsplit('/bin/nvcc', 1)[0]}")


def test_nothing_installed_says_no_toolchain(tmp_path):
    cause, fix = no_home_cause(dists(tmp_path))
    assert cause.startswith("no CUDA toolchain is installed") and fix.startswith("ask for one: ")


def test_with_one_nvcc_among_several_wheels_the_carrier_is_named(installed):
    both = dists(installed["nvidia-cuda-nvcc-cu12==12.9.86"]) + dists(installed["nvidia-cuda-nvcc==13.0.88"])
    cause, _ = no_home_cause(both)
    assert cause.startswith("nvidia-cuda-nvcc 13.0.88 has nvcc at")
