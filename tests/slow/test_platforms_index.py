"""Several platforms built for real (slow): recipes/cuda-toolchain-multiarch.toml for amd64 and arm64 (arm64
under qemu-user-static emulation), each smoke-tested in its own container, joined by export-oci into
one OCI image index that two builds reproduce (the second on a fresh engine of the test's own: a second
local dockerd, tests/engine_daemon.py, with an empty builder cache), pushed as one tag to a real
loopback registry and pulled back by platform with skopeo.

Images are tagged with this process's id and removed at the end (the lock-labelled images a build
reuses are the engine's cache, as for every build); nothing of the session engine's builder cache is
pruned, and a fresh engine goes with everything in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.cli import app as cli
from imagebuild.engine.docker import DockerEngine
from imagebuild.image import index
from imagebuild.lock import read_lock
from tests import registry_server

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "recipes" / "cuda-toolchain-multiarch.toml"
PID = os.getpid()
DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "/usr/bin/docker")



from tests.flows.test_platforms_build import built_tags, emulation_problem, export, unavailable


@pytest.mark.slow
def test_one_recipe_builds_amd64_and_arm64_into_one_reproducible_index_pushed_as_one_tag(
        engine, fresh_runner, tmp_path, monkeypatch):
    why = emulation_problem() or (", ".join(registry_server.missing_tools()) or None)
    if why:
        unavailable(why)
    ref = f"imagebuild-test/multiarch-{PID}:13.0"
    server = registry_server.start_registry(tmp_path / "registry")
    try:
        # Built (never reused by lock) and smoke-tested (never a pass on record replayed), each platform.
        report = flows.build(MULTI, engine, flows.BuildOptions(tag=ref, rebuild=True))
        assert set(report.platforms) == {"amd64", "arm64"} and report.native == "amd64"
        for arch, one in report.platforms.items():
            info = engine.inspect(one.image)
            assert info.platform.startswith(f"linux/{arch}"), info.platform
            assert info.labels["io.imagebuild.lock.sha256"] == read_lock(Path(report.lock_path), arch).sha256
            checks = {c["name"]: c for c in one.smoke.report["checks"]}
            assert one.smoke.ok and not one.smoke.cached and checks["cuda-toolchain"]["status"] == "pass"
        # The deep_gemm tier compiled on arm64 too, for the arm64 platform's own SM12x target (DGX Spark).
        arm_checks = {c["name"]: c for c in report.platforms["arm64"].smoke.report["checks"]}
        assert arm_checks["deep-gemm-sm120"]["status"] == "pass"
        assert "sm_121" in arm_checks["deep-gemm-sm120"]["detail"]
        assert engine.inspect(ref).id == engine.inspect(flows.platform_ref(ref, "amd64")).id
        machine = subprocess.run([DOCKER, "run", "--rm", "--network", "none", flows.platform_ref(ref, "arm64"),
                                  "python", "-c", "import platform; print(platform.machine())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        assert machine == "aarch64"

        first = export(ref, tmp_path / "first")
        # Two builds, one index: the second on a fresh engine, from an empty builder cache (nothing to reuse).
        # Its bytes are what is compared; the first build's smoke tests proved these very contents.
        again = flows.build(MULTI, DockerEngine(host=fresh_runner.host), flows.BuildOptions(tag=ref, run_smoke=False))
        assert not any(one.reused or one.smoke for one in again.platforms.values())
        with monkeypatch.context() as there:
            there.setenv("DOCKER_HOST", fresh_runner.host)  # export-oci's engine
            second = export(ref, tmp_path / "second")
        assert second == first

        target = f"{server.host}/team/cuda-toolchain:13.0"
        assert cli.main(["push", str(tmp_path / "first"), target, "--insecure-http"]) == 0
        raw = json.loads(registry_server.run("skopeo", "inspect", "--raw", "--tls-verify=false",
                                             f"docker://{target}").stdout)
        assert raw["mediaType"] == "application/vnd.oci.image.index.v1+json"
        assert sorted(m["platform"]["architecture"] for m in raw["manifests"]) == ["amd64", "arm64"]
        pulled = tmp_path / "pulled"
        registry_server.run("skopeo", "copy", "--insecure-policy", "--src-tls-verify=false", "--preserve-digests",
                            "--override-arch", "arm64", f"docker://{target}", f"oci:{pulled}:x")
        got = json.loads((pulled / "index.json").read_text())["manifests"][0]["digest"]
        assert got == index.read_index_layout(tmp_path / "first").manifest_for("linux/arm64").digest
    finally:
        server.stop()
        for tag in built_tags(engine, ref):
            subprocess.run([DOCKER, "rmi", tag], capture_output=True)
