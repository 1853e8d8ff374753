"""The lock file: what a resolved recipe is (every wheel pinned by sha256), read, written and checked for staleness.

How a lock is made (uv, for the base's Python and glibc) is resolve.py. The lock also records what it was made from (the recipe's and the template's checksums, the tool
version, the base's identity, each patch's sha256), so a stale lock is detected before a build.
The same inputs give a byte-identical lock: no timestamps, sorted keys, sorted packages.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagebuild import payload
from imagebuild.base.debian import valid_version
from imagebuild.base.identity import BaseIdentity, LockedDeb, LockedSuite
from imagebuild.common import write_atomic
from imagebuild.errors import LockError, StaleLock
from imagebuild.recipe.layers import LAYER_ORDER
from imagebuild.recipe.model import Recipe
from imagebuild.recipe.reader import meaning_sha256, parse_toml, read_source

LOCK_VERSION = 2  # 2: the Debian base locked by package (every .deb's pool file and sha256)


@dataclass(frozen=True)
class LockedWheel:
    name: str  # canonical
    version: str
    filename: str
    sha256: str
    size: int
    layer: str
    url: str = field(default="", compare=False)  # where the resolver found it; not written to the lock

    @property
    def requirement_line(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class LockedPatch:
    package: str
    file: str  # file name inside the build context's patches/
    sha256: str
    strip: int
    version: str  # the locked version of the package it patches


@dataclass(frozen=True)
class LockedModelConfig:
    """A config.json an [[aot.shapes]] entry reads (`model_config`): its edit changes the kernels."""
    shape: str
    file: str  # as the recipe writes it, relative to the recipe
    sha256: str


@dataclass(frozen=True)
class Lock:
    recipe: str  # recipe stem
    recipe_sha256: str
    tool_version: str
    template_sha256: str
    base: BaseIdentity
    python_platform: str
    resolver: str
    wheels: tuple[LockedWheel, ...]
    patches: tuple[LockedPatch, ...] = ()
    cuda: dict = field(default_factory=dict)
    payload_sha256: str = ""  # imagebuild's in-image code; "" in locks made before it was recorded
    model_configs: tuple[LockedModelConfig, ...] = ()  # written only when a shape reads one

    @property
    def packages(self) -> dict[str, str]:
        return {w.name: w.version for w in self.wheels}

    def layer(self, name: str) -> tuple[LockedWheel, ...]:
        return tuple(w for w in self.wheels if w.layer == name)

    def to_dict(self) -> dict:
        return {
            "lock_version": LOCK_VERSION,
            "recipe": {"name": self.recipe, "sha256": self.recipe_sha256},
            "imagebuild": {"version": self.tool_version, "template_sha256": self.template_sha256,
                           **({"payload_sha256": self.payload_sha256} if self.payload_sha256 else {})},
            "base": self.base.to_dict(),
            "target": {"python": self.base.python, "platform": self.python_platform},
            "resolver": self.resolver,
            "cuda": self.cuda,
            "packages": [{"name": w.name, "version": w.version, "layer": w.layer,
                          "wheel": {"filename": w.filename, "sha256": w.sha256, "size": w.size}}
                         for w in self.wheels],
            "patches": [vars(p) for p in self.patches],
            **({"model_configs": [vars(m) for m in self.model_configs]} if self.model_configs else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


@dataclass(frozen=True)
class PlatformLocks:
    """A multi-platform recipe's lock: one single-platform Lock per platform, in one file. Each
    entry is exactly the lock a one-platform recipe would write, so the image built from it carries
    (and is labelled with) its own platform's lock."""

    recipe: str
    recipe_sha256: str
    locks: dict[str, Lock]  # Debian arch -> its Lock

    def to_dict(self) -> dict:
        return {"lock_version": LOCK_VERSION, "recipe": {"name": self.recipe, "sha256": self.recipe_sha256},
                "platforms": {arch: self.locks[arch].to_dict() for arch in sorted(self.locks)}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload_sha256() -> str:
    """imagebuild's own code that goes into or runs inside an image besides the wheels (the probe
    zipapp, the patcher, the pruner): a change to it changes the image a lock builds."""
    return payload.checksum()


# Keys that do not decide the image: where the base's .debs are fetched from (the lock pins every file
# by sha256), and which `unknown` smoke checks may still tag it.
NOT_THE_IMAGE = {"base": ("mirror", "security_mirror", "snapshot", "keyring"), "smoke": ("accept_unknown",)}


def recipe_sha256(recipe: Recipe) -> str:
    """What the recipe means (recipe/reader.py's meaning_sha256), not its bytes: a comment or a
    reformatting leaves a lock fresh, a changed value makes it stale, but for NOT_THE_IMAGE's keys."""
    data = parse_toml(read_source(recipe.path), recipe.path)
    for table, keys in NOT_THE_IMAGE.items():
        if isinstance(data.get(table), dict):
            kept = {k: v for k, v in data[table].items() if k not in keys}
            data = {k: v for k, v in data.items() if k != table} | ({table: kept} if kept else {})
    return meaning_sha256(data)


def default_lock_path(recipe: Recipe) -> Path:
    """recipes/NAME.toml -> lockfiles/NAME.lock, beside the recipes folder."""
    return recipe.path.parent.parent / "lockfiles" / f"{recipe.stem}.lock"


# ---------------------------------------------------------------- read, write, freshness

def write_lock(lock: Lock, path: Path) -> None:
    """Temp file + rename: a crash never leaves half a lock."""
    write_atomic(path, lock.to_json().encode())


def write_locks(locks: Lock | PlatformLocks, path: Path) -> None:
    write_atomic(path, locks.to_json().encode())


def _lock_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(f"{path}: no lock yet: run `imagebuild lock RECIPE` first") from None
    except (OSError, UnicodeDecodeError) as err:
        raise LockError(f"{path}: cannot read the lock: {err}") from None


def read_lock(path: Path, platform: str | None = None) -> Lock:
    """The lock of one image. A multi-platform lock file needs `platform` (amd64 or arm64) to say
    which of its locks; a single-platform one must be for that platform when it is given."""
    locks = read_locks(path)
    if platform is None:
        if isinstance(locks, Lock):
            return locks
        raise LockError(f"{path} holds the locks of {len(locks.locks)} platforms "
                        f"({', '.join(sorted(locks.locks))}): say which one (--platform ARCH)")
    found = {locks.base.arch: locks} if isinstance(locks, Lock) else locks.locks
    if platform not in found:
        raise LockError(f"{path} has no lock for platform {platform!r}; it holds {', '.join(sorted(found))}")
    return found[platform]


def read_locks(path: Path) -> Lock | PlatformLocks:
    """A lock file as written: one Lock, or a PlatformLocks of a multi-platform recipe."""
    return parse_locks(_lock_text(path), str(path))


def parse_locks(text: str, source: str) -> Lock | PlatformLocks:
    data = _json(text, source)
    if not (isinstance(data, dict) and "platforms" in data):
        return _parse_lock(data, source)
    reader = _Reader(source)
    if data.get("lock_version") != LOCK_VERSION:
        reader.fail("lock_version", f"{data.get('lock_version')!r} is not {LOCK_VERSION}")
    recipe = reader.table(data.get("recipe"), "recipe")
    platforms = reader.table(data.get("platforms"), "platforms")
    if not platforms:
        reader.fail("platforms", "names no platform")
    locks = {}
    for arch, entry in platforms.items():
        lock = _parse_lock(entry, f"{source} [platforms.{arch}]")
        if lock.base.arch != arch:
            reader.fail(f"platforms.{arch}.base.arch", f"{lock.base.arch!r} is not {arch!r}")
        locks[arch] = lock
    return PlatformLocks(recipe=reader.string(recipe, "name", "recipe"),
                         recipe_sha256=reader.sha(recipe, "sha256", "recipe"), locks=locks)


def _json(text: str, source: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise LockError(f"{source}: not valid JSON ({err}): relock with `imagebuild lock RECIPE`") from None


def parse_lock(text: str, source: str) -> Lock:
    """Validate a single-platform lock read from disk; anything off is one LockError naming the key."""
    locks = parse_locks(text, source)
    if not isinstance(locks, Lock):
        raise LockError(f"{source} holds the locks of several platforms ({', '.join(sorted(locks.locks))}): "
                        "say which one (--platform ARCH)")
    return locks


def _parse_lock(data, source: str) -> Lock:
    reader = _Reader(source)
    top = reader.table(data, "")
    if top.get("lock_version") != LOCK_VERSION:
        raise LockError(f"{source}: lock_version {top.get('lock_version')!r} is not {LOCK_VERSION}: "
                        "relock with this imagebuild")
    recipe = reader.table(top.get("recipe"), "recipe")
    tool = reader.table(top.get("imagebuild"), "imagebuild")
    target = reader.table(top.get("target"), "target")
    wheels = tuple(reader.wheel(item, f"packages[{i}]")
                   for i, item in enumerate(reader.array(top.get("packages"), "packages")))
    patches = tuple(reader.patch(item, f"patches[{i}]")
                    for i, item in enumerate(reader.array(top.get("patches", []), "patches")))
    return Lock(recipe=reader.string(recipe, "name", "recipe"),
                recipe_sha256=reader.sha(recipe, "sha256", "recipe"),
                tool_version=reader.string(tool, "version", "imagebuild"),
                template_sha256=reader.sha(tool, "template_sha256", "imagebuild"),
                payload_sha256=reader.sha(tool, "payload_sha256", "imagebuild") if "payload_sha256" in tool else "",
                base=reader.base(top.get("base")),
                python_platform=reader.string(target, "platform", "target"),
                resolver=reader.string(top, "resolver", ""),
                wheels=wheels, patches=patches,
                cuda=reader.table(top.get("cuda", {}), "cuda"),
                model_configs=tuple(reader.model_config(item, f"model_configs[{i}]") for i, item
                                    in enumerate(reader.array(top.get("model_configs", []), "model_configs"))))


class _Reader:
    """Typed field access over untrusted JSON, raising LockError with the key path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str):
        raise LockError(f"{self.source}: [{key}] {message}: relock with `imagebuild lock RECIPE`")

    def table(self, value, key: str) -> dict:
        if not isinstance(value, dict):
            self.fail(key or "(top)", f"expected an object, got {type(value).__name__}")
        return value

    def array(self, value, key: str) -> list:
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, table: dict, name: str, where: str) -> str:
        value = table.get(name)
        if not isinstance(value, str) or not value:
            self.fail(f"{where}.{name}".lstrip("."), "expected a non-empty string")
        return value

    def sha(self, table: dict, name: str, where: str) -> str:
        value = self.string(table, name, where)
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            self.fail(f"{where}.{name}", "expected a sha256 in lowercase hex")
        return value

    def integer(self, table: dict, name: str, where: str) -> int:
        value = table.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            self.fail(f"{where}.{name}", "expected a whole number ≥ 0")
        return value

    def version(self, table: dict, name: str, where: str) -> str:
        value = self.string(table, name, where)
        try:
            Version(value)
        except InvalidVersion:
            self.fail(f"{where}.{name}", f"{value!r} is not a version")
        return value

    def wheel(self, item, key: str) -> LockedWheel:
        item = self.table(item, key)
        wheel = self.table(item.get("wheel"), f"{key}.wheel")
        layer = self.string(item, "layer", key)
        if layer not in LAYER_ORDER:
            self.fail(f"{key}.layer", f"{layer!r} is not one of {', '.join(LAYER_ORDER)}")
        filename = self.string(wheel, "filename", f"{key}.wheel")
        try:
            parse_wheel_filename(filename)
        except Exception:  # packaging raises several types for bad names
            self.fail(f"{key}.wheel.filename", f"{filename!r} is not a wheel file name")
        if "/" in filename or filename.startswith("."):
            self.fail(f"{key}.wheel.filename", "must be a bare file name")
        return LockedWheel(name=canonicalize_name(self.string(item, "name", key)),
                           version=self.version(item, "version", key), filename=filename,
                           sha256=self.sha(wheel, "sha256", f"{key}.wheel"),
                           size=self.integer(wheel, "size", f"{key}.wheel"), layer=layer)

    def model_config(self, item, key: str) -> LockedModelConfig:
        item = self.table(item, key)
        return LockedModelConfig(shape=self.string(item, "shape", key), file=self.string(item, "file", key),
                                 sha256=self.sha(item, "sha256", key))

    def patch(self, item, key: str) -> LockedPatch:
        item = self.table(item, key)
        file = self.string(item, "file", key)
        if "/" in file or file.startswith("."):
            self.fail(f"{key}.file", "must be a bare file name")
        return LockedPatch(package=self.string(item, "package", key), file=file,
                           sha256=self.sha(item, "sha256", key),
                           strip=self.integer(item, "strip", key),
                           version=self.version(item, "version", key))

    def base(self, value) -> BaseIdentity:
        table = self.table(value, "base")
        kind = self.string(table, "kind", "base")
        if kind not in ("debian", "image"):
            self.fail("base.kind", f"{kind!r} is not debian or image")
        arch = self.string(table, "arch", "base")
        if arch not in ("amd64", "arm64"):
            self.fail("base.arch", f"{arch!r} is not amd64 or arm64")
        fields = dict(kind=kind, python=self.string(table, "python", "base"),
                      glibc=self.string(table, "glibc", "base"), arch=arch,
                      python_path=self.string(table, "python_path", "base"))
        if kind == "image":
            return BaseIdentity(**fields, ref=self.string(table, "ref", "base"))
        suites = tuple(self.suite(item, f"base.suites[{i}]")
                       for i, item in enumerate(self.array(table.get("suites"), "base.suites")))
        if not suites:
            self.fail("base.suites", "names no suite")
        names = {suite.name for suite in suites}
        debs = tuple(self.deb(item, f"base.debs[{i}]", names, arch)
                     for i, item in enumerate(self.array(table.get("debs"), "base.debs")))
        seen: set[str] = set()
        for i, deb in enumerate(debs):
            if deb.name in seen:
                self.fail(f"base.debs[{i}]", f"{deb.name} is locked twice")
            seen.add(deb.name)
        if not debs:
            self.fail("base.debs", "locks no package")
        return BaseIdentity(**fields, suite=self.string(table, "suite", "base"),
                            rootfs_sha256=self.sha(table, "rootfs_sha256", "base"),
                            inputs_sha256=self.sha(table, "inputs_sha256", "base"),
                            suites=suites, debs=tuple(sorted(debs, key=lambda d: d.name)))

    def suite(self, item, key: str) -> LockedSuite:
        item = self.table(item, key)
        components = self.array(item.get("components"), f"{key}.components")
        if not components or not all(isinstance(c, str) and c for c in components):
            self.fail(f"{key}.components", "expected a non-empty list of component names")
        return LockedSuite(name=self.string(item, "name", key), components=tuple(components),
                           date=self.string(item, "date", key))

    def deb(self, item, key: str, suites: set[str], arch: str) -> LockedDeb:
        item = self.table(item, key)
        name = self.string(item, "name", key)
        version = self.string(item, "version", key)
        if not valid_version(version):
            self.fail(f"{key}.version", f"{version!r} is not a Debian version (package {name})")
        deb_arch = self.string(item, "arch", key)
        if deb_arch not in (arch, "all"):
            self.fail(f"{key}.arch", f"{deb_arch!r} is neither {arch} nor all (package {name})")
        filename = self.string(item, "filename", key)
        parts = filename.split("/")
        if parts[0] != "pool" or ".." in parts or "" in parts:
            self.fail(f"{key}.filename", f"{filename!r} is not a path under pool/ (package {name})")
        # The pool file is NAME_VERSION_ARCH.deb (epoch dropped, ':' escaped): an edited version shows.
        expected = f"{name}_{version.split(':', 1)[-1]}_{deb_arch}.deb"
        if parts[-1] not in (expected, expected.replace(":", "%3a")):
            self.fail(f"{key}", f"package {name} {version} ({deb_arch}) does not match its pool file "
                      f"{parts[-1]!r}: the lock was edited by hand")
        suite = self.string(item, "suite", key)
        if suite not in suites:
            self.fail(f"{key}.suite", f"{suite!r} is not one of base.suites (package {name})")
        return LockedDeb(name=name, version=version, arch=deb_arch, filename=filename,
                         sha256=self.sha(item, "sha256", key), size=self.integer(item, "size", key), suite=suite)


def stale_reasons(lock: Lock, recipe: Recipe, *, template_sha256: str) -> list[str]:
    """Why this lock no longer describes this recipe rendered by the template whose sha256 is given
    (render.template_sha256()); empty when it is fresh."""
    reasons = []
    if lock.recipe_sha256 != recipe_sha256(recipe):
        reasons.append(f"{recipe.path.name} changed since it was locked")
    if lock.template_sha256 != template_sha256:
        reasons.append("Dockerfile.j2 changed since the lock was made")
    if not lock.payload_sha256:
        reasons.append("the lock predates the checksum of imagebuild's in-image code")
    elif lock.payload_sha256 != payload_sha256():
        reasons.append("imagebuild's in-image code (probe, patcher or pruner) changed since the lock was made")
    patches_now = [(p.package, sha256_bytes(p.path.read_bytes()), p.strip) for p in recipe.patches]
    if patches_now != [(p.package, p.sha256, p.strip) for p in lock.patches]:
        reasons.append("a patch file changed since the lock was made")
    if model_configs(recipe) != lock.model_configs:
        reasons.append("a shape's model_config (config.json) changed since the lock was made")
    return reasons


def model_configs(recipe: Recipe) -> tuple[LockedModelConfig, ...]:
    """Each [[aot.shapes]] model_config with its sha256 as the file is now (read when the recipe was loaded)."""
    found = recipe.aot.model_configs if recipe.aot is not None else ()
    return tuple(LockedModelConfig(shape=one.shape, file=one.file, sha256=one.dims.sha256) for one in found)


def ensure_fresh(lock: Lock, recipe: Recipe, lock_path: Path, *, template_sha256: str) -> None:
    reasons = stale_reasons(lock, recipe, template_sha256=template_sha256)
    if reasons:
        raise StaleLock(f"{lock_path} is stale: " + "; ".join(reasons) +
                        f". Refresh it with `imagebuild lock {recipe.path}` or build with --relock.")
