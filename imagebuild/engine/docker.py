"""DockerEngine: BuildKit builds through Debian's docker CLI, everything else through the engine API."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence

import docker
import docker.errors
import requests.exceptions

from imagebuild.common import Progress, quiet
from imagebuild.engine.contract import (BuildCache, Engine, ImageConfig, ImageInfo, RunResult, config_created,
                                        config_platform, split_ref, write_rootfs_archive)
from imagebuild.engine.build_log import BUILD_LOG_LINES, TAIL_SHOWN, build_failure
from imagebuild.engine.streams import command_stream, run_streaming, widen_pipe
from imagebuild.errors import BuildFailed, EngineUnavailable, ImageNotFound, ToolMissing

# read_file keeps a copied file's tar in memory up to this size, then spills it to a temp file.
_READ_IN_MEMORY = 8 << 20
# Debian's docker.io CLI (20.10) runs BuildKit builds itself; newer CLIs need the buildx plugin.
_CLI_CANDIDATES = ("/usr/bin/docker", "docker")
_START_HINT = ("start one: as root, `dockerd >/var/log/dockerd.log 2>&1 &` (Debian package docker.io) "
               "or `systemctl start docker`; or point DOCKER_HOST at a running engine")


def find_cli() -> str:
    chosen = os.environ.get("IMAGEBUILD_DOCKER_CLI")
    for candidate in ((chosen,) if chosen else _CLI_CANDIDATES):
        found = shutil.which(candidate)
        if found:
            return found
    raise ToolMissing("no docker CLI found: `apt-get install -y docker.io` installs Debian's, which "
                      "runs BuildKit builds (or set IMAGEBUILD_DOCKER_CLI)")


_EXPORT_CHUNK = 1 << 20


def cache_flags(cache: BuildCache | None) -> list[str]:
    """BuildKit's inline cache, what Docker 20.10 supports without buildx: sources are images whose
    config carries the cache metadata; a target asks for that metadata in the image built here
    (the engine daemon pulls from the sources itself, so it must trust their registries)."""
    if cache is None:
        return []
    flags = [flag for source in cache.sources for flag in ("--cache-from", source)]
    if cache.target:
        flags += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    return flags


_DOCKER_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def docker_size(text: str) -> int:
    """`310MB`, `3.33kB`, `0B` as Docker prints sizes (decimal units) -> bytes; 0 for anything else."""
    import re
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGT]?B)\s*", text or "")
    return int(float(match.group(1)) * _DOCKER_UNITS[match.group(2)]) if match else 0


class DockerEngine(Engine):
    name = "docker"
    reads_files = True

    def __init__(self, cli: str | None = None, host: str | None = None):
        self._cli = cli
        self._client = None
        self.host = host  # a DOCKER_HOST-style endpoint; None: the environment's (DOCKER_HOST or the local socket)

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self.check()
        return self._client

    @property
    def local(self) -> bool:
        """A unix socket is this host's daemon; tcp:// or ssh:// (DOCKER_HOST, --engine-host) is another's."""
        return (self.host or os.environ.get("DOCKER_HOST") or "unix://").startswith("unix://")

    @property
    def cli(self) -> str:
        if self._cli is None:
            self._cli = find_cli()
        return self._cli

    def command(self, *args: str) -> list[str]:
        """A docker CLI command line aimed at this engine's endpoint."""
        return [self.cli, *(("-H", self.host) if self.host else ()), *args]

    def check(self) -> None:
        if self._client is not None:
            return
        where = self.host or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            client = docker.DockerClient(base_url=self.host, timeout=600) if self.host else docker.from_env(timeout=600)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as err:
            raise EngineUnavailable(f"no Docker engine answers at {where} ({type(err).__name__}): "
                                    f"{_START_HINT}") from None
        self._client = client

    def build(self, context: Path, *, secrets: Mapping[str, Path] = {},
              progress: Progress = quiet, cache: BuildCache | None = None,
              platform: str | None = None, hold: str | None = None) -> str:
        self.check()
        with tempfile.TemporaryDirectory(prefix="imagebuild-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            # The host's network, as buildah's builds have: a daemon with no bridge builds too, and
            # a cache written by one runner matches another's (the network mode is in the step's key).
            command = self.command("build", "--progress=plain", "--network", "host", "--iidfile", str(iidfile))
            if platform:
                command += ["--platform", platform]
            for name, path in sorted(secrets.items()):
                command += ["--secret", f"id={name},src={path}"]
            command += cache_flags(cache)
            command += ["--tag", hold] if hold else []
            command.append(str(context))
            code, tail = run_streaming(command, progress, env={**os.environ, "DOCKER_BUILDKIT": "1"},
                                       keep=BUILD_LOG_LINES)
            if code != 0:
                text = "\n".join(tail[-TAIL_SHOWN:])
                if "buildx" in text and "missing" in text:
                    raise ToolMissing(f"{self.cli} cannot run BuildKit builds without buildx: use "
                                      "Debian's /usr/bin/docker (package docker.io) or set "
                                      "IMAGEBUILD_DOCKER_CLI")
                raise build_failure("docker build", code, tail)
            return iidfile.read_text().strip()

    def tag(self, image_id: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        try:
            self.client.api.tag(image_id, repository, tag)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(image_id, self.name) from None

    def run(self, image: str, command: Sequence[str], *, network: bool = False,
            gpus: bool | tuple = False, timeout: float = 600) -> RunResult:
        """A foreign platform's image runs under the host's registered binfmt emulator."""
        requests_ = None
        if gpus:  # what `docker run --gpus all` or `--gpus '"device=0,1"'` asks the daemon for
            chosen = {"count": -1} if gpus is True else {"device_ids": list(gpus)}
            requests_ = [docker.types.DeviceRequest(capabilities=[["gpu"]], **chosen)]
        container = self.client.containers.create(
            image, list(command), network_mode=None if network else "none",
            device_requests=requests_, detach=True)
        try:
            container.start()
        except docker.errors.APIError as err:
            container.remove(force=True)
            if gpus and "device driver" in str(err):
                raise EngineUnavailable("GPUs are visible but the engine has no NVIDIA runtime: install "
                                        "nvidia-container-toolkit, or run with --no-gpus") from None
            raise
        try:
            timed_out = False
            try:
                status = container.wait(timeout=timeout)
                code = int(status.get("StatusCode", 1))
            except requests.exceptions.RequestException:
                container.kill()
                code, timed_out = 124, True
            out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            return RunResult(code, out, err, timed_out)
        finally:
            container.remove(force=True)

    def cache_mounts(self, own_step: str) -> list[dict]:
        """BuildKit's cache mounts of imagebuild's own build steps: those whose step's command names
        own_step (uv's wheel cache, the kernel cache), read from `docker system df -v`."""
        proc = subprocess.run(self.command("system", "df", "-v", "--format", "{{json .BuildCache}}"),
                              capture_output=True, text=True)
        try:
            records = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
        except json.JSONDecodeError:
            return []
        return [{"id": str(r.get("ID")), "bytes": docker_size(str(r.get("Size", "0B"))),
                 "description": str(r.get("Description", "")), "last_used": str(r.get("LastUsedAt", ""))}
                for r in records if isinstance(r, dict) and r.get("CacheType") == "exec.cachemount"
                and own_step in str(r.get("Description", ""))]

    def remove_cache_mount(self, mount_id: str) -> None:
        subprocess.run(self.command("builder", "prune", "--force", "--filter", f"id={mount_id}"),
                       capture_output=True, text=True, check=False)

    def find_labelled(self, key: str, value: str, only: set[str] | None = None) -> str | None:
        self.check()
        images = [image for image in self.client.api.images(filters={"label": f"{key}={value}"})
                  if only is None or image.get("Id") in only]
        newest = max(images, key=lambda image: image.get("Created") or 0, default=None)
        return newest["Id"] if newest else None

    def _inspect_image(self, ref: str) -> dict | None:
        """The engine's JSON for the image; None when there is no such image."""
        try:
            return self.client.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as err:
            if err.status_code in (400, 404):  # an invalid reference cannot exist
                return None
            raise

    def inspect(self, ref: str) -> ImageInfo | None:
        data = self._inspect_image(ref)
        if data is None:
            return None
        config = data.get("Config") or {}
        return ImageInfo(id=data["Id"], size=int(data.get("Size") or 0),
                         labels=dict(config.get("Labels") or {}),
                         diff_ids=tuple((data.get("RootFS") or {}).get("Layers") or ()),
                         tags=tuple(data.get("RepoTags") or ()), env=tuple(config.get("Env") or ()),
                         platform=config_platform(data.get("Os"), data.get("Architecture"), data.get("Variant")))

    def image_config(self, ref: str) -> ImageConfig:
        data = self._inspect_image(ref)
        if data is None:
            raise ImageNotFound(ref, self.name)
        config = data.get("Config") or {}
        return ImageConfig(id=data["Id"], entrypoint=tuple(config.get("Entrypoint") or ()),
                           cmd=tuple(config.get("Cmd") or ()), env=tuple(config.get("Env") or ()),
                           workdir=config.get("WorkingDir") or "", user=config.get("User") or "",
                           created=config_created(data.get("Created")),
                           platform=config_platform(data.get("Os"), data.get("Architecture"), data.get("Variant")))

    def remove(self, ref: str) -> None:
        try:
            self.client.api.remove_image(ref, force=True)
        except docker.errors.ImageNotFound:
            pass

    @contextlib.contextmanager
    def export_rootfs(self, ref: str) -> Iterator[BinaryIO]:
        """A container is created (never started), its filesystem streamed, and it is removed.

        The stream comes from a `docker export` process, so the engine's reading runs beside the
        caller's work on the bytes rather than in turn with it."""
        container = self.client.api.create_container(
            ref, command=["/.imagebuild-export"], labels={"io.imagebuild.role": "export"},
            network_disabled=True)["Id"]
        try:
            with tempfile.TemporaryFile() as errors:
                proc = subprocess.Popen(self.command("export", container), stdout=subprocess.PIPE,
                                        stderr=errors, bufsize=_EXPORT_CHUNK)
                widen_pipe(proc.stdout)
                try:
                    yield proc.stdout
                    finished = proc.stdout.read(1) == b""  # the caller read it all
                finally:
                    if proc.poll() is None:
                        proc.kill()  # the caller stopped early: nothing more is wanted
                    proc.stdout.close()
                    code = proc.wait()
                if finished and code != 0:
                    errors.seek(0)
                    raise BuildFailed(f"docker export of {ref} failed (exit {code}): "
                                      f"{errors.read().decode('utf-8', 'replace').strip()}")
        finally:
            self.client.api.remove_container(container, force=True)

    def read_file(self, image: str, path: str) -> bytes | None:
        """A container is created (never started), the one path copied out of it (the archive API behind
        `docker cp`), and it is removed: only that file leaves the engine. The answer is a tar of that path
        alone; anything but one regular file in it is None."""
        try:
            container = self.client.api.create_container(
                image, command=["/.imagebuild-read"], labels={"io.imagebuild.role": "read"},
                network_disabled=True)["Id"]
        except docker.errors.ImageNotFound:
            raise ImageNotFound(image, self.name) from None
        try:
            try:
                chunks, _ = self.client.api.get_archive(container, path)
            except docker.errors.NotFound:
                return None
            with tempfile.SpooledTemporaryFile(max_size=_READ_IN_MEMORY) as spool:
                for chunk in chunks:
                    spool.write(chunk)
                spool.seek(0)
                return only_file(spool, f"{image}:{path}")
        finally:
            self.client.api.remove_container(container, force=True)

    @contextlib.contextmanager
    def save(self, image: str) -> Iterator[BinaryIO]:
        """`docker save` as a stream: layers are never held in memory."""
        self.check()
        with command_stream(self.command("save", image), f"docker save {image}") as stream:
            yield stream

    def transport(self, ref: str) -> str:
        return f"docker-daemon:{ref}"

    def at(self, endpoint: str) -> "DockerEngine":
        """The same CLI, talking to the daemon at endpoint (DOCKER_HOST's form: ssh://…, tcp://…, unix://…)."""
        return DockerEngine(cli=self._cli, host=endpoint)

    def load(self, write: Callable[[BinaryIO], None], what: str) -> str:
        """`docker load` of the image archive `write` streams into it; what docker said. Raises
        BuildFailed when it fails (a load that stops reading early is reported, not a broken pipe)."""
        with tempfile.TemporaryFile() as said:
            proc = subprocess.Popen(self.command("load", "--quiet"), stdin=subprocess.PIPE,
                                    stdout=said, stderr=subprocess.STDOUT)
            try:
                write(proc.stdin)
            except BrokenPipeError:
                pass  # docker load stopped early: what it said tells why
            finally:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            code = proc.wait()
            said.seek(0)
            text = said.read().decode("utf-8", "replace").strip()
        if code != 0:
            raise BuildFailed(f"docker load of {what} failed (exit {code}): {text}")
        return text

    def import_rootfs(self, tar: Path, ref: str, *, arch: str = "amd64") -> str:
        """`docker import` for amd64; another arch is loaded as a one-layer image archive written
        here, since Docker 20.10's `import --platform` still records amd64."""
        self.check()
        if arch != "amd64":
            return load_rootfs(self, tar, ref, arch)
        proc = subprocess.run(self.command("import", str(tar), ref), capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildFailed(f"docker import of {tar} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()


def only_file(archive: BinaryIO, where: str) -> bytes | None:
    """The file of a one-path archive (what the engine's archive API answers for a path): its bytes when its
    first entry is a regular file, else None. An archive that does not read is the engine's fault, said
    as one error."""
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            member = tar.next()
            return tar.extractfile(member).read() if member is not None and member.isfile() else None
    except (tarfile.TarError, EOFError, OSError) as error:
        raise BuildFailed(f"the engine's copy of {where} is not a readable tar: {error}") from None


def load_rootfs(engine: DockerEngine, tar: Path, ref: str, arch: str) -> str:
    """A rootfs tar loaded as a one-layer image of `arch` (write_rootfs_archive) streamed into `docker load`."""
    text = engine.load(lambda sink: write_rootfs_archive(sink, tar, arch, tags=(ref,)), f"the {arch} rootfs {tar}")
    info = engine.inspect(ref)
    if info is None:
        raise BuildFailed(f"docker load of {tar} did not leave {ref}: {text}")
    return info.id
