"""Stage: the container engine. The contract (contract.py: Engine, ImageInfo, ImageConfig, RunResult) and its
implementations: DockerEngine (docker.py, BuildKit through Debian's docker.io CLI) and BuildahEngine
(buildah.py, no daemon). streams.py runs build tools and export commands as streams.

Public surface: Engine, BuildCache, ImageInfo, ImageConfig, RunResult, Progress, ENGINES, DEFAULT_ENGINE,
engine_names(), default_engine(name).
May import: common, errors. A new engine: a module here implementing Engine, and one line in ENGINES;
the CLI's --engine choices and every caller read the names from here (tests/test_architecture.py holds
everything outside engine/ to that).
"""

from __future__ import annotations

import importlib

from imagebuild.engine.contract import BuildCache, Engine, ImageConfig, ImageInfo, Progress, RunResult

__all__ = ["BuildCache", "DEFAULT_ENGINE", "ENGINES", "Engine", "ImageConfig", "ImageInfo", "Progress", "RunResult",
           "default_engine", "engine_names"]

# Every engine: its name (the CLI's --engine) -> "module:class", imported on first use, so an engine
# whose client library is not installed costs nothing to the others.
ENGINES = {
    "docker": "imagebuild.engine.docker:DockerEngine",
    "buildah": "imagebuild.engine.buildah:BuildahEngine",
}
DEFAULT_ENGINE = "docker"


def engine_names() -> tuple[str, ...]:
    """The engines' names, the default first."""
    return (DEFAULT_ENGINE, *(name for name in ENGINES if name != DEFAULT_ENGINE))


def default_engine(name: str = DEFAULT_ENGINE) -> Engine:
    """A new engine of that name, reaching its default endpoint."""
    if name not in ENGINES:
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"unknown engine {name!r}: the engines are: {', '.join(engine_names())}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
