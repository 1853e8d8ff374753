"""A base's identity: what the lock records and what the resolver targets.

A Debian base is locked by package, as wheels are: every .deb by name, version, architecture, pool
filename and sha256 (from its suite's Packages index), the suites it came from with each Release
file's date, and the rootfs sha256 a bootstrap of exactly those .debs gives (the check). An image
base is its digest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imagebuild.common import MACHINES


@dataclass(frozen=True)
class LockedDeb:
    name: str
    version: str
    arch: str  # the package's own: amd64, arm64 or all
    filename: str  # pool path inside its suite's archive, e.g. pool/main/z/zlib/zlib1g_…_amd64.deb
    sha256: str
    size: int
    suite: str  # the suite whose index listed it: where the mirror serves it

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "arch": self.arch, "filename": self.filename,
                "sha256": self.sha256, "size": self.size, "suite": self.suite}


@dataclass(frozen=True)
class LockedSuite:
    name: str  # bookworm, bookworm-updates, bookworm-security
    components: tuple[str, ...]
    date: str  # the Release file's Date, as written: the state of the suite the lock saw

    def to_dict(self) -> dict:
        return {"name": self.name, "components": list(self.components), "date": self.date}


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
    inputs_sha256: str | None = None  # debian: what was asked (packages, suites, bootstrap format)
    suites: tuple[LockedSuite, ...] = ()
    debs: tuple[LockedDeb, ...] = ()  # debian: sorted by name
    ref: str | None = None  # image: repo@sha256:...

    @property
    def packages(self) -> dict[str, str]:
        """Debian package -> exact version."""
        return {deb.name: deb.version for deb in self.debs}

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
        data = {"kind": self.kind, "python": self.python, "glibc": self.glibc, "arch": self.arch,
                "python_path": self.python_path, "suite": self.suite, "rootfs_sha256": self.rootfs_sha256,
                "inputs_sha256": self.inputs_sha256, "ref": self.ref,
                "suites": [s.to_dict() for s in self.suites], "debs": [d.to_dict() for d in self.debs]}
        return {k: v for k, v in data.items() if v not in (None, [], {})}


def base_moves(old: BaseIdentity, new: BaseIdentity) -> list[dict]:
    """What moving the base changed: package, old -> new version, and the suite it now comes from."""
    before, after = {d.name: d for d in old.debs}, {d.name: d for d in new.debs}
    moves = []
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if was is None or now is None or was.version != now.version:
            moves.append({"package": name, "old": was.version if was else None,
                          "new": now.version if now else None, "suite": (now or was).suite})
    return moves
