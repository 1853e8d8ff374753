"""export-oci, sbom, diff and verify through the CLI over flows/repro.py, on a real and tiny engine image
(`FROM scratch` + COPY, a lock at the in-image lock path: tests/image/test_oci_index.py's), in JSON and
in text. The image is tagged imagebuild-test/repro-flow-PID:1 and removed at the end."""

from __future__ import annotations

import json
import os

import pytest

from imagebuild.cli import app as cli
from imagebuild.flows import repro
from tests.image.test_oci_index import LOCK, build_platform_image

REPO = f"imagebuild-test/repro-flow-{os.getpid()}"
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def image(engine, tmp_path_factory):
    ref = build_platform_image(engine, tmp_path_factory.mktemp("repro-flow"), "linux/amd64", f"{REPO}:1")
    try:
        yield ref
    finally:
        engine.remove(ref)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))


def run_cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_export_sbom_and_diff_of_one_image_in_json_and_text(image, tmp_path, capsys):
    code, said = run_cli(capsys, "export-oci", image, "-o", tmp_path / "layout", "--json")
    exported = json.loads(said)
    assert code == 0 and exported["sbom"]["file"] == str(tmp_path / "layout.cdx.json")
    assert exported["sbom"]["artifact_digest"].startswith("sha256:") and (tmp_path / "layout.cdx.json").is_file()
    code, text = run_cli(capsys, "export-oci", image, "-o", tmp_path / "again", "--no-sbom")
    assert code == 0 and text.startswith(f"exported {image} -> {tmp_path / 'again'}  manifest "
                                         f"{exported['manifest_digest']}") and "SBOM" not in text

    code, said = run_cli(capsys, "sbom", image, "-o", tmp_path / "engine.cdx.json", "--json")
    from_engine = json.loads(said)
    assert code == 0 and from_engine["attached"] is None and from_engine["components"] > 0
    code, text = run_cli(capsys, "sbom", f"oci:{tmp_path / 'again'}", "-o", tmp_path / "layout2.cdx.json")
    assert code == 0 and text.startswith(f"SBOM written to {tmp_path / 'layout2.cdx.json'} "
                                         f"({from_engine['components']} components; attached to "
                                         f"{tmp_path / 'again'} as sha256:")
    report = repro.image_sbom(None, f"oci:{tmp_path / 'layout'}", tmp_path / "layout3.cdx.json")  # no engine asked
    assert report.layout == tmp_path / "layout" and report.to_dict()["attached"].startswith("sha256:")

    code, said = run_cli(capsys, "diff", image, f"oci:{tmp_path / 'layout'}", "--json")
    assert code == 0 and json.loads(said)["same"] is True
    code, text = run_cli(capsys, "diff", image, f"oci:{tmp_path / 'layout'}")
    assert code == 0 and text.strip() == "the same files"


def test_a_different_image_is_named_and_several_images_take_no_lock(engine, image, tmp_path, capsys):
    other = build_platform_image(engine, tmp_path, "linux/amd64", f"{REPO}:2", extra="other")
    try:
        code, text = run_cli(capsys, "diff", image, other)
        assert code == 1 and "platform: " in text and text.rstrip().endswith("1 path(s) differ")
        code, said = run_cli(capsys, "export-oci", image, other, "-o", tmp_path / "x", "--lock", LOCK, "--json")
        error = json.loads(said)
        assert code == 2 and error["message"].startswith("--lock names one image's lock")
        assert not (tmp_path / "x").exists()
    finally:
        engine.remove(other)
