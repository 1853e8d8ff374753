"""Layers shared between fresh runners through a real registry (docker-registry on loopback): one
runner builds with --cache-to, a second Docker engine with an empty store and builder cache (its own
dockerd) builds a recipe whose application layer changed with --cache-from, and takes every unchanged
layer from the registry instead of installing it again."""

from __future__ import annotations

import json
import re
import shutil

import requests

from imagebuild.cli.app import main as cli_main
from imagebuild.engine.buildah import cache_flags as buildah_flags
from imagebuild.engine.contract import BuildCache
from imagebuild.engine.docker import cache_flags as docker_flags
from imagebuild.image.export import BUILDKIT_CACHE_KEY, normalized_config
from tests.conftest import cannot_run

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def test_docker_reads_inline_caches_and_asks_for_one_only_with_a_target():
    assert docker_flags(None) == []
    assert docker_flags(BuildCache(sources=("r:5000/a:x", "r:5000/b:y"))) == [
        "--cache-from", "r:5000/a:x", "--cache-from", "r:5000/b:y"]
    assert docker_flags(BuildCache(target="r:5000/a:x")) == ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]


def test_buildah_is_given_repositories_and_plain_http_only_when_asked():
    assert buildah_flags(None) == []
    assert buildah_flags(BuildCache(sources=("r:5000/team/a:x",), target="r:5000/team/a:x")) == [
        "--cache-from", "r:5000/team/a", "--cache-to", "r:5000/team/a"]
    assert buildah_flags(BuildCache(target="r:5000/a", insecure_http=True)) == [
        "--cache-to", "r:5000/a", "--tls-verify=false"]


def test_the_cache_metadata_reaches_only_the_cache_image():
    engine_config = {"architecture": "amd64", "os": "linux", BUILDKIT_CACHE_KEY: "W3sibGF5ZXJzIjpbXX1d",
                     "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64]}}
    released = normalized_config(engine_config, ["sha256:" + "b" * 64], 0)
    cache = normalized_config(engine_config, ["sha256:" + "b" * 64], 0, build_cache=True)
    assert BUILDKIT_CACHE_KEY not in released
    assert cache == {**released, BUILDKIT_CACHE_KEY: engine_config[BUILDKIT_CACHE_KEY]}


def test_a_cache_reference_without_a_registry_host_is_refused_before_anything_runs(capsys):
    status = cli_main(["build", "recipes/cuda-toolchain.toml", "--cache-from", "team/cache:main", "--json"])
    error = json.loads(capsys.readouterr().out)
    assert status == 2 and "names no registry host" in error["message"] and "team/cache:main" in error["message"]


# ---------------------------------------------------------------- two runners, one registry

def cache_diff_ids(registry, reference: str) -> tuple[list[str], dict]:
    """The diff_ids and config of the image pushed as a build cache."""
    repository, tag = reference.split("/", 1)[1].rsplit(":", 1)
    manifest = requests.get(f"{registry.url}/v2/{repository}/manifests/{tag}",
                            headers={"Accept": OCI_MANIFEST}, timeout=30).json()
    config = requests.get(f"{registry.url}/v2/{repository}/blobs/{manifest['config']['digest']}", timeout=30).json()
    return config["rootfs"]["diff_ids"], config


def blob_gets(registry) -> list[str]:
    return re.findall(r'"GET /v2/[^"]*/blobs/(sha256:[0-9a-f]{64})', registry.log.read_text())


def buildah_storage(folder, monkeypatch) -> None:
    """An empty containers-storage of its own (vfs: no mounts left behind): a fresh buildah runner."""
    folder.mkdir(parents=True)
    conf = folder / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{folder}/graph"\nrunroot = "{folder}/run"\n')
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(conf))


def test_buildah_takes_unchanged_steps_from_the_registry_into_an_empty_storage(registry, tmp_path, monkeypatch):
    from imagebuild.engine.buildah import BuildahEngine
    if not shutil.which("buildah"):
        cannot_run("needs buildah", "apt-get install -y buildah")
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY a /a\nCOPY b /b\n")
    (context / "a").write_text("the unchanged step\n")
    (context / "b").write_text("one\n")
    cache = f"{registry.host}/imagebuild-test/buildah-cache"
    buildah = BuildahEngine()

    buildah_storage(tmp_path / "runner-a", monkeypatch)
    first = buildah.inspect(buildah.build(context, cache=BuildCache(target=cache, insecure_http=True)))

    def fresh_build(name: str, sources: tuple[str, ...]) -> tuple[list[str], list[str], int]:
        buildah_storage(tmp_path / name, monkeypatch)
        before = len(blob_gets(registry))
        lines: list[str] = []
        image = buildah.build(context, progress=lines.append, cache=BuildCache(sources=sources, insecure_http=True))
        return lines, list(buildah.inspect(image).diff_ids), len(blob_gets(registry)) - before

    (context / "b").write_text("two\n")
    lines, layers, pulled = fresh_build("runner-b", (cache,))
    assert any(line.startswith("--> Cache pulled from remote") for line in lines), lines
    assert layers[0] == first.diff_ids[0] and layers[1] != first.diff_ids[1] and pulled >= 1
    # Negative control: an empty storage with no cache source runs every step itself.
    lines, layers, pulled = fresh_build("runner-c", ())
    assert not any("Cache pulled" in line for line in lines) and pulled == 0
