"""`export-lxc --platform`: which platform's rootfs a template or OCI archive is made from. Real arm64 and
amd64 images are built here with BuildKit (`FROM scratch`, one rootfs tar per TARGETARCH), tagged the way a
multi-platform build tags them (NAME:TAG is the host's platform, NAME:TAG-arm64 the other)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.cli import app as cli
from imagebuild.errors import EXIT_BAD_INPUT, EXIT_OK
from imagebuild.lxc import lxc
from imagebuild.lxc.rootfs_filter import TemplateError
from tests.lxc.test_lxc import debian_rootfs, directory, entry, make_tar

ELF_MACHINE = {"amd64": 0x3E, "arm64": 0xB7}  # e_machine: EM_X86_64, EM_AARCH64
DOCKERFILE = "FROM scratch\nARG TARGETARCH\nADD rootfs-${TARGETARCH}.tar /\n"


def elf_header(machine: int) -> bytes:
    """The 64 bytes of an ELF64 little-endian executable's header: enough for `file` and pve-container."""
    return b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHI", 2, machine, 1) + bytes(40)


def elf_machine(data: bytes) -> int:
    return struct.unpack_from("<H", data, 18)[0]


def build(engine, context: Path, platform: str, ref: str) -> None:
    done = subprocess.run(engine.command("build", "--quiet", "--platform", platform, "-t", ref, str(context)),
                          env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"docker build --platform {platform} failed: {done.stderr[-2000:]}"


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    """NAME:TAG (amd64) with NAME:TAG-arm64 beside it, and ARM:TAG, an arm64 image under a tag of its own;
    each rootfs says its arch in /etc/platform-marker and in the ELF header of /bin/sh, which is what
    pve-container reads a template's architecture from (detect_architecture in src/PVE/LXC/Create.pm)."""
    context = tmp_path_factory.mktemp("lxc-platform")
    (context / "Dockerfile").write_text(DOCKERFILE)
    for arch, machine in ELF_MACHINE.items():
        entries = debian_rootfs(entry("etc/platform-marker", f"{arch}\n".encode()), directory("opt"))
        entries = [dict(e, data=elf_header(machine)) if e["name"] == "usr/bin/sh" else e
                   for e in entries if not e["name"].startswith("dev/")]
        (context / f"rootfs-{arch}.tar").write_bytes(make_tar(entries))
    name, arm = f"imagebuild-test/lxc-platform:{os.getpid()}", f"imagebuild-test/lxc-platform-arm:{os.getpid()}"
    made = [name, lxc.platform_tag(name, "arm64"), arm]
    try:
        build(engine, context, "linux/amd64", name)
        build(engine, context, "linux/arm64", made[1])
        build(engine, context, "linux/arm64", arm)
        yield {"name": name, "arm": arm}
    finally:
        for ref in made:
            engine.remove(ref)


def export(capsys, *argv) -> tuple[int, dict]:
    status = cli.main(["export-lxc", *argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


def template_files(path: Path) -> dict[str, bytes]:
    """The regular files of a .tar.zst template, unpacked with zstd as pve-container would."""
    data = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


# ---------------------------------------------------------------- with the engine

@pytest.mark.engine
def test_platform_arm64_picks_the_arm64_rootfs_from_its_arch_tag(images, tmp_path, capsys):
    out = tmp_path / "x_arm64.tar.zst"
    status, report = export(capsys, images["name"], "--platform", "linux/arm64", "-o", str(out))
    assert status == EXIT_OK and report["platform"] == "linux/arm64"
    assert report["image"] == f"{images['name']}-arm64"
    files = template_files(out)
    assert files["./etc/platform-marker"] == b"arm64\n"
    assert elf_machine(files["./usr/bin/sh"]) == ELF_MACHINE["arm64"]


@pytest.mark.engine
def test_platform_of_the_image_itself_is_used_as_it_is(images, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, report = export(capsys, images["arm"], "--platform", "arm64")  # no -o: the name says arm64
    stem = images["arm"].replace("/", "-").replace(":", "_")
    assert status == EXIT_OK and report["image"] == images["arm"] and report["platform"] == "linux/arm64"
    assert os.listdir(tmp_path) == [f"{stem}_arm64.tar.zst"]
    assert template_files(tmp_path / f"{stem}_arm64.tar.zst")["./etc/platform-marker"] == b"arm64\n"
    status, report = export(capsys, images["name"], "--platform", "linux/amd64", "-o", str(tmp_path / "a.tar.zst"))
    assert status == EXIT_OK and report["image"] == images["name"] and report["platform"] == "linux/amd64"
    assert elf_machine(template_files(tmp_path / "a.tar.zst")["./usr/bin/sh"]) == ELF_MACHINE["amd64"]


@pytest.mark.engine
def test_without_platform_the_image_is_exported_as_it_is_and_the_report_says_which(images, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export-lxc", images["arm"]]) == EXIT_OK
    stem = images["arm"].replace("/", "-").replace(":", "_")
    assert "linux/arm64" in capsys.readouterr().out and os.listdir(tmp_path) == [f"{stem}_arm64.tar.zst"]
    status, report = export(capsys, images["name"], "-o", str(tmp_path / "host.tar.zst"))
    assert status == EXIT_OK and report["platform"] == "linux/amd64" and report["image"] == images["name"]


@pytest.mark.engine
def test_oci_archive_of_the_arm64_platform_says_arm64_in_its_config(images, tmp_path, capsys):
    out = tmp_path / "x.tar"
    status, report = export(capsys, images["name"], "--platform", "arm64", "--oci", "-o", str(out))
    assert status == EXIT_OK and report["platform"] == "linux/arm64" and report["format"] == "oci-archive"
    with tarfile.open(out) as tar:
        def blob(digest: str) -> dict:
            return json.loads(tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]).read())
        index = json.loads(tar.extractfile("index.json").read())
        manifest = blob(index["manifests"][0]["digest"])
        assert blob(manifest["config"]["digest"])["architecture"] == "arm64"


@pytest.mark.engine
def test_no_image_of_the_platform_asked_for_is_one_error_and_writes_nothing(engine, images, tmp_path, capsys,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, error = export(capsys, images["name"], "--platform", "linux/s390x")
    assert status == EXIT_BAD_INPUT and error["ok"] is False and error["error"] == "PlatformNotFound"
    assert error["image"] == images["name"] and error["platform"] == "linux/s390x"
    assert error["found"] == {images["name"]: "linux/amd64", f"{images['name']}-arm64": "linux/arm64"}
    assert f"tagged {images['name']}-s390x" in error["message"]
    assert cli.main(["export-lxc", images["arm"], "--platform", "amd64"]) == EXIT_BAD_INPUT
    told = capsys.readouterr().err
    assert "no linux/amd64 image of" in " ".join(told.split()) and "Traceback" not in told
    status, error = export(capsys, "imagebuild-test/lxc-platform-none:0", "--platform", "arm64")
    assert status == EXIT_BAD_INPUT and error["found"] == {} and "at all" in error["message"]
    image_id = engine.inspect(images["name"]).id  # an id has no per-platform tags to fall back to
    status, error = export(capsys, image_id, "--platform", "arm64")
    assert status == EXIT_BAD_INPUT and error["found"] == {image_id: "linux/amd64"} and "tagged" not in error["message"]
    status, error = export(capsys, images["name"], "--platform", "windows/arm64")
    assert status == EXIT_BAD_INPUT and error["error"] == "TemplateError" and "--platform" in error["message"]
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the platform argument, no engine

@pytest.mark.parametrize("text, platform", [
    ("arm64", "linux/arm64"), ("linux/arm64", "linux/arm64"), ("aarch64", "linux/arm64"),
    ("linux/arm64/v8", "linux/arm64"), (" AMD64 ", "linux/amd64"), ("x86_64", "linux/amd64"),
    ("linux/arm/v7", "linux/arm/v7")])
def test_platform_argument_forms(text, platform):
    assert lxc.parse_platform(text) == platform


@pytest.mark.parametrize("text", ["", "linux", "windows/amd64", "linux/amd64/v1/x", "linux/sparc", "linux/arm/7"])
def test_platform_argument_refused_says_how_to_write_it(text):
    with pytest.raises(TemplateError, match="write linux/ARCH or ARCH"):
        lxc.parse_platform(text)


def test_platform_matching_and_tags():
    assert lxc.same_platform("linux/arm64", "linux/arm64/v8") and lxc.same_platform("linux/arm", "linux/arm/v7")
    assert not lxc.same_platform("linux/arm/v6", "linux/arm/v7") and not lxc.same_platform("arm64", "linux/amd64")
    assert not lxc.same_platform("arm64", "") and not lxc.same_platform("arm64", "darwin/arm64")
    assert lxc.platform_tag("myorg/x:1.0", "arm64") == "myorg/x:1.0-arm64"
    assert lxc.platform_tag("localhost:5000/x", "amd64") == "localhost:5000/x:latest-amd64"
    assert lxc.arch_of("linux/arm64/v8") == "arm64" and lxc.arch_of("") == "amd64"
    assert lxc.default_name("x:1", arch="arm64") == "x_1_arm64.tar.zst"


@given(st.text(max_size=40))
def test_platform_argument_parser_never_raises_anything_else(text):
    try:
        parsed = lxc.parse_platform(text)
    except TemplateError as error:
        assert "--platform" in str(error)
    else:
        assert parsed.startswith("linux/") and lxc.parse_platform(parsed) == parsed
        assert lxc.same_platform(text, parsed) and lxc.arch_of(parsed) in lxc.ARCHES


@given(st.text(max_size=40), st.text(max_size=40))
def test_platform_matching_and_naming_never_raise(asked, found):
    lxc.same_platform(asked, found)
    assert lxc.default_name("x:1", arch=lxc.arch_of(found)).endswith(".tar.zst")
