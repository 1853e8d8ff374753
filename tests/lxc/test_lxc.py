"""Proxmox publishing: the rootfs filter on built tars and on garbage, atomic writes, GPU passthrough
lines from fake host trees, and, with the engine, real templates unpacked the way pve-container does
(uid shift of 100000) and booted with systemd-nspawn until the image's own probe passes inside."""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.cli import app as cli
from imagebuild.errors import ToolMissing
from imagebuild.render.paths import PROBE_COMMAND
from imagebuild.lxc import lxc, lxc_gpu, rootfs_filter
from tests.conftest import cannot_run

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN_RECIPE = ROOT / "recipes" / "cuda-toolchain.toml"
PROBE = " ".join(PROBE_COMMAND)  # the smoke test's own command
SHIFT = 100000  # pve-container's default map for unprivileged containers: u:0:100000:65536
# pve-container's extraction: src/PVE/LXC/Create.pm plus PVE::Storage::Plugin::COMMON_TAR_FLAGS.
PROXMOX_TAR = ["tar", "xpf", "-", "--totals", "--one-file-system", "-p", "--sparse", "--numeric-owner",
               "--acls", "--xattrs", "--xattrs-include=user.*", "--xattrs-include=security.capability",
               "--warning=no-file-ignored", "--warning=no-xattr-write", "--skip-old-files",
               "--anchored", "--exclude", "./dev/*"]
OS_RELEASE = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'


# ---------------------------------------------------------------- rootfs tars made here

def entry(name, data=b"", *, kind=tarfile.REGTYPE, uid=0, gid=0, mode=0o644, link="", mtime=1700000000):
    return dict(name=name, data=data, kind=kind, uid=uid, gid=gid, mode=mode, link=link, mtime=mtime)


def directory(name, **kw):
    return entry(name, kind=tarfile.DIRTYPE, mode=0o755, **kw)


def symlink(name, target):
    return entry(name, kind=tarfile.SYMTYPE, link=target, mode=0o777)


def debian_rootfs(*extra, os_release=True, debian_version=b"12.12\n"):
    """What `docker export` gives for a merged-/usr Debian image, in its order, with its /dev."""
    entries = [entry(".dockerenv", mode=0o755), symlink("bin", "usr/bin"), directory("dev"),
               entry("dev/console", mode=0o755), entry("dev/null", kind=tarfile.CHRTYPE, mode=0o666),
               directory("dev/pts"), symlink("dev/stdin", "/proc/self/fd/0"), directory("etc"),
               entry("etc/bash.bashrc", b"# System-wide .bashrc\n"), entry("etc/environment"),
               entry("etc/hostname", mode=0o755), directory("etc/profile.d"),
               symlink("lib", "usr/lib"), symlink("sbin", "usr/sbin"), directory("usr"),
               directory("usr/bin"), entry("usr/bin/sh", b"\x7fELF", mode=0o755), directory("usr/lib"),
               directory("usr/sbin")]
    if os_release:
        entries.insert(entries.index(directory("etc")) + 1, symlink("etc/os-release", "../usr/lib/os-release"))
        entries.append(entry("usr/lib/os-release", OS_RELEASE))
    if debian_version is not None:
        entries.append(entry("etc/debian_version", debian_version))
    return entries + list(extra)


def make_tar(entries) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e["name"])
            info.type, info.uid, info.gid, info.mode = e["kind"], e["uid"], e["gid"], e["mode"]
            info.linkname, info.mtime = e["link"], e["mtime"]
            if e["kind"] == tarfile.CHRTYPE:
                info.devmajor, info.devminor = 1, 3
            info.size = len(e["data"]) if e["kind"] == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(e["data"]) if info.size else None)
    return buffer.getvalue()


def run_filter(entries, plan=rootfs_filter.TemplatePlan(env=("PATH=/opt/venv/bin:/usr/bin", "CUDA_HOME=/opt/cuda"),
                                              command=("python",), epoch=1700000000)):
    sink = io.BytesIO()
    summary = rootfs_filter.filter_rootfs(io.BytesIO(make_tar(entries) if isinstance(entries, list) else entries),
                                sink, plan)
    sink.seek(0)
    with tarfile.open(fileobj=sink) as tar:
        members = {m.name: (m, tar.extractfile(m).read() if m.isreg() else None) for m in tar}
    return summary, members


def test_dev_entries_and_the_dockerenv_are_dropped_and_the_dev_folder_stays():
    summary, members = run_filter(debian_rootfs(entry("opt/disk", kind=tarfile.BLKTYPE)))
    assert "./dev" in members and members["./dev"][0].isdir()
    assert not [name for name in members if name.startswith("./dev/")]
    assert "./.dockerenv" not in members and "./opt/disk" not in members
    assert summary.dropped == ["/.dockerenv", "/opt/disk"]


def test_every_name_sits_under_dot_slash_once():
    entries = debian_rootfs(entry("opt/a", b"x"), entry("opt/b", kind=tarfile.LNKTYPE, link="opt/a"),
                            entry("/abs/c", b"y"), entry("./dot/d", b"z"))
    _, members = run_filter(entries)
    names = [name for name in members]
    assert all(name == "." or name.startswith("./") for name in names)
    assert len(names) == len(set(names))  # pve-container unpacks with --skip-old-files: first wins
    assert members["./opt/b"][0].linkname == "./opt/a" and "./abs/c" in members and "./dot/d" in members


def test_an_owner_outside_the_unprivileged_range_names_the_file():
    with pytest.raises(rootfs_filter.OwnerOutOfRange, match=r"/opt/data/model\.bin is owned by 100000:0"):
        run_filter(debian_rootfs(entry("opt/data/model.bin", b"w", uid=100000)))
    with pytest.raises(rootfs_filter.OwnerOutOfRange, match="65536"):
        run_filter(debian_rootfs(entry("opt/x", gid=65536)))
    summary, members = run_filter(debian_rootfs(entry("opt/edge", uid=65535, gid=65535)))
    assert members["./opt/edge"][0].uid == 65535


def test_missing_os_release_is_refused():
    with pytest.raises(rootfs_filter.NotAProxmoxOs, match="no /etc/os-release"):
        run_filter(debian_rootfs(os_release=False))


def test_debian_without_its_version_file_is_refused():
    with pytest.raises(rootfs_filter.NotAProxmoxOs, match="etc/debian_version is missing"):
        run_filter(debian_rootfs(debian_version=None))
    with pytest.raises(rootfs_filter.NotAProxmoxOs, match="missing or empty"):
        run_filter(debian_rootfs(debian_version=b"\n"))


def test_an_os_proxmox_cannot_set_up_is_refused():
    entries = [e for e in debian_rootfs() if e["name"] != "usr/lib/os-release"]
    with pytest.raises(rootfs_filter.NotAProxmoxOs, match="ID='wolfi'"):
        run_filter(entries + [entry("usr/lib/os-release", b"ID=wolfi\n")])


def test_os_facts_are_read_through_the_os_release_link():
    summary, _ = run_filter(debian_rootfs())
    assert summary.os == {"id": "debian", "version_id": "12", "version_file": "etc/debian_version",
                          "version": "12.12"}


def test_without_an_init_the_shim_lands_through_the_merged_usr_link():
    summary, members = run_filter(debian_rootfs())
    assert summary.init == "shim"
    init, text = members["./usr/sbin/init"]
    assert init.mode == 0o755 and text.startswith(b"#!/bin/sh\n") and "./sbin/init" not in members
    assert members["./etc/imagebuild/command"][1].endswith(b"set -- python\n")
    assert members["./etc/imagebuild"][0].isdir()
    script = members["./etc/profile.d/imagebuild.sh"][1].decode()
    assert "export PATH=/opt/venv/bin:/usr/bin\n" in script and "export CUDA_HOME=/opt/cuda\n" in script
    assert members["./etc/environment"][1].endswith(b"PATH=/opt/venv/bin:/usr/bin\nCUDA_HOME=/opt/cuda\n")
    bashrc = members["./etc/bash.bashrc"][1]
    assert bashrc.startswith(b"# System-wide .bashrc\n") and b". /etc/profile.d/imagebuild.sh" in bashrc


def test_the_image_init_is_kept_in_auto_mode_and_replaced_in_shim_mode():
    systemd = [directory("usr/lib/systemd"), entry("usr/lib/systemd/systemd", b"\x7fELF", mode=0o755),
               symlink("usr/sbin/init", "../lib/systemd/systemd")]
    summary, members = run_filter(debian_rootfs(*systemd))
    assert summary.init == "image" and members["./usr/sbin/init"][0].issym()
    assert "./etc/imagebuild/command" not in members
    plan = rootfs_filter.TemplatePlan(init="shim", epoch=0)
    summary, members = run_filter(debian_rootfs(*systemd), plan)
    assert summary.init == "shim" and members["./usr/sbin/init"][0].isreg()
    assert "./usr/lib/systemd/systemd" in members  # the link was replaced, not what it points to


def test_init_image_without_one_is_refused():
    with pytest.raises(rootfs_filter.NotAProxmoxOs, match="no /sbin/init"):
        run_filter(debian_rootfs(), rootfs_filter.TemplatePlan(init="image"))


def test_command_and_environment_files_quote_what_they_carry():
    env = ("A=plain", "B=two words", "C=it's", "D=x\"y", "bad-name=1")
    plan = rootfs_filter.TemplatePlan(env=env, command=("sh", "-c", "echo $HOME; exit 3"), workdir="/srv/my app")
    summary, members = run_filter(debian_rootfs(), plan)
    command = members["./etc/imagebuild/command"][1].decode()
    assert "cd '/srv/my app' 2>/dev/null || cd /\n" in command
    assert "set -- sh -c 'echo $HOME; exit 3'\n" in command
    environment = members["./etc/environment"][1].decode()
    assert "A=plain\n" in environment and 'B="two words"\n' in environment and "D=" not in environment
    assert any("bad-name" in w for w in summary.warnings) and any("ENV D" in w for w in summary.warnings)
    script = members["./etc/profile.d/imagebuild.sh"][1].decode()
    result = subprocess.run(["sh", "-c", script + 'printf "%s|%s|%s|%s" "$A" "$B" "$C" "$D"'],
                            capture_output=True, text=True, check=True)
    assert result.stdout == "plain|two words|it's|x\"y"


def test_mtimes_are_clamped_and_the_output_is_the_same_twice():
    entries = debian_rootfs(entry("opt/new", b"n", mtime=2000000000), entry("opt/old", b"o", mtime=5))
    plan = rootfs_filter.TemplatePlan(epoch=1800000000)
    one, two = io.BytesIO(), io.BytesIO()
    rootfs_filter.filter_rootfs(io.BytesIO(make_tar(entries)), one, plan)
    rootfs_filter.filter_rootfs(io.BytesIO(make_tar(entries)), two, plan)
    assert one.getvalue() == two.getvalue()
    one.seek(0)
    with tarfile.open(fileobj=one) as tar:
        assert tar.getmember("./opt/new").mtime == 1800000000 and tar.getmember("./opt/old").mtime == 5


def test_driver_libraries_are_found_and_stubs_pass_unless_loaded():
    assert rootfs_filter.is_driver_library("usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert rootfs_filter.is_driver_library("opt/x/libcuda.so")
    assert not rootfs_filter.is_driver_library("opt/cuda/lib64/stubs/libcuda.so")
    assert rootfs_filter.is_driver_library("opt/cuda/lib64/stubs/libcuda.so",
                                 ["LD_LIBRARY_PATH=/opt/lib:/opt/cuda/lib64/stubs/"])
    assert not rootfs_filter.is_driver_library("opt/cuda/lib/libcudart.so.13")
    summary, _ = run_filter(debian_rootfs(entry("usr/lib/libcuda.so.1", b"\x7fELF"),
                                          symlink("usr/lib/libcuda.so", "libcuda.so.1")))
    assert summary.driver_libraries == ["/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so"]


@pytest.mark.parametrize("cut", [100, 700, 1500, -1024, -512, -1])
def test_a_truncated_stream_is_refused(cut):
    data = make_tar(debian_rootfs(entry("opt/blob", os.urandom(3000))))
    with pytest.raises(rootfs_filter.UnreadableRootfs):
        run_filter(data[:cut] if cut > 0 else data[:len(data) + cut - 9216])


def test_names_that_climb_out_are_refused():
    with pytest.raises(rootfs_filter.UnreadableRootfs, match="climbs out"):
        run_filter(debian_rootfs(entry("../etc/passwd", b"x")))


# ---------------------------------------------------------------- hypothesis: garbage in, clear errors out

def _filter_or_refuse(data: bytes) -> None:
    try:
        rootfs_filter.filter_rootfs(io.BytesIO(data), io.BytesIO(), rootfs_filter.TemplatePlan(epoch=0))
    except rootfs_filter.TemplateError as err:
        assert str(err)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_give_a_template_error_never_a_traceback(data):
    _filter_or_refuse(data)


_names = st.text(st.sampled_from("abc./-_é\x00\udcff"), min_size=1, max_size=40)
_members = st.lists(st.fixed_dictionaries({
    "name": _names, "data": st.binary(max_size=600),
    "kind": st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                             tarfile.CHRTYPE, tarfile.FIFOTYPE, b"V", b"x", b"g"]),
    "uid": st.integers(0, 70000), "gid": st.integers(0, 70000), "mode": st.integers(0, 0o7777),
    "link": _names, "mtime": st.integers(-10, 2**34)}), max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_members, st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), max_size=6),
       st.one_of(st.none(), st.integers(0, 10**5)))
def test_damaged_tar_streams_give_a_template_error_never_a_traceback(members, flips, cut):
    try:
        data = bytearray(make_tar(debian_rootfs() + [
            entry(m["name"], m["data"] if m["kind"] == tarfile.REGTYPE else b"", kind=m["kind"],
                  uid=m["uid"], gid=m["gid"], mode=m["mode"], link=m["link"], mtime=m["mtime"])
            for m in members]))
    except (ValueError, UnicodeError):
        return  # tarfile cannot write that member; nothing to feed the filter
    for offset, value in flips:
        data[offset % len(data)] = value
    _filter_or_refuse(bytes(data[:cut] if cut is not None else data))


@given(st.text(max_size=2000))
def test_proc_devices_parser_never_raises(text):
    devices = lxc_gpu.parse_proc_devices(text)
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in devices.items())


# ---------------------------------------------------------------- writing the file

def test_compression_comes_from_the_suffix(tmp_path):
    assert lxc.compression_for(Path("a.tar.zst")) == "zst"
    assert lxc.compression_for(Path("a.tar.xz"), "xz") == "xz"
    with pytest.raises(rootfs_filter.TemplateError, match="--compress gz"):
        lxc.compression_for(Path("a.tar.zst"), "gz")
    with pytest.raises(rootfs_filter.TemplateError, match="ends with .tar.zst, .tar.gz or .tar.xz"):
        lxc.compression_for(Path("a.zst"))
    assert lxc.default_name("imagebuild/cuda-toolchain:13.0") == "imagebuild-cuda-toolchain_13.0_amd64.tar.zst"
    assert lxc.default_name("localhost:5000/x", "xz") == "localhost-5000-x_latest_amd64.tar.xz"
    assert lxc.default_name("x:1", oci=True) == "x_1_amd64.tar"


@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz", ".tar.xz"])
def test_each_compressor_writes_what_tar_reads(tmp_path, suffix):
    out = tmp_path / f"t{suffix}"
    summary, size, digest = lxc.write_template(io.BytesIO(make_tar(debian_rootfs())), out,
                                               rootfs_filter.TemplatePlan(epoch=0), lxc.compression_for(out))
    assert out.stat().st_size == size and out.stat().st_mode & 0o777 == 0o644
    flag = {".tar.zst": "--zstd", ".tar.gz": "-z", ".tar.xz": "-J"}[suffix]
    listing = subprocess.run(["tar", "tf", str(out), flag], capture_output=True, text=True, check=True)
    assert "./usr/sbin/init" in listing.stdout.split() and os.listdir(tmp_path) == [out.name]


class _Failing(io.RawIOBase):
    """A source that gives `good` bytes, then raises `error` (an engine that dies mid-stream)."""

    def __init__(self, data: bytes, good: int, error: BaseException):
        self.data, self.good, self.error, self.at = data, good, error, 0

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.at >= self.good:
            raise self.error
        n = min(len(buffer), self.good - self.at)
        buffer[:n] = self.data[self.at:self.at + n]
        self.at += n
        return n


@pytest.mark.parametrize("error", [ConnectionResetError("engine went away"), KeyboardInterrupt()])
def test_a_failure_mid_stream_leaves_no_file(tmp_path, error):
    data = make_tar(debian_rootfs(entry("opt/blob", os.urandom(1 << 20))))
    out = tmp_path / "t.tar.zst"
    with pytest.raises(type(error)):
        lxc.write_template(io.BufferedReader(_Failing(data, 600_000, error)), out, rootfs_filter.TemplatePlan())
    assert os.listdir(tmp_path) == []


def test_a_refused_rootfs_leaves_no_file(tmp_path):
    with pytest.raises(rootfs_filter.OwnerOutOfRange):
        lxc.write_template(io.BytesIO(make_tar(debian_rootfs(entry("opt/x", uid=70000)))),
                           tmp_path / "t.tar.zst", rootfs_filter.TemplatePlan())
    assert os.listdir(tmp_path) == []


def test_a_missing_compressor_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolMissing, match="apt-get install -y zstd"):
        lxc.compressor_command("zst")


# ---------------------------------------------------------------- GPU passthrough from fake host trees

FAKE_PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  5 /dev/tty
 10 misc
 89 i2c
128 ptm
136 pts
195 nvidia
195 nvidiactl
226 drm
234 ipmidev
505 nvidia-caps-imex-channels
506 nvidia-caps
507 nvidia-uvm

Block devices:
  7 loop
  8 sd
259 blkext
"""


def fake_host(tmp_path, gpus=(0, 1), devices=FAKE_PROC_DEVICES, nodes=("nvidiactl", "nvidia-uvm",
              "nvidia-uvm-tools", "nvidia-modeset")) -> Path:
    """A fake host root: proc/devices text and dev/ with plain files named like the driver's nodes."""
    root = tmp_path / "fake-host"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "devices").write_text(devices)
    (root / "dev" / "nvidia-caps").mkdir(parents=True)
    for node in [f"nvidia{gpu}" for gpu in gpus] + list(nodes):
        (root / "dev" / node).touch()
    return root


def test_fake_host_all_gpus(tmp_path):
    config = lxc_gpu.gpu_passthrough("all", fake_host(tmp_path, gpus=(0, 1, 2)))
    assert config.gpus == (0, 1, 2) and config.uvm_major == 507 and config.caps_major == 506
    assert config.lines == (
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 507:* rwm",
        "lxc.cgroup2.devices.allow: c 506:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir")
    assert config.warnings == ()


def test_fake_host_the_gpus_asked_for_only(tmp_path):
    config = lxc_gpu.gpu_passthrough("1,3", fake_host(tmp_path, gpus=(0, 1, 2, 3)))
    mounted = [line.split()[1] for line in config.lines if line.startswith("lxc.mount.entry")]
    assert mounted[:2] == ["/dev/nvidia1", "/dev/nvidia3"] and "/dev/nvidia0" not in mounted


def test_fake_host_uvm_major_is_read_not_assumed(tmp_path):
    devices = FAKE_PROC_DEVICES.replace("507 nvidia-uvm", "238 nvidia-uvm").replace("506 nvidia-caps\n", "")
    config = lxc_gpu.gpu_passthrough("0", fake_host(tmp_path, devices=devices))
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in config.lines and config.caps_major is None
    assert sum(line.startswith("lxc.cgroup2") for line in config.lines) == 2


def test_fake_host_errors_say_what_is_missing(tmp_path):
    with pytest.raises(lxc_gpu.NoGpuDevices, match=r"no /dev/nvidia2 on this host \(it has nvidia0, nvidia1\)"):
        lxc_gpu.gpu_passthrough("0,2", fake_host(tmp_path))
    no_uvm = fake_host(tmp_path / "b", devices=FAKE_PROC_DEVICES.replace("507 nvidia-uvm\n", ""))
    with pytest.raises(lxc_gpu.NoGpuDevices, match="modprobe nvidia-uvm"):
        lxc_gpu.gpu_passthrough("all", no_uvm)
    with pytest.raises(lxc_gpu.NoGpuDevices, match="is the NVIDIA driver loaded"):
        lxc_gpu.gpu_passthrough("all", fake_host(tmp_path / "c", gpus=()))
    with pytest.raises(lxc_gpu.NoGpuDevices, match="cannot read"):
        lxc_gpu.gpu_passthrough("all", tmp_path / "nowhere")
    for bad in ("", "x", "0,0", "-1", "1,,2"):
        with pytest.raises(lxc_gpu.NoGpuDevices, match="--gpus"):
            lxc_gpu.parse_gpus(bad)


def test_fake_host_missing_nodes_are_warnings(tmp_path):
    config = lxc_gpu.gpu_passthrough("all", fake_host(tmp_path, nodes=("nvidiactl",)))
    assert any("nvidia-uvm does not exist" in w and "nvidia-modprobe" in w for w in config.warnings)
    assert any("lxc.mount.entry: /dev/nvidia-uvm " in line for line in config.lines)


def test_proc_devices_parser_reads_character_devices_only():
    devices = lxc_gpu.parse_proc_devices(FAKE_PROC_DEVICES + "Character devices:\n 9 late\n")
    assert devices["nvidia-uvm"] == 507 and devices["nvidiactl"] == 195 and devices["late"] == 9
    assert "loop" not in devices and "sd" not in devices


@pytest.fixture
def lxc_cli(monkeypatch):
    return cli.main


def test_lxc_config_cli_on_a_fake_host(tmp_path, lxc_cli, capsys):
    root = fake_host(tmp_path)
    assert lxc_cli(["lxc-config", "--gpus", "0", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lxc.cgroup2.devices.allow: c 195:* rwm" and len(lines) == 9
    assert lxc_cli(["lxc-config", "--gpus", "all", "--root", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == [0, 1] and data["uvm_major"] == 507 and data["ok"] is True
    assert lxc_cli(["lxc-config", "--gpus", "5", "--root", str(root), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "NoGpuDevices"


def test_lxc_syntax_is_what_pve_container_writes_for_raw_lxc_keys(tmp_path, lxc_cli, capsys):
    config = lxc_gpu.gpu_passthrough("0", fake_host(tmp_path))
    plain = lxc_gpu.lxc_syntax(config.lines)
    assert plain[0] == "lxc.cgroup2.devices.allow = c 195:* rwm"  # the value's own colon stays
    assert plain[3] == "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"
    assert len(plain) == len(config.lines) and all(" = " in line and ": " not in line.split(" = ")[0] for line in plain)
    assert lxc_cli(["lxc-config", "--gpus", "0", "--root", str(fake_host(tmp_path / "b")), "--format", "lxc"]) == 0
    assert tuple(capsys.readouterr().out.splitlines()) == plain
    assert lxc_cli(["lxc-config", "--gpus", "0", "--root", str(fake_host(tmp_path / "c")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "pve" and data["lines"][0] == "lxc.cgroup2.devices.allow: c 195:* rwm"


# ---------------------------------------------------------------- with the engine

docker_needed = pytest.mark.engine


@pytest.fixture(scope="module")
def engine():
    from imagebuild.engine import default_engine
    engine = default_engine("docker")
    try:
        engine.check()
    except Exception as err:  # noqa: BLE001
        cannot_run(f"no Docker engine: {err}", "scripts/host.sh installs docker.io and starts dockerd")
    return engine


@pytest.fixture
def fake_image(engine, tmp_path):
    """Small images made with `docker import` from tars built here (no command, nothing to run)."""
    made = []

    def make(entries) -> str:
        tar = tmp_path / f"fake-{len(made)}.tar"
        tar.write_bytes(make_tar(entries))
        ref = f"imagebuild-test/lxc-fake:{os.getpid()}-{len(made)}"
        engine.import_rootfs(tar, ref)
        made.append(ref)
        return ref
    yield make
    for ref in made:
        engine.remove(ref)


def _export_containers(engine) -> list:
    return engine.client.api.containers(all=True, filters={"label": "io.imagebuild.role=export"})


@docker_needed
def test_fake_image_with_libcuda_is_refused_by_lxc_config(fake_image, tmp_path, lxc_cli, capsys):
    bad = fake_image(debian_rootfs(directory("usr/lib/x86_64-linux-gnu"),
                                   entry("usr/lib/x86_64-linux-gnu/libcuda.so.595.71.05", b"\x7fELF"),
                                   symlink("usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.595.71.05")))
    good = fake_image(debian_rootfs(directory("opt/cuda/lib64/stubs"),
                                    entry("opt/cuda/lib64/stubs/libcuda.so", b"\x7fELF")))
    root = fake_host(tmp_path)
    assert lxc_cli(["lxc-config", "--root", str(root), "--image", bad, "--json"]) == 1
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "DriverInImage" and "libcuda.so.595.71.05" in error["message"]
    assert lxc_cli(["lxc-config", "--root", str(root), "--image", good, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["image"]["driver_libraries"] == []


@docker_needed
@pytest.mark.parametrize("problem, entries, error", [
    ("owner", debian_rootfs(entry("opt/model.bin", b"w", uid=200000)), "OwnerOutOfRange"),
    ("os-release", debian_rootfs(os_release=False), "NotAProxmoxOs"),
])
def test_fake_image_that_cannot_be_a_template_leaves_nothing(engine, fake_image, tmp_path, lxc_cli,
                                                             capsys, problem, entries, error):
    out = tmp_path / "out" / "t.tar.zst"
    out.parent.mkdir()
    assert lxc_cli(["export-lxc", fake_image(entries), "-o", str(out), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["error"] == error and (problem != "owner" or "/opt/model.bin" in report["message"])
    assert os.listdir(out.parent) == [] and _export_containers(engine) == []


@docker_needed
@pytest.mark.parametrize("writer", ["imagebuild", "skopeo"])
def test_fake_image_as_an_oci_archive_proxmox_recognizes(engine, fake_image, tmp_path, writer):
    if writer == "skopeo" and shutil.which("skopeo") is None:
        cannot_run("skopeo is not installed", "apt-get install -y skopeo")
    image = fake_image(debian_rootfs(entry("opt/app", b"app")))
    out = tmp_path / "out" / "app.tar"
    report = lxc.export_oci(engine, image, out, writer=writer)
    assert report.tool == ("imagebuild.oci" if writer == "imagebuild" else "skopeo")
    with tarfile.open(out) as tar:  # what pve-container's archive_is_oci_format looks for
        names = tar.getnames()
    assert "oci-layout" in names and "index.json" in names and any(n.startswith("blobs/") for n in names)
    assert os.listdir(out.parent) == ["app.tar"]


@pytest.fixture(scope="module")
def toolchain(engine, tmp_path_factory):
    """The cuda-toolchain image, built through the library API if absent, under a tag of our own
    (other runs may remove the shared tag meanwhile); what this fixture made, it removes."""
    from imagebuild import flows
    ref = f"imagebuild-test/lxc-toolchain:{os.getpid()}"
    report = flows.build(TOOLCHAIN_RECIPE, engine, flows.BuildOptions(tag=ref))  # reused from the builder cache when built
    yield ref
    engine.remove(report.image)


def need_nspawn() -> None:
    """Locally a skip; under CI=true a failure, so that a missing install step cannot hide."""
    if shutil.which("systemd-nspawn") is None:
        cannot_run("systemd-nspawn missing", "apt-get install -y systemd-container")


def in_user_namespace(argv, *, stdin: Path, cwd: Path, shift=SHIFT, count=65536) -> int:
    """Run argv as root of a new user namespace with u:0:shift:count and g:0:shift:count, as
    pve-container does with lxc-usernsexec; like it, the archive is opened outside and given as stdin."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: unshare, wait for its maps, become root there, run tar
        try:
            os.close(ready_r)
            os.close(go_w)
            os.dup2(os.open(stdin, os.O_RDONLY), 0)
            os.chdir(cwd)
            if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
                os._exit(121)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            os.setgid(0)
            os.setgroups([])
            os.setuid(0)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    os.close(ready_w)
    os.close(go_r)
    os.read(ready_r, 1)
    for kind in ("uid_map", "gid_map"):
        Path(f"/proc/{pid}/{kind}").write_text(f"0 {shift} {count}\n")
    os.write(go_w, b"x")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def nspawn(root: Path, *args, boot=True, timeout=900) -> subprocess.CompletedProcess:
    command = ["systemd-nspawn", "--quiet", "--directory", str(root), f"--private-users={SHIFT}:65536",
               "--private-network", "--register=no", "--keep-unit", "--console=pipe"]
    command += ["--boot"] if boot else []
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def unpacked(engine, toolchain, tmp_path_factory):
    """The toolchain exported through the CLI with the probe as the shim's command, then unpacked
    as pve-container does: tar under the uid shift into the (shifted) root of the volume."""
    need_nspawn()
    work = tmp_path_factory.mktemp("lxc")
    out = work / "toolchain.tar.zst"
    code = "import sys, imagebuild.cli.app as c; sys.exit(c.main(sys.argv[1:]))"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "export-lxc", toolchain, "-o", str(out),
                           "--cmd", PROBE, "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout) | {"wall_s": time.monotonic() - started}
    root = work / "rootfs"
    root.mkdir()
    os.chown(root, SHIFT, SHIFT)
    assert in_user_namespace(PROXMOX_TAR + ["--zstd", "-C", "."], stdin=out, cwd=root) == 0
    yield report, root
    shutil.rmtree(work)


@docker_needed
def test_toolchain_template_unpacked_like_proxmox_has_its_layout(engine, unpacked):
    report, root = unpacked
    print(f"export: {report['wall_s']:.1f} s, {report['size'] / 1e6:.0f} MB")
    assert report["rootfs"]["os"]["id"] == "debian" and report["rootfs"]["init"] == "shim"
    assert report["rootfs"]["driver_libraries"] == [] and _export_containers(engine) == []
    owners = {(st.st_uid, st.st_gid) for st in (os.lstat(p) for p in [root, *root.rglob("*")])}
    assert all(SHIFT <= u < SHIFT + 65536 and SHIFT <= g < SHIFT + 65536 for u, g in owners)
    assert (SHIFT, SHIFT) in owners and os.listdir(root / "dev") == []
    init = root / "usr/sbin/init"
    assert init.stat().st_mode & 0o111 and init.stat().st_uid == SHIFT
    assert "ID=debian" in (root / "etc/os-release").resolve().read_text().split()
    assert not (root / ".dockerenv").exists()


@docker_needed
def test_toolchain_template_boots_and_its_probe_passes_as_in_docker(engine, toolchain, unpacked):
    _, root = unpacked
    booted = nspawn(root)  # /sbin/init as PID 1, as LXC starts it; the shim runs the probe
    assert "{" in booted.stdout, booted.stderr[-3000:]
    probe = json.loads(booted.stdout[booted.stdout.index("{"):])
    assert booted.returncode == 0 and probe["ok"], booted.stdout[-3000:] + booted.stderr[-2000:]
    statuses = {c["name"]: c["status"] for c in probe["checks"]}
    assert statuses["deep-gemm-sm120"] == "pass"  # nvcc in the container compiled the SM120 kernels
    docker = pipeline_smoke(engine, toolchain)
    assert statuses == {c["name"]: c["status"] for c in docker["checks"]}


@docker_needed
def test_toolchain_template_login_and_attach_shells_get_the_image_env(engine, toolchain, unpacked):
    _, root = unpacked
    cuda_home = next(v.split("=", 1)[1] for v in engine.inspect(toolchain).env if v.startswith("CUDA_HOME="))
    for shell in (["bash", "-lc"], ["bash", "-ic"]):  # a login shell, and `pct enter`'s interactive one
        seen = nspawn(root, "env", "-i", "TERM=dumb", *shell, "echo $CUDA_HOME; command -v nvcc", boot=False)
        assert seen.stdout.split()[-2:] == [cuda_home, f"{cuda_home}/bin/nvcc"], seen.stderr


@docker_needed
def test_toolchain_template_idles_and_stops_on_lxcs_halt_signal(unpacked):
    _, root = unpacked
    command = root / "etc/imagebuild/command"
    saved = command.read_bytes()
    command.write_text("set --\n")  # what `--cmd ''` writes: the shim idles
    try:
        proc = subprocess.Popen(["systemd-nspawn", "--quiet", "--directory", str(root),
                                 f"--private-users={SHIFT}:65536", "--private-network", "--register=no",
                                 "--keep-unit", "--console=pipe", "--boot", "--kill-signal=SIGPWR"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()  # idling
        proc.send_signal(signal.SIGTERM)  # nspawn hands PID 1 its --kill-signal: SIGPWR, as lxc-stop
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode in (0, 143), stderr
    finally:
        command.write_bytes(saved)


def pipeline_smoke(engine, image: str) -> dict:
    from imagebuild import flows
    return flows.smoke(image, engine).report


@docker_needed
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_export_leaves_no_file(engine, toolchain, tmp_path, stop):
    out = tmp_path / "t.tar.zst"
    code = "import sys, imagebuild.cli.app as c; sys.exit(c.main(sys.argv[1:]))"
    # As from a terminal: a shell without job control (CI, background jobs) starts children with
    # SIGINT ignored, and Python keeps it so.
    proc = subprocess.Popen([sys.executable, "-c", code, "export-lxc", toolchain, "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # Signal as soon as the temp file exists: the stream has started and is far from done
        # (waiting for bytes raced with a fast export on a quiet machine).
        if any(p.name.endswith(".partial") for p in tmp_path.iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the export ended before it could be interrupted"
    proc.send_signal(stop)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert os.listdir(tmp_path) == []
    assert _export_containers(engine) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_our_zstd(p, out)]


def _is_our_zstd(pid: str, out: Path) -> bool:
    try:
        return "zstd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode() and \
            str(out.parent) in os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return False
