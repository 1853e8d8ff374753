"""Stage 2b, bootstrap: a Debian base resolved from its suites into a lock's identity, and rebuilt
from that identity on any host, any day, while its .debs can be fetched.

    sources.py  where each suite is served: the recipe's mirror, else the host's apt sources
    mirror.py   Release, Packages and .debs fetched and checked against their sha256 (cache, mirror, snapshot)
    resolve.py  which .debs: apt's resolver over the fetched indices, in a private configuration
    rootfs.py   a local repository of exactly the locked .debs, bootstrapped with mmdebstrap

May import: base, engine, recipe, common, errors.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

from imagebuild.base.debian import Release, compare_versions
from imagebuild.base.identity import BaseIdentity, LockedDeb, LockedSuite, base_moves
from imagebuild.bootstrap.mirror import DEBIAN_KEYRING, Archives
from imagebuild.bootstrap.resolve import apt_version, read_resolution, resolution_key, resolve_debs, write_resolution
from imagebuild.bootstrap.rootfs import BOOTSTRAP_FORMAT, DPKG_EXCLUDES, bootstrap_locked, rootfs_path
from imagebuild.bootstrap.sources import HOST_SOURCES, suite_uris
from imagebuild.common import BOOTSTRAP_EPOCH, Progress, quiet, sha256_file
from imagebuild.engine.contract import ImageInfo
from imagebuild.errors import ImagebuildError, LockError
from imagebuild.recipe.model import DebianBase, ImageBase

# What every Debian base needs besides the recipe's packages: the interpreter and TLS roots.
REQUIRED_PACKAGES = ("ca-certificates", "python3")


def bootstrap_inputs(base: DebianBase) -> dict:
    """What was asked of a Debian base; a locked base is kept while these stay the same."""
    return {"format": BOOTSTRAP_FORMAT, "suite": base.suite, "suites": list(base.apt_suites),
            "components": list(base.components), "arch": base.arch, "variant": "minbase",
            "packages": sorted(set(REQUIRED_PACKAGES) | set(base.packages)),
            "dpkg_excludes": list(DPKG_EXCLUDES), "epoch": BOOTSTRAP_EPOCH}


def inputs_sha256(base: DebianBase) -> str:
    return hashlib.sha256(json.dumps(bootstrap_inputs(base), sort_keys=True).encode()).hexdigest()


def archives(base: DebianBase) -> Archives:
    keyring = Path(base.keyring) if base.keyring else DEBIAN_KEYRING
    return Archives(suite_uris(base, HOST_SOURCES), base.snapshot, keyring=keyring)


def _major_minor(debian_version: str) -> str:
    """`2.36-9+deb12u14` -> `2.36`; `3.11.2-1+b1` -> `3.11` (epoch dropped)."""
    match = re.match(r"^(\d+)\.(\d+)", debian_version.split(":", 1)[-1])
    if not match:
        raise ImagebuildError(f"cannot read a major.minor from Debian version {debian_version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def releases_now(base: DebianBase, where: Archives, progress: Progress = quiet) -> list[tuple[str, Release]]:
    """Each suite's Release as its signed InRelease stands now."""
    releases = []
    for suite in base.apt_suites:
        release = where.release(suite)
        progress(f"reading {suite} ({release.date})")
        releases.append((suite, release))
    return releases


def locked_suites(base: DebianBase, releases: list[tuple[str, Release]]) -> tuple[LockedSuite, ...]:
    return tuple(LockedSuite(suite, base.components, release.date) for suite, release in releases)


def indices_of(base: DebianBase, where: Archives, releases: list[tuple[str, Release]]) -> list:
    """[(suite, Packages text, entries)] of every suite and component, as each Release vouches for them."""
    return [(suite, *where.packages(suite, release, component, base.arch))
            for suite, release in releases for component in base.components]


def suites_now(base: DebianBase, where: Archives, progress: Progress = quiet):
    """Each suite's Release and its indices as the sources serve them now: (LockedSuite, [(suite, text, entries)])."""
    releases = releases_now(base, where, progress)
    return locked_suites(base, releases), indices_of(base, where, releases)


def resolved_debs(base: DebianBase, where: Archives, asked: list[str],
                  progress: Progress = quiet) -> tuple[tuple[LockedSuite, ...], tuple[LockedDeb, ...]]:
    """Each suite as its signed Release stands now, and the .debs apt picks from the Packages indices that Release
    vouches for. apt's answer is kept under what decides it (resolve.resolution_key): while no index moves, a
    relock reads each Release again (the suites' state today) but neither decompresses nor parses an index
    (5-8 s of CPU for bookworm's three) nor runs apt."""
    releases = releases_now(base, where, progress)
    suites = locked_suites(base, releases)
    vouched = [(suite, component, release.index(component, base.arch)) for suite, release in releases
               for component in base.components]
    apt = apt_version()
    path = None
    if apt and all(index is not None for _, _, index in vouched):
        key = resolution_key(bootstrap_inputs(base), [(s, c, i.sha256) for s, c, i in vouched], asked, apt)
        path = where.cache / "debian-resolved" / f"{key}.json"
        kept = read_resolution(path)
        if kept is not None:
            return suites, kept
    debs = resolve_debs(indices_of(base, where, releases), asked, base.arch)
    if path is not None:
        write_resolution(path, debs)
    return suites, debs


def resolve_base(base: DebianBase, progress: Progress = quiet) -> BaseIdentity:
    """The base as its suites stand today: apt's picks, each .deb fetched and checked, bootstrapped once
    from exactly those to learn the rootfs sha256 the lock will check."""
    where = archives(base)
    asked = sorted(set(REQUIRED_PACKAGES) | set(base.packages))
    suites, debs = resolved_debs(base, where, asked, progress)
    for required in ("libc6", "python3"):
        if required not in {deb.name for deb in debs}:
            raise LockError(f"the {base.suite} base resolves without {required}")
    versions = {deb.name: deb.version for deb in debs}
    identity = BaseIdentity(kind="debian", suite=base.suite, arch=base.arch, python=_major_minor(versions["python3"]),
                            glibc=_major_minor(versions["libc6"]), inputs_sha256=inputs_sha256(base),
                            suites=suites, debs=debs, rootfs_sha256="0" * 64)
    tar = locked_rootfs(identity, base, progress, check=False)
    return replace(identity, rootfs_sha256=sha256_file(tar))


def identify(base: DebianBase | ImageBase, locked: BaseIdentity | None = None, *, upgrade: bool = False,
             progress: Progress = quiet) -> BaseIdentity:
    """The base a lock records: an image by digest; a Debian base kept as locked (as uv keeps pins)
    unless what was asked changed or `upgrade` moves it to the sources' current state."""
    if isinstance(base, ImageBase):
        return BaseIdentity(kind="image", ref=base.ref, python=base.python, glibc=base.glibc,
                            arch="amd64", python_path=base.python_path)
    if locked is not None and not upgrade and locked.kind == "debian" and locked.inputs_sha256 == inputs_sha256(base):
        return locked
    return resolve_base(base, progress)


def locked_rootfs(identity: BaseIdentity, base: DebianBase, progress: Progress = quiet, *, check: bool = True):
    """The rootfs tar of a locked Debian base: its .debs fetched (cache, mirror, snapshot) and checked,
    bootstrapped, and its sha256 compared with the lock's."""
    files = archives(base).fetch_debs(identity.debs, identity.suites, progress)
    tar = bootstrap_locked(identity, files, progress)
    if check:
        actual = sha256_file(tar)
        if actual != identity.rootfs_sha256:
            tar.unlink()
            raise ImagebuildError(
                f"the Debian {identity.suite}/{identity.arch} rootfs bootstrapped from the lock's "
                f"{len(identity.debs)} .debs has sha256 {actual[:16]}…, not the locked "
                f"{identity.rootfs_sha256[:16]}…: every .deb matched its hash, so the bootstrap itself "
                "differs (another mmdebstrap or dpkg than the one that locked it?). "
                "Relock with `imagebuild lock RECIPE --upgrade-base` on this host")
    return tar


def base_mismatch(info: ImageInfo | None, identity: BaseIdentity) -> str | None:
    """Why the engine's image under the base's tag is not the locked base, or None when it is: the locked
    base is one layer whose diff_id (the sha256 of the uncompressed layer tar, which the engine computes
    as it imports) is the lock's rootfs sha256, for the lock's arch. A tag proves nothing: an image made
    FROM the base and tagged with its name keeps the base's layer and adds its own."""
    if info is None:
        return "the engine has no image under that tag"
    wanted = f"sha256:{identity.rootfs_sha256}"
    layers = list(info.diff_ids)
    if layers != [wanted]:
        said = ", ".join(str(layer) for layer in layers) or "none"
        return (f"its layers are [{said}], not the one layer {wanted} (the lock's rootfs sha256)"
                + (f": {len(layers) - 1} more on top of it" if layers[:1] == [wanted] else ""))
    arch = info.platform.split("/")[1] if info.platform.count("/") >= 1 else ""
    if arch != identity.arch:
        return f"it is for {info.platform or 'no platform'}, not linux/{identity.arch}"
    return None


def ensure_base_image(identity: BaseIdentity, base: DebianBase | ImageBase, engine,
                      progress: Progress = quiet) -> str:
    """Make the locked base present in the engine and return how to name it in FROM. An image already
    under the base's tag is used only when its one layer is the lock's rootfs (base_mismatch); otherwise
    the rootfs is bootstrapped from the lock and imported under the tag, saying why."""
    ref = identity.image_ref
    if identity.kind == "image":
        return ref
    present = engine.inspect(ref)
    why = base_mismatch(present, identity)
    if why is None:
        return ref
    if present is not None:
        progress(f"not using the engine's {ref} ({present.id}): {why}; rebuilding it from the lock")
    tar = locked_rootfs(identity, base, progress)
    progress(f"importing base {ref}")
    engine.import_rootfs(tar, ref, arch=identity.arch)
    still = base_mismatch(engine.inspect(ref), identity)
    if still is not None:
        raise ImagebuildError(f"the {engine.name} engine imported the locked rootfs as {ref}, but {still}: "
                              "this engine rewrites the layer it is given, so the base cannot be checked "
                              "against the lock in it")
    return ref


def pending_updates(identity: BaseIdentity, base: DebianBase, progress: Progress = quiet) -> list[dict]:
    """Locked packages that the locked suites now carry in a newer version, and in which suite."""
    _, indices = suites_now(base, archives(base), progress)
    newest: dict[str, tuple[str, str]] = {}
    for suite, _, entries in indices:
        for entry in entries:
            if entry.arch not in (identity.arch, "all"):
                continue
            best = newest.get(entry.name)
            if best is None or compare_versions(entry.version, best[0]) > 0:
                newest[entry.name] = (entry.version, suite)
    waiting = []
    for deb in identity.debs:
        version, suite = newest.get(deb.name, (deb.version, deb.suite))
        if compare_versions(version, deb.version) > 0:
            waiting.append({"package": deb.name, "locked": deb.version, "newest": version, "suite": suite})
    return waiting


__all__ = ["REQUIRED_PACKAGES", "base_mismatch", "base_moves", "bootstrap_inputs", "ensure_base_image", "identify",
           "inputs_sha256", "locked_rootfs", "pending_updates", "resolve_base", "resolved_debs", "rootfs_path"]
