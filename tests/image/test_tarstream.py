"""The header-at-a-time tar codec against Python's tarfile: what tarfile writes in each of its three
formats reads back field for field, what the codec writes tarfile reads back the same, and damaged
streams end in TarStreamError, never a traceback."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.image import tarstream

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
_KINDS = {tarfile.REGTYPE: tarstream.REGULAR, tarfile.DIRTYPE: tarstream.DIRECTORY,
          tarfile.SYMTYPE: tarstream.SYMLINK, tarfile.LNKTYPE: tarstream.HARDLINK,
          tarfile.FIFOTYPE: tarstream.FIFO, tarfile.CHRTYPE: tarstream.CHARDEV}


def tar_of(infos, fmt=tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for info, data in infos:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def info(name, data=b"", kind=tarfile.REGTYPE, **fields):
    item = tarfile.TarInfo(name)
    item.type, item.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(item, key, value)
    return item, data


def read_all(data: bytes):
    reader = tarstream.Reader(io.BytesIO(data))
    out = []
    for member in reader:
        body = bytearray()
        reader.copy_data(body.extend)
        out.append((member, bytes(body)))
    return out


def plain(member: tarstream.Member) -> str:
    """Names compared without a trailing slash: tar writes folders with one, and tarfile drops it
    (from folders and from any PAX path); the codec gives names as they are written."""
    return member.name.rstrip("/")


def test_each_format_reads_back_field_for_field():
    long = "opt/" + "deep/" * 40 + "file.bin"
    items = [info("etc", kind=tarfile.DIRTYPE, mode=0o755), info("etc/hosts", b"127.0.0.1\n", uid=7, gid=8),
             info("bin", kind=tarfile.SYMTYPE, linkname="usr/bin"), info(long, b"x" * 700),
             info("opt/hard", kind=tarfile.LNKTYPE, linkname="etc/hosts"),
             info("run/fifo", kind=tarfile.FIFOTYPE)]
    for fmt in FORMATS.values():
        members = read_all(tar_of(items, fmt))
        assert [(plain(m), m.type, m.linkname, m.uid, m.gid, m.size, data) for m, data in members] == [
            (i.name, _KINDS[i.type], i.linkname, i.uid, i.gid, i.size, d) for i, d in items]


def test_pax_keys_outside_the_header_fields_are_kept_and_large_ids_come_from_pax():
    item, data = info("usr/bin/ping", b"\x7fELF", uid=3_000_000, gid=5, mtime=1700000000,
                      pax_headers={"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00 \x00\x00",
                                   "atime": "1.5"})
    [(member, body)] = read_all(tar_of([(item, data)]))
    assert member.uid == 3_000_000 and member.mtime == 1700000000 and body == b"\x7fELF"
    assert member.pax == {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00 \x00\x00"}


def test_what_the_writer_writes_tarfile_reads_the_same():
    members = [tarstream.Member("./etc/", tarstream.DIRECTORY, mode=0o755, mtime=5),
               tarstream.Member("./" + "a/" * 80 + "f", size=3, uid=65535, gid=1, uname="root"),
               tarstream.Member("./é", size=0, pax={"SCHILY.xattr.user.k": "v"}),
               tarstream.Member("./l", tarstream.SYMLINK, linkname="x" * 300),
               tarstream.Member("./big", size=0, mtime=2**40)]
    sink = io.BytesIO()
    writer = tarstream.Writer(sink)
    for member in members:
        writer.add(member, b"abc" if member.size else None)
    writer.close()
    assert len(sink.getvalue()) % tarstream.RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(sink.getvalue())) as tar:
        got = tar.getmembers()
        assert [m.name for m in got] == ["./etc", "./" + "a/" * 80 + "f", "./é", "./l", "./big"]
        assert tar.extractfile(got[1]).read() == b"abc" and got[1].uid == 65535 and got[1].uname == "root"
        assert got[2].pax_headers["SCHILY.xattr.user.k"] == "v"
        assert got[3].linkname == "x" * 300 and got[4].mtime == 2**40


def test_the_writer_refuses_contents_that_do_not_match_the_header():
    writer = tarstream.Writer(io.BytesIO())
    writer.add(tarstream.Member("./f", size=2))
    with pytest.raises(tarstream.TarStreamError):
        writer.data(b"abc")
    with pytest.raises(tarstream.TarStreamError):
        writer.add(tarstream.Member("./g"))


@pytest.mark.parametrize("cut", [0, 100, 512, 1100, -1024])
def test_a_truncated_stream_is_an_error_that_says_where(cut):
    data = tar_of([info("a", b"y" * 3000), info("b", b"z")])
    with pytest.raises(tarstream.TarStreamError, match="byte"):
        read_all(data[:cut] if cut >= 0 else data[:len(data) + cut - 9216])


def test_sparse_members_are_refused_with_the_fix():
    item, _ = info("sparse")
    item.type = tarfile.GNUTYPE_SPARSE
    data = tar_of([(item, b"")], tarfile.GNU_FORMAT)
    with pytest.raises(tarstream.TarStreamError, match="sparse"):
        read_all(data)


# ---------------------------------------------------------------- hypothesis

_text = st.text(st.sampled_from("ab/._-é\udcff"), min_size=1, max_size=180)
_items = st.lists(st.fixed_dictionaries({
    "name": _text, "data": st.binary(max_size=1500), "link": _text,
    "kind": st.sampled_from(sorted(_KINDS)), "uid": st.integers(0, 2**21 - 1),
    "gid": st.integers(0, 2**21 - 1), "mode": st.integers(0, 0o7777), "mtime": st.integers(0, 2**33 - 1),
    "uname": st.text(st.sampled_from("rot_é"), max_size=40)}), max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_items, st.sampled_from(sorted(FORMATS)))
def test_reader_agrees_with_tarfile_on_what_tarfile_writes(items, fmt):
    infos = []
    for item in items:
        made = info(item["name"], item["data"] if item["kind"] == tarfile.REGTYPE else b"", item["kind"],
                    uid=item["uid"], gid=item["gid"], mode=item["mode"], mtime=item["mtime"],
                    linkname=item["link"] if item["kind"] in (tarfile.SYMTYPE, tarfile.LNKTYPE) else "",
                    uname=item["uname"])
        infos.append(made)
    try:
        data = tar_of(infos, FORMATS[fmt])
    except (ValueError, UnicodeError):
        return  # the format cannot hold it: tarfile refuses, nothing to compare
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tar:
        expected = [(m.name.rstrip("/"), _KINDS[m.type], m.linkname, m.uid, m.gid, m.mode, m.mtime, m.uname,
                     tar.extractfile(m).read() if m.isreg() else b"") for m in tar]
    got = [(plain(m), m.type, m.linkname, m.uid,
            m.gid, m.mode, m.mtime, m.uname, body) for m, body in read_all(data)]
    assert got == expected
    sink = io.BytesIO()
    writer = tarstream.Writer(sink)
    for member, body in read_all(data):
        writer.add(member, body if member.type == tarstream.REGULAR else None)
    writer.close()
    again = [(plain(m), m.type, m.linkname, m.uid,
              m.gid, m.mode, m.mtime, m.uname, body) for m, body in read_all(sink.getvalue())]
    assert again == got


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_items, st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(0, 10**5)))
def test_damaged_streams_raise_tarstreamerror_only(items, flips, cut):
    infos = [info(i["name"], i["data"] if i["kind"] == tarfile.REGTYPE else b"", i["kind"], uid=i["uid"])
             for i in items]
    try:
        data = bytearray(tar_of(infos))
    except (ValueError, UnicodeError):
        return
    for offset, value in flips:
        data[offset % len(data)] = value
    try:
        read_all(bytes(data[:cut] if cut is not None else data))
    except tarstream.TarStreamError as err:
        assert str(err)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_raise_tarstreamerror_only(data):
    try:
        read_all(data)
    except tarstream.TarStreamError as err:
        assert str(err)
