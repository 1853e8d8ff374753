"""eStargz layers: a gzip layer that a lazy consumer can mount before it holds the whole blob.

Each regular file's data starts a gzip member of its own (a new one every 4 MiB), so one file can be
fetched with a byte range and inflated alone. A table of contents, `stargz.index.json`, is the last tar
entry: every entry's metadata, each chunk's offset in the blob and sha256. A 51-byte empty gzip member
ends the blob; its extra field holds the TOC's offset. Any gzip reader sees one multi-member gzip of an
ordinary tar, so a consumer without a lazy snapshotter (Docker 20.10, Podman, containerd) pulls it as any
gzip layer. Files named `prioritized` go first, followed by `.prefetch.landmark`: a lazy consumer fetches
everything up to the landmark in one range at mount time and the rest as it is read.

Format: stargz-snapshotter's estargz package and docs/estargz.md (v0.12.0, what Debian 12 ships). Written
the same way every time: the normalized entries (normalize.py), gzip members without a name or a time at
GZIP_LEVEL, TOC keys in one order, so the blob depends on the tar, the prioritized list and zlib only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import tarfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, BinaryIO, Iterable

from imagebuild.image.compression import GZIP_LEVEL, CompressionError

TOC_NAME = "stargz.index.json"
PREFETCH_LANDMARK = ".prefetch.landmark"
NO_PREFETCH_LANDMARK = ".no.prefetch.landmark"
LANDMARKS = (PREFETCH_LANDMARK, NO_PREFETCH_LANDMARK)
LANDMARK_DATA = b"\x0f"
CHUNK_SIZE = 4 << 20  # the estargz package's default
FOOTER_SIZE = 51
# Annotations on the layer's manifest descriptor: the TOC's digest (the snapshotter verifies the TOC against
# it, then each chunk against the TOC) and the uncompressed size (Podman's stargz store reads it).
TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
UNCOMPRESSED_SIZE = "io.containers.estargz.uncompressed-size"
_BLOCK = tarfile.BLOCKSIZE
_COPY = 1 << 20
_TYPES = {tarfile.DIRTYPE: "dir", tarfile.REGTYPE: "reg", tarfile.SYMTYPE: "symlink",
          tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block",
          tarfile.FIFOTYPE: "fifo"}


class EstargzError(CompressionError):
    """An eStargz blob whose footer, TOC or chunks do not read or do not match."""


@dataclass(frozen=True)
class EstargzLayer:
    diff_id: str  # sha256 of the whole uncompressed tar, TOC entry included
    toc_digest: str  # sha256 of the TOC's JSON bytes
    uncompressed_size: int
    prioritized: int  # entries placed before the landmark (0: none, `.no.prefetch.landmark` first)

    @property
    def annotations(self) -> dict[str, str]:
        return {TOC_DIGEST: self.toc_digest, UNCOMPRESSED_SIZE: str(self.uncompressed_size)}


class _Members:
    """Gzip members written one after another to `out`, each with the header Python's gzip writes for
    mtime 0 and no name; `offset` is where the next member starts in the blob."""

    def __init__(self, out: IO[bytes]):
        self.out, self.offset, self._deflate = out, 0, None
        self.plain = hashlib.sha256()
        self.plain_size = 0

    def _emit(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.offset += len(data)

    def open(self) -> None:
        if self._deflate is None:
            self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._crc, self._size = 0, 0
            self._emit(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + (b"\x04" if GZIP_LEVEL == 1 else b"\x00") + b"\xff")

    def write(self, data: bytes) -> None:
        self.open()
        self.plain.update(data)
        self.plain_size += len(data)
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._emit(self._deflate.compress(data))

    def close(self) -> None:
        if self._deflate is not None:
            self._emit(self._deflate.flush() + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))
            self._deflate = None


def footer(toc_offset: int) -> bytes:
    """The 51-byte empty gzip member whose extra field says where the TOC's member starts."""
    sub = b"%016xSTARGZ" % toc_offset
    extra = b"SG" + struct.pack("<H", len(sub)) + sub
    stored_empty = b"\x01\x00\x00\xff\xff"  # one final stored block of no bytes
    return (b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x00\xff" + struct.pack("<H", len(extra)) + extra
            + stored_empty + struct.pack("<II", 0, 0))


def _modtime(seconds: int) -> str | None:
    if seconds <= 0:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _toc_entry(member: tarfile.TarInfo, name: str) -> dict:
    """The entry's keys as the estargz package names them; empty values left out, as its JSON does."""
    entry = {"name": name, "type": _TYPES[member.type]}
    if member.type == tarfile.REGTYPE and member.size:
        entry["size"] = member.size
    fields = {"modtime": _modtime(int(member.mtime)),
              "linkName": member.linkname if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE) else None,
              "mode": member.mode, "uid": member.uid, "gid": member.gid}
    if member.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        fields.update(devMajor=member.devmajor, devMinor=member.devminor)
    xattrs = {key[len("SCHILY.xattr."):]: base64.b64encode(value.encode("utf-8", "surrogateescape")).decode()
              for key, value in sorted(member.pax_headers.items()) if key.startswith("SCHILY.xattr.")}
    fields["xattrs"] = xattrs
    entry.update((key, value) for key, value in fields.items() if value)
    return entry


def prioritized_order(index: list[tuple[tarfile.TarInfo, int]], prioritized: Iterable[str]
                      ) -> tuple[list[tuple[tarfile.TarInfo, int]], int]:
    """(entries with each prioritized path first, after its parent directories and its hard link's target;
    how many entries moved). Paths the layer does not hold are passed over: a layer holds part of an image."""
    by_name = {member.name: (member, offset) for member, offset in index}
    moved: dict[str, tuple[tarfile.TarInfo, int]] = {}

    def move(name: str) -> None:
        if not name or name in moved or name not in by_name:
            return
        parent = name.rpartition("/")[0]
        move(parent)
        member = by_name[name][0]
        if member.type == tarfile.LNKTYPE:
            move(member.linkname)
        moved[name] = by_name[name]

    for path in prioritized:
        wanted = path.strip("/")
        if wanted in by_name:
            move(wanted)
    rest = [item for item in index if item[0].name not in moved]
    return list(moved.values()) + rest, len(moved)


def write_estargz(plain: BinaryIO, index: list[tuple[tarfile.TarInfo, int]], out: IO[bytes], *,
                  prioritized: Iterable[str] = (), chunk_size: int = CHUNK_SIZE) -> EstargzLayer:
    """The normalized entries of `plain` (normalize.index_layer) as an eStargz blob written to `out`."""
    index = [item for item in index if item[0].name not in (TOC_NAME, *LANDMARKS)]
    ordered, moved = prioritized_order(index, prioritized)
    landmark = tarfile.TarInfo(PREFETCH_LANDMARK if moved else NO_PREFETCH_LANDMARK)
    landmark.size, landmark.mode = len(LANDMARK_DATA), 0o644
    ordered.insert(moved, (landmark, -1))
    members, toc = _Members(out), []
    for member, offset in ordered:
        header = member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        members.open()
        members.write(header)
        entry = _toc_entry(member, member.name + ("/" if member.type == tarfile.DIRTYPE else ""))
        if member.type != tarfile.REGTYPE or not member.size:
            if member.type == tarfile.REGTYPE:
                entry["digest"] = "sha256:" + hashlib.sha256(b"").hexdigest()
            toc.append(entry)
            continue
        if offset >= 0:
            plain.seek(offset)
        whole, written = hashlib.sha256(), 0
        first = entry
        while written < member.size:
            members.close()
            size = min(chunk_size, member.size - written)
            entry.update(offset=members.offset, chunkOffset=written)
            if size == chunk_size:
                entry["chunkSize"] = size
            chunk = _read_chunk(plain, size, member.name) if offset >= 0 else LANDMARK_DATA
            whole.update(chunk)
            members.write(chunk)
            entry["chunkDigest"] = "sha256:" + hashlib.sha256(chunk).hexdigest()
            toc.append(entry)
            written += size
            entry = {"name": member.name, "type": "chunk"}
        first["digest"] = "sha256:" + whole.hexdigest()
        members.write(tarfile.NUL * (-member.size % _BLOCK))
    for entry in toc:  # chunkOffset 0 is left out, as the package's omitempty does
        if entry.get("chunkOffset") == 0:
            del entry["chunkOffset"]
    members.close()
    toc_offset = members.offset
    try:
        toc_json = json.dumps({"version": 1, "entries": toc}, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        named = next(e["name"] for e in toc if not _utf8(e["name"]) or not _utf8(e.get("linkName", "")))
        raise EstargzError(f"{named!r} is not UTF-8, and eStargz's TOC is JSON, which cannot name it: write this "
                           "image with --compression gzip or zstd") from None
    toc_member = tarfile.TarInfo(TOC_NAME)
    toc_member.size = len(toc_json)
    members.write(toc_member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    members.write(toc_json + tarfile.NUL * (-len(toc_json) % _BLOCK) + tarfile.NUL * (2 * _BLOCK))
    members.close()
    out.write(footer(toc_offset))
    return EstargzLayer("sha256:" + members.plain.hexdigest(), "sha256:" + hashlib.sha256(toc_json).hexdigest(),
                        members.plain_size, moved)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_chunk(plain: BinaryIO, size: int, name: str) -> bytes:
    parts, left = [], size
    while left:
        part = plain.read(min(left, _COPY))
        if not part:
            raise EstargzError(f"{name!r}: the layer tar ends inside its data")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


# ---------------------------------------------------------------- reading one back

_TOC_LIMIT = 256 << 20


@dataclass(frozen=True)
class Toc:
    offset: int  # where the TOC's gzip member starts
    digest: str  # sha256 of its JSON bytes: what the TOC_DIGEST annotation must say
    entries: list


def parse_footer(raw: bytes, where: str) -> int:
    """The TOC's offset from the blob's last 51 bytes."""
    if len(raw) != FOOTER_SIZE or raw[:3] != b"\x1f\x8b\x08" or not raw[3] & 0x04:
        raise EstargzError(f"{where}: no eStargz footer (the last {FOOTER_SIZE} bytes are not a gzip member "
                           "with an extra field)")
    xlen = struct.unpack("<H", raw[10:12])[0]
    extra = raw[12:12 + xlen]
    if xlen != 26 or extra[:2] != b"SG" or struct.unpack("<H", extra[2:4])[0] != 22 or extra[20:26] != b"STARGZ":
        raise EstargzError(f"{where}: the footer's extra field is not eStargz's `SG` subfield: {extra!r}")
    try:
        return int(extra[4:20].decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        raise EstargzError(f"{where}: the footer's TOC offset is not hexadecimal: {extra[4:20]!r}") from None


def read_toc(blob: BinaryIO, where: str) -> Toc:
    """The TOC of an eStargz blob, checked to be the blob's last tar entry before the footer."""
    size = blob.seek(0, 2)
    if size < FOOTER_SIZE:
        raise EstargzError(f"{where}: {size} bytes is shorter than eStargz's {FOOTER_SIZE}-byte footer")
    blob.seek(size - FOOTER_SIZE)
    offset = parse_footer(blob.read(FOOTER_SIZE), where)
    if offset > size - FOOTER_SIZE:
        raise EstargzError(f"{where}: the footer puts the TOC at byte {offset}, past the blob's end ({size})")
    blob.seek(offset)
    plain = _inflate_member(blob.read(min(size - FOOTER_SIZE - offset, _TOC_LIMIT)), where, "the TOC")
    try:
        header = tarfile.TarInfo.frombuf(plain[:_BLOCK], "utf-8", "surrogateescape")
    except tarfile.TarError as err:
        raise EstargzError(f"{where}: the TOC member holds no tar header: {err}") from None
    if header.name != TOC_NAME:
        raise EstargzError(f"{where}: the TOC member's tar entry is {header.name!r}, not {TOC_NAME!r}")
    raw = plain[_BLOCK:_BLOCK + header.size]
    if len(raw) != header.size:
        raise EstargzError(f"{where}: the TOC is cut short ({len(raw)} of {header.size} bytes)")
    try:
        toc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise EstargzError(f"{where}: the TOC is not JSON: {err}") from None
    if not isinstance(toc, dict) or not isinstance(toc.get("entries"), list) or \
            not all(isinstance(e, dict) for e in toc["entries"]):
        raise EstargzError(f"{where}: the TOC has no list of entries")
    return Toc(offset, "sha256:" + hashlib.sha256(raw).hexdigest(), toc["entries"])


def _inflate_member(data: bytes, where: str, what: str, want: int | None = None) -> bytes:
    """One gzip member from the start of `data`, inflated (only its first `want` bytes when given)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        if want is None:
            out = inflate.decompress(data, _TOC_LIMIT)
        else:
            out = inflate.decompress(data, want)
    except zlib.error as err:
        raise EstargzError(f"{where}: {what} does not inflate: {err}") from None
    if want is None and not inflate.eof:
        raise EstargzError(f"{where}: {what} is cut short or over {_TOC_LIMIT} bytes")
    return out


def verify_chunks(blob: BinaryIO, toc: Toc, where: str) -> int:
    """Inflate every chunk from its own offset, as a lazy reader does, and check it against its digest;
    the number of chunks checked. A chunk that does not start a member, or has the wrong bytes, raises."""
    size, checked, last_size = blob.seek(0, 2), 0, {}
    for entry in toc.entries:
        kind, name = entry.get("type"), entry.get("name")
        if kind == "reg":
            last_size[name] = entry.get("size", 0)
        if kind not in ("reg", "chunk") or (kind == "reg" and not entry.get("size")):
            continue
        try:
            offset, start = int(entry["offset"]), int(entry.get("chunkOffset", 0))
            length = int(entry.get("chunkSize") or last_size.get(name, 0) - start)
            digest = str(entry["chunkDigest"])
        except (KeyError, TypeError, ValueError):
            raise EstargzError(f"{where}: TOC entry {name!r} lacks a usable offset, size or chunkDigest") from None
        if not 0 < offset < toc.offset or length <= 0:
            raise EstargzError(f"{where}: TOC entry {name!r} points at byte {offset} ({length} bytes), outside "
                               f"the blob's data (TOC at {toc.offset}, {size} bytes)")
        blob.seek(offset)
        data = _read_until(blob, offset, toc.offset, length, where, name)
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise EstargzError(f"{where}: {name!r} at byte {offset}: its {length} bytes do not match {digest}")
        checked += 1
    return checked


def _read_until(blob: BinaryIO, offset: int, end: int, length: int, where: str, name: str) -> bytes:
    inflate, out = zlib.decompressobj(16 + zlib.MAX_WBITS), bytearray()
    while len(out) < length:
        take = min(_COPY, end - blob.tell())
        data = blob.read(take) if take > 0 else b""
        if not data:
            break
        try:
            out += inflate.decompress(data, length - len(out))
        except zlib.error as err:
            raise EstargzError(f"{where}: {name!r}'s chunk at byte {offset} does not inflate: {err}") from None
        if inflate.eof:
            break
    if len(out) < length:
        raise EstargzError(f"{where}: {name!r}'s chunk at byte {offset} gives {len(out)} of {length} bytes "
                           "before its gzip member ends")
    return bytes(out[:length])
