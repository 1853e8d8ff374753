"""Debian's archive formats read as plain values: Release and InRelease, Packages, dpkg's status, versions.

    parse_release      a Release or clearsigned InRelease -> Release (suite, date, the SHA256 index list)
    release_timestamp  its Date -> the UTC timestamp that names an archive snapshot
    parse_packages     a Packages index -> one PackageEntry per stanza (version, pool path, sha256, size)
    parse_dpkg_status  a rootfs's var/lib/dpkg/status -> what is installed
    compare_versions   dpkg's version order (lib/dpkg/version.c); valid_version its syntax (parsehelp.c)

Pure logic: no network, no files. An InRelease is unwrapped here; its signature is checked elsewhere.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NamedTuple, NoReturn

from imagebuild.errors import LockError

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian Policy 5.6.1
_ARCH = re.compile(r"[a-z0-9][a-z0-9-]*")
_PACKAGE_FIELDS = ("Package", "Version", "Architecture", "Filename", "SHA256", "Size")
_INDEX_SUFFIXES = (".xz", ".gz", "")  # the smallest download first
_REFETCH = "fetch it again and check its sha256 against the Release file"


@dataclass(frozen=True)
class IndexFile:
    """One line of a Release file's SHA256 section."""

    path: str  # relative to the suite's directory, e.g. "main/binary-amd64/Packages.xz"
    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    suite: str  # "stable-security", "bookworm"; "" when only Codename is given
    codename: str  # "" when absent
    date: str  # exactly as written: "Sat, 08 Nov 2026 10:13:40 UTC"
    components: tuple[str, ...]
    architectures: tuple[str, ...]
    files: dict[str, IndexFile]  # the SHA256 section, by path

    def index(self, component: str, arch: str) -> IndexFile | None:
        """The Packages index for component/arch: Packages.xz, else Packages.gz, else Packages."""
        # The security archive lists "updates/main" as a component but serves main/.
        for name in dict.fromkeys((component, component.rpartition("/")[2])):
            for suffix in _INDEX_SUFFIXES:
                found = self.files.get(f"{name}/binary-{arch}/Packages{suffix}")
                if found is not None:
                    return found
        return None


@dataclass(frozen=True)
class PackageEntry:
    name: str
    version: str
    arch: str
    filename: str  # pool path, e.g. "pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb"
    sha256: str
    size: int
    essential: bool = False
    priority: str = ""


# --- deb822 paragraphs ---------------------------------------------------------------------------------------

class _Paragraph(NamedTuple):
    line: int  # the line of its first field, counted from 1
    fields: dict[str, str]  # name as written -> value; a repeated name keeps the last value
    starts: dict[str, int]  # name -> the line it starts on
    repeated: list[str]  # names given more than once (compared case-insensitively, as deb822 does)


def _paragraphs(lines: list[str], first_line: int = 1) -> Iterator[_Paragraph]:
    """deb822 paragraphs of `lines`, the first of which is line `first_line` of its file."""
    paragraph = _Paragraph(0, {}, {}, [])
    seen: set[str] = set()
    name = None  # the field that continuation lines extend
    more: list[str] | None = None  # its lines so far, once it has continuation lines
    for number, line in enumerate(lines, first_line):
        if not line or line.isspace():
            if more is not None:
                paragraph.fields[name] = "\n".join(more)
            if paragraph.fields:
                yield paragraph
            paragraph, seen, name, more = _Paragraph(0, {}, {}, []), set(), None, None
            continue
        head = line[0]
        if head == " " or head == "\t":
            if name is not None:
                text = line[1:].rstrip()
                if more is None:
                    more = [paragraph.fields[name]]
                more.append("" if text == "." else text)
            continue
        if head == "#":
            continue
        if more is not None:
            paragraph.fields[name] = "\n".join(more)
            more = None
        colon = line.find(":")
        if colon <= 0:
            name = None
            continue
        name = line[:colon]
        key = name.lower()
        if key in seen:
            paragraph.repeated.append(name)
        elif not seen:
            paragraph = paragraph._replace(line=number)
        seen.add(key)
        paragraph.fields[name] = line[colon + 1:].strip()
        paragraph.starts[name] = number
    if more is not None:
        paragraph.fields[name] = "\n".join(more)
    if paragraph.fields:
        yield paragraph


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """The deb822 paragraphs of `text`: field name as written -> value, continuation lines joined by newlines.

    Never raises: lines that are neither fields, continuations nor comments are skipped.
    """
    return [paragraph.fields for paragraph in _paragraphs(text.split("\n"))]


# --- Release and InRelease -----------------------------------------------------------------------------------

_BEGIN_SIGNED = "-----BEGIN PGP SIGNED MESSAGE-----"
_BEGIN_SIGNATURE = "-----BEGIN PGP SIGNATURE-----"
_END_SIGNATURE = "-----END PGP SIGNATURE-----"


def _signed_body(lines: list[str], source: str) -> tuple[list[str], int]:
    """The lines a clearsigned file signs, dash-unescaped, and the line number of the first; a plain file whole."""
    def refuse(number: int, problem: str) -> NoReturn:
        raise LockError(f"{source}: line {number}: {problem}: this is not a well-formed InRelease; "
                        "fetch it again, and do not use text that sits outside its signature")

    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if start == len(lines) or lines[start].rstrip() != _BEGIN_SIGNED:
        for number, line in enumerate(lines, 1):
            if line.startswith("-----BEGIN PGP"):
                refuse(number, f"{line.rstrip()!r} after unsigned text")
        return lines, 1
    header_end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), None)
    if header_end is None:
        refuse(start + 1, "the signed message's header (the Hash: lines) never ends")
    body: list[str] = []
    for i in range(header_end + 1, len(lines)):
        line = lines[i]
        if line.startswith("- "):
            body.append(line[2:])
        elif not line.startswith("-"):
            body.append(line)
        elif line.rstrip() == _BEGIN_SIGNATURE:
            break
        else:
            refuse(i + 1, f"{line.rstrip()!r} is neither dash-escaped nor the signature")
    else:
        refuse(len(lines), "the signed message has no signature block")
    end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == _END_SIGNATURE), None)
    if end is None:
        refuse(i + 1, "the signature block never ends")
    trailing = next((j for j in range(end + 1, len(lines)) if lines[j].strip()), None)
    if trailing is not None:
        refuse(trailing + 1, "text after the signature")
    return body, header_end + 2


def _safe_path(path: str) -> bool:
    """A relative path with no '..' part and no whitespace: safe to join to a mirror URL or a directory."""
    return (bool(path) and not path.startswith("/") and ".." not in path.split("/")
            and not any(c.isspace() for c in path))


def _index_files(paragraph: _Paragraph, body: list[str], first_line: int, source: str) -> dict[str, IndexFile]:
    field_line = paragraph.starts["SHA256"]
    numbers = [field_line]  # the line each row of the field's value sits on
    for i in range(field_line - first_line + 1, len(body)):
        if body[i][:1] not in (" ", "\t", "#") or body[i].isspace():
            break
        if not body[i].startswith("#"):
            numbers.append(i + first_line)
    files: dict[str, IndexFile] = {}
    for number, row in zip(numbers, paragraph.fields["SHA256"].split("\n")):
        if number == field_line and not row:
            continue  # "SHA256:" alone on its line, as always
        parts = row.split()
        if (len(parts) != 3 or not _SHA256.fullmatch(parts[0]) or not (parts[1].isascii() and parts[1].isdigit())
                or not _safe_path(parts[2])):
            raise LockError(f"{source}: line {number}: [SHA256] {row!r} is not '<64 lowercase hex> <size> "
                            "<relative path>': fetch the Release file again")
        if parts[2] in files:
            raise LockError(f"{source}: line {number}: [SHA256] {parts[2]!r} is listed twice: "
                            "fetch the Release file again")
        files[parts[2]] = IndexFile(path=parts[2], sha256=parts[0], size=int(parts[1]))
    return files


def parse_release(text: str, source: str) -> Release:
    """A Release file, or an InRelease whose clearsigned wrapper is removed (not verified)."""
    body, first_line = _signed_body(text.split("\n"), source)
    paragraphs = list(_paragraphs(body, first_line))
    if not paragraphs:
        raise LockError(f"{source}: no fields: this is not a Debian Release file; check the suite's URL")
    if len(paragraphs) > 1:
        raise LockError(f"{source}: line {paragraphs[1].line}: a second paragraph; a Release file holds one: "
                        "check that this is a Release file")
    paragraph = paragraphs[0]
    fields = paragraph.fields
    if paragraph.repeated:
        raise LockError(f"{source}: line {paragraph.starts[paragraph.repeated[0]]}: [{paragraph.repeated[0]}] is "
                        "given twice, so readers may disagree on it: fetch the Release file again")
    if not fields.get("Date"):
        raise LockError(f"{source}: [Date] missing: without it the release cannot be pinned to a snapshot; "
                        "check that this is a Debian Release file")
    try:
        release_timestamp(fields["Date"])
    except LockError as err:
        raise LockError(f"{source}: line {paragraph.starts['Date']}: [Date] {err}") from None
    if not fields.get("Suite") and not fields.get("Codename"):
        raise LockError(f"{source}: neither [Suite] nor [Codename]: check that this is a Debian Release file")
    if "SHA256" not in fields:
        raise LockError(f"{source}: no [SHA256] section, and no weaker sum will do to pin the indices: "
                        "use a mirror that publishes SHA256 sums")
    return Release(suite=fields.get("Suite", ""), codename=fields.get("Codename", ""), date=fields["Date"],
                   components=tuple(fields.get("Components", "").split()),
                   architectures=tuple(fields.get("Architectures", "").split()),
                   files=_index_files(paragraph, body, first_line, source))


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DATE = re.compile(r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), +)?([0-9]{1,2}) +(" + "|".join(_MONTHS)
                   + r") +([0-9]{4}) +([0-9]{2}):([0-9]{2}):([0-9]{2}) +(UTC|GMT|Z|[+-][0-9]{4})")


def release_timestamp(date: str) -> str:
    """A Release's Date ("Sat, 08 Nov 2026 10:13:40 UTC", or with "+0000") as UTC "20261108T101340Z"."""
    found = _DATE.fullmatch(date.strip())
    try:
        if found is None:
            raise ValueError
        day, month, year, hour, minute, second, zone = found.groups()
        offset = timedelta(0)
        if zone[0] in "+-":
            if int(zone[3:]) >= 60:
                raise ValueError
            offset = (1 if zone[0] == "+" else -1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[3:]))
        when = datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hour), int(minute), int(second),
                        tzinfo=timezone(offset)).astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise LockError(f"date {date!r} is not a Release date like 'Sat, 08 Nov 2026 10:13:40 UTC': "
                        "fetch the Release file again") from None
    return (f"{when.year:04d}{when.month:02d}{when.day:02d}"
            f"T{when.hour:02d}{when.minute:02d}{when.second:02d}Z")


# --- Packages and dpkg's status ------------------------------------------------------------------------------

def _refuse_stanza(source: str, paragraph: _Paragraph, field: str, problem: str) -> NoReturn:
    name = paragraph.fields.get("Package")
    who = f"package {name!r}" if name else "a stanza without a Package name"
    raise LockError(f"{source}: line {paragraph.starts.get(field, paragraph.line)}: {who}: [{field}] {problem}: "
                    f"the index is damaged or not a Packages file; {_REFETCH}")


def parse_packages(text: str, source: str) -> list[PackageEntry]:
    """Every stanza of a Packages index, each checked: a name, a version, a safe pool path, a sha256 and a size."""
    entries = []
    for paragraph in _paragraphs(text.split("\n")):
        fields = paragraph.fields
        for field in _PACKAGE_FIELDS:
            if not fields.get(field):
                _refuse_stanza(source, paragraph, field, "missing" if field not in fields else "empty")
        if paragraph.repeated:
            _refuse_stanza(source, paragraph, paragraph.repeated[0], "given twice, so readers may disagree on it")
        name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
        filename, sha256, size = fields["Filename"], fields["SHA256"], fields["Size"]
        if not _PACKAGE_NAME.fullmatch(name):
            _refuse_stanza(source, paragraph, "Package", f"{name!r} is not a Debian package name")
        if not valid_version(version):
            _refuse_stanza(source, paragraph, "Version", f"{version!r} is not a valid dpkg version")
        if not _ARCH.fullmatch(arch):
            _refuse_stanza(source, paragraph, "Architecture", f"{arch!r} is not a Debian architecture name")
        if not _safe_path(filename):
            _refuse_stanza(source, paragraph, "Filename", f"{filename!r} is not a relative pool path without '..'")
        if not _SHA256.fullmatch(sha256):
            _refuse_stanza(source, paragraph, "SHA256", f"{sha256!r} is not 64 lowercase hex digits")
        if not (size.isascii() and size.isdigit()):
            _refuse_stanza(source, paragraph, "Size", f"{size!r} is not a whole number of bytes")
        entries.append(PackageEntry(name=name, version=version, arch=arch, filename=filename, sha256=sha256,
                                    size=int(size), essential=fields.get("Essential") == "yes",
                                    priority=fields.get("Priority", "")))
    return entries


def parse_dpkg_status(text: str, source: str = "var/lib/dpkg/status") -> dict[str, tuple[str, str]]:
    """Installed packages: name -> (version, architecture), sorted by name.

    A name installed for several architectures (Multi-Arch: same) is keyed "name:arch", dpkg's own spelling.
    """
    installed = []
    for paragraph in _paragraphs(text.split("\n")):
        fields = paragraph.fields
        if not fields.get("Status", "").endswith(" installed"):
            continue
        for field in ("Package", "Version", "Architecture"):
            if not fields.get(field):
                raise LockError(f"{source}: line {paragraph.line}: an installed package without [{field}]: "
                                "the dpkg database is damaged; rebuild the base")
        installed.append((fields["Package"], fields["Version"], fields["Architecture"]))
    arches: dict[str, set[str]] = {}
    for name, _, arch in installed:
        arches.setdefault(name, set()).add(arch)
    keyed = {(name if len(arches[name]) == 1 else f"{name}:{arch}"): (version, arch)
             for name, version, arch in installed}
    return dict(sorted(keyed.items()))


# --- versions ------------------------------------------------------------------------------------------------

_LETTERS = frozenset(string.ascii_letters)
_DIGITS = frozenset(string.digits)
_UPSTREAM_CHARS = _LETTERS | _DIGITS | frozenset(".-+~:")
_REVISION_CHARS = _LETTERS | _DIGITS | frozenset(".+~")
_EPOCH = re.compile(r"[\n\v\f\r]*[+-]?[0-9]+")  # what C's strtol reads once the version is trimmed of blanks
_EPOCH_MAX = 2**31 - 1  # INT_MAX


class _Version(NamedTuple):
    epoch: int
    upstream: str
    revision: str
    error: str  # why dpkg refuses it outright; "" if it does not
    warning: str  # why dpkg calls it bad syntax yet still compares it; "" if it does not


def _parse_version(version: str) -> _Version:
    """`version` split as dpkg's parseversion splits it, with its verdict."""
    def refused(error: str) -> _Version:
        return _Version(0, "", "", error, "")

    text = version.strip(" \t")
    if not text:
        return refused("the version is empty")
    if " " in text or "\t" in text:
        return refused("the version has embedded spaces")
    epoch = 0
    epoch_text, colon, rest = text.partition(":")
    if colon:
        if not _EPOCH.fullmatch(epoch_text):
            return refused("the epoch (before the first ':') is not a number")
        epoch = int(epoch_text)
        if epoch < 0:
            return refused("the epoch is negative")
        if epoch > _EPOCH_MAX:
            return refused("the epoch is too big")
        if not rest:
            return refused("nothing after the ':'")
        text = rest
    upstream, hyphen, revision = text.rpartition("-")
    if not hyphen:
        upstream, revision = text, ""
    elif not revision:
        return refused("the revision (after the last '-') is empty")
    if not upstream:
        return refused("the upstream version is empty")
    warning = ""
    if upstream[0] not in _DIGITS:
        warning = "the upstream version does not start with a digit"
    elif not _UPSTREAM_CHARS.issuperset(upstream):
        warning = "the upstream version has a character outside [A-Za-z0-9.+~:-]"
    elif not _REVISION_CHARS.issuperset(revision):
        warning = "the revision has a character outside [A-Za-z0-9.+~]"
    return _Version(epoch, upstream, revision, "", warning)


def valid_version(v: str) -> bool:
    """Whether dpkg takes `v` without complaint, written plainly: digits-only epoch, no surrounding blanks."""
    if v != v.strip() or (":" in v and not v.partition(":")[0].isdigit()):
        return False
    parsed = _parse_version(v)
    return not parsed.error and not parsed.warning


def _order(c: str) -> int:
    """A character's weight in dpkg's comparison; "" is the end of the string."""
    if not c or c in _DIGITS:
        return 0
    if c in _LETTERS:
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256  # dpkg compares bytes; beyond ASCII (never valid) this orders by code point


def _verrevcmp(a: str, b: str) -> int:
    """lib/dpkg/version.c verrevcmp: alternating non-digit runs (by _order) and digit runs (by value)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and a[i] not in _DIGITS) or (j < len(b) and b[j] not in _DIGITS):
            ac, bc = _order(a[i:i + 1]), _order(b[j:j + 1])
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while i < len(a) and j < len(b) and a[i] in _DIGITS and b[j] in _DIGITS:
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i] in _DIGITS:
            return 1
        if j < len(b) and b[j] in _DIGITS:
            return -1
        if first_diff:
            return first_diff
    return 0


def compare_versions(a: str, b: str) -> int:
    """dpkg's order of two versions: -1, 0 or 1. LockError for a version dpkg refuses to compare."""
    parsed = []
    for version in (a, b):
        found = _parse_version(version)
        if found.error:
            raise LockError(f"version {version!r} cannot be compared: {found.error}; "
                            "a Debian version reads [epoch:]upstream[-revision]")
        parsed.append(found)
    left, right = parsed
    if left.epoch != right.epoch:
        return 1 if left.epoch > right.epoch else -1
    result = _verrevcmp(left.upstream, right.upstream) or _verrevcmp(left.revision, right.revision)
    return (result > 0) - (result < 0)
