"""The SBOM's prebuilt kernels ([aot]): read from the manifest an image carries, listed as file components."""

from __future__ import annotations

import copy
import re
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.errors import ImagebuildError
from imagebuild.image import sbom
from imagebuild.lock import read_lock
from tests.image.test_sbom import LOCK, schema_errors
from tests.json_fuzz import json_values, replace_one_field

MANIFEST = {"manifest_version": 1, "archs": ["12.0f"], "artifacts": [
    {"kind": "flashinfer", "name": "cascade", "path": "/opt/venv/lib/python3.11/site-packages/flashinfer/data/aot/"
     "cascade/cascade.so", "sha256": "c" * 64, "bytes": 232624, "sass": [120], "ptx": [], "shapes": ["a"]},
    {"kind": "sglang", "name": "sgl_kernel_jit_activation_bf16_t_true", "path": "/var/cache/sglang/jit/sm120f/x.so",
     "sha256": "d" * 64, "bytes": 90000, "sass": [120], "ptx": [], "target": "sm120f"}]}


def test_each_kernel_is_a_file_component_with_its_hash_and_gpu_code():
    kernels = sbom.parse_kernel_manifest(json.dumps(MANIFEST).encode(), "image:/m.json")
    document = sbom.build_sbom(read_lock(LOCK), image_name="imagebuild/x", kernels=kernels)
    assert schema_errors(document) is None
    files = {c["bom-ref"]: c for c in document["components"] if c["type"] == "file"}
    assert set(files) == {"kernel:flashinfer:cascade", "kernel:sglang:sgl_kernel_jit_activation_bf16_t_true"}
    cascade = files["kernel:flashinfer:cascade"]
    assert cascade["hashes"] == [{"alg": "SHA-256", "content": "c" * 64}]
    props = {p["name"]: p["value"] for p in cascade["properties"]}
    assert props["imagebuild:sass"] == "sm_120" and props["imagebuild:kernel-kind"] == "flashinfer"
    image = next(d for d in document["dependencies"] if d["ref"] == "image")
    assert set(files) <= set(image["dependsOn"])


def test_an_image_without_kernels_has_no_file_components():
    document = sbom.build_sbom(read_lock(LOCK), image_name="imagebuild/x")
    assert not [c for c in document["components"] if c["type"] == "file"]


@pytest.mark.parametrize("data, why", [
    (b"{", "not JSON"), (b"[]", "no artifacts list"), (b'{"artifacts": {}}', "no artifacts list"),
    (json.dumps({"artifacts": [dict(MANIFEST["artifacts"][0], sha256="x")]}).encode(), "artifacts[0]"),
    (json.dumps({"artifacts": [dict(MANIFEST["artifacts"][0], sass=[True])]}).encode(), "artifacts[0]"),
    (b"\xff\xfe", "not JSON"),
])
def test_a_bad_manifest_is_one_error_naming_it(data, why):
    with pytest.raises(ImagebuildError, match=re.escape(why)) as caught:
        sbom.parse_kernel_manifest(data, "img:/opt/imagebuild/aot-manifest.json")
    assert "img:/opt/imagebuild/aot-manifest.json" in str(caught.value)


@given(json_values)
def test_any_json_is_read_or_refused_with_an_error(value):
    try:
        sbom.parse_kernel_manifest(json.dumps(value).encode(), "m")
    except ImagebuildError:
        pass


@given(st.data())
def test_a_manifest_with_any_field_replaced_is_read_or_refused(data):
    doc = copy.deepcopy(MANIFEST)
    replace_one_field(doc, data)
    try:
        kernels = sbom.parse_kernel_manifest(json.dumps(doc).encode(), "m")
    except ImagebuildError:
        return
    assert all(len(k["sha256"]) == 64 for k in kernels)
