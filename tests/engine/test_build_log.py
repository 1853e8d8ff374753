"""Which build step failed and why, read from the output of real builds (BuildKit, buildah) and from
arbitrary text, which must never raise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.bootstrap import ensure_base_image
from imagebuild.engine.build_log import build_failure, failed_step
from imagebuild.lock import read_lock
from imagebuild.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
FAILING = '''FROM {base}
RUN echo step-one
RUN --mount=type=cache,target=/root/.cache \\
    echo working; echo "apply_patch: error: demo.py: hunk 1 of 1 (@@ -1,2 +1,2 @@) does not apply at line 3:" >&2; \\
    echo "  expected: x = 1" >&2; exit 3
RUN echo never
'''


def docker_build_output(context: Path) -> list[str]:
    proc = subprocess.run(["/usr/bin/docker", "build", "--progress=plain", str(context)], capture_output=True,
                          text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    return (proc.stdout + proc.stderr).splitlines()


@pytest.fixture(scope="module")
def base_ref(engine):
    """The small recipe's Debian base, as the pipeline imports it (bootstrapped once, cached)."""
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    return ensure_base_image(lock.base, load_recipe(REPO / "recipes" / "cuda-toolchain.toml").base, engine)


@pytest.mark.engine
def test_a_failed_buildkit_run_step_names_the_step_and_the_tools_error(engine, base_ref, tmp_path):
    (tmp_path / "Dockerfile").write_text(FAILING.format(base=base_ref))
    step = failed_step(docker_build_output(tmp_path))
    assert step.step == "3/4" and step.instruction.startswith("RUN --mount=type=cache")
    # The error line and what follows it (BuildKit interleaves the step's stdout and stderr).
    assert step.cause.startswith("apply_patch: error: demo.py: hunk 1 of 1 (@@ -1,2 +1,2 @@) does not apply at "
                                 "line 3:\n") and "  expected: x = 1" in step.cause.splitlines()
    assert step.exit_code == 3 and "working" in step.output
    error = build_failure("docker build", 1, docker_build_output(tmp_path))
    assert str(error).startswith("docker build failed at step 3/4: apply_patch: error: demo.py: hunk 1 of 1")
    assert error.details()["step"]["exit_code"] == 3


@pytest.mark.engine
def test_a_build_that_fails_before_any_step_is_the_tools_tail(engine, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM imagebuild-test/no-such-image@sha256:" + "0" * 64 + "\n")
    lines = docker_build_output(tmp_path)
    assert failed_step(lines) is None
    error = build_failure("docker build", 1, lines)
    assert "no image was tagged. Last lines:" in str(error) and error.details() == {}


@pytest.mark.needs_tool("buildah", package="buildah")
def test_a_failed_buildah_step_names_the_step_and_the_cause(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY a /etc/a\nCOPY missing /etc/missing\n")
    (tmp_path / "a").write_text("hi\n")
    proc = subprocess.run(["buildah", "bud", "--pull-never", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0
    step = failed_step((proc.stdout + proc.stderr).splitlines())
    assert (step.step, step.instruction) == ("3/3", "COPY missing /etc/missing")
    assert '"/missing": no such file or directory' in step.cause


def test_an_internal_vertex_error_is_not_a_step_of_ours():
    lines = ["#3 [internal] load metadata for docker.io/library/x:1", "#3 ERROR: pull access denied",
             "------", "error: failed to solve: pull access denied"]
    assert failed_step(lines) is None


def test_without_an_error_line_the_cause_is_the_steps_last_output():
    lines = ["#5 [2/2] RUN false", "#5 0.1 compiling", "#5 0.2 still compiling", "",
             "#5 ERROR: executor failed running [/bin/sh -c false]: exit code: 1"]
    step = failed_step(lines)
    assert (step.step, step.cause, step.exit_code) == ("2/2", "still compiling", 1)


LINE = st.text(max_size=80) | st.sampled_from(
    ["#5 [2/2] RUN x", "#5 0.1 error: boom", "#5 ERROR: exit code: 2", "STEP 1/2: RUN y",
     'Error: building at STEP "RUN y": exit status 1', "#5 [internal] load", "#x 1.0 y", "#5 ERROR:"])


@given(st.lists(LINE, max_size=30))
def test_any_output_gives_a_step_or_none_and_never_raises(lines):
    step = failed_step(lines)
    error = build_failure("docker build", 1, lines)
    if step is not None:
        assert step.cause in str(error) and error.details()["step"]["step"] == step.step
