"""`imagebuild export-lxc` and `imagebuild lxc-config`: a thin layer over imagebuild.lxc.lxc and lxc_gpu.

cli.py's extension hook calls add_commands(command); each handler is fn(args, out, err) -> exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
from pathlib import Path

from rich.console import Console

from imagebuild.cli.options import engine_option
from imagebuild.cli.output import line
from imagebuild.errors import EXIT_OK
from imagebuild.lxc import lxc, lxc_gpu


def add_commands(command) -> None:
    cmd = command("export-lxc", "write an image as a Proxmox LXC template (rootfs .tar.zst), or "
                  "as an OCI archive for Proxmox 9.1+ with --oci")
    cmd.add_argument("image")
    cmd.add_argument("-o", "--output", type=Path,
                     help="the template's path, ending .tar.zst, .tar.gz or .tar.xz (.tar with --oci); "
                     "default NAME_TAG_ARCH.tar.zst here, ARCH the exported image's")
    cmd.add_argument("--platform", metavar="PLATFORM",
                     help="export this platform's image (linux/arm64 or arm64): IMAGE if it is that "
                     "platform, else IMAGE-ARCH, the tag a multi-platform build gives it (default: IMAGE as it is)")
    cmd.add_argument("--compress", choices=sorted(lxc.COMPRESSORS),
                     help="compressor (default: from the output's suffix, else zst)")
    cmd.add_argument("--init", choices=["auto", "shim", "image"], default="auto",
                     help="/sbin/init of the container: the image's own, else imagebuild's shim that "
                     "runs the image's command (auto); always the shim; the image's or fail")
    cmd.add_argument("--cmd", metavar="COMMAND",
                     help="what the shim runs instead of the image's ENTRYPOINT+CMD, as a shell line; "
                     "'' idles until the container is stopped")
    cmd.add_argument("--oci", action="store_true",
                     help="write an uncompressed OCI archive (Proxmox 9.1+ runs its entrypoint itself)")
    engine_option(cmd)
    cmd.set_defaults(handler=export_lxc)

    cmd = command("lxc-config", "print the Proxmox container config lines that pass NVIDIA GPUs "
                  "through (append them to /etc/pve/lxc/ID.conf)")
    cmd.add_argument("--gpus", default="all", help="all, or GPU numbers like 0,1 (default all)")
    cmd.add_argument("--format", choices=["pve", "lxc"], default="pve",
                     help="pve: `lxc.key: value` for /etc/pve/lxc/ID.conf (default); lxc: `lxc.key = value` "
                     "for a plain LXC container's config")
    cmd.add_argument("--image", help="also check that this image carries no libcuda.so of its own")
    cmd.add_argument("--root", type=Path, default=Path("/"),
                     help="read proc/devices and dev/ under this folder (default /, the host)")
    engine_option(cmd)
    cmd.set_defaults(handler=lxc_config)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM stops an export the way Ctrl-C does: the partial file is removed on the way out."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def export_lxc(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.engine import default_engine
    engine = default_engine(args.engine)
    image, platform = lxc.resolve_image(engine, args.image, args.platform)
    output = args.output or Path(lxc.default_name(args.image, args.compress or "zst", args.oci,
                                                  lxc.arch_of(platform)))
    with err.status(line("exporting")) as status, _sigterm_interrupts():
        def progress(text: str) -> None:
            if text.startswith("exported "):
                status.update(line(text))
            else:
                err.print(line(("›", "bold cyan"), " ", text))
        if args.oci:
            report = lxc.export_oci(engine, image, output, progress=progress)
        else:
            command = None if args.cmd is None else tuple(shlex.split(args.cmd))
            report = lxc.export_template(engine, image, output, compression=args.compress,
                                         init=args.init, command=command, progress=progress)
    if args.json:
        out.print_json(data=report.to_dict())
        return EXIT_OK
    rootfs = report.rootfs
    if rootfs:
        for warning in rootfs.warnings:
            err.print(line(("warning", "yellow"), " ", warning))
        if rootfs.driver_libraries:
            err.print(line(("warning", "yellow"), " the image carries the driver library ",
                           ", ".join(rootfs.driver_libraries), ": it shadows the host's driver"))
        out.print(line("os ", str(rootfs.os["id"]), " ", str(rootfs.os["version"] or rootfs.os["version_id"]),
                       f"; init: {'the image' + chr(39) + 's' if rootfs.init == 'image' else 'imagebuild shim'}; "
                       f"{rootfs.members} entries; dropped {len(rootfs.dropped)} outside /dev"))
    kind = f"LXC template ({report.compression})" if report.format == "lxc-rootfs" else \
        f"OCI archive (via {report.tool})"
    out.print(line(("wrote", "green"), " ", str(report.path), f"  {kind}  ", report.platform or "platform unknown",
                   f"  {report.size / 1e6:.0f} MB  sha256 {report.sha256[:16]}…  in {report.seconds:.1f} s"))
    if report.image != args.image:
        out.print(line("  from ", report.image, ", the ", report.platform, " image of ", args.image))
    return EXIT_OK


def lxc_config(args: argparse.Namespace, out: Console, err: Console) -> int:
    config = lxc_gpu.gpu_passthrough(args.gpus, args.root)
    libraries = None
    if args.image:
        from imagebuild.engine import default_engine
        libraries = lxc_gpu.image_driver_libraries(default_engine(args.engine), args.image)
        if libraries:
            raise lxc_gpu.DriverInImage(
                f"{args.image} carries {', '.join(libraries)}: a container must use the host's own "
                "driver library, which Proxmox's mount entries cannot replace; remove it from the image "
                "(a link-time stub under …/stubs/ is fine)")
    lines = config.lines if args.format == "pve" else lxc_gpu.lxc_syntax(config.lines)
    if args.json:
        data = config.to_dict() | {"lines": list(lines), "format": args.format, "ok": True}
        if args.image:
            data["image"] = {"name": args.image, "driver_libraries": libraries}
        out.print_json(data=data)
        return EXIT_OK
    for warning in config.warnings:
        err.print(line(("warning", "yellow"), " ", warning))
    if args.image:
        err.print(line(args.image, ": no libcuda.so of its own (the host's driver will be used)"))
    for text in lines:
        out.print(line(text))
    return EXIT_OK
