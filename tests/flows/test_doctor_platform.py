"""`imagebuild doctor --image` and the image's platform: an image of the host's platform, one of the other
(arm64 on an amd64 host) run under qemu through its binfmt handler, and, with a fake binfmt_misc folder, a
handler missing or disabled. The images are real: a Debian base with python3 if the engine holds one,
else a rootfs of python3 and dash unpacked by `mmdebstrap --variant=extract` (no emulated dpkg runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.flows import doctor
from imagebuild.knowledge.rules.host import BINFMT_FIX, platform_finding
from imagebuild.cli import app as cli
from imagebuild.errors import EXIT_FAILED, EXIT_OK
from tests.conftest import cannot_run

NATIVE = doctor.host_arch()
FOREIGN = "arm64" if NATIVE == "amd64" else "amd64"
UNAME_M = {"amd64": "x86_64", "arm64": "aarch64"}
EXTRACT = ["--variant=extract", "--include=python3-minimal,libpython3.11-stdlib,dash",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*", "--format=tar"]


def need_emulation(arch: str) -> None:
    handler = doctor.binfmt_handler(arch)
    if not handler["enabled"]:
        cannot_run(f"no enabled binfmt handler {handler['handler']} ({handler['path']})",
                   f"`{BINFMT_FIX}` registers it")


def debian_base(engine, arch: str) -> str | None:
    """An imagebuild/base:bookworm-ARCH-* image already in the engine (it has python3), else None."""
    listed = subprocess.run(engine.command("images", "--format", "{{.Repository}}:{{.Tag}}", "imagebuild/base"),
                            capture_output=True, text=True, check=False).stdout.split()
    return next((ref for ref in sorted(listed) if ref.startswith(f"imagebuild/base:bookworm-{arch}-")), None)


@pytest.fixture(scope="module")
def python_image(engine, tmp_path_factory):
    """python_image(arch): an image of that platform with python3; what it builds is removed at the end."""
    made: dict[str, str] = {}

    def image(arch: str) -> str:
        if arch in made:
            return made[arch]
        base = debian_base(engine, arch)
        if base:
            return base
        if shutil.which("mmdebstrap") is None:
            cannot_run(f"no imagebuild/base:bookworm-{arch}-* image and no mmdebstrap to make a rootfs",
                       "apt-get install -y mmdebstrap")
        context = tmp_path_factory.mktemp(f"python-{arch}")
        done = subprocess.run(["mmdebstrap", *EXTRACT, f"--architectures={arch}", "bookworm",
                               str(context / "rootfs.tar")], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            cannot_run(f"mmdebstrap could not fetch bookworm/{arch}: {done.stderr.strip()[-300:]}",
                       "a reachable Debian mirror")
        (context / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\n")
        ref = f"imagebuild-test/doctor-python:{os.getpid()}-{arch}"
        built = subprocess.run(engine.command("build", "--quiet", "--platform", f"linux/{arch}", "-t", ref,
                                              str(context)), env={**os.environ, "DOCKER_BUILDKIT": "1"},
                               capture_output=True, text=True, check=False)
        assert built.returncode == 0, built.stderr[-2000:]
        made[arch] = ref
        return ref
    yield image
    for ref in made.values():
        engine.remove(ref)


def platform_of(report) -> dict:
    return next(f.to_probe() for f in report.findings if f.rule == "platform")


def run_cli(capsys, *argv) -> tuple[int, str]:
    status = cli.main(["doctor", *argv])
    return status, capsys.readouterr().out


# ---------------------------------------------------------------- with the engine

@pytest.mark.engine
def test_image_of_the_hosts_platform_passes(engine, python_image, capsys):
    image = python_image(NATIVE)
    report = doctor.diagnose_image(image, engine)
    assert report.platform == {"image": f"linux/{NATIVE}", "host": f"linux/{NATIVE}", "emulated": False,
                               "binfmt": None}
    assert platform_of(report)["status"] == "pass" and report.ok
    assert UNAME_M[NATIVE] in report.host["platform"]
    status, out = run_cli(capsys, "--image", image, "--json")
    assert status == EXIT_OK and json.loads(out)["platform"]["image"] == f"linux/{NATIVE}"


@pytest.mark.engine
def test_image_of_the_other_platform_runs_emulated_and_says_so(engine, python_image, capsys):
    need_emulation(FOREIGN)
    image = python_image(FOREIGN)
    report = doctor.diagnose_image(image, engine)
    assert report.platform["image"].startswith(f"linux/{FOREIGN}") and report.platform["emulated"] is True
    assert report.platform["binfmt"]["handler"] == f"qemu-{UNAME_M[FOREIGN]}" and report.platform["binfmt"]["enabled"]
    finding = platform_of(report)
    assert finding["status"] == "warn" and "runs under emulation" in finding["detail"] and report.ok
    assert UNAME_M[FOREIGN] in report.host["platform"]  # the probe itself saw the emulated machine
    status, out = run_cli(capsys, "--image", image, "--json")
    assert status == EXIT_OK and json.loads(out)["platform"]["emulated"] is True
    status, out = run_cli(capsys, "--image", image)
    assert status == EXIT_OK and f"platform: linux/{FOREIGN}" in out and "runs under emulation" in " ".join(out.split())


@pytest.mark.engine
def test_no_binfmt_handler_is_one_failing_finding_with_the_install_command(engine, python_image, tmp_path,
                                                                         monkeypatch, capsys):
    """A fake, empty binfmt_misc folder: the container is never started, and the CLI prints the fix."""
    image = python_image(FOREIGN)
    monkeypatch.setattr(doctor, "BINFMT_DIR", tmp_path)
    status, out = run_cli(capsys, "--image", image, "--json")
    report = json.loads(out)
    assert status == EXIT_FAILED and report["ok"] is False and report["facts"] == {}
    assert [f["name"] for f in report["findings"]] == ["platform"]
    assert report["platform"]["binfmt"] == {"handler": f"qemu-{UNAME_M[FOREIGN]}",
                                            "path": str(tmp_path / f"qemu-{UNAME_M[FOREIGN]}"),
                                            "registered": False, "enabled": False}
    assert report["findings"][0]["fix"].startswith("apt-get install qemu-user-static binfmt-support")
    status, out = run_cli(capsys, "--image", image)
    text = " ".join(out.split())
    assert status == EXIT_FAILED and "is not registered" in text and "Traceback" not in out
    assert "fix: apt-get install qemu-user-static binfmt-support" in text


# ---------------------------------------------------------------- the rule, no engine

def test_a_disabled_handler_is_enabled_again_not_reinstalled(tmp_path):
    (tmp_path / "qemu-aarch64").write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    finding = platform_finding(doctor.image_platform("linux/arm64/v8", "x86_64", tmp_path)).to_probe()
    assert finding["status"] == "fail" and "qemu-aarch64 is disabled" in finding["detail"]
    assert finding["fix"].startswith("update-binfmts --enable qemu-aarch64")


def test_an_arm64_host_runs_amd64_images_through_qemu_x86_64(tmp_path):
    (tmp_path / "qemu-x86_64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/x86_64-binfmt-P\n")
    runs = doctor.image_platform("linux/amd64", "aarch64", tmp_path)
    assert runs["host"] == "linux/arm64" and runs["binfmt"]["handler"] == "qemu-x86_64"
    finding = platform_finding(runs).to_probe()
    assert finding["status"] == "warn" and "driver libraries here are arm64" in finding["detail"]
    assert platform_finding(doctor.image_platform("linux/arm64", "arm64")).to_probe()["status"] == "pass"
    unknown = platform_finding(doctor.image_platform("linux/mips64le", "x86_64", tmp_path)).to_probe()
    assert unknown["status"] == "fail" and "knows no qemu handler" in unknown["detail"]


@given(st.text(max_size=30), st.text(max_size=12))
def test_platform_rule_never_raises(image, machine):
    runs = doctor.image_platform(image, machine, Path("/nonexistent-binfmt_misc"))
    assert platform_finding(runs).to_probe()["status"] in ("pass", "warn", "fail")
    json.dumps(runs)
