"""Does each recipe patch apply to the locked wheel, or to another release before a pin moves?

The wheel in question is downloaded for the lock's target (never installed) and each patch is
checked, hunk by hunk and exactly, against the files inside it. `lock`, `check` and `build` check
the locked wheels themselves (hash-verified, cached by sha256), so a patch that no longer applies
is found in seconds, before any build; `imagebuild patches` checks other releases.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from imagebuild.common import cache_dir
from imagebuild.errors import ImagebuildError
from imagebuild.lock.lockfile import Lock, default_lock_path, read_lock
from imagebuild.lock.resolve import uv_binary
from imagebuild.payload.apply_patch import PatchError, check_patch
from imagebuild.recipe.model import Recipe, load_recipe


@dataclass
class PatchCheck:
    package: str
    patch: str
    locked: str | None
    checked: str
    problems: list[str] = field(default_factory=list)

    @property
    def applies(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"package": self.package, "patch": self.patch, "locked": self.locked,
                "checked": self.checked, "applies": self.applies, "problems": self.problems}


def parse_pins(pins: list[str]) -> dict[str, str]:
    """`flashinfer-python==0.7.3` -> {"flashinfer-python": "0.7.3"}."""
    versions = {}
    for pin in pins:
        try:
            requirement = Requirement(pin)
        except InvalidRequirement as err:
            raise ImagebuildError(f"--version {pin!r}: {err}; write it as PACKAGE==VERSION") from None
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(exact) != 1:
            raise ImagebuildError(f"--version {pin!r}: name one exact release, as PACKAGE==VERSION")
        versions[canonicalize_name(requirement.name)] = exact[0]
    return versions


def newest_release(package: str, python: str, platform: str) -> str:
    """The newest release uv would pick for the target, ignoring the package's dependencies."""
    proc = subprocess.run([uv_binary(), "pip", "compile", "-", "--no-deps", "--no-header", "--quiet",
                           "--no-config", "--python-version", python, "--python-platform", platform,
                           "--no-annotate"], input=package + "\n", capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].strip()
    raise ImagebuildError(f"cannot find a release of {package} for Python {python} on {platform}:\n"
                          f"{proc.stderr.strip()}")


def download_wheel(package: str, version: str, python: str, platform: str, into: Path) -> Path:
    """pip download (no install, no dependencies) of the wheel the target would get."""
    platform_tag = platform.split("-", 1)[1] + "_" + platform.split("-", 1)[0]  # manylinux_2_36_x86_64
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--only-binary=:all:", "--python-version", python, "--platform", platform_tag,
                           "--dest", str(into), f"{package}=={version}"], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ImagebuildError(f"cannot download {package}=={version} for {platform}: "
                              f"{proc.stderr.strip()[-800:]}")
    return wheels[0]


def check_against_wheel(patch_text: str, wheel: Path, strip: int) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

        def read(path: str) -> str | None:
            if path not in names:
                return None
            return archive.read(path).decode("utf-8", "replace")

        try:
            return check_patch(patch_text, read, strip)
        except PatchError as err:
            return [str(err)]


def check_patches(recipe_path: str | Path, *, versions: dict[str, str] | None = None,
                  latest: bool = False) -> list[PatchCheck]:
    """Check each patch against the pinned release, `versions` where given, or the newest release."""
    recipe = load_recipe(recipe_path)
    lock_path = default_lock_path(recipe)
    lock = read_lock(lock_path)
    locked = lock.packages
    versions = versions or {}
    results = []
    with tempfile.TemporaryDirectory(prefix="imagebuild-patches-") as tmp:
        for index, patch in enumerate(recipe.patches):
            if patch.package in versions:
                version = versions[patch.package]
            elif latest:
                version = newest_release(patch.package, lock.base.python, lock.python_platform)
            else:
                version = locked.get(patch.package)
            if version is None:
                raise ImagebuildError(f"{recipe.path}: {patch.package} is not in {lock_path}: "
                                      "name a release with --version PACKAGE==VERSION")
            folder = Path(tmp) / f"{index}"
            folder.mkdir()
            wheel = download_wheel(patch.package, version, lock.base.python, lock.python_platform, folder)
            problems = check_against_wheel(patch.path.read_text(), wheel, patch.strip)
            results.append(PatchCheck(patch.package, patch.path.name, locked.get(patch.package),
                                      version, problems))
    return results


def locked_wheel(lock: Lock, package: str) -> Path:
    """The locked wheel of a package, downloaded once (pip, hash-checking mode) and kept by its sha256."""
    wheel = next((w for w in lock.wheels if w.name == canonicalize_name(package)), None)
    if wheel is None:
        raise ImagebuildError(f"{package} is not in the lock: relock, or drop its patch")
    folder = cache_dir() / "wheels" / wheel.sha256
    cached = folder / wheel.filename
    if cached.is_file():
        return cached
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(wheel.requirement_line + "\n")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "--only-binary=:all:", "--python-version", lock.base.python,
                               *_tag_options(wheel.filename, lock.python_platform), "--dest", tmp,
                               "-r", str(requirements)], capture_output=True, text=True)
        got = Path(tmp) / wheel.filename
        if proc.returncode != 0 or not got.is_file():
            raise ImagebuildError(f"cannot download the locked wheel {wheel.filename} "
                                  f"(sha256 {wheel.sha256[:12]}...): {proc.stderr.strip()[-800:]}")
        got.replace(cached)  # pip checked the sha256 against the lock's
    return cached


def _tag_options(filename: str, python_platform: str) -> list[str]:
    """pip's --platform/--abi for exactly this wheel: pip takes a manylinux tag literally (no older
    glibc implied), so the wheel's own tags are named; a pure wheel takes the lock's platform."""
    _, _, _, tags = parse_wheel_filename(filename)
    platforms = sorted({tag.platform for tag in tags} - {"any"})
    if not platforms:
        arch, _, rest = python_platform.partition("-")
        platforms = [f"{rest}_{arch}"]  # x86_64-manylinux_2_36 -> manylinux_2_36_x86_64
    abis = sorted({tag.abi for tag in tags} - {"none"})
    return [option for platform in platforms for option in ("--platform", platform)] + \
        [option for abi in abis for option in ("--abi", abi)]


def check_locked_patches(recipe: Recipe, lock: Lock) -> list[PatchCheck]:
    """Each recipe patch against the wheel the lock installs; a package the lock lacks is skipped
    (the lock is stale, and says so itself)."""
    results = []
    locked = lock.packages
    for patch in recipe.patches:
        version = locked.get(patch.package)
        if version is None:
            continue
        wheel = locked_wheel(lock, patch.package)
        problems = check_against_wheel(patch.path.read_text(), wheel, patch.strip)
        results.append(PatchCheck(patch.package, str(patch.path), version, version, problems))
    return results
