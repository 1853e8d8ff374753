"""Running a build tool or an export command as a stream: its lines to progress, or its stdout to read.

The engines use these, and so do the stages that read an engine's output (bases, image export, LXC).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from typing import BinaryIO, Iterator, Mapping, Sequence

from imagebuild.common import Progress
from imagebuild.errors import BuildFailed, ImagebuildError

_CHUNK = 1 << 20


def widen_pipe(stream, size: int = 1 << 20) -> None:
    """Let a pipe hold up to size bytes (Linux's default is 64 KiB), so a producer and a consumer
    on either side of imagebuild keep working while it handles the previous chunk. Best effort:
    the kernel's pipe-max-size, or a stream that is not a pipe, leaves it as it was."""
    import fcntl
    try:
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, size)
    except (OSError, AttributeError, ValueError):
        pass


def run_streaming(command: Sequence[str], progress: Progress, *, env: Mapping[str, str] | None = None,
                  keep: int = 60) -> tuple[int, list[str]]:
    """Run a build tool, handing each output line to progress; (exit code, its last `keep` lines)."""
    proc = subprocess.Popen(list(command), env=dict(env) if env is not None else None, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-keep:]
        progress(line)
    return proc.wait(), tail


@contextlib.contextmanager
def command_stream(argv: list[str], what: str) -> Iterator[BinaryIO]:
    """A command's stdout as a stream. When the command itself failed (an image that does not exist
    gives an empty stream), its message is the error, not what reading the empty stream raised."""
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)
        except OSError as err:
            raise BuildFailed(f"{what}: cannot run {argv[0]}: {err}") from None
        try:
            yield proc.stdout
            while proc.stdout.read(_CHUNK):  # drain in pieces: the producer never blocks on us
                pass
            code = proc.wait()
        except ImagebuildError:
            try:
                code = proc.wait(timeout=2)  # done writing already: its own exit code tells
            except subprocess.TimeoutExpired:
                raise  # still writing, so the stream itself was bad
            if code == 0:
                raise
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if code != 0:
            errors.seek(0)
            raise BuildFailed(f"{what} failed (exit {code}): "
                              f"{errors.read().decode('utf-8', 'replace').strip()}") from None
