"""A wheel's file list and members are read by HTTP range requests, without downloading the wheel.

Real parts only: real wheels from PyPI (pip download, once per session), a real HTTP server on
127.0.0.1 that honours Range (and one that ignores it), zips written by zipfile (comments, a ZIP64
local header) and one in full ZIP64 form, compared member by member with zipfile; negative controls
for HTTP errors, non-zips, truncated directories and bad CRCs; and a property test that any bytes
served as a wheel are read or refused with WheelError, never with another exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import struct
import subprocess
import sys
import threading
import zipfile
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.lock.remote_wheel import RemoteWheel, WheelError, WheelFiles, wheel_files

WHEELS = ("requests==2.32.3", "markupsafe==3.0.2", "numpy==2.1.3")
DIST_INFO = ("*.dist-info/METADATA", "*.dist-info/RECORD")


class Site:
    """What the loopback server serves: files by path, whether it honours Range, a forced status."""

    def __init__(self, ranges: bool = True):
        self.files: dict[str, bytes] = {}
        self.ranges = ranges
        self.status: int | None = None
        self.hits = 0
        self.base = ""
        self._lock = threading.Lock()

    def url(self, name: str, data: bytes | None = None) -> str:
        if data is not None:
            self.files[f"/{name}"] = data
        return f"{self.base}/{name}"

    def count(self) -> None:
        with self._lock:
            self.hits += 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10

    def do_GET(self):
        site: Site = self.server.site
        site.count()
        body = site.files.get(self.path)
        if site.status is not None or body is None:
            return self.reply(site.status or 404, b"no such file\n")
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if not site.ranges or wanted is None:
            return self.reply(200, body)
        first, last = wanted.groups()
        if first:
            first, last = int(first), min(int(last) if last else len(body) - 1, len(body) - 1)
        elif last:
            first, last = max(len(body) - int(last), 0), len(body) - 1
        if first == "" or first > last:  # bytes=-, a start past the end, an empty file
            return self.reply(416, b"", {"Content-Range": f"bytes */{len(body)}"})
        self.reply(206, body[first:last + 1], {"Content-Range": f"bytes {first}-{last}/{len(body)}"})

    def reply(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up early is no error
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serving(ranges: bool = True):
    site = Site(ranges)
    server = Server(("127.0.0.1", 0), Handler)
    server.site = site
    site.base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def site():
    with serving() as served:
        yield served


@pytest.fixture
def plain_site():
    with serving(ranges=False) as served:
        yield served


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """requests (pure Python), markupsafe (small, binary) and numpy (~16 MB) for cp311 manylinux x86_64."""
    folder = tmp_path_factory.mktemp("wheels")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder),
               *WHEELS, "--python-version", "3.11", "--platform", "manylinux_2_17_x86_64"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip download of {WHEELS} took over 600 s; these tests need the real wheels")
    if proc.returncode != 0:
        pytest.fail(f"pip download of {WHEELS} failed; these tests need the real wheels:\n{proc.stderr[-3000:]}")
    found = {path.name.split("-")[0].lower(): path for path in folder.glob("*.whl")}
    assert set(found) == {"requests", "markupsafe", "numpy"}, found
    return found


def dead_url(name: str) -> str:
    """A URL nobody answers: a server that was started and stopped again."""
    with serving() as gone:
        return gone.url(name)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_as_zipfile(wheel: RemoteWheel, data: bytes, limit: int = 8 << 20) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert wheel.names() == archive.namelist()
        for name in archive.namelist():
            assert wheel.read(name, limit=limit) == archive.read(name), name


def zip_bytes(files: dict[str, tuple[bytes, int]], comment: bytes = b"", zip64: str | None = None) -> bytes:
    """A zip written by zipfile; the member named zip64 gets a ZIP64 local header (force_zip64)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, (data, method) in files.items():
            info = zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0))
            info.compress_type = method
            with archive.open(info, "w", force_zip64=name == zip64) as member:
                member.write(data)
        archive.comment = comment
    return out.getvalue()


def zip64_archive(files: dict[str, bytes], comment: bytes = b"") -> bytes:
    """A zip in full ZIP64 form, as one over 4 GiB is written: every size and offset in the central
    directory is 0xFFFFFFFF with the real value in the ZIP64 extra field, and the end record leads
    through the ZIP64 locator to the ZIP64 end record."""
    out, central = bytearray(), bytearray()
    for name, data in files.items():
        raw, crc, offset = name.encode(), zlib.crc32(data), len(out)
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        body = packer.compress(data) + packer.flush()
        extra = struct.pack("<HHQQ", 1, 16, len(data), len(body))
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 45, 0x800, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                           len(raw), len(extra)) + raw + extra + body
        extra = struct.pack("<HHQQQ", 1, 24, len(data), len(body), offset)
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 45, 45, 0x800, 8, 0, 0x21, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(raw), len(extra), 0, 0, 0, 0, 0xFFFFFFFF) + raw + extra
    directory_at, count = len(out), len(files)
    out += central
    record_at = len(out)
    out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(central), directory_at)
    out += struct.pack("<4sLQL", b"PK\x06\x07", 0, record_at, 1)
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF,
                       len(comment)) + comment
    return bytes(out)


# --- real wheels --------------------------------------------------------------------------------

@pytest.mark.parametrize("project", ["requests", "markupsafe"])
def test_names_and_every_member_match_zipfile(wheels, site, project):
    data = wheels[project].read_bytes()
    with RemoteWheel(site.url(wheels[project].name, data), timeout=10) as wheel:
        assert_same_as_zipfile(wheel, data)
        assert wheel.requests_made == site.hits
        if len(data) <= 64 * 1024:  # the first read held the whole wheel
            assert (wheel.requests_made, wheel.bytes_read) == (1, len(data))


@pytest.mark.parametrize("project", ["requests", "markupsafe"])
def test_a_server_that_ignores_range_is_read_once(wheels, plain_site, project):
    data = wheels[project].read_bytes()
    with RemoteWheel(plain_site.url("w.whl", data), timeout=10) as wheel:
        assert_same_as_zipfile(wheel, data)
        assert (plain_site.hits, wheel.requests_made, wheel.bytes_read) == (1, 1, len(data))


def test_a_size_from_the_index_is_asked_for_and_checked(wheels, site):
    data = wheels["requests"].read_bytes()
    url = site.url("w.whl", data)
    with RemoteWheel(url, size=len(data), timeout=10) as wheel:
        assert_same_as_zipfile(wheel, data)
    for wrong in (len(data) - 1, len(data) + 1):
        with pytest.raises(WheelError, match=rf"asked for bytes=\d+-{wrong - 1} of {wrong}, the server answered"):
            RemoteWheel(url, size=wrong, timeout=10)


def test_numpy_dist_info_costs_a_few_requests_and_a_small_part_of_the_wheel(wheels, site):
    data = wheels["numpy"].read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as archive, \
            RemoteWheel(site.url(wheels["numpy"].name, data), timeout=10) as wheel:
        assert wheel.names() == archive.namelist()
        for name in ("numpy-2.1.3.dist-info/METADATA", "numpy-2.1.3.dist-info/RECORD"):
            assert wheel.read(name) == archive.read(name)
        assert wheel.requests_made <= 4 and site.hits == wheel.requests_made
        assert wheel.bytes_read < len(data) / 20, (wheel.bytes_read, len(data))
        largest = max(archive.infolist(), key=lambda info: info.file_size)
        assert largest.file_size > 8 << 20  # over the default limit: refused, then read with a larger one
        with pytest.raises(WheelError, match="over the limit"):
            wheel.read(largest.filename)
        assert wheel.read(largest.filename, limit=64 << 20) == archive.read(largest.filename)


def test_a_small_chunk_reads_markupsafe_dist_info_from_under_half_the_wheel(wheels, site):
    data = wheels["markupsafe"].read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as archive, \
            RemoteWheel(site.url("m.whl", data), chunk=4096, timeout=10) as wheel:
        for name in ("MarkupSafe-3.0.2.dist-info/METADATA", "MarkupSafe-3.0.2.dist-info/RECORD"):
            assert wheel.read(name) == archive.read(name)
        assert wheel.bytes_read < len(data) / 2, (wheel.bytes_read, len(data))


# --- wheel_files and its cache -------------------------------------------------------------------

def test_a_second_wheel_files_reads_nothing_from_the_network(wheels, tmp_path):
    path = wheels["numpy"]
    cache = tmp_path / "wheel-files"
    with serving() as site:
        url = site.url(path.name, path.read_bytes())
        first = wheel_files(url, sha256(path), cache=cache, members=DIST_INFO)
        assert 1 <= site.hits <= 4
    with zipfile.ZipFile(path) as archive:
        assert first.names == tuple(archive.namelist())
        assert first.members == {"*.dist-info/METADATA": archive.read("numpy-2.1.3.dist-info/METADATA"),
                                 "*.dist-info/RECORD": archive.read("numpy-2.1.3.dist-info/RECORD")}
    assert (cache / f"{sha256(path)}.json").is_file()
    # the server is gone: only the cache can answer
    assert wheel_files(url, sha256(path), cache=cache, members=DIST_INFO[:1]) == \
        WheelFiles(first.names, {"*.dist-info/METADATA": first.members["*.dist-info/METADATA"]})
    with pytest.raises(WheelError, match=re.escape(url)):  # a member the cache lacks needs the network
        wheel_files(url, sha256(path), cache=cache, members=["*.dist-info/WHEEL"])


def test_wheel_files_resolves_dist_info_and_reports_missing_members(wheels, site, tmp_path):
    path = wheels["requests"]
    url = site.url(path.name, path.read_bytes())
    wanted = ["*.dist-info/WHEEL", "*.dist-info/entry_points.txt", "requests/__version__.py", "no/such.py"]
    found = wheel_files(url, sha256(path), cache=tmp_path / "c", members=wanted)
    with zipfile.ZipFile(path) as archive:
        assert found.members == {"*.dist-info/WHEEL": archive.read("requests-2.32.3.dist-info/WHEEL"),
                                 "*.dist-info/entry_points.txt": None,
                                 "requests/__version__.py": archive.read("requests/__version__.py"),
                                 "no/such.py": None}
    hits = site.hits
    assert wheel_files(url, sha256(path), cache=tmp_path / "c", members=wanted) == found
    assert site.hits == hits


def test_wheel_files_reads_a_full_local_copy_instead_of_the_network(wheels, tmp_path):
    path, cache = wheels["markupsafe"], tmp_path / "wheel-files"
    copy = tmp_path / "wheels" / sha256(path) / path.name
    copy.parent.mkdir(parents=True)
    copy.write_bytes(path.read_bytes())
    found = wheel_files(dead_url(path.name), sha256(path), cache=cache, members=DIST_INFO)
    with zipfile.ZipFile(path) as archive:
        assert found.names == tuple(archive.namelist())
        assert found.members["*.dist-info/RECORD"] == archive.read("MarkupSafe-3.0.2.dist-info/RECORD")


def test_wheel_files_picks_the_dist_info_named_like_the_wheel(site, tmp_path):
    data = zip_bytes({"pkg/__init__.py": (b"", zipfile.ZIP_STORED),
                      "pkg-1.0.dist-info/METADATA": (b"Name: pkg\n", zipfile.ZIP_DEFLATED),
                      "vendored-2.0.dist-info/METADATA": (b"Name: vendored\n", zipfile.ZIP_DEFLATED)})
    key = hashlib.sha256(data).hexdigest()
    url = site.url("pkg-1.0-py3-none-any.whl", data)
    assert wheel_files(url, key, cache=tmp_path / "a", members=DIST_INFO[:1]).members == \
        {"*.dist-info/METADATA": b"Name: pkg\n"}
    other = site.url("other-3.0-py3-none-any.whl", data)
    with pytest.raises(WheelError, match="cannot tell which dist-info folder holds"):
        wheel_files(other, key, cache=tmp_path / "b", members=DIST_INFO[:1])


def test_a_corrupt_local_copy_is_a_wheel_error_naming_it(tmp_path):
    copy = tmp_path / "wheels" / ("0" * 64) / "broken-1.0-py3-none-any.whl"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"not a zip")
    with pytest.raises(WheelError, match=f"{re.escape(str(copy))}: BadZipFile"):
        wheel_files("http://127.0.0.1:9/broken-1.0-py3-none-any.whl", "0" * 64, cache=tmp_path / "c")


def test_wheel_files_refuses_a_key_that_is_not_a_sha256(tmp_path):
    with pytest.raises(WheelError, match="not a sha256"):
        wheel_files("http://127.0.0.1:9/w.whl", "../../etc", cache=tmp_path)


# --- zip forms wheels rarely use ------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [64, 1024, 64 * 1024])
def test_a_long_comment_and_a_zip64_local_header(site, chunk):
    files = {"a/stored.txt": (b"stored " * 300, zipfile.ZIP_STORED),
             "a/deflated.txt": (b"deflated " * 3000, zipfile.ZIP_DEFLATED),
             "b/zip64.bin": (bytes(range(256)) * 40, zipfile.ZIP_DEFLATED),
             "empty": (b"", zipfile.ZIP_STORED)}
    data = zip_bytes(files, comment=b"c" * 60000, zip64="b/zip64.bin")
    with RemoteWheel(site.url("c.zip", data), chunk=chunk, timeout=10) as wheel:
        assert_same_as_zipfile(wheel, data)


@pytest.mark.parametrize("ranges", [True, False])
@pytest.mark.parametrize("comment", [b"", b"c" * 30], ids=["no-comment", "comment"])  # 64 bytes miss a locator
def test_a_zip64_end_record_and_zip64_extra_fields(ranges, comment):
    files = {"pkg/__init__.py": b"print('hi')\n" * 50, "pkg-1.0.dist-info/METADATA": "Name: pkg\nÜ\n".encode()}
    data = zip64_archive(files, comment)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # the form is one zipfile reads
        assert {name: archive.read(name) for name in archive.namelist()} == files
    with serving(ranges) as served, RemoteWheel(served.url("z.whl", data), chunk=64, timeout=10) as wheel:
        assert_same_as_zipfile(wheel, data)


# --- negative controls ------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [404, 500])
def test_http_errors_name_the_url_and_status(site, status):
    url = site.url("w.whl", b"x")
    site.status = status
    with pytest.raises(WheelError, match=rf"{re.escape(url)}: HTTP {status}"):
        RemoteWheel(url, timeout=10)


def test_an_unreachable_server_is_a_wheel_error():
    url = dead_url("w.whl")
    with pytest.raises(WheelError, match=re.escape(url)):
        RemoteWheel(url, timeout=10)


@pytest.mark.parametrize("data", [b"", b"not a zip at all\n" * 100, b"PK\x05\x06 too short"])
def test_bytes_that_are_not_a_zip(site, data):
    with pytest.raises(WheelError, match="not a zip|HTTP 416"):
        RemoteWheel(site.url("w.whl", data), timeout=10)


def test_a_truncated_central_directory(wheels, site):
    data = wheels["requests"].read_bytes()
    size, offset = struct.unpack_from("<2L", data, len(data) - 10)  # no comment: the end record is last
    cut = data[:offset + size // 2] + data[offset + size:]
    with pytest.raises(WheelError, match="does not fit"):
        RemoteWheel(site.url("cut.whl", cut), timeout=10)
    zeroed = data[:offset + size // 2] + bytes(size - size // 2) + data[offset + size:]
    with pytest.raises(WheelError, match="central directory entry .* truncated or corrupt"):
        RemoteWheel(site.url("zeroed.whl", zeroed), timeout=10)
    count = struct.unpack_from("<H", data, len(data) - 12)[0]
    miscounted = data[:-12] + struct.pack("<H", count - 1) + data[-10:]
    with pytest.raises(WheelError, match=f"holds {count} entries, the end record says {count - 1}"):
        RemoteWheel(site.url("miscounted.whl", miscounted), timeout=10)


@pytest.mark.parametrize("field, value, message", [
    (12, 10, "entry 0 is truncated or corrupt"),  # a directory shorter than one entry
    (16, 0, "entry 0 is truncated or corrupt"),  # a directory that starts at the first local header
    (16, 0xFFFFFFF0, "does not fit before byte"),
    (10, 0, "holds 23 entries, the end record says 0")])
def test_an_end_record_that_lies(wheels, site, field, value, message):
    data = bytearray(wheels["requests"].read_bytes())
    width = 2 if field in (10, 20) else 4
    data[len(data) - 22 + field:len(data) - 22 + field + width] = value.to_bytes(width, "little")
    with pytest.raises(WheelError, match=message):
        RemoteWheel(site.url("lies.whl", bytes(data)), timeout=10)


def test_a_stored_member_with_a_wrong_crc(site):
    payload = b"hello, wheel\n" * 20
    data = bytearray(zip_bytes({"ok.txt": (b"fine", zipfile.ZIP_STORED), "bad.txt": (payload, zipfile.ZIP_STORED)}))
    data[data.index(payload) + 5] ^= 0x20
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive, pytest.raises(zipfile.BadZipFile, match="CRC"):
        archive.read("bad.txt")  # zipfile agrees the member is bad
    with RemoteWheel(site.url("crc.zip", bytes(data)), timeout=10) as wheel:
        assert wheel.read("ok.txt") == b"fine"
        with pytest.raises(WheelError, match=r"crc\.zip: member 'bad.txt' fails its CRC-32 check"):
            wheel.read("bad.txt")


def test_a_local_header_that_names_another_file(site):
    data = zip_bytes({"first.txt": (b"one", zipfile.ZIP_STORED), "other.txt": (b"two", zipfile.ZIP_STORED)})
    data = data.replace(b"first.txt", b"fiRST.txt", 1)  # the local header; the directory still says first.txt
    with zipfile.ZipFile(io.BytesIO(data)) as archive, pytest.raises(zipfile.BadZipFile, match="differ"):
        archive.read("first.txt")  # zipfile agrees
    with RemoteWheel(site.url("names.zip", data), timeout=10) as wheel:
        assert wheel.names() == ["first.txt", "other.txt"] and wheel.read("other.txt") == b"two"
        with pytest.raises(WheelError, match="member 'first.txt': its local header names another file"):
            wheel.read("first.txt")


def test_unsupported_compression_missing_members_and_limits(site):
    data = zip_bytes({"b.txt": (b"bzip2 " * 100, zipfile.ZIP_BZIP2), "big": (bytes(5000), zipfile.ZIP_DEFLATED)})
    with RemoteWheel(site.url("m.zip", data), timeout=10) as wheel:
        with pytest.raises(WheelError, match="compression method 12"):
            wheel.read("b.txt")
        with pytest.raises(WheelError, match="no member 'c.txt'"):
            wheel.read("c.txt")
        with pytest.raises(WheelError, match="over the limit of 4096"):
            wheel.read("big", limit=4096)
        assert wheel.read("big") == bytes(5000)


def test_a_body_over_max_size_is_refused(wheels, plain_site):
    data = wheels["requests"].read_bytes()
    with pytest.raises(WheelError, match="ignored Range and the body is over 1000 bytes"):
        RemoteWheel(plain_site.url("w.whl", data), max_size=1000, timeout=10)


# --- any bytes at all ---------------------------------------------------------------------------------

SMALL_ZIP = zip_bytes({"pkg/__init__.py": ("".join(f"x{i} = {i * i}\n" for i in range(150)).encode(),
                                           zipfile.ZIP_DEFLATED),
                       "pkg/data.bin": (bytes(range(200)), zipfile.ZIP_STORED),
                       "pkg-1.0.dist-info/METADATA": (b"Name: pkg\n", zipfile.ZIP_DEFLATED)},
                      comment=b"small", zip64="pkg/data.bin")


@st.composite
def mutated(draw, base: bytes = SMALL_ZIP) -> bytes:
    """The small zip with a byte or two flipped, or bytes cut, inserted or removed."""
    data = bytearray(base)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "flip", "truncate", "insert", "delete"]))
        if kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data)


# Where each header's fields lie (offset, width): sizes, offsets, name/extra/comment lengths, counts.
FIELDS = {b"PK\x03\x04": [(8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2)],
          b"PK\x01\x02": [(8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (42, 4)],
          b"PK\x05\x06": [(8, 2), (10, 2), (12, 4), (16, 4), (20, 2)]}
HEADER_FIELDS = [(found.start() + at, width) for found in re.finditer(b"|".join(map(re.escape, FIELDS)), SMALL_ZIP)
                 for at, width in FIELDS[found.group()]]


@st.composite
def fields_overwritten(draw) -> bytes:
    """The small zip with one or two header fields set to another value, often a small or extreme one."""
    data = bytearray(SMALL_ZIP)
    for _ in range(draw(st.integers(1, 2))):
        at, width = draw(st.sampled_from(HEADER_FIELDS))
        value = draw(st.integers(0, 64) | st.sampled_from([0xFFFF, 0xFFFFFFFF]) | st.integers(0, (1 << 32) - 1))
        data[at:at + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600) | mutated() | fields_overwritten(),
       chunk=st.sampled_from([22, 100, 64 * 1024]), ranges=st.booleans())
def test_any_bytes_are_read_or_refused_with_a_wheel_error(site, data, chunk, ranges):
    site.ranges = ranges
    url = site.url("any.whl", data)
    with requests.Session() as session:
        try:
            with RemoteWheel(url, session=session, chunk=chunk, timeout=10) as wheel:
                for name in wheel.names():
                    with contextlib.suppress(WheelError):
                        wheel.read(name, limit=1 << 20)
        except WheelError as err:
            assert str(err).startswith(url)
