"""imagebuild push of a multi-platform layout (an OCI image index) to a real loopback docker-registry,
read back by skopeo: the index under the tag, each platform's manifest and SBOM by digest, and the
arm64 image pulled back by platform. The layout reader push uses is checked on arbitrary input in
tests/image/test_layout.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from imagebuild.cli import app as cli
from imagebuild.image import index, oci, sbom
from imagebuild.image.layout import read_image
from imagebuild.registry import Connection, list_referrers
from tests.image.test_oci_index import build_platform_image

sys.path.insert(0, str(Path(__file__).parent.parent))
import registry_server  # noqa: E402
from registry_server import start_registry  # noqa: E402

REPO = f"imagebuild-test/push-index-{os.getpid()}"


from tests.registry.test_registry import isolated  # noqa: E402,F401 -- autouse: no credentials, config or cache of the machine


def imagebuild(capsys, *argv) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv] + ["--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def layouts(engine, tmp_path_factory):
    """The index layout export-oci writes for an amd64 and an arm64 image, and the single-image
    layout of the arm64 one (each with SBOMs attached)."""
    registry_server.require_tools()
    folder = tmp_path_factory.mktemp("push-index")
    refs = [f"{REPO}:7-amd64", f"{REPO}:7-arm64"]
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("IMAGEBUILD_CACHE", str(folder / "cache"))
            for ref in refs:
                build_platform_image(engine, folder, "linux/" + ref.rsplit("-", 1)[1], ref)
            for argv in ([*refs, "-o", folder / "multi"], [refs[1], "-o", folder / "single"]):
                assert cli.main(["export-oci", *map(str, argv), "--json"]) == 0
        yield {"multi": folder / "multi", "single": folder / "single"}
    finally:
        for ref in refs:
            engine.remove(ref)


@pytest.fixture
def plain(tmp_path):
    server = start_registry(tmp_path / "registry")
    yield server
    server.stop()


def skopeo(server, *argv: str, text: bool = True):
    return registry_server.run("skopeo", *argv, text=text)


@pytest.mark.engine
def test_an_index_layout_is_pushed_whole_and_pulled_back_by_platform(layouts, plain, capsys, tmp_path):
    layout = index.read_index_layout(layouts["multi"])
    ref = f"{plain.host}/team/multi:7"
    code, report = imagebuild(capsys, "push", layouts["multi"], ref, "--insecure-http")
    assert code == 0, report
    assert report["digest"] == layout.index.digest and report["media_type"] == oci.MEDIA_INDEX
    assert report["platforms"] == [
        {"platform": str(p.platform), "digest": p.manifest.digest, "referrers": [p.sbom.digest]}
        for p in layout.platforms]
    assert report["manifests"] == 5  # two images, two SBOMs, the index

    raw = skopeo(plain, "inspect", "--raw", "--tls-verify=false", f"docker://{ref}", text=False).stdout
    assert raw == oci.blob_path(layouts["multi"], layout.index.digest).read_bytes()
    assert json.loads(raw)["mediaType"] == oci.MEDIA_INDEX
    pulled = tmp_path / "pulled"
    skopeo(plain, "copy", "--insecure-policy", "--src-tls-verify=false", "--preserve-digests",
           "--override-arch", "arm64", f"docker://{ref}", f"oci:{pulled}:x")
    got = json.loads((pulled / "index.json").read_text())["manifests"][0]["digest"]
    assert got == layout.manifest_for("linux/arm64").digest
    session = Connection(insecure_http=True).open(plain.host)
    for item in layout.platforms:  # each SBOM is in the registry, naming its platform's manifest
        artifact = skopeo(plain, "inspect", "--raw", "--tls-verify=false",
                          f"docker://{plain.host}/team/multi@{item.sbom.digest}", text=False).stdout
        assert json.loads(artifact)["subject"]["digest"] == item.manifest.digest
        # and a reader finds it from the manifest: distribution 2.8 has no referrers API, so by the fallback tag
        assert [d.digest for d in list_referrers(session, "team/multi", item.manifest.digest, sbom.MEDIA_CYCLONEDX)] \
            == [item.sbom.digest]

    code, again = imagebuild(capsys, "push", layouts["multi"], ref, "--insecure-http")
    assert code == 0 and again["bytes_sent"] == 0 and again["digest"] == layout.index.digest
    assert [len(list_referrers(session, "team/multi", item.manifest.digest)) for item in layout.platforms] == [1, 1]


@pytest.mark.engine
def test_a_single_image_layout_with_its_sbom_needs_no_layout_name(layouts, plain, capsys):
    """export-oci lists the SBOM beside the image in index.json: push takes the image, and the SBOM
    with it (before, it counted both as images and asked for --layout-name)."""
    ref = f"{plain.host}/team/single:7"
    code, report = imagebuild(capsys, "push", layouts["single"], ref, "--insecure-http")
    assert code == 0, report
    single = read_image(layouts["single"])
    assert report["digest"] == single.manifest_digest and report["manifests"] == 2
    assert "platforms" not in report
    session = Connection(insecure_http=True).open(plain.host)
    assert [d.digest for d in list_referrers(session, "team/single", single.manifest_digest, sbom.MEDIA_CYCLONEDX)] \
        == [r.digest for r in single.referrers]
    assert report["digest"] == index.read_index_layout(layouts["multi"]).manifest_for("linux/arm64").digest
