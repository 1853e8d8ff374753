"""Real virtual environments for adopt's tests, made as users make them: `python3 -m venv` (pip and
setuptools inside), then filled from the real index with uv. Python is Debian's /usr/bin/python3 (3.11,
bookworm's), so an adopted recipe's base is bookworm."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from imagebuild.lock.resolve import uv_binary

SYSTEM_PYTHON = "/usr/bin/python3"
EXCLUDE_NEWER = "2026-11-20T00:00:00Z"  # the committed recipes' own: the same releases every run
TOOLCHAIN = ("cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0", "sgl-deep-gemm==0.2.3.post2")  # recipes/cuda-toolchain.toml
SMALL = ("python-dateutil==2.9.0.post0",)  # pure Python, and it requires six


def make_venv(folder: Path, *requirements: str, find_links: str | None = None) -> Path:
    """A venv at folder with these requirements installed; its interpreter's path."""
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(folder)], check=True, capture_output=True)
    python = folder / "bin" / "python"
    if requirements:
        install(python, *requirements, find_links=find_links)
    return python


def install(python: Path, *arguments: str, find_links: str | None = None) -> None:
    command = [uv_binary(), "pip", "install", "--quiet", "--no-config", "--python", str(python),
               "--exclude-newer", EXCLUDE_NEWER, *(["--find-links", find_links] if find_links else []), *arguments]
    # copies, never hard links into uv's cache: a test edits installed files, and a link would edit the cache
    env = {**os.environ, "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "copy"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def editable_project(folder: Path, name: str = "proj", dependencies: str = '"six"') -> Path:
    """A small setuptools project to install editable (`uv pip install -e`)."""
    (folder / "src" / name).mkdir(parents=True)
    (folder / "src" / name / "__init__.py").write_text("VALUE = 1\n")
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1"\ndependencies = [{dependencies}]\n'
                                           '[build-system]\nrequires = ["setuptools>=61"]\n'
                                           'build-backend = "setuptools.build_meta"\n')
    return folder
