"""tests/engine_leftovers.py: what a run left in the engine, said at its end (under CI), read from the
real engine's own words (docker images, docker system df)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.engine_leftovers import EngineState, leftovers, parse_state, read_state, size_bytes

ID = "sha256:" + "a" * 64


@pytest.mark.parametrize("text, size", [("10.34GB", 10_340_000_000), ("0B", 0), ("452MB", 452_000_000),
                                        ("1.5kB", 1500), ("12 G B", None), ("", None), ("5GiB", None)])
def test_docker_sizes_read_as_bytes(text, size):
    assert size_bytes(text) == size


@given(st.text(max_size=60), st.text(max_size=60))
def test_any_engine_answer_is_a_state_never_a_traceback(images, usage):
    state = parse_state(images, usage)
    assert all(isinstance(names, list) for names in state.images.values())


def test_what_appeared_is_listed_with_imagebuilds_bases_marked_and_the_cache_growth():
    before = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n", "Images|9GB\nBuild Cache|10.34GB\n")
    new = "sha256:" + "b" * 64
    after = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n{new}|imagebuild/base:bookworm-arm64-0123|452MB\n",
                        "Build Cache|46.34GB\n")
    lines = leftovers(before, after)
    assert lines[0].startswith("image sha256:bbbbbbbbbbbb imagebuild/base:bookworm-arm64-0123, 0.45 GB")
    assert "imagebuild's own base" in lines[0]
    assert lines[1].startswith("builder cache grew by 36.00 GB to 46.34 GB")


def test_nothing_left_says_so_and_an_unsaid_cache_size_is_said():
    same = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n", "Build Cache|10GB\n")
    assert leftovers(same, same)[0].startswith("nothing:")
    assert leftovers(same, EngineState(images=same.images)) == ["builder cache: the engine did not say its size"]


@pytest.mark.engine
def test_the_real_engine_is_read_and_a_run_under_ci_ends_with_the_report(tmp_path):
    state = read_state()
    assert state is not None and state.images and state.build_cache is not None
    sample = tmp_path / "test_sample.py"
    sample.write_text("def test_nothing():\n    pass\n")
    env = {**os.environ, "CI": "", "IMAGEBUILD_ENGINE_REPORT": "1", "PYTHONPATH": str(REPO)}
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure  # noqa: F401\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(sample)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "what this run left in the engine" in done.stdout
