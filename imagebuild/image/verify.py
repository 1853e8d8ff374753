"""Verify and diff: an image's files, read from its layers as streams, against its lock or another image.

`verify_image` checks an image against the lock it claims to come from: the io.imagebuild.* labels,
every locked distribution's installed version and RECORD hashes, the patches listed in each
<dist-info>/IMAGEBUILD_PATCHES, and the prebuilt kernels its [aot] manifest lists. `diff_images` names the first files that differ between two images.
An image is an engine reference or an OCI layout (`oci:DIR`, or a folder holding an oci-layout file).
Layers are read one tar stream at a time and only a table of the merged files (hashes, not contents)
stays in memory, apart from the few dist-info files verify reads. Verify reads an engine image as the
engine exports a container's filesystem (one stream of the merged tree); diff reads layers, as saved.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import IO, Callable

from packaging.utils import canonicalize_name

from imagebuild.errors import ImageNotFound
from imagebuild.image import export
from imagebuild.image import normalize
from imagebuild.image import oci
from imagebuild.image.layout import layer_stream, read_image
from imagebuild.image import sbom
from imagebuild.lock import Lock, read_lock
from imagebuild.render import LABEL_PREFIX, site_packages

_KINDS = {tarfile.REGTYPE: "file", tarfile.LNKTYPE: "hardlink", tarfile.SYMTYPE: "symlink",
          tarfile.DIRTYPE: "dir", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block",
          tarfile.FIFOTYPE: "fifo"}
_KEEP_LIMIT = 16 << 20
PATCHES_FILE = "IMAGEBUILD_PATCHES"  # written by apply_patch.py inside the image
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True)
class FileEntry:
    """One path of an image's merged filesystem, as a container sees it."""

    kind: str
    mode: int
    uid: int
    gid: int
    mtime: int
    size: int = 0
    sha256: str | None = None  # regular files (and hard links: their target's)
    link: str | None = None  # symlink target, or the path a hard link points to
    xattrs: tuple = ()

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "mode": oct(self.mode), "owner": f"{self.uid}:{self.gid}",
               "mtime": self.mtime}
        if self.kind in ("file", "hardlink"):
            out |= {"size": self.size, "sha256": self.sha256}
        if self.link is not None:
            out["link"] = self.link
        if self.xattrs:
            out["xattrs"] = dict(self.xattrs)
        return out


@dataclass
class LayerFiles:
    entries: dict[str, FileEntry] = field(default_factory=dict)
    whiteouts: list[str] = field(default_factory=list)  # paths removed from the layers below
    opaque: list[str] = field(default_factory=list)  # folders whose lower contents are hidden
    contents: dict[str, bytes] = field(default_factory=dict)


@dataclass
class ImageFiles:
    config: dict
    files: dict[str, FileEntry]
    contents: dict[str, bytes]  # the files `keep` asked for

    @property
    def labels(self) -> dict[str, str]:
        labels = (self.config.get("config") or {}).get("Labels") or {}
        return labels if isinstance(labels, dict) else {}


def read_layer_files(stream: IO[bytes], keep: Callable[[str], bool] = lambda _: False) -> LayerFiles:
    """One layer tar stream -> its entries, whiteouts and the contents of the files `keep` picks."""
    layer = LayerFiles()
    try:
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape") as tar:
            for info in tar:
                path = normalize.clean_path(info.name)
                folder, base = posixpath.split(path)
                if base == OPAQUE:
                    layer.opaque.append(folder)
                    continue
                if base.startswith(WHITEOUT):
                    layer.whiteouts.append(posixpath.join(folder, base[len(WHITEOUT):]))
                    continue
                layer.entries[path] = _entry(tar, info, path, layer, keep)
    except normalize.LayerError:
        raise
    except normalize.TAR_ERRORS as err:
        raise normalize.LayerError(f"not a readable layer tar: {type(err).__name__}: {err}") from None
    return layer


def _entry(tar: tarfile.TarFile, info: tarfile.TarInfo, path: str, layer: LayerFiles,
           keep: Callable[[str], bool]) -> FileEntry:
    kind = _KINDS.get(normalize.ENTRY_TYPES.get(info.type, info.type), "other")
    xattrs = tuple(sorted((k[len("SCHILY.xattr."):], v) for k, v in info.pax_headers.items()
                          if k.startswith("SCHILY.xattr.")))
    common = dict(mode=info.mode & 0o7777, uid=info.uid, gid=info.gid, mtime=int(info.mtime),
                  xattrs=xattrs)
    if kind == "file":
        digest, handle, kept = hashlib.sha256(), tar.extractfile(info), []
        wanted = keep(path) and info.size <= _KEEP_LIMIT
        while block := handle.read(1 << 20):
            digest.update(block)
            if wanted:
                kept.append(block)
        if wanted:
            layer.contents[path] = b"".join(kept)
        return FileEntry("file", size=info.size, sha256=digest.hexdigest(), **common)
    if kind == "hardlink":
        target = normalize.clean_path(info.linkname)
        source = layer.entries.get(target)
        if target in layer.contents:
            layer.contents[path] = layer.contents[target]
        return FileEntry("hardlink", size=source.size if source else 0,
                         sha256=source.sha256 if source else None, link=target, **common)
    if kind == "symlink":
        return FileEntry("symlink", link=info.linkname, **common)
    if kind in ("char", "block"):
        return FileEntry(kind, link=f"{info.devmajor}:{info.devminor}", **common)
    return FileEntry(kind, **common)


def merge_layers(layers: list[LayerFiles]) -> tuple[dict[str, FileEntry], dict[str, bytes]]:
    """Apply layers bottom to top, honouring whiteouts and opaque folders."""
    files: dict[str, FileEntry] = {}
    contents: dict[str, bytes] = {}
    for layer in layers:
        gone = [p for p in layer.whiteouts] + [p for p in layer.opaque]
        if gone:
            exact = set(layer.whiteouts)
            prefixes = tuple(p.rstrip("/") + "/" for p in gone if p != ".") + (("",) if "." in gone else ())
            for table in (files, contents):
                for path in [p for p in table if p in exact or p.startswith(prefixes)]:
                    del table[path]
        files.update(layer.entries)
        contents.update(layer.contents)
    return files, contents


def is_layout(ref: str) -> bool:
    return ref.startswith("oci:") or (Path(ref) / "oci-layout").is_file()


def layout_path(ref: str) -> Path:
    """The folder a layout reference names (`oci:DIR` or DIR)."""
    return Path(ref.removeprefix("oci:"))


def engine_image(engine, ref: str):
    """The engine's inspection of `ref`, or ImageNotFound saying how a layout is named instead."""
    info = engine.inspect(ref)
    if info is None:
        raise ImageNotFound(ref, engine.name, " (an OCI layout is named oci:DIR)")
    return info


def image_files(engine, ref: str, keep: Callable[[str], bool] = lambda _: False) -> ImageFiles:
    """The merged filesystem of an engine image or an OCI layout."""
    if is_layout(ref):
        layout = read_image(layout_path(ref))
        layers = []
        for desc in layout.layers:
            with layer_stream(layout, desc) as stream:
                layers.append(read_layer_files(stream, keep))
        files, contents = merge_layers(layers)
        return ImageFiles(layout.config, files, contents)
    engine_image(engine, ref)
    with export.saved_image(engine, ref) as stream:
        saved = export.read_saved(stream, lambda _, s: read_layer_files(s, keep))
    files, contents = merge_layers(saved.layers)
    return ImageFiles(saved.config, files, contents)


def image_file(engine, ref: str, path: str) -> bytes | None:
    """One regular file (`path`, relative to the root) of an engine image or an OCI layout; None when it holds
    none there. An engine that reads one file (Docker: a created container's archive) sends only that file; for
    the others, and a layout, the image is read layer by layer, the file kept alone."""
    if is_layout(ref):
        return layout_file(layout_path(ref), path)
    if engine.reads_files:
        return engine.read_file(ref, "/" + path)
    return image_files(engine, ref, keep=lambda p: p == path).contents.get(path)


def layout_file(layout_dir: Path, path: str) -> bytes | None:
    """One file of a layout's image, looked for from the top layer down (the top is usually small)."""
    layout = read_image(Path(layout_dir))
    for desc in reversed(layout.layers):
        with layer_stream(layout, desc) as stream:
            layer = read_layer_files(stream, keep=lambda p: p == path)
        if path in layer.contents:
            return layer.contents[path]
        if path in layer.entries or any(path == w or path.startswith(w.rstrip("/") + "/")
                                        for w in layer.whiteouts + layer.opaque):
            return None
    return None


# ---------------------------------------------------------------- verify against a lock

@dataclass(frozen=True)
class Mismatch:
    what: str  # label | package | file | patch
    subject: str
    expected: str
    actual: str

    def to_dict(self) -> dict:
        return vars(self).copy()


@dataclass(frozen=True)
class SharedFile:
    """A path two or more locked distributions install; the image holds the copy of `kept`
    (the one installed last). Not a mismatch: it is what any installer leaves."""

    path: str
    owners: tuple[str, ...]
    kept: str

    def to_dict(self) -> dict:
        return {"path": self.path, "owners": list(self.owners), "kept": self.kept}


@dataclass
class VerifyReport:
    image: str
    lock: str
    checked: dict[str, int]
    mismatches: list[Mismatch]
    shared: list[SharedFile] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict:
        return {"image": self.image, "lock": self.lock, "ok": self.ok, "checked": self.checked,
                "mismatches": [m.to_dict() for m in self.mismatches],
                "shared": [f.to_dict() for f in self.shared]}


def _dist_info_file(site: str) -> Callable[[str], bool]:
    def keep(path: str) -> bool:
        folder, name = posixpath.split(path)
        return (name in ("METADATA", "RECORD", PATCHES_FILE) and folder.endswith(".dist-info")
                and posixpath.dirname(folder) == site) or path == sbom.KERNEL_MANIFEST
    return keep


def _check_kernels(found: ImageFiles, image: str, checked: dict) -> list[Mismatch]:
    """[aot]'s prebuilt kernels sit outside every RECORD: each must still hash as its manifest says."""
    data = found.contents.get(sbom.KERNEL_MANIFEST)
    if data is None:
        return []
    mismatches = []
    for artifact in sbom.parse_kernel_manifest(data, f"{image}:/{sbom.KERNEL_MANIFEST}"):
        checked["kernels"] += 1
        entry = found.files.get(artifact["path"].lstrip("/"))
        actual = "(missing)" if entry is None else entry.sha256 or f"({entry.kind})"
        if actual != artifact["sha256"]:
            mismatches.append(Mismatch("kernel", artifact["path"], artifact["sha256"], actual))
    return mismatches


def record_hash(hexdigest: str) -> str:
    """A sha256 as RECORD writes it: sha256=<urlsafe base64, no padding>."""
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode()


def parse_record(text: str) -> list[tuple[str, str, str]]:
    """RECORD rows (path, hash, size); a row csv cannot read is split on commas instead."""
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:
        rows = [line.split(",") for line in text.splitlines()]
    return [tuple((row + ["", "", ""])[:3]) for row in rows if row and row[0]]


def container_files(engine, ref: str, keep: Callable[[str], bool] = lambda _: False) -> ImageFiles:
    """The filesystem a container of the image sees, read as one stream: for an engine, its own export of
    the merged tree (one pass, where a save first writes every layer out on the engine's disk and the layers
    are merged here); for an OCI layout, its layers merged. Owners, modes and contents as in image_files;
    what the engine adds to every container (/etc/hosts, /.dockerenv, empty /proc) is in it too, so compare
    two images with image_files, not this."""
    if is_layout(ref):
        return image_files(engine, ref, keep)
    info = engine_image(engine, ref)
    with engine.export_rootfs(ref) as stream:
        tree = read_layer_files(stream, keep)
    return ImageFiles({"config": {"Labels": dict(info.labels)}}, tree.entries, tree.contents)


def verify_image(engine, image: str, lock_path: Path) -> VerifyReport:
    lock = read_lock(Path(lock_path))
    site = site_packages(lock).lstrip("/")
    found = container_files(engine, image, keep=_dist_info_file(site))
    return verify_files(found, lock, image=image, lock_path=str(lock_path))


def verify_files(found: ImageFiles, lock: Lock, *, image: str, lock_path: str) -> VerifyReport:
    site = site_packages(lock).lstrip("/")
    mismatches: list[Mismatch] = []
    checked = {"labels": 0, "packages": 0, "files": 0, "patches": 0, "kernels": 0}
    for key, expected in ((f"{LABEL_PREFIX}.lock.sha256", lock.sha256),
                          (f"{LABEL_PREFIX}.recipe.sha256", lock.recipe_sha256)):
        checked["labels"] += 1
        actual = found.labels.get(key, "(missing)")
        if actual != expected:
            mismatches.append(Mismatch("label", key, expected, actual))
    dists = _installed(found)
    for name in sorted(set(dists) - set(lock.packages)):
        mismatches.append(Mismatch("package", name, "(not in the lock)", dists[name][1]))
    patches_by_package: dict[str, list[str]] = {}
    for patch in lock.patches:
        patches_by_package.setdefault(canonicalize_name(patch.package), []).append(patch.sha256)
    records = {name: _record_rows(found, dists[name][0]) for name in lock.packages if name in dists}
    owners = _owners(site, records)
    shared: dict[str, SharedFile] = {}
    for name, version in lock.packages.items():
        checked["packages"] += 1
        if name not in dists:
            mismatches.append(Mismatch("package", name, version, "(not installed)"))
            continue
        info, installed = dists[name]
        if installed != version:
            mismatches.append(Mismatch("package", name, version, installed))
        mismatches += _check_record(found, site, info, name, records[name], checked, owners, shared)
        listed = _listed_patches(found.contents.get(f"{info}/{PATCHES_FILE}"))
        expected = patches_by_package.get(name, [])
        checked["patches"] += len(expected)
        if listed != expected:
            mismatches.append(Mismatch("patch", name, " ".join(expected) or "(no patches)",
                                       " ".join(listed) or "(no patches)"))
    mismatches += _check_kernels(found, image, checked)
    return VerifyReport(image, lock_path, checked, mismatches, sorted(shared.values(), key=lambda f: f.path))


def _installed(found: ImageFiles) -> dict[str, tuple[str, str]]:
    """canonical name -> (dist-info path, version), from each METADATA in site-packages."""
    dists = {}
    for path, data in found.contents.items():
        folder, name = posixpath.split(path)
        if name != "METADATA":
            continue
        headers = HeaderParser().parsestr(data.decode("utf-8", "replace"), headersonly=True)
        if headers.get("Name"):
            dists[canonicalize_name(headers["Name"])] = (folder, str(headers.get("Version", "")))
    return dists


def _record_rows(found: ImageFiles, info: str) -> list[tuple[str, str, str]] | None:
    record = found.contents.get(f"{info}/RECORD")
    return None if record is None else parse_record(record.decode("utf-8", "replace"))


def _owners(site: str, records: dict[str, list | None]) -> dict[str, list[tuple[str, str]]]:
    """Installed path -> [(distribution, RECORD hash)] for every path some RECORD lists with a hash."""
    owners: dict[str, list[tuple[str, str]]] = {}
    for name, rows in records.items():
        for path, digest, _ in rows or ():
            if digest:
                owners.setdefault(posixpath.normpath(posixpath.join(site, path)), []).append((name, digest))
    return owners


def _check_record(found: ImageFiles, site: str, info: str, name: str, rows: list | None, checked: dict,
                  owners: dict[str, list[tuple[str, str]]], shared: dict[str, SharedFile]) -> list[Mismatch]:
    if rows is None:
        return [Mismatch("file", f"/{info}/RECORD", "a RECORD", "(missing)")]
    out = []
    for path, digest, size in rows:
        full = posixpath.normpath(posixpath.join(site, path))
        entry = found.files.get(full)
        if not digest:
            continue  # RECORD itself, IMAGEBUILD_PATCHES: listed without a hash by design
        checked["files"] += 1
        others = [(owner, theirs) for owner, theirs in owners.get(full, ()) if owner != name]
        actual = record_hash(entry.sha256) if entry is not None and entry.sha256 else None
        kept = next((owner for owner, theirs in others if theirs == actual), None)
        if kept is not None and actual != digest:
            shared[full] = SharedFile("/" + full, tuple(sorted({name, *(o for o, _ in others)})), kept)
            continue
        if entry is None:
            out.append(Mismatch("file", "/" + full, digest, f"(missing; {name})"))
        elif entry.sha256 is None:
            out.append(Mismatch("file", "/" + full, digest, f"(a {entry.kind}; {name})"))
        elif digest.startswith("sha256=") and actual != digest:
            out.append(Mismatch("file", "/" + full, digest, f"{actual} ({name})"))
        elif size and size.isdigit() and int(size) != entry.size:
            out.append(Mismatch("file", "/" + full, f"{size} bytes", f"{entry.size} bytes ({name})"))
    return out


def _listed_patches(data: bytes | None) -> list[str]:
    if not data:
        return []
    return [line.split()[0] for line in data.decode("utf-8", "replace").splitlines() if line.split()]


# ---------------------------------------------------------------- diff two images

@dataclass(frozen=True)
class Difference:
    path: str
    fields: tuple[str, ...]  # missing | kind | content | mode | owner | mtime | link | xattrs
    a: FileEntry | None
    b: FileEntry | None

    def to_dict(self) -> dict:
        return {"path": self.path, "differs": list(self.fields),
                "a": self.a.to_dict() if self.a else None, "b": self.b.to_dict() if self.b else None}


@dataclass
class DiffReport:
    a: str
    b: str
    total: int
    differences: list[Difference]
    config: list[str]  # config keys that differ
    normalized: bool

    @property
    def same(self) -> bool:
        return self.total == 0 and not self.config

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "same": self.same, "normalized": self.normalized,
                "total": self.total, "config": self.config,
                "differences": [d.to_dict() for d in self.differences]}


def compare_entries(a: FileEntry | None, b: FileEntry | None, epoch: int | None) -> tuple[str, ...]:
    if a is None or b is None:
        return ("missing",)
    fields = []
    if a.kind != b.kind:
        fields.append("kind")
    if (a.sha256, a.size) != (b.sha256, b.size):
        fields.append("content")
    if a.mode != b.mode:
        fields.append("mode")
    if (a.uid, a.gid) != (b.uid, b.gid):
        fields.append("owner")
    clamp = (lambda t: min(t, epoch)) if epoch is not None else (lambda t: t)
    if clamp(a.mtime) != clamp(b.mtime):
        fields.append("mtime")
    if a.link != b.link:
        fields.append("link")
    if a.xattrs != b.xattrs:
        fields.append("xattrs")
    return tuple(fields)


def diff_files(a: ImageFiles, b: ImageFiles, *, epoch: int | None = oci.REPRO_EPOCH,
               limit: int = 20, names: tuple[str, str] = ("A", "B")) -> DiffReport:
    """Files that differ, in path order (mtimes clamped to epoch unless epoch is None)."""
    differences, total = [], 0
    for path in sorted(set(a.files) | set(b.files), key=normalize.path_sort_key):
        fields = compare_entries(a.files.get(path), b.files.get(path), epoch)
        if fields:
            total += 1
            if len(differences) < limit:
                differences.append(Difference("/" + path if path != "." else "/", fields,
                                              a.files.get(path), b.files.get(path)))
    config_a = export.normalized_config(a.config, [], 0)["config"]
    config_b = export.normalized_config(b.config, [], 0)["config"]
    config = sorted(k for k in set(config_a) | set(config_b) if config_a.get(k) != config_b.get(k))
    return DiffReport(names[0], names[1], total, differences, config, epoch is not None)


def diff_images(engine, a: str, b: str, *, epoch: int | None = oci.REPRO_EPOCH,
                limit: int = 20) -> DiffReport:
    return diff_files(image_files(engine, a), image_files(engine, b), epoch=epoch, limit=limit,
                      names=(a, b))
