"""A Debian base identity for unit tests of what reads a lock (no mirror, no bootstrap): each package
a LockedDeb with the pool filename Debian would give it and a made-up sha256."""

from __future__ import annotations

import hashlib

from imagebuild.base.identity import BaseIdentity, LockedDeb, LockedSuite

SUITE_DATE = "Sat, 11 Jul 2026 10:16:37 UTC"


def locked_deb(name: str, version: str, arch: str = "amd64", suite: str = "bookworm") -> LockedDeb:
    pool = f"pool/main/{name[:4] if name.startswith('lib') else name[0]}/{name}"
    return LockedDeb(name=name, version=version, arch=arch, sha256=hashlib.sha256(f"{name} {version}".encode()).hexdigest(),
                     filename=f"{pool}/{name}_{version.split(':', 1)[-1]}_{arch}.deb", size=1000, suite=suite)


def debian_identity(packages: dict[str, str], arch: str = "amd64", python: str = "3.11",
                    glibc: str = "2.36") -> BaseIdentity:
    return BaseIdentity(kind="debian", suite="bookworm", arch=arch, python=python, glibc=glibc,
                        rootfs_sha256="e" * 64, inputs_sha256="c" * 64,
                        suites=(LockedSuite("bookworm", ("main",), SUITE_DATE),),
                        debs=tuple(locked_deb(name, version, arch) for name, version in sorted(packages.items())))
