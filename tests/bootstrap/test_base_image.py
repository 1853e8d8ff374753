"""The locked base is used only when the bytes prove it: the engine's image under the base's tag must be
one layer whose diff_id is the lock's rootfs sha256 (the engine computes a layer's diff_id as the sha256
of the uncompressed layer tar it imports, and the lock's rootfs sha256 is the sha256 of that same tar).

The engine tests use a base of their own (a small rootfs tar whose sha256, and so whose tag, no real lock
has), never the user's real base tag, and remove what they made."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.bootstrap import base_mismatch, ensure_base_image, rootfs_path
from imagebuild.engine.contract import ImageInfo
from imagebuild.lock import read_lock
from imagebuild.recipe.model import DebianBase, load_recipe
from tests.fake_base import debian_identity

REPO = Path(__file__).resolve().parents[2]
ROOTFS = "ab" * 32
IDENTITY = replace(debian_identity({"libc6": "2.36-9"}), rootfs_sha256=ROOTFS)


def image(*diff_ids: str, platform: str = "linux/amd64") -> ImageInfo:
    return ImageInfo(id="sha256:" + "1" * 64, size=1, diff_ids=diff_ids, platform=platform)


def test_the_one_layer_of_the_lock_s_rootfs_is_the_base():
    assert base_mismatch(image(f"sha256:{ROOTFS}"), IDENTITY) is None
    arm = replace(IDENTITY, arch="arm64")
    assert base_mismatch(image(f"sha256:{ROOTFS}", platform="linux/arm64/v8"), arm) is None


def test_an_image_made_from_the_base_is_not_the_base():
    why = base_mismatch(image(f"sha256:{ROOTFS}", "sha256:" + "cd" * 32), IDENTITY)
    assert why and "1 more on top of it" in why and "cd" * 32 in why


@pytest.mark.parametrize("info, said", [
    (None, "no image under that tag"),
    (image(), "layers are [none]"),
    (image("sha256:" + "cd" * 32), "not the one layer sha256:" + ROOTFS),
    (image(ROOTFS), "not the one layer"),  # a diff_id is "sha256:<hex>"; the bare hex is not one
    (image(f"sha256:{ROOTFS}", platform="linux/arm64/v8"), "not linux/amd64"),
    (image(f"sha256:{ROOTFS}", platform=""), "not linux/amd64"),
])
def test_anything_else_under_the_tag_is_refused_saying_why(info, said):
    why = base_mismatch(info, IDENTITY)
    assert why is not None and said in why


@given(st.lists(st.text(max_size=80), max_size=4), st.text(max_size=30))
def test_any_reply_from_an_engine_is_judged_without_a_traceback(layers, platform):
    why = base_mismatch(image(*layers, platform=platform), IDENTITY)
    assert why is None or isinstance(why, str)
    if why is None:
        assert layers == [f"sha256:{ROOTFS}"]


# ---------------------------------------------------------------- on the real engine

def small_rootfs(folder: Path) -> tuple[Path, str]:
    """A tar with one file that names this test run, so its sha256 (and the tag) is this test's own."""
    data = f"imagebuild test base {os.getpid()} {folder}\n".encode()
    member = tarfile.TarInfo("etc/imagebuild-test-base")
    member.size, member.mtime = len(data), 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(member, io.BytesIO(data))
    path = folder / "rootfs.tar"
    path.write_bytes(buffer.getvalue())
    return path, hashlib.sha256(buffer.getvalue()).hexdigest()


@pytest.fixture
def own_base(tmp_path, monkeypatch):
    """A locked base of this test's own: no .debs, its rootfs tar already where the bootstrap caches it."""
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    tar, sha = small_rootfs(tmp_path)
    identity = replace(IDENTITY, rootfs_sha256=sha, debs=())
    cached = rootfs_path(identity)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(tar.read_bytes())
    base = DebianBase("bookworm", mirror="http://mirror.invalid/debian", security_mirror="http://mirror.invalid/sec")
    return identity, base


@pytest.mark.engine
def test_the_real_base_s_layer_is_the_lock_s_rootfs(engine):
    """Real values: the flagship lock's rootfs sha256 is the diff_id of the base it imports."""
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    ensure_base_image(lock.base, load_recipe(REPO / "recipes" / "cuda-toolchain.toml").base, engine)
    info = engine.inspect(lock.base.image_ref)
    assert info.diff_ids == (f"sha256:{lock.base.rootfs_sha256}",), info.diff_ids
    assert base_mismatch(info, lock.base) is None


@pytest.mark.engine
def test_an_image_built_from_the_base_and_tagged_as_it_is_not_used(engine, own_base, tmp_path):
    identity, base = own_base
    ref = identity.image_ref
    said: list[str] = []
    made: list[str] = []
    try:
        ensure_base_image(identity, base, engine, said.append)
        genuine = engine.inspect(ref)
        made.append(genuine.id)
        assert genuine.diff_ids == (f"sha256:{identity.rootfs_sha256}",)
        assert said == [f"importing base {ref}"]

        said.clear()
        ensure_base_image(identity, base, engine, said.append)  # the genuine one: used as it is
        assert said == [] and engine.inspect(ref).id == genuine.id

        # The example: FROM the base plus one file, tagged with the base's tag.
        (tmp_path / "ctx").mkdir()
        (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {ref}\nCOPY extra /etc/extra\n")
        (tmp_path / "ctx" / "extra").write_text("not in the lock\n")
        built = subprocess.run(["/usr/bin/docker", "build", "-q", "-t", ref, str(tmp_path / "ctx")],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        impostor = engine.inspect(ref)
        made.append(impostor.id)
        assert impostor.id != genuine.id and impostor.diff_ids[0] == genuine.diff_ids[0]

        ensure_base_image(identity, base, engine, said.append)
        assert said[0].startswith(f"not using the engine's {ref} ({impostor.id}): its layers are ")
        assert "1 more on top of it" in said[0] and said[0].endswith("rebuilding it from the lock")
        assert said[1:] == [f"importing base {ref}"]
        now = engine.inspect(ref)
        made.append(now.id)
        assert now.id != impostor.id and now.diff_ids == (f"sha256:{identity.rootfs_sha256}",)
    finally:
        engine.remove(ref)
        for image_id in reversed(made):
            engine.remove(image_id)


@pytest.mark.needs_tool("buildah", package="buildah")
def test_buildah_imports_the_rootfs_as_the_one_layer_the_lock_names(own_base):
    """buildah's `add` writes a layer of its own (another diff_id); the base goes in as the tar itself."""
    from imagebuild.engine.buildah import BuildahEngine
    buildah = BuildahEngine()
    identity, base = own_base
    said: list[str] = []
    try:
        ensure_base_image(identity, base, buildah, said.append)
        info = buildah.inspect(identity.image_ref)
        assert info.diff_ids == (f"sha256:{identity.rootfs_sha256}",) and info.platform == "linux/amd64"
        assert said == [f"importing base {identity.image_ref}"]
        said.clear()
        ensure_base_image(identity, base, buildah, said.append)
        assert said == []
    finally:
        buildah.remove(identity.image_ref)
