"""A lazy node for tests and benches: a private containerd (Debian's 1.6) whose `stargz` snapshotter is
tools/stargz-grpc (stargz-snapshotter 0.12's library, built by scripts/host.sh into .venv/bin), everything
under one temp folder: its own root, state, sockets and namespace, so nothing of the machine's Docker or
containerd is touched. `ctr-remote image rpull` mounts an eStargz image's layers over FUSE and fetches
only what is read (and what precedes `.prefetch.landmark`), from a loopback registry over plain HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

STARGZ = Path(sys.prefix) / "bin" / "stargz-grpc"


def why_not() -> str | None:
    """Why no lazy node can start here, or None."""
    if os.geteuid() != 0:
        return "a private containerd and a FUSE snapshotter need root"
    missing = [tool for tool in ("containerd", "ctr", "ctr-remote", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (apt-get install -y containerd stargz-snapshotter)"
    if not STARGZ.exists():
        return f"{STARGZ} is not built (scripts/host.sh builds tools/stargz-grpc)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse here"
    return None


@dataclass
class LazyNode:
    root: Path
    address: str  # containerd's socket
    namespace: str
    log: Path  # the snapshotter's log (JSON lines)
    processes: tuple

    def ctr(self, *args: str, check: bool = True, timeout: float = 1800, remote: bool = False
            ) -> subprocess.CompletedProcess:
        tool = "ctr-remote" if remote else "ctr"
        proc = subprocess.run([tool, "--address", self.address, "-n", self.namespace, *args], capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout)[-2000:]}")
        return proc

    def rpull(self, ref: str) -> None:
        """Lazily: the manifest and config are fetched, each layer is mounted from its TOC."""
        self.ctr("image", "rpull", "--plain-http", ref, remote=True)

    def pull(self, ref: str) -> None:
        """Whole: every layer fetched and unpacked onto overlayfs, as containerd does without stargz."""
        self.ctr("image", "pull", "--plain-http", ref)

    def run(self, ref: str, *command: str, lazy: bool = True) -> str:
        snapshotter = ["--snapshotter", "stargz"] if lazy else []
        return self.ctr("run", "--rm", "--net-host", *snapshotter, ref, f"t-{uuid.uuid4().hex[:8]}",
                        *command).stdout

    def forget(self) -> None:
        """Remove every image (content and snapshots go with it) and the FUSE mounts under them."""
        refs = self.ctr("images", "ls", "-q", check=False).stdout.split()
        if refs:
            self.ctr("images", "rm", "--sync", *refs, check=False)

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def prepared(self, since: int = 0) -> tuple[int, list[str]]:
        """From the snapshotter's log after byte `since`: how many layers it mounted remotely, and the error
        of each it could not (containerd then fetches that layer whole)."""
        with open(self.log, "rb") as handle:
            handle.seek(since)
            lines = handle.read().decode(errors="replace").splitlines()
        done, failed = 0, []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("remote-snapshot-prepared") == "true":
                done += 1
            elif entry.get("remote-snapshot-prepared") == "false":
                failed.append(str(entry.get("error", "")))
        return done, failed


    def prefetched(self) -> list[tuple[str, float, int]]:
        """(layer digest, seconds, bytes) of each layer's prefetch, from the snapshotter's metrics lines."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            match = re.match(r"value=([0-9.]+) milliseconds; prefetch_size=(\d+) bytes", str(entry.get("msg", "")))
            if entry.get("operation") == "prefetch_total" and match:
                found.append((str(entry.get("layer_sha", "")), float(match[1]) / 1000, int(match[2])))
        return found


def _wait_for(path: Path, process: subprocess.Popen, log: Path, what: str) -> None:
    for _ in range(300):
        if path.exists():
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up: {log.read_text(errors='replace')[-2000:] if log.exists() else ''}")


@contextlib.contextmanager
def running(fs_config: str = "") -> Iterator[LazyNode]:
    """Start containerd and stargz-grpc; on the way out, stop both, unmount and remove everything they made.
    fs_config: TOML lines for the snapshotter (fs/config.Config: `noprefetch`, `no_background_fetch`, ...)."""
    root = Path(tempfile.mkdtemp(prefix="ib-lazy-", dir="/tmp"))  # short: unix socket paths stay < 108 bytes
    namespace = f"ib-{root.name[-8:]}".replace("_", "0").lower()
    store_sock, ctrd_sock = root / "stargz.sock", root / "containerd.sock"
    (root / "stargz.toml").write_text(fs_config)
    (root / "containerd.toml").write_text(f"""version = 2
root = "{root}/ctrd-root"
state = "{root}/ctrd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{ctrd_sock}"
[ttrpc]
  address = "{ctrd_sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[proxy_plugins.stargz]
  type = "snapshot"
  address = "{store_sock}"
""")
    log, ctrd_log = root / "stargz.log", root / "containerd.log"
    processes = []
    try:
        with open(log, "wb") as out:
            store = subprocess.Popen([str(STARGZ), "-root", str(root / "store"), "-address", str(store_sock),
                                      "-config", str(root / "stargz.toml"), "-log-level", "debug"],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(store)
        _wait_for(store_sock, store, log, "stargz-grpc")
        with open(ctrd_log, "wb") as out:
            ctrd = subprocess.Popen(["containerd", "--config", str(root / "containerd.toml")], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(ctrd)
        _wait_for(ctrd_sock, ctrd, ctrd_log, "containerd")
        node = LazyNode(root, str(ctrd_sock), namespace, log, tuple(processes))
        yield node
        node.forget()
    finally:
        _stop(processes)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if len(line.split()) > 1 and line.split()[1].startswith(str(root))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(f"/run/containerd/runc/{namespace}", ignore_errors=True)


def _stop(processes: list) -> None:
    """containerd first (SIGTERM), then the snapshotter with SIGINT, which unmounts its FUSE layers."""
    for process, sig in zip(reversed(processes), (signal.SIGTERM, signal.SIGINT)):
        if process.poll() is None:
            process.send_signal(sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
