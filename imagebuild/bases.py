"""Bases: a Debian suite bootstrapped once with mmdebstrap and cached by its inputs, or an image pinned by digest.

A base's identity is what the lock records: for Debian, the suite, the rootfs tar's sha256 (which is
also the imported layer's diff_id) and every installed package's exact version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from imagebuild.common import BOOTSTRAP_EPOCH, MACHINES, cache_dir, sha256_file
from imagebuild.engine.streams import run_streaming
from imagebuild.errors import ImagebuildError, ToolMissing
from imagebuild.recipe.model import DebianBase, ImageBase

# Bump when the bootstrap command changes, so cached rootfs tars made the old way are not reused.
BOOTSTRAP_FORMAT = 1
# What every Debian base needs besides the recipe's packages: the interpreter and TLS roots.
REQUIRED_PACKAGES = ("ca-certificates", "python3")
# Docs and manuals are dead weight in a serving image; copyright files stay for license compliance.
_DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaseIdentity:
    """What a lock pins of its base, and what the resolver targets."""

    kind: str  # "debian" | "image"
    python: str  # major.minor of the base's interpreter
    glibc: str  # major.minor
    arch: str  # Debian architecture name
    python_path: str = "/usr/bin/python3"
    suite: str | None = None
    rootfs_sha256: str | None = None  # debian: sha256 of the uncompressed rootfs tar = layer diff_id
    packages: dict[str, str] = field(default_factory=dict)  # debian: package -> exact version
    ref: str | None = None  # image: repo@sha256:...

    @property
    def uv_platform(self) -> str:
        """The resolver target: the base's glibc, never the host's."""
        return f"{MACHINES[self.arch]}-manylinux_{self.glibc.replace('.', '_')}"

    @property
    def image_ref(self) -> str:
        """How a Dockerfile names this base."""
        if self.kind == "image":
            return self.ref
        return f"imagebuild/base:{self.suite}-{self.arch}-{self.rootfs_sha256[:16]}"

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, {}, ())}

    @classmethod
    def from_dict(cls, data: dict) -> "BaseIdentity":
        return cls(**data)


def bootstrap_inputs(base: DebianBase) -> dict:
    """Everything that decides the rootfs bytes, besides the mirror's state."""
    return {
        "format": BOOTSTRAP_FORMAT,
        "suite": base.suite,
        "arch": base.arch,
        "variant": "minbase",
        "packages": sorted(set(REQUIRED_PACKAGES) | set(base.packages)),
        "dpkg_excludes": list(_DPKG_EXCLUDES),
        "epoch": BOOTSTRAP_EPOCH,
    }


def bootstrap_key(base: DebianBase) -> str:
    blob = json.dumps(bootstrap_inputs(base), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def rootfs_path(base: DebianBase) -> Path:
    return cache_dir() / "bases" / f"{base.suite}-{base.arch}-{bootstrap_key(base)}.tar"


def bootstrap(base: DebianBase, progress: Progress = lambda _: None, *, refresh: bool = False) -> Path:
    """Bootstrap the suite into a cached rootfs tar (temp file + rename) and return its path."""
    target = rootfs_path(base)
    if target.exists() and not refresh:
        return target
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise ToolMissing("mmdebstrap is not installed: it bootstraps Debian bases. "
                          "Install it with `apt-get install -y mmdebstrap`.")
    inputs = bootstrap_inputs(base)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    os.close(fd)
    command = [mmdebstrap, "--variant=minbase", f"--architectures={base.arch}",
               f"--include={','.join(inputs['packages'])}", "--format=tar",
               *[f"--dpkgopt={opt}" for opt in _DPKG_EXCLUDES],
               base.suite, tmp]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(BOOTSTRAP_EPOCH)}
    progress(f"bootstrapping Debian {base.suite}/{base.arch} with mmdebstrap "
             f"({len(inputs['packages'])} packages asked for)")
    try:
        code, tail = run_streaming(command, lambda line: line.startswith("I: ") and progress(line[3:]),
                                   env=env, keep=30)
        if code != 0:
            raise ImagebuildError(f"mmdebstrap failed for Debian {base.suite}/{base.arch} "
                                  f"(exit {code}):\n" + "\n".join(tail))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def read_dpkg_status(rootfs_tar: Path) -> dict[str, str]:
    """Installed package -> version, read from the tar as a stream (never unpacked, never whole in memory)."""
    with tarfile.open(rootfs_tar, mode="r|*") as archive:
        for member in archive:
            if member.name.lstrip("./") == "var/lib/dpkg/status" and member.isfile():
                handle = archive.extractfile(member)
                return parse_dpkg_status(handle.read().decode("utf-8", "replace"))
    raise ImagebuildError(f"{rootfs_tar}: no var/lib/dpkg/status inside: not a Debian rootfs")


def parse_dpkg_status(text: str) -> dict[str, str]:
    packages: dict[str, str] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, flags=re.MULTILINE))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields and "Version" in fields:
            packages[fields["Package"]] = fields["Version"]
    return dict(sorted(packages.items()))


def _major_minor(debian_version: str) -> str:
    """`2.36-9+deb12u14` -> `2.36`; `3.11.2-1+b1` -> `3.11` (epoch dropped)."""
    upstream = debian_version.split(":", 1)[-1]
    match = re.match(r"^(\d+)\.(\d+)", upstream)
    if not match:
        raise ImagebuildError(f"cannot read a major.minor from Debian version {debian_version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def debian_identity(base: DebianBase, progress: Progress = lambda _: None) -> BaseIdentity:
    """Bootstrap (or reuse) the rootfs and describe it; python and glibc come from its real packages.

    The description is cached beside the tar, keyed by the tar's size and mtime: hashing and scanning
    half a gigabyte on every lock would cost more than the resolve itself."""
    tar = bootstrap(base, progress)
    stamp = tar.stat()
    cached = tar.with_suffix(".identity.json")
    try:
        saved = json.loads(cached.read_text())
        if saved.pop("stamp") == [stamp.st_size, stamp.st_mtime_ns]:
            return BaseIdentity.from_dict(saved)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no usable cache: describe the tar afresh
    identity = _describe(base, tar)
    cached.write_text(json.dumps({**identity.to_dict(), "stamp": [stamp.st_size, stamp.st_mtime_ns]}))
    return identity


def _describe(base: DebianBase, tar: Path) -> BaseIdentity:
    packages = read_dpkg_status(tar)
    for required in ("libc6", "python3"):
        if required not in packages:
            raise ImagebuildError(f"the {base.suite} rootfs has no {required} package installed")
    return BaseIdentity(
        kind="debian", suite=base.suite, arch=base.arch,
        python=_major_minor(packages["python3"]), glibc=_major_minor(packages["libc6"]),
        rootfs_sha256=sha256_file(tar), packages=packages,
    )


def image_identity(base: ImageBase) -> BaseIdentity:
    return BaseIdentity(kind="image", ref=base.ref, python=base.python, glibc=base.glibc,
                        arch="amd64", python_path=base.python_path)


def identify(base: DebianBase | ImageBase, progress: Progress = lambda _: None) -> BaseIdentity:
    if isinstance(base, DebianBase):
        return debian_identity(base, progress)
    return image_identity(base)


def ensure_base_image(identity: BaseIdentity, base: DebianBase | ImageBase, engine,
                      progress: Progress = lambda _: None) -> str:
    """Make the locked base present in the engine and return how to name it in FROM."""
    ref = identity.image_ref
    if identity.kind == "image" or engine.image_exists(ref):
        return ref
    tar = bootstrap(base, progress)
    actual = sha256_file(tar)
    if actual != identity.rootfs_sha256:
        tar = bootstrap(base, progress, refresh=True)
        actual = sha256_file(tar)
    if actual != identity.rootfs_sha256:
        raise ImagebuildError(
            f"the Debian {identity.suite} rootfs bootstrapped now (sha256 {actual[:16]}…) differs from "
            f"the locked one ({identity.rootfs_sha256[:16]}…): the mirror has moved on. "
            "Relock with `imagebuild lock RECIPE` (or `build --relock`), or point mmdebstrap at a "
            "snapshot mirror to rebuild the locked state.")
    progress(f"importing base {ref}")
    engine.import_rootfs(tar, ref, arch=identity.arch)
    return ref
