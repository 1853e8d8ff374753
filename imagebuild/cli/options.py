"""Options more than one command takes, written once."""

from __future__ import annotations

import argparse

from imagebuild.engine import DEFAULT_ENGINE, engine_names
from imagebuild.image.compression import CHOICES, DEFAULT


def engine_option(cmd: argparse.ArgumentParser) -> None:
    """--engine, its choices the engines imagebuild has (imagebuild.engine.ENGINES)."""
    cmd.add_argument("--engine", default=DEFAULT_ENGINE, choices=engine_names(),
                     help=f"the container engine (default: {DEFAULT_ENGINE})")


def compression_option(cmd: argparse.ArgumentParser, what: str) -> None:
    """--compression gzip|zstd|estargz: gzip, which every engine reads, unless another is asked for."""
    cmd.add_argument("--compression", choices=tuple(CHOICES), default=DEFAULT.name,
                     help=f"how {what} are compressed: gzip (default; every engine reads it), zstd "
                          "(a node unpacks it faster; containerd, Podman, CRI-O and Docker 23+ read it) or "
                          "estargz (gzip that stargz-snapshotter mounts lazily; every gzip reader reads it)")


def gpu_request(text: str) -> bool | tuple:
    """`all` (True: every GPU the engine's host has) or GPU numbers like `0,1` (a tuple of them)."""
    if text == "all":
        return True
    numbers = tuple(part.strip() for part in text.split(","))
    if not numbers or not all(part.isascii() and part.isdigit() for part in numbers):
        raise argparse.ArgumentTypeError(f"{text!r} is not 'all' or GPU numbers like 0,1")
    return tuple(dict.fromkeys(numbers))


def gpus_options(cmd: argparse.ArgumentParser, what: str) -> None:
    """--gpus and --no-gpus: by default GPUs are used when this machine shows them (/dev/nvidiactl); a
    remote engine's host (DOCKER_HOST) is not this machine, so --gpus says so."""
    which = cmd.add_mutually_exclusive_group()
    which.add_argument("--gpus", type=gpu_request, metavar="all|N,M",
                       help=f"{what} with these GPUs of the engine's host, as `docker run --gpus` takes them "
                            "(default: all, when this machine has an NVIDIA device)")
    which.add_argument("--no-gpus", action="store_true", help=f"{what} without GPUs even where they are visible")


def gpus_chosen(args: argparse.Namespace) -> bool | tuple | None:
    """What --gpus/--no-gpus asked for: None leaves it to the flow (GPUs when this machine has them)."""
    return False if args.no_gpus else args.gpus
