"""imagebuild.image.layout, the one OCI layout reader: on layouts real tools wrote (umoci, skopeo with
OCI and with Docker media types, imagebuild's own export), on an image index over them, and on any
damage or any JSON in their place: read, or one LayoutError naming the file and what is wrong."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.image import oci, verify
from imagebuild.image.layout import read_image, read_layout
from imagebuild.image.oci import LayoutError
from tests.image.test_oci import engine_config, export_archive, json_values, make_tar, member, saved_archive
from tests.json_fuzz import replace_one_field
from tests.conftest import missing_tool

SKOPEO_FLAGS = ("copy", "--insecure-policy", "-q")


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tool_layouts(tmp_path_factory):
    """umoci's layout of a one-file image (ref name 1), skopeo's copy of it beside it (ref name 2), and
    skopeo's copy of it with Docker's media types (dock)."""
    missing_tool("umoci", "skopeo", package="umoci skopeo")
    root = tmp_path_factory.mktemp("tools")
    lay, bundle = root / "umoci", root / "bundle"
    run("umoci", "init", "--layout", str(lay))
    run("umoci", "new", "--image", f"{lay}:1")
    run("umoci", "unpack", "--rootless", "--image", f"{lay}:1", str(bundle))
    (bundle / "rootfs" / "hello").write_text("hi\n")
    run("umoci", "repack", "--image", f"{lay}:1", str(bundle))
    two = root / "two"
    shutil.copytree(lay, two)
    run("skopeo", *SKOPEO_FLAGS, f"oci:{two}:1", f"oci:{two}:2")
    run("skopeo", *SKOPEO_FLAGS, "--format", "v2s2", f"oci:{lay}:1", f"oci:{root / 'dock'}:dock")
    return {"umoci": lay, "two": two, "dock": root / "dock"}


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """imagebuild's own export of a saved image (two layers)."""
    out = tmp_path_factory.mktemp("ours") / "layout"
    export_archive(saved_archive([make_tar([member("etc/a", data=b"1")]), make_tar([member("etc/b", data=b"2")])],
                                 engine_config(2)), out)
    return out


def test_umoci_and_skopeo_layouts_are_read(tool_layouts):
    image = read_image(tool_layouts["umoci"])
    assert image.manifest.media_type == oci.MEDIA_MANIFEST and len(image.layers) == 1
    assert image.manifest_digest == "sha256:" + hashlib.sha256(image.image.data).hexdigest()
    assert [b.digest for b in image.image.blobs] == [image.image.config.digest, image.layers[0].digest]
    assert verify.layout_file(tool_layouts["umoci"], "hello") == b"hi\n"  # its layer, read through layer_stream

    docker = read_image(tool_layouts["dock"])  # Docker's manifest and layer media types
    assert docker.manifest.media_type == oci.DOCKER_MANIFEST
    assert verify.layout_file(tool_layouts["dock"], "hello") == b"hi\n"  # a Docker gzip layer


def test_a_name_picks_one_of_several_images(tool_layouts):
    with pytest.raises(LayoutError, match=r"expected one image, found 2 \(names: '1', '2'\)"):
        read_layout(tool_layouts["two"])
    assert read_image(tool_layouts["two"], "2").manifest_digest == read_image(tool_layouts["umoci"]).manifest_digest
    with pytest.raises(LayoutError, match="expected one image named '3', found 0"):
        read_layout(tool_layouts["two"], "3")


def _add_index(layout: Path, entries: list[dict], name: str = "multi") -> str:
    data = oci.canonical_json({"schemaVersion": 2, "mediaType": oci.MEDIA_INDEX, "manifests": entries})
    digest = oci.write_blob(layout, data)
    oci.write_index(layout, [oci.Descriptor(oci.MEDIA_INDEX, digest, len(data), {oci.REF_NAME: name})])
    return digest


def test_an_index_over_real_images_is_read_with_each_platform(tool_layouts, tmp_path):
    layout = tmp_path / "multi"
    shutil.copytree(tool_layouts["umoci"], layout)
    for blob in (tool_layouts["dock"] / "blobs" / "sha256").iterdir():
        shutil.copy(blob, layout / "blobs" / "sha256" / blob.name)
    oci_entry, docker_entry = (json.loads((tool_layouts[n] / "index.json").read_text())["manifests"][0]
                               for n in ("umoci", "dock"))
    digest = _add_index(layout, [{**oci_entry, "platform": {"os": "linux", "architecture": "amd64"}},
                                 {**docker_entry, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}])
    contents = read_layout(layout)
    assert contents.image.digest == digest and contents.image.is_index
    assert [(str(c.platform), c.media_type) for c in contents.image.children] == [
        ("linux/amd64", oci.MEDIA_MANIFEST), ("linux/arm64/v8", oci.DOCKER_MANIFEST)]
    assert [m.digest for m in contents.image.walk()] == [oci_entry["digest"], docker_entry["digest"], digest]
    with pytest.raises(LayoutError, match="is an image index, not one image's manifest"):
        read_image(layout)


def test_foreign_layers_are_not_looked_for(ours, tmp_path):
    layout = tmp_path / "foreign"
    shutil.copytree(ours, layout)
    entry = oci.parse_index((layout / "index.json").read_bytes())[0]
    manifest = json.loads(oci.read_blob(layout, entry))
    gone = manifest["layers"][0]
    oci.blob_path(layout, gone["digest"]).unlink()
    manifest["layers"][0] = {**gone, "urls": ["https://example.invalid/layer"]}
    data = oci.canonical_json(manifest)
    oci.write_index(layout, [oci.Descriptor(oci.MEDIA_MANIFEST, oci.write_blob(layout, data), len(data))])
    image = read_layout(layout).image
    assert [b.digest for b in image.blobs] == [image.config.digest, manifest["layers"][1]["digest"]]
    with pytest.raises(LayoutError, match="lives elsewhere"):
        read_image(layout)


@pytest.mark.parametrize("damage, message", [
    (lambda layout, blob: (layout / "oci-layout").unlink(), r"oci-layout is missing: .* is not an OCI image layout"),
    (lambda layout, blob: (layout / "index.json").write_text("{"), r"index\.json: not valid JSON"),
    (lambda layout, blob: blob("manifest").write_bytes(b"{}"), r"is 2 bytes, its descriptor says"),
    (lambda layout, blob: blob("config").write_bytes(_flip(blob("config").read_bytes())), "does not match its digest"),
    (lambda layout, blob: blob("layer").unlink(), r"\.layers\[0\]: blob sha256:\w+ is missing from the layout"),
    (lambda layout, blob: blob("layer").write_bytes(b"short"), r"\.layers\[0\]: blob sha256:\w+ is 5 bytes"),
])
def test_damage_is_one_error_naming_the_file(ours, tmp_path, damage, message):
    layout = tmp_path / "damaged"
    shutil.copytree(ours, layout)
    image = read_image(layout)
    blobs = {"manifest": image.manifest.digest, "config": image.image.config.digest, "layer": image.layers[0].digest}
    damage(layout, lambda which: oci.blob_path(layout, blobs[which]))
    with pytest.raises(LayoutError, match=message) as caught:
        read_image(layout)
    assert str(layout) in str(caught.value)


def _flip(data: bytes, at: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


# ---------------------------------------------------------------- any damage, any JSON

def _copy(source: Path, tmp_path_factory) -> Path:
    layout = tmp_path_factory.mktemp("garbled") / "layout"
    shutil.copytree(source, layout)
    return layout


def _refused_naming(layout: Path, read, *args) -> LayoutError | None:
    try:
        read(layout, *args)
    except LayoutError as err:
        assert str(layout) in str(err), err  # the file is named
        return err
    return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 50), cut=st.integers(0, 4000) | st.none(), flip=st.integers(0, 4000) | st.none())
def test_a_damaged_file_is_read_or_refused_by_name(ours, tmp_path_factory, which, cut, flip):
    """Any one file of a real layout cut short, changed in one byte or deleted: read, or one LayoutError
    naming the layout. A changed blob is always noticed, but for a layer's bytes at the same size (layers
    are not hashed here); oci-layout and index.json are not content-addressed (a changed ref name reads)."""
    layout = _copy(ours, tmp_path_factory)
    files = sorted(p for p in layout.rglob("*") if p.is_file())
    path = files[which % len(files)]
    data = path.read_bytes()
    if cut is None and flip is None:
        path.unlink()
    else:
        data = data[:cut] if cut is not None else data
        path.write_bytes(_flip(data, flip % len(data)) if flip is not None and data else data)
    original = ours / path.relative_to(layout)
    error = _refused_naming(layout, read_image)
    changed = not path.exists() or path.read_bytes() != original.read_bytes()
    layer = path.name in {d.digest[7:] for d in read_image(ours).layers}
    same_size = path.exists() and path.stat().st_size == original.stat().st_size
    if changed and path.parent.name == "sha256" and not (layer and same_size):
        assert error is not None, f"{path.relative_to(layout)} changed and was not noticed"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from(["index.json", "manifest", "config"]))
def test_one_field_anywhere_replaced_is_read_or_refused(ours, tmp_path_factory, data, which):
    """index.json, the manifest or the config with one value replaced by any JSON (the manifest and the
    config rewritten under their new digests, so only their content is wrong)."""
    layout = _copy(ours, tmp_path_factory)
    entries = json.loads((layout / "index.json").read_text())
    manifest_entry = entries["manifests"][0]
    manifest = json.loads(oci.blob_path(layout, manifest_entry["digest"]).read_bytes())
    if which == "index.json":
        replace_one_field(entries, data)
    elif which == "manifest":
        replace_one_field(manifest, data)
    else:
        config = json.loads(oci.blob_path(layout, manifest["config"]["digest"]).read_bytes())
        replace_one_field(config, data)
        blob = oci.canonical_json(config)
        manifest["config"] = {**manifest["config"], "digest": oci.write_blob(layout, blob), "size": len(blob)}
    if which != "index.json":
        blob = oci.canonical_json(manifest)
        manifest_entry.update(digest=oci.write_blob(layout, blob), size=len(blob))
    (layout / "index.json").write_bytes(json.dumps(entries).encode())
    _refused_naming(layout, read_image)
    _refused_naming(layout, read_layout)


descriptor_like = st.fixed_dictionaries(
    {"mediaType": st.sampled_from([oci.MEDIA_MANIFEST, oci.MEDIA_INDEX, oci.DOCKER_LIST, "", 3, None]),
     "digest": st.sampled_from(["sha256:" + "a" * 64, "sha512:" + "b" * 128, "sha256:nothex", 7])},
    optional={"size": json_values, "platform": json_values, "artifactType": json_values, "urls": json_values})
_REAL = object()  # becomes the descriptor of the layout's real image manifest


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values | st.fixed_dictionaries(
    {"schemaVersion": st.sampled_from([2, 1]),
     "mediaType": st.sampled_from([oci.MEDIA_INDEX, oci.MEDIA_MANIFEST, oci.DOCKER_LIST]),
     "manifests": st.lists(st.just(_REAL) | descriptor_like, max_size=3) | json_values},
    optional={"layers": json_values, "config": json_values}), top=st.booleans())
def test_any_image_index_in_a_layout_is_read_or_refused(ours, tmp_path_factory, body, top):
    """The image index index.json names (or index.json itself) holds anything: read, or one LayoutError;
    what is read is what the bytes say."""
    layout = _copy(ours, tmp_path_factory)
    real = json.loads((layout / "index.json").read_text())["manifests"][0]
    data = json.dumps(body, default=lambda _: real).encode()
    index_digest = oci.write_blob(layout, data)
    oci.write_index(layout, [oci.Descriptor(oci.MEDIA_INDEX, index_digest, len(data), {oci.REF_NAME: "1"})])
    if top:
        (layout / "index.json").write_bytes(data)
    try:
        contents = read_layout(layout)
    except LayoutError as err:
        assert str(layout) in str(err)
        return
    for manifest in contents.image.walk():
        assert manifest.digest == "sha256:" + hashlib.sha256(manifest.data).hexdigest()
        assert manifest.platform is None or isinstance(manifest.platform, oci.Platform)
