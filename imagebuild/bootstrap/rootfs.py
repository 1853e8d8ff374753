"""A rootfs from exactly the locked .debs: a local repository holding them and nothing else,
bootstrapped with mmdebstrap at a fixed SOURCE_DATE_EPOCH, so the same lock gives the same tar on
any host, whatever its apt sources say and whatever the mirror serves today.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from imagebuild.base.debian import parse_stanzas
from imagebuild.base.identity import BaseIdentity, LockedDeb
from imagebuild.common import BOOTSTRAP_EPOCH, Progress, cache_dir, quiet, sha256_file
from imagebuild.engine.streams import run_streaming
from imagebuild.errors import BaseFetchFailed, ImagebuildError, ToolMissing

# Bump when the bootstrap command changes, so rootfs tars made the old way are not reused.
BOOTSTRAP_FORMAT = 2
# Docs and manuals are dead weight in a serving image; copyright files stay for license compliance.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
# The image's apt sources: the bootstrap's local repository is gone, and no mirror is named here.
SOURCES_LIST = ("# imagebuild bootstrapped this base from the .debs its lock names (lockfiles/*.lock).\n"
                "# To install more with apt, add your mirror's suites here.\n")


def rootfs_key(identity: BaseIdentity) -> str:
    blob = json.dumps({"format": BOOTSTRAP_FORMAT, "suite": identity.suite, "arch": identity.arch,
                       "debs": sorted(deb.sha256 for deb in identity.debs), "excludes": DPKG_EXCLUDES,
                       "epoch": BOOTSTRAP_EPOCH, "sources_list": SOURCES_LIST}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def rootfs_path(identity: BaseIdentity) -> Path:
    return cache_dir() / "bases" / f"{identity.suite}-{identity.arch}-{rootfs_key(identity)}.tar"


def control_fields(path: Path) -> str:
    """The .deb's control paragraph, as dpkg-deb reads it."""
    proc = subprocess.run(["dpkg-deb", "--field", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BaseFetchFailed(f"{path}: dpkg-deb cannot read its control file: {proc.stderr.strip()}")
    return proc.stdout.strip("\n")


def write_local_repo(root: Path, suite: str, arch: str, debs: tuple[LockedDeb, ...], files: dict[str, Path]) -> None:
    """root/dists/SUITE/main/binary-ARCH/Packages over root/pool/: exactly these .debs."""
    stanzas = []
    for deb in debs:
        control = control_fields(files[deb.name])
        fields = parse_stanzas(control)[0] if control else {}
        seen = (fields.get("Package"), fields.get("Version"), fields.get("Architecture"))
        if seen != (deb.name, deb.version, deb.arch):
            raise BaseFetchFailed(f"{files[deb.name]} is {' '.join(map(str, seen))}, not the locked "
                                  f"{deb.name} {deb.version} {deb.arch}")
        pooled = root / "pool" / f"{deb.sha256}.deb"
        pooled.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(files[deb.name], pooled)
        except OSError:
            shutil.copyfile(files[deb.name], pooled)
        stanzas.append(f"{control}\nFilename: pool/{pooled.name}\nSize: {deb.size}\nSHA256: {deb.sha256}\n")
    index = root / "dists" / suite / "main" / f"binary-{arch}" / "Packages"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("\n".join(stanzas))
    digest = sha256_file(index)
    (root / "dists" / suite / "Release").write_text(
        f"Suite: {suite}\nCodename: {suite}\nArchitectures: {arch}\nComponents: main\n"
        f"SHA256:\n {digest} {index.stat().st_size} main/binary-{arch}/Packages\n")


def bootstrap_locked(identity: BaseIdentity, files: dict[str, Path], progress: Progress = quiet) -> Path:
    """The rootfs tar of exactly the locked .debs (cached; temp file + rename); its sha256 is not checked here."""
    target = rootfs_path(identity)
    if target.exists():
        return target
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise ToolMissing("mmdebstrap is not installed: it bootstraps Debian bases. "
                          "Install it with `apt-get install -y mmdebstrap`.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="imagebuild-debs-", dir=target.parent) as tmp:
        repo, tar, empty, sources = (Path(tmp) / name for name in ("repo", "rootfs.tar", "apt.conf", "sources.list"))
        write_local_repo(repo, identity.suite, identity.arch, identity.debs, files)
        empty.write_text("")
        sources.write_text(SOURCES_LIST)
        command = [mmdebstrap, "--variant=minbase", f"--architectures={identity.arch}",
                   f"--include={','.join(deb.name for deb in identity.debs)}", "--format=tar",
                   *[f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES],
                   "--aptopt=Acquire::Languages \"none\"",
                   "--customize-hook=rm -f \"$1\"/etc/apt/sources.list.d/*",
                   f"--customize-hook=upload {sources} /etc/apt/sources.list",
                   identity.suite, str(tar), f"deb [trusted=yes] copy://{repo} {identity.suite} main"]
        # The host's apt configuration (sources, proxies, pins) must not reach the bootstrap.
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(BOOTSTRAP_EPOCH), "APT_CONFIG": str(empty)}
        progress(f"bootstrapping Debian {identity.suite}/{identity.arch} from its {len(identity.debs)} locked .debs")
        code, tail = run_streaming(command, lambda line: line.startswith("I: ") and progress(line[3:]),
                                   env=env, keep=30)
        if code != 0:
            raise ImagebuildError(f"mmdebstrap failed for Debian {identity.suite}/{identity.arch} "
                                  f"(exit {code}):\n" + "\n".join(tail))
        os.replace(tar, target)
    return target
