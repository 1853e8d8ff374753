"""The recipe tables that change installed distributions: [[patches]] (a unified diff applied
exactly) and [[prune]] (files the stack cannot use, removed or stripped). model.py parses the rest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from imagebuild.recipe.reader import Key, RecipeReader, show, toml_kind

_PATCH_KEYS = ("package", "file", "strip")
_PRUNE_KEYS = ("package", "remove", "strip_debug", "reason", "platforms")
_RECORD_GLOB = re.compile(r"(?!/)(?!.*(?:^|/)\.\.(?:/|$))[^\0\n\r\\]+")


@dataclass(frozen=True)
class Patch:
    package: str  # canonical distribution name
    path: Path  # absolute path of the patch file
    strip: int = 1


@dataclass(frozen=True)
class Prune:
    """Files of one distribution the image's stack cannot use, removed or stripped at install."""

    package: str  # canonical distribution name
    remove: tuple[str, ...] = ()  # globs over the distribution's RECORD paths
    strip_debug: tuple[str, ...] = ()  # ELF files whose debug sections go
    reason: str = ""  # why nothing in the image can use them (reports, tombstone modules)
    platforms: tuple[str, ...] = ()  # the platforms (Debian archs) it applies to; empty: every platform

    def applies_to(self, arch: str) -> bool:
        return not self.platforms or arch in self.platforms


def distribution_name(read: RecipeReader, key: Key, text: str) -> str:
    try:
        return canonicalize_name(text, validate=True)
    except ValueError:
        raise read.error(key, f"{show(text)} is not a distribution name",
                         hint='a project name as on PyPI, without a version, e.g. "torch"') from None


def _package(read: RecipeReader, item: dict, key: Key, example: str) -> str:
    return distribution_name(read, key + ("package",),
                             read.string(item, key + ("package",), required=True, example=example))


def parse_patches(read: RecipeReader, doc: dict, folder: Path) -> tuple[Patch, ...]:
    patches = []
    for key, item in read.tables(doc, "patches", _PATCH_KEYS):
        package = _package(read, item, key, '"flashinfer-python"')
        file = read.string(item, key + ("file",), required=True, example='"patches/fix.patch"')
        path = Path(os.path.abspath(folder / file))
        problem = _not_a_file(path)
        if problem:
            raise read.error(key + ("file",), f"patch file {path} {problem}",
                             hint=f"patch paths are relative to the recipe's folder, {folder}")
        strip = item.get("strip", 1)
        if isinstance(strip, bool) or not isinstance(strip, int):
            raise read.error(key + ("strip",), f"expected an integer, got {toml_kind(strip)}")
        if strip < 0:
            raise read.error(key + ("strip",), "must be 0 or more", hint="the -p level of `patch`, usually 1")
        patches.append(Patch(package=package, path=path, strip=strip))
    return tuple(patches)


def parse_prune(read: RecipeReader, doc: dict, archs: tuple[str, ...]) -> tuple[Prune, ...]:
    """[[prune]] entries; `archs` are the platform names an entry's `platforms` may hold."""
    entries = []
    for key, item in read.tables(doc, "prune", _PRUNE_KEYS):
        package = _package(read, item, key, '"sglang-kernel"')
        globs = {}
        for name in ("remove", "strip_debug"):
            globs[name] = tuple(read.strings(item, key + (name,), example='["pkg/unused_ops.so"]'))
            for position, pattern in enumerate(globs[name]):
                if not _RECORD_GLOB.fullmatch(pattern):
                    raise read.error(key + (name, position), f"{show(pattern)} is not a path glob inside "
                                     "site-packages",
                                     hint="relative, / between folders, no .., e.g. \"sgl_kernel/flash_ops*.so\"")
        if not globs["remove"] and not globs["strip_debug"]:
            raise read.error(key, "prunes nothing", hint="give remove = [globs] or strip_debug = [globs]")
        reason = read.string(item, key + ("reason",), required=True,
                             example='"SASS for sm_80/sm_90a only: an SM120 GPU cannot run it"')
        if not reason.strip() or "\n" in reason or "\r" in reason:
            raise read.error(key + ("reason",), "must be one non-empty line",
                             hint="say why nothing in the image can use these files")
        platforms = read.strings(item, key + ("platforms",), example='["amd64"]')
        for position, arch in enumerate(platforms):
            if arch not in archs:
                raise read.error(key + ("platforms", position), f"{show(arch)} is not a platform",
                                 hint=f"one of: {', '.join(archs)} (files only one platform's wheel has)")
        entries.append(Prune(package=package, remove=globs["remove"], strip_debug=globs["strip_debug"],
                             reason=reason.strip(), platforms=tuple(sorted(set(platforms)))))
    return tuple(entries)


def _not_a_file(path: Path) -> str | None:
    try:
        if path.is_file():
            return None
        return "is not a file" if path.exists() else "does not exist"
    except (OSError, ValueError) as err:  # a name too long, a NUL byte
        return f"cannot be read ({getattr(err, 'strerror', None) or err})"
