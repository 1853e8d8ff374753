"""A Podman store of a test's or bench's own, for tests and benches: a temp folder with its graph root, run root and
a storage.conf naming them, with containers-storage's partial pulls on or off. Podman reads the file from
CONTAINERS_STORAGE_CONF (in `env`); the machine's own Podman store and configuration are never touched, and
remove() takes back only what this store holds."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Podman's global flags for a store used from a test: no systemd cgroups, no events journal.
FLAGS = ("--cgroup-manager", "cgroupfs", "--events-backend", "none")


@dataclass(frozen=True)
class PodmanStore:
    folder: Path
    env: dict

    @classmethod
    def create(cls, *, partial: bool, driver: str = "overlay") -> "PodmanStore":
        folder = Path(tempfile.mkdtemp(prefix="ib-pp-"))  # a short path: Podman wants its run root short
        conf = folder / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "{driver}"\nrunroot = "{folder}/run"\ngraphroot = "{folder}/graph"\n'
                        f'[storage.options]\npull_options = {{enable_partial_images = "{str(partial).lower()}", '
                        'use_hard_links = "false", ostree_repos = ""}\n')
        return cls(folder, {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)})

    def command(self, *args: str) -> list[str]:
        return ["podman", *FLAGS, *args]

    def remove(self) -> None:
        subprocess.run(self.command("rmi", "-a", "-f"), capture_output=True, env=self.env)  # this store's only
        subprocess.run(["umount", "-R", str(self.folder / "graph" / "overlay")], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)
