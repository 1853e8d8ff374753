"""Proof, end to end: a venv made from real wheels (recipes/cuda-toolchain.toml's set and a small
pure-Python package), one installed file edited by hand, then `adopt`, `lock`, `build`, `smoke` and
`verify` on the real engine, all through the command line. The image holds the same versions and the
edited file byte for byte, and adopting the image back gives the same pins and no edit left over.

The image is named after this test's own recipe and removed at the end; the base it builds on is
imagebuild's cache (named by its content, shared by every bookworm recipe) and stays."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import missing_tool
from tests.venvs import SMALL, SYSTEM_PYTHON, TOOLCHAIN, make_venv, site_packages

pytestmark = [pytest.mark.slow, pytest.mark.engine]

REPO = Path(__file__).resolve().parents[2]
EDITED = "dateutil/__init__.py"
READ = ("import base64, json, re, sys, importlib.metadata as m; print(json.dumps({'versions': "
        "{re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in m.distributions()}, "
        "'file': base64.b64encode(open(sys.argv[1], 'rb').read()).decode()}))")


def imagebuild(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DOCKER_BUILDKIT": "1"}
    done = subprocess.run([sys.executable, "-m", "imagebuild", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=3600)
    assert done.returncode == 0, f"imagebuild {' '.join(args)}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def test_an_adopted_venv_builds_into_an_image_that_holds_it(engine, tmp_path):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    python = make_venv(tmp_path / "venv", *TOOLCHAIN, *SMALL)
    site = site_packages(python)
    source = site / EDITED
    text = source.read_text()
    assert "__all__" in text
    source.write_text(text.replace("__all__", "__all__  # kept as the box had it", 1) + "\nHAND_EDITED = True\n")
    edited = source.read_bytes()
    venv_versions = json.loads(subprocess.run([str(python), "-c", READ, str(source)], capture_output=True, text=True,
                                              check=True).stdout)["versions"]

    name = f"adopt-e2e-{uuid.uuid4().hex[:10]}"
    recipe = tmp_path / "recipes" / f"{name}.toml"
    image = f"{name}:latest"
    assert engine.inspect(image) is None
    try:
        adopted = imagebuild("adopt", "--python", str(python), "-o", str(recipe), "--without-torch",
                             "--arch", "sm_120a", "--arch", "12.0f")
        assert [p["files"] for p in adopted["patches"]] == [[EDITED]]
        locked = imagebuild("lock", str(recipe))
        assert locked["packages"] == len(adopted["requirements"]) + len(adopted["constraints"])
        built = imagebuild("build", str(recipe))
        assert built["image"] == image and built["smoke"]["ok"]
        assert imagebuild("smoke", image, "--no-gpus")["ok"]
        verified = imagebuild("verify", image, "--lock", str(tmp_path / "lockfiles" / f"{name}.lock"))
        assert verified["ok"], verified

        inside = engine.run(image, ["/opt/venv/bin/python", "-c", READ, f"/opt/venv/lib/python3.11/site-packages/{EDITED}"])
        assert inside.exit_code == 0, inside.stderr
        found = json.loads(inside.stdout)
        assert base64.b64decode(found["file"]) == edited
        pinned = {r.split("==")[0].split("[")[0]: r.split("==")[1] for r in adopted["requirements"] + adopted["constraints"]}
        assert {n: found["versions"].get(n) for n in pinned} == {n: venv_versions[n] for n in pinned} == pinned
        assert {"pip", "setuptools"} & set(found["versions"]) == set()  # left out, as the report said

        again = imagebuild("adopt", "--image", image, "-o", str(tmp_path / "again" / "recipes" / "again.toml"),
                           "--without-torch", "--arch", "sm_120a", "--arch", "12.0f")
        assert (again["requirements"], again["constraints"]) == (adopted["requirements"], adopted["constraints"])
        assert again["patches"] == [] and again["unpatched"] == [] and again["left_out"] == []
        assert again["read"]["executable"].startswith("/opt/venv/bin/python")
    finally:
        engine.remove(image)
