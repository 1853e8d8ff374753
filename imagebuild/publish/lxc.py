"""Publish to Proxmox: an image as an LXC rootfs template (or an OCI archive). The container config
lines that pass NVIDIA GPUs through are lxc_gpu.py's.

    engine export stream ──filter (owners, /dev, init, env)──▶ zstd -T0 ──▶ .NAME.partial ──rename──▶ NAME

pve-container unpacks a template with `tar xpf --numeric-owner --xattrs --anchored --exclude ./dev/*`
under a uid shift of 100000 (src/PVE/LXC/Create.pm), picks its setup plugin by /etc/os-release ID and
starts /sbin/init. docs/proxmox.md says what the template holds and why. Nothing here holds more than
one file of the image in memory, and the final path appears only when the template is complete.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from imagebuild.common import atomic_output, sha256_file
from imagebuild.engine.streams import widen_pipe
from imagebuild.errors import ImagebuildError, ToolMissing
from imagebuild.image import tarstream
from imagebuild.publish.rootfs_filter import (ImageConfig, RootfsSummary, TemplateError, TemplatePlan, TemplateReport,
                                              clean_name, damaged_as_unreadable, filter_rootfs)

Progress = Callable[[str], None]
BUFFER = 1 << 20
COMPRESSORS = {"zst": (".tar.zst", ("zstd", "-T0", "-q", "-c")),
               "gz": (".tar.gz", ("pigz", "-n", "-c")),  # gzip -n -c when pigz is missing
               "xz": (".tar.xz", ("xz", "-T0", "-q", "-c"))}
# ---------------------------------------------------------------- export

def compression_for(path: Path, requested: str | None = None) -> str:
    """zst, gz or xz, from the name's suffix (pve-container picks tar's option by it) or --compress."""
    found = next((name for name, (suffix, _) in COMPRESSORS.items() if path.name.endswith(suffix)), None)
    if found is None:
        *first, last = (suffix for suffix, _ in COMPRESSORS.values())
        suffixes = f"{', '.join(first)} or {last}"
        raise TemplateError(f"{path.name}: a Proxmox template's name ends with {suffixes} "
                            "(pct picks the decompressor by it)")
    if requested and requested != found:
        raise TemplateError(f"{path.name} ends with {COMPRESSORS[found][0]} but --compress {requested} "
                            "was asked for: make them agree")
    return found


def default_name(image: str, compression: str = "zst", oci: bool = False) -> str:
    """Proxmox's template naming: `name_version_arch.tar.zst` (imagebuild/cuda-toolchain:13.0 ->
    imagebuild-cuda-toolchain_13.0_amd64.tar.zst)."""
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    stem = re.sub(r"[^A-Za-z0-9.+-]+", "-", name.replace("/", "-")).strip("-") or "image"
    return f"{stem}_{tag}_amd64" + (".tar" if oci else COMPRESSORS[compression][0])


def compressor_command(compression: str) -> list[str]:
    command = list(COMPRESSORS[compression][1])
    if compression == "gz" and shutil.which("pigz") is None:
        command = ["gzip", "-n", "-c"]
    if shutil.which(command[0]) is None:
        package = {"zstd": "zstd", "xz": "xz-utils", "gzip": "gzip"}[command[0]]
        raise ToolMissing(f"{command[0]} is not installed: `apt-get install -y {package}`")
    return command


def compress_to(path: Path, compression: str, write: Callable[[BinaryIO], object]):
    """Run write(stdin of the compressor) with the compressor writing path; return write's result."""
    command = compressor_command(compression)
    with open(path, "wb") as target, tempfile.TemporaryFile() as errors:
        # Its own session: Ctrl-C reaches imagebuild, which stops it, rather than both at once.
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=target, stderr=errors,
                                bufsize=BUFFER, start_new_session=True)
        widen_pipe(proc.stdin)
        try:
            result = write(proc.stdin)
            proc.stdin.close()
        except BrokenPipeError:
            proc.wait()
            errors.seek(0)
            raise TemplateError(f"{command[0]} stopped (exit {proc.returncode}): "
                                f"{errors.read().decode('utf-8', 'replace').strip()}") from None
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if proc.wait() != 0:
            errors.seek(0)
            raise TemplateError(f"{command[0]} failed (exit {proc.returncode}): "
                                f"{errors.read().decode('utf-8', 'replace').strip()}")
    return result


def image_config(engine, image: str) -> ImageConfig:
    engine.check()
    client = getattr(engine, "client", None)
    if client is None:
        raise ImagebuildError(f"the {engine.name} engine cannot show an image's config yet")
    import docker.errors
    try:
        data = client.api.inspect_image(image)
    except docker.errors.NotFound:
        raise TemplateError(f"no image {image!r} in the {engine.name} engine") from None
    config = data.get("Config") or {}
    created = re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", data.get("Created") or "")
    epoch = (int(datetime.fromisoformat(created.group(0)).replace(tzinfo=timezone.utc).timestamp())
             if created else 0)
    return ImageConfig(id=data["Id"], env=tuple(config.get("Env") or ()),
                       command=tuple(config.get("Entrypoint") or ()) + tuple(config.get("Cmd") or ()),
                       workdir=config.get("WorkingDir") or "", user=config.get("User") or "",
                       created=epoch)


def rootfs_members(stream: BinaryIO) -> Iterator[tuple[str, tarstream.Member]]:
    """Each entry of a rootfs tar stream as (clean path, header); file contents are skipped."""
    with damaged_as_unreadable():
        for member in tarstream.Reader(stream):
            yield clean_name(member.name), member


def _throttled(progress: Progress, total: int) -> Callable[[int], None]:
    last = [0.0]

    def report(done: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            share = f" of ~{total / 1e6:.0f} MB" if total else ""
            progress(f"exported {done / 1e6:.0f} MB{share}")
    return report


def write_template(source: BinaryIO, out: Path, plan: TemplatePlan, compression: str = "zst",
                   progress: Callable[[int], None] = lambda _: None) -> tuple[RootfsSummary, int, str]:
    """A rootfs tar stream -> filter -> compressor -> out, atomically; (summary, size, sha256)."""
    with atomic_output(out) as temp:
        summary = compress_to(temp, compression,
                              lambda sink: filter_rootfs(source, sink, plan, progress))
        size, digest = temp.stat().st_size, sha256_file(temp)
    return summary, size, digest


def export_template(engine, image: str, out: Path, *, compression: str | None = None,
                    init: str = "auto", command: tuple[str, ...] | None = None,
                    progress: Progress = lambda _: None) -> TemplateReport:
    """The image as a Proxmox LXC rootfs template at out (zstd unless its suffix says gz or xz)."""
    started = time.monotonic()
    out = Path(out)
    compression = compression_for(out, compression)
    compressor_command(compression)  # missing tools fail before the engine is asked for anything
    config = image_config(engine, image)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or config.created)
    plan = TemplatePlan(init=init, command=config.command if command is None else tuple(command),
                        workdir=config.workdir, env=config.env, epoch=epoch)
    info = engine.inspect(config.id)
    progress(f"exporting {image} ({config.id[7:19]}) to {out} ({compression})")
    with engine.export_rootfs(config.id) as stream:
        summary, size, digest = write_template(stream, out, plan, compression,
                                               _throttled(progress, info.size if info else 0))
    if command is not None and summary.init == "image":
        summary.warnings.append("--cmd is what imagebuild's shim runs; the image's own /sbin/init "
                                "ignores it (use --init shim)")
    if config.user not in ("", "root", "0", "0:0") and summary.init == "shim":
        summary.warnings.append(f"the image's USER {config.user} is not applied: the shim runs its "
                                "command as root")
    return TemplateReport(image, config.id, str(out), "lxc-rootfs", compression, size, digest,
                          time.monotonic() - started, summary)


def export_oci(engine, image: str, out: Path, *, writer: str = "auto",
               progress: Progress = lambda _: None) -> TemplateReport:
    """An uncompressed OCI archive (Proxmox 9.1+): imagebuild.image.oci's layout tarred (writer auto or
    imagebuild), or skopeo's oci-archive (writer skopeo, or auto without imagebuild.image.oci)."""
    started = time.monotonic()
    out = Path(out)
    if not out.name.endswith(".tar"):
        raise TemplateError(f"{out.name}: Proxmox takes an OCI archive only as a .tar")
    config = image_config(engine, image)
    export_layout = None
    if writer != "skopeo":
        try:
            from imagebuild.image.export import export_layout
            from imagebuild.image.oci import REPRO_EPOCH
        except ImportError:
            if writer == "imagebuild":
                raise
    with atomic_output(out) as temp:
        if export_layout is not None:
            tool = "imagebuild.oci"
            progress(f"writing {image} as an OCI layout (imagebuild.image.oci), then {out}")
            with tempfile.TemporaryDirectory(prefix=".oci-", dir=out.parent) as scratch:
                layout = Path(scratch) / "layout"
                export_layout(engine, config.id, layout, epoch=REPRO_EPOCH)
                _tar_folder(layout, temp, REPRO_EPOCH)
        else:
            tool = "skopeo"
            if shutil.which("skopeo") is None:
                raise ToolMissing("--oci needs skopeo: `apt-get install -y skopeo`")
            progress(f"skopeo copy docker-daemon:{image} oci-archive:{out}")
            temp.unlink()
            proc = subprocess.run(["skopeo", "copy", "--quiet", f"docker-daemon:{image}",
                                   f"oci-archive:{temp}"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise TemplateError(f"skopeo copy failed: {proc.stderr.strip()}")
        size, digest = temp.stat().st_size, sha256_file(temp)
    return TemplateReport(image, config.id, str(out), "oci-archive", None, size, digest,
                          time.monotonic() - started, None, tool)


def _tar_folder(folder: Path, path: Path, epoch: int) -> None:
    """Names as pve-container looks for them (`oci-layout`, `index.json`, `blobs/...`), sorted."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                full = Path(root) / name
                info = tar.gettarinfo(str(full), arcname=str(full.relative_to(folder)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = min(int(info.mtime), epoch)
                if info.isreg():
                    with open(full, "rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
