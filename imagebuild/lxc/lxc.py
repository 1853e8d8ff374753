"""Publish to Proxmox: an image as an LXC rootfs template (or an OCI archive). The container config
lines that pass NVIDIA GPUs through are lxc_gpu.py's.

    engine export stream ──filter (owners, /dev, init, env)──▶ zstd -T0 ──▶ .NAME.partial ──rename──▶ NAME

pve-container unpacks a template with `tar xpf --numeric-owner --xattrs --anchored --exclude ./dev/*`
under a uid shift of 100000 (src/PVE/LXC/Create.pm), picks its setup plugin by /etc/os-release ID and
starts /sbin/init. docs/proxmox.md says what the template holds and why. Nothing here holds more than
one file of the image in memory, and the final path appears only when the template is complete.

Docker 20.10 keeps one platform per tag, so a multi-platform build tags each platform's image
NAME:TAG-<arch>; resolve_image() picks the one for `--platform`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from imagebuild.common import Progress, atomic_output, quiet, sha256_file
from imagebuild.engine.contract import split_ref
from imagebuild.engine.streams import widen_pipe
from imagebuild.errors import ToolMissing
from imagebuild.image import tarstream
from imagebuild.lxc.rootfs_filter import (RootfsSummary, TemplateError, TemplatePlan, TemplateReport, clean_name,
                                          damaged_as_unreadable, filter_rootfs)

BUFFER = 1 << 20
COMPRESSORS = {"zst": (".tar.zst", ("zstd", "-T0", "-q", "-c")),
               "gz": (".tar.gz", ("pigz", "-n", "-c")),  # gzip -n -c when pigz is missing
               "xz": (".tar.xz", ("xz", "-T0", "-q", "-c"))}
# Go's GOARCH names, as image configs write them; the aliases are what `uname -m` says.
ARCHES = ("amd64", "arm64", "arm", "386", "ppc64le", "s390x", "riscv64")
ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64"}
PLATFORM_TAG_ARCHES = ("amd64", "arm64")  # the NAME:TAG-<arch> tags a multi-platform build makes


class PlatformNotFound(TemplateError):
    """Neither IMAGE nor IMAGE-<arch> is an image of the platform asked for."""

    def __init__(self, image: str, platform: str, found: dict[str, str]):
        self.image, self.platform, self.found = image, platform, dict(found)
        seen = "; ".join(f"{ref} is {found[ref]}" for ref in found) or f"no image {image!r} at all"
        tagged = f" (its image is tagged {platform_tag(image, arch_of(platform))})" if has_tags(image) else ""
        super().__init__(f"no {platform} image of {image}: {seen}. Build the recipe for {platform}{tagged}, "
                         "or name that platform's image instead")

    def details(self) -> dict:
        return {"image": self.image, "platform": self.platform, "found": self.found}


# ---------------------------------------------------------------- platform

def parse_platform(text: str) -> str:
    """`linux/arm64`, `arm64` or `aarch64` -> `linux/arm64`; a variant stays (`linux/arm/v7`), except
    arm64's v8, which every arm64 image is."""
    parts = str(text).strip().lower().split("/")
    if len(parts) == 1:
        parts = ["linux", *parts]
    os_name, arch, variant = (parts + [""])[:3] if len(parts) <= 3 else ("", "", "")
    arch = ARCH_ALIASES.get(arch, arch)
    if os_name != "linux" or arch not in ARCHES or (variant and not re.fullmatch(r"v[0-9]{1,2}", variant)):
        raise TemplateError(f"--platform {text!r}: write linux/ARCH or ARCH, ARCH one of "
                            f"{', '.join(ARCHES)} (linux/arm/v7 for a variant)")
    return f"linux/{arch}" + (f"/{variant}" if variant and (arch, variant) != ("arm64", "v8") else "")


def same_platform(asked: str, found: str) -> bool:
    """Does the image's platform (ImageInfo.platform) answer the one asked for?"""
    try:
        asked, found = parse_platform(asked), parse_platform(found)
    except TemplateError:
        return False
    return found == asked or (asked.count("/") == 1 and found.startswith(asked + "/"))  # any variant


def has_tags(image: str) -> bool:
    """A name:tag has per-platform tags beside it; a digest or an image id has none."""
    return "@" not in image and not image.startswith("sha256:")


def platform_tag(image: str, arch: str) -> str:
    """`myorg/x:1.0` -> `myorg/x:1.0-arm64`: where a multi-platform build tags one platform's image."""
    name, tag = split_ref(image)
    return f"{name}:{tag}-{arch}"


def resolve_image(engine, image: str, platform: str | None = None) -> tuple[str, str]:
    """(the reference to export, its platform): IMAGE as it is without `platform`; with one, IMAGE when it
    is that platform, else IMAGE-<arch> when that is. PlatformNotFound says what there is otherwise."""
    engine.check()
    if platform is None:
        return image, engine.require(image).platform
    info = engine.inspect(image)
    asked = parse_platform(platform)
    found = {image: info.platform} if info else {}
    if info and same_platform(asked, info.platform):
        return image, info.platform
    if not has_tags(image):
        raise PlatformNotFound(image, asked, found)
    arch = arch_of(asked)
    for tag_arch in dict.fromkeys((arch, *PLATFORM_TAG_ARCHES)):  # the others only to say what there is
        ref = platform_tag(image, tag_arch)
        tagged = engine.inspect(ref)
        if tagged is None:
            continue
        if tag_arch == arch and same_platform(asked, tagged.platform):
            return ref, tagged.platform
        found[ref] = tagged.platform
    raise PlatformNotFound(image, asked, found)


def arch_of(platform: str) -> str:
    """`linux/arm64` -> `arm64`, the architecture Proxmox's template names carry."""
    parts = platform.split("/")
    return parts[1] if len(parts) > 1 and parts[1] else "amd64"


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


def default_name(image: str, compression: str = "zst", oci: bool = False, arch: str = "amd64") -> str:
    """Proxmox's template naming: `name_version_arch.tar.zst` (imagebuild/cuda-toolchain:13.0 ->
    imagebuild-cuda-toolchain_13.0_amd64.tar.zst); arch is the exported image's (arch_of)."""
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    stem = re.sub(r"[^A-Za-z0-9.+-]+", "-", name.replace("/", "-")).strip("-") or "image"
    arch = re.sub(r"[^A-Za-z0-9]+", "", arch) or "amd64"
    return f"{stem}_{tag}_{arch}" + (".tar" if oci else COMPRESSORS[compression][0])


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
                    progress: Progress = quiet) -> TemplateReport:
    """The image as a Proxmox LXC rootfs template at out (zstd unless its suffix says gz or xz)."""
    started = time.monotonic()
    out = Path(out)
    compression = compression_for(out, compression)
    compressor_command(compression)  # missing tools fail before the engine is asked for anything
    engine.check()
    config = engine.image_config(image)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or config.created)
    plan = TemplatePlan(init=init, command=config.command if command is None else tuple(command),
                        workdir=config.workdir, env=config.env, epoch=epoch)
    info = engine.inspect(config.id)
    progress(f"exporting {image} ({config.id[7:19]}, {config.platform}) to {out} ({compression})")
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
                          time.monotonic() - started, summary, platform=config.platform)


def export_oci(engine, image: str, out: Path, *, writer: str = "auto",
               progress: Progress = quiet) -> TemplateReport:
    """An uncompressed OCI archive (Proxmox 9.1+): imagebuild.image.oci's layout tarred (writer auto or
    imagebuild), or skopeo's oci-archive (writer skopeo, or auto without imagebuild.image.oci)."""
    started = time.monotonic()
    out = Path(out)
    if not out.name.endswith(".tar"):
        raise TemplateError(f"{out.name}: Proxmox takes an OCI archive only as a .tar")
    engine.check()
    config = engine.image_config(image)
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
            source = engine.transport(image)
            progress(f"skopeo copy {source} oci-archive:{out}")
            temp.unlink()
            proc = subprocess.run(["skopeo", "copy", "--quiet", source, f"oci-archive:{temp}"],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise TemplateError(f"skopeo copy failed: {proc.stderr.strip()}")
        size, digest = temp.stat().st_size, sha256_file(temp)
    return TemplateReport(image, config.id, str(out), "oci-archive", None, size, digest,
                          time.monotonic() - started, None, tool, config.platform)


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
