"""The engine contract: what imagebuild needs from a container engine, and nothing more.

An engine builds a context into an untagged image (so a failed build or a failed smoke test never
leaves a tag), tags it, runs a command in a throwaway container, inspects and removes images, and
imports a rootfs tar as a base. DockerEngine (engine/docker.py) is the implementation in use.
"""

from __future__ import annotations

import abc
import contextlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageInfo:
    id: str  # sha256:...
    size: int  # bytes, uncompressed
    labels: dict[str, str] = field(default_factory=dict)
    diff_ids: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


class Engine(abc.ABC):
    name: str = "engine"

    @abc.abstractmethod
    def check(self) -> None:
        """Raise EngineUnavailable, saying how to start the engine, when it does not answer."""

    @abc.abstractmethod
    def build(self, context: Path, *, secrets: Mapping[str, Path] = {},
              progress: Progress = lambda _: None) -> str:
        """Build the context's Dockerfile; return the image id. Never tags. Raises BuildFailed."""

    @abc.abstractmethod
    def tag(self, image_id: str, ref: str) -> None: ...

    @abc.abstractmethod
    def run(self, image: str, command: Sequence[str], *, network: bool = False,
            gpus: bool = False, timeout: float = 600) -> RunResult:
        """Run command in a fresh container that is removed afterwards."""

    @abc.abstractmethod
    def inspect(self, ref: str) -> ImageInfo | None:
        """None when no such image exists."""

    @abc.abstractmethod
    def remove(self, ref: str) -> None:
        """Remove an image (by id or reference); a missing image is not an error."""

    @abc.abstractmethod
    def import_rootfs(self, tar: Path, ref: str, *, arch: str = "amd64") -> str:
        """Import a rootfs tar as a single-layer image tagged ref; return its id."""

    @contextlib.contextmanager
    def export_rootfs(self, ref: str) -> Iterator[BinaryIO]:
        """The image's merged filesystem as one tar stream (never whole in memory)."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot export an image's filesystem")
        yield  # pragma: no cover

    def save(self, image: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """The image as a `docker save` archive stream (manifest.json, config, one tar per layer),
        read once and never held whole: oci, verify and lxc read it."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot stream an image out")

    def image_exists(self, ref: str) -> bool:
        return self.inspect(ref) is not None


def widen_pipe(stream, size: int = 1 << 20) -> None:
    """Let a pipe hold up to size bytes (Linux's default is 64 KiB), so a producer and a consumer
    on either side of imagebuild keep working while it handles the previous chunk. Best effort:
    the kernel's pipe-max-size, or a stream that is not a pipe, leaves it as it was."""
    import fcntl
    try:
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, size)
    except (OSError, AttributeError, ValueError):
        pass


def run_streaming(command: Sequence[str], progress: Progress, *, env: Mapping[str, str] | None = None,
                  keep: int = 60) -> tuple[int, list[str]]:
    """Run a build tool, handing each output line to progress; (exit code, its last `keep` lines)."""
    proc = subprocess.Popen(list(command), env=dict(env) if env is not None else None, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-keep:]
        progress(line)
    return proc.wait(), tail


def default_engine(name: str = "docker") -> Engine:
    if name == "docker":
        from imagebuild.engine.docker import DockerEngine
        return DockerEngine()
    if name == "buildah":
        from imagebuild.engine.buildah import BuildahEngine
        return BuildahEngine()
    from imagebuild.errors import ImagebuildError
    raise ImagebuildError(f"unknown engine {name!r}: the engines are: docker, buildah")
