"""export-lxc, --oci and lxc-config --image through the buildah engine, on an image buildah makes here: a
Debian-like rootfs imported, then a Dockerfile's ENTRYPOINT, CMD, ENV, WORKDIR and USER over it. What the
template's shim runs and its environment come from that config, read through the engine contract."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile

import pytest

from imagebuild.cli import app as cli
from imagebuild.engine import default_engine
from imagebuild.errors import ImagebuildError
from imagebuild.lxc import lxc
from tests.conftest import cannot_run, missing_tool
from tests.lxc.test_lxc import debian_rootfs, directory, entry, fake_host, make_tar

pytestmark = pytest.mark.needs_tool("buildah", "zstd", package="buildah zstd")

NAME = f"localhost/imagebuild-test/lxc-buildah:{os.getpid()}"
DOCKERFILE = """FROM {base}
ENV APP_MODE="two words" PATH=/opt/app/bin:/usr/bin
WORKDIR /srv/app
USER 1000
ENTRYPOINT ["/opt/app/bin/serve"]
CMD ["--port", "8000"]
"""


def buildah_containers() -> list[str]:
    """The working containers buildah holds now (an export leaves none behind)."""
    done = subprocess.run(["buildah", "containers", "--quiet", "--notruncate"], capture_output=True, text=True,
                          check=True)
    return done.stdout.split()


@pytest.fixture(scope="module")
def buildah(tmp_path_factory):
    """The engine, and the images made here: NAME (the config above) and NAME-driver (libcuda added over
    it); what this fixture made, it removes."""
    engine = default_engine("buildah")
    engine.layers = False  # no intermediate images left behind
    try:
        engine.check()
    except ImagebuildError as err:
        cannot_run(f"buildah cannot reach its storage: {err}")
    tmp = tmp_path_factory.mktemp("lxc-buildah")
    base, made = f"{NAME}-rootfs", []
    try:
        rootfs = tmp / "rootfs.tar"
        rootfs.write_bytes(make_tar(debian_rootfs(directory("opt"), directory("opt/app"), directory("opt/app/bin"),
                                                  entry("opt/app/bin/serve", b"#!/bin/sh\n", mode=0o755))))
        engine.import_rootfs(rootfs, base)
        made.append(base)
        for ref, dockerfile, files in (
                (NAME, DOCKERFILE.format(base=base), {}),
                (f"{NAME}-driver", f"FROM {NAME}\nCOPY libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n",
                 {"libcuda.so.1": b"\x7fELF"})):
            context = tmp / f"context-{len(made)}"
            context.mkdir()
            (context / "Dockerfile").write_text(dockerfile)
            for name, data in files.items():
                (context / name).write_bytes(data)
            engine.tag(engine.build(context), ref)
            made.append(ref)
        yield engine
    finally:
        for ref in reversed(made):
            engine.remove(ref)


def export(capsys, *argv: str) -> tuple[int, dict]:
    status = cli.main(["export-lxc", *argv, "--engine", "buildah", "--json"])
    return status, json.loads(capsys.readouterr().out)


def template_members(path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    data = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isreg() else None) for m in tar}


def test_the_contract_reads_the_image_config_buildah_wrote(buildah):
    config = buildah.image_config(NAME)
    assert config.id == buildah.inspect(NAME).id
    assert (config.entrypoint, config.cmd, config.workdir, config.user) == (
        ("/opt/app/bin/serve",), ("--port", "8000"), "/srv/app", "1000")
    assert config.command == ("/opt/app/bin/serve", "--port", "8000")
    assert config.env == ("PATH=/opt/app/bin:/usr/bin", "APP_MODE=two words")
    assert config.created == buildah.epoch and config.platform == buildah.inspect(NAME).platform


def test_export_lxc_through_buildah_runs_the_image_config(buildah, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    before = buildah_containers()
    out = tmp_path / "app.tar.zst"
    status, report = export(capsys, NAME, "-o", str(out))
    assert status == 0, report
    assert report["image"] == NAME and report["image_id"] == buildah.inspect(NAME).id
    assert report["format"] == "lxc-rootfs" and report["rootfs"]["init"] == "shim"
    assert any("USER 1000 is not applied" in w for w in report["rootfs"]["warnings"])
    members = template_members(out)
    command = members["./etc/imagebuild/command"][1].decode()
    assert "cd /srv/app 2>/dev/null || cd /\n" in command
    assert command.endswith("set -- /opt/app/bin/serve --port 8000\n")
    environment = members["./etc/environment"][1].decode()
    assert environment.endswith('PATH=/opt/app/bin:/usr/bin\nAPP_MODE="two words"\n')
    assert members["./opt/app/bin/serve"][1] == b"#!/bin/sh\n" and members["./srv/app"][0].isdir()
    assert max(m.mtime for m, _ in members.values()) == buildah.epoch  # clamped to the config's date
    assert buildah_containers() == before


def oci_archive_config(path) -> dict:
    """The image config's `config` of an OCI archive's one image."""
    with tarfile.open(path) as tar:
        blob = lambda digest: json.loads(tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:")).read())
        index = json.loads(tar.extractfile("index.json").read())
        return blob(blob(index["manifests"][0]["digest"])["config"]["digest"])["config"]


def test_export_lxc_oci_through_buildah_keeps_the_config(buildah, tmp_path, capsys):
    out = tmp_path / "app.tar"
    status, report = export(capsys, NAME, "--oci", "-o", str(out))
    assert status == 0 and report["format"] == "oci-archive" and report["tool"] == "imagebuild.oci", report
    config = oci_archive_config(out)
    assert config["Entrypoint"] == ["/opt/app/bin/serve"] and config["Cmd"] == ["--port", "8000"]
    assert config["WorkingDir"] == "/srv/app" and "APP_MODE=two words" in config["Env"]


def test_the_skopeo_writer_reads_buildah_s_own_store(buildah, tmp_path):
    missing_tool("skopeo", package="skopeo")
    report = lxc.export_oci(buildah, NAME, tmp_path / "app.tar", writer="skopeo")
    assert report.tool == "skopeo" and report.image_id == buildah.inspect(NAME).id
    assert oci_archive_config(tmp_path / "app.tar")["Entrypoint"] == ["/opt/app/bin/serve"]


def test_lxc_config_image_check_through_buildah(buildah, tmp_path, capsys):
    root = fake_host(tmp_path)
    argv = ["lxc-config", "--root", str(root), "--engine", "buildah", "--json", "--image"]
    assert cli.main([*argv, NAME]) == 0
    assert json.loads(capsys.readouterr().out)["image"]["driver_libraries"] == []
    assert cli.main([*argv, f"{NAME}-driver"]) == 1
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "DriverInImage" and "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in error["message"]


def test_a_missing_image_is_image_not_found_naming_buildah(buildah, tmp_path, capsys):
    missing = f"{NAME}-missing"
    status, error = export(capsys, missing, "-o", str(tmp_path / "x.tar.zst"))
    assert status == 2 and error["error"] == "ImageNotFound"
    assert error["message"] == f"no image {missing!r} in the buildah engine: build, pull or load it first"
    assert (error["image"], error["engine"]) == (missing, "buildah") and os.listdir(tmp_path) == []
