"""The rootfs filter: an engine's filesystem export made into a template pct accepts, one tar header at a time.

Owners are kept numeric and must fit the unprivileged range (0-65535, shifted by 100000 on the
host), /dev entries go (pct creates them), Docker's placeholder files are dropped, /etc/os-release
must name an OS pve-container has a plugin for, and the template gets an init that runs the image's
command with its environment when the image has none (docs/proxmox.md, "Init and environment").
lxc.py streams an image through it into the compressor.
"""

from __future__ import annotations

import contextlib
import posixpath
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from imagebuild.errors import EXIT_FAILED, ImagebuildError
from imagebuild.image import tarstream

ID_RANGE = 65536  # unprivileged containers map uid/gid 0..65535 to 100000..165535
SMALL_FILE = 1 << 20  # files the filter reads or edits (os-release, bash.bashrc) stay under this
# /etc/os-release ID -> the file pve-container's plugin for it reads (None: os-release is enough).
PROXMOX_OS = {"debian": "etc/debian_version", "devuan": "etc/devuan_version",
              "ubuntu": "etc/lsb-release", "alpine": "etc/alpine-release",
              "centos": "etc/redhat-release", "rocky": "etc/redhat-release",
              "almalinux": "etc/redhat-release", "fedora": None, "archlinux": None, "arch": None,
              "gentoo": None, "opensuse": None, "opensuse-leap": None, "opensuse-tumbleweed": None,
              "sles": None, "nixos": None, "openeuler": None, "openEuler": None}
# Files the template gets from imagebuild (docs/proxmox.md, "Init and environment").
INIT = "sbin/init"
ENV_SCRIPT = "etc/profile.d/imagebuild.sh"
COMMAND_FILE = "etc/imagebuild/command"
BASHRC_HOOK = (b"# imagebuild: the image's environment for interactive shells (pct enter)\n"
               b"[ -r /etc/profile.d/imagebuild.sh ] && . /etc/profile.d/imagebuild.sh\n")
INIT_SHIM_FILE = Path(__file__).parent / "lxc-init.sh"  # /sbin/init when the image has none
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
    platform: str = ""  # the exported image's: linux/amd64, linux/arm64

    def to_dict(self) -> dict:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 2)
        return data


# ---------------------------------------------------------------- the filter

def clean_name(name: str) -> str:
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
    with damaged_as_unreadable():
        return _filter(tarstream.Reader(source), tarstream.Writer(sink), plan, progress)


@contextlib.contextmanager
def damaged_as_unreadable() -> Iterator[None]:
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
        name = clean_name(member.name)
        kind = member.type
        summary.members += 1
        summary.bytes_in += member.size if kind == tarstream.REGULAR else 0
        progress(summary.bytes_in)
        if kind not in _TYPES:
            raise UnreadableRootfs(f"/{name}: tar member type {kind!r} is not a file, folder, "
                                   f"link, device or fifo")
        target = clean_name(member.linkname) if kind == tarstream.HARDLINK else None
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
