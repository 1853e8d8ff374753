"""Lock: the recipe resolved with uv for the base's Python and glibc, every wheel pinned by sha256.

The lock also records what it was made from (the recipe's and the template's checksums, the tool
version, the base's identity, each patch's sha256), so a stale lock is detected before a build.
The same inputs give a byte-identical lock: no timestamps, sorted keys, sorted packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagebuild import __version__
from imagebuild.bases import BaseIdentity
from imagebuild.errors import LockError, ResolveFailed, StaleLock, ToolMissing
from imagebuild.files import write_atomic
from imagebuild.layers import LAYER_ORDER, LayerPlan
from imagebuild.recipe import Recipe

LOCK_VERSION = 1
# uv's marker trick for "leave this distribution out of the resolve": no platform matches it.
_NEVER = "sys_platform == 'imagebuild-excluded'"


@dataclass(frozen=True)
class LockedWheel:
    name: str  # canonical
    version: str
    filename: str
    sha256: str
    size: int
    layer: str

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
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def template_path() -> Path:
    """Dockerfile.j2: at the repository root in a checkout, inside the package in a wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "Dockerfile.j2", here.parent / "Dockerfile.j2"):
        if candidate.is_file():
            return candidate
    raise LockError(f"Dockerfile.j2 not found next to {here}: the installation is incomplete")


def template_sha256() -> str:
    return sha256_bytes(template_path().read_bytes())


def payload_sha256() -> str:
    """imagebuild's own code that goes into or runs inside an image besides the wheels (the probe
    zipapp, the patcher, the pruner): a change to it changes the image a lock builds."""
    from imagebuild.probe import bundle
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name, data in (("probe.pyz", bundle.zipapp_bytes()),
                       ("apply_patch.py", (here / "apply_patch.py").read_bytes()),
                       ("prune.py", (here / "prune.py").read_bytes())):
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def recipe_sha256(recipe: Recipe) -> str:
    return sha256_bytes(recipe.path.read_bytes())


def default_lock_path(recipe: Recipe) -> Path:
    """recipes/NAME.toml -> lockfiles/NAME.lock, beside the recipes folder."""
    return recipe.path.parent.parent / "lockfiles" / f"{recipe.stem}.lock"


# ---------------------------------------------------------------- resolve

def uv_binary() -> str:
    """uv from the same environment as imagebuild (a dependency), else PATH."""
    candidate = Path(sys.executable).parent / "uv"
    if candidate.is_file():
        return str(candidate)
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except Exception:  # the uv package is absent or has no binary: look on PATH
        pass
    from shutil import which
    found = which("uv")
    if not found:
        raise ToolMissing("uv is not installed: `pip install uv` (imagebuild resolves with it).")
    return found


def uv_version(uv: str) -> str:
    """`uv 0.13.9`: from the installed uv package when that is the binary in use (no extra process)."""
    if Path(uv).parent == Path(sys.executable).parent:
        try:
            from importlib.metadata import version
            return f"uv {version('uv')}"
        except Exception:  # not installed as a package here: ask the binary
            pass
    out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False)
    return " ".join(out.stdout.split()[:2]) or "uv (unknown version)"


def compile_command(recipe: Recipe, base: BaseIdentity, workdir: Path, uv: str) -> list[str]:
    """The `uv pip compile` call: the base's Python and glibc, never the host's."""
    (workdir / "requirements.in").write_text("\n".join(recipe.python.requirements) + "\n")
    (workdir / "constraints.txt").write_text("\n".join(recipe.python.constraints) + "\n")
    (workdir / "overrides.txt").write_text(
        "".join(f"{name} ; {_NEVER}\n" for name in recipe.python.exclude))
    command = [uv, "pip", "compile", "requirements.in", "-c", "constraints.txt",
               "--overrides", "overrides.txt", "--python-version", base.python,
               "--python-platform", base.uv_platform, "--format", "pylock.toml",
               "-o", "pylock.toml", "--no-header", "--quiet", "--no-config"]
    for url in recipe.python.extra_index_urls:
        command += ["--extra-index-url", url]
    if recipe.python.exclude_newer:
        command += ["--exclude-newer", recipe.python.exclude_newer]
    return command


_LEGACY_MANYLINUX = {"2_5": "manylinux1", "2_12": "manylinux2010", "2_17": "manylinux2014"}


def target_tags(python: str, glibc: str, arch: str) -> list[Tag]:
    """Wheel tags the base's interpreter accepts, best first (what pip or uv inside it would pick)."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    major, minor = (int(x) for x in glibc.split(".")[:2])
    platforms = []
    for glibc_minor in range(minor, 4, -1) if major == 2 else ():
        platforms.append(f"manylinux_2_{glibc_minor}_{machine}")
        if legacy := _LEGACY_MANYLINUX.get(f"2_{glibc_minor}"):
            platforms.append(f"{legacy}_{machine}")
    platforms.append(f"linux_{machine}")
    version = tuple(int(x) for x in python.split(".")[:2])
    return [*cpython_tags(version, platforms=platforms),
            *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms)]


def _wheel_filename(wheel: dict) -> str:
    return str(wheel.get("name") or str(wheel.get("url", "")).rsplit("/", 1)[-1])


def _best_wheel(files: list, ranking: dict[Tag, int]) -> dict | None:
    """uv lists every wheel that fits the target; keep the one an installer in the image prefers."""
    best, best_rank = None, len(ranking)
    for wheel in files:
        try:
            _, _, _, wheel_tags = parse_wheel_filename(_wheel_filename(wheel))
        except Exception:  # packaging raises several types for bad file names
            continue
        rank = min((ranking.get(tag, len(ranking)) for tag in wheel_tags), default=len(ranking))
        if rank < best_rank:
            best, best_rank = wheel, rank
    return best


def parse_pylock(text: str, plan: LayerPlan, source: str = "pylock.toml",
                 tags: list[Tag] | None = None) -> tuple[LockedWheel, ...]:
    """Read uv's PEP 751 output: one wheel per package for the target. Sdist-only packages are refused."""
    ranking = {tag: index for index, tag in reversed(list(enumerate(tags or [])))}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ResolveFailed(f"{source}: the resolver wrote unreadable TOML: {err}") from None
    wheels = []
    for entry in data.get("packages", []):
        name = canonicalize_name(str(entry.get("name", "")))
        version = str(entry.get("version", ""))
        files = entry.get("wheels") or []
        if not files:
            raise ResolveFailed(
                f"{name} {version} has no wheel for this target (only a source distribution): "
                "imagebuild never compiles packages during a build. Pin a version that ships a wheel, "
                f"or leave it out with [python].exclude = [\"{name}\"].")
        wheel = _best_wheel(files, ranking) if ranking else files[0]
        if wheel is None:
            raise ResolveFailed(f"{name} {version}: none of its wheels installs on the target")
        filename = _wheel_filename(wheel)
        sha = (wheel.get("hashes") or {}).get("sha256")
        if not sha:
            raise ResolveFailed(f"{name} {version}: the index gave no sha256 for {filename}")
        wheels.append(LockedWheel(name=name, version=version, filename=filename, sha256=sha,
                                  size=int(wheel.get("size") or 0), layer=plan.layer_of(name)))
    return tuple(sorted(wheels, key=lambda w: (LAYER_ORDER.index(w.layer), w.name)))


def resolve_wheels(recipe: Recipe, base: BaseIdentity) -> tuple[tuple[LockedWheel, ...], str]:
    uv = uv_binary()
    with tempfile.TemporaryDirectory(prefix="imagebuild-resolve-") as tmp:
        workdir = Path(tmp)
        command = compile_command(recipe, base, workdir, uv)
        proc = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False,
                              env={**os.environ, "UV_NO_PROGRESS": "1"})
        if proc.returncode != 0:
            raise ResolveFailed(f"{recipe.path}: uv could not resolve [python] for Python {base.python} "
                                f"on {base.uv_platform}:\n{proc.stderr.strip()}")
        text = (workdir / "pylock.toml").read_text()
    tags = target_tags(base.python, base.glibc, base.arch)
    return parse_pylock(text, LayerPlan.for_recipe(recipe), tags=tags), uv_version(uv)


def lock_patches(recipe: Recipe, packages: dict[str, str]) -> tuple[LockedPatch, ...]:
    locked = []
    for index, patch in enumerate(recipe.patches):
        if patch.package not in packages:
            raise LockError(f"{recipe.path}: [[patches]] #{index + 1} patches {patch.package}, which the "
                            "resolve does not contain: add it to [python].requirements or drop the patch")
        locked.append(LockedPatch(package=patch.package, file=f"{index + 1:02d}-{patch.path.name}",
                                  sha256=sha256_bytes(patch.path.read_bytes()), strip=patch.strip,
                                  version=packages[patch.package]))
    return tuple(locked)


def check_prune_targets(recipe: Recipe, packages: dict[str, str]) -> None:
    for index, entry in enumerate(recipe.prune):
        if entry.package not in packages:
            raise LockError(f"{recipe.path}: [[prune]] #{index + 1} prunes {entry.package}, which the resolve "
                            "does not contain: drop the entry, or fix its package name")


def cuda_summary(recipe: Recipe) -> dict:
    if recipe.cuda is None:
        return {}
    return {"toolkit": str(recipe.cuda.toolkit), "archs": [a.sm for a in recipe.cuda.archs],
            "min_driver": recipe.cuda.min_driver}


def resolve_lock(recipe: Recipe, base: BaseIdentity) -> Lock:
    wheels, resolver = resolve_wheels(recipe, base)
    packages = {w.name: w.version for w in wheels}
    check_prune_targets(recipe, packages)
    return Lock(recipe=recipe.stem, recipe_sha256=recipe_sha256(recipe), tool_version=__version__,
                template_sha256=template_sha256(), payload_sha256=payload_sha256(), base=base,
                python_platform=base.uv_platform,
                resolver=resolver, wheels=wheels, patches=lock_patches(recipe, packages),
                cuda=cuda_summary(recipe))


# ---------------------------------------------------------------- read, write, freshness

def write_lock(lock: Lock, path: Path) -> None:
    """Temp file + rename: a crash never leaves half a lock."""
    write_atomic(path, lock.to_json().encode())


def read_lock(path: Path) -> Lock:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(f"{path}: no lock yet: run `imagebuild lock RECIPE` first") from None
    except (OSError, UnicodeDecodeError) as err:
        raise LockError(f"{path}: cannot read the lock: {err}") from None
    return parse_lock(text, str(path))


def parse_lock(text: str, source: str) -> Lock:
    """Validate a lock read from disk; anything off is one LockError naming the key."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise LockError(f"{source}: not valid JSON ({err}): relock with `imagebuild lock RECIPE`") from None
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
                cuda=reader.table(top.get("cuda", {}), "cuda"))


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
        packages = self.table(table.get("packages", {}), "base.packages")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in packages.items()):
            self.fail("base.packages", "expected package -> version strings")
        arch = self.string(table, "arch", "base")
        if arch not in ("amd64", "arm64"):
            self.fail("base.arch", f"{arch!r} is not amd64 or arm64")
        fields = dict(kind=kind, python=self.string(table, "python", "base"),
                      glibc=self.string(table, "glibc", "base"), arch=arch,
                      python_path=self.string(table, "python_path", "base"), packages=packages)
        if kind == "debian":
            fields.update(suite=self.string(table, "suite", "base"),
                          rootfs_sha256=self.sha(table, "rootfs_sha256", "base"))
        else:
            fields["ref"] = self.string(table, "ref", "base")
        return BaseIdentity(**fields)


def stale_reasons(lock: Lock, recipe: Recipe) -> list[str]:
    """Why this lock no longer describes this recipe; empty when it is fresh."""
    reasons = []
    if lock.recipe_sha256 != recipe_sha256(recipe):
        reasons.append(f"{recipe.path.name} changed since it was locked")
    if lock.template_sha256 != template_sha256():
        reasons.append("Dockerfile.j2 changed since the lock was made")
    if not lock.payload_sha256:
        reasons.append("the lock predates the checksum of imagebuild's in-image code")
    elif lock.payload_sha256 != payload_sha256():
        reasons.append("imagebuild's in-image code (probe, patcher or pruner) changed since the lock was made")
    patches_now = [(p.package, sha256_bytes(p.path.read_bytes()), p.strip) for p in recipe.patches]
    if patches_now != [(p.package, p.sha256, p.strip) for p in lock.patches]:
        reasons.append("a patch file changed since the lock was made")
    return reasons


def ensure_fresh(lock: Lock, recipe: Recipe, lock_path: Path) -> None:
    reasons = stale_reasons(lock, recipe)
    if reasons:
        raise StaleLock(f"{lock_path} is stale: " + "; ".join(reasons) +
                        f". Refresh it with `imagebuild lock {recipe.path}` or build with --relock.")
