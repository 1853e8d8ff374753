"""Layers shared between fresh runners: the built image, with BuildKit's inline cache metadata kept in
its config, is pushed to a cache reference; the next runner's build names that reference in
--cache-from, and its engine pulls the layers of unchanged steps instead of running them.

The cache image is the released image's twin: the same normalized layers (a registry holding both
stores them once), and a config that also says which build step made which layer. The released image
never carries that metadata, so its digest stays reproducible. Its layers are always gzip, whatever
--compression says: the engine's BuildKit pulls them, and Docker 20.10 reads no zstd.
"""

from __future__ import annotations

from imagebuild.common import Progress, quiet
from imagebuild.engine.contract import BuildCache
from imagebuild.registry import Connection, push_engine_image


def push_build_cache(engine, image: str, cache: BuildCache, connection: Connection = Connection(),
                     progress: Progress = quiet) -> str:
    """Push `image` with its build-cache metadata to cache.target; returns the pushed digest."""
    return push_engine_image(engine, image, cache.target, connection, build_cache=True, progress=progress).digest
