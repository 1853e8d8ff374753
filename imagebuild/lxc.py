"""Publish to Proxmox: an image as an LXC rootfs template (or an OCI archive). The container config
lines that pass NVIDIA GPUs through are lxc_gpu.py's.

    engine export stream ──filter (owners, /dev, init, env)──▶ zstd -T0 ──▶ .NAME.partial ──rename──▶ NAME

pve-container unpacks a template with `tar xpf --numeric-owner --xattrs --anchored --exclude ./dev/*`
under a uid shift of 100000 (src/PVE/LXC/Create.pm), picks its setup plugin by /etc/os-release ID and
starts /sbin/init. docs/proxmox.md says what the template holds and why. Nothing here holds more than
one file of the image in memory, and the final path appears only when the template is complete.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from imagebuild import tarstream
from imagebuild.bases import sha256_file
from imagebuild.engine import widen_pipe
from imagebuild.errors import EXIT_FAILED, ImagebuildError, ToolMissing
from imagebuild.files import atomic_output

Progress = Callable[[str], None]
ID_RANGE = 65536  # unprivileged containers map uid/gid 0..65535 to 100000..165535
BUFFER = 1 << 20
SMALL_FILE = 1 << 20  # files the filter reads or edits (os-release, bash.bashrc) stay under this
# /etc/os-release ID -> the file pve-container's plugin for it reads (None: os-release is enough).
PROXMOX_OS = {"debian": "etc/debian_version", "devuan": "etc/devuan_version",
              "ubuntu": "etc/lsb-release", "alpine": "etc/alpine-release",
              "centos": "etc/redhat-release", "rocky": "etc/redhat-release",
              "almalinux": "etc/redhat-release", "fedora": None, "archlinux": None, "arch": None,
              "gentoo": None, "opensuse": None, "opensuse-leap": None, "opensuse-tumbleweed": None,
              "sles": None, "nixos": None, "openeuler": None, "openEuler": None}
COMPRESSORS = {"zst": (".tar.zst", ("zstd", "-T0", "-q", "-c")),
               "gz": (".tar.gz", ("pigz", "-n", "-c")),  # gzip -n -c when pigz is missing
               "xz": (".tar.xz", ("xz", "-T0", "-q", "-c"))}
# Files the template gets from imagebuild (docs/proxmox.md, "Init and environment").
INIT = "sbin/init"
ENV_SCRIPT = "etc/profile.d/imagebuild.sh"
COMMAND_FILE = "etc/imagebuild/command"
BASHRC_HOOK = (b"# imagebuild: the image's environment for interactive shells (pct enter)\n"
               b"[ -r /etc/profile.d/imagebuild.sh ] && . /etc/profile.d/imagebuild.sh\n")
INIT_SHIM_FILE = Path(__file__).parent / "data" / "lxc-init.sh"  # /sbin/init when the image has none
_TYPES = {tarstream.REGULAR, tarstream.DIRECTORY, tarstream.SYMLINK, tarstream.HARDLINK, tarstream.FIFO,
          tarstream.CHARDEV, tarstream.BLOCKDEV}
_DEVICES = {tarstream.CHARDEV, tarstream.BLOCKDEV}
_DOCKER_PLACEHOLDERS = {"etc/hostname", "etc/hosts", "etc/resolv.conf"}  # empty, 0755, from `docker create`


class TemplateError(ImagebuildError):
    """The image cannot become a Proxmox template as it is."""


class OwnerOutOfRange(TemplateError):
    def __init__(self, path: str, uid: int, gid: int):
        self.path, self.uid, self.gid = path, uid, gid
        super().__init__(f"/{path} is owned by {uid}:{gid}, outside 0-{ID_RANGE - 1}: an unprivileged "
                         f"Proxmox container maps only those ids (to 100000+id); chown it in the recipe")


class NotAProxmoxOs(TemplateError):
    """os-release or the distribution's version file is missing, or names an OS Proxmox cannot set up."""


class UnreadableRootfs(TemplateError):
    exit_code = EXIT_FAILED


# ---------------------------------------------------------------- values

@dataclass(frozen=True)
class ImageConfig:
    """What the template needs from the image's config."""

    id: str
    env: tuple[str, ...] = ()
    command: tuple[str, ...] = ()  # ENTRYPOINT + CMD
    workdir: str = ""
    user: str = ""
    created: int = 0  # seconds since the epoch


@dataclass(frozen=True)
class TemplatePlan:
    init: str = "auto"  # auto: the image's /sbin/init if it has one, else the shim; shim; image
    command: tuple[str, ...] = ()  # what the shim runs; () idles
    workdir: str = ""
    env: tuple[str, ...] = ()
    epoch: int | None = None  # mtimes are clamped to this (None: kept)


@dataclass
class RootfsSummary:
    members: int = 0
    bytes_in: int = 0
    dropped: list[str] = field(default_factory=list)
    os: dict = field(default_factory=dict)
    init: str = ""
    added: list[str] = field(default_factory=list)
    driver_libraries: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class TemplateReport:
    image: str
    image_id: str
    path: str
    format: str  # lxc-rootfs or oci-archive
    compression: str | None
    size: int
    sha256: str
    seconds: float
    rootfs: RootfsSummary | None = None
    tool: str = ""  # for OCI: what wrote the layout

    def to_dict(self) -> dict:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 2)
        return data


# ---------------------------------------------------------------- the filter

def _clean(name: str) -> str:
    """`./etc/x`, `/etc/x`, `etc//x` -> `etc/x`; the root is ''. A `..` that climbs out is refused."""
    parts = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise UnreadableRootfs(f"tar member {name!r} climbs out of the root; not a rootfs")
        parts.append(part)
    return "/".join(parts)


def _resolve(path: str, links: dict[str, str], follow_last: bool = True, limit: int = 40) -> str | None:
    """path inside the archive with its symlinked components followed (None: a loop)."""
    parts, done = path.split("/"), []
    while parts:
        done.append(parts.pop(0))
        target = links.get("/".join(done)) if parts or follow_last else None
        if target is None:
            continue
        limit -= 1
        if limit < 0:
            return None
        base = "" if target.startswith("/") else "/".join(done[:-1])
        parts = [p for p in posixpath.normpath("/" + posixpath.join(base, target)).split("/") if p] + parts
        done = []
    return "/".join(done)


def parse_os_release(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key] = value.strip().strip("\"'")
    return values


def is_driver_library(path: str, env: Iterable[str] = ()) -> bool:
    """libcuda.so* is the host driver's: a copy in the image shadows it. A link-time stub (…/stubs/)
    is fine unless LD_LIBRARY_PATH puts its folder on the loader's path."""
    folder, base = posixpath.split("/" + path)
    if not base.startswith("libcuda.so"):
        return False
    if "stubs" not in folder.split("/"):
        return True
    paths = [v.partition("=")[2] for v in env if v.startswith("LD_LIBRARY_PATH=")]
    return any(posixpath.normpath(p) == folder for value in paths for p in value.split(":") if p)


def env_files(env: Iterable[str]) -> tuple[bytes, bytes, list[str]]:
    """The image's Env as /etc/profile.d/imagebuild.sh (shell) and lines for /etc/environment (pam_env)."""
    script = ["# The image's environment (its ENV), written by imagebuild export-lxc; login shells, "
              + "/etc/bash.bashrc and /sbin/init read it."]
    pam, skipped = ["# The image's environment, written by imagebuild export-lxc (pam_env reads it)."], []
    for item in env:
        key, _, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            skipped.append(f"ENV {key!r} is not a shell variable name; left out")
            continue
        script.append(f"export {key}={shlex.quote(value)}")
        if re.fullmatch(r"[^\s\"'\\#]*", value):
            pam.append(f"{key}={value}")
        elif '"' not in value and "\\" not in value and "\n" not in value:
            pam.append(f'{key}="{value}"')
        else:
            skipped.append(f"ENV {key} cannot be written to /etc/environment; login shells still get it")
    return ("\n".join(script) + "\n").encode(), ("\n".join(pam) + "\n").encode(), skipped


def command_file(command: Iterable[str], workdir: str) -> bytes:
    lines = ["# The image's ENTRYPOINT + CMD and WORKDIR, run by /sbin/init (imagebuild's shim)."]
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)} 2>/dev/null || cd /")
    lines.append("set --" + "".join(" " + shlex.quote(arg) for arg in command))
    return ("\n".join(lines) + "\n").encode()


def filter_rootfs(source: BinaryIO, sink: BinaryIO, plan: TemplatePlan = TemplatePlan(),
                  progress: Callable[[int], None] = lambda _: None) -> RootfsSummary:
    """Copy a rootfs tar stream into a Proxmox template tar stream; raise TemplateError if it can't be one."""
    with _readable():
        return _filter(tarstream.Reader(source), tarstream.Writer(sink), plan, progress)


@contextlib.contextmanager
def _readable() -> Iterator[None]:
    """A damaged tar stream becomes UnreadableRootfs."""
    try:
        yield
    except tarstream.TarStreamError as err:
        raise UnreadableRootfs(f"the image's filesystem stream is damaged: {err}") from None


def _filter(reader: tarstream.Reader, out: tarstream.Writer, plan: TemplatePlan,
            progress: Callable[[int], None]) -> RootfsSummary:
    summary = RootfsSummary()
    env_script, environment, skipped = env_files(plan.env)
    summary.warnings += skipped
    replaced = {ENV_SCRIPT: env_script, COMMAND_FILE: command_file(plan.command, plan.workdir)}
    appended = {"etc/environment": environment, "etc/bash.bashrc": BASHRC_HOOK}
    links: dict[str, str] = {}
    kept: dict[str, bytes] = {}  # small files read for the checks at the end
    written: set[str] = set()
    dropped: set[str] = set()
    for member in reader:
        name = _clean(member.name)
        kind = member.type
        summary.members += 1
        summary.bytes_in += member.size if kind == tarstream.REGULAR else 0
        progress(summary.bytes_in)
        if kind not in _TYPES:
            raise UnreadableRootfs(f"/{name}: tar member type {kind!r} is not a file, folder, "
                                   f"link, device or fifo")
        target = _clean(member.linkname) if kind == tarstream.HARDLINK else None
        if (name.startswith("dev/") or name == ".dockerenv" or kind in _DEVICES
                or target in dropped or name in replaced
                or (plan.init == "shim" and _resolve(name, links, False) == _resolve(INIT, links, False))):
            dropped.add(name)
            if not name.startswith("dev/") and name not in replaced:
                summary.dropped.append("/" + name)
            continue
        if not (0 <= member.uid < ID_RANGE and 0 <= member.gid < ID_RANGE):
            raise OwnerOutOfRange(name, member.uid, member.gid)
        if kind == tarstream.SYMLINK:
            links[name] = member.linkname
        if kind != tarstream.DIRECTORY and is_driver_library(name, plan.env):
            summary.driver_libraries.append("/" + name)
        _normalize(member, name, target, plan.epoch)
        if kind != tarstream.REGULAR:
            member.size = 0
            out.add(member)
        elif name in appended or (_watched(name) and member.size <= SMALL_FILE):
            if member.size > SMALL_FILE:
                raise TemplateError(f"/{name} is over {SMALL_FILE >> 20} MiB; imagebuild appends to it")
            data = kept[name] = reader.read_data(SMALL_FILE)
            if name in appended:
                data += (b"" if not data or data.endswith(b"\n") else b"\n") + appended.pop(name)
                member.size = len(data)
            out.add(member, data)
        else:
            out.add(member)
            reader.copy_data(out.data)
        written.add(name)
    summary.os = _check_os(kept, links)
    has_init = _resolve(INIT, links) in written
    if plan.init == "image" and not has_init:
        raise NotAProxmoxOs("the image has no /sbin/init, which Proxmox starts; use --init shim "
                            "(imagebuild's init script, docs/proxmox.md) or install an init in the recipe")
    summary.init = "image" if has_init and plan.init != "shim" else "shim"
    additions = dict(replaced) | appended
    if summary.init == "shim":
        additions[INIT] = INIT_SHIM_FILE.read_bytes()
    else:
        del additions[COMMAND_FILE]
    for path, data in sorted(additions.items()):
        if path in appended and _resolve(path, links) in written:
            summary.warnings.append(f"/{path} is a link to /{_resolve(path, links)}; not extended")
            continue
        summary.added.append("/" + _add(out, path, data, links, written, plan.epoch or 0))
    out.close()
    summary.dropped.sort()
    return summary


def _normalize(member: tarstream.Member, name: str, target: str | None, epoch: int | None) -> None:
    """Names under ./ (pve-container's exclude is anchored there), folders ending in /."""
    member.name = "./" + name + ("/" if name and member.type == tarstream.DIRECTORY else "")
    if target is not None:
        member.linkname = "./" + target
    member.mode &= 0o7777
    if epoch is not None:
        member.mtime = max(0, min(member.mtime, epoch))
    if name in _DOCKER_PLACEHOLDERS and member.type == tarstream.REGULAR and member.size == 0:
        member.mode = 0o644


def _watched(name: str) -> bool:
    return name in ("etc/os-release", "usr/lib/os-release") or name in PROXMOX_OS.values()


def _read_through(kept: dict[str, bytes], links: dict[str, str], path: str) -> bytes | None:
    resolved = _resolve(path, links)
    return kept.get(resolved) if resolved is not None else None


def _check_os(kept: dict[str, bytes], links: dict[str, str]) -> dict:
    text = _read_through(kept, links, "etc/os-release")
    if text is None:
        raise NotAProxmoxOs("the image has no /etc/os-release: Proxmox picks the container's setup "
                            "(network, hostname, DNS) by its ID; build from a distribution base")
    release = parse_os_release(text.decode("utf-8", "replace"))
    os_id = release.get("ID", "")
    if os_id not in PROXMOX_OS:
        raise NotAProxmoxOs(f"/etc/os-release says ID={os_id!r}, which Proxmox has no setup for "
                            f"(it knows {', '.join(sorted(set(PROXMOX_OS)))})")
    version_file = PROXMOX_OS[os_id]
    version = None
    if version_file:
        data = _read_through(kept, links, version_file)
        version = data.decode("utf-8", "replace").strip().splitlines()[0] if data and data.strip() else None
        if version is None:
            raise NotAProxmoxOs(f"/etc/os-release says ID={os_id} but /{version_file} is missing or "
                                f"empty: Proxmox's {os_id} setup reads its version from there")
    return {"id": os_id, "version_id": release.get("VERSION_ID", ""), "version_file": version_file,
            "version": version}


def _add(out: tarstream.Writer, path: str, data: bytes, links: dict[str, str], written: set[str],
         mtime: int) -> str:
    """Write one of imagebuild's files at the path it lands on (through merged-/usr links), with folders."""
    folder, base = posixpath.split(path)
    real_folder = _resolve(folder, links) if folder else ""
    if real_folder is None:
        raise UnreadableRootfs(f"/{folder} is a symlink loop; cannot add /{path}")
    parts = real_folder.split("/") if real_folder else []
    for depth in range(1, len(parts) + 1):
        parent = "/".join(parts[:depth])
        if parent not in written:
            out.add(tarstream.Member(f"./{parent}/", tarstream.DIRECTORY, mode=0o755, mtime=mtime))
            written.add(parent)
    real = posixpath.join(real_folder, base)
    if real in written:
        raise UnreadableRootfs(f"/{real} came before the symlink that leads to it; cannot replace it")
    out.add(tarstream.Member("./" + real, mode=0o755 if path == INIT else 0o644, size=len(data),
                             mtime=mtime), data)
    written.add(real)
    return real


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
    with _readable():
        for member in tarstream.Reader(stream):
            yield _clean(member.name), member


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
    """An uncompressed OCI archive (Proxmox 9.1+): imagebuild.oci's layout tarred (writer auto or
    imagebuild), or skopeo's oci-archive (writer skopeo, or auto without imagebuild.oci)."""
    started = time.monotonic()
    out = Path(out)
    if not out.name.endswith(".tar"):
        raise TemplateError(f"{out.name}: Proxmox takes an OCI archive only as a .tar")
    config = image_config(engine, image)
    export_layout = None
    if writer != "skopeo":
        try:
            from imagebuild.oci import REPRO_EPOCH, export_layout
        except ImportError:
            if writer == "imagebuild":
                raise
    with atomic_output(out) as temp:
        if export_layout is not None:
            tool = "imagebuild.oci"
            progress(f"writing {image} as an OCI layout (imagebuild.oci), then {out}")
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
