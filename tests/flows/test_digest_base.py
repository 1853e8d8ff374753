"""A base named by digest (`repo@sha256:…`) is used as it is: here the digest comes from a real
registry on loopback that the test starts, since no outside registry is reachable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.bootstrap import ensure_base_image
from imagebuild.lock import read_lock
from imagebuild.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
DOCKER = "/usr/bin/docker"

pytestmark = pytest.mark.engine


def docker(*args: str) -> str:
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_digest_pinned_base_builds_and_smokes(engine, registry, write_recipe):
    small = REPO / "recipes" / "cuda-toolchain.toml"
    base = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock").base
    ensure_base_image(base, load_recipe(small).base, engine)  # the Debian base, in the engine
    pushed = f"{registry.host}/imagebuild-test/base:{os.getpid()}"
    docker("tag", base.image_ref, pushed)
    docker("push", pushed)
    digest_ref = docker("inspect", "--format", "{{index .RepoDigests 0}}", pushed)
    assert "@sha256:" in digest_ref

    text = small.read_text().replace('name = "imagebuild/cuda-toolchain"', 'name = "imagebuild-test/on-digest"')
    text = text.replace('debian = "bookworm"          # glibc 2.36: nvcc 13.0 breaks on glibc >= 2.41 (trixie)\n'
                        'packages = ["g++"]           # nvcc\'s host compiler\n',
                        f'image = "{digest_ref}"\npython = "3.11"\nglibc = "2.36"\n')
    assert digest_ref in text
    recipe = write_recipe(text, "on-digest")
    try:
        report = flows.build(recipe, engine)
        assert report.smoke.ok
        lock = read_lock(recipe.parent.parent / "lockfiles" / "on-digest.lock")
        assert lock.base.kind == "image" and lock.base.ref == digest_ref
        assert engine.inspect(report.image).labels["io.imagebuild.base"] == digest_ref
    finally:
        for ref in ("imagebuild-test/on-digest:13.0", pushed):
            engine.remove(ref)
