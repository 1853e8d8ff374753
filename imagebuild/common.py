"""Small helpers every stage shares; this module imports nothing of imagebuild's.

    BOOTSTRAP_EPOCH, REPRO_EPOCH  the one fixed time bases are bootstrapped with and layers clamped to
    cache_dir()                   where bases, layer blobs and push state are cached
    sha256_file()                 a file's sha256, read in chunks
    atomic_output(), write_atomic()  a file appears whole or not at all (temp file, then rename)
    host_arch(), MACHINES          Debian's architecture names against `uname -m`'s
    platform_name(arch)           the OCI platform of an architecture: linux/arm64
    Progress, quiet                a progress callback (one line of text at a time) and the one that says nothing
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# What a stage says while it works, a line at a time (the CLI prints it; a library caller may drop it).
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """The progress callback that says nothing."""


def announce(progress: Progress, kind: str, event: dict, text: str) -> None:
    """A structured progress event (a kernel module reused, compiling, compiled): as an event where the
    callback takes events (the CLI's --json progress), else as its line of text."""
    emit = getattr(progress, "event", None)
    if callable(emit):
        emit(kind, event)
    else:
        progress(text)

# Fixed so that two bootstraps of the same mirror state give the same bytes (mmdebstrap honours it);
# layers written during a build are clamped to the same time (docs/reproducibility.md, "The epoch").
BOOTSTRAP_EPOCH = 1700000000
REPRO_EPOCH = BOOTSTRAP_EPOCH


# Debian (and OCI) architecture name -> the machine name `uname -m`, wheel tags and uv's targets use.
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_arch(machine: str | None = None) -> str:
    """`uname -m` (this machine's, or the one given) as Debian names it: x86_64 -> amd64, aarch64 -> arm64."""
    import platform
    machine = (platform.machine() if machine is None else machine).lower()
    return {m: arch for arch, m in MACHINES.items()}.get(machine, machine)


def platform_name(arch: str) -> str:
    """The OCI platform of a Debian architecture name: amd64 -> linux/amd64."""
    return f"linux/{arch}"


def cache_dir() -> Path:
    root = os.environ.get("IMAGEBUILD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "imagebuild")
    return Path(root)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temp file beside path that becomes path only when the block ends without an exception
    (KeyboardInterrupt included); otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    temp = Path(temp)
    try:
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes) -> Path:
    """path holds data, or (after a crash or an error) what it held before."""
    with atomic_output(path) as temp:
        temp.write_bytes(data)
    return Path(path)
