"""bench/runners.py's own logic: the sibling recipe it writes (the flagship's, one pin more, still a valid recipe
whose lock keeps every version), what the registry's access log says runner B pulled (Debian's docker-registry
2.8.2's own lines, tests/test_bench_node.py), and when runner B is an error rather than a number."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.recipe.model import load_recipe
from tests.bench_script import loaded
from tests.json_fuzz import json_values
from tests.test_bench_node import BLOB, LOG, MISSING, RANGED

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runners():
    yield from loaded("runners")


def test_the_sibling_is_the_recipe_with_one_pin_more_and_its_lock(runners, tmp_path):
    flagship = REPO / "recipes" / "sglang-blackwell.toml"
    path = runners.sibling(flagship, tmp_path)
    recipe, original = load_recipe(path), load_recipe(flagship)
    assert recipe.python.requirements == ("six==1.17.0", *original.python.requirements)
    assert recipe.name == "imagebuild/sglang-blackwell-sibling" and recipe.aot == original.aot
    assert [p.path for p in recipe.patches] == [p.path for p in original.patches]  # found where the flagship's are
    assert (tmp_path / "lockfiles" / "sglang-blackwell-sibling.lock").read_bytes() == \
        (REPO / "lockfiles" / "sglang-blackwell.lock").read_bytes()


def test_a_recipe_without_a_requirements_list_is_refused_by_name(runners, tmp_path):
    odd = tmp_path / "odd.toml"
    odd.write_text('[image]\nname = "x/y"\n[python]\nrequirements = ["six"]\n')
    with pytest.raises(SystemExit, match="odd.toml: no `requirements = \\[` line"):
        runners.sibling(odd, tmp_path / "out")


def test_only_whole_gets_count_as_pulled(runners):
    assert runners.pulled(LOG) == (1, 5000)  # not the PUT or the HEAD
    assert runners.pulled(RANGED + MISSING) == (0, 0)  # a ranged GET, a 404
    assert runners.pulled(LOG + LOG.replace(BLOB, "sha256:" + "1" * 64)) == (2, 10000)


def report(compiled, reused, added=None):
    seeded = {"added": added, "taken": [{"source": "127.0.0.1:5000/bench/x:buildcache-main"}]} if added else None
    return {"report": {"kernels": {"step": "ran", "compiled": compiled, "reused": reused, "seeded": seeded}}}


def test_runner_b_must_compile_nothing_reuse_all_and_pull(runners):
    runners.check_second(report(12, 0), report(0, 12, {"flashinfer": 6}), blobs=17)  # the control
    with pytest.raises(runners.PassError, match="runner B compiled 1 and reused 11"):
        runners.check_second(report(12, 0), report(1, 11, {"flashinfer": 5}), blobs=17)
    with pytest.raises(runners.PassError, match="runner A compiled no kernel"):
        runners.check_second(report(0, 12), report(0, 12), blobs=17)  # A's engine was not empty
    with pytest.raises(runners.PassError, match="pulled no blob"):
        runners.check_second(report(12, 0), report(0, 12, {"flashinfer": 6}), blobs=0)
    with pytest.raises(runners.PassError, match="compiled None"):
        runners.check_second(report(12, 0), {"report": {}}, blobs=3)  # no kernel report at all


@given(json_values)
def test_any_build_report_gives_a_verdict_never_a_traceback(runners, value):
    """`build --json` is another tool's output here: whatever its shape, runner B passes or is a PassError."""
    assert set(runners.kernels_of({"kernels": value})) == {"step", "compiled", "reused", "seeded_added", "seeded_from"}
    try:
        runners.check_second(report(12, 0), {"report": value}, blobs=1)
    except runners.PassError:
        pass


@given(st.text(max_size=400))
def test_any_log_text_gives_counts(runners, text):
    blobs, size = runners.pulled(text)
    assert blobs >= 0 and size >= 0
