"""eStargz layers (`--compression estargz`): each file's data starts a gzip member of its own, the TOC names
every chunk's offset and digest, the 51-byte footer points at the TOC. Checked here on the blob itself (by
inflating each chunk from its own offset, as a lazy reader does), for repeatable bytes, for the prioritized
order, and on damaged blobs (one clear error, never a traceback). Real consumers: Docker 20.10 pulls a
pushed eStargz image as the gzip it also is (test below); stargz-snapshotter mounts it lazily
(tests/image/test_estargz_lazy.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.image import compression, estargz, export, oci
from imagebuild.image.compression import ESTARGZ, GZIP, CompressionError
from imagebuild.image.estargz import EstargzError, read_toc, verify_chunks
from imagebuild.image.normalize import LayerError, index_layer
from imagebuild.registry import Connection
from tests.image.test_zstd import isolated, server, true_image  # noqa: F401  (fixtures)

CHUNK = 1 << 16  # small chunks, so a test file spans several


def layer_tar() -> bytes:
    """Directories, a file over several chunks, a small one, an empty one, a hard link, a symlink, an xattr."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("usr", "usr/lib", "usr/lib/python3"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        files = (("usr/lib/libbig.so", hashlib.sha256(b"big").digest() * 9000),  # 288,000 bytes: 5 chunks
                 ("usr/lib/python3/site.py", b"import os\n" * 300),
                 ("usr/lib/python3/__init__.py", b""),
                 ("usr/lib/caps", b"\x7fELF"))
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), oci.REPRO_EPOCH - 99, 0o644
            if name == "usr/lib/caps":
                info.pax_headers = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("usr/lib/libbig.so.1")
        link.type, link.linkname = tarfile.SYMTYPE, "libbig.so"
        tar.addfile(link)
        hard = tarfile.TarInfo("usr/lib/python3/site-copy.py")
        hard.type, hard.linkname = tarfile.LNKTYPE, "usr/lib/python3/site.py"
        tar.addfile(hard)
    return out.getvalue()


def written(tmp_path: Path, data: bytes = b"", prioritized=(), chunk=CHUNK) -> tuple[bytes, estargz.EstargzLayer]:
    plain = io.BytesIO(data or layer_tar())
    index = index_layer(plain, oci.REPRO_EPOCH)
    out = io.BytesIO()
    layer = estargz.write_estargz(plain, index, out, prioritized=prioritized, chunk_size=chunk)
    return out.getvalue(), layer


# ---------------------------------------------------------------- the blob itself

def test_every_gzip_reader_reads_the_tar_and_the_toc_matches_its_annotations(tmp_path):
    blob, layer = written(tmp_path)
    plain = gzip.decompress(blob)  # Python's gzip reads every member, the footer's empty one too
    assert "sha256:" + hashlib.sha256(plain).hexdigest() == layer.diff_id
    assert len(plain) == layer.uncompressed_size
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        names = [m.name for m in tar]
        assert tar.extractfile("usr/lib/libbig.so").read() == hashlib.sha256(b"big").digest() * 9000
        assert tar.getmember("usr/lib/caps").pax_headers["SCHILY.xattr.security.capability"] == "\x01\x00\x00\x02"
    assert names[0] == estargz.NO_PREFETCH_LANDMARK and names[-1] == estargz.TOC_NAME
    toc = read_toc(io.BytesIO(blob), "the blob")
    assert toc.digest == layer.toc_digest == layer.annotations[estargz.TOC_DIGEST]
    assert layer.annotations[estargz.UNCOMPRESSED_SIZE] == str(len(plain))
    by_name = {}
    for entry in toc.entries:
        by_name.setdefault(entry["name"], []).append(entry)
    big = by_name["usr/lib/libbig.so"]
    assert [e["type"] for e in big] == ["reg", "chunk", "chunk", "chunk", "chunk"]
    assert big[0]["digest"] == "sha256:" + hashlib.sha256(hashlib.sha256(b"big").digest() * 9000).hexdigest()
    assert [e.get("chunkOffset", 0) for e in big] == [0, CHUNK, 2 * CHUNK, 3 * CHUNK, 4 * CHUNK]
    assert "chunkSize" not in big[-1]  # the last, short chunk runs to the file's end
    # the hard link's data rides on the path first in sorted order (normalize.py): `site-copy.py`
    assert by_name["usr/lib/python3/site.py"][0] == {"name": "usr/lib/python3/site.py", "type": "hardlink",
                                                     "linkName": "usr/lib/python3/site-copy.py", "mode": 0o644,
                                                     "modtime": oci.rfc3339(oci.REPRO_EPOCH - 99)}
    assert by_name["usr/lib/libbig.so.1"][0] == {"name": "usr/lib/libbig.so.1", "type": "symlink",
                                                   "linkName": "libbig.so", "mode": 0o644}
    caps = by_name["usr/lib/caps"][0]
    assert caps["xattrs"] == {"security.capability": "AQAAAg=="}  # Go's []byte: base64
    assert caps["modtime"] == oci.rfc3339(oci.REPRO_EPOCH - 99)
    assert by_name["usr/"][0]["type"] == "dir"
    # every regular file's data and every chunk inflates on its own, from its offset, to its digest
    chunks = sum(1 for e in toc.entries if e["type"] == "chunk" or (e["type"] == "reg" and e.get("size")))
    assert verify_chunks(io.BytesIO(blob), toc, "the blob") == chunks == 5 + 1 + 1 + 1  # libbig.so in 5, site-copy.py, caps, the landmark


def test_the_footer_is_51_bytes_an_empty_gzip_member_pointing_at_the_toc(tmp_path):
    blob, _ = written(tmp_path)
    tail = blob[-estargz.FOOTER_SIZE:]
    assert gzip.decompress(tail) == b""
    toc = read_toc(io.BytesIO(blob), "the blob")
    assert estargz.parse_footer(tail, "x") == toc.offset
    member = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert member.decompress(blob[toc.offset:])[:len(estargz.TOC_NAME)] == estargz.TOC_NAME.encode()
    assert member.unused_data == tail  # the TOC's member is the last before the footer


def test_the_same_tar_gives_the_same_bytes_and_the_order_changes_them(tmp_path):
    first, layer = written(tmp_path)
    again, same = written(tmp_path)
    assert first == again and layer == same
    moved, other = written(tmp_path, prioritized=["usr/lib/python3/site-copy.py"])
    assert moved != first and other.diff_id != layer.diff_id  # another order, another tar
    assert compression.cache_key(ESTARGZ) != compression.cache_key(ESTARGZ.with_prioritized(["a"]))
    assert compression.cache_key(ESTARGZ.with_prioritized(["a"])) == compression.cache_key(
        ESTARGZ.with_prioritized(["a"]))
    with pytest.raises(CompressionError, match="only estargz"):
        GZIP.with_prioritized(["a"])


def test_prioritized_files_go_first_after_their_parents_and_hard_link_targets(tmp_path):
    blob, layer = written(tmp_path, prioritized=["/usr/lib/python3/site.py", "usr/lib/not-here",
                                                 "usr/lib/libbig.so.1"])
    names = [e["name"] for e in read_toc(io.BytesIO(blob), "b").entries if e["type"] != "chunk"]
    assert names[:7] == ["usr/", "usr/lib/", "usr/lib/python3/", "usr/lib/python3/site-copy.py",
                         "usr/lib/python3/site.py", "usr/lib/libbig.so.1", estargz.PREFETCH_LANDMARK]
    assert layer.prioritized == 6 and estargz.NO_PREFETCH_LANDMARK not in names
    # the hard link's data rides on the path first in sorted order, so the link entry follows it in the tar
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        members = [m.name for m in tar]
        assert members.index("usr/lib/python3/site-copy.py") < members.index("usr/lib/python3/site.py")
        assert tar.getmember("usr/lib/python3/site.py").islnk()
    nothing, none = written(tmp_path, prioritized=["not/in/this/layer"])
    assert none.prioritized == 0 and read_toc(io.BytesIO(nothing), "b").entries[0]["name"] == \
        estargz.NO_PREFETCH_LANDMARK


def test_a_layer_already_holding_a_toc_or_landmark_gets_only_its_own(tmp_path):
    blob, _ = written(tmp_path)
    again, _ = written(tmp_path, data=gzip.decompress(blob))
    names = [e["name"] for e in read_toc(io.BytesIO(again), "b").entries]
    assert names.count(estargz.NO_PREFETCH_LANDMARK) == 1 and estargz.TOC_NAME not in names
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(again))) as tar:
        assert [m.name for m in tar].count(estargz.TOC_NAME) == 1


def test_normalize_writes_estargz_with_its_annotations_and_the_layer_cache_keeps_them(tmp_path):
    raw = tmp_path / "raw.tar"
    raw.write_bytes(layer_tar())
    with open(raw, "rb") as handle:
        layer = export.normalize_layer(handle, tmp_path / "out" / "blobs", epoch=oci.REPRO_EPOCH, compression=ESTARGZ)
    with open(raw, "rb") as handle:
        gz = export.normalize_layer(handle, tmp_path / "out" / "blobs", epoch=oci.REPRO_EPOCH, compression=GZIP)
    assert layer.descriptor.media_type == GZIP.media_type and not gz.descriptor.annotations
    assert set(layer.descriptor.annotations) == {estargz.TOC_DIGEST, estargz.UNCOMPRESSED_SIZE}
    assert layer.diff_id != gz.diff_id  # the TOC entry and the landmark are in the tar
    cache = export.LayerCache(tmp_path / "cache")
    cache.put("e" * 64, oci.REPRO_EPOCH, layer, tmp_path / "out" / "blobs", ESTARGZ)
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", GZIP) is None
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", ESTARGZ.with_prioritized(["x"])) is None
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", ESTARGZ) == layer
    manifest = oci.image_manifest(oci.Descriptor(oci.MEDIA_CONFIG, "sha256:" + "0" * 64, 2), [layer.descriptor])
    assert manifest["layers"][0]["annotations"][estargz.TOC_DIGEST] == layer.descriptor.annotations[estargz.TOC_DIGEST]


def test_a_name_that_is_not_utf8_is_one_clear_error_not_a_traceback(tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tar:
        info = tarfile.TarInfo("opt/caf\udce9.txt")  # the byte 0xE9: Latin-1, not UTF-8
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    raw = tmp_path / "latin1.tar"
    raw.write_bytes(out.getvalue())
    with open(raw, "rb") as handle, pytest.raises(LayerError, match="not UTF-8.*--compression gzip"):
        export.normalize_layer(handle, tmp_path / "blobs", epoch=oci.REPRO_EPOCH, compression=ESTARGZ)
    with open(raw, "rb") as handle:  # gzip carries the name as the tar's bytes
        assert export.normalize_layer(handle, tmp_path / "blobs", epoch=oci.REPRO_EPOCH, compression=GZIP)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.text(alphabet="ab/é_.\udce9", min_size=1, max_size=12),
                             st.binary(max_size=3 * 1024), max_size=6),
       chunk=st.integers(min_value=1, max_value=2048), first=st.lists(st.text(alphabet="ab/é", max_size=6), max_size=3))
def test_any_layer_round_trips_or_is_refused_with_a_layer_error(tmp_path, files, chunk, first):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    try:
        blob, layer = written(tmp_path, out.getvalue() or layer_tar(), prioritized=first, chunk=chunk)
    except (LayerError, EstargzError):  # a path with `..` or that is not UTF-8: one clear error
        return
    toc = read_toc(io.BytesIO(blob), "b")
    assert toc.digest == layer.toc_digest
    verify_chunks(io.BytesIO(blob), toc, "b")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob)), encoding="utf-8", errors="surrogateescape") as tar:
        for member in tar:
            if member.isfile() and member.name in files:
                assert tar.extractfile(member).read() == files[member.name]


# ---------------------------------------------------------------- damaged blobs

def test_a_flipped_byte_in_a_chunk_is_named_and_the_intact_blob_verifies(tmp_path):
    blob, _ = written(tmp_path)
    toc = read_toc(io.BytesIO(blob), "b")
    big = next(e for e in toc.entries if e["type"] == "chunk")
    at = big["offset"] + 40
    damaged = blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1:]
    with pytest.raises(EstargzError, match="usr/lib/libbig.so"):
        verify_chunks(io.BytesIO(damaged), read_toc(io.BytesIO(damaged), "b"), "b")
    assert verify_chunks(io.BytesIO(blob), toc, "b") == 8


def test_a_plain_gzip_layer_is_no_estargz(tmp_path):
    plain = io.BytesIO(layer_tar())
    with pytest.raises(EstargzError, match="no eStargz footer"):
        read_toc(io.BytesIO(gzip.compress(plain.getvalue(), mtime=0)), "gzip.tar.gz")
    with pytest.raises(EstargzError, match="shorter than"):
        read_toc(io.BytesIO(b"\x1f\x8b"), "tiny")


def test_a_toc_offset_that_points_elsewhere_is_refused(tmp_path):
    blob, _ = written(tmp_path)
    toc = read_toc(io.BytesIO(blob), "b")
    wrong = blob[:-estargz.FOOTER_SIZE] + estargz.footer(toc.offset - 10)
    with pytest.raises(EstargzError, match="the TOC"):
        read_toc(io.BytesIO(wrong), "b")
    past = blob[:-estargz.FOOTER_SIZE] + estargz.footer(len(blob) * 2)
    with pytest.raises(EstargzError, match="past the blob's end"):
        read_toc(io.BytesIO(past), "b")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255), cut=st.integers(min_value=0))
def test_any_damaged_or_cut_blob_is_an_estargz_error_or_reads(tmp_path, at, value, cut):
    blob, _ = written(tmp_path)
    at %= len(blob)
    damaged = (blob[:at] + bytes([value]) + blob[at + 1:])[:len(blob) - cut % 200]
    try:
        toc = read_toc(io.BytesIO(damaged), "b")
        verify_chunks(io.BytesIO(damaged), toc, "b")
    except EstargzError:
        pass


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400), offset=st.integers(min_value=0, max_value=2 ** 63 - 1))
def test_arbitrary_bytes_with_a_footer_never_escape_as_a_traceback(data, offset):
    for blob in (data, data + estargz.footer(offset), gzip.compress(data, mtime=0) + estargz.footer(0)):
        try:
            verify_chunks(io.BytesIO(blob), read_toc(io.BytesIO(blob), "b"), "b")
        except EstargzError:
            pass


@settings(max_examples=150, deadline=None)
@given(toc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                            st.sampled_from(["name", "type", "offset", "size", "chunkOffset", "chunkSize",
                                             "chunkDigest", "entries", "version"]), inner, max_size=6),
                        max_leaves=20))
def test_any_toc_json_reads_or_is_refused(toc):
    raw = json.dumps(toc).encode()
    out = io.BytesIO()
    member = tarfile.TarInfo(estargz.TOC_NAME)
    member.size = len(raw)
    body = member.tobuf(tarfile.PAX_FORMAT) + raw + b"\0" * (-len(raw) % 512 + 1024)
    out.write(gzip.compress(b"payload", mtime=0))
    offset = out.tell()
    out.write(gzip.compress(body, mtime=0) + estargz.footer(offset))
    blob = out.getvalue()
    try:
        verify_chunks(io.BytesIO(blob), read_toc(io.BytesIO(blob), "b"), "b")
    except EstargzError:
        pass


# ---------------------------------------------------------------- a consumer that reads it as gzip

@pytest.mark.engine
def test_docker_pulls_the_pushed_estargz_image_as_gzip_and_runs_it(engine, true_image, server, tmp_path):
    """Docker 20.10 has no lazy snapshotter: it must read the blob as the multi-member gzip it is, and its
    diff_ids (the sha256 of what it inflated) must be imagebuild's."""
    from imagebuild.registry import push
    layout = export.export_layout(engine, true_image, tmp_path / "layout", compression="estargz", cache=False)
    again = export.export_layout(engine, true_image, tmp_path / "again", compression="estargz", cache=False)
    gz = export.export_layout(engine, true_image, tmp_path / "gzip", cache=False)
    assert layout.manifest_digest == again.manifest_digest != gz.manifest_digest
    assert all(estargz.TOC_DIGEST in d.annotations for d in layout.layers) and layout.layers
    ref = f"{server.host}/team/estargz:{os.getpid()}"
    assert push(tmp_path / "layout", ref, Connection(insecure_http=True)).digest == layout.manifest_digest
    docker = engine.command()
    try:
        pulled = subprocess.run([*docker, "pull", "-q", ref], capture_output=True, text=True)
        assert pulled.returncode == 0, pulled.stderr
        said = subprocess.run([*docker, "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                              capture_output=True, text=True, check=True).stdout
        assert json.loads(said) == list(layout.diff_ids)
        ran = subprocess.run([*docker, "run", "--rm", "--network", "none", ref, "/usr/bin/true"],
                             capture_output=True, text=True)
        failed = subprocess.run([*docker, "run", "--rm", "--network", "none", ref, "/usr/bin/false"],
                                capture_output=True, text=True)
        assert ran.returncode == 0 and failed.returncode == 1, (ran.stderr, failed.stderr)
    finally:
        subprocess.run([*docker, "rmi", "-f", ref], capture_output=True)


def test_estargz_has_its_own_lock_tag_and_push_record_whatever_its_prefetch_list():
    from imagebuild.flows import built
    from imagebuild.flows.by_lock import lock_tag
    lock = "e5" * 32
    listed = ESTARGZ.with_prioritized(["usr/bin/python3"])
    assert lock_tag(lock, "estargz") == lock_tag(lock, listed) == f"lock-{lock}-estargz"
    built.record_push(lock, "127.0.0.1:5000/team/x", "sha256:" + "3" * 64, listed)
    built.record_push(lock, "127.0.0.1:5000/team/x", "sha256:" + "4" * 64, GZIP)
    assert built.pushed_digest(lock, "127.0.0.1:5000/team/x", "estargz") == "sha256:" + "3" * 64
    assert built.pushed_digest(lock, "127.0.0.1:5000/team/x") == "sha256:" + "4" * 64


@pytest.mark.engine
def test_build_by_lock_pushes_estargz_under_its_own_lock_tag_and_finds_it_again(engine, true_image, server, tmp_path):
    from imagebuild.flows.by_lock import RegistryTarget, lock_tag, push_by_lock, reuse_by_lock
    from tests.image.test_zstd import LOCK
    target = RegistryTarget(f"{server.host}/team/by-lock", Connection(insecure_http=True), compression="estargz")
    smoke = {"ok": True, "checks": [{"name": "true", "status": "pass"}]}
    hit = push_by_lock(engine, true_image, target, LOCK, "estargz-run", smoke)
    assert hit.lock_reference == f"{server.host}/team/by-lock:{lock_tag(LOCK, 'estargz')}"
    again = export.export_layout(engine, true_image, tmp_path / "again", compression="estargz", cache=False)
    assert hit.digest == again.manifest_digest
    said: list[str] = []
    found = reuse_by_lock(target, LOCK, "next-run", said.append, expected=hit.digest)
    assert found is not None and found.digest == hit.digest, said
    gzip_target = RegistryTarget(f"{server.host}/team/by-lock", Connection(insecure_http=True))
    assert reuse_by_lock(gzip_target, LOCK, "gzip-run", said.append) is None
