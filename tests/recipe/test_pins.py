"""Moving one pin in place (imagebuild/recipe/pins.py) and `lock --upgrade-package` end to end: the
committed cuda-toolchain recipe and lock, a real resolve against PyPI, and a pin that does not resolve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from imagebuild.cli.app import main
from imagebuild.errors import RecipeError
from imagebuild.lock import read_lock
from imagebuild.recipe.pins import parse_upgrade, set_pin
from imagebuild.recipe.reader import parse_toml

REPO = Path(__file__).resolve().parents[2]
TEXT = '''\
# a comment naming "torch==2.14.1" too: it must stay as it is
[image]
name = "x/y"  # trailing comment

[python]
requirements = [
  "torch==2.14.1",          # the framework
  'cuda-toolkit[nvcc,cccl]==13.0.3.0',
  "six>=1.16; python_version >= '3.8'",
]
constraints = ["nvidia-cuda-nvcc==13.0.*"]
'''


def changed_lines(a: str, b: str) -> list[tuple[str, str]]:
    return [(x, y) for x, y in zip(a.splitlines(), b.splitlines()) if x != y]


def test_a_pin_moves_in_place_and_nothing_else_does():
    new = set_pin(TEXT, Path("r.toml"), "torch", "2.14.2")
    assert changed_lines(TEXT, new) == [('  "torch==2.14.1",          # the framework',
                                         '  "torch==2.14.2",          # the framework')]
    literal = set_pin(TEXT, Path("r.toml"), "cuda_toolkit", "13.0.4.0")  # any spelling of the name
    assert changed_lines(TEXT, literal) == [("  'cuda-toolkit[nvcc,cccl]==13.0.3.0',", "  'cuda-toolkit[nvcc,cccl]==13.0.4.0',")]
    marked = set_pin(TEXT, Path("r.toml"), "six", "1.17.0")
    assert parse_toml(marked, Path("r.toml"))["python"]["requirements"][2] == "six==1.17.0; python_version >= '3.8'"
    loose = set_pin(TEXT, Path("r.toml"), "torch", None)
    assert parse_toml(loose, Path("r.toml"))["python"]["requirements"][0] == "torch"


def test_a_package_that_is_not_a_requirement_is_one_error_naming_the_key():
    with pytest.raises(RecipeError) as caught:
        set_pin(TEXT, Path("r.toml"), "nvidia-cuda-nvcc", "13.0.88")  # a constraint, not a requirement
    assert caught.value.key == "python.requirements" and "nvidia-cuda-nvcc is not in" in str(caught.value)
    with pytest.raises(RecipeError, match="names a URL"):
        set_pin('[python]\nrequirements = ["foo @ https://example.invalid/foo.whl"]\n', Path("r.toml"), "foo", "1")


def test_an_entry_written_in_a_form_the_edit_does_not_know_is_refused():
    text = '[python]\nrequirements = ["tor\\u0063h==2.14.1"]\n'  # an escape: the literal is not the value
    with pytest.raises(RecipeError, match="left as it is"):
        set_pin(text, Path("r.toml"), "torch", "2.14.2")


@pytest.mark.parametrize("spec, parsed", [("sglang", ("sglang", None)), ("SGLang==0.5.22", ("sglang", "0.5.22")),
                                          ("cuda_toolkit==13.0.3.0", ("cuda-toolkit", "13.0.3.0"))])
def test_upgrade_specs(spec, parsed):
    assert parse_upgrade(spec) == parsed


@pytest.mark.parametrize("spec", ["", "sglang>=1", "sglang==not-a-version", "a b"])
def test_a_bad_upgrade_spec_says_what_to_write(spec):
    with pytest.raises(ValueError, match="NAME|version"):
        parse_upgrade(spec)


@given(st.sampled_from(["torch", "cuda-toolkit", "six"]),
       st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,3}){0,3}(\.post[0-9])?\Z"))
def test_any_version_lands_in_exactly_that_entry(name, version):
    new = set_pin(TEXT, Path("r.toml"), name, version)
    before, after = (parse_toml(t, Path("r.toml")) for t in (TEXT, new))
    index = {"torch": 0, "cuda-toolkit": 1, "six": 2}[name]
    assert f"=={version}" in after["python"]["requirements"][index]
    after["python"]["requirements"][index] = before["python"]["requirements"][index]
    assert after == before and len(changed_lines(TEXT, new)) <= 1


# ---------------------------------------------------------------- the command, for real

@pytest.fixture
def toolchain(tmp_path):
    """The committed cuda-toolchain recipe and its lock, in a folder of their own (its base stays locked)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "lockfiles").mkdir()
    recipe = tmp_path / "recipes" / "cuda-toolchain.toml"
    shutil.copy(REPO / "recipes" / "cuda-toolchain.toml", recipe)
    shutil.copy(REPO / "lockfiles" / "cuda-toolchain.lock", tmp_path / "lockfiles" / "cuda-toolchain.lock")
    return recipe


def test_upgrade_package_moves_the_pin_relocks_and_prints_the_diff(toolchain, capsys):
    before = toolchain.read_text()
    assert main(["lock", str(toolchain), "--upgrade-package", "sgl-deep-gemm==0.2.3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["upgraded"] == [{"name": "sgl-deep-gemm", "old": "0.2.3.post2", "new": "0.2.3"}]
    assert changed_lines(before, toolchain.read_text()) == [('  "sgl-deep-gemm==0.2.3.post2",', '  "sgl-deep-gemm==0.2.3",')]
    lock = read_lock(toolchain.parent.parent / "lockfiles" / "cuda-toolchain.lock")
    assert lock.packages["sgl-deep-gemm"] == "0.2.3"
    (platform,) = report["diff"]["platforms"]
    assert {"name": "sgl-deep-gemm", "old": "0.2.3.post2", "new": "0.2.3", "layer": "kernels"} in platform["moved"]
    assert not [s for s in platform["rebuilds"] if s["step"] == "base" and s["rebuilds"]]
    # no version: the newest that resolves with the rest of the recipe (its exclude_newer included)
    assert main(["lock", str(toolchain), "--upgrade-package", "sgl-deep-gemm"]) == 0
    text = capsys.readouterr().out
    newest = read_lock(toolchain.parent.parent / "lockfiles" / "cuda-toolchain.lock").packages["sgl-deep-gemm"]
    assert Version(newest) > Version("0.2.3") and f'"sgl-deep-gemm=={newest}"' in toolchain.read_text()
    assert f"sgl-deep-gemm 0.2.3 -> {newest}" in text


def test_a_pin_that_does_not_resolve_leaves_recipe_and_lock_as_they_were(toolchain, capsys):
    lock_path = toolchain.parent.parent / "lockfiles" / "cuda-toolchain.lock"
    recipe_before, lock_before = toolchain.read_bytes(), lock_path.read_bytes()
    assert main(["lock", str(toolchain), "--upgrade-package", "sgl-deep-gemm==99.0.0", "--json"]) != 0
    error = json.loads(capsys.readouterr().out)
    assert error["ok"] is False and "sgl-deep-gemm" in error["message"]
    assert toolchain.read_bytes() == recipe_before and lock_path.read_bytes() == lock_before
    assert sorted(p.name for p in toolchain.parent.iterdir()) == ["cuda-toolchain.toml"]  # no temp file left
    assert main(["lock", str(toolchain), "--upgrade-package", "nvidia-cuda-nvcc==13.0.88", "--json"]) == 2
    assert "is not in [python].requirements" in json.loads(capsys.readouterr().out)["message"]
    assert toolchain.read_bytes() == recipe_before
