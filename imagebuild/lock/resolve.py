"""Resolving a recipe into a Lock: `uv pip compile` for the base's Python and glibc, then one wheel
per distribution chosen for the target's tags, hashed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from imagebuild import __version__
from imagebuild.base.identity import BaseIdentity
from imagebuild.common import MACHINES, Progress, cache_dir, host_arch, quiet
from imagebuild.errors import LockError, ResolveFailed, ToolMissing
from imagebuild.lock.lockfile import (Lock, LockedPatch, LockedWheel, model_configs, payload_sha256, recipe_sha256,
                                      sha256_bytes)
from imagebuild.recipe.layers import LAYER_ORDER, LayerPlan
from imagebuild.recipe.model import Recipe

# uv's marker trick for "leave this distribution out of the resolve": no platform matches it.
_NEVER = "sys_platform == 'imagebuild-excluded'"


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


def uv_binary_for(arch: str, progress: Progress = quiet) -> str:
    """A uv that runs on `arch`, for builds of that platform (it runs inside the build, emulated or on
    a native builder): this machine's own uv, or the same uv release's wheel for that CPU from the
    package index, unpacked once into the cache."""
    uv = uv_binary()
    if arch == host_arch():
        return uv
    release = uv_version(uv).split()[-1]
    target = cache_dir() / "tools" / f"uv-{release}-{arch}" / "uv"
    if target.is_file():
        return str(target)
    machine = MACHINES[arch]
    progress(f"fetching uv {release} for {arch} (it runs inside the {arch} build)")
    with tempfile.TemporaryDirectory(prefix="imagebuild-uv-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "--only-binary=:all:", f"--platform=manylinux_2_17_{machine}", "-d", tmp,
                               f"uv=={release}"], capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob("uv-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ToolMissing(f"no uv {release} for {arch} could be downloaded (it runs inside the {arch} "
                              f"build): {proc.stderr.strip()[-500:]}")
        import zipfile
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(".data/scripts/uv")), None)
            if member is None:
                raise ToolMissing(f"{wheels[0].name} holds no uv binary")
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_suffix(".partial")
            staged.write_bytes(wheel.read(member))
            staged.chmod(0o755)
            os.replace(staged, target)
    return str(target)


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


def preferences_pylock(prefer: dict[str, str]) -> str:
    """The versions a relock keeps, as the output file uv reads them from before resolving (pip-compile's
    way: an existing output's pins are preferred where they still fit, and moved only where they don't)."""
    lines = ['lock-version = "1.0"', 'created-by = "imagebuild"']
    for name, version in sorted(prefer.items()):
        lines += ["", "[[packages]]", f"name = {toml_string(name)}", f"version = {toml_string(version)}"]
    return "\n".join(lines) + "\n"


def toml_string(text: str) -> str:
    """A TOML basic string: quote and backslash escaped, control characters as \\uXXXX."""
    return '"' + "".join("\\" + ch if ch in '"\\' else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ch == "\x7f"
                         else ch for ch in text) + '"'


def compile_command(recipe: Recipe, base: BaseIdentity, workdir: Path, uv: str, *,
                    prefer: dict[str, str] | None = None, upgrade: tuple[str, ...] = ()) -> list[str]:
    """The `uv pip compile` call: the base's Python and glibc, never the host's. `prefer`: versions kept
    where they still resolve (a relock's old lock); `upgrade`: names whose preference is dropped."""
    (workdir / "requirements.in").write_text("\n".join(recipe.python.requirements) + "\n")
    if prefer:
        (workdir / "pylock.toml").write_text(preferences_pylock(prefer))
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
    for name in upgrade:
        command += ["--upgrade-package", name]
    return command


_NO_MATCHING_WHEEL = re.compile(r"Because (\S+?)(?:==(\S+))? has no wheels with a matching platform tag")
# uv wraps its explanation at the terminal's width ($COLUMNS; pytest-xdist's workers set 80), so the
# words are matched with every run of white space read as one space.
_WHITESPACE = re.compile(r"\s+")


_UNAVAILABLE = (re.compile(r"there is no version of (\S+?)=="),
                re.compile(r"Because (\S+?) was not found in the package registry"), _NO_MATCHING_WHEEL)


def unavailable_package(uv_stderr: str) -> str | None:
    """The canonical name of the distribution uv found no such release of, or no wheel of for the
    target, when that is why the resolve failed; None for any other reason (a conflict)."""
    text = _WHITESPACE.sub(" ", uv_stderr)
    for pattern in _UNAVAILABLE:
        if match := pattern.search(text):
            return canonicalize_name(match.group(1))
    return None


def missing_wheel(uv_stderr: str) -> str | None:
    """`name version` of the package uv found no wheel for on the target platform, if that is why
    the resolve failed (uv: "Because X==V has no wheels with a matching platform tag")."""
    match = _NO_MATCHING_WHEEL.search(_WHITESPACE.sub(" ", uv_stderr))
    if not match:
        return None
    return f"{match.group(1)} {match.group(2)}" if match.group(2) else match.group(1)


_LEGACY_MANYLINUX = {"2_5": "manylinux1", "2_12": "manylinux2010", "2_17": "manylinux2014"}


def target_tags(python: str, glibc: str, arch: str) -> list[Tag]:
    """Wheel tags the base's interpreter accepts, best first (what pip or uv inside it would pick)."""
    machine = MACHINES[arch]
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
                 tags: list[Tag] | None = None, target: str = "this target") -> tuple[LockedWheel, ...]:
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
                f"{name} {version} has no wheel for {target} (only a source distribution): "
                "imagebuild never compiles packages during a build. Pin a version that ships a wheel, "
                f"or leave it out with [python].exclude = [\"{name}\"].", package=name)
        wheel = _best_wheel(files, ranking) if ranking else files[0]
        if wheel is None:
            raise ResolveFailed(f"{name} {version}: none of its wheels installs on {target}", package=name)
        filename = _wheel_filename(wheel)
        sha = (wheel.get("hashes") or {}).get("sha256")
        if not sha:
            raise ResolveFailed(f"{name} {version}: the index gave no sha256 for {filename}")
        wheels.append(LockedWheel(name=name, version=version, filename=filename, sha256=sha,
                                  size=int(wheel.get("size") or 0), layer=plan.layer_of(name),
                                  url=str(wheel.get("url") or "")))
    return tuple(sorted(wheels, key=lambda w: (LAYER_ORDER.index(w.layer), w.name)))


def resolve_wheels(recipe: Recipe, base: BaseIdentity, *, prefer: dict[str, str] | None = None,
                   upgrade: tuple[str, ...] = ()) -> tuple[tuple[LockedWheel, ...], str]:
    uv = uv_binary()
    with tempfile.TemporaryDirectory(prefix="imagebuild-resolve-") as tmp:
        workdir = Path(tmp)
        command = compile_command(recipe, base, workdir, uv, prefer=prefer, upgrade=upgrade)
        proc = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False,
                              env={**os.environ, "UV_NO_PROGRESS": "1"})
        if proc.returncode != 0:
            missing = missing_wheel(proc.stderr)
            headline = (f"{missing} has no wheel for linux/{base.arch} ({base.uv_platform}): pin a release "
                        f"that ships one, or build this platform without it. " if missing else "")
            raise ResolveFailed(f"{recipe.path}: {headline}uv could not resolve [python] for Python "
                                f"{base.python} on linux/{base.arch} ({base.uv_platform}):\n{proc.stderr.strip()}",
                                package=unavailable_package(proc.stderr))
        text = (workdir / "pylock.toml").read_text()
    tags = target_tags(base.python, base.glibc, base.arch)
    target = f"linux/{base.arch} ({base.uv_platform})"
    return parse_pylock(text, LayerPlan.for_recipe(recipe), tags=tags, target=target), uv_version(uv)


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


def resolve_lock(recipe: Recipe, base: BaseIdentity, *, template_sha256: str, prefer: dict[str, str] | None = None,
                 upgrade: tuple[str, ...] = ()) -> Lock:
    """The recipe resolved for the base, to be rendered by the template whose sha256 is given
    (render.template_sha256()); `prefer` (name -> version) keeps an old lock's versions wherever the
    recipe still allows them, except the names in `upgrade`."""
    wheels, resolver = resolve_wheels(recipe, base, prefer=prefer, upgrade=upgrade)
    packages = {w.name: w.version for w in wheels}
    check_prune_targets(recipe, packages)
    return Lock(recipe=recipe.stem, recipe_sha256=recipe_sha256(recipe), tool_version=__version__,
                template_sha256=template_sha256, payload_sha256=payload_sha256(), base=base,
                python_platform=base.uv_platform,
                resolver=resolver, wheels=wheels, patches=lock_patches(recipe, packages),
                cuda=cuda_summary(recipe), model_configs=model_configs(recipe))
