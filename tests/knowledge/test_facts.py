"""The facts table (knowledge/compat.toml) and its public lookups (knowledge/facts.py)."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.errors import ImagebuildError
from imagebuild.knowledge import facts
from imagebuild.knowledge.facts import (SuiteFacts, debian_suite, load_facts, parse_version, release_cuda, torch_cuda,
                                        without_cuda)
from imagebuild.recipe.cuda import CudaVersion
from imagebuild.recipe.model import DEBIAN_SUITES

CUDA_12_8 = CudaVersion(12, 8)
CUDA_13_0 = CudaVersion(13, 0)


# --- the data file ----------------------------------------------------------------------------

def test_every_fact_has_a_source_and_a_basis():
    raw = tomllib.loads(facts.DATA_FILE.read_text())
    entries = [raw["glibc_nvcc"]] + [e for value in raw.values() if isinstance(value, list)
                                      for e in value]
    assert len(entries) > 30
    for entry in entries:
        assert isinstance(entry.get("source"), str) and entry["source"].strip(), entry
        assert entry.get("basis") in facts.BASES, entry


def test_facts_load_once_and_cover_the_brief():
    facts = load_facts()
    assert load_facts() is facts
    for cuda in ("12.4", "12.6", "12.8", "12.9", "13.0", "13.1", "13.2", "13.3", "13.4", "13.5"):
        assert CudaVersion.parse(cuda) in facts.drivers
    assert facts.drivers[CudaVersion(13, 4)].ga is None
    assert facts.drivers[CUDA_13_0].updates[-1] == "580.95.05"
    assert {m: f.floor for m, f in facts.floors.items()} == {12: 525, 13: 580}
    assert facts.archs["sm_120f"].first_cuda == CudaVersion(12, 9)
    assert facts.archs["sm_110a"].first_cuda == CUDA_13_0
    for name in ("cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                 "nvidia-cuda-crt", "nvidia-nvvm"):
        assert name in facts.toolchain
    for name in ("nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cuda-nvcc-cu13"):
        assert name not in facts.toolchain


@pytest.mark.parametrize("text, problem", [
    ("not toml [", "cannot read"),
    ("", "[[minor_version_compat]]: missing or empty"),
    ("[[minor_version_compat]]\nmajor = 13\nfloor = 580\nbasis = 'verified'\n", "missing 'source'"),
    ("[[minor_version_compat]]\nmajor = 13\nfloor = 580\nsource = ' '\nbasis = 'verified'\n",
     "'source' is empty"),
    ("[[minor_version_compat]]\nmajor = 13\nfloor = '580'\nsource = 's'\nbasis = 'verified'\n",
     "'floor' must be of type int"),
    ("[[minor_version_compat]]\nmajor = 13\nfloor = 580\nsource = 's'\nbasis = 'guess'\n",
     "'basis' must be one of"),
])
def test_a_malformed_data_file_is_a_clear_error(tmp_path, text, problem):
    path = tmp_path / "compat.toml"
    path.write_text(text)
    with pytest.raises(ImagebuildError, match=str(path)) as err:
        load_facts(path)
    assert problem in str(err.value)


@pytest.mark.parametrize("old, new, problem", [
    ('ga = "580.65.06"', 'ga = "580"', "not a Linux driver version"),
    ('first_cuda = "13.0"', 'first_cuda = "thirteen"', "not a CUDA version"),
    ('targets = ["sm_75"]', 'targets = ["sm_80"]', "target sm_80: listed twice"),
    ('glibc = "2.36"', 'glibc = "2.36.x"', "[[debian]] entry 2"),
    ('[glibc_nvcc]', '[glibc_nvcc_gone]', "[glibc_nvcc]: missing"),
])
def test_a_bad_value_in_the_real_file_names_its_entry(tmp_path, old, new, problem):
    text = facts.DATA_FILE.read_text()
    assert old in text
    path = tmp_path / "compat.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ImagebuildError) as err:
        load_facts(path)
    assert problem in str(err.value)


# --- lookups ----------------------------------------------------------------------------------

@pytest.mark.parametrize("suite, python, glibc, manylinux", [
    ("bullseye", "3.9", "2.31", "manylinux_2_31"),
    ("bookworm", "3.11", "2.36", "manylinux_2_36"),
    ("trixie", "3.13", "2.41", "manylinux_2_41"),
])
def test_debian_suite(suite, python, glibc, manylinux):
    facts = debian_suite(suite)
    assert isinstance(facts, SuiteFacts)
    assert (facts.suite, facts.python, facts.glibc, facts.manylinux) == (suite, python, glibc, manylinux)
    assert facts.source


def test_the_suites_a_recipe_accepts_are_those_with_facts():
    """recipe/ (a leaf, below knowledge) keeps the suite names it accepts; each needs its facts here."""
    assert set(load_facts().suites) == set(DEBIAN_SUITES)


def test_an_unknown_suite_names_the_known_ones():
    with pytest.raises(ImagebuildError, match="bookworm, bullseye, trixie"):
        debian_suite("buster")


@pytest.mark.parametrize("version, cuda", [
    ("2.14.1+cu130", CUDA_13_0), ("2.14.1+cu128", CUDA_12_8), ("2.10.0+cu130", CUDA_13_0),
    ("2.4.0+cu118", CudaVersion(11, 8)),
    # A plain release says nothing of its CUDA: no table guesses it; lock reads the wheel's METADATA.
    ("2.9.0", None), ("2.14.1", None), ("2.99.0", None),
    ("2.14.1+cpu", None), ("2.9.0+rocm6.4", None), ("nonsense", None), ("", None),
])
def test_torch_cuda_is_what_the_version_says(version, cuda):
    assert torch_cuda(version) == cuda


@pytest.mark.parametrize("local, cpu", [("cpu", True), ("rocm6.4", True), ("xpu", True), ("cu130", False),
                                        ("cu128", False), ("", False), ("cpu.cxx11.abi", False)])
def test_without_cuda_reads_the_local_tag(local, cpu):
    assert without_cuda(local) is cpu


@pytest.mark.parametrize("text, cuda", [("13.0.88", CUDA_13_0), ("13.0.3.0", CUDA_13_0), ("12.8.90", CUDA_12_8),
                                        ("13", None), ("thirteen", None), ("", None), (None, None)])
def test_release_cuda_is_the_leading_major_minor(text, cuda):
    assert release_cuda(text) == cuda


@given(st.one_of(st.text(max_size=20), st.none(), st.integers()))
def test_parse_version_answers_none_for_what_is_no_version(text):
    parsed = parse_version(text)
    assert parsed is None or str(parsed)
