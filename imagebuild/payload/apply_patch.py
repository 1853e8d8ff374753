"""Apply a recipe's unified diff to an installed distribution: exactly, or not at all.

Copied into the image and run there (stdlib only, Python >= 3.9, no imagebuild imports):

    python apply_patch.py --strip 1 --package NAME --sha256 HEX SITE_PACKAGES PATCH

Every hunk must match at its stated line numbers (no fuzz, no offset), and nothing is written
unless every hunk of every file matches. The distribution's RECORD then gets the new hashes and
<dist-info>/IMAGEBUILD_PATCHES names the patches applied, so tools that check RECORD see a
consistent, declared install; <dist-info>/IMAGEBUILD_PATCHED_FILES.json holds the sha256 each patched
file was left with, which the probe checks in the finished image. parse_patch, apply_to_text and
check_patch write nothing: `imagebuild patches check` uses them to test a patch against a newer release.
"""

from __future__ import annotations

import argparse
import base64
import csv
import glob
import hashlib
import io
import json
import os
import posixpath
import re
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

PATCHES_FILE = "IMAGEBUILD_PATCHES"
# What the patches left: {path relative to site-packages: sha256 hex, or null for a file they deleted}. The
# probe (payload/probe/checks/toolchain.py check_packages) checks the image's files against it, so a later step cannot undo a patch.
PATCHED_FILES = "IMAGEBUILD_PATCHED_FILES.json"
REGENERATE = "regenerate the patch against the locked version of the package"


class PatchError(Exception):
    """A patch that cannot be read or applied; str(err) is the whole message for the user."""


@dataclass
class Hunk:
    header: str  # the "@@ -a,b +c,d @@" line as written
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (" ", "-" or "+", text + newline)

    @property
    def old_lines(self) -> list[str]:
        return [text for op, text in self.lines if op != "+"]

    @property
    def new_lines(self) -> list[str]:
        return [text for op, text in self.lines if op != "-"]


@dataclass
class FilePatch:
    old_path: str | None  # as written in the patch; None for /dev/null (a new file)
    new_path: str | None  # None for /dev/null (a deletion)
    hunks: list[Hunk] = field(default_factory=list)
    new_mode: int | None = None  # permission bits of a created file, from a git header

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_deletion(self) -> bool:
        return self.new_path is None

    def target(self, strip: int) -> str:
        """The path this patch changes, relative to the patched tree, `strip` components removed."""
        return strip_path(self.old_path if self.new_path is None else self.new_path, strip)


def strip_path(path: str | None, strip: int) -> str:
    """Remove `strip` leading components; refuse absolute paths and `..`."""
    if path is None or strip < 0:
        raise PatchError("a file patch names no path, or --strip is negative")
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PatchError(f"{path!r}: not a path this file system can hold") from None
    if "\0" in path:
        raise PatchError(f"{path!r}: a path with a NUL character")
    if path.startswith("/"):
        raise PatchError(f"{path!r}: absolute paths are refused; a patch names files relative to "
                         "site-packages")
    parts = path.split("/")
    if len(parts) <= strip:
        raise PatchError(f"{path}: cannot strip {strip} leading component(s) from a path of "
                         f"{len(parts)}; check the patch's strip level")
    kept = [part for part in parts[strip:] if part not in ("", ".")]
    if not kept or ".." in kept:
        raise PatchError(f"{path}: refused, the path would escape site-packages")
    return "/".join(kept)


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n"; only "\\n" ends a line, so "\\r" and form feeds stay content."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    return lines + [pieces[-1]] if pieces[-1] else lines


# ---- parsing ---------------------------------------------------------------------------------

_HUNK = re.compile(r"@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
_UNSUPPORTED = {
    "old mode ": "mode changes", "new mode ": "mode changes",
    "rename ": "renames", "copy ": "copies", "similarity index ": "renames",
    "dissimilarity index ": "rewrites", "GIT binary patch": "binary patches",
    "Binary files ": "binary patches",
}
_EPOCH = re.compile(r"1970-01-01 00:00:00(\.0+)? \+0000$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a unified diff (git-style or plain) into file patches; raise PatchError if malformed."""
    if not isinstance(text, str):
        raise PatchError(f"a patch is text, got {type(text).__name__}")
    lines = split_lines(text)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            patch, i = _parse_git_file(lines, i)
        elif _is_file_header(lines, i):
            patch = FilePatch(_header_path(lines[i]), _header_path(lines[i + 1]))
            i = _parse_hunks(lines, i + 2, patch)
        elif line.startswith("@@"):
            raise PatchError(f"patch line {i + 1}: hunk {_show(line)} comes before any file "
                             "header (--- / +++)")
        elif line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchError(f"patch line {i + 1}: binary patches are not supported")
        else:  # commit messages, "Index:" lines, format-patch trailers
            i += 1
            continue
        patches.append(patch)
    return patches


def _is_file_header(lines: list[str], i: int) -> bool:
    return i + 1 < len(lines) and lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")


def _parse_git_file(lines: list[str], i: int) -> tuple[FilePatch, int]:
    names = _git_names(lines[i][len("diff --git "):].rstrip("\r\n"))
    patch = FilePatch(*names) if names else FilePatch("", "")
    start, i = i, i + 1
    while i < len(lines) and not lines[i].startswith(("diff --git ", "--- ", "@@")):
        line = lines[i]
        kind = next((v for k, v in _UNSUPPORTED.items() if line.startswith(k)), None)
        if kind:
            raise PatchError(f"patch line {i + 1}: {kind} are not supported ({_show(line)})")
        if line.startswith("new file mode "):
            patch.old_path, patch.new_mode = None, _mode(line, i)
        elif line.startswith("deleted file mode "):
            patch.new_path = None
        elif not line.startswith("index "):
            break
        i += 1
    if _is_file_header(lines, i):
        old, new = _header_path(lines[i]), _header_path(lines[i + 1])
        if (old is None) != patch.is_new or (new is None) != patch.is_deletion:
            raise PatchError(f"patch line {i + 1}: the --- / +++ lines disagree with the git header "
                             "on whether the file is created or deleted")
        patch.old_path, patch.new_path = old, new
        return patch, _parse_hunks(lines, i + 2, patch)
    if not names or not (patch.is_new or patch.is_deletion):
        raise PatchError(f"patch line {start + 1}: {_show(lines[start])} has no --- / +++ lines "
                         "and no hunks")
    return patch, i  # an empty file created or deleted


def _git_names(rest: str) -> tuple[str, str] | None:
    """Both paths of a `diff --git` line; None when they cannot be told apart (spaces in names)."""
    if rest.startswith('"'):
        old, tail = _unquote(rest)
        if not tail.startswith(" "):
            return None
        tail = tail[1:]
        return (old, _unquote(tail)[0]) if tail.startswith('"') else (old, tail)
    half = len(rest) // 2
    if len(rest) % 2 == 1 and rest[half] == " ":
        old, new = rest[:half], rest[half + 1:]
        if old == new or old.split("/", 1)[1:] == new.split("/", 1)[1:]:
            return old, new
    return tuple(rest.split(" ")) if rest.count(" ") == 1 else None  # type: ignore[return-value]


def _header_path(line: str) -> str | None:
    """The path of a ---/+++ line, without its timestamp; None for /dev/null."""
    text = line[4:].rstrip("\r\n")
    if text.startswith('"'):
        path, stamp = _unquote(text)
    else:
        path, _, stamp = text.partition("\t")
    if not path:
        raise PatchError(f"file header {_show(line)} names no path")
    # `diff -N` shows a missing file as one dated at the epoch, where git writes /dev/null
    return None if path == "/dev/null" or _EPOCH.match(stamp.strip()) else path


def _unquote(text: str) -> tuple[str, str]:
    """Decode git's C-style quoted path at the start of `text`; return it and the rest."""
    out, i = bytearray(), 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1:]
        if char == "\\":
            code = text[i + 1:i + 4]
            if re.fullmatch(r"[0-3][0-7][0-7]", code):
                out.append(int(code, 8))
                i += 4
                continue
            if code[:1] not in _ESCAPES:
                raise PatchError(f"bad escape in quoted path {text!r}")
            out.append(_ESCAPES[code[:1]])
            i += 2
            continue
        out += char.encode("utf-8", "surrogatepass")
        i += 1
    raise PatchError(f"unterminated quoted path {text!r}")


def _mode(line: str, i: int) -> int:
    digits = line.rsplit(" ", 1)[-1].strip()
    if not re.fullmatch(r"[0-7]{6}", digits):
        raise PatchError(f"patch line {i + 1}: bad file mode {_show(line)}")
    return int(digits, 8) & 0o777


def _parse_hunks(lines: list[str], i: int, patch: FilePatch) -> int:
    while i < len(lines) and lines[i].startswith("@@"):
        hunk, i = _parse_hunk(lines, i)
        patch.hunks.append(hunk)
    # a diff line right after a hunk means the header undercounts (the "-- " line signs an email)
    if i < len(lines) and lines[i][:1] in (" ", "-", "+") and lines[i].rstrip() != "--" \
            and not _is_file_header(lines, i):
        raise PatchError(f"patch line {i + 1}: hunk {patch.hunks[-1].header if patch.hunks else ''} "
                         "has more lines than the header counts")
    if not patch.hunks and not (patch.is_new or patch.is_deletion):
        raise PatchError(f"{patch.new_path}: the file header is followed by no hunk")
    return i


def _parse_hunk(lines: list[str], i: int) -> tuple[Hunk, int]:
    header = lines[i].rstrip("\r\n")
    match = _HUNK.match(header)
    if not match:
        raise PatchError(f"patch line {i + 1}: malformed hunk header {header!r}")
    a, b, c, d = match.groups()
    hunk = Hunk(header, int(a), 1 if b is None else int(b), int(c), 1 if d is None else int(d))
    where = f"patch line {i + 1}: hunk {header}"
    if hunk.old_start == 0 < hunk.old_count or hunk.new_start == 0 < hunk.new_count:
        raise PatchError(f"{where}: a non-empty range cannot start at line 0")
    old = new = 0
    i += 1
    while old < hunk.old_count or new < hunk.new_count:
        if i >= len(lines):
            raise PatchError(f"{where} is truncated: the patch ends after {old} of {hunk.old_count} "
                             f"old and {new} of {hunk.new_count} new lines")
        line = lines[i]
        op, text = (" ", line) if line == "\n" else (line[:1], line[1:])  # blank context, trimmed
        if op == "\\":
            _no_newline(hunk, where)
        elif op in (" ", "-", "+"):
            old += op != "+"
            new += op != "-"
            if old > hunk.old_count or new > hunk.new_count:
                raise PatchError(f"{where}: the body has more lines than the header counts")
            hunk.lines.append((op, text if text.endswith("\n") else text + "\n"))
        else:
            raise PatchError(f"{where}: patch line {i + 1} ({_show(line)}) is not a hunk line; the "
                             "header's line counts do not match its body")
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        _no_newline(hunk, where)
        i += 1
    for side in (hunk.old_lines, hunk.new_lines):
        if any(not text.endswith("\n") for text in side[:-1]):
            raise PatchError(f"{where}: '\\ No newline at end of file' follows a line that is not "
                             "the last of its side")
    return hunk, i


def _no_newline(hunk: Hunk, where: str) -> None:
    if not hunk.lines:
        raise PatchError(f"{where}: '\\ No newline at end of file' follows no line")
    op, text = hunk.lines[-1]
    hunk.lines[-1] = (op, text.removesuffix("\n"))


def _show(line: str) -> str:
    line = line.removesuffix("\n")
    return repr(line if len(line) <= 120 else line[:117] + "...")


# ---- applying in memory ----------------------------------------------------------------------

def apply_to_text(file_patch: FilePatch, original_text: str, name: str | None = None) -> str:
    """The text after every hunk applies exactly at its stated lines; PatchError on any mismatch."""
    name = name or file_patch.new_path or file_patch.old_path or "?"
    source = split_lines(original_text)
    out: list[str] = []
    done = 0  # lines of `source` already copied or replaced
    total = len(file_patch.hunks)
    for number, hunk in enumerate(file_patch.hunks, 1):
        where = f"{name}: hunk {number} of {total} ({hunk.header})"
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if start < done:
            raise PatchError(f"{where} starts inside or before the hunk before it; {REGENERATE}")
        if start > len(source):
            raise PatchError(f"{where} does not apply: it starts after line {start}, but the file "
                             f"has {len(source)} lines.\n  {REGENERATE}")
        for offset, expected in enumerate(hunk.old_lines):
            found = source[start + offset] if start + offset < len(source) else None
            if found != expected:
                raise PatchError(f"{where} does not apply at line {start + offset + 1}:\n"
                                 f"  expected: {_show_line(expected)}\n"
                                 f"  found:    {_show_found(found, len(source))}\n"
                                 f"  The file is not the one the patch was made from: {REGENERATE}.")
        out += source[done:start] + hunk.new_lines
        done = start + len(hunk.old_lines)
    out += source[done:]
    if any(not line.endswith("\n") for line in out[:-1]):
        raise PatchError(f"{name}: a line marked '\\ No newline at end of file' would not end the "
                         f"file; {REGENERATE}")
    return "".join(out)


def _show_line(line: str) -> str:
    return repr(line[:-1]) if line.endswith("\n") else f"{line!r} (no newline at end of file)"


def _show_found(line: str | None, length: int) -> str:
    return f"end of file (the file has {length} lines)" if line is None else _show_line(line)


def apply_file_patch(file_patch: FilePatch, path: str, original: str | None) -> str | None:
    """The new text of `path` (None once deleted), given its text now (None if it does not exist)."""
    if file_patch.is_new:
        if original is not None:
            raise PatchError(f"{path}: the patch creates this file, but it already exists")
        return apply_to_text(file_patch, "", path)
    if original is None:
        raise PatchError(f"{path}: not found, but the patch changes it; {REGENERATE}")
    text = apply_to_text(file_patch, original, path)
    if not file_patch.is_deletion:
        return text
    if text:
        raise PatchError(f"{path}: the patch deletes this file, but it holds more than the patch "
                         f"removes; {REGENERATE}")
    return None


def check_patch(text: str, read_file: Callable[[str], str | None], strip: int = 1) -> list[str]:
    """Problems that stop `text` applying to the files `read_file` returns; empty means it applies."""
    try:
        patches = parse_patch(text)
    except PatchError as err:
        return [str(err)]
    if not patches:
        return ["the patch changes no file"]
    problems: list[str] = []
    current: dict[str, str | None] = {}
    for file_patch in patches:
        try:
            path = file_patch.target(strip)
            if path not in current:
                current[path] = read_file(path)
            current[path] = apply_file_patch(file_patch, path, current[path])
        except PatchError as err:
            problems.append(str(err))
    return problems


# ---- applying to an installed distribution ---------------------------------------------------

@dataclass
class Distribution:
    name: str
    version: str
    dist_info: str  # directory name inside site-packages, e.g. flashinfer_python-0.7.2.dist-info


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_distribution(site: str, package: str) -> Distribution:
    """The one *.dist-info in `site` whose project name is `package` (compared canonically)."""
    found = []
    for entry in sorted(os.listdir(site)):
        stem, dot, _ = entry.rpartition(".dist-info")
        if not dot or canonical_name(stem.rsplit("-", 1)[0]) != canonical_name(package):
            continue
        meta = _read_metadata(os.path.join(site, entry, "METADATA"))
        found.append(Distribution(meta.get("Name", package), meta.get("Version", "?"), entry))
    if not found:
        raise PatchError(f"{package} is not installed in {site}: no {package}-*.dist-info there; "
                         "check the patch's package name in the recipe")
    if len(found) > 1:
        raise PatchError(f"{site} holds {len(found)} dist-info directories for {package} "
                         f"({', '.join(d.dist_info for d in found)}): the install is broken")
    return found[0]


def _read_metadata(path: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            for line in file:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def record_hash(data: bytes) -> str:
    """The wheel RECORD form: sha256=<urlsafe base64, no padding>."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def apply_patch_file(site_packages: str, patch_file: str, *, package: str, sha256: str,
                     strip: int = 1) -> list[str]:
    """Verify, apply and record one patch; return a line per changed file. Writes only on success."""
    data = _read_bytes(patch_file)
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256.lower():
        raise PatchError(f"{patch_file}: sha256 is {actual}, the lock says {sha256}: the build "
                         "context is stale or was altered; render it again from the lock")
    patches = parse_patch(data.decode("utf-8", "surrogateescape"))
    if not patches:
        raise PatchError(f"{patch_file}: the patch changes no file")
    site = os.path.realpath(site_packages)
    if not os.path.isdir(site):
        raise PatchError(f"{site_packages}: not a directory; expected the image's site-packages")
    dist = find_distribution(site, package)
    about = f"{dist.name} {dist.version}"
    info = os.path.join(site, dist.dist_info)
    applied = _read_text(os.path.join(info, PATCHES_FILE)) or ""
    if actual in applied.split():
        raise PatchError(f"{patch_file}: already applied to {about} (listed in {PATCHES_FILE})")
    record_text = _read_text(os.path.join(info, "RECORD"))
    if record_text is None:
        raise PatchError(f"{info}: has no RECORD, so its files cannot be checked or re-hashed")
    listed = {posixpath.normpath(row[0]) for _, row in _record_rows(record_text) if row}

    new_texts: dict[str, str | None] = {}  # path relative to site -> text after the patch
    created: dict[str, int] = {}  # new file -> its permission bits
    for file_patch in patches:
        path = file_patch.target(strip)
        _inside(site, path)
        if path.startswith(dist.dist_info + "/"):
            raise PatchError(f"{path}: a patch may not change the dist-info; this tool keeps it")
        if not file_patch.is_new and path not in listed:
            raise PatchError(f"{path}: not listed in the RECORD of {about}: the patch names a file "
                             "this distribution does not install (another package's, or a wrong "
                             "strip level)")
        if file_patch.is_new and not any(p.startswith(path.split("/")[0] + "/") for p in listed):
            raise PatchError(f"{path}: created outside every directory of {about}")
        if path not in new_texts:
            new_texts[path] = _read_text(os.path.join(site, path))
        if file_patch.is_new and new_texts[path] is None:
            created[path] = 0o644 if file_patch.new_mode is None else file_patch.new_mode
        try:
            new_texts[path] = apply_file_patch(file_patch, path, new_texts[path])
        except PatchError as err:
            raise PatchError(f"{err}\n  installed: {about} in {site}") from None

    outputs = {path: None if text is None else text.encode("utf-8", "surrogateescape")
               for path, text in new_texts.items()}
    stale = [os.path.relpath(pyc, site).replace(os.sep, "/") for path in outputs
             if path.endswith(".py") for pyc in _compiled(site, path)]
    outputs[f"{dist.dist_info}/{PATCHES_FILE}"] = \
        (applied + f"{actual}  {os.path.basename(patch_file)}\n").encode("utf-8", "surrogateescape")
    outputs[f"{dist.dist_info}/{PATCHED_FILES}"] = _produced(os.path.join(info, PATCHED_FILES), new_texts, outputs)
    record = _rewrite_record(record_text, outputs, stale)
    _write_all(site, {**outputs, f"{dist.dist_info}/RECORD": record.encode("utf-8", "surrogateescape")},
               created, stale)
    return [f"{'deleted' if text is None else 'created' if path in created else 'patched'} {path} "
            f"({about})" for path, text in new_texts.items()]


def _produced(path: str, new_texts: dict, outputs: dict) -> bytes:
    """PATCHED_FILES with this patch's files: the sha256 each now has (null: deleted), over earlier patches'."""
    text = _read_text(path)
    try:
        produced = json.loads(text) if text is not None else {}
    except ValueError:
        produced = None
    if not isinstance(produced, dict):
        raise PatchError(f"{path}: not the JSON object this tool writes; reinstall the distribution")
    for name in new_texts:
        data = outputs[name]
        produced[name] = None if data is None else hashlib.sha256(data).hexdigest()
    return (json.dumps(produced, indent=1, sort_keys=True) + "\n").encode("utf-8", "surrogateescape")


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _read_text(path: str) -> str | None:
    """A file's text, bytes that are not UTF-8 kept as they are; None if it does not exist."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        raise PatchError(f"{path}: not a regular file; refused")
    return _read_bytes(path).decode("utf-8", "surrogateescape")


def _inside(site: str, path: str) -> None:
    real = os.path.realpath(os.path.join(site, path))
    if os.path.commonpath([real, site]) != site:
        raise PatchError(f"{path}: resolves to {real}, outside {site}; refused")


def _compiled(site: str, path: str) -> list[str]:
    """Cached bytecode of a changed module: stale now, and RECORD lists it."""
    folder, name = posixpath.split(path)
    pattern = os.path.join(site, folder, "__pycache__", glob.escape(name[:-3]) + ".*.pyc")
    return sorted(glob.glob(pattern))


def _record_rows(text: str) -> list[tuple[str, list[str]]]:
    rows = []
    for line in split_lines(text):
        try:
            row = next(csv.reader([line.rstrip("\r\n")]), [])
        except csv.Error:
            row = []
        rows.append((line, row))
    return rows


def _rewrite_record(text: str, outputs: dict[str, bytes | None], removed: list[str]) -> str:
    """RECORD with new hashes and sizes for changed files, rows of removed files dropped."""
    end = "\r\n" if "\r\n" in text else "\n"
    updates = {path: [record_hash(data), str(len(data))]
               for path, data in outputs.items() if data is not None}
    dropped = {path for path, data in outputs.items() if data is None} | set(removed)
    lines = []
    for line, row in _record_rows(text):
        key = posixpath.normpath(row[0]) if row else None
        if key in dropped:
            continue
        lines.append(_csv_line([row[0]] + updates.pop(key), end) if key in updates else line)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += end
    return "".join(lines + [_csv_line([path] + row, end) for path, row in updates.items()])


def _csv_line(row: list[str], end: str) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator=end).writerow(row)
    return buffer.getvalue()


def _write_all(site: str, outputs: dict[str, bytes | None], created: dict[str, int],
               removed: list[str]) -> None:
    """Stage every file beside its target, then rename them all; delete last."""
    staged: list[tuple[str, str]] = []
    try:
        for path, data in outputs.items():
            if data is not None:
                target = os.path.join(site, path)
                staged.append((_stage(target, data, created.get(path, 0o644)), target))
    except BaseException:
        for temporary, _ in staged:
            _remove(temporary)
        raise
    for temporary, target in staged:
        os.replace(temporary, target)
    for path in [p for p, data in outputs.items() if data is None] + removed:
        _remove(os.path.join(site, path))


def _stage(target: str, data: bytes, new_mode: int) -> str:
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".imagebuild-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        if os.path.exists(target):  # keep the mode and owner of the file it replaces
            info = os.stat(target)
            os.chmod(temporary, stat.S_IMODE(info.st_mode))
            try:
                os.chown(temporary, info.st_uid, info.st_gid)
            except (PermissionError, AttributeError):
                pass
        else:
            os.chmod(temporary, new_mode)
    except BaseException:
        _remove(temporary)
        raise
    return temporary


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- command line ----------------------------------------------------------------------------

class _Arguments(argparse.ArgumentParser):
    def error(self, message: str):  # exit 1 with our message, as every other failure does
        raise PatchError(f"{message} (see --help)")


def main(argv: list[str] | None = None) -> int:
    parser = _Arguments(prog="apply_patch.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--strip", type=int, default=1, help="leading path components to remove")
    parser.add_argument("--package", required=True, help="the distribution the patch changes")
    parser.add_argument("--sha256", required=True, help="the patch file's sha256, from the lock")
    parser.add_argument("site_packages", help="the site-packages directory holding the package")
    parser.add_argument("patch", help="the unified diff to apply")
    try:
        args = parser.parse_args(argv)
        if not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
            raise PatchError(f"--sha256 {args.sha256!r} is not 64 hex digits")
        for line in apply_patch_file(args.site_packages, args.patch, package=args.package,
                                     sha256=args.sha256, strip=args.strip):
            print(line)
        return 0
    except PatchError as err:
        message = str(err)
    except OSError as err:
        message = f"{err.filename or ''}: {err.strerror or err}"
    except Exception as err:  # noqa: BLE001 -- a message, never a traceback, whatever the input
        message = f"unexpected {type(err).__name__}: {err}"
    print(f"apply_patch: error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
