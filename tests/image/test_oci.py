"""imagebuild.image.oci: layer normalization, saved-image reading, layout writing and reading.

These tests make their own tars and layouts on disk; the engine round trip is in test_repro_build.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.image import export, oci
from imagebuild.image.layout import read_image
from imagebuild.image.normalize import LayerError

EPOCH = oci.REPRO_EPOCH
LATE = EPOCH + 12345  # "build time": after the epoch, so it is clamped


def member(name, kind=tarfile.REGTYPE, data=b"", mtime=LATE, mode=0o644, uid=0, gid=0, link="",
           pax=None, uname="root", gname="root"):
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.mode, info.uid, info.gid = kind, mtime, mode, uid, gid
    info.uname, info.gname, info.linkname = uname, gname, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.pax_headers = dict(pax or {})
    return info, data


def make_tar(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return out.getvalue()


def sample_members(order=1, mtime=LATE):
    members = [
        member("opt/", tarfile.DIRTYPE, mode=0o755, mtime=mtime),
        member("opt/b.txt", data=b"bee\n", mtime=mtime, uid=1000, gid=1000, uname="me", gname="us"),
        member("opt/a.txt", data=b"ay\n", mtime=mtime,
               pax={"atime": "1.5", "ctime": "2.5", "SCHILY.xattr.user.k": "v"}),
        member("opt/old.txt", data=b"old\n", mtime=1000),  # before the epoch: kept as it is
        member("opt/z-target", data=b"shared\n", mtime=mtime),
        member("opt/a-link", tarfile.LNKTYPE, link="opt/z-target", mtime=mtime),  # sorts before its target
        member("opt/sym", tarfile.SYMTYPE, link="a.txt", mtime=mtime),
        member("opt/.wh.gone", mtime=mtime),
        member("opt/sub/", tarfile.DIRTYPE, mode=0o755, mtime=mtime),
        member("opt/sub/.wh..wh..opq", mtime=mtime),
    ]
    return members[::order]


def normalize_bytes(data: bytes, tmp_path: Path, epoch=EPOCH) -> export.LayerBlob:
    tmp_path.mkdir(parents=True, exist_ok=True)
    raw = tmp_path / f"raw-{hashlib.sha256(data).hexdigest()[:8]}.tar"
    raw.write_bytes(data)
    with open(raw, "rb") as handle:
        return export.normalize_layer(handle, tmp_path / "blobs", epoch=epoch)


def read_blob_tar(tmp_path: Path, layer: export.LayerBlob) -> list[tarfile.TarInfo]:
    blob = oci.blob_path(tmp_path, layer.descriptor.digest).read_bytes()
    plain = gzip.decompress(blob)
    assert "sha256:" + hashlib.sha256(plain).hexdigest() == layer.diff_id
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        return tar.getmembers()


def test_normalized_layer_is_sorted_clamped_and_anonymous(tmp_path):
    layer = normalize_bytes(make_tar(sample_members()), tmp_path)
    members = read_blob_tar(tmp_path, layer)
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {"opt/.wh.gone", "opt/sub/.wh..wh..opq"} <= set(names)  # whiteouts kept
    by_name = {m.name: m for m in members}
    assert by_name["opt/b.txt"].mtime == EPOCH and by_name["opt/old.txt"].mtime == 1000
    assert all(m.uname == "" and m.gname == "" for m in members)
    assert (by_name["opt/b.txt"].uid, by_name["opt/b.txt"].gid) == (1000, 1000)
    assert by_name["opt/a.txt"].pax_headers == {"SCHILY.xattr.user.k": "v"}  # no atime/ctime
    # the hard link group is carried by the first path in sorted order
    assert by_name["opt/a-link"].isfile() and by_name["opt/z-target"].islnk()
    assert by_name["opt/z-target"].linkname == "opt/a-link"
    assert by_name["opt/sym"].linkname == "a.txt"


def test_hard_links_still_extract_as_one_file(tmp_path):
    layer = normalize_bytes(make_tar(sample_members()), tmp_path)
    plain = gzip.decompress(oci.blob_path(tmp_path, layer.descriptor.digest).read_bytes())
    out = tmp_path / "x"
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        tar.extractall(out, filter="tar")
    assert (out / "opt/z-target").read_bytes() == b"shared\n"
    assert os.path.samefile(out / "opt/z-target", out / "opt/a-link")


def test_order_and_build_time_do_not_change_the_digests(tmp_path):
    first = normalize_bytes(make_tar(sample_members(1, LATE)), tmp_path / "a")
    second = normalize_bytes(make_tar(sample_members(-1, LATE + 999)), tmp_path / "b")
    assert first == second


def test_gnu_and_pax_input_give_one_layer(tmp_path):
    plain = [m for m in sample_members() if not m[0].pax_headers]  # GNU tars carry no xattrs
    assert normalize_bytes(make_tar(plain, tarfile.GNU_FORMAT), tmp_path / "g") == \
        normalize_bytes(make_tar(plain[::-1]), tmp_path / "p")


def test_gzip_has_no_name_and_no_time(tmp_path):
    layer = normalize_bytes(make_tar(sample_members()), tmp_path)
    head = oci.blob_path(tmp_path, layer.descriptor.digest).read_bytes()[:10]
    assert head[:3] == b"\x1f\x8b\x08" and head[3] == 0  # FLG: no FNAME, no comment
    assert head[4:8] == b"\0\0\0\0"  # MTIME


def test_gzip_input_layers_are_inflated(tmp_path):
    plain = make_tar(sample_members())
    assert normalize_bytes(gzip.compress(plain, mtime=5), tmp_path / "g") == \
        normalize_bytes(plain, tmp_path / "p")


def test_root_entry_and_dot_slash_prefixes_are_dropped(tmp_path):
    layer = normalize_bytes(make_tar([member("./", tarfile.DIRTYPE), member("./etc/x", data=b"1")]),
                            tmp_path)
    assert [m.name for m in read_blob_tar(tmp_path, layer)] == ["etc/x"]


def test_duplicate_paths_keep_the_last(tmp_path):
    layer = normalize_bytes(make_tar([member("a", data=b"one"), member("a", data=b"two")]), tmp_path)
    assert [m.size for m in read_blob_tar(tmp_path, layer)] == [3]
    blob = gzip.decompress(oci.blob_path(tmp_path, layer.descriptor.digest).read_bytes())
    assert b"two" in blob and b"one" not in blob


@pytest.mark.parametrize("bad, message", [
    (make_tar([member("../escape", data=b"x")]), "unsafe path"),
    (make_tar([member("a", data=b"x" * 2000)])[:1024], "truncated"),
    (make_tar([member("a", data=b"x")]) + b"\x01" * 512 + b"\0" * 1024, "damaged"),
    (b"", "not a readable layer tar"),
])
def test_damaged_layers_are_clear_errors(tmp_path, bad, message):
    with pytest.raises(LayerError, match=message):
        normalize_bytes(bad, tmp_path)


def test_a_damaged_header_after_the_first_is_not_silently_the_end(tmp_path):
    good = make_tar([member("a", data=b"x"), member("b", data=b"y")])
    broken = good[:1024] + b"garbage!" + good[1032:]  # the second header's checksum no longer holds
    with pytest.raises(LayerError, match="damaged"):
        normalize_bytes(broken, tmp_path)


# A gzip layer whose deflate data is damaged: zlib raises its own error, which is no OSError (2026-12-05 it
# escaped as `zlib.error: Error -3 while decompressing data: invalid distances set`).
_GZIPPED = gzip.compress(make_tar([member("a", data=os.urandom(1 << 16) + b"x" * 50_000)]), mtime=0)
_BAD_DEFLATE = _GZIPPED[:40] + b"\0" * 20 + _GZIPPED[60:]


def test_a_gzip_layer_with_damaged_deflate_data_is_one_clear_error_and_the_intact_one_reads(tmp_path):
    from imagebuild.image.compression import GZIP, CompressionError, decompress_bytes, decompressed
    assert normalize_bytes(_GZIPPED, tmp_path / "good").diff_id  # the negative control
    for bad in (_BAD_DEFLATE, _GZIPPED[:-30]):
        with pytest.raises(LayerError, match="a gzip layer that does not decompress"):
            normalize_bytes(bad, tmp_path / "bad")
        with pytest.raises(CompressionError, match="bad.gz: a gzip blob that does not inflate"):
            with decompressed(io.BytesIO(bad), GZIP, "bad.gz") as plain:
                while plain.read(1 << 16):
                    pass
        with pytest.raises(CompressionError, match="bad.gz: a gzip blob that does not inflate"):
            decompress_bytes(bad, "bad.gz")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0), value=st.integers(0, 255), cut=st.integers(0, 64))
def test_any_damaged_or_cut_gzip_layer_is_a_layer_error_or_reads(tmp_path, at, value, cut):
    data = bytearray(_GZIPPED[:len(_GZIPPED) - cut])
    data[at % len(data)] = value
    try:
        normalize_bytes(bytes(data), tmp_path)
    except LayerError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=4096))
def test_arbitrary_bytes_never_escape_as_a_traceback(tmp_path, data):
    try:
        normalize_bytes(data, tmp_path)
    except LayerError:
        pass


_VALID = make_tar(sample_members())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=8),
       cut=st.integers(0, len(_VALID)))
def test_garbled_tars_are_normalized_or_refused(tmp_path, edits, cut):
    data = bytearray(_VALID[:cut])
    for offset, value in edits:
        if offset < len(data):
            data[offset] = value
    try:
        layer = normalize_bytes(bytes(data), tmp_path)
    except LayerError:
        return
    read_blob_tar(tmp_path, layer)  # what was accepted is a readable tar


# ---------------------------------------------------------------- saved images and layouts

def saved_archive(layers: list[bytes], config: dict, extra_json=True) -> bytes:
    """A `docker save` archive as Docker 20.10 writes it: layer dirs first, manifest.json last."""
    names, members = [], []
    for i, data in enumerate(layers):
        names.append(f"{i:064x}/layer.tar")
        members += [member(f"{i:064x}/VERSION", data=b"1.0"), member(names[-1], data=data)]
    members.append(member("cafe.json", data=json.dumps(config).encode()))
    manifest = [{"Config": "cafe.json", "RepoTags": ["x:1"], "Layers": names}]
    members += [member("manifest.json", data=json.dumps(manifest).encode())]
    return make_tar(members)


def engine_config(diff_ids=2):
    return {"architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00.123Z",
            "container": "abc", "docker_version": "20.10",
            "config": {"Env": ["A=1"], "Cmd": ["python"], "Labels": {"l": "v"}, "Image": "sha256:aa",
                       "OnBuild": None, "WorkingDir": ""},
            "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "FROM x"}] * diff_ids,
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64] * diff_ids}}


def export_archive(archive: bytes, out: Path, ref_name="1") -> export.LayoutResult:
    def normalize(name, stream):
        raw = out.parent / f"spill-{name.replace('/', '_')}"
        raw.write_bytes(stream.read())
        with open(raw, "rb") as handle:
            return export.normalize_layer(handle, out / "blobs", epoch=EPOCH)

    out.mkdir(parents=True)
    saved = export.read_saved(io.BytesIO(archive), normalize)
    return export.write_image(out, saved.config, saved.layers, epoch=EPOCH, ref_name=ref_name)


def test_saved_image_to_layout_is_standard_and_readable(tmp_path):
    archive = saved_archive([make_tar(sample_members()), make_tar([member("etc/x", data=b"1")])],
                            engine_config())
    result = export_archive(archive, tmp_path / "layout")
    layout = read_image(tmp_path / "layout")
    assert layout.manifest_digest == result.manifest_digest and layout.diff_ids == result.diff_ids
    config = layout.config
    assert config["created"] == oci.rfc3339(EPOCH) == "2023-11-14T22:13:20Z"
    assert config["config"] == {"Env": ["A=1"], "Cmd": ["python"], "Labels": {"l": "v"}}
    assert config["history"] == [{"created_by": "FROM x"}] * 2  # no dates, no comments
    index = json.loads((tmp_path / "layout/index.json").read_text())
    assert index["manifests"][0]["annotations"] == {oci.REF_NAME: "1"}


def test_two_exports_of_differently_timed_saves_agree(tmp_path):
    one = saved_archive([make_tar(sample_members(1, LATE))], engine_config(1))
    later = engine_config(1) | {"created": "2027-05-05T00:00:00Z"}
    two = saved_archive([make_tar(sample_members(-1, LATE + 50))], later)
    a, b = export_archive(one, tmp_path / "a"), export_archive(two, tmp_path / "b")
    assert (a.manifest_digest, a.diff_ids) == (b.manifest_digest, b.diff_ids)


@pytest.mark.needs_tool("oci-image-tool", "umoci", package="oci-image-tool umoci")
def test_layout_passes_oci_image_tool_and_umoci_unpacks_it(tmp_path):
    export_archive(saved_archive([make_tar(sample_members())], engine_config(1)), tmp_path / "layout")
    check = subprocess.run(["oci-image-tool", "validate", "--type", "image", str(tmp_path / "layout")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unpack = subprocess.run(["umoci", "unpack", "--image", f"{tmp_path / 'layout'}:1",
                             str(tmp_path / "bundle")], capture_output=True, text=True)
    assert unpack.returncode == 0, unpack.stderr
    rootfs = tmp_path / "bundle/rootfs"
    assert (rootfs / "opt/a.txt").read_bytes() == b"ay\n"
    assert os.path.samefile(rootfs / "opt/a-link", rootfs / "opt/z-target")


def test_layer_cache_reuses_a_blob_only_for_the_same_input(tmp_path):
    cache = export.LayerCache(tmp_path / "cache")
    (tmp_path / "l1/blobs").mkdir(parents=True)
    layer = normalize_bytes(make_tar(sample_members()), tmp_path / "l1")
    cache.put("ab" * 32, EPOCH, layer, tmp_path / "l1/blobs")
    assert cache.get("ab" * 32, EPOCH, tmp_path / "l2/blobs") == layer
    assert oci.blob_path(tmp_path / "l2", layer.descriptor.digest).is_file()
    assert cache.get("ab" * 32, EPOCH + 1, tmp_path / "l3/blobs") is None
    assert cache.get("cd" * 32, EPOCH, tmp_path / "l3/blobs") is None


@pytest.mark.parametrize("archive, message", [
    (b"not a tar at all" * 40, "not a readable saved image"),
    (make_tar([member("manifest.json", data=b"[]")]), "exactly one image"),
    (make_tar([member("manifest.json", data=b"{nope")]), "not valid JSON"),
    (make_tar([member("manifest.json", data=json.dumps(
        [{"Config": "c.json", "Layers": ["l/layer.tar"]}]).encode()),
        member("c.json", data=b"{}")]), "not in the archive"),
])
def test_bad_saved_images_are_clear_errors(archive, message):
    with pytest.raises(oci.LayoutError, match=message):
        export.read_saved(io.BytesIO(archive), lambda name, stream: stream.read())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
descriptor_like = st.fixed_dictionaries(
    {"mediaType": st.sampled_from([oci.MEDIA_MANIFEST, "", 3]),
     "digest": st.sampled_from(["sha256:" + "a" * 64, "sha256:" + "A" * 64, "md5:x", None]),
     "size": st.sampled_from([0, 5, -1, True, "7"])},
    optional={"annotations": json_values, "artifactType": json_values})


@settings(max_examples=300, deadline=None)
@given(value=json_values | st.fixed_dictionaries(
    {"schemaVersion": st.sampled_from([2, 1, "2"]),
     "manifests": st.lists(descriptor_like | json_values, max_size=3)}))
def test_index_json_from_outside_is_parsed_or_refused(value):
    try:
        manifests = oci.parse_index(json.dumps(value).encode())
    except oci.LayoutError:
        return
    assert all(isinstance(d, oci.Descriptor) for d in manifests)


@settings(max_examples=300, deadline=None)
@given(value=json_values | st.fixed_dictionaries(
    {"schemaVersion": st.just(2), "config": descriptor_like | json_values,
     "layers": st.lists(descriptor_like, max_size=3) | json_values},
    optional={"subject": descriptor_like | json_values}), raw=st.binary(max_size=64))
def test_manifest_json_from_outside_is_parsed_or_refused(value, raw):
    for data in (json.dumps(value).encode(), raw):
        try:
            oci.parse_manifest(data, "m")
        except oci.LayoutError:
            pass


@settings(max_examples=300, deadline=None)
@given(config=st.dictionaries(st.sampled_from(["config", "history", "architecture", "os", "variant",
                                                "rootfs", "created"]), json_values, max_size=6))
def test_any_engine_config_normalizes_without_error(config):
    out = export.normalized_config(config, ["sha256:" + "0" * 64], EPOCH)
    assert out["created"] == oci.rfc3339(EPOCH) and out["rootfs"]["diff_ids"] == ["sha256:" + "0" * 64]
    json.dumps(out)


platform_like = st.fixed_dictionaries(
    {"os": st.sampled_from(["linux", "", 3]), "architecture": st.sampled_from(["arm64", None, "amd64"])},
    optional={"variant": st.sampled_from(["v8", 8, ""])})
entry_like = st.fixed_dictionaries(
    {"mediaType": st.sampled_from([oci.MEDIA_MANIFEST, oci.MEDIA_INDEX, 3]),
     "urls": st.sampled_from([[], ["https://x"], "https://x", [3]]),
     "digest": st.sampled_from(["sha256:" + "a" * 64, "sha256:xyz", None]),
     "size": st.sampled_from([0, 556, -1, True])},
    optional={"platform": platform_like | json_values, "annotations": json_values})
index_like = json_values | st.fixed_dictionaries(
    {"schemaVersion": st.sampled_from([2, "2"]), "manifests": st.lists(entry_like | json_values, max_size=3)},
    optional={"mediaType": st.sampled_from([oci.MEDIA_INDEX, oci.MEDIA_MANIFEST, None])})


@settings(max_examples=300, deadline=None)
@given(value=index_like, raw=st.binary(max_size=64))
def test_an_image_index_from_outside_is_parsed_or_refused(value, raw):
    for data in (json.dumps(value).encode(), raw):
        try:
            entries = oci.parse_image_index(data, "index")
        except oci.LayoutError:
            continue
        assert all(isinstance(d, oci.Descriptor) and (p is None or isinstance(p, oci.Platform)) for d, p in entries)


_ARCHIVE = saved_archive([make_tar(sample_members())], engine_config(1))


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(0, len(_ARCHIVE)),
       edits=st.lists(st.tuples(st.integers(0, len(_ARCHIVE) - 1), st.integers(0, 255)), max_size=6))
def test_garbled_saved_images_are_read_or_refused(cut, edits):
    data = bytearray(_ARCHIVE[:cut])
    for offset, value in edits:
        if offset < len(data):
            data[offset] = value
    try:
        export.read_saved(io.BytesIO(bytes(data)), lambda name, stream: stream.read())
    except (oci.LayoutError, LayerError):
        pass
