"""Step markers: written by render into every RUN step, read back from a failed step's instruction as the
build tool printed it, and a failed step explained from them, on Dockerfiles render wrote and on real
BuildKit failures of a rendered context."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.bootstrap import ensure_base_image
from imagebuild.engine.build_log import FailedStep
from imagebuild.errors import BuildFailed
from imagebuild.lock import LockedPatch, LockedWheel, read_lock, uv_binary
from imagebuild.recipe import load_recipe
from imagebuild.recipe.model import Patch, Prune
from imagebuild.render import render_context, render_dockerfile, render_values
from imagebuild.render.markers import KINDS, Marker, explain, marker, parse_marker
from tests.render.test_context import PRUNE, _recipe
from tests.render.test_context_aot import AOT, _stack_lock

REPO = Path(__file__).resolve().parents[2]
kinds = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
keys = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
values = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,20}", fullmatch=True)


# ---------------------------------------------------------------- writer and reader

@given(kinds, st.dictionaries(keys, values, max_size=4), st.text(max_size=40), st.text(max_size=40))
def test_a_marker_reads_back_wherever_the_tool_prints_it(kind, fields, before, after):
    before = before.replace("imagebuild-step", "")  # the step's own text names no other marker
    text = f"RUN --mount=type=cache,target=/x{before} \\\n    {marker(kind, **fields)} && {after}"
    assert parse_marker(text) == Marker(kind, fields)


@given(st.text(max_size=300))
def test_parse_marker_never_raises(text):
    found = parse_marker(text)
    assert found is None or (isinstance(found.kind, str) and all(isinstance(v, str) for v in found.fields.values()))


@given(st.text(max_size=300).map(lambda tail: ": imagebuild-step=" + tail))
def test_parse_marker_never_raises_on_a_marker_cut_or_garbled(text):
    found = parse_marker(text)
    assert found is None or re.fullmatch(r"[a-z][a-z0-9-]*", found.kind)


@given(keys, st.text(max_size=20))
def test_a_value_the_shell_would_change_is_refused(key, value):
    try:
        written = marker("install", **{key: value})
    except ValueError:
        assert not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value)
    else:
        assert parse_marker(written).fields == {key: value}


@pytest.mark.parametrize("text", ["RUN ln -sfn a b", "COPY requirements/1-framework.txt /opt/x", "",
                                  "RUN echo imagebuild-step=install", "RUN x: imagebuild-step=install"])
def test_a_step_without_a_marker_has_none(text):
    assert parse_marker(text) is None


# ---------------------------------------------------------------- what render writes

def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions as BuildKit prints them: continuation lines joined, comments left out."""
    joined = dockerfile.replace("\\\n", "")
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


def _everything(tmp_path):
    """A lock and recipe with every kind of step: venv, install (pruned or not), links, patch, aot."""
    patch_file = tmp_path / "fix.patch"
    patch_file.write_text("--- a/x\n+++ b/x\n")
    lock = replace(_stack_lock(), patches=(LockedPatch("sgl-deep-gemm", "01-fix.patch", "f" * 64, 1, "0.2.3.post2"),))
    recipe = _recipe(tmp_path, prune=PRUNE, aot=AOT, patches=(Patch("sgl-deep-gemm", patch_file, 1),))
    return lock, recipe, patch_file


def test_every_run_step_render_writes_carries_one_marker_of_a_known_kind(tmp_path):
    lock, recipe, _ = _everything(tmp_path)
    runs = [text for text in _instructions(render_dockerfile(render_values(lock, recipe))) if text.startswith("RUN ")]
    found = [parse_marker(text) for text in runs]
    assert len(runs) == 7 and None not in found
    assert all(text.count("imagebuild-step=") == 1 for text in runs)
    assert {m.kind for m in found} == set(KINDS)


def _fail(text: str, number: str = "5/19") -> BuildFailed:
    return BuildFailed("docker build failed", step=FailedStep(number, text, "boom: the cause", "exit code: 1", 1))


def test_each_step_render_writes_is_explained_in_the_recipes_words(tmp_path):
    lock, recipe, patch_file = _everything(tmp_path)
    runs = [text for text in _instructions(render_dockerfile(render_values(lock, recipe))) if text.startswith("RUN ")]
    said = [str(explain(_fail(text), recipe, lock)).split(": boom")[0] for text in runs]
    assert said == [
        "build step 5/19 failed",  # uv venv
        "[[prune]] failed in the framework layer",
        "build step 5/19 failed",  # the toolchain's links
        "[[prune]] failed in the kernels layer",
        "installing the application layer failed",
        f"the patch {patch_file} does not apply to sgl-deep-gemm 0.2.3.post2",
        "build step 5/19 failed",  # [aot]
    ]
    error = explain(_fail(runs[4]), recipe, lock)
    assert str(error).endswith("\n  hint: the lock's wheels did not install on the base: relock (`imagebuild lock`) "
                               "or check the base\nno image was tagged.")
    assert error.step.instruction == runs[4] and len(runs[4]) > 200
    assert f"\n  step 5/19: {runs[4][:197]}...\n" in str(error)  # the instruction shown is cut at 200


def test_two_patches_of_one_package_are_told_apart_by_file(tmp_path):
    lock, recipe, first = _everything(tmp_path)
    second = tmp_path / "more.patch"
    second.write_text("--- a/y\n+++ b/y\n")
    lock = replace(lock, patches=lock.patches + (LockedPatch("sgl-deep-gemm", "02-more.patch", "e" * 64, 1, "0.2.3.post2"),))
    recipe = replace(recipe, patches=recipe.patches + (Patch("sgl-deep-gemm", second, 1),))
    patches = [text for text in _instructions(render_dockerfile(render_values(lock, recipe))) if "step=patch" in text]
    assert [str(explain(_fail(text), recipe, lock)).split(" does not")[0] for text in patches] == [
        f"the patch {first}", f"the patch {second}"]


def test_a_failure_naming_no_step_is_returned_as_it_is(tmp_path):
    lock, recipe, _ = _everything(tmp_path)
    failure = BuildFailed("docker build failed (exit 1); no image was tagged. Last lines:\n...")
    assert explain(failure, recipe, lock) is failure


@given(st.text(max_size=300))
def test_explain_never_raises_on_any_instruction(text):
    lock, recipe = _stack_lock(), _recipe(Path("/nonexistent"))
    error = explain(_fail(text), recipe, lock)
    assert isinstance(error, BuildFailed) and str(error).endswith("no image was tagged.")


# ---------------------------------------------------------------- real BuildKit failures of a rendered context

SIX = LockedWheel("six", "1.16.0", "six-1.16.0-py2.py3-none-any.whl",
                  "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254", 11053, "application")


@pytest.fixture(scope="module")
def small(engine):
    """The small recipe's lock and its Debian base (bootstrapped once, cached), with six as its one wheel."""
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    recipe = load_recipe(REPO / "recipes" / "cuda-toolchain.toml")
    ensure_base_image(lock.base, recipe.base, engine)
    lock = replace(lock, wheels=(SIX,), cuda=None, patches=())
    recipe = replace(recipe, cuda=None, env={}, labels={}, prune=(), patches=(), aot=None)
    return lock, recipe


def _build_failure(engine, lock, recipe, tmp_path) -> BuildFailed:
    context = render_context(lock, recipe, tmp_path / "ctx", uv_path=uv_binary())
    # The build fetches six from the index: behind a TLS-intercepting proxy it needs the host's roots.
    roots = [Path(p) for p in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt") if p]
    roots = [path for path in roots if path.is_file()]
    with pytest.raises(BuildFailed) as caught:
        engine.build(context, secrets={"ca": roots[0]} if roots else {})
    return explain(caught.value, recipe, lock)


@pytest.mark.engine
def test_a_prune_that_matches_nothing_is_said_as_prune_in_its_layer(engine, small, tmp_path):
    lock, recipe = small
    recipe = replace(recipe, prune=(Prune("six", remove=("no_such_module*.py",), reason="matches nothing"),))
    error = _build_failure(engine, lock, recipe, tmp_path)
    assert str(error).startswith("[[prune]] failed in the application layer: prune: error: [[prune]] remove "
                                 "'no_such_module*.py' matches no file of six 1.16.0"), str(error)
    assert parse_marker(error.step.instruction) == Marker("install", {"layer": "application", "prune": "yes"})


@pytest.mark.engine
def test_a_patch_that_does_not_apply_is_said_with_its_file_and_the_locked_version(engine, small, tmp_path):
    lock, recipe = small
    patch = tmp_path / "six.patch"
    patch.write_text("--- a/six.py\n+++ b/six.py\n@@ -1,1 +1,1 @@\n-no such line\n+a line\n")
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    lock = replace(lock, patches=(LockedPatch("six", "01-six.patch", sha, 1, "1.16.0"),))
    error = _build_failure(engine, lock, replace(recipe, patches=(Patch("six", patch, 1),)), tmp_path)
    assert str(error).startswith(f"the patch {patch} does not apply to six 1.16.0: apply_patch: error: "), str(error)
    assert "\n  hint: `imagebuild patches " in str(error)


@pytest.mark.engine
def test_a_wheel_that_does_not_install_is_said_as_its_layer(engine, small, tmp_path):
    lock, recipe = small
    lock = replace(lock, wheels=(replace(SIX, sha256="0" * 64),))  # uv refuses the wheel it downloads
    error = _build_failure(engine, lock, recipe, tmp_path)
    assert str(error).startswith("installing the application layer failed: "), str(error)
    assert "Hash mismatch for `six==1.16.0`" in str(error)
    assert error.step.exit_code not in (None, 0)
