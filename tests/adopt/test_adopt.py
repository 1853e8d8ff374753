"""`imagebuild adopt` on real environments, through the command line: venvs made from the real index
(the cuda-toolchain set, a small pure-Python package), changed by hand; the resolve is uv's, the original
files come from the real wheels by range reads. What it writes passes `imagebuild check`; what it cannot
rebuild is listed; each bad input is one clear error, and nothing is left half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.venvs import SMALL, SYSTEM_PYTHON, TOOLCHAIN, editable_project, install, make_venv, site_packages
from tests.conftest import cannot_run, missing_tool

REPO = Path(__file__).resolve().parents[2]
EDIT = b"\n# fixed by hand on the box\nHAND_EDITED = True\n"
TORCH_CPU = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")


def imagebuild(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "imagebuild", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def adopt_json(*args: str) -> tuple[int, dict]:
    done = imagebuild("adopt", *args, "--json")
    return done.returncode, json.loads(done.stdout)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture(scope="module")
def toolchain_venv(tmp_path_factory):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    python = make_venv(tmp_path_factory.mktemp("toolchain") / "venv", *TOOLCHAIN, *SMALL)
    site = site_packages(python)
    with open(site / "dateutil" / "__init__.py", "ab") as handle:
        handle.write(EDIT)
    (site / "handmade.py").write_text("print('added by hand')\n")
    return python


def test_a_working_venv_becomes_a_recipe_that_check_passes(toolchain_venv, tmp_path):
    recipe = tmp_path / "recipes" / "box.toml"
    status, report = adopt_json("--python", str(toolchain_venv), "-o", str(recipe), "--without-torch",
                                "--arch", "sm_120a")
    assert status == 0, report
    assert report["requirements"] == ["cuda-toolkit[cccl,crt,cudart,nvcc,nvvm]==13.0.3.0",
                                      "python-dateutil==2.9.0.post0", "sgl-deep-gemm==0.2.3.post2"]
    assert report["constraints"] == ["nvidia-cuda-cccl==13.0.85", "nvidia-cuda-crt==13.0.88", "nvidia-cuda-nvcc==13.0.88",
                                     "nvidia-cuda-runtime==13.0.96", "nvidia-nvvm==13.0.88", "six==1.17.0"]
    assert report["read"]["executable"] == str(toolchain_venv) and report["read"]["in_venv"]
    assert [e["name"] for e in report["left_out"]] == ["pip", "setuptools"]
    assert report["added_files"]["files"] == [str(site_packages(toolchain_venv) / "handmade.py")]
    assert report["added_by_lock"] == [] and report["unpatched"] == []
    (patch,) = report["patches"]
    assert (patch["package"], patch["files"]) == ("python-dateutil", ["dateutil/__init__.py"])
    assert report["written"] == [str(recipe), str(recipe.parent / "patches" / "python-dateutil-2.9.0.post0.patch")]
    data = tomllib.loads(recipe.read_text())
    assert data["cuda"] == {"toolkit": "13.0", "archs": ["sm_120a"], "min_driver": "580.65.06"}
    assert data["patches"] == [{"package": "python-dateutil", "file": "patches/python-dateutil-2.9.0.post0.patch"}]
    assert data["base"] == {"debian": "bookworm", "arch": "amd64", "packages": ["g++"]}
    checked = imagebuild("check", str(recipe), "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout
    assert files_under(recipe.parent) == ["box.toml", "patches", "patches/python-dateutil-2.9.0.post0.patch"]


def test_an_editable_install_and_a_file_added_by_hand_are_reported(tmp_path):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    python = make_venv(tmp_path / "venv", *SMALL)
    install(python, "-e", str(editable_project(tmp_path / "proj", dependencies='"six", "attrs==24.2.0"')))
    (site_packages(python) / "notes.txt").write_text("hand-made\n")
    (site_packages(python) / "dateutil" / "red\x1b[31m.txt").write_text("a name that would recolour a terminal\n")
    recipe = tmp_path / "recipes" / "small.toml"
    status, report = adopt_json("--python", str(python), "-o", str(recipe), "--without-torch")
    assert status == 0, report
    (proj,) = [e for e in report["left_out"] if e["name"] == "proj"]
    assert proj["excluded"] and "editable" in proj["why"] and (tmp_path / "proj").as_uri() in proj["why"]
    assert sorted(report["added_files"]["files"]) == [str(site_packages(python) / "dateutil" / "red\x1b[31m.txt"),
                                                      str(site_packages(python) / "notes.txt")]
    assert "attrs==24.2.0" in report["requirements"]  # proj's own requirement, pinned now that proj is out
    data = tomllib.loads(recipe.read_text())
    assert data["python"]["exclude"] == ["proj"] and "cuda" not in data
    text = imagebuild("adopt", "--python", str(python), "-o", str(tmp_path / "recipes" / "again.toml"),
                      "--without-torch").stdout
    assert "proj 0.1: installed editable from" in text and "notes.txt" in text and "left out of the recipe" in text
    assert "red\\x1b[31m.txt" in text and "\x1b" not in text  # outside text printed literally, escapes shown


def test_a_probe_under_another_interpreter_says_which_it_read(tmp_path):
    """The seed's mistake: the system's python3 instead of the venv's; no torch there, and it says whose."""
    missing_tool(SYSTEM_PYTHON)
    recipe = tmp_path / "recipes" / "box.toml"
    status, report = adopt_json("--python", SYSTEM_PYTHON, "-o", str(recipe))
    assert status == 2 and report["error"] == "AdoptError"
    assert f"no torch in the environment of {SYSTEM_PYTHON} (Python 3.11" in report["message"]
    assert "prefix /usr, not a venv" in report["message"] and "VENV/bin/python" in report["message"]
    assert files_under(tmp_path / "recipes") == []


@pytest.mark.parametrize("make, said", [
    (lambda tmp: tmp / "nowhere" / "python", "no such file"),
    (lambda tmp: tmp, "not an executable file"),
    (lambda tmp: (tmp / "notes.txt", (tmp / "notes.txt").write_text("x"))[0], "not an executable file"),
    (lambda tmp: Path("/bin/true"), "not a Python interpreter the inventory probe runs under (exit 0"),
])
def test_a_python_that_is_no_interpreter_is_one_clear_error(tmp_path, make, said):
    python = make(tmp_path)
    status, report = adopt_json("--python", str(python), "-o", str(tmp_path / "recipes" / "x.toml"))
    assert status == 2 and said in report["message"] and report["ok"] is False
    assert not (tmp_path / "recipes").exists()


def test_an_existing_recipe_is_kept_unless_forced(toolchain_venv, tmp_path):
    recipe = tmp_path / "recipes" / "box.toml"
    recipe.parent.mkdir()
    recipe.write_text("# mine\n")
    args = ("--python", str(toolchain_venv), "-o", str(recipe), "--without-torch", "--arch", "sm_120a")
    status, report = adopt_json(*args)
    assert status == 2 and "exists" in report["message"] and "--force" in report["message"]
    assert recipe.read_text() == "# mine\n" and files_under(recipe.parent) == ["box.toml"]
    status, report = adopt_json(*args, "--force")
    assert status == 0 and recipe.read_text().startswith("# Adopted by `imagebuild adopt`")


def test_pins_that_do_not_resolve_are_one_error_and_write_nothing(tmp_path):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    python = make_venv(tmp_path / "venv", "requests==2.32.3")
    install(python, "--no-deps", "urllib3==1.20")  # requests 2.32.3 needs urllib3>=1.21.1: a broken venv
    recipe = tmp_path / "recipes" / "broken.toml"
    status, report = adopt_json("--python", str(python), "-o", str(recipe), "--without-torch")
    assert status == 1 and report["error"] == "ResolveFailed", report
    assert "pins do not resolve" in report["message"] and "urllib3==1.20" in report["message"]
    assert "no recipe was written" in report["message"]
    assert not (tmp_path / "recipes").exists()


def test_a_distribution_no_index_serves_is_left_out_with_what_to_do(tmp_path):
    if not TORCH_CPU.is_file():
        cannot_run(f"needs {TORCH_CPU} (a torch build no index here serves)",
                   f"put that wheel, from PyTorch's CPU index, in {TORCH_CPU.parent}")
    python = make_venv(tmp_path / "venv")
    install(python, "--find-links", str(TORCH_CPU.parent), "torch==2.13.0+cpu")
    recipe = tmp_path / "recipes" / "cpu.toml"
    status, report = adopt_json("--python", str(python), "-o", str(recipe))
    assert status == 0, report
    (torch,) = [e for e in report["left_out"] if e["name"] == "torch"]
    assert torch["version"] == "2.13.0+cpu" and "on the index" in torch["why"]
    assert "https://download.pytorch.org/whl/cpu" in torch["fix"] and "--exclude torch" in torch["fix"]
    data = tomllib.loads(recipe.read_text())
    assert "torch" in data["python"]["exclude"] and "cuda" not in data
    assert any(r.startswith("sympy==") for r in data["python"]["requirements"])  # torch's, pinned directly
    assert imagebuild("check", str(recipe)).returncode == 0
