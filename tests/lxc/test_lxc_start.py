"""A template started by LXC itself (Debian's lxc 5.0), the engine Proxmox drives: the cuda-toolchain image
exported by `export-lxc` with its own command (python), unpacked by `lxc-usernsexec` under Proxmox's id map
(u/g 0 -> 100000, 65536 ids) with pve-container's tar flags, and started by `lxc-start` with no network.
Its init must run the image's command on the console with the image's environment (the test types into
that python), `lxc-attach` must run the image's probe as Docker does, and `lxc-config`'s GPU lines must
pass LXC's own config parser. docs/proxmox.md says what this proves and what it cannot here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import tty
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.render.paths import PROBE_COMMAND
from tests.conftest import cannot_run
from tests.lxc.test_lxc import PROXMOX_TAR, SHIFT, fake_host, pipeline_smoke
from tests.lxc.test_lxc import toolchain  # noqa: F401  (the module fixture: the image, built if absent)

LXC_TOOLS = ("lxc-start", "lxc-stop", "lxc-attach", "lxc-info", "lxc-wait", "lxc-destroy", "lxc-usernsexec")
PROBE = " ".join(PROBE_COMMAND)
CLI = [sys.executable, "-c", "import sys, imagebuild.cli.app as c; sys.exit(c.main(sys.argv[1:]))"]
# The old shim's line (before this test): sh gives a background job /dev/null as its stdin, `<&0` included.
OLD_SHIM_START = b'"$@" <&0 &\n'
SHIM_START = b'exec 3<&0\n"$@" <&3 3<&- &\nexec 3<&-\n'

pytestmark = [pytest.mark.engine, pytest.mark.needs_tool(*LXC_TOOLS, package="lxc")]


# ---------------------------------------------------------------- /etc/subuid

def subid_covers(text: str, user: str, start: int, count: int) -> bool:
    """Does an /etc/subuid (or /etc/subgid) text give user the ids start..start+count-1 on one line?"""
    for line in str(text).splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] == user and all(f.isascii() and f.isdigit() for f in fields[1:]):
            first, size = int(fields[1]), int(fields[2])
            if first <= start and start + count <= first + size:
                return True
    return False


@pytest.mark.parametrize("text, covered", [
    ("root:100000:65536\n", True),
    ("lxd:1000000:65536\nroot:90000:100000\n", True),
    ("root:100000:65535\n", False),  # one id short
    ("root:100001:65536\n", False),
    ("daemon:100000:65536\n", False),
    ("# root:100000:65536\n", False),
    ("", False),
])
def test_subid_ranges_are_read_for_root_only_and_whole(text, covered):
    assert subid_covers(text, "root", SHIFT, 65536) is covered


@given(st.text(max_size=300))
def test_subid_reader_never_raises(text):
    assert subid_covers(text, "root", SHIFT, 65536) in (True, False)


# ---------------------------------------------------------------- the container

class Console:
    """The container's console: a pty of ours that LXC's `lxc.console.path` attaches to /dev/console."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)  # no echo or newline translation on our side; the container's pty does its own
        self.path = os.ttyname(self.slave)
        self.seen = b""

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def read_until(self, pattern: str, limit: float = 180) -> re.Match:
        """Read until pattern (a regex over what the console showed); an error with the output if it never comes."""
        deadline = time.monotonic() + limit
        while not (found := re.search(pattern.encode(), self.seen, re.S)):
            left = deadline - time.monotonic()
            assert left > 0, f"the console never showed {pattern!r}; it showed: {self.seen[-3000:]!r}"
            self._read(min(left, 1.0))
        return found

    def drain(self) -> bytes:
        while self._read(0.5):
            pass
        return self.seen

    def _read(self, wait: float) -> bool:
        if not select.select([self.master], [], [], wait)[0]:
            return False
        try:
            chunk = os.read(self.master, 65536)
        except OSError:
            return False
        self.seen += chunk
        return bool(chunk)

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)


class Container:
    """One LXC container under a folder of its own (`lxc-* -P`), configured as Proxmox configures an
    unprivileged one: common.conf and userns.conf (what pve's debian.*.conf include), the id map, no
    network device (`lxc.net.0.type = empty`: a loopback only), AppArmor's generated profile."""

    def __init__(self, lxcpath: Path, name: str):
        self.lxcpath, self.name = lxcpath, name
        self.folder = lxcpath / name
        self.rootfs = self.folder / "rootfs"
        self.starts = 0
        self.log = self.folder / "lxc.log"

    def config(self, console: str, extra=()) -> str:
        return "\n".join([
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.include = /usr/share/lxc/config/userns.conf",
            f"lxc.uts.name = {self.name}",
            f"lxc.rootfs.path = dir:{self.rootfs}",
            f"lxc.idmap = u 0 {SHIFT} 65536",
            f"lxc.idmap = g 0 {SHIFT} 65536",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = generated",
            f"lxc.console.path = {console}",
            *extra, ""])

    def run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([tool, "-P", str(self.lxcpath), "-n", self.name, *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def state(self) -> str:
        info = self.run("lxc-info", "-s")
        return info.stdout.split()[-1] if info.returncode == 0 and info.stdout.split() else f"unknown: {info.stderr}"

    def attach(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """argv in the running container with an empty environment (as `pct exec` would run it)."""
        return self.run("lxc-attach", "--clear-env", "--", *argv, timeout=timeout)

    def wait_stopped(self) -> subprocess.CompletedProcess:
        return self.run("lxc-wait", "-s", "STOPPED", "-t", "120", timeout=180)

    @contextlib.contextmanager
    def started(self, extra=()):
        """(console, lxc-start's result); the container is killed and its console closed on the way out."""
        console = Console()
        self.starts += 1
        self.log = self.folder / f"lxc-{self.starts}.log"
        (self.folder / "config").write_text(self.config(console.path, extra))
        try:
            yield console, self.run("lxc-start", "-l", "INFO", "-o", str(self.log))
        finally:
            if self.state() != "STOPPED":
                self.run("lxc-stop", "-k")
            console.close()
            (self.folder / "config").write_text(self.config("none"))  # what lxc-destroy reads at the end


@pytest.fixture(scope="module")
def container(engine, toolchain):  # noqa: F811
    """The toolchain exported through the CLI (its command: the image's CMD, python) and unpacked as
    pve-container unpacks it, into an LXC container of its own; destroyed and removed afterwards."""
    for path in ("/etc/subuid", "/etc/subgid"):
        text = Path(path).read_text() if Path(path).exists() else ""
        if not subid_covers(text, "root", SHIFT, 65536):
            cannot_run(f"{path} gives root no ids {SHIFT}-{SHIFT + 65535}, which LXC's newuidmap needs for "
                       "Proxmox's id map", "scripts/host.sh adds root:100000:65536")
    # Its own folder, which the container's root (100000 here) can reach: pytest's tmp is root's alone.
    work = Path(tempfile.mkdtemp(prefix="imagebuild-lxc-"))
    work.chmod(0o711)
    lxc = Container(work / "lxc", f"imagebuild-lxc-{os.getpid()}")
    try:
        template = work / "toolchain.tar.zst"
        done = subprocess.run(CLI + ["export-lxc", toolchain, "-o", str(template), "--json"],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["rootfs"]["init"] == "shim"
        lxc.rootfs.mkdir(parents=True)
        lxc.lxcpath.chmod(0o711)
        lxc.folder.chmod(0o711)
        os.chown(lxc.rootfs, SHIFT, SHIFT)
        with open(template, "rb") as stdin:  # pve-container: lxc-usernsexec, the archive on stdin
            done = subprocess.run(["lxc-usernsexec", "-m", f"b:0:{SHIFT}:65536", "--", *PROXMOX_TAR, "--zstd",
                                   "-C", str(lxc.rootfs)], stdin=stdin, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        template.unlink()
        yield lxc
    finally:
        if lxc.folder.exists():
            lxc.run("lxc-destroy", "-f")
        shutil.rmtree(work, ignore_errors=True)
    assert not work.exists()


def image_env(engine, image: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in engine.inspect(image).env)


def test_lxc_starts_the_template_and_its_init_runs_the_images_python_on_the_console(container, engine, toolchain):  # noqa: F811
    with container.started() as (console, started):
        assert started.returncode == 0, started.stderr + container.log.read_text()
        assert container.state() == "RUNNING"
        console.read_until(r"Python 3\.11.*>>> ")  # the image's CMD, at its prompt on /dev/console
        console.send("import json, os, sys; print('ib' + '-seen', json.dumps(dict(prefix=sys.prefix, "
                     "env=dict(os.environ), parent=os.getppid(), stdin=os.readlink('/proc/self/fd/0'), "
                     "init=open('/proc/1/cmdline').read().split(chr(0))[:2])))\r")
        seen = json.loads(console.read_until(r"ib-seen (\{.*?\})\r*\n").group(1))
        init_pid = int(container.run("lxc-info", "-p", "-H").stdout)
        host_ids = [line.split()[1] for line in Path(f"/proc/{init_pid}/status").read_text().splitlines()
                    if line.startswith(("Uid:", "Gid:"))]
        net = container.attach("cat", "/proc/net/dev")
        shm = container.attach("grep", " /dev/shm ", "/proc/mounts")
    print(f"in the container: {seen}")
    assert seen["init"] == ["/bin/sh", "/sbin/init"] and seen["parent"] == 1  # the shim is PID 1, python its child
    assert host_ids == [str(SHIFT), str(SHIFT)]  # unprivileged: its root is 100000 on the host
    assert seen["prefix"] == "/opt/venv" and seen["stdin"].startswith("/dev/") and seen["stdin"] != "/dev/null"
    expected = image_env(engine, toolchain)
    assert expected and {key: seen["env"].get(key) for key in expected} == expected
    assert seen["env"]["PATH"].split(":")[0] == "/opt/venv/bin"
    interfaces = [line.split(":")[0].strip() for line in net.stdout.splitlines() if ":" in line]
    assert interfaces == ["lo"], net.stdout  # lxc.net.0.type = empty: nothing can leave the box
    assert shm.stdout.split()[2:3] == ["tmpfs"], shm  # the shim mounted /dev/shm


def test_lxc_attach_runs_the_images_probe_as_docker_does(container, engine, toolchain):  # noqa: F811
    with container.started() as (console, started):
        assert started.returncode == 0, started.stderr + container.log.read_text()
        shells = {flags: container.attach("bash", flags, "echo $CUDA_HOME; command -v python nvcc", timeout=60)
                  for flags in ("-lc", "-ic")}  # a login shell; `pct enter`'s interactive one
        probe = container.attach("bash", "-lc", PROBE)
    cuda_home = image_env(engine, toolchain)["CUDA_HOME"]
    for flags, shell in shells.items():
        assert shell.stdout.split()[-3:] == [cuda_home, "/opt/venv/bin/python", f"{cuda_home}/bin/nvcc"], \
            (flags, shell.stdout, shell.stderr)
    assert "{" in probe.stdout, probe.stderr[-3000:]
    report = json.loads(probe.stdout[probe.stdout.index("{"):])
    assert report["ok"], probe.stdout[-3000:]
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert statuses["deep-gemm-sm120"] == "pass"  # the venv imported deep_gemm and its nvcc compiled SM120 kernels
    assert statuses == {check["name"]: check["status"] for check in pipeline_smoke(engine, toolchain)["checks"]}


def test_the_container_ends_with_its_command_and_stops_on_lxc_stop(container):
    with container.started() as (console, started):
        assert started.returncode == 0, started.stderr
        console.read_until(">>> ")
        console.send("raise SystemExit(7)\r")  # the command ends: the shim exits, and the container with it
        assert container.wait_stopped().returncode == 0 and container.state() == "STOPPED"
    with container.started() as (console, started):
        assert started.returncode == 0, started.stderr
        console.read_until(">>> ")
        stop = container.run("lxc-stop", "--nokill", "-t", "120", timeout=180)  # SIGPWR to PID 1, no kill after
        assert stop.returncode == 0 and container.state() == "STOPPED", stop.stderr


def test_negative_control_the_old_shim_leaves_python_no_console_and_the_container_stops(container):
    init = container.rootfs / "usr/sbin/init"
    saved = init.read_bytes()
    assert SHIM_START in saved
    init.write_bytes(saved.replace(SHIM_START, OLD_SHIM_START))  # in place: owner and mode stay
    try:
        with container.started() as (console, started):
            assert started.returncode == 0, started.stderr
            assert container.wait_stopped().returncode == 0  # python read EOF from /dev/null and ended
            shown = console.drain()
    finally:
        init.write_bytes(saved)
    assert b">>> " not in shown and b"Python 3" not in shown


def lxc_config(*args: str) -> dict:
    done = subprocess.run(CLI + ["lxc-config", *args, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_lxc_config_gpu_lines_pass_lxcs_own_parser_and_absent_devices_are_skipped(container, tmp_path):
    # This host has no NVIDIA driver: the majors come from a fake proc/devices; the lines name the real /dev.
    config = lxc_config("--gpus", "all", "--root", str(fake_host(tmp_path)), "--format", "lxc")
    lines = config["lines"]
    mounts = [line.split(" = ", 1)[1].split()[0] for line in lines if line.startswith("lxc.mount.entry = ")]
    assert len(lines) == 10 and len(mounts) == 7
    with container.started(lines) as (console, started):
        assert started.returncode == 0, started.stderr + container.log.read_text()
        read_back = container.run("lxc-info", "-c", "lxc.cgroup2.devices.allow", "-c", "lxc.mount.entry")
        inside = container.attach("sh", "-c", "for f in /dev/nvidia*; do stat -c '%n|%F' \"$f\"; done")
    log = container.log.read_text()
    values = {re.sub(r"^lxc\.[a-z0-9.]+ = ", "", line) for line in read_back.stdout.splitlines()}
    assert {line.split(" = ", 1)[1] for line in lines} <= values, read_back.stdout  # LXC's parser holds each line
    kinds = dict(line.split("|", 1) for line in inside.stdout.splitlines())
    skipped = []
    for source in mounts:
        if os.path.exists(source):  # a host with the driver: its device, bound in
            assert kinds[source] in ("character special file", "directory"), kinds
            continue
        note = f'Failed to mount "{source}" on "'
        assert any(note in line and line.endswith("(optional)") for line in log.splitlines()), log[-3000:]
        assert kinds.get(source) != "character special file"  # nothing faked: at most LXC's empty create= target
        skipped.append(source)
    print(f"lxc-config's {len(lines)} lines read back by LXC; skipped as absent here (LXC's own note in its log): "
          f"{', '.join(skipped) or 'none'}")
    if "Ignoring cgroup2 limits on legacy cgroup system" in log:
        print("note: this host's cgroups are v1 (hybrid), so LXC parsed the cgroup2 device lines but applies "
              "none; Proxmox 7+ runs pure cgroup v2")


def test_negative_control_proxmox_form_lines_are_refused_by_lxcs_parser(container, tmp_path):
    lines = lxc_config("--gpus", "all", "--root", str(fake_host(tmp_path)))["lines"]
    assert lines[0] == "lxc.cgroup2.devices.allow: c 195:* rwm"  # /etc/pve/lxc/ID.conf's form
    with container.started(lines) as (console, started):
        assert started.returncode != 0
        assert "Invalid configuration line: lxc.cgroup2.devices.allow: c 195:* rwm" in started.stderr, started.stderr
