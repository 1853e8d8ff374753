"""A second Docker engine for tests: Debian's dockerd with its own data root, exec root and socket,
so a test has a truly fresh runner (empty image store, empty builder cache, empty uv cache mount)
beside the session's engine, without pruning anything of that engine's.

It gets a bridge of its own and writes no iptables rules (the first engine owns those); its builds
use the host's network, as imagebuild's builds do everywhere. Never `--bridge none`: a dockerd started
so deletes the host's docker0, and the first engine's containers lose their network.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

DOCKER_CLI = "/usr/bin/docker"


@dataclass
class Daemon:
    host: str  # unix:///…/docker.sock, for DOCKER_HOST
    process: subprocess.Popen
    log: Path
    root: Path
    bridge: str

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([DOCKER_CLI, *args], capture_output=True, text=True,
                              env={**os.environ, "DOCKER_HOST": self.host})
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} on {self.host}: {proc.stderr[-2000:]}")
        return proc

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        subprocess.run(["umount", "-R", str(self.root / "data")], capture_output=True)  # any mount left
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def why_not() -> str | None:
    """Why no second engine can start here, or None."""
    if os.geteuid() != 0:
        return "a second dockerd needs root"
    if shutil.which("dockerd") is None or not os.path.exists(DOCKER_CLI):
        return "dockerd and /usr/bin/docker are needed (apt-get install -y docker.io)"
    if shutil.which("ip") is None:
        return "ip is needed for the second engine's bridge (apt-get install -y iproute2)"
    return None


def free_octet() -> int:
    """A third octet of 198.18.x.0/24 that no interface here uses yet: two engines of tests running at
    once (the suite's two workers) never share a subnet."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    taken = {int(m) for m in re.findall(r"inet 198\.18\.(\d+)\.", used)}
    return random.choice([octet for octet in range(256) if octet not in taken])


def start_daemon() -> Daemon:
    # A short root: the managed containerd's socket lives under the exec root, and a unix socket's
    # path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="ib-dockerd-", dir="/tmp"))
    sock = f"unix://{root}/docker.sock"
    log = root / "dockerd.log"
    bridge = "ibd" + root.name[-8:].replace("_", "0")  # an interface name: at most 15 characters
    address = f"198.18.{free_octet()}.1/24"  # RFC 2544's range: no real network uses it
    for command in (["ip", "link", "add", "name", bridge, "type", "bridge"],
                    ["ip", "addr", "add", address, "dev", bridge], ["ip", "link", "set", bridge, "up"]):
        subprocess.run(command, check=True, capture_output=True)
    process = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "dockerd.pid"), "-H", sock, "--bridge", bridge,
         "--iptables=false", "--ip-masq=false"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    daemon = Daemon(sock, process, log, root, bridge)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if daemon.docker("info", check=False).returncode == 0:
            return daemon
        time.sleep(0.5)
    tail = log.read_text()[-2000:]
    daemon.stop()
    raise RuntimeError(f"a second dockerd did not come up: {tail}")


@contextlib.contextmanager
def running() -> Iterator[Daemon]:
    """A second engine for the length of a with-block, then stopped with everything in it; the
    session engine's docker0 must outlive it."""
    docker0 = _link("docker0")
    daemon = start_daemon()
    try:
        yield daemon
    finally:
        daemon.stop()
    assert _link("docker0") == docker0, "the second engine took docker0 with it"


def _link(name: str) -> list[str]:
    return subprocess.run(["ip", "-br", "link", "show", name], capture_output=True, text=True).stdout.split()[:1]
