"""How a layer blob is compressed: gzip (the default, which every engine reads), zstd (which a node
unpacks several times faster: containerd, Podman, CRI-O and Docker ≥ 23 read it) or eStargz (gzip that a
lazy consumer mounts before it has the whole blob, and every gzip reader reads: estargz.py writes it).

Both are written so the same tar gives the same blob every time: gzip without a name or a time at a
fixed level (zlib's version decides the rest); zstd by Debian's `zstd` CLI at a fixed level, single
threaded (a worker count would change the frames), always fed through a pipe (so no frame states the
content size) and with its checksum on. The blob's bytes then depend on the tar, the level and zstd's
version only. Reading a zstd blob goes through the same CLI; a damaged one is a LayoutError.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
import zlib
from dataclasses import dataclass
from typing import IO, Iterator

from imagebuild.image.oci import LayoutError

# Level 1: five times faster than 6 on these machines for a 3 % larger blob; fixed, as the digest
# depends on it (and on zlib's version).
GZIP_LEVEL = 1
# zstd's own default: smaller than gzip -1 and about as fast to write; fixed, as the digest depends on it.
ZSTD_LEVEL = 3
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class CompressionError(LayoutError):
    """A compressor that is missing or fails, or a blob that does not decompress."""


@dataclass(frozen=True)
class Compression:
    name: str  # what --compression takes
    media_type: str  # the layer's OCI media type
    cache_key: str  # the compressor and level, in LayerCache's key (cache_key() adds zstd's version)
    prioritized: tuple[str, ...] = ()  # eStargz only: paths placed first, for a lazy consumer to prefetch

    def __str__(self) -> str:
        return self.name

    def with_prioritized(self, paths) -> "Compression":
        """eStargz whose layers put these paths (the files a workload reads) first, in this order."""
        if self.name != "estargz":
            raise CompressionError(f"only estargz layers take a prioritized file list, not {self.name}")
        return Compression(self.name, self.media_type, self.cache_key, tuple(paths))


GZIP = Compression("gzip", "application/vnd.oci.image.layer.v1.tar+gzip", str(GZIP_LEVEL))
ZSTD = Compression("zstd", "application/vnd.oci.image.layer.v1.tar+zstd", f"zstd{ZSTD_LEVEL}")
ESTARGZ = Compression("estargz", GZIP.media_type, f"estargz{GZIP_LEVEL}")
CHOICES = {c.name: c for c in (GZIP, ZSTD, ESTARGZ)}
DEFAULT = GZIP


def compression(name: str | Compression) -> Compression:
    """`gzip`, `zstd` or `estargz` as a Compression; anything else is one clear error."""
    if isinstance(name, Compression):
        return name
    found = CHOICES.get(name)
    if found is None:
        raise CompressionError(f"compression {name!r} is not one of {', '.join(CHOICES)}")
    return found


def _zstd() -> str:
    found = shutil.which("zstd")
    if found is None:
        raise CompressionError("zstd layers need the zstd command: apt-get install zstd "
                               "(scripts/host.sh installs it)")
    return found


@functools.lru_cache(maxsize=1)
def _zstd_version() -> str:
    """`v1.5.4`: the CLI's version, which decides the blob's bytes as much as the level does."""
    said = subprocess.run([_zstd(), "-V"], capture_output=True, text=True).stdout
    match = re.search(r"v\d+\.\d+\.\d+", said)
    return match.group(0) if match else "unknown"


def cache_key(kind: str | Compression) -> str:
    """What a cached blob was made with: gzip's level (zlib is Python's own), zstd's level and version, or
    eStargz's level and the digest of its prioritized list (the order of a layer's entries)."""
    kind = compression(kind)
    if kind.name == "zstd":
        return f"{kind.cache_key}-{_zstd_version()}"
    if kind.name == "estargz":
        listed = hashlib.sha256("\n".join(kind.prioritized).encode("utf-8", "surrogateescape")).hexdigest()
        return f"{kind.cache_key}-{listed[:16]}"
    return kind.cache_key


def check_available(kind: str | Compression) -> None:
    """Fail before any work when the compressor is missing (gzip is Python's own)."""
    if compression(kind) is ZSTD:
        _zstd()


@contextlib.contextmanager
def compressed_writer(out: IO[bytes], kind: str | Compression) -> Iterator[IO[bytes]]:
    """A write stream whose bytes reach `out` compressed, the same way every time; the blob is whole
    when the block ends (a compressor that fails raises CompressionError)."""
    kind = compression(kind)
    if kind.name == "estargz":
        raise CompressionError("an eStargz layer is written entry by entry (estargz.write_estargz), not as a stream")
    if kind is GZIP:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=out, mtime=0) as gz:
            yield gz
        return
    with tempfile.TemporaryFile() as said:
        process = subprocess.Popen([_zstd(), f"-{ZSTD_LEVEL}", "--single-thread", "--check", "-q", "-c"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=said)
        with _Pump(process.stdout, out):
            try:
                yield process.stdin
            finally:
                process.stdin.close()
        code = process.wait()
        if code != 0:
            said.seek(0)
            raise CompressionError(f"zstd exited with {code}: {said.read(2000).decode('utf-8', 'replace').strip()}")


class _Pump:
    """Copies a process's stdout into `out` on a thread while the caller feeds its stdin."""

    def __init__(self, source: IO[bytes], out: IO[bytes]):
        self.source, self.out, self.error = source, out, None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while chunk := self.source.read(_CHUNK):
                self.out.write(chunk)
        except BaseException as err:  # handed to the caller's thread in __exit__
            self.error = err
            while self.source.read(_CHUNK):  # keep draining so the compressor never blocks
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join()
        self.source.close()
        if self.error is not None and exc[0] is None:
            raise self.error


@contextlib.contextmanager
def decompressed(handle: IO[bytes], kind: str | Compression, where: str) -> Iterator[IO[bytes]]:
    """A compressed blob as a plain stream. A blob that is damaged or truncated raises CompressionError
    naming `where`: a gzip one at the read that meets the damage, a zstd one when read to its end."""
    kind = compression(kind)
    if kind.media_type == GZIP.media_type:
        with gzip.GzipFile(fileobj=handle, mode="rb") as plain:
            yield _Inflating(plain, where)
        return
    with tempfile.TemporaryFile() as said:
        process = subprocess.Popen([_zstd(), "-d", "-q", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=said)
        feeder = threading.Thread(target=_feed, args=(handle, process.stdin), daemon=True)
        feeder.start()
        try:
            yield _Checked(process, said, where)
        finally:
            process.stdout.close()
            if process.poll() is None:
                process.kill()
            process.wait()
            feeder.join()


def _feed(source: IO[bytes], sink: IO[bytes]) -> None:
    """Copy source into a process's stdin, then close it; a process that stopped reading ends the copy."""
    try:
        while chunk := source.read(_CHUNK):
            sink.write(chunk)
    except (BrokenPipeError, ValueError, OSError):
        pass
    finally:
        try:
            sink.close()
        except (BrokenPipeError, OSError):
            pass


class _Inflating:
    """GzipFile's reads, with what a damaged stream raises (zlib's error for a bad deflate block, which is no
    OSError; gzip's for a bad header or checksum; EOFError for a cut end) as CompressionError naming where."""

    def __init__(self, plain: gzip.GzipFile, where: str):
        self.plain, self.where = plain, where

    def read(self, size: int = -1) -> bytes:
        try:
            return self.plain.read(size)
        except (OSError, EOFError, zlib.error) as err:
            raise CompressionError(f"{self.where}: a gzip blob that does not inflate: {err}") from None


class _Checked:
    """zstd -d's stdout; at its end, the exit status is checked, so a damaged blob never reads as short."""

    def __init__(self, process: subprocess.Popen, errors: IO[bytes], where: str):
        self.process, self.errors, self.where = process, errors, where

    def read(self, size: int = -1) -> bytes:
        data = self.process.stdout.read(size)
        if not data or (size is None or size < 0):
            self._check()
        return data

    def _check(self) -> None:
        code = self.process.wait()
        if code != 0:
            self.errors.seek(0)
            said = self.errors.read(2000).decode("utf-8", "replace").strip()
            raise CompressionError(f"{self.where}: a zstd blob that does not decompress (zstd exited with "
                                   f"{code}: {said})")


def decompress_bytes(blob: bytes, where: str) -> bytes:
    """A small blob (gzip, zstd or plain, by its magic) decompressed in memory."""
    if blob.startswith(GZIP_MAGIC):
        try:
            return gzip.decompress(blob)
        except (OSError, EOFError, zlib.error) as err:
            raise CompressionError(f"{where}: a gzip blob that does not inflate: {err}") from None
    if blob.startswith(ZSTD_MAGIC):
        done = subprocess.run([_zstd(), "-d", "-q", "-c"], input=blob, capture_output=True)
        if done.returncode != 0:
            raise CompressionError(f"{where}: a zstd blob that does not decompress (zstd exited with "
                                   f"{done.returncode}: {done.stderr[:2000].decode('utf-8', 'replace').strip()})")
        return done.stdout
    return blob
