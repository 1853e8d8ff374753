"""A fresh runner takes unchanged layers from a registry build cache (slow): one runner builds with
--cache-to against a real docker-registry on loopback, a second, empty engine builds the next lock with
--cache-from and installs only the changed layers (the cache's other cases: tests/flows/test_build_cache.py)."""

from __future__ import annotations

import os
import time

import pytest

from imagebuild import flows
from imagebuild.engine.contract import BuildCache
from imagebuild.registry import Connection
from imagebuild.engine.docker import DockerEngine
from imagebuild.image.export import BUILDKIT_CACHE_KEY
from tests.flows.test_build import _copy_recipe
from tests.flows.test_build_cache import blob_gets, cache_diff_ids

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.mark.slow
def test_a_fresh_runner_takes_unchanged_layers_from_the_cache_and_installs_only_the_changed_ones(
        engine, registry, fresh_runner, write_recipe, monkeypatch):
    pid = os.getpid()
    cache_ref = f"{registry.host}/imagebuild-test/build-cache:{pid}"
    recipe = _copy_recipe(write_recipe, "cache-first")
    bumped = _copy_recipe(write_recipe, "cache-bumped", requirements_extra='  "six==1.16.0",\n')
    first_ref = f"imagebuild-test/cache-first:{pid}"
    try:
        first = flows.build(recipe, engine, flows.BuildOptions(tag=first_ref, rebuild=True,
                               cache=BuildCache(target=cache_ref, insecure_http=True),
                               connection=Connection(insecure_http=True)))
    finally:
        engine.remove(first_ref)
    assert first.cache == {"from": [], "to": cache_ref, "digest": first.cache["digest"], "written_by": "imagebuild"}
    cached, config = cache_diff_ids(registry, cache_ref)
    assert config.get(BUILDKIT_CACHE_KEY), "the cache image must carry BuildKit's cache metadata"

    # The second runner: its own dockerd, nothing in its store or builder cache but the base.
    # A cache that does not exist yet (a new branch's) is skipped, not an error.
    absent = f"{registry.host}/imagebuild-test/build-cache:absent-{pid}"
    monkeypatch.setenv("DOCKER_HOST", fresh_runner.host)
    runner = DockerEngine()
    downloads = len(blob_gets(registry))
    started = time.monotonic()
    second = flows.build(bumped, runner, flows.BuildOptions(tag=f"imagebuild-test/cache-bumped:{pid}",
                            cache=BuildCache(sources=(absent, cache_ref), insecure_http=True),
                            connection=Connection(insecure_http=True)))
    with_cache = time.monotonic() - started
    layers = runner.inspect(second.image_id).diff_ids
    # Every layer below the probe's files (which carry the lock) is the cache's own, pulled, not rebuilt:
    # a layer this engine had built would not be the normalized blob the registry holds.
    shared = len(cached) - 1
    assert list(layers[:shared]) == cached[:shared]
    assert len(layers) == len(cached) + 2  # the application layer's requirements and its install
    assert not set(layers[shared:]) & set(cached)
    assert second.smoke.ok and second.cache == {"from": [absent, cache_ref], "to": None, "digest": None,
                                                 "written_by": None}
    pulled = set(blob_gets(registry)[downloads:])
    assert len(pulled) >= shared  # each cached layer's blob (and the manifest's config) came from the registry

    # Negative control: the same fresh runner with its builder cache emptied and no --cache-from
    # builds every layer itself, so none of them is the registry's.
    runner.remove(second.image_id)
    fresh_runner.docker("builder", "prune", "-af")
    started = time.monotonic()
    third = flows.build(bumped, runner, flows.BuildOptions(tag=f"imagebuild-test/cache-bumped:{pid}", rebuild=True))
    without_cache = time.monotonic() - started
    control = runner.inspect(third.image_id).diff_ids
    assert not set(control[1:]) & set(cached) and len(control) == len(layers)
    print(f"fresh runner, application pin bump: {with_cache:.1f} s with --cache-from, "
          f"{without_cache:.1f} s without")  # measured, not asserted (docs/benchmarks.md)


# ---------------------------------------------------------------- buildah keeps its cache itself
