"""Writing a file so that it appears whole or not at all: a temp file beside it, then a rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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
