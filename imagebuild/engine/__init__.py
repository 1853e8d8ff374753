"""Stage: the container engine. The contract (contract.py: Engine, ImageInfo, RunResult) and its
implementations: DockerEngine (docker.py, BuildKit through Debian's docker.io CLI) and BuildahEngine
(buildah.py, no daemon). streams.py runs build tools and export commands as streams.

Public surface: Engine, BuildCache, ImageInfo, RunResult, Progress, default_engine(name).
May import: common, errors. A new engine: a module here implementing Engine, named in default_engine.
"""

from __future__ import annotations

from imagebuild.engine.contract import BuildCache, Engine, ImageInfo, Progress, RunResult

__all__ = ["BuildCache", "Engine", "ImageInfo", "Progress", "RunResult", "default_engine"]


def default_engine(name: str = "docker") -> Engine:
    if name == "docker":
        from imagebuild.engine.docker import DockerEngine
        return DockerEngine()
    if name == "buildah":
        from imagebuild.engine.buildah import BuildahEngine
        return BuildahEngine()
    from imagebuild.errors import ImagebuildError
    raise ImagebuildError(f"unknown engine {name!r}: the engines are: docker, buildah")
