"""A tar stream read and written one header at a time, for filters that copy gigabytes.

tarfile rebuilds a TarInfo per member on the way in and a PAX header per member on the way out;
on a 15,000-entry rootfs that was most of export-lxc's own CPU. Here a header is parsed from its
512 bytes, file contents move in large chunks through one reused buffer, and the output is POSIX
ustar with a PAX extended header only where a field does not fit (what tarfile's PAX_FORMAT writes).

Read: ustar, GNU (long names, base-256 numbers) and PAX (local and global headers). Sparse members
are refused: no engine's export writes them. Every damaged stream raises TarStreamError.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Callable, Iterator

BLOCK = 512
RECORD = 20 * BLOCK  # what tar pads an archive to
CHUNK = 1 << 20
MAX_EXTENDED = 16 << 20  # a PAX or GNU long-name header bigger than this is damage, not metadata
REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO = b"0", b"1", b"2", b"3", b"4", b"5", b"6"
_FILE_TYPES = {b"0": REGULAR, b"\0": REGULAR, b"7": REGULAR}
_KNOWN_TYPES = {HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO}
_PAX_FIELDS = {"path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime"}
_PAX_DROPPED = {"atime", "ctime", "charset", "comment", "hdrcharset"}
_PAX_RECORD = re.compile(rb"(\d+) ([^=\n]+)=")
_POSIX_MAGIC = b"ustar\x0000"
_ZEROS = bytes(RECORD)


class TarStreamError(Exception):
    """The stream is not a tar archive, or is damaged or truncated; the message says where."""


class Member:
    """One entry: the header's fields after PAX and GNU extensions are applied. `type` is one of
    the module's type constants (a contiguous or old-style file reads as REGULAR), or the unknown
    flag as it came."""

    __slots__ = ("name", "type", "mode", "uid", "gid", "size", "mtime", "linkname", "uname", "gname",
                 "devmajor", "devminor", "pax", "offset", "data_size")

    def __init__(self, name: str, type: bytes = REGULAR, *, mode: int = 0o644, uid: int = 0,
                 gid: int = 0, size: int = 0, mtime: int = 0, linkname: str = "", uname: str = "",
                 gname: str = "", devmajor: int = 0, devminor: int = 0, pax: dict | None = None,
                 offset: int = 0, data_size: int | None = None):
        self.name, self.type, self.mode, self.uid, self.gid = name, type, mode, uid, gid
        self.size, self.mtime, self.linkname, self.uname, self.gname = size, mtime, linkname, uname, gname
        self.devmajor, self.devminor, self.pax, self.offset = devmajor, devminor, pax or {}, offset
        self.data_size = size if data_size is None else data_size  # bytes after the header

    def isreg(self) -> bool:
        return self.type == REGULAR

    def isdir(self) -> bool:
        return self.type == DIRECTORY

    def issym(self) -> bool:
        return self.type == SYMLINK

    def __repr__(self) -> str:
        return f"Member({self.name!r}, {self.type!r}, size={self.size})"


# ---------------------------------------------------------------- reading

def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes, what: str, offset: int) -> int:
    """An octal field (NUL or space terminated), or GNU's base-256 (first byte 0x80 or 0xff)."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xff else value
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    try:
        return int(digits, 8)
    except ValueError:
        raise TarStreamError(f"the header at byte {offset} has {what} {digits[:16]!r}, "
                             "not an octal number") from None


def _pax_records(data: bytes, offset: int) -> dict[str, str]:
    records, position = {}, 0
    while position < len(data) and data[position:position + 1] != b"\0":
        match = _PAX_RECORD.match(data, position)
        length = int(match.group(1)) if match else 0
        end = position + length
        if not match or length < len(match.group(0)) + 1 or end > len(data) or data[end - 1:end] != b"\n":
            raise TarStreamError(f"the PAX header at byte {offset} has a malformed record at its "
                                 f"byte {position}")
        key = match.group(2).decode("utf-8", "surrogateescape")
        value = data[match.end():end - 1]
        records[key] = value.decode("utf-8", "surrogateescape")  # bytes round-trip (xattrs, names)
        position = end
    return records


class Reader:
    """`for member in Reader(stream)`; between members, the caller may take the current member's
    contents with read_data, copy_data or nothing (they are skipped). The stream is read to its end
    after tar's end-of-archive block, so a producer process exits cleanly."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.position = stream, 0
        self._pending = 0  # bytes of the current member's contents and padding not yet read
        self._left = 0  # of those, contents
        self._globals: dict[str, str] = {}
        self._buffer = bytearray(CHUNK)

    def _exact(self, size: int, what: str) -> bytes:
        data = self.stream.read(size)
        while len(data) < size:
            more = self.stream.read(size - len(data))
            if not more:
                raise TarStreamError(f"the stream stops at byte {self.position + len(data)} inside {what}: "
                                     "truncated")
            data += more
        self.position += size
        return data

    def _discard(self, size: int, what: str) -> None:
        view = memoryview(self._buffer)
        while size:
            got = self.stream.readinto(view[:min(size, CHUNK)])
            if not got:
                raise TarStreamError(f"the stream stops at byte {self.position} inside {what}: truncated")
            size -= got
            self.position += got

    def _finish_member(self, what: str = "a member's contents") -> None:
        if self._pending:
            self._discard(self._pending, what)
            self._pending = self._left = 0

    def __iter__(self) -> Iterator[Member]:
        while (member := self.next()) is not None:
            yield member

    def next(self) -> Member | None:
        self._finish_member()
        pax: dict[str, str] = {}
        long_name = long_link = None
        while True:
            offset = self.position
            block = self.stream.read(BLOCK)
            if not block:
                raise TarStreamError(f"the stream stops at byte {offset} without tar's end-of-archive "
                                     "marker: truncated or damaged")
            self.position += len(block)
            if len(block) < BLOCK:
                block += self._exact(BLOCK - len(block), "a header")
            if block == _ZEROS[:BLOCK]:
                if pax or long_name is not None or long_link is not None:
                    raise TarStreamError(f"an extended header ends the archive at byte {offset}")
                while self.stream.read(CHUNK):  # the second zero block and any record padding
                    pass
                return None
            member = self._header(block, offset)
            kind = member.type
            if kind in (b"x", b"g", b"L", b"K"):
                if member.size > MAX_EXTENDED:
                    raise TarStreamError(f"the extended header at byte {offset} claims {member.size} bytes")
                data = self._exact(member.size, f"the extended header at byte {offset}")
                self._discard(-member.size % BLOCK, f"the extended header at byte {offset}")
                if kind == b"x":
                    pax.update(_pax_records(data, offset))
                elif kind == b"g":
                    self._globals.update(_pax_records(data, offset))
                elif kind == b"L":
                    long_name = _text(data)
                else:
                    long_link = _text(data)
                continue
            if kind == b"S" or any(key.startswith("GNU.sparse.") for key in pax):
                raise TarStreamError(f"/{member.name} at byte {offset} is a sparse file; write the "
                                     "archive without --sparse")
            self._extend(member, {**self._globals, **pax}, long_name, long_link)
            self._left = member.data_size
            self._pending = member.data_size + (-member.data_size % BLOCK)
            return member

    def _header(self, block: bytes, offset: int) -> Member:
        stored = _number(block[148:156], "a checksum", offset)
        unsigned = sum(block) - sum(block[148:156]) + 256
        if stored != unsigned and stored != unsigned - 256 * sum(b > 127 for b in block[:148] + block[156:]):
            raise TarStreamError(f"the header at byte {offset} fails its checksum: not a tar archive "
                                 "or damaged")
        name = _text(block[0:100])
        if block[257:265] == _POSIX_MAGIC and block[345:346] != b"\0":
            name = _text(block[345:500]) + "/" + name
        flag = block[156:157]
        kind = _FILE_TYPES.get(flag, flag)
        size = _number(block[124:136], "a size", offset)
        if size < 0:
            raise TarStreamError(f"the header at byte {offset} has a negative size")
        return Member(name, kind, mode=_number(block[100:108], "a mode", offset),
                      uid=_number(block[108:116], "a uid", offset),
                      gid=_number(block[116:124], "a gid", offset), size=size,
                      mtime=_number(block[136:148], "an mtime", offset), linkname=_text(block[157:257]),
                      uname=_text(block[265:297]), gname=_text(block[297:329]),
                      devmajor=_number(block[329:337], "a device major", offset),
                      devminor=_number(block[337:345], "a device minor", offset), offset=offset)

    @staticmethod
    def _extend(member: Member, pax: dict[str, str], long_name: str | None, long_link: str | None) -> None:
        if long_name is not None:
            member.name = long_name
        if long_link is not None:
            member.linkname = long_link
        try:
            member.name = pax.get("path", member.name)
            member.linkname = pax.get("linkpath", member.linkname)
            member.uname, member.gname = pax.get("uname", member.uname), pax.get("gname", member.gname)
            for key in ("size", "uid", "gid"):
                if key in pax:
                    setattr(member, key, int(pax[key]))
            if "mtime" in pax:
                member.mtime = int(float(pax["mtime"]))
        except (ValueError, OverflowError):
            raise TarStreamError(f"the PAX header before byte {member.offset} has a field that is "
                                 "not a number") from None
        if member.size < 0:
            raise TarStreamError(f"the PAX header before byte {member.offset} has a negative size")
        member.pax = {k: v for k, v in pax.items() if k not in _PAX_FIELDS and k not in _PAX_DROPPED}
        # tarfile's rule: contents follow files and types tar does not know; links, folders and
        # devices carry none whatever their size field says.
        member.data_size = 0 if member.type in _KNOWN_TYPES else member.size

    def read_data(self, limit: int) -> bytes:
        """The current member's contents (at most limit bytes are taken into memory)."""
        if self._left > limit:
            raise TarStreamError(f"a member of {self._left} bytes is over the {limit} read here")
        data = self._exact(self._left, "a member's contents")
        self._pending -= self._left
        self._left = 0
        return data

    def copy_data(self, write: Callable[[memoryview], object]) -> None:
        """The current member's contents, chunk by chunk, to write (each chunk valid only during the call)."""
        view = memoryview(self._buffer)
        while self._left:
            got = self.stream.readinto(view[:min(self._left, CHUNK)])
            if not got:
                raise TarStreamError(f"the stream stops at byte {self.position} inside a member's "
                                     "contents: truncated")
            write(view[:got])
            self._left -= got
            self._pending -= got
            self.position += got


# ---------------------------------------------------------------- writing

def _pax_record(key: str, value: str) -> bytes:
    body = b"".join((b" ", key.encode("utf-8", "surrogateescape"), b"=",
                     value.encode("utf-8", "surrogateescape"), b"\n"))
    length = len(body) + 1
    while len(str(length).encode()) + len(body) != length:
        length = len(str(length).encode()) + len(body)
    return str(length).encode() + body


def _octal(value: int, width: int) -> bytes | None:
    """The field as tar's octal digits, or None when it does not fit (then PAX carries it)."""
    if 0 <= value < 8 ** (width - 1):
        return b"%0*o\0" % (width - 1, value)
    return None


def _split_name(raw: bytes) -> tuple[bytes, bytes] | None:
    """ustar's prefix/name split of a long path, or None when none fits."""
    if len(raw) <= 100:
        return b"", raw
    cut = raw.find(b"/", len(raw) - 101)  # the first slash that leaves at most 100 bytes after it
    return (raw[:cut], raw[cut + 1:]) if 0 < cut <= 155 and cut < len(raw) - 1 else None


def _block(name: bytes, mode: int, uid: bytes, gid: bytes, size: bytes, mtime: bytes, kind: bytes,
           link: bytes, uname: bytes, gname: bytes, major: int, minor: int, prefix: bytes) -> bytes:
    head = b"".join((name.ljust(100, b"\0"), b"%07o\0" % mode, uid, gid, size, mtime, b"        ", kind,
                     link.ljust(100, b"\0"), _POSIX_MAGIC, uname.ljust(32, b"\0"), gname.ljust(32, b"\0"),
                     b"%07o\0" % major, b"%07o\0" % minor, prefix.ljust(155, b"\0"), bytes(12)))
    return head[:148] + b"%06o\0 " % sum(head) + head[156:]


def _ascii(text: str, width: int) -> bytes | None:
    raw = text.encode("utf-8", "surrogateescape")
    return raw if len(raw) <= width and raw.isascii() else None


def header(member: Member) -> bytes:
    """The member's header blocks: ustar, preceded by a PAX header for whatever ustar cannot hold."""
    pax = dict(member.pax)
    raw_name = member.name.encode("utf-8", "surrogateescape")
    split = _split_name(raw_name) if raw_name.isascii() else None
    if split is None:
        pax["path"] = member.name
        prefix, name = b"", raw_name[:100].decode("ascii", "replace").encode("ascii", "replace")
    else:
        prefix, name = split
    link = _ascii(member.linkname, 100)
    if link is None:
        pax["linkpath"] = member.linkname
        link = b""
    uname, gname = _ascii(member.uname, 32), _ascii(member.gname, 32)
    if uname is None:
        pax["uname"], uname = member.uname, b""
    if gname is None:
        pax["gname"], gname = member.gname, b""
    numbers = []
    for key, value, width in (("uid", member.uid, 8), ("gid", member.gid, 8), ("size", member.size, 12),
                              ("mtime", member.mtime, 12)):
        field = _octal(value, width)
        if field is None:
            pax[key], field = str(value), b"%0*o\0" % (width - 1, 0)
        numbers.append(field)
    block = _block(name, member.mode & 0o7777, *numbers, member.type, link, uname, gname,
                   member.devmajor if 0 <= member.devmajor < 8 ** 7 else 0,
                   member.devminor if 0 <= member.devminor < 8 ** 7 else 0, prefix)
    if not pax:
        return block
    records = b"".join(_pax_record(key, value) for key, value in pax.items())
    extended = _block(b"././@PaxHeader", 0o644, b"%07o\0" % 0, b"%07o\0" % 0,
                      b"%011o\0" % len(records), b"%011o\0" % 0, b"x", b"", b"", b"", 0, 0, b"")
    return extended + records + bytes(-len(records) % BLOCK) + block


class Writer:
    """Members out: write(member) then its contents through data(); close() ends the archive."""

    def __init__(self, sink: BinaryIO):
        self.sink, self.position, self._left = sink, 0, 0

    def _out(self, data) -> None:
        self.sink.write(data)
        self.position += len(data)

    def add(self, member: Member, contents: bytes | None = None) -> None:
        """A header, and the contents when they are at hand (else data() follows, member.size bytes)."""
        if self._left:
            raise TarStreamError(f"{self._left} bytes of the previous member were not written")
        self._out(header(member))
        self._left = member.size if member.type == REGULAR else 0
        if contents is not None:
            self.data(contents)

    def data(self, chunk) -> None:
        if len(chunk) > self._left:
            raise TarStreamError("more contents than the header's size")
        self._out(chunk)
        self._left -= len(chunk)
        if not self._left:
            self._out(bytes(-self.position % BLOCK))

    def close(self) -> None:
        if self._left:
            raise TarStreamError(f"{self._left} bytes of the last member were not written")
        self._out(bytes(2 * BLOCK))
        self._out(bytes(-self.position % RECORD))
