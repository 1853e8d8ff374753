"""Which .debs a base is: apt's own resolver, run over the suites' indices and nothing else.

mmdebstrap's minbase is the Essential set, Priority: required and apt; with the recipe's packages
and imagebuild's own, apt (simulating, in a private configuration that reads none of the host's
sources) picks the candidates from the fetched indices, and each pick is looked up there for its
pool filename and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from imagebuild.base.debian import PackageEntry
from imagebuild.base.identity import LockedDeb
from imagebuild.common import write_atomic
from imagebuild.errors import LockError, ToolMissing

_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) .*\[([^\]\s]+)\]\)", re.MULTILINE)


def apt_config(root: Path, arch: str) -> str:
    """An apt configuration confined to `root`: no host sources, preferences, status or parts."""
    lines = {
        "Dir": root, "Dir::State": root / "state", "Dir::State::lists": root / "lists",
        "Dir::State::status": root / "status", "Dir::Cache": root / "cache",
        "Dir::Etc": root / "etc", "Dir::Etc::SourceList": root / "etc/sources.list",
        "Dir::Etc::SourceParts": root / "etc/sources.list.d", "Dir::Etc::Parts": root / "etc/apt.conf.d",
        "Dir::Etc::Preferences": root / "etc/preferences", "Dir::Etc::PreferencesParts": root / "etc/preferences.d",
        "Dir::Etc::Trusted": root / "etc/trusted.gpg", "Dir::Etc::TrustedParts": root / "etc/trusted.gpg.d",
        "Dir::Log": root / "log", "APT::Architecture": arch, "APT::Install-Recommends": "false",
        "APT::Install-Suggests": "false", "Debug::NoLocking": "true",
    }
    text = "".join(f'{key} "{value}";\n' for key, value in lines.items())
    return text + f'APT::Architectures {{ "{arch}"; }};\nDir::Bin::Methods "/usr/lib/apt/methods";\n'


def planned_installs(apt_output: str) -> list[tuple[str, str, str]]:
    """(name, version, architecture) of each `Inst` line of `apt-get -s install`'s plan."""
    return [(name.split(":")[0], version, arch) for name, version, arch in _INST.findall(apt_output)]


def resolve_debs(indices: list[tuple[str, str, list[PackageEntry]]], asked: list[str], arch: str) -> tuple[LockedDeb, ...]:
    """The .debs apt installs for minbase plus `asked`; indices are (suite, Packages text, entries),
    earlier suites first."""
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise ToolMissing("apt-get is not installed: it resolves a Debian base's packages")
    with tempfile.TemporaryDirectory(prefix="imagebuild-apt-") as tmp:
        root = Path(tmp)
        for folder in ("state", "lists/partial", "cache/archives/partial", "etc/sources.list.d",
                       "etc/apt.conf.d", "etc/preferences.d", "etc/trusted.gpg.d", "log", "repo"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        (root / "status").write_text("")
        (root / "repo/Packages").write_text("\n\n".join(text.strip("\n") for _, text, _ in indices) + "\n")
        (root / "etc/sources.list").write_text(f"deb [trusted=yes] file:{root / 'repo'} ./\n")
        (root / "apt.conf").write_text(apt_config(root, arch))
        env = {**os.environ, "APT_CONFIG": str(root / "apt.conf"), "LC_ALL": "C.UTF-8"}
        update = subprocess.run([apt_get, "-q", "update"], capture_output=True, text=True, env=env)
        if update.returncode != 0:
            raise LockError("apt-get could not read the suites' indices:\n" + update.stderr[-2000:])
        proc = subprocess.run([apt_get, "-s", "-q", "install", "?essential", "?priority(required)", "apt", *asked],
                              capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise LockError(f"apt cannot install {', '.join(asked)} with minbase from the locked suites:\n"
                        + (proc.stdout + proc.stderr)[-3000:])
    found: dict[tuple[str, str, str], LockedDeb] = {}
    for suite, _, entries in reversed(indices):  # the earliest suite that lists a version wins
        for entry in entries:
            found[(entry.name, entry.version, entry.arch)] = LockedDeb(
                name=entry.name, version=entry.version, arch=entry.arch, filename=entry.filename,
                sha256=entry.sha256, size=entry.size, suite=suite)
    picked = []
    for name, version, deb_arch in planned_installs(proc.stdout):
        deb = found.get((name, version, deb_arch))
        if deb is None:
            raise LockError(f"apt picked {name} {version} ({deb_arch}), which no fetched index lists")
        picked.append(deb)
    if not picked:
        raise LockError("apt's plan installs nothing: the indices hold no Essential packages for "
                        f"{arch}; its output:\n{proc.stdout[-2000:]}")
    return tuple(sorted(picked, key=lambda deb: deb.name))


# ---------------------------------------------------------------- apt's answer, kept by what decides it

RESOLVED_FORMAT = 1  # bump when what resolve_debs returns for the same inputs changes
_DEB_FIELDS = {"name": str, "version": str, "arch": str, "filename": str, "sha256": str, "size": int, "suite": str}


def apt_version() -> str | None:
    """`apt 2.6.1 (amd64)`: apt's own first line, part of what decides its answer (None: no apt-get here)."""
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        return None
    done = subprocess.run([apt_get, "--version"], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def resolution_key(inputs: dict, indices: Sequence[Sequence[str]], asked: list[str], apt: str) -> str:
    """What decides apt's picks: the base's inputs, each (suite, component, sha256) of the Packages indices in
    the order apt reads them (each sha256 vouched for by its suite's signed Release), the packages asked, apt."""
    return hashlib.sha256(json.dumps({"format": RESOLVED_FORMAT, "inputs": inputs, "indices": indices,
                                      "asked": sorted(asked), "apt": apt}, sort_keys=True).encode()).hexdigest()


def read_resolution(path: Path) -> tuple[LockedDeb, ...] | None:
    """The .debs an earlier resolve of the same key wrote, or None for a file that is missing or is not one
    (damaged, hand-edited, another format): the caller then resolves again."""
    try:
        data = json.loads(path.read_bytes())
        if data["format"] != RESOLVED_FORMAT:
            return None
        debs = tuple(_deb(item) for item in data["debs"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return debs or None


def _deb(item: dict) -> LockedDeb:
    for field, kind in _DEB_FIELDS.items():
        if type(item[field]) is not kind:
            raise TypeError(f"{field}: {type(item[field]).__name__}")
    return LockedDeb(**{field: item[field] for field in _DEB_FIELDS})


def write_resolution(path: Path, debs: tuple[LockedDeb, ...]) -> None:
    """Kept for the next resolve of the same key; a cache that cannot be written is only slower."""
    try:
        write_atomic(path, json.dumps({"format": RESOLVED_FORMAT, "debs": [deb.to_dict() for deb in debs]},
                                      indent=1).encode())
    except OSError:
        pass
