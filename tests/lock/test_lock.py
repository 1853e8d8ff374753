"""Lock: uv resolves for the base's Python and glibc; the lock file is deterministic, validated and
detects staleness. Resolves go to the real index (uv's default) with small packages."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import imagebuild.lock.lockfile as lock_module
from tests.fake_base import debian_identity
from imagebuild.errors import LockError, ResolveFailed, StaleLock
from imagebuild.lock import (Lock, LockedWheel, ensure_fresh, parse_lock, parse_pylock, read_lock, resolve_lock,
                             write_lock)
from imagebuild.recipe.layers import LayerPlan
from imagebuild.recipe.model import load_recipe
from imagebuild.render import template_sha256
from tests.json_fuzz import json_values, replace_one_field

FIXTURES = Path(__file__).parent.parent / "fixtures" / "locks"
BOOKWORM = debian_identity({"libc6": "2.36-9+deb12u14", "python3": "3.11.2-1+b1"})
TEMPLATE = template_sha256()  # render/Dockerfile.j2, as the flows hand it to the lock
PLAN = LayerPlan(overrides={}, application=frozenset({"sgl-deep-gemm"}))

SMALL = """\
[image]
name = "imagebuild-test/small"

[base]
debian = "bookworm"

[python]
requirements = ["requests==2.32.3"]
exclude = ["urllib3"]
exclude_newer = "2025-06-01"
"""


def test_pylock_gives_one_hashed_wheel_per_package_in_layer_order():
    wheels = parse_pylock((FIXTURES / "cuda-toolchain.pylock.toml").read_text(), PLAN)
    assert [w.name for w in wheels][:2] == ["cuda-toolkit", "nvidia-cuda-cccl"]
    assert {w.layer for w in wheels} == {"framework", "kernels"}
    assert wheels[-1].name == "sgl-deep-gemm" and wheels[-1].layer == "kernels"
    nvcc = next(w for w in wheels if w.name == "nvidia-cuda-nvcc")
    assert nvcc.filename.startswith("nvidia_cuda_nvcc-13.0.88-") and len(nvcc.sha256) == 64
    assert nvcc.requirement_line == f"nvidia-cuda-nvcc==13.0.88 --hash=sha256:{nvcc.sha256}"


def test_pylock_refuses_a_package_without_a_wheel():
    text = '[[packages]]\nname = "legacy"\nversion = "1.0"\nsdist = { url = "x.tar.gz" }\n'
    with pytest.raises(ResolveFailed, match=r"legacy 1.0 has no wheel.*exclude"):
        parse_pylock(text, PLAN)


def test_pylock_refuses_a_wheel_without_sha256():
    text = '[[packages]]\nname = "a"\nversion = "1"\nwheels = [{ url = "https://x.invalid/a-1-py3-none-any.whl" }]\n'
    with pytest.raises(ResolveFailed, match="no sha256"):
        parse_pylock(text, PLAN)


def _lock(wheels=None) -> Lock:
    wheels = wheels or parse_pylock((FIXTURES / "cuda-toolchain.pylock.toml").read_text(), PLAN)
    return Lock(recipe="cuda-toolchain", recipe_sha256="a" * 64, tool_version="0.1.0",
                template_sha256="b" * 64, base=BOOKWORM, python_platform=BOOKWORM.uv_platform,
                resolver="uv 0.13.9", wheels=wheels,
                cuda={"toolkit": "13.0", "archs": ["sm_120a"], "min_driver": "595.71.05",
                      "nvcc": "nvidia/cu13/bin/nvcc", "deep_gemm": "sgl-deep-gemm",
                      # as the real cuda-toolchain lock reads them from its wheels' RECORDs
                      "unversioned": {"nvidia/cu13/lib/libcudart.so": "libcudart.so.13",
                                      "nvidia/cu13/lib/libnvvm.so": "libnvvm.so.4"}})


def test_lock_round_trips_byte_identically():
    lock = _lock()
    text = lock.to_json()
    again = parse_lock(text, "x.lock")
    assert again == lock
    assert again.to_json() == text
    assert text.endswith("\n") and json.loads(text)["lock_version"] == 2


def test_write_lock_replaces_atomically(tmp_path):
    path = tmp_path / "lockfiles" / "x.lock"
    write_lock(_lock(), path)
    assert read_lock(path) == _lock()
    assert [p.name for p in path.parent.iterdir()] == ["x.lock"]  # no temp file left


def test_missing_lock_says_how_to_make_one(tmp_path):
    with pytest.raises(LockError, match="imagebuild lock"):
        read_lock(tmp_path / "none.lock")


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["packages"][0]["wheel"].update(sha256="nothex"), r"packages\[0\].wheel.sha256"),
    (lambda d: d["packages"][1].update(layer="gpu"), r"packages\[1\].layer"),
    (lambda d: d["packages"][2]["wheel"].update(filename="../evil.whl"), r"packages\[2\].wheel.filename"),
    (lambda d: d["packages"][0].update(version="not a version"), r"packages\[0\].version"),
    (lambda d: d["base"].update(kind="vm"), r"base.kind"),
    (lambda d: d["base"]["debs"][0].update(sha256="0" * 63), r"base.debs\[0\].sha256"),
    (lambda d: d["base"]["debs"][0].update(version="2.36-9+evil1"), r"package libc6 2.36-9\+evil1 .*edited"),
    (lambda d: d["base"]["debs"][1].update(filename="pool/../../etc/passwd"), r"base.debs\[1\].filename"),
    (lambda d: d["base"]["debs"][0].update(suite="sid"), r"base.debs\[0\].suite.*package libc6"),
    (lambda d: d["base"]["debs"][0].update(arch="arm64"), r"base.debs\[0\].arch"),
    (lambda d: d["base"]["debs"].append(dict(d["base"]["debs"][0])), r"locked twice"),
    (lambda d: d["base"].update(debs=[]), r"base.debs\] locks no package"),
    (lambda d: d["base"].update(suites=[]), r"base.suites\] names no suite"),
    (lambda d: d["base"].pop("rootfs_sha256"), r"base.rootfs_sha256"),
    (lambda d: d.update(lock_version=99), r"lock_version 99"),
    (lambda d: d.pop("recipe"), r"\[recipe\]"),
])
def test_a_damaged_lock_names_the_key(mutate, key):
    data = json.loads(_lock().to_json())
    mutate(data)
    with pytest.raises(LockError, match=key):
        parse_lock(json.dumps(data), "lockfiles/x.lock")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps)))
def test_any_text_is_a_lock_or_a_lock_error(text):
    try:
        parse_lock(text, "fuzz.lock")
    except LockError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_real_lock_with_one_field_replaced_never_tracebacks(data):
    doc = json.loads(_lock().to_json())
    replace_one_field(doc, data)
    try:
        parse_lock(json.dumps(doc), "fuzz.lock")
    except LockError:
        pass


# ---------------------------------------------------------------- real resolves

def test_resolve_targets_the_base_not_the_host_and_is_byte_identical(write_recipe):
    recipe = load_recipe(write_recipe(SMALL.replace("requests==2.32.3", "pyyaml==6.0.2")))
    py312 = replace(BOOKWORM, python="3.12")
    first = resolve_lock(recipe, py312, template_sha256=TEMPLATE)
    second = resolve_lock(recipe, py312, template_sha256=TEMPLATE)
    assert first.to_json() == second.to_json()
    (pyyaml,) = first.wheels
    # The host runs 3.11: a cp312 manylinux wheel proves the resolve targeted the base.
    assert "-cp312-cp312-manylinux" in pyyaml.filename and "x86_64" in pyyaml.filename
    assert first.python_platform == "x86_64-manylinux_2_36"


def test_exclude_leaves_a_dependency_out_of_the_resolve(write_recipe):
    recipe = load_recipe(write_recipe(SMALL))
    names = set(resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE).packages)
    assert "requests" in names and "idna" in names
    assert "urllib3" not in names


def test_an_impossible_resolve_is_one_clear_error(write_recipe):
    recipe = load_recipe(write_recipe(SMALL.replace("requests==2.32.3", "requests==0.0.999")))
    with pytest.raises(ResolveFailed, match=r"uv could not resolve \[python\] for Python 3.11"):
        resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)


def test_a_changed_recipe_makes_the_lock_stale(write_recipe, tmp_path):
    path = write_recipe(SMALL)
    recipe = load_recipe(path)
    lock = resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)
    ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)  # fresh: no error
    path.write_text(SMALL.replace("2.32.3", "2.32.4"))
    with pytest.raises(StaleLock, match=r"test.toml changed.*--relock"):
        ensure_fresh(lock, load_recipe(path), tmp_path / "x.lock", template_sha256=TEMPLATE)


def test_a_changed_template_makes_the_lock_stale(write_recipe, tmp_path):
    """The lock records the template sha256 it is handed, and is stale against another one."""
    recipe = load_recipe(write_recipe(SMALL))
    lock = resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)
    assert lock.template_sha256 == TEMPLATE
    ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)
    with pytest.raises(StaleLock, match="Dockerfile.j2 changed"):
        ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256="0" * 64)


def test_changed_in_image_code_makes_the_lock_stale(write_recipe, tmp_path, monkeypatch):
    """The probe, patcher and pruner land in (or shape) the image: a lock names their checksum."""
    recipe = load_recipe(write_recipe(SMALL))
    lock = resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)
    assert lock.payload_sha256 == lock_module.payload_sha256()
    ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)
    monkeypatch.setattr(lock_module, "payload_sha256", lambda: "9" * 64)
    with pytest.raises(StaleLock, match="in-image code .probe, patcher or pruner. changed"):
        ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)


def test_a_lock_from_before_the_payload_checksum_reads_and_is_stale(write_recipe, tmp_path):
    recipe = load_recipe(write_recipe(SMALL))
    lock = resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)
    data = json.loads(lock.to_json())
    del data["imagebuild"]["payload_sha256"]
    old = parse_lock(json.dumps(data), "old.lock")
    assert old.payload_sha256 == ""
    with pytest.raises(StaleLock, match="predates the checksum"):
        ensure_fresh(old, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)


def test_locked_wheel_layers_follow_the_plan():
    plan = LayerPlan(overrides={"kernels": ("my-kernel*",)}, application=frozenset({"sglang"}))
    assert plan.layer_of("torch") == "framework"
    assert plan.layer_of("nvidia-cuda-nvcc") == "framework"
    assert plan.layer_of("flashinfer-python") == "kernels"
    assert plan.layer_of("My_Kernel_Lib") == "kernels"
    assert plan.layer_of("sglang") == "application"
    assert plan.layer_of("fastapi") == "libraries"
    assert LockedWheel("a", "1", "a-1-py3-none-any.whl", "c" * 64, 1, "kernels").layer == "kernels"


def test_of_several_fitting_wheels_the_one_the_image_would_install_is_locked():
    from imagebuild.lock import target_tags
    text = ('[[packages]]\nname = "charset-normalizer"\nversion = "3.4.2"\nwheels = [\n'
            ' { name = "charset_normalizer-3.4.2-py3-none-any.whl", hashes = { sha256 = "' + "1" * 64 + '" } },\n'
            ' { name = "charset_normalizer-3.4.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",'
            ' hashes = { sha256 = "' + "2" * 64 + '" } },\n'
            ' { name = "charset_normalizer-3.4.2-cp312-cp312-manylinux_2_17_x86_64.whl",'
            ' hashes = { sha256 = "' + "3" * 64 + '" } },\n]\n')
    (wheel,) = parse_pylock(text, PLAN, tags=target_tags("3.11", "2.36", "amd64"))
    assert wheel.sha256 == "2" * 64
    (wheel,) = parse_pylock(text, PLAN, tags=target_tags("3.12", "2.36", "amd64"))
    assert wheel.sha256 == "3" * 64
    (wheel,) = parse_pylock(text, PLAN, tags=target_tags("3.13", "2.36", "amd64"))
    assert wheel.sha256 == "1" * 64


def test_a_changed_patch_file_makes_the_lock_stale(write_recipe, tmp_path):
    patch = tmp_path / "recipes" / "fix.patch"
    path = write_recipe(SMALL + '\n[[patches]]\npackage = "requests"\nfile = "fix.patch"\n')
    patch.write_text("--- a/requests/__init__.py\n+++ b/requests/__init__.py\n")
    recipe = load_recipe(path)
    lock = resolve_lock(recipe, BOOKWORM, template_sha256=TEMPLATE)
    assert lock.patches[0].package == "requests" and lock.patches[0].version == "2.32.3"
    ensure_fresh(lock, recipe, tmp_path / "x.lock", template_sha256=TEMPLATE)
    patch.write_text(patch.read_text() + "@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(StaleLock, match="a patch file changed"):
        ensure_fresh(lock, load_recipe(path), tmp_path / "x.lock", template_sha256=TEMPLATE)


def test_a_comment_or_reformatting_keeps_the_lock_fresh_and_a_changed_value_does_not(write_recipe, tmp_path):
    path = write_recipe(SMALL)
    lock = resolve_lock(load_recipe(path), BOOKWORM, template_sha256=TEMPLATE)
    path.write_text("# pinned for the 2025 images\n" + SMALL.replace('name = "imagebuild-test/small"',
                                                                     "name   =   'imagebuild-test/small'  # ours"))
    ensure_fresh(lock, load_recipe(path), tmp_path / "x.lock", template_sha256=TEMPLATE)
    path.write_text(SMALL.replace('exclude_newer = "2025-06-01"', 'exclude_newer = "2025-06-02"'))
    with pytest.raises(StaleLock, match="test.toml changed since it was locked"):
        ensure_fresh(lock, load_recipe(path), tmp_path / "x.lock", template_sha256=TEMPLATE)
