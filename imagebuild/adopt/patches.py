"""Hand edits as patches: each modified file of a distribution from an index, diffed against the same
file in the wheel the lock installs (read with range requests, lock/remote_wheel.py), one patch per
distribution, proved before it is kept: applied in memory with the image's own patcher
(payload/apply_patch.py) it must give the edited file byte for byte.

    unified_diff(path, old, new)                  -> patch text (git-style headers, strip 1)
    make_patches(inventory, plan, wheels, read)   -> ([PatchFile], [Unpatched])

A file that cannot become a patch (binary, outside site-packages, in the dist-info, too large for the
report, or a wheel whose copy is not the one installed) is Unpatched, with why and what to do.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from imagebuild.adopt.inventory import Installed, Inventory
from imagebuild.adopt.text import comment
from imagebuild.lock.lockfile import LockedWheel
from imagebuild.payload.apply_patch import PatchError, apply_to_text, parse_patch, split_lines

CONTEXT = 3
NO_NEWLINE = "\\ No newline at end of file\n"

ReadMember = Callable[[LockedWheel, str], "bytes | None"]  # the wheel's copy of a site-packages path


@dataclass(frozen=True)
class PatchFile:
    package: str
    version: str
    filename: str  # NAME-VERSION.patch
    data: bytes
    files: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"package": self.package, "version": self.version, "file": f"patches/{self.filename}",
                "files": list(self.files), "sha256": hashlib.sha256(self.data).hexdigest()}


@dataclass(frozen=True)
class Unpatched:
    package: str
    version: str
    path: str
    why: str
    fix: str

    def to_dict(self) -> dict:
        return {"package": self.package, "version": self.version, "path": self.path, "why": self.why, "fix": self.fix}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _hunk_lines(lines: list[str], marker: str) -> list[str]:
    out = []
    for text in lines:
        out += [marker + text] if text.endswith("\n") else [marker + text + "\n", NO_NEWLINE]
    return out


def _range(start: int, end: int) -> str:
    """A hunk side's `start,count` as diff writes it (count 1 implied; an empty side names the line before)."""
    count = end - start
    return f"{start + 1}" if count == 1 else f"{start},0" if count == 0 else f"{start + 1},{count}"


def unified_diff(path: str, old: str, new: str) -> str:
    """The unified diff that turns old into new (lines end at "\\n" only, as the patcher splits them),
    with "\\ No newline at end of file" where a side's last line has none."""
    a, b = split_lines(old), split_lines(new)
    out = [f"diff --git a/{path} b/{path}\n", f"--- a/{path}\n", f"+++ b/{path}\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT):
        (_, i1, _, j1, _), (_, _, i2, _, j2) = group[0], group[-1]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += _hunk_lines(a[x1:x2], " ")
            else:
                out += _hunk_lines(a[x1:x2], "-") + _hunk_lines(b[y1:y2], "+")
    return "".join(out)


def _text(data: bytes) -> str | None:
    """The bytes as the patcher reads them (UTF-8, other bytes kept); None for a binary file."""
    return None if b"\0" in data else data.decode("utf-8", "surrogateescape")


def _proved(diff: str, path: str, old: str, new: str) -> str | None:
    """Why the patch does not turn old into new exactly, or None when it does."""
    try:
        patches = parse_patch(diff)
        if len(patches) != 1 or patches[0].target(1) != path:
            return f"the patch names {[p.target(1) for p in patches]}, not {path}"
        if apply_to_text(patches[0], old, path) != new:
            return "applied, the patch does not give the edited file byte for byte"
    except PatchError as err:
        return f"the image's patcher refuses it: {err}"
    return None


def _member(dist: Installed, wheel: LockedWheel, path: str, read: ReadMember) -> tuple[bytes | None, str]:
    try:
        return read(wheel, path), ""
    except Exception as err:  # noqa: BLE001 -- a wheel that cannot be read is reported, never a crash
        return None, f"{type(err).__name__}: {err}"


def _distribution_patch(dist: Installed, wheel: LockedWheel, read: ReadMember,
                        where: str) -> tuple[PatchFile | None, list[Unpatched]]:
    diffs, unpatched = [], []

    def refuse(path: str, why: str, fix: str) -> None:
        unpatched.append(Unpatched(dist.name, dist.version, path, why, fix))

    for modified in dist.modified:
        path = modified.path
        if not modified.inside:
            refuse(path, "outside site-packages (a script or data file): a patch reaches site-packages only",
                   "make the change in the image another way (an [env] variable, or a distribution of your own)")
            continue
        if path.split("/", 1)[0] == dist.dist_info:
            refuse(path, "in the distribution's metadata, which the lock installs from the wheel as it is",
                   "nothing: the image gets the wheel's own metadata")
            continue
        if modified.content is None:
            refuse(path, f"the probe did not carry its bytes ({modified.omitted})", "patch it by hand: "
                   f"diff it against the file in {wheel.filename} and add a [[patches]] entry")
            continue
        original, failed = _member(dist, wheel, path, read)
        if original is None:
            refuse(path, f"not in the locked wheel {wheel.filename}" + (f" ({failed})" if failed else ""),
                   "check that the lock's wheel is the one installed; patch it by hand")
            continue
        if _record_hash(original) != modified.record:
            refuse(path, f"the locked wheel {wheel.filename} holds another copy than the one installed "
                   f"(RECORD {modified.record}, the wheel {_record_hash(original)}): a patch would carry more "
                   "than the hand edit", "install that wheel in the environment and edit again, or patch by hand")
            continue
        old, new = _text(original), _text(modified.content)
        if old is None or new is None:
            refuse(path, "a binary file: patches change text only",
                   "leave it as the wheel has it, or ship the change in a distribution of your own")
            continue
        diff = unified_diff(path, old, new)
        problem = _proved(diff, path, old, new)
        if problem:
            refuse(path, problem, "patch it by hand")
            continue
        diffs.append((path, diff))
    if not diffs:
        return None, unpatched
    files = tuple(path for path, _ in diffs)
    head = (f"{dist.name} {dist.version}: hand edits adopted from {comment(where)} by `imagebuild adopt`\n\n"
            f"The environment's {', '.join(comment(f) for f in files)} differed from {comment(wheel.filename)}.\n"
            "Paths are relative to site-packages (strip 1).\n\n")
    data = (head + "".join(diff for _, diff in diffs)).encode("utf-8", "surrogateescape")
    return PatchFile(dist.name, dist.version, f"{dist.name}-{dist.version}.patch", data, files), unpatched


def make_patches(inventory: Inventory, pins: Mapping[str, str], wheels: Mapping[str, LockedWheel],
                 read: ReadMember) -> tuple[list[PatchFile], list[Unpatched]]:
    """A patch for each pinned distribution with modified files; the rest of the edits Unpatched."""
    patches, unpatched = [], []
    for dist in inventory.distributions:
        if not dist.modified:
            continue
        wheel = wheels.get(dist.name)
        if dist.name not in pins or wheel is None:
            for modified in dist.modified:
                unpatched.append(Unpatched(dist.name, dist.version, modified.path, "the distribution is left out "
                                           "of the recipe, so there is no wheel to diff against",
                                           "see why it is left out"))
            continue
        patch, refused = _distribution_patch(dist, wheel, read, inventory.where)
        patches += [patch] if patch else []
        unpatched += refused
    return patches, unpatched


def missing_files(inventory: Inventory) -> list[dict]:
    """Files a RECORD lists that are gone: deleted by hand, kept in the image unless pruned."""
    return [{"package": d.name, "version": d.version, "path": path,
             "fix": f"a [[prune]] entry (package = \"{d.name}\", remove = [\"{path}\"]) drops it from the image too"}
            for d in inventory.distributions for path in d.missing]

