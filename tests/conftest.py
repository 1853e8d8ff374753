"""Shared fixtures: recipes written into temp folders, and the real Docker engine."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_recipe(tmp_path):
    """Write a recipe under tmp/recipes/NAME.toml (so its lock goes to tmp/lockfiles/NAME.lock)."""

    def write(text: str, name: str = "test") -> Path:
        folder = tmp_path / "recipes"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.toml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(scope="session")
def engine():
    """The real Docker engine. CI starts one (.ci/run); a test that needs it fails without it."""
    from imagebuild.engine.docker import DockerEngine

    if os.environ.get("IMAGEBUILD_SKIP_ENGINE") == "1":
        pytest.skip("IMAGEBUILD_SKIP_ENGINE=1: engine tests skipped on request")
    docker_engine = DockerEngine()
    docker_engine.check()
    return docker_engine
