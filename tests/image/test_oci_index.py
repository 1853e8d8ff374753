"""imagebuild.image.index: one engine image per platform written as one OCI layout under an image index.

The images are real and tiny: `FROM scratch` + COPY, built by BuildKit with `--platform` (no
emulation runs: nothing executes), each carrying a lock at /opt/imagebuild/lock.json for its SBOM.
Every image made here is tagged imagebuild-test/oci-index-PID:… and removed at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.cli import app as cli
from imagebuild.image import export, index, oci, sbom
from tests.image.test_oci import index_like

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "cuda-toolchain.lock"
REPO = f"imagebuild-test/oci-index-{os.getpid()}"


def build_platform_image(engine, folder: Path, platform: str, ref: str, extra: str = "") -> str:
    """A FROM scratch image for `platform` with the lock inside and one file saying which it is."""
    context = folder / f"context-{ref.rsplit(':', 1)[-1]}"
    (context / "opt" / "imagebuild").mkdir(parents=True)
    shutil.copyfile(LOCK, context / "opt" / "imagebuild" / "lock.json")
    (context / "platform").write_text(platform + extra + "\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY opt /opt\nCOPY platform /platform\n")
    subprocess.run([engine.cli, "build", "-q", "--platform", platform, "-t", ref, str(context)],
                   check=True, capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    return ref


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("platform-images")
    made = {"amd64": f"{REPO}:1-amd64", "arm64": f"{REPO}:1-arm64", "amd64-again": f"{REPO}:2-amd64"}
    try:
        for name, ref in made.items():
            build_platform_image(engine, folder, "linux/" + name.split("-")[0], ref, extra=name)
        yield made
    finally:
        for ref in made.values():
            engine.remove(ref)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "EXTENSIONS", tuple(dict.fromkeys(cli.EXTENSIONS + ("imagebuild.cli.repro",))))


def run_cli(capsys, *argv) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv] + ["--json"])
    return code, json.loads(capsys.readouterr().out)


def blob_json(layout: Path, digest: str):
    return json.loads(oci.blob_path(layout, digest).read_bytes())


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.engine
def test_the_index_names_each_platform_with_its_manifest_and_sbom(engine, images, tmp_path, capsys):
    out = tmp_path / "layout"
    code, report = run_cli(capsys, "export-oci", images["arm64"], images["amd64"], "-o", out)
    assert code == 0, report
    entries = json.loads((out / "index.json").read_text())["manifests"]
    assert [e["mediaType"] for e in entries] == [oci.MEDIA_INDEX] + [oci.MEDIA_MANIFEST] * 2
    assert entries[0]["annotations"] == {oci.REF_NAME: "1"}  # the tag without its -ARCH
    assert [e.get("artifactType") for e in entries[1:]] == [sbom.MEDIA_CYCLONEDX] * 2
    body = blob_json(out, entries[0]["digest"])
    assert body["mediaType"] == oci.MEDIA_INDEX and report["index_digest"] == entries[0]["digest"]
    assert [m["platform"] for m in body["manifests"]] == [  # sorted by platform, not by argument
        {"architecture": "amd64", "os": "linux"}, {"architecture": "arm64", "os": "linux"}]

    layout = index.read_index_layout(out)
    assert [str(p.platform) for p in layout.platforms] == ["linux/amd64", "linux/arm64"]
    for item, entry in zip(layout.platforms, report["platforms"]):
        manifest = blob_json(out, item.manifest.digest)
        config = blob_json(out, manifest["config"]["digest"])
        assert config["architecture"] == item.platform.architecture
        assert entry["manifest_digest"] == item.manifest.digest and entry["sbom_artifact"] == item.sbom.digest
        artifact = blob_json(out, item.sbom.digest)
        assert artifact["subject"]["digest"] == item.manifest.digest
        document = json.loads(Path(entry["sbom_file"]).read_text())
        assert document["metadata"]["component"]["hashes"][0]["content"] == item.manifest.digest[7:]
        assert oci.blob_path(out, artifact["layers"][0]["digest"]).read_bytes() == sbom.sbom_bytes(document)
        # each platform's manifest is byte for byte what the single-image export writes
        single = export.export_layout(engine, entry["image"], tmp_path / f"single-{item.platform.slug}")
        assert single.manifest_digest == item.manifest.digest


@pytest.mark.engine
def test_two_exports_give_one_index_digest(images, tmp_path, capsys):
    first = run_cli(capsys, "export-oci", images["amd64"], images["arm64"], "-o", tmp_path / "a")[1]
    second = run_cli(capsys, "export-oci", images["arm64"], images["amd64"], "-o", tmp_path / "b",
                     "--no-sbom")[1]
    third = run_cli(capsys, "export-oci", images["arm64"], images["amd64"], "-o", tmp_path / "c")[1]
    assert first["index_digest"] == second["index_digest"] == third["index_digest"]
    assert tree(tmp_path / "a") == tree(tmp_path / "c")
    assert [p["sbom_artifact"] for p in second["platforms"]] == [None, None]
    assert json.loads((tmp_path / "b/index.json").read_text())["manifests"][1:] == []


@pytest.mark.engine
@pytest.mark.needs_tool("skopeo", "oci-image-tool", package="skopeo oci-image-tool")
def test_each_platform_is_a_standard_image_an_independent_client_picks(images, tmp_path, capsys):
    """oci-image-tool (2017) knows no image index: skopeo picks each platform out of it, by its
    `platform`, and the validator checks what it picked."""
    out = tmp_path / "layout"
    assert run_cli(capsys, "export-oci", images["amd64"], images["arm64"], "-o", out)[0] == 0
    layout = index.read_index_layout(out)
    for arch in ("amd64", "arm64"):
        picked = tmp_path / f"picked-{arch}"
        subprocess.run(["skopeo", "copy", "--insecure-policy", "--preserve-digests", "--override-arch", arch,
                        f"oci:{out}:1", f"oci:{picked}:x"], check=True, capture_output=True)
        entry = json.loads((picked / "index.json").read_text())["manifests"][0]
        assert entry["digest"] == layout.manifest_for(f"linux/{arch}").digest
        check = subprocess.run(["oci-image-tool", "validate", "--type", "image", "--ref", "name=x", str(picked)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.engine
def test_two_images_of_one_platform_are_refused_and_nothing_is_written(images, tmp_path, capsys):
    out = tmp_path / "layout"
    out.mkdir()
    (out / "kept").write_text("the layout that was there")
    code, report = run_cli(capsys, "export-oci", images["amd64"], images["arm64"], images["amd64-again"],
                           "-o", out)
    assert code == 2 and report["error"] == "DuplicatePlatform"
    assert images["amd64"] in report["message"] and images["amd64-again"] in report["message"]
    assert "linux/amd64" in report["message"]
    assert tree(out) == {"kept": b"the layout that was there"}
    assert [p.name for p in tmp_path.iterdir()] == ["layout"]  # no sibling temp folder, no blob exported


@pytest.mark.engine
def test_a_failure_midway_leaves_nothing_half_written(engine, images, tmp_path):
    def sbom_for(part, image, result):
        if image == images["arm64"]:  # the second platform: the first is already in the staging folder
            raise oci.LayoutError("stop here")
        return None

    with pytest.raises(oci.LayoutError, match="stop here"):
        index.export_index(engine, [images["amd64"], images["arm64"]], tmp_path / "layout", sbom_for=sbom_for)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"])


@pytest.mark.engine
def test_lock_and_ref_names_with_several_images(images, tmp_path, capsys):
    code, report = run_cli(capsys, "export-oci", images["amd64"], images["arm64"], "-o", tmp_path / "x",
                           "--lock", LOCK)
    assert code == 2 and "--lock names one image's lock" in report["message"]
    code, report = run_cli(capsys, "export-oci", images["amd64-again"], images["arm64"], "-o", tmp_path / "x")
    assert code == 2 and "--ref-name" in report["message"]  # tags 2-amd64 and 1-arm64 share no name
    assert not (tmp_path / "x").exists()
    code, report = run_cli(capsys, "export-oci", images["amd64-again"], images["arm64"], "-o", tmp_path / "x",
                           "--ref-name", "multi", "--no-sbom")
    assert code == 0 and index.read_index_layout(tmp_path / "x", "multi").ref_name == "multi"


# ---------------------------------------------------------------- the index read back, on any input

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=index_like, top=st.booleans())
def test_an_index_layout_from_outside_is_read_or_refused(tmp_path_factory, value, top):
    """The index blob (or index.json itself) holds anything: read, or one LayoutError."""
    layout = tmp_path_factory.mktemp("garbled")
    data = json.dumps(value).encode()
    digest = oci.write_blob(layout, data)
    oci.write_index(layout, [oci.Descriptor(oci.MEDIA_INDEX, digest, len(data), {oci.REF_NAME: "1"})])
    if top:
        (layout / "index.json").write_bytes(data)
    try:
        found = index.read_index_layout(layout)
    except oci.LayoutError:
        return
    assert found.index.digest == "sha256:" + hashlib.sha256(data).hexdigest()
