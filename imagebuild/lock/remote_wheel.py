"""Read a wheel's file list and a few of its files at an HTTP(S) URL without downloading the wheel.

Like pip's lazy wheel: a zip ends with its End Of Central Directory record, which says where the
central directory (every member's name, sizes and offset) lies. One range request fetches the tail,
one the directory when the tail does not hold it, and one each member read (rarely two). A server
that ignores Range (200, the whole body) is read once, up to max_size bytes, and serves every read.

    RemoteWheel(url).names(), .read(name, limit)  members stored or deflated, CRC-checked;
                                                   .requests_made and .bytes_read say what it cost
    wheel_files(url, sha256, cache=, members=)    -> WheelFiles; members are exact paths or
        "*.dist-info/FILE" (in the wheel's own dist-info); kept in cache/<sha256>.json, and read
        with zipfile from a full copy at cache/../wheels/<sha256>/*.whl when there is one
    WheelError                                    every failure, naming the URL and what is wrong

The cache key is the sha256 the lock records for the wheel. A partial read cannot verify it (only
the whole file has that hash), so the lock's hash names the bytes read here: trust the lock.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from imagebuild.common import write_atomic
from imagebuild.errors import ImagebuildError

MiB = 1 << 20
MAX_DIRECTORY = 64 * MiB  # far above any wheel's; bounds what a corrupt end record can make us fetch
_EOCD = struct.Struct("<4s4H2LH")  # End Of Central Directory record (22 bytes + comment)
_LOCATOR = struct.Struct("<4sLQL")  # ZIP64 locator, just before the EOCD
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # ZIP64 End Of Central Directory record
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # one central directory entry
_LOCAL = struct.Struct("<4s5H3L2H")  # a member's local file header
_LONGEST_TAIL = _LOCATOR.size + _EOCD.size + 0xFFFF  # the comment is at most 64 KiB
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_DIST_INFO = "*.dist-info/"


class WheelError(ImagebuildError):
    """A wheel that cannot be read as asked; the message names the URL or file and what is wrong."""


@dataclass(frozen=True)
class WheelFiles:
    """Every member's name, and the members asked for (None where the wheel has no such member)."""

    names: tuple[str, ...]
    members: dict[str, bytes | None]


@dataclass(frozen=True)
class _Entry:
    raw_name: bytes
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    offset: int
    header_guess: int  # the local header's length if its extra field is the central one's


class RemoteWheel:
    """A wheel at a URL; its central directory is read when it is made."""

    def __init__(self, url: str, *, session: requests.Session | None = None, size: int | None = None,
                 chunk: int = 64 * 1024, max_size: int = 2 << 30, timeout: float = 60.0):
        self.url = url
        self.requests_made = 0
        self.bytes_read = 0
        self._session = session or requests.Session()
        self._own_session = session is None
        self._size = size
        self._max_size = max_size
        self._timeout = timeout
        self._whole: tempfile.SpooledTemporaryFile | None = None  # once a server ignored Range
        self._tail = (0, b"")  # (where it starts, the bytes): a small wheel's tail is all of it
        try:
            self._entries = self._directory(max(chunk, _LOCATOR.size + _EOCD.size))
        except BaseException:
            self.close()
            raise
        self._by_name = dict(self._entries)  # a name listed twice: the last one, as zipfile reads it

    def __enter__(self) -> RemoteWheel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._whole is not None:
            self._whole.close()
        if self._own_session:
            self._session.close()

    def names(self) -> list[str]:
        return [name for name, _ in self._entries]

    def read(self, name: str, limit: int = 8 * MiB) -> bytes:
        """The member's bytes; limit bounds both what is fetched and what is returned."""
        entry = self._by_name.get(name)
        if entry is None:
            raise self._error(f"no member {name!r}")
        if max(entry.size, entry.compressed_size) > limit:
            raise self._error(f"member {name!r} is {entry.size} bytes ({entry.compressed_size} compressed), "
                              f"over the limit of {limit}")
        if entry.flags & 1:
            raise self._error(f"member {name!r} is encrypted")
        if entry.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise self._error(f"member {name!r} uses compression method {entry.method}; "
                              "only stored (0) and deflate (8) are read")
        room = self._members_end - entry.offset  # members lie before the central directory
        data = self._bytes(entry.offset, min(entry.header_guess + entry.compressed_size, room))
        if len(data) < _LOCAL.size or data[:4] != b"PK\x03\x04":
            raise self._error(f"member {name!r}: no local file header at byte {entry.offset}")
        name_length, extra_length = _LOCAL.unpack_from(data)[9:]
        begin = _LOCAL.size + name_length + extra_length
        if begin + entry.compressed_size > room:
            raise self._error(f"member {name!r} runs into the central directory")
        if data[_LOCAL.size:_LOCAL.size + name_length] != entry.raw_name:
            raise self._error(f"member {name!r}: its local header names another file")
        if len(data) < begin + entry.compressed_size:
            data += self._bytes(entry.offset + len(data), begin + entry.compressed_size - len(data))
        body = data[begin:begin + entry.compressed_size]
        if entry.method == zipfile.ZIP_DEFLATED:
            try:  # one byte more than the directory says shows a size that lies
                body = zlib.decompressobj(-15).decompress(body, entry.size + 1)
            except zlib.error as err:
                raise self._error(f"member {name!r} does not inflate: {err}") from err
        if len(body) != entry.size:
            raise self._error(f"member {name!r} holds {len(body)} bytes, the directory says {entry.size}")
        if zlib.crc32(body) != entry.crc:
            raise self._error(f"member {name!r} fails its CRC-32 check")
        return body

    def _error(self, message: str) -> WheelError:
        return WheelError(f"{self.url}: {message}")

    def _directory(self, chunk: int) -> list[tuple[str, _Entry]]:
        tail = self._bytes(-1, chunk)
        at = _find_end_record(tail)
        if at is None and len(tail) < min(self._size, _LONGEST_TAIL):
            tail = self._bytes(-1, _LONGEST_TAIL)
            at = _find_end_record(tail)
        if at is None:
            raise self._error("not a zip file: no end of central directory record")
        start = self._size - len(tail)
        if at < _LOCATOR.size and start > 0:  # the ZIP64 locator may sit just before the tail
            more = min(_LOCATOR.size, start)
            tail, start, at = self._bytes(start - more, more) + tail, start - more, at + more
        _, _, _, _, count, size, offset, _ = _EOCD.unpack_from(tail, at)
        end = start + at  # the directory ends where the end record begins
        locator = at - _LOCATOR.size
        if locator >= 0 and tail[locator:locator + 4] == b"PK\x06\x07":
            record_at = _LOCATOR.unpack_from(tail, locator)[2]
            if record_at + _EOCD64.size > start + locator:
                raise self._error("the ZIP64 locator points past itself")
            record = self._span(tail, start, record_at, _EOCD64.size)
            if record[:4] != b"PK\x06\x06":
                raise self._error(f"no ZIP64 end of central directory record at byte {record_at}")
            count, size, offset = _EOCD64.unpack(record)[7:]
            end = record_at
        if offset + size > end or size > MAX_DIRECTORY:
            raise self._error(f"the end record's central directory ({size} bytes at {offset}) does not fit "
                              f"before byte {end}")
        self._members_end, self._tail = offset, (start, tail)
        return self._parse(self._span(tail, start, offset, size), count)

    def _span(self, tail: bytes, start: int, offset: int, length: int) -> bytes:
        """length bytes at offset, taken from the tail (which begins at start) where it holds them."""
        head = self._bytes(offset, min(length, start - offset)) if offset < start else b""
        skip = max(offset - start, 0)
        data = head + tail[skip:skip + length - len(head)]
        if len(data) != length:
            raise self._error(f"{length} bytes at byte {offset} lie past the end of the file")
        return data

    def _parse(self, data: bytes, count: int) -> list[tuple[str, _Entry]]:
        entries, at = [], 0
        while at < len(data):
            if data[at:at + 4] != b"PK\x01\x02" or at + _CENTRAL.size > len(data):
                raise self._error(f"central directory entry {len(entries)} is truncated or corrupt")
            fields = _CENTRAL.unpack_from(data, at)
            flags, method, crc, compressed, size, name_length, extra_length, comment_length = (
                fields[3], fields[4], *fields[7:13])
            name_at = at + _CENTRAL.size
            extra_at = name_at + name_length
            at = extra_at + extra_length + comment_length
            if at > len(data):
                raise self._error(f"central directory entry {len(entries)} runs past the directory")
            raw_name = data[name_at:extra_at]
            size, compressed, offset = self._zip64(data[extra_at:extra_at + extra_length],
                                                   size, compressed, fields[16])
            try:
                name = raw_name.decode("utf-8" if flags & 0x800 else "cp437").split("\0", 1)[0]
            except UnicodeDecodeError as err:
                raise self._error(f"central directory entry {len(entries)} has a bad name: {err}") from err
            entries.append((name, _Entry(raw_name, flags, method, crc, compressed, size, offset,
                                         _LOCAL.size + name_length + extra_length)))
        if len(entries) != count:
            raise self._error(f"the central directory holds {len(entries)} entries, the end record says {count}")
        return entries

    def _zip64(self, extra: bytes, *values: int) -> list[int]:
        """The real size, compressed size and offset: each stored as 0xFFFFFFFF is in the ZIP64 extra field."""
        values, at = list(values), 0
        while at + 4 <= len(extra):
            kind, length = struct.unpack_from("<HH", extra, at)
            body, at = extra[at + 4:at + 4 + length], at + 4 + length
            for index in [i for i, value in enumerate(values) if kind == 1 and value == 0xFFFFFFFF]:
                if len(body) < 8:
                    raise self._error("a ZIP64 extra field is too short")
                values[index], body = struct.unpack_from("<Q", body)[0], body[8:]
        return values

    def _bytes(self, offset: int, length: int) -> bytes:
        """length bytes at offset; offset -1 asks for the last length bytes (fewer in a shorter file)."""
        if offset < 0 and self._size is not None:
            offset = max(self._size - length, 0)
            length = self._size - offset
        if length <= 0:
            return b""
        start, tail = self._tail
        if start <= offset and offset + length <= start + len(tail):  # read with the directory
            return tail[offset - start:offset - start + length]
        if self._whole is None:
            data = self._request(offset, length)
            if data is not None:
                return data
        if offset < 0:
            offset = max(self._size - length, 0)
        self._whole.seek(offset)
        return self._whole.read(length)

    def _request(self, offset: int, length: int) -> bytes | None:
        """One range request; None when the server sent the whole body instead (kept in _whole)."""
        wanted = f"bytes=-{length}" if offset < 0 else f"bytes={offset}-{offset + length - 1}"
        self.requests_made += 1
        try:
            with self._session.get(self.url, headers={"Range": wanted, "Accept-Encoding": "identity"},
                                   stream=True, timeout=self._timeout) as reply:
                if reply.status_code == 200:
                    self._whole = self._spool(reply)
                    return None
                if reply.status_code != 206:
                    raise self._error(f"HTTP {reply.status_code} {reply.reason} for {wanted}")
                match = _CONTENT_RANGE.fullmatch(reply.headers.get("Content-Range", ""))
                first, last, total = map(int, match.groups()) if match else (-1, -1, -1)
                expected = (max(total - length, 0), total - 1) if offset < 0 else (offset, offset + length - 1)
                if not match or (first, last) != expected or (self._size or total) != total:
                    raise self._error(f"asked for {wanted} of {self._size or '?'}, the server answered "
                                      f"Content-Range {reply.headers.get('Content-Range')!r}")
                self._size, data = total, bytearray()
                for block in reply.iter_content(1 << 16):
                    self.bytes_read += len(block)
                    data += block
                    if len(data) > last - first + 1:
                        raise self._error(f"the server sent more than the bytes asked for by {wanted}")
        except requests.RequestException as err:
            raise self._error(f"{type(err).__name__}: {err}") from err
        if len(data) != last - first + 1:
            raise self._error(f"the server sent {len(data)} bytes for {wanted}")
        return bytes(data)

    def _spool(self, reply: requests.Response) -> tempfile.SpooledTemporaryFile:
        spool = tempfile.SpooledTemporaryFile(max_size=32 * MiB)
        for block in reply.iter_content(1 << 20):
            self.bytes_read += len(block)
            if spool.tell() + len(block) > self._max_size:
                spool.close()
                raise self._error(f"the server ignored Range and the body is over {self._max_size} bytes")
            spool.write(block)
        if self._size not in (None, spool.tell()):
            spool.close()
            raise self._error(f"the server sent {spool.tell()} bytes, expected {self._size}")
        self._size = spool.tell()
        return spool


def _find_end_record(tail: bytes) -> int | None:
    """Where the last End Of Central Directory record whose comment fits in tail begins."""
    at = len(tail)
    while (at := tail.rfind(b"PK\x05\x06", 0, at)) >= 0:
        if at + _EOCD.size <= len(tail) and at + _EOCD.size + _EOCD.unpack_from(tail, at)[7] <= len(tail):
            return at
    return None


def wheel_files(url: str, sha256: str, *, cache: Path, members: Sequence[str] = (),
                session: requests.Session | None = None) -> WheelFiles:
    """The wheel's names and the members asked for, from cache/<sha256>.json when it holds them all."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise WheelError(f"{url}: {sha256!r} is not a sha256")
    path = Path(cache) / f"{sha256}.json"
    known = _load(path)
    if known is None or any(member not in known.members for member in members):
        copies = sorted((Path(cache).parent / "wheels" / sha256).glob("*.whl"))
        if copies:
            try:
                with zipfile.ZipFile(copies[0]) as archive:
                    known = _collect(url, archive.namelist(), archive.read, members, known)
            except (OSError, EOFError, RuntimeError, ValueError, NotImplementedError, zipfile.BadZipFile,
                    zlib.error) as err:
                raise WheelError(f"{copies[0]}: {type(err).__name__}: {err}") from err
        else:
            with RemoteWheel(url, session=session) as wheel:
                known = _collect(url, wheel.names(), wheel.read, members, known)
        stored = {key: None if data is None else base64.b64encode(data).decode()
                  for key, data in known.members.items()}
        write_atomic(path, json.dumps({"url": url, "sha256": sha256, "names": known.names, "members": stored},
                                      sort_keys=True).encode())
    return WheelFiles(known.names, {member: known.members[member] for member in members})


def _collect(url: str, names: list[str], read: Callable[[str], bytes], members: Sequence[str],
             known: WheelFiles | None) -> WheelFiles:
    found = dict(known.members) if known else {}
    for member in members:
        if member not in found:
            exact = _resolve(url, names, member)
            found[member] = None if exact is None else read(exact)
    return WheelFiles(tuple(names), found)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _resolve(url: str, names: list[str], member: str) -> str | None:
    """An exact path, or "*.dist-info/FILE": FILE in the wheel's own (top-level) dist-info folder."""
    if not member.startswith(_DIST_INFO):
        return member if member in names else None
    suffix = ".dist-info/" + member[len(_DIST_INFO):]
    found = sorted({name for name in names if name.endswith(suffix) and "/" not in name[:-len(suffix)]})
    if len(found) > 1:  # vendored dist-info folders: the wheel's own is named like the wheel file
        wheel = "-".join(unquote(urlsplit(url).path).rsplit("/", 1)[-1].split("-")[:2])
        found = [name for name in found if _normal(name[:-len(suffix)]) == _normal(wheel)]
        if len(found) != 1:
            raise WheelError(f"{url}: cannot tell which dist-info folder holds {member!r}")
    return found[0] if found else None


def _load(path: Path) -> WheelFiles | None:
    """What the cache holds for one wheel; None when it holds nothing usable."""
    try:
        data = json.loads(path.read_text())
        members = {key: None if value is None else base64.b64decode(value, validate=True)
                   for key, value in data["members"].items()}
        return WheelFiles(tuple(str(name) for name in data["names"]), members)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
