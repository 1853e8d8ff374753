"""Proxmox GPU passthrough (`imagebuild lxc-config`): the container config lines that bind the
host's NVIDIA devices into a container, and the check that an image brings no driver library of
its own (the container must use the host's libcuda, which mount entries cannot replace).

The device majors are read from the host's /proc/devices and the GPUs from its /dev: the nvidia-uvm
major differs from host to host. The lines are in Proxmox's `/etc/pve/lxc/ID.conf` form; lxc_syntax
gives them as a plain LXC config takes them. docs/proxmox.md says how the lines are used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from imagebuild.errors import EXIT_FAILED, ImagebuildError
from imagebuild.lxc.lxc import rootfs_members
from imagebuild.lxc.rootfs_filter import is_driver_library


class DriverInImage(ImagebuildError):
    exit_code = EXIT_FAILED


class NoGpuDevices(ImagebuildError):
    """The host tree lacks what passthrough needs (the driver or nvidia-uvm is not loaded)."""


NVIDIA_MAJOR = 195  # nvidia0..N, nvidiactl (255) and nvidia-modeset (254); fixed by the driver
CONTROL_DEVICES = (("nvidiactl", "file"), ("nvidia-uvm", "file"), ("nvidia-uvm-tools", "file"),
                   ("nvidia-modeset", "file"), ("nvidia-caps", "dir"))


@dataclass
class GpuPassthrough:
    gpus: tuple[int, ...]
    uvm_major: int
    caps_major: int | None
    lines: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def parse_proc_devices(text) -> dict[str, int]:
    """Character devices in /proc/devices as name -> major; anything unreadable is skipped."""
    devices: dict[str, int] = {}
    section = None
    for line in str(text).splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            section = stripped.split()[0].lower()
            continue
        fields = stripped.split(None, 1)
        if section == "character" and len(fields) == 2 and fields[0].isascii() and fields[0].isdigit():
            devices.setdefault(fields[1].strip(), int(fields[0]))
    return devices


def parse_gpus(spec: str) -> tuple[int, ...] | None:
    """`all` -> None; `0,1` -> (0, 1)."""
    if spec.strip() == "all":
        return None
    try:
        gpus = tuple(int(part) for part in spec.split(","))
    except ValueError:
        raise NoGpuDevices(f"--gpus {spec!r}: give `all` or GPU numbers like 0,1") from None
    if not gpus or any(gpu < 0 for gpu in gpus) or len(set(gpus)) != len(gpus):
        raise NoGpuDevices(f"--gpus {spec!r}: give `all` or distinct GPU numbers like 0,1")
    return gpus


def gpu_passthrough(spec: str = "all", root: Path = Path("/")) -> GpuPassthrough:
    """Container config lines passing the host's NVIDIA devices through, read from root/proc/devices
    and root/dev (the nvidia-uvm major differs from host to host)."""
    root = Path(root)
    try:
        devices = parse_proc_devices((root / "proc/devices").read_text(errors="replace"))
    except OSError as err:
        raise NoGpuDevices(f"cannot read {root / 'proc/devices'}: {err.strerror}") from None
    if "nvidia-uvm" not in devices:
        raise NoGpuDevices(f"{root / 'proc/devices'} lists no nvidia-uvm: load the driver's modules "
                           "on the host (`modprobe nvidia-uvm`, or run nvidia-smi once)")
    present = sorted(int(p.name[6:]) for p in (root / "dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    wanted = parse_gpus(spec)
    if wanted is None:
        if not present:
            raise NoGpuDevices(f"no {root / 'dev'}/nvidiaN: is the NVIDIA driver loaded on this host?")
        wanted = tuple(present)
    missing = [gpu for gpu in wanted if gpu not in present]
    if missing:
        raise NoGpuDevices(f"no {', '.join(f'/dev/nvidia{g}' for g in missing)} on this host (it has "
                           f"{', '.join(f'nvidia{g}' for g in present) or 'none'})")
    warnings = []
    if not any(devices.get(name) == NVIDIA_MAJOR for name in ("nvidia", "nvidia-frontend", "nvidiactl")):
        warnings.append(f"{root / 'proc/devices'} shows no NVIDIA driver on major {NVIDIA_MAJOR}")
    uvm, caps = devices["nvidia-uvm"], devices.get("nvidia-caps")
    lines = [f"lxc.cgroup2.devices.allow: c {NVIDIA_MAJOR}:* rwm",
             f"lxc.cgroup2.devices.allow: c {uvm}:* rwm"]
    if caps is not None:
        lines.append(f"lxc.cgroup2.devices.allow: c {caps}:* rwm")
    nodes = [(f"nvidia{gpu}", "file") for gpu in wanted] + list(CONTROL_DEVICES)
    for node, kind in nodes:
        lines.append(f"lxc.mount.entry: /dev/{node} dev/{node} none bind,optional,create={kind}")
        if not (root / "dev" / node).exists():
            warnings.append(f"/dev/{node} does not exist on this host yet; the entry is optional"
                            + (" (nvidia-modprobe -u -c=0 creates nvidia-uvm)" if "uvm" in node else ""))
    return GpuPassthrough(tuple(wanted), uvm, caps, tuple(lines), tuple(warnings))


def lxc_syntax(lines) -> tuple[str, ...]:
    """Proxmox's `lxc.key: value` lines as LXC's own config syntax, `lxc.key = value`: what
    pve-container writes for them into the config it starts the container with (LXC's parser
    refuses the colon form)."""
    return tuple(f"{key.strip()} = {value.strip()}" for key, _, value in (line.partition(":") for line in lines))


def image_driver_libraries(engine, image: str) -> list[str]:
    """Paths of libcuda.so* in the image that would shadow the host's driver (stubs aside)."""
    engine.check()
    config = engine.image_config(image)
    found = []
    with engine.export_rootfs(config.id) as stream:
        for name, member in rootfs_members(stream):
            if not member.isdir() and is_driver_library(name, config.env):
                found.append("/" + name)
    return sorted(found)
