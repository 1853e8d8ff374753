"""BuildahEngine: builds with `buildah bud` (Debian's buildah 1.28), images in containers-storage.

buildah runs the same Dockerfile.j2 output as BuildKit: RUN --mount=type=cache, type=bind and
type=secret all work in 1.28. `--timestamp` sets every file's mtime and the config's dates to the
epoch, so buildah's own layers are already close to what imagebuild.image.oci normalizes to. Containers
for `run` are buildah working containers (buildah from / run / rm): no podman needed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping, Sequence

from imagebuild.common import REPRO_EPOCH, Progress, quiet
from imagebuild.engine.contract import (BuildCache, Engine, ImageConfig, ImageInfo, RunResult, config_created,
                                        config_platform, split_ref, write_rootfs_archive)
from imagebuild.engine.build_log import BUILD_LOG_LINES, build_failure
from imagebuild.engine.streams import command_stream, run_streaming
from imagebuild.errors import BuildFailed, EngineUnavailable, ImageNotFound, ToolMissing

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def find_buildah() -> str:
    found = shutil.which(os.environ.get("IMAGEBUILD_BUILDAH", "buildah"))
    if found is None:
        raise ToolMissing("buildah is not installed: `apt-get install -y buildah` (Debian's 1.28 works)")
    return found


def parse_size(text: str) -> int:
    """buildah's `3.51 KB` -> bytes (decimal units, as buildah prints them)."""
    match = re.match(r"^\s*([\d.]+)\s*([KMGT]?B)\s*$", str(text), re.IGNORECASE)
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()]) if match else 0


def gpu_devices(gpus: bool | tuple, found: list) -> list:
    """The /dev/nvidia* nodes a container of these GPUs needs: every one for True; for GPU numbers, those
    GPUs' own nodes (/dev/nvidiaN) and every shared one (nvidiactl, nvidia-uvm, nvidia-caps, ...)."""
    if not gpus:
        return []
    wanted = {f"/dev/nvidia{number}" for number in gpus} if gpus is not True else None
    return sorted(device for device in found
                  if wanted is None or device in wanted or not re.fullmatch(r"/dev/nvidia[0-9]+", device))


def cache_flags(cache: BuildCache | None) -> list[str]:
    """buildah keeps its layer cache in a registry repository itself (one tag per cache key), during
    the build: it takes repositories, not tags, and 1.28 reads one source."""
    if cache is None:
        return []
    flags = []
    if cache.sources:
        flags += ["--cache-from", split_ref(cache.sources[0])[0]]
    if cache.target:
        flags += ["--cache-to", split_ref(cache.target)[0]]
    if flags and cache.insecure_http:
        flags.append("--tls-verify=false")
    return flags


class BuildahEngine(Engine):
    name = "buildah"
    writes_cache = True

    def __init__(self, buildah: str | None = None, *, epoch: int = REPRO_EPOCH, layers: bool = True):
        self._buildah = buildah
        self.epoch = epoch
        self.layers = layers  # keep intermediate layers as a build cache, as BuildKit does

    @property
    def buildah(self) -> str:
        if self._buildah is None:
            self._buildah = find_buildah()
        return self._buildah

    def _run(self, *args: str, check: bool = True, timeout: float | None = None,
             input_: bytes | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.buildah, *args], capture_output=True, timeout=timeout, input=input_)
        if check and proc.returncode != 0:
            raise BuildFailed(f"buildah {args[0]} failed (exit {proc.returncode}): "
                              f"{proc.stderr.decode('utf-8', 'replace').strip()[-2000:]}")
        return proc

    def check(self) -> None:
        proc = subprocess.run([self.buildah, "info"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise EngineUnavailable(f"buildah cannot reach its storage: {proc.stderr.strip()[-500:]}")

    def build(self, context: Path, *, secrets: Mapping[str, Path] = {},
              progress: Progress = quiet, cache: BuildCache | None = None,
              platform: str | None = None, hold: str | None = None) -> str:
        self.check()
        with tempfile.TemporaryDirectory(prefix="imagebuild-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            command = [self.buildah, "bud", "--pull-never", "--network", "host",
                       "--timestamp", str(self.epoch), "--iidfile", str(iidfile),
                       f"--layers={'true' if self.layers or cache else 'false'}", *cache_flags(cache)]
            if platform:
                command += ["--platform", platform]
            for name, path in sorted(secrets.items()):
                command += ["--secret", f"id={name},src={path}"]
            command += ["--tag", hold] if hold else []
            command.append(str(context))
            code, tail = run_streaming(command, progress, keep=BUILD_LOG_LINES)
            if code != 0:
                raise build_failure("buildah bud", code, tail)
            return "sha256:" + iidfile.read_text().strip().removeprefix("sha256:")

    def tag(self, image_id: str, ref: str) -> None:
        if self.inspect(image_id) is None:
            raise ImageNotFound(image_id, self.name)
        self._run("tag", image_id.removeprefix("sha256:"), ref)

    def run(self, image: str, command: Sequence[str], *, network: bool = False,
            gpus: bool | tuple = False, timeout: float = 600) -> RunResult:
        container = self._run("from", "--pull-never", "--quiet", image.removeprefix("sha256:"))
        name = container.stdout.decode().strip()
        try:
            args = [self.buildah, "run", "--network", "host" if network else "none"]
            for device in gpu_devices(gpus, glob.glob("/dev/nvidia*")):
                if not os.path.isdir(device):
                    args += ["--device", device]
            args += [name, "--", *command]
            try:
                proc = subprocess.run(args, capture_output=True, timeout=timeout)
            except subprocess.TimeoutExpired as err:
                return RunResult(124, (err.stdout or b"").decode("utf-8", "replace"),
                                 (err.stderr or b"").decode("utf-8", "replace"), True)
            return RunResult(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                             proc.stderr.decode("utf-8", "replace"))
        finally:
            self._run("rm", name, check=False)

    def find_labelled(self, key: str, value: str, only: set[str] | None = None) -> str | None:
        proc = self._run("images", "--json", "--no-trunc", "--filter", f"label={key}={value}", check=False)
        try:
            rows = json.loads(proc.stdout or b"[]") if proc.returncode == 0 else []
        except json.JSONDecodeError:
            return None
        rows = [row for row in rows if isinstance(row, dict) and row.get("id")
                and (only is None or "sha256:" + str(row["id"]).removeprefix("sha256:") in only)]
        newest = max(rows, key=lambda row: str(row.get("createdatraw") or row.get("createdat") or ""), default=None)
        return "sha256:" + str(newest["id"]).removeprefix("sha256:") if newest else None

    def _inspect_image(self, ref: str) -> dict | None:
        """`buildah inspect --type image` as JSON (the config under OCIv1); None when there is no such image."""
        proc = self._run("inspect", "--type", "image", ref.removeprefix("sha256:"), check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def inspect(self, ref: str) -> ImageInfo | None:
        data = self._inspect_image(ref)
        if data is None:
            return None
        config = data.get("OCIv1") or {}
        run = config.get("config") or {}
        listing = self._run("images", "--json", "--no-trunc", ref.removeprefix("sha256:"), check=False)
        rows = json.loads(listing.stdout or b"[]") if listing.returncode == 0 else []
        row = rows[0] if rows else {}
        image_id = data.get("FromImageID") or row.get("id", "")
        return ImageInfo(id="sha256:" + image_id.removeprefix("sha256:"),
                         size=parse_size(row.get("size", "")), labels=dict(run.get("Labels") or {}),
                         diff_ids=tuple((config.get("rootfs") or {}).get("diff_ids") or ()),
                         tags=tuple(row.get("names") or ()), env=tuple(run.get("Env") or ()),
                         platform=config_platform(config.get("os"), config.get("architecture"), config.get("variant")))

    def image_config(self, ref: str) -> ImageConfig:
        data = self._inspect_image(ref)
        if data is None:
            raise ImageNotFound(ref, self.name)
        config = data.get("OCIv1") or {}
        run = config.get("config") or {}
        return ImageConfig(id="sha256:" + str(data.get("FromImageID") or "").removeprefix("sha256:"),
                           entrypoint=tuple(run.get("Entrypoint") or ()), cmd=tuple(run.get("Cmd") or ()),
                           env=tuple(run.get("Env") or ()), workdir=run.get("WorkingDir") or "",
                           user=run.get("User") or "", created=config_created(config.get("created")),
                           platform=config_platform(config.get("os"), config.get("architecture"),
                                                    config.get("variant")))

    def remove(self, ref: str) -> None:
        self._run("rmi", "-f", ref.removeprefix("sha256:"), check=False)

    def import_rootfs(self, tar: Path, ref: str, *, arch: str = "amd64") -> str:
        """The tar pulled as a one-layer docker archive, so the layer is the tar as is (its diff_id the tar's
        sha256, as with docker); `buildah add` would write a layer of its own."""
        with tempfile.TemporaryDirectory(prefix="imagebuild-rootfs-") as tmp:
            archive = Path(tmp) / "rootfs-image.tar"
            with open(archive, "wb") as sink:
                write_rootfs_archive(sink, tar, arch)
            image_id = self._run("pull", "--quiet", f"docker-archive:{archive}").stdout.decode().strip()
        self._run("tag", image_id.removeprefix("sha256:"), ref)
        return "sha256:" + image_id.removeprefix("sha256:")

    @contextlib.contextmanager
    def export_rootfs(self, ref: str) -> Iterator[BinaryIO]:
        """The image's merged filesystem as a tar stream: a working container, mounted, tarred by
        GNU tar (numeric owners, xattrs, sorted names without `./`), then unmounted and removed."""
        name = self._run("from", "--pull-never", "--quiet", ref.removeprefix("sha256:")).stdout.decode().strip()
        try:
            root = self._run("mount", name).stdout.decode().strip()
            argv = ["tar", "-C", root, "-cf", "-", "--numeric-owner", "--xattrs", "--xattrs-include=*",
                    "--sort=name", "--", *sorted(os.listdir(root))]
            with command_stream(argv, f"tar of {ref}") as stream:
                yield stream
        finally:
            self._run("umount", name, check=False)
            self._run("rm", name, check=False)

    def transport(self, ref: str) -> str:
        return f"containers-storage:{ref.removeprefix('sha256:')}"

    @contextlib.contextmanager
    def save(self, image: str) -> Iterator[BinaryIO]:
        """The image as a docker-archive stream (what `docker save` writes)."""
        argv = [self.buildah, "push", "--quiet", image.removeprefix("sha256:"), "docker-archive:/dev/stdout"]
        with command_stream(argv, f"buildah push {image}") as stream:
            yield stream
