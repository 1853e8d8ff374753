"""The CI workflow users copy, run for real: its own step scripts, read out of
.github/workflows/build.yml, run in order in a GitHub-like environment against a docker-registry on
loopback with TLS from a private CA and a password, on the session's Docker engine. A first run builds,
smoke-tests and publishes; the gallery's other recipe (the same wheels, one file pruned from its first install
layer, as the Hopper recipe differs from the flagship) publishes beside it, its later layers rebuilt on another
parent yet byte-identical, so the registry is sent only its own; a fresh runner's run of the same lock reuses
it; a release tag's run gives the release tag the same digest."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from imagebuild.render.markers import parse_marker
from tests import registry_server
from tests.flows.test_build import _copy_recipe

from tests.flows.test_ci_workflow import OCI_MANIFEST, STEPS, USERS, workflow_steps  # noqa: F401
from tests.conftest import cannot_run

pytestmark = pytest.mark.engine


@pytest.fixture
def runner(tmp_path, engine, monkeypatch):
    """A GitHub-like step environment: RUNNER_TEMP, GITHUB_* files, the venv's imagebuild on PATH,
    a `sudo` that runs its command (we are root), and a docker config of its own."""
    if os.geteuid() != 0 or shutil.which("jq") is None:
        cannot_run("needs root and jq", "run as root; apt-get install -y jq")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sudo = bin_dir / "sudo"
    sudo.write_text('#!/bin/sh\nexec "$@"\n')
    sudo.chmod(sudo.stat().st_mode | stat.S_IEXEC)
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    return {"RUNNER_TEMP": str(temp), "GITHUB_OUTPUT": str(temp / "output"),
            "GITHUB_STEP_SUMMARY": str(temp / "summary.md"), "DOCKER_CONFIG": str(tmp_path / "docker-config"),
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "FORK": "false"}


@pytest.fixture
def private_registry(tmp_path):
    with registry_server.serving(tmp_path / "registry", users=USERS,
                                 tls=registry_server.make_tls(tmp_path / "tls")) as server:
        yield server
    shutil.rmtree(f"/etc/docker/certs.d/{server.host}", ignore_errors=True)  # what the workflow put there


def run_workflow(env: dict, workdir: Path) -> dict:
    """The workflow's steps, in order, each in its own `bash -e` as GitHub runs them; build.json back."""
    steps = workflow_steps()
    for name in STEPS:
        step = steps[name]
        if step.get("if") == "env.IMAGE_REPOSITORY != ''" and not env.get("IMAGE_REPOSITORY"):
            continue
        script = workdir / "step.sh"
        script.write_text(step["run"])
        done = subprocess.run(["bash", "-e", str(script)], cwd=workdir, capture_output=True, text=True,
                              env={**os.environ, **step.get("env", {}), **env})
        assert done.returncode == 0, f"step {name!r} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads((workdir / "build.json").read_text())


def manifest_digest(registry, repository: str, tag: str) -> str:
    response = requests.head(f"{registry.url}/v2/{repository}/manifests/{tag}", auth=("ci", USERS["ci"]),
                             headers={"Accept": OCI_MANIFEST}, verify=str(registry.ca), timeout=30)
    return response.headers.get("Docker-Content-Digest", f"HTTP {response.status_code}")


# The gallery's variant: one file fewer in the framework layer, so BuildKit builds every later step again on
# another parent (the Hopper recipe keeps a kernel file the flagship prunes, with the same effect).
VARIANT = """
[[prune]]
package = "nvidia-cuda-nvcc"
remove = ["nvidia/cu13/bin/bin2c"]
reason = "a gallery variant: nothing here embeds files with bin2c"
"""


def layer_steps(registry, repository: str, tag: str) -> list[tuple[str, str]]:
    """(step, digest) of each layer of the image under tag, oldest first: the config's history names the step
    (imagebuild's marker: `install framework`; else the instruction, `COPY imagebuild/probe.pyz ...`)."""
    def get(path: str, accept: str) -> dict:
        reply = requests.get(f"{registry.url}/v2/{repository}/{path}", auth=("ci", USERS["ci"]),
                             headers={"Accept": accept}, verify=str(registry.ca), timeout=30)
        reply.raise_for_status()
        return reply.json()
    manifest = get(f"manifests/{tag}", OCI_MANIFEST)
    config = get(f"blobs/{manifest['config']['digest']}", "application/vnd.oci.image.config.v1+json")
    made = [str(h.get("created_by", "")) for h in config["history"] if not h.get("empty_layer")]
    names = [f"{m.kind} {m.fields.get('layer', '')}".strip() if (m := parse_marker(c)) else c.split(" # ")[0]
             for c in made]
    assert len(names) == len(manifest["layers"]), (names, manifest["layers"])
    return list(zip(names, (layer["digest"] for layer in manifest["layers"])))


def uploaded(log_text: str) -> set[str]:
    """The blobs whose uploads the registry completed (the closing PUT names the digest), from its access log."""
    found = re.findall(r'"PUT /v2/\S+/blobs/uploads/\S+[?&]digest=sha256(?::|%3[Aa])([0-9a-f]{64})\S* HTTP/[0-9.]+" 201',
                       log_text)  # the digest as the client wrote it: imagebuild's requests quotes the colon
    return {f"sha256:{hex_digest}" for hex_digest in found}


@pytest.mark.slow
def test_the_workflow_publishes_then_a_fresh_runner_reuses_and_a_release_tag_gets_the_same_digest(
        engine, runner, private_registry, write_recipe, tmp_path):
    """A gallery of two recipes (two jobs of the matrix, in turn on this engine): each publishes under its own
    recipe's tag; the second reads the first one's cache of main besides its own."""
    pid = os.getpid()
    recipe = _copy_recipe(write_recipe, f"ci-{pid}")
    sibling = _copy_recipe(write_recipe, f"ci-{pid}-b")
    sibling.write_text(sibling.read_text() + VARIANT)
    repository = f"imagebuild-test/ci-{pid}"
    env = {**runner, "RECIPES": f"{recipe} {sibling}", "RECIPE": str(recipe),
           "IMAGE_REPOSITORY": f"{private_registry.host}/{repository}",
           "REGISTRY_CA_CERT": private_registry.ca.read_text(),
           "IMAGEBUILD_REGISTRY_USER": "ci", "IMAGEBUILD_REGISTRY_PASSWORD": USERS["ci"]}
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    built_refs = []
    try:
        main = dict(env, GITHUB_REF="refs/heads/main", GITHUB_REF_NAME="main")
        first = run_workflow(main, workdir)
        built_refs.append(first["image"])
        assert first["image"] == f"imagebuild-test/ci-{pid}:ci-{pid}-branch-main" and first["smoke"]["probe"]["ok"]
        assert first["registry"]["pushed"] is True
        assert first["cache"]["to"] == f"{env['IMAGE_REPOSITORY']}:buildcache-ci-{pid}-branch-main" and \
            first["cache"]["digest"]
        digest = first["registry"]["digest"]
        assert manifest_digest(private_registry, repository, f"ci-{pid}-branch-main") == digest
        summary = Path(runner["GITHUB_STEP_SUMMARY"]).read_text()
        assert f"{env['IMAGE_REPOSITORY']}:ci-{pid}-branch-main@{digest}" in summary

        before = private_registry.log.stat().st_size
        other = run_workflow(dict(main, RECIPE=str(sibling)), workdir)  # the matrix's other job
        built_refs.append(other["image"])
        assert other["image"] == f"imagebuild-test/ci-{pid}-b:ci-{pid}-b-branch-main" and other["registry"]["pushed"]
        assert f"{env['IMAGE_REPOSITORY']}:buildcache-ci-{pid}-branch-main" in other["cache"]["from"]
        assert manifest_digest(private_registry, repository, f"ci-{pid}-b-branch-main") == other["registry"]["digest"]
        assert other["registry"]["digest"] != digest and manifest_digest(
            private_registry, repository, f"ci-{pid}-branch-main") == digest  # the first job's tag stays its own
        # The variant shares every layer but its pruned framework install and its probe files, the kernel
        # layer included, though BuildKit built it again on another parent: the same bytes, the same digest.
        ours = layer_steps(private_registry, repository, f"ci-{pid}-branch-main")
        theirs = layer_steps(private_registry, repository, f"ci-{pid}-b-branch-main")
        assert [step for step, _ in ours] == [step for step, _ in theirs]
        differ = [step for (step, a), (_, b) in zip(ours, theirs) if a != b]
        assert len(differ) == 2 and differ[0] == "install framework" and \
            differ[1].startswith("COPY imagebuild/probe.pyz"), differ
        shared = {a for (_, a), (_, b) in zip(ours, theirs) if a == b}
        assert "install kernels" in [step for step, a in ours if a in shared], ours
        # The registry was sent the variant's own layers only: no upload of a layer it already held.
        with open(private_registry.log, "rb") as log:
            log.seek(before)
            sent = uploaded(log.read().decode(errors="replace"))
        own = {b for (_, a), (_, b) in zip(ours, theirs) if a != b}
        assert own <= sent and not (sent & shared), (sorted(own), sorted(sent & shared))

        engine.remove(first["image"])  # a fresh runner: nothing of this lock in the engine
        again = run_workflow(main, workdir)
        assert again["reused"] is True and again["registry"]["pushed"] is False and again["smoke"] is None
        assert again["registry"]["digest"] == digest and engine.inspect(first["image"]) is None

        release = run_workflow(dict(env, GITHUB_REF="refs/tags/v1.0.0", GITHUB_REF_NAME="v1.0.0"), workdir)
        assert release["reused"] is True and manifest_digest(private_registry, repository, f"ci-{pid}-v1.0.0") == digest
        assert (workdir / "digest.txt").read_text().strip() == digest
        # The daemon reached the registry with the workflow's CA and login: the CLI config holds the login.
        assert private_registry.host in json.loads((Path(runner["DOCKER_CONFIG"]) / "config.json").read_text())["auths"]
    finally:
        for ref in built_refs:
            engine.remove(ref)
