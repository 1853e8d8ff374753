"""imagebuild.image.sbom: CycloneDX 1.5, checked against the spec's JSON schema; attached to a layout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from imagebuild.image import sbom
from imagebuild.image.layout import read_image
from imagebuild.lock import LockedPatch, read_lock
from tests.image.test_oci import engine_config, export_archive, make_tar, sample_members, saved_archive
from tests.conftest import needs_module

LOCK = Path(__file__).resolve().parents[2] / "lockfiles" / "cuda-toolchain.lock"
validation = needs_module("cyclonedx.validation.json")
from cyclonedx.schema import SchemaVersion  # noqa: E402


def schema_errors(document: dict) -> str | None:
    error = validation.JsonStrictValidator(SchemaVersion.V1_5).validate_str(
        sbom.sbom_bytes(document).decode())
    return None if error is None else str(getattr(error, "data", error))[:2000]


def patched_lock():
    lock = read_lock(LOCK)
    patch = LockedPatch(package="sgl-deep-gemm", file="01-deep-gemm.patch", sha256="b" * 64, strip=1,
                        version="0.2.3.post2")
    return type(lock)(**{**vars(lock), "patches": (patch,)})


def test_sbom_of_the_toolchain_lock_is_valid_cyclonedx():
    lock = read_lock(LOCK)
    document = sbom.build_sbom(lock, image_name="imagebuild/cuda-toolchain", image_tag="13.0",
                               manifest_digest="sha256:" + "1" * 64)
    assert schema_errors(document) is None
    components = {c["bom-ref"]: c for c in document["components"]}
    nvcc = components["pkg:pypi/nvidia-cuda-nvcc@13.0.88"]
    assert nvcc["hashes"] == [{"alg": "SHA-256", "content": next(
        w.sha256 for w in lock.wheels if w.name == "nvidia-cuda-nvcc")}]
    debs = [c for c in document["components"] if c.get("purl", "").startswith("pkg:deb/")]
    assert len(debs) == len(lock.base.packages)
    assert "pkg:deb/debian/bsdutils@1%3A2.38.1-5%2Bdeb12u3?arch=amd64&distro=debian-bookworm" in components
    cuda = components["cuda:13.0"]
    assert cuda["type"] == "framework"
    toolchain = next(d for d in document["dependencies"] if d["ref"] == "cuda:13.0")["dependsOn"]
    assert "pkg:pypi/nvidia-cuda-nvcc@13.0.88" in toolchain and "pkg:pypi/sgl-deep-gemm@0.2.3.post2" not in toolchain
    assert document["metadata"]["component"]["purl"].startswith("pkg:oci/cuda-toolchain@sha256%3A")


def test_patches_are_recorded_as_pedigree():
    document = sbom.build_sbom(patched_lock(), image_name="x")
    assert schema_errors(document) is None
    gemm = next(c for c in document["components"] if c["name"] == "sgl-deep-gemm")
    assert gemm["pedigree"]["patches"] == [{"type": "unofficial", "diff": {"url": "patches/01-deep-gemm.patch"}}]
    assert {"name": "imagebuild:patch", "value": "01-deep-gemm.patch sha256:" + "b" * 64} in gemm["properties"]


def test_the_same_lock_gives_the_same_bytes():
    one = sbom.sbom_bytes(sbom.build_sbom(read_lock(LOCK), image_name="x", manifest_digest="sha256:" + "2" * 64))
    two = sbom.sbom_bytes(sbom.build_sbom(read_lock(LOCK), image_name="x", manifest_digest="sha256:" + "2" * 64))
    assert one == two and b"2026-" not in one  # no wall-clock time anywhere


def test_attached_sbom_is_a_referrer_and_leaves_the_image_manifest_alone(tmp_path):
    result = export_archive(saved_archive([make_tar(sample_members())], engine_config(1)), tmp_path / "layout")
    document = sbom.build_sbom(read_lock(LOCK), image_name="x", manifest_digest=result.manifest_digest)
    first = sbom.attach_sbom(tmp_path / "layout", document)
    again = sbom.attach_sbom(tmp_path / "layout", document)  # idempotent: replaced, not added
    layout = read_image(tmp_path / "layout")
    assert first == again and layout.manifest_digest == result.manifest_digest
    assert [d.digest for d in layout.referrers] == [first.digest]
    assert sbom.read_attached(tmp_path / "layout") == document
    index = json.loads((tmp_path / "layout/index.json").read_text())
    assert [m.get("artifactType") for m in index["manifests"]] == [None, sbom.MEDIA_CYCLONEDX]
    if shutil.which("oci-image-tool"):  # the 2017 validator knows no OCI 1.1 artifacts: check the image ref
        check = subprocess.run(["oci-image-tool", "validate", "--type", "image", "--ref", "name=1",
                                str(tmp_path / "layout")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
