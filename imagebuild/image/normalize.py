"""Layer normalization: an engine's layer tar rewritten so that two builds of one lock give the
same bytes, then compressed (gzip, or zstd on request: compression.py) the same way every time.

Each layer is spilled to a temp file, indexed (headers only) and copied in sorted path order into
its blob: mtimes clamped to the lock's epoch, numeric owners without names, no atime/ctime, xattrs
kept, hard links pointed at the first path of their group; whiteouts (`.wh.*`) pass through as the
plain files they are. The compressor writes no name or time, at a fixed level. No layer is held
in memory. imagebuild.image.oci puts the result into an OCI layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, Iterator

from imagebuild.errors import ImagebuildError
from imagebuild.image.compression import (DEFAULT, GZIP, GZIP_MAGIC, ZSTD, ZSTD_MAGIC, Compression, CompressionError,
                                          compressed_writer, decompressed)
from imagebuild.image.estargz import write_estargz

_CHUNK = 1 << 20
ENTRY_TYPES = {tarfile.REGTYPE: tarfile.REGTYPE, tarfile.AREGTYPE: tarfile.REGTYPE,
          tarfile.CONTTYPE: tarfile.REGTYPE, tarfile.LNKTYPE: tarfile.LNKTYPE,
          tarfile.SYMTYPE: tarfile.SYMTYPE, tarfile.DIRTYPE: tarfile.DIRTYPE,
          tarfile.CHRTYPE: tarfile.CHRTYPE, tarfile.BLKTYPE: tarfile.BLKTYPE,
          tarfile.FIFOTYPE: tarfile.FIFOTYPE}
TAR_ERRORS = (tarfile.TarError, EOFError, ValueError, OverflowError, UnicodeError, KeyError,
               IndexError, TypeError, AttributeError)


class LayerError(ImagebuildError):
    """A layer tar that cannot be read or normalized (damaged, truncated, unsafe paths)."""


@dataclass(frozen=True)
class NormalizedLayer:
    diff_id: str  # sha256 of the normalized, uncompressed tar
    digest: str  # sha256 of the compressed blob, which is stored under that name
    size: int  # of the compressed blob
    annotations: dict = field(default_factory=dict)  # for the manifest's descriptor (eStargz's TOC digest)


class _Hashing:
    """A write-only stream that hashes and counts what passes through to `raw`."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        self.raw.write(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def clean_path(name: str) -> str:
    """A tar member name as a relative path: no leading `/` or `./`, no `..`; the root is `.`."""
    path = posixpath.normpath("/" + name.replace("\\", "/") if name else "/").lstrip("/")
    if name and any(part == ".." for part in name.split("/")):
        raise LayerError(f"unsafe path {name!r} in a layer: `..` leaves the image's root")
    return path or "."


def normalize_member(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    """The header as the layout writes it: only what a container sees, build time clamped."""
    kind = ENTRY_TYPES.get(info.type)
    if kind is None or info.issparse():
        raise LayerError(f"{info.name!r}: tar entry type {info.type!r} is not supported in a layer")
    new = tarfile.TarInfo(clean_path(info.name))
    new.type = kind
    new.mode = info.mode & 0o7777
    new.uid, new.gid = int(info.uid), int(info.gid)
    new.uname = new.gname = ""
    new.mtime = max(0, min(int(info.mtime), epoch))
    new.size = info.size if kind == tarfile.REGTYPE else 0
    if kind == tarfile.LNKTYPE:
        new.linkname = clean_path(info.linkname)
    elif kind == tarfile.SYMTYPE:
        new.linkname = info.linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        new.devmajor, new.devminor = info.devmajor, info.devminor
    new.pax_headers = {k: info.pax_headers[k] for k in sorted(info.pax_headers)
                       if k.startswith("SCHILY.xattr.")}
    return new


def path_sort_key(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def index_layer(raw: BinaryIO, epoch: int) -> list[tuple[tarfile.TarInfo, int]]:
    """Read a seekable layer tar's headers: [(normalized header, data offset)] in sorted path order.

    A path that appears twice keeps its last entry (what extraction leaves). Hard links are pointed
    at the first path of their group in sorted order, which then carries the data."""
    size = raw.seek(0, os.SEEK_END)
    raw.seek(0)
    entries: dict[str, tuple[tarfile.TarInfo, int]] = {}
    try:
        tar = tarfile.open(fileobj=raw, mode="r:", encoding="utf-8", errors="surrogateescape")
        while (info := tar.next()) is not None:
            tar.members.clear()  # keep only the compact index below
            member = normalize_member(info, epoch)
            if member.name == ".":
                continue  # only imported rootfs tars carry `./`; the runtime gives / its own mode
            if member.type == tarfile.REGTYPE and info.offset_data + info.size > size:
                raise LayerError(f"{member.name!r}: its data runs past the end of the layer "
                                 f"({info.offset_data + info.size} > {size} bytes): the tar is truncated")
            entries.pop(member.name, None)
            entries[member.name] = (member, info.offset_data)
        _check_tail(raw, tar.offset, size)
    except LayerError:
        raise
    except TAR_ERRORS as err:
        raise LayerError(f"not a readable layer tar: {type(err).__name__}: {err}") from None
    return _relink(entries)


def _check_tail(raw: BinaryIO, offset: int, size: int) -> None:
    """tarfile stops quietly at a damaged header after the first; only zero padding may follow the end."""
    raw.seek(offset)
    position = offset
    while block := raw.read(_CHUNK):
        if block.strip(b"\0"):
            at = position + len(block) - len(block.lstrip(b"\0"))
            raise LayerError(f"the layer tar is damaged at byte {at}: data after its last readable "
                             "entry")
        position += len(block)


def _relink(entries: dict[str, tuple[tarfile.TarInfo, int]]) -> list[tuple[tarfile.TarInfo, int]]:
    groups: dict[str, list[str]] = {}
    for name, (member, _) in entries.items():
        if member.type == tarfile.LNKTYPE and member.linkname in entries:
            groups.setdefault(member.linkname, []).append(name)
    for target, links in groups.items():
        source, offset = entries[target]
        if source.type != tarfile.REGTYPE:
            continue
        first, *rest = sorted([target, *links], key=path_sort_key)
        entries[first] = (_copy(source, name=first), offset)  # the data rides on the first path
        for name in rest:
            link = _copy(source, name=name)
            link.type, link.size, link.linkname = tarfile.LNKTYPE, 0, first
            entries[name] = (link, 0)
    return [entries[name] for name in sorted(entries, key=path_sort_key)]


def _copy(info: tarfile.TarInfo, *, name: str) -> tarfile.TarInfo:
    new = tarfile.TarInfo(name)
    for attr in ("type", "mode", "uid", "gid", "uname", "gname", "mtime", "size", "linkname",
                 "devmajor", "devminor"):
        setattr(new, attr, getattr(info, attr))
    new.pax_headers = dict(info.pax_headers)
    return new


def write_normalized(raw: BinaryIO, index: list[tuple[tarfile.TarInfo, int]], out: IO[bytes]) -> str:
    """Write the sorted entries as a PAX tar to `out`; return the tar's sha256 (the diff_id)."""
    hashed = _Hashing(out)
    with tarfile.open(fileobj=hashed, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tar:
        for member, offset in index:
            if member.type == tarfile.REGTYPE:
                raw.seek(offset)
                tar.addfile(member, raw)
            else:
                tar.addfile(member)
    return hashed.digest


def write_layer_blob(raw: BinaryIO, blob_dir: Path, *, epoch: int,
                     compression: Compression = DEFAULT) -> NormalizedLayer:
    """A seekable layer tar (plain, gzip or zstd) -> a normalized blob (gzip, zstd or eStargz) in
    blob_dir/sha256/."""
    blobs = blob_dir / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    with _plain(raw, blobs) as plain:
        index = index_layer(plain, epoch)
        fd, tmp = tempfile.mkstemp(prefix=".layer-", dir=blobs)
        try:
            annotations = {}
            with os.fdopen(fd, "wb") as handle:
                blob = _Hashing(handle)
                try:
                    if compression.name == "estargz":
                        written = write_estargz(plain, index, blob, prioritized=compression.prioritized)
                        diff_id, annotations = written.diff_id, written.annotations
                    else:
                        with compressed_writer(blob, compression) as compressed:
                            diff_id = write_normalized(plain, index, compressed)
                except CompressionError as err:
                    raise LayerError(str(err)) from None
            os.replace(tmp, blobs / blob.digest.split(":", 1)[1])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return NormalizedLayer(diff_id, blob.digest, blob.size, annotations)


@contextlib.contextmanager
def _plain(raw: BinaryIO, spill_dir: Path) -> Iterator[BinaryIO]:
    """The layer uncompressed and seekable: a gzip or zstd layer is decompressed into a temp file first."""
    raw.seek(0)
    head = raw.read(4)
    kind = GZIP if head.startswith(GZIP_MAGIC) else ZSTD if head == ZSTD_MAGIC else None
    raw.seek(0)
    if kind is None:
        yield raw
        return
    with tempfile.TemporaryFile(dir=spill_dir) as plain:
        try:
            with decompressed(raw, kind, "a layer") as inflated:
                shutil.copyfileobj(inflated, plain, _CHUNK)
        except (OSError, EOFError, ValueError, CompressionError) as err:
            raise LayerError(f"a {kind.name} layer that does not decompress: {err}") from None
        plain.seek(0)
        yield plain


@contextlib.contextmanager
def spilled(stream: IO[bytes], spill_dir: Path) -> Iterator[tuple[BinaryIO, str]]:
    """A layer stream copied into a temp file: (the seekable file, the sha256 hex of its bytes)."""
    with tempfile.TemporaryFile(dir=spill_dir) as raw:
        hashed = _Hashing(raw)
        shutil.copyfileobj(stream, hashed, _CHUNK)
        yield raw, hashed.hash.hexdigest()
