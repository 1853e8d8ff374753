"""Build by lock against a real registry (docker-registry on loopback): the first run builds, smoke-tests
and pushes under the recipe's tag and lock-<sha256>, with its smoke report attached; a second run, with the
image gone from the engine as on a fresh CI runner, finds it with a manifest HEAD, reads its config's lock
label and the attached report, and tags it: no build, no layer downloaded. (tests/registry/test_referrers.py
has the lock tags that are not taken.)"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.cli.app import main as cli_main
from imagebuild.errors import ImagebuildError
from imagebuild.lock import read_lock
from imagebuild.flows.by_lock import RegistryTarget, find_by_lock, lock_tag
from imagebuild.image.oci import parse_manifest
from imagebuild.registry import Connection, get_blob, get_manifest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cuda-toolchain.toml"

pytestmark = pytest.mark.engine


@pytest.fixture
def registry(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))  # no blob-mount memory from other runs
    return registry


def blob_downloads(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if re.search(r'"GET /v2/[^"]*/blobs/', line)]


def test_an_unknown_lock_is_not_found_by_a_head(registry):
    target = RegistryTarget(f"{registry.host}/imagebuild-test/by-lock", Connection(insecure_http=True))
    assert find_by_lock(target, "0" * 64) is None
    assert lock_tag("ab" * 32) == "lock-" + "ab" * 32


def test_a_registry_build_without_smoke_is_refused(registry):
    target = RegistryTarget(f"{registry.host}/imagebuild-test/by-lock", Connection(insecure_http=True))
    with pytest.raises(ImagebuildError, match="only smoke-tested images"):
        flows.build(RECIPE, None, flows.BuildOptions(registry=target, run_smoke=False))


def test_second_run_of_an_unchanged_lock_reuses_the_pushed_image_without_downloading(engine, registry, capsys):
    repository = f"{registry.host}/imagebuild-test/by-lock"
    target = RegistryTarget(repository, Connection(insecure_http=True))
    ref = f"imagebuild-test/by-lock:{os.getpid()}"
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    first = flows.build(RECIPE, engine, flows.BuildOptions(tag=ref, registry=target))
    try:
        assert first.smoke.ok and first.registry["pushed"] is True
        assert first.registry["reference"] == f"{repository}:{os.getpid()}"
        assert first.registry["lock_reference"] == f"{repository}:lock-{lock.sha256}"
        assert find_by_lock(target, lock.sha256) == first.registry["digest"]
    finally:
        engine.remove(ref)  # a fresh runner: the engine no longer holds the image

    downloads_before = len(blob_downloads(registry.log))
    started = time.monotonic()
    status = cli_main(["build", str(RECIPE), "--tag", ref, "--registry", repository, "--insecure-http", "--json"])
    seconds = time.monotonic() - started
    report = json.loads(capsys.readouterr().out)
    print(f"second run of an unchanged lock: {seconds:.2f} s")  # measured, not asserted (docs/benchmarks.md)
    assert status == 0 and report["reused"] is True
    assert report["registry"] == {**first.registry, "pushed": False}
    assert report["registry"]["smoke"]["checks"] == [{"name": c["name"], "status": c["status"]}
                                                     for c in first.smoke.report["checks"]]  # the checks stated
    assert report["smoke"] is None and "build" not in report["seconds"]
    assert engine.inspect(ref) is None  # nothing was pulled into the engine or built
    # Read to prove it: the config (its lock label) and the attached smoke report; no layer.
    read = {re.search(r"/blobs/(sha256:[0-9a-f]{64})", line).group(1)
            for line in blob_downloads(registry.log)[downloads_before:]}
    session = Connection(insecure_http=True).open(registry.host)
    data, media_type, _ = get_manifest(session, "imagebuild-test/by-lock", first.registry["digest"])
    config, layers, _ = parse_manifest(data, "the pushed manifest", media_type)
    artifact = get_manifest(session, "imagebuild-test/by-lock", report["registry"]["smoke"]["artifact"])
    _, payloads, subject = parse_manifest(artifact[0], "the smoke report's manifest")
    assert subject.digest == first.registry["digest"]
    assert read == {config.digest, payloads[0].digest} and not read & {layer.digest for layer in layers}
    payload = json.loads(get_blob(session, "imagebuild-test/by-lock", payloads[0]))
    assert (payload["manifest"], payload["config"], payload["image_id"]) == (
        first.registry["digest"], config.digest, first.image_id)  # the pushed config is normalized: its own digest

    # --rebuild goes past the registry: the engine builds (or reuses its own image) and pushes again.
    again = flows.build(RECIPE, engine, flows.BuildOptions(tag=ref, registry=target, rebuild=True))
    try:
        assert again.registry["pushed"] is True and again.registry["digest"] == first.registry["digest"]
    finally:
        engine.remove(ref)


def test_push_of_an_image_built_from_a_lock_also_pushes_its_lock_tag_and_a_derived_image_does_not(
        engine, registry, capsys, tmp_path):
    """`imagebuild push` is the other way CI publishes: the image this machine built from the lock (and
    smoke-tested) goes up under lock-<sha256> too, so the next runner's build --registry finds it; an
    image made FROM it carries the same label but is not the lock's image, and gets no lock tag."""
    repository = f"{registry.host}/imagebuild-test/push-lock"
    target = RegistryTarget(repository, Connection(insecure_http=True))
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    ref = f"imagebuild-test/push-lock:{os.getpid()}"
    built = flows.build(RECIPE, engine, flows.BuildOptions(tag=ref))
    derived = f"imagebuild-test/push-lock-derived:{os.getpid()}"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {ref}\nRUN echo app > /opt/app.txt\n")
    import subprocess
    made = subprocess.run(["/usr/bin/docker", "build", "-q", "-t", derived, str(tmp_path / "ctx")],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        capsys.readouterr()
        assert cli_main(["push", derived, f"{repository}:derived", "--insecure-http", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["lock_tag"] is None
        assert find_by_lock(target, lock.sha256) is None  # the negative control: a label is no proof
        assert cli_main(["push", ref, f"{repository}:{os.getpid()}", "--insecure-http", "--json"]) == 0
        pushed = json.loads(capsys.readouterr().out)
        assert pushed["lock_tag"] == lock_tag(lock.sha256)
        assert find_by_lock(target, lock.sha256) == pushed["digest"]
        # zstd layers: another manifest for the same lock, under its own lock tag; the gzip one stays put.
        assert cli_main(["push", ref, f"{repository}:{os.getpid()}-zstd", "--insecure-http", "--compression", "zstd",
                         "--json"]) == 0
        zstd = json.loads(capsys.readouterr().out)
        assert zstd["lock_tag"] == lock_tag(lock.sha256, "zstd") and zstd["digest"] != pushed["digest"]
        assert find_by_lock(RegistryTarget(repository, Connection(insecure_http=True), compression="zstd"), lock.sha256) == \
            zstd["digest"]
        assert find_by_lock(target, lock.sha256) == pushed["digest"]
    finally:
        engine.remove(derived)
        engine.remove(built.image)
    # The next runner, its engine without the image, finds it by the lock tag push wrote.
    status = cli_main(["build", str(RECIPE), "--tag", ref, "--registry", repository, "--insecure-http", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["reused"] is True and report["registry"]["digest"] == pushed["digest"]
    status = cli_main(["build", str(RECIPE), "--tag", ref, "--registry", repository, "--insecure-http",
                       "--compression", "zstd", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["reused"] is True and report["registry"]["digest"] == zstd["digest"]
    assert report["registry"]["lock_reference"] == f"{repository}:{lock_tag(lock.sha256, 'zstd')}"
