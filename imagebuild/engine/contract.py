"""The engine contract: what imagebuild needs from a container engine, and nothing more.

An engine builds a context into an image named only by a hold the caller owns (so a failed build or a
failed smoke test never leaves the recipe's tag, and nothing removes the image while the caller smokes it:
a build of the same lock elsewhere on the engine makes the same id), tags it, runs a command in a
throwaway container, inspects images (ImageInfo, and the config a container of one runs with:
ImageConfig) and removes them, and imports a rootfs tar as a base.
An image that is not there is errors.ImageNotFound (Engine.require, Engine.image_config).
DockerEngine (engine/docker.py) is the implementation in use; BuildahEngine (engine/buildah.py) builds
without a daemon. How a build tool's output is streamed lives in engine/streams.py. A new engine
implements Engine and joins ENGINES in engine/__init__.py.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence

from imagebuild.common import Progress, quiet, sha256_file
from imagebuild.errors import ImageNotFound


@dataclass(frozen=True)
class ImageInfo:
    id: str  # sha256:...
    size: int  # bytes, uncompressed
    labels: dict[str, str] = field(default_factory=dict)
    diff_ids: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    platform: str = ""  # "linux/arm64", from the image config's os, architecture (and variant)


@dataclass(frozen=True)
class ImageConfig:
    """What a container of the image runs, as its config says: export-lxc's init and environment, the
    GPU commands' driver-library check."""
    id: str  # sha256:...
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""
    created: int = 0  # seconds since the epoch; 0 when unsaid
    platform: str = ""  # "linux/arm64", as ImageInfo.platform

    @property
    def command(self) -> tuple[str, ...]:
        """ENTRYPOINT + CMD: what the container runs."""
        return self.entrypoint + self.cmd


@dataclass(frozen=True)
class BuildCache:
    """Layers shared between runners through a registry: a build may take unchanged layers from the
    `sources` (HOST/REPO:TAG references) and leaves its own for the next runner at `target`.

    Docker 20.10 has no `--cache-to`: it reads BuildKit's inline cache, whose metadata rides in the
    image config, so the pipeline pushes the built image to `target` itself (flows/build_cache.py).
    An engine that writes its cache during the build says so with `Engine.writes_cache`."""
    sources: tuple[str, ...] = ()
    target: str | None = None
    insecure_http: bool = False  # an engine that reaches the cache registry itself (buildah) speaks plain HTTP


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


def config_platform(os_name: str | None, architecture: str | None, variant: str | None = None) -> str:
    """An image config's os/architecture[/variant] as one platform string; amd64 when unsaid."""
    text = f"{os_name or 'linux'}/{architecture or 'amd64'}"
    return f"{text}/{variant}" if variant else text


def config_created(text: str | None) -> int:
    """An image config's `created` (RFC 3339, `2026-12-04T20:26:14.0496Z`) as seconds since the epoch, to
    the second; 0 when unsaid or unreadable."""
    found = re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", text or "")
    return int(datetime.fromisoformat(found.group(0)).replace(tzinfo=timezone.utc).timestamp()) if found else 0


def write_rootfs_archive(sink: BinaryIO, tar: Path, arch: str, tags: Sequence[str] = ()) -> None:
    """A rootfs tar as a one-layer image of `arch`, in `docker save`'s archive format, written to sink: its
    config names the arch, its one layer is the tar as is, so the layer's diff_id is the tar's sha256 (the
    lock's rootfs sha256), whichever engine loads it."""
    diff_id = "sha256:" + sha256_file(tar)
    config = {"architecture": arch, "os": "linux", **({"variant": "v8"} if arch == "arm64" else {}),
              "config": {}, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
              "history": [{"created_by": f"imagebuild: Debian rootfs {tar.name}"}]}
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": list(tags), "Layers": ["rootfs/layer.tar"]}]).encode()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for name, data in ((config_name, config_bytes), ("manifest.json", manifest)):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
        archive.add(str(tar), arcname="rootfs/layer.tar", recursive=False)


def split_ref(ref: str) -> tuple[str, str]:
    """`host:5000/name:tag` -> (`host:5000/name`, `tag`); no tag -> `latest`."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


class Engine(abc.ABC):
    name: str = "engine"
    writes_cache: bool = False  # True: build() itself writes BuildCache.target
    reads_files: bool = False  # True: read_file() reads one file without streaming the whole image out

    @property
    def local(self) -> bool:
        """Whether its containers run on this host, so that this host's devices and nvidia-smi are theirs."""
        return True

    @abc.abstractmethod
    def check(self) -> None:
        """Raise EngineUnavailable, saying how to start the engine, when it does not answer."""

    @abc.abstractmethod
    def build(self, context: Path, *, secrets: Mapping[str, Path] = {},
              progress: Progress = quiet, cache: BuildCache | None = None,
              platform: str | None = None, hold: str | None = None) -> str:
        """Build the context's Dockerfile; return the image id. Raises BuildFailed. Tags nothing but `hold`,
        a name the caller owns and drops with remove(hold), given as the image is made: an image no name
        holds goes when another holder of the same id removes its last name, or with `image prune`.
        With `cache`, unchanged layers may come from its sources (a source that does not exist yet
        is not an error: the first run has none). `platform` ("linux/arm64") builds for that
        platform: its RUN steps run under emulation where it is not the engine's own."""

    @abc.abstractmethod
    def tag(self, image_id: str, ref: str) -> None:
        """Give the image one more name; raises ImageNotFound when it is not there."""

    @abc.abstractmethod
    def run(self, image: str, command: Sequence[str], *, network: bool = False,
            gpus: bool | tuple = False, timeout: float = 600) -> RunResult:
        """Run command in a fresh container that is removed afterwards; gpus: True for every GPU of the
        engine's host, or a tuple of GPU numbers ("0", "1")."""

    @abc.abstractmethod
    def inspect(self, ref: str) -> ImageInfo | None:
        """None when no such image exists."""

    @abc.abstractmethod
    def image_config(self, ref: str) -> ImageConfig:
        """The image's config (entrypoint, cmd, env, workdir, user); raises ImageNotFound."""

    def require(self, ref: str) -> ImageInfo:
        """inspect(ref), for an image that must be there: raises ImageNotFound when it is not."""
        info = self.inspect(ref)
        if info is None:
            raise ImageNotFound(ref, self.name)
        return info

    @abc.abstractmethod
    def remove(self, ref: str) -> None:
        """Remove an image (by id or reference); a missing image is not an error. A reference of an image that
        has other names only drops that name."""

    @abc.abstractmethod
    def import_rootfs(self, tar: Path, ref: str, *, arch: str = "amd64") -> str:
        """Import a rootfs tar as a single-layer image tagged ref; return its id."""

    @contextlib.contextmanager
    def export_rootfs(self, ref: str) -> Iterator[BinaryIO]:
        """The image's merged filesystem as one tar stream (never whole in memory)."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot export an image's filesystem")
        yield  # pragma: no cover

    def read_file(self, image: str, path: str) -> bytes | None:
        """One regular file of the image's filesystem (`path` absolute), read without running anything of the
        image and without streaming the rest of it out; None when the image holds no regular file there (a
        directory, a link, nothing). Only where `reads_files`; verify.image_file reads the others' images
        whole."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot read one file of an image")

    def save(self, image: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """The image as a `docker save` archive stream (manifest.json, config, one tar per layer),
        read once and never held whole: oci, verify and lxc read it."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot stream an image out")

    def transport(self, ref: str) -> str:
        """The image as containers/image (skopeo) names it, with the transport that reads this engine's
        store: `docker-daemon:REF`, `containers-storage:REF`."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine names no skopeo transport for {ref!r}")

    def at(self, endpoint: str) -> "Engine":
        """The same kind of engine reaching another endpoint (a platform's own builder: a recipe's
        [platforms.ARCH].engine). An engine that builds only on this machine refuses."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine builds only on this machine: it cannot reach {endpoint!r}")

    def reaches_endpoints(self) -> bool:
        """Whether at() can reach another endpoint."""
        return type(self).at is not Engine.at

    def load(self, write: Callable[[BinaryIO], None], what: str) -> str:
        """Load the image archive (a `docker save` stream) that `write` writes into this engine; what the
        engine said. Raises BuildFailed when it fails."""
        from imagebuild.errors import ImagebuildError
        raise ImagebuildError(f"the {self.name} engine cannot load an image archive ({what})")

    def image_exists(self, ref: str) -> bool:
        return self.inspect(ref) is not None

    def cache_mounts(self, own_step: str) -> list[dict]:
        """The engine's build cache mounts that imagebuild's builds fill, told apart by own_step, a text
        the command of each step using one contains (the caller's: render.paths.OWN_STEP): id, bytes,
        description, last_used. An engine whose builds keep no such mounts answers []."""
        return []

    def remove_cache_mount(self, mount_id: str) -> None:
        """Remove one build cache record cache_mounts() named, and nothing else."""

    def find_labelled(self, key: str, value: str, only: set[str] | None = None) -> str | None:
        """The id of an image whose label key is value (the newest when several are; with `only`, the
        newest of those ids), else None. An engine that cannot search by label answers None, and the
        caller builds."""
        return None
