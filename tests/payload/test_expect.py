"""expect.json's one schema (payload/probe/expect.py SCHEMA): documents it takes and refuses, the probe's
lenient reading and the renderer's strict one, and what render writes for every committed lock."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.errors import LockError
from imagebuild.lock import Lock, read_locks
from imagebuild.payload.probe.expect import KEYS, NO_EXPECTATIONS, SCHEMA, load_expect, validate_expect
from imagebuild.recipe import load_recipe
from imagebuild.render import expectations, render_values

REPO = Path(__file__).resolve().parents[2]
COMPLETE = {
    "python": {"executable": "/opt/venv/bin/python", "version": "3.11"},
    "packages": {"Sgl_Deep.GEMM": "0.2.3.post2", "torch": "2.9.1"},
    "cuda": {"toolkit": "13.0", "archs": ["sm_120a"], "home": "/opt/venv/cu13", "toolchain": ["nvidia-cuda-nvcc"],
             "min_driver": "580.65.06"},
    "deep_gemm": {"compile": True},
    "imports": ["torch"],
    "torch_cuda": "13.0",
    "flashinfer_dynamo": True,
    "aot": {"manifest": "/opt/imagebuild/aot-manifest.json", "archs": ["12.0f"], "sglang": True,
            "shapes": [{"name": "s"}], "deep_gemm": "disabled"},
    "patches": [{"package": "sgl-deep-gemm", "sha256": "f" * 64}],
}
PROBLEMS = {field.name: field.problem for field in SCHEMA}


def test_the_schema_names_each_key_once_and_the_defaults_cover_them():
    assert len(set(KEYS)) == len(KEYS) == len(SCHEMA) and set(NO_EXPECTATIONS) == set(KEYS)


def test_a_complete_document_is_taken_strictly_and_normalised():
    expect, errors = validate_expect(COMPLETE, strict=True)
    assert errors == [] and set(expect) == set(KEYS)
    assert expect["packages"] == {"sgl-deep-gemm": "0.2.3.post2", "torch": "2.9.1"}
    assert expect["cuda"]["min_driver"] == "580.65.06"  # keys the schema does not name inside a value are kept


def test_the_probe_reads_a_missing_key_as_its_default_and_the_renderer_refuses_it():
    minimal = {"python": COMPLETE["python"], "packages": {}}
    expect, errors = validate_expect(minimal)
    assert errors == [] and expect == dict(NO_EXPECTATIONS, python=COMPLETE["python"])
    expect, errors = validate_expect(minimal, strict=True)
    assert expect is None and '"imports" is missing' in errors and '"patches" is missing' in errors


def test_a_key_the_schema_does_not_name_is_the_renderers_mistake_only():
    assert validate_expect(dict(COMPLETE, extra=1))[1] == []
    assert validate_expect(dict(COMPLETE, extra=1), strict=True)[1] == ['"extra" is no key of expect.json']


@pytest.mark.parametrize("key, value", [
    ("python", "/usr/bin/python3"), ("python", {"executable": "/x"}), ("packages", {"torch": 2.9}),
    ("packages", None), ("cuda", {"toolkit": "thirteen", "home": "/x"}), ("cuda", {"toolkit": "13.0", "home": 1}),
    ("cuda", {"toolkit": "13.0", "home": "/x", "archs": "sm_120a"}), ("deep_gemm", {"compile": "yes"}),
    ("imports", "torch"), ("imports", None), ("torch_cuda", "thirteen"), ("flashinfer_dynamo", None),
    ("aot", {"manifest": "/m", "archs": [], "sglang": True, "shapes": [{}]}),
    ("aot", {"manifest": "/m", "archs": ["12.0f"], "sglang": True, "shapes": ["s"]}),
    ("patches", [{"package": "six"}]), ("patches", {"six": "f" * 64}),
])
def test_a_wrong_value_is_refused_with_its_keys_problem(key, value):
    for strict in (False, True):
        assert validate_expect(dict(COMPLETE, **{key: value}), strict=strict) == (None, [PROBLEMS[key]])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12)


@given(st.sampled_from(KEYS), json_values, st.booleans())
def test_one_key_changed_is_taken_or_refused_by_that_key_alone(key, value, strict):
    expect, errors = validate_expect(dict(COMPLETE, **{key: value}), strict=strict)
    assert (expect is None and errors == [PROBLEMS[key]]) or (errors == [] and set(expect) == set(KEYS))


@given(json_values | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=6),
       st.booleans())
def test_validation_never_raises(raw, strict):
    expect, errors = validate_expect(raw, strict=strict)
    assert (expect is None) == bool(errors) and all(isinstance(error, str) for error in errors)


def test_an_unreadable_file_is_said_not_raised(tmp_path):
    path = tmp_path / "expect.json"
    path.write_text("{")
    assert load_expect(str(path))[1].startswith(f"cannot read expect file {path}: JSONDecodeError")
    path.write_text(json.dumps(dict(COMPLETE, imports="torch")))
    assert load_expect(str(path)) == (None, f"invalid expect file {path}: {PROBLEMS['imports']}")


# ---------------------------------------------------------------- the renderer's side

def _committed_locks():
    for path in sorted((REPO / "lockfiles").glob("*.lock")):
        recipe = load_recipe(REPO / "recipes" / f"{path.stem}.toml")
        found = read_locks(path)
        for arch, lock in ({None: found} if isinstance(found, Lock) else found.locks).items():
            yield f"{path.stem}:{arch or lock.base.arch}", lock, recipe.for_platform(arch) if arch else recipe


@pytest.mark.parametrize("name, lock, recipe", list(_committed_locks()), ids=lambda v: v if isinstance(v, str) else "")
def test_what_render_writes_for_each_committed_lock_is_taken_strictly(name, lock, recipe):
    document = render_values(lock, recipe).expect
    assert validate_expect(json.loads(json.dumps(document)), strict=True)[1] == [], name


def test_a_lock_whose_expect_file_the_probe_would_refuse_stops_render():
    _, lock, _ = next(_committed_locks())
    with pytest.raises(LockError, match=r'expect.json the probe refuses: "python" must be'):
        expectations(replace(lock, base=replace(lock.base, python=3.11)))
