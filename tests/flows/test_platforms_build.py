"""A platform of a multi-platform recipe built on its own engine (a second local dockerd on its own socket,
standing in for a native Grace builder) and copied back into the default engine. The two-platform build,
reproduced and pushed as one index, is tests/slow/test_platforms_index.py.

Images are tagged with this process's id and removed at the end; nothing of the session engine's builder
cache is pruned, and a fresh engine goes with everything in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.cli import app as cli
from imagebuild.errors import EngineUnavailable
from imagebuild.image import index
from tests.conftest import cannot_run

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "recipes" / "cuda-toolchain-multiarch.toml"
PID = os.getpid()
DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")




def emulation_problem() -> str | None:
    """Why arm64 binaries cannot run here, or None (scripts/host.sh registers qemu-user-static)."""
    handler = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not handler.is_file() or not handler.read_text().startswith("enabled"):
        return "no arm64 binfmt handler is registered: run scripts/host.sh (qemu-user-static, binfmt-support)"
    return None


def unavailable(why: str):
    cannot_run(why, "scripts/host.sh installs and registers them")


def built_tags(engine, ref: str) -> list[str]:
    return [r for r in (ref, flows.platform_ref(ref, "amd64"), flows.platform_ref(ref, "arm64"))
            if engine.inspect(r) is not None]


def export(ref: str, out: Path) -> str:
    """export-oci of both platforms' images into one layout: its index digest."""
    amd, arm = flows.platform_ref(ref, "amd64"), flows.platform_ref(ref, "arm64")
    assert cli.main(["export-oci", amd, arm, "-o", str(out), "--json"]) == 0
    return index.read_index_layout(out).index.digest


TINY = """\
[image]
name = "imagebuild-test/remote-builder"
tag = "{tag}"

[base]
debian = "bookworm"
packages = ["g++"]

[python]
requirements = ["six==1.16.0"]

[platforms.amd64]
engine = "{endpoint}"
"""


def test_a_platform_is_built_on_its_own_engine_and_copied_back(engine, fresh_runner, write_recipe):
    tag = f"remote-{PID}"
    ref = f"imagebuild-test/remote-builder:{tag}"
    try:
        recipe = write_recipe(TINY.format(tag=tag, endpoint=fresh_runner.host), name="remote-builder")
        # No smoke: the probe fails an image without a CUDA toolchain by design; the slow test smokes.
        report = flows.build(recipe, engine, flows.BuildOptions(run_smoke=False))
        one = report.platforms["amd64"]
        assert "copy" in one.seconds and one.smoke is None
        assert fresh_runner.docker("run", "--rm", "--network", "none", one.image, "python", "-c",
                                   "import six; print(six.__version__)").stdout.strip() == "1.16.0"
        # Built there (the builder holds it), and here under the same id for export-oci and push.
        there = json.loads(fresh_runner.docker("image", "inspect", one.image).stdout)[0]["Id"]
        assert there == one.image_id == engine.inspect(one.image).id == engine.inspect(ref).id
        # Negative control: an endpoint with no engine behind it stops the build and tags nothing.
        dead = write_recipe(TINY.format(tag=tag + "-dead", endpoint=f"unix://{fresh_runner.root}/nothing.sock"),
                            name="remote-dead")
        with pytest.raises(EngineUnavailable, match="nothing.sock"):
            flows.build(dead, engine, flows.BuildOptions(run_smoke=False))
        assert engine.inspect(f"imagebuild-test/remote-builder:{tag}-dead-amd64") is None
    finally:
        for name in built_tags(engine, ref):
            subprocess.run([DOCKER, "rmi", name], capture_output=True)
