"""Several platforms from one recipe: [platforms.<arch>] parsed and checked per platform, one lock per
platform in one file, and a real resolve for arm64 (uv, the real index, small packages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild import flows
from imagebuild.knowledge import Finding, rules
from tests.fake_base import debian_identity
from imagebuild.errors import LockError, RecipeError, ResolveFailed
from imagebuild.lock import Lock, LockedWheel, PlatformLocks, parse_locks, read_lock, resolve_lock, write_locks
from imagebuild.lock.resolve import missing_wheel
from imagebuild.recipe.model import load_recipe, parse_recipe
from imagebuild.render import template_sha256
from tests.json_fuzz import replace_one_field

RECIPE = """\
[image]
name = "imagebuild-test/multi"

[base]
debian = "bookworm"

[python]
requirements = ["six==1.16.0"]

[cuda]
toolkit = "13.0"
archs = ["sm_120a"]
min_driver = "595.71.05"

[platforms.arm64]
cuda_archs = ["sm_90a", "sm_100a", "sm_121a"]

[platforms.amd64]
"""


def parse(text: str, tmp_path: Path):
    path = tmp_path / "multi.toml"
    path.write_text(text)
    return load_recipe(path)


def error(text: str, tmp_path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        parse(text, tmp_path)
    return caught.value


# ---------------------------------------------------------------- the recipe

def test_platforms_come_in_a_fixed_order_and_each_gets_its_own_base_and_gpu_targets(tmp_path):
    recipe = parse(RECIPE, tmp_path)
    assert [p.name for p in recipe.platforms] == ["linux/amd64", "linux/arm64"]
    arm = recipe.for_platform("arm64")
    assert arm.base.arch == "arm64" and not arm.platforms
    assert [a.sm for a in arm.cuda.archs] == ["sm_90a", "sm_100a", "sm_121a"]
    amd = recipe.for_platform("amd64")
    assert amd.base.arch == "amd64" and [a.sm for a in amd.cuda.archs] == ["sm_120a"]
    assert amd.path == arm.path == recipe.path  # one recipe: one checksum for every platform's lock


def test_a_recipe_without_platforms_is_one_platform_as_before(tmp_path):
    recipe = parse(RECIPE.split("[platforms.arm64]")[0], tmp_path)
    assert recipe.platforms == () and recipe.base.arch == "amd64"


@pytest.mark.parametrize("old, new, key, message", [
    ("[platforms.amd64]\n", "[platforms.riscv64]\n", "platforms.riscv64", "platform"),
    ('debian = "bookworm"', 'debian = "bookworm"\narch = "arm64"', "base.arch", "both say which platforms"),
    ('cuda_archs = ["sm_90a", "sm_100a", "sm_121a"]', 'cuda_archs = ["sm_9x"]', "platforms.arm64.cuda_archs[0]",
     "sm_9x"),
    ('cuda_archs = ["sm_90a", "sm_100a", "sm_121a"]', 'engine = "grace-1:2376"', "platforms.arm64.engine",
     "not a Docker endpoint"),
    ('cuda_archs = ["sm_90a", "sm_100a", "sm_121a"]', 'builder = "x"', "platforms.arm64.builder", "builder"),
])
def test_a_bad_platform_entry_names_the_key_and_its_line(tmp_path, old, new, key, message):
    problem = error(RECIPE.replace(old, new), tmp_path)
    assert problem.key == key and message in str(problem) and problem.line is not None


def test_platforms_need_a_debian_base_and_gpu_targets_need_cuda(tmp_path):
    image = RECIPE.replace('debian = "bookworm"', 'image = "x/y@sha256:' + "a" * 64 + '"\npython = "3.11"\n'
                           'glibc = "2.36"')
    assert "need a Debian base" in str(error(image, tmp_path))
    no_cuda = RECIPE.replace('[cuda]\ntoolkit = "13.0"\narchs = ["sm_120a"]\nmin_driver = "595.71.05"\n', "")
    assert error(no_cuda, tmp_path).key == "platforms.arm64.cuda_archs"
    assert "names no platform" in str(error(RECIPE.split("[platforms.arm64]")[0] + "[platforms]\n", tmp_path))


def test_an_engine_endpoint_is_kept_as_written(tmp_path):
    recipe = parse(RECIPE.replace("[platforms.amd64]", '[platforms.amd64]\nengine = "unix:///run/b.sock"'), tmp_path)
    assert recipe.platform("amd64").engine == "unix:///run/b.sock" and recipe.platform("arm64").engine is None


values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                    max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), values, max_size=3))
def test_any_platforms_table_is_a_recipe_or_one_recipe_error(table):
    import tomli_w
    try:
        text = RECIPE.split("[platforms.arm64]")[0] + tomli_w.dumps({"platforms": table})
    except (TypeError, ValueError):  # not representable in TOML (None)
        return
    try:
        parse_recipe(text, Path("fuzz.toml"))
    except RecipeError:
        pass


PRUNE = """
[[prune]]
package = "six"
remove = ["six.py"]
reason = "only the amd64 wheel has it"
platforms = ["amd64"]
"""


def test_a_prune_entry_for_some_platforms_prunes_only_their_images(tmp_path):
    recipe = parse(RECIPE + PRUNE, tmp_path)
    assert [e.platforms for e in recipe.prune] == [("amd64",)]
    assert recipe.for_platform("amd64").prune == recipe.prune
    assert recipe.for_platform("arm64").prune == ()
    # A one-platform recipe keeps the entries of its own platform only.
    single = RECIPE.split("[platforms.arm64]")[0]
    assert parse(single + PRUNE, tmp_path).prune == recipe.prune
    assert parse(single.replace('debian = "bookworm"', 'debian = "bookworm"\narch = "arm64"') + PRUNE,
                 tmp_path).prune == ()
    problem = error(RECIPE + PRUNE.replace('["amd64"]', '["x86_64"]'), tmp_path)
    assert problem.key == "prune[0].platforms[0]" and "amd64, arm64" in str(problem)


# ---------------------------------------------------------------- compatibility, per platform

def test_each_platforms_gpu_targets_are_checked_against_the_toolkit(tmp_path):
    recipe = parse(RECIPE.replace('toolkit = "13.0"', 'toolkit = "12.8"'), tmp_path)
    errors = [f for f in rules.check_recipe(recipe) if f.status == "error"]
    assert [(f.rule, f.key) for f in errors] == [("arch-needs-newer-cuda", "platforms.arm64.cuda_archs")]
    assert "sm_121a" in errors[0].message and "[platforms.arm64].cuda_archs" in errors[0].evidence
    # Negative control: with CUDA 12.9, DGX Spark's sm_121a compiles, and GB200's sm_100a already did.
    fine = parse(RECIPE.replace('toolkit = "13.0"', 'toolkit = "12.9"'), tmp_path)
    assert not [f for f in rules.check_recipe(fine) if f.rule.startswith("arch-")]


def test_findings_every_platform_has_are_said_once_and_the_others_name_their_platform():
    shared = Finding("note", "overlap", "two own a.py", "", "", "src")
    arm_only = Finding("error", "no-nvcc", "no nvcc", "", "", "src")
    merged = flows.across_platforms({"amd64": [shared], "arm64": [shared, arm_only]})
    assert [f.message for f in merged] == ["two own a.py", "linux/arm64: no nvcc"]


# ---------------------------------------------------------------- the lock file

def one_lock(arch: str) -> Lock:
    base = debian_identity({"libc6": "2.36-9", "python3": "3.11.2-1"}, arch=arch)
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    wheel = LockedWheel("six", "1.16.0", "six-1.16.0-py2.py3-none-any.whl", "a" * 64, 11053, "libraries")
    numpy = LockedWheel("numpy", "2.1.0", f"numpy-2.1.0-cp311-cp311-manylinux_2_17_{machine}.whl",
                        ("b" if arch == "amd64" else "c") * 64, 1, "libraries")
    return Lock(recipe="multi", recipe_sha256="d" * 64, tool_version="0", template_sha256="f" * 64,
                base=base, python_platform=base.uv_platform, resolver="uv", wheels=(numpy, wheel),
                payload_sha256="0" * 64)


def test_a_multi_platform_lock_holds_one_ordinary_lock_per_platform(tmp_path):
    locks = PlatformLocks("multi", "d" * 64, {"arm64": one_lock("arm64"), "amd64": one_lock("amd64")})
    path = tmp_path / "multi.lock"
    write_locks(locks, path)
    read = parse_locks(path.read_text(), str(path))
    assert read == locks and list(json.loads(path.read_text())["platforms"]) == ["amd64", "arm64"]
    arm = read_lock(path, "arm64")
    assert arm.python_platform == "aarch64-manylinux_2_36" and arm.sha256 == one_lock("arm64").sha256
    # Each platform's entry is what a one-platform lock would be: the image carries it as is.
    assert parse_locks(arm.to_json(), "x") == arm
    with pytest.raises(LockError, match=r"holds the locks of 2 platforms \(amd64, arm64\)"):
        read_lock(path)
    with pytest.raises(LockError, match="no lock for platform 'riscv64'"):
        read_lock(path, "riscv64")


def test_a_platform_entry_for_another_arch_is_refused():
    data = json.loads(PlatformLocks("multi", "d" * 64, {"arm64": one_lock("amd64")}).to_json())
    with pytest.raises(LockError, match=r"platforms.arm64.base.arch"):
        parse_locks(json.dumps(data), "x.lock")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_multi_platform_lock_with_one_field_replaced_never_tracebacks(data):
    doc = json.loads(PlatformLocks("multi", "d" * 64, {"amd64": one_lock("amd64"), "arm64": one_lock("arm64")})
                     .to_json())
    replace_one_field(doc, data)
    try:
        parse_locks(json.dumps(doc), "fuzz.lock")
    except LockError:
        pass


# ---------------------------------------------------------------- real resolves for arm64

def test_uv_resolves_the_arm64_wheel_of_a_binary_package(tmp_path):
    recipe = parse(RECIPE.replace('"six==1.16.0"', '"pyyaml==6.0.2"'), tmp_path).for_platform("arm64")
    locked = resolve_lock(recipe, one_lock("arm64").base, template_sha256=template_sha256())
    (pyyaml,) = locked.wheels
    assert "aarch64" in pyyaml.filename and locked.python_platform == "aarch64-manylinux_2_36"
    assert locked.cuda["archs"] == ["sm_90a", "sm_100a", "sm_121a"]


@pytest.mark.parametrize("columns", [None, "40"])
def test_a_package_without_a_wheel_for_a_platform_is_named_with_the_platform(tmp_path, monkeypatch, columns):
    # nvidia-cuda-runtime-cu11 11.7.99 ships manylinux1_x86_64 and win_amd64 wheels only. uv wraps its
    # explanation at $COLUMNS: a narrow terminal must not lose the headline.
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    recipe = parse(RECIPE.replace('"six==1.16.0"', '"nvidia-cuda-runtime-cu11==11.7.99"'), tmp_path)
    assert resolve_lock(recipe.for_platform("amd64"), one_lock("amd64").base, template_sha256=template_sha256()).wheels  # negative control
    with pytest.raises(ResolveFailed) as caught:
        resolve_lock(recipe.for_platform("arm64"), one_lock("arm64").base, template_sha256=template_sha256())
    first_line = str(caught.value).splitlines()[0]
    assert "nvidia-cuda-runtime-cu11 11.7.99 has no wheel for linux/arm64 (aarch64-manylinux_2_36)" in first_line


def test_the_missing_wheel_is_read_from_uvs_words_or_not_at_all():
    said = ("  cause: Because torch==2.14.1 has no wheels with a matching platform tag (e.g., "
            "`manylinux_2_36_aarch64`) and you require torch==2.14.1, we can conclude ...")
    assert missing_wheel(said) == "torch 2.14.1"
    assert missing_wheel("error: Failed to fetch: connection refused") is None
    wrapped = ("  cause: Because nvidia-cuda-runtime-cu11==11.7.99 has no wheels with a\n"
               "         matching platform tag (e.g., `manylinux_2_36_aarch64`) and you\n")
    assert missing_wheel(wrapped) == "nvidia-cuda-runtime-cu11 11.7.99"  # uv at COLUMNS=80


@given(st.text(), st.integers(min_value=10, max_value=120))
def test_the_missing_wheel_is_read_the_same_at_any_width_and_never_raises(noise, width):
    import textwrap
    said = f"{noise} cause: Because torch==2.14.1 has no wheels with a matching platform tag (e.g., x)"
    found = missing_wheel(said)
    assert found is not None and found.endswith("2.14.1")
    assert missing_wheel("\n".join(textwrap.wrap(said, width, break_long_words=False))) == found
    if "Because" not in noise:
        assert missing_wheel(noise) is None
