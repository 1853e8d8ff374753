"""Reading an OCI image layout back: the one reader of every layout imagebuild is handed or wrote
itself, whoever reads it (verify and diff, the SBOM, the index layout, push).

    read_layout(path, ref_name)  the image a layout holds, as a tree of Manifests: an image manifest,
                                 or an image index with each platform's manifest under it; each one
                                 carries the artifacts (SBOMs) beside it in index.json whose subject it is
    read_image(path, ref_name)   the same for one image manifest, with its config read and checked

The image is the index.json entry with that ref name (org.opencontainers.image.ref.name), or without a
name the one entry that is no artifact. Every manifest is read from its blob, checked against its
descriptor's size and digest; every config and layer blob must be in the layout at its size (layers
are not hashed here: gigabytes, and a registry hashes what it receives). OCI and Docker media types are
both read. A layout is outside input: anything off is one LayoutError naming the file and what is wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from imagebuild.image.compression import GZIP, ZSTD, decompressed
from imagebuild.image.oci import (INDEX_TYPES, MANIFEST_TYPES, MEDIA_MANIFEST, REF_NAME, Descriptor, LayoutError,
                                  Platform, blob_path, is_digest, load_json, parse_image_index, parse_index,
                                  parse_manifest, read_blob)

MAX_DEPTH = 4  # an image index inside an image index inside ...: deeper than this is no image


@dataclass(frozen=True)
class Blob:
    """A config or layer blob a manifest names, in the layout at the size its descriptor says."""
    digest: str
    size: int
    path: Path


@dataclass
class Manifest:
    """An image manifest or an image index, read from its blob; `data` is its exact bytes (a push sends
    them as they are, so the pushed digest is the layout's)."""
    descriptor: Descriptor  # as index.json, or the index holding it, names it
    data: bytes
    config: Descriptor | None = None  # an image manifest's
    layers: tuple[Descriptor, ...] = ()
    subject: Descriptor | None = None  # an artifact's: the manifest it is about
    blobs: tuple[Blob, ...] = ()  # config, then layers; a foreign layer (with urls) lives elsewhere
    children: tuple[Manifest, ...] = ()  # an image index's manifests
    platform: Platform | None = None  # an index entry's, as the index names it
    referrers: list[Manifest] = field(default_factory=list)  # artifacts whose subject this is

    @property
    def digest(self) -> str:
        return self.descriptor.digest

    @property
    def media_type(self) -> str:
        return self.descriptor.media_type

    @property
    def artifact_type(self) -> str | None:
        return self.descriptor.artifact_type

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    def walk(self) -> Iterator[Manifest]:
        """Children before parents: the order they must reach a registry in."""
        for child in self.children:
            yield from child.walk()
        yield self

    def push_order(self) -> Iterator[Manifest]:
        """walk(), each manifest preceded by the artifacts that name it as their subject."""
        for child in self.children:
            yield from child.push_order()
        for referrer in self.referrers:
            yield from referrer.walk()
        yield self


@dataclass(frozen=True)
class LayoutContents:
    path: Path
    entries: tuple[Descriptor, ...]  # index.json's
    image: Manifest  # the entry chosen, read


def read_layout(path: str | Path, ref_name: str | None = None) -> LayoutContents:
    """The image in an OCI layout (ref_name picks one by org.opencontainers.image.ref.name), with its
    artifacts. Another entry of index.json that cannot be read is not this image's: it is left out."""
    path = Path(path)
    marker = load_json(_read(path, "oci-layout"), f"{path}/oci-layout")
    if not isinstance(marker, dict) or not isinstance(marker.get("imageLayoutVersion"), str):
        raise LayoutError(f"{path}/oci-layout: expected {{\"imageLayoutVersion\": ...}}")
    where = f"{path}/index.json"
    entries = parse_index(_read(path, "index.json"), where)
    # artifacts (SBOMs) are never candidates: they travel with the image they name
    chosen = [i for i, d in enumerate(entries) if not d.artifact_type
              and (ref_name is None or d.annotations.get(REF_NAME) == ref_name)]
    if len(chosen) != 1:
        names = ", ".join(repr(d.annotations.get(REF_NAME)) for d in entries if not d.artifact_type) or "none"
        wanted = f" named {ref_name!r}" if ref_name is not None else ""
        raise LayoutError(f"{where}: expected one image{wanted}, found {len(chosen)} (names: {names}); "
                          f"pick one by its ref name (push: --layout-name)")
    image = _load(path, entries[chosen[0]], f"{where}.manifests[{chosen[0]}]")
    subjects = {m.digest: m for m in image.walk()}
    for i, entry in enumerate(entries):
        if i == chosen[0] or entry.media_type != MEDIA_MANIFEST:
            continue
        try:
            other = _load(path, entry, f"{where}.manifests[{i}]")
        except LayoutError:
            continue  # another image's damage is not this one's
        if other.subject is not None and other.subject.digest in subjects:
            subjects[other.subject.digest].referrers.append(other)
    return LayoutContents(path, entries, image)


def _read(layout: Path, name: str) -> bytes:
    try:
        return (layout / name).read_bytes()
    except OSError:
        raise LayoutError(f"{layout}/{name} is missing: {layout} is not an OCI image layout") from None


def _load(layout: Path, desc: Descriptor, where: str, platform: Platform | None = None, depth: int = 0) -> Manifest:
    """The manifest `desc` names (`where` says who names it), its blobs found, an index's children read."""
    data = read_blob(layout, desc, where=where)
    blob = str(blob_path(layout, desc.digest))
    if desc.media_type in INDEX_TYPES:
        if depth >= MAX_DEPTH:
            raise LayoutError(f"{where}: image indexes nested more than {MAX_DEPTH} deep")
        entries = parse_image_index(data, blob, desc.media_type)
        children = tuple(_load(layout, child, f"{blob}.manifests[{i}]", child_platform, depth + 1)
                         for i, (child, child_platform) in enumerate(entries))
        return Manifest(desc, data, children=children, platform=platform)
    if desc.media_type in MANIFEST_TYPES:
        config, layers, subject = parse_manifest(data, blob, desc.media_type)
        named = [(config, f"{blob}.config")] + [(d, f"{blob}.layers[{i}]") for i, d in enumerate(layers)]
        blobs = tuple(_present(layout, d, at) for d, at in named if not d.urls)
        return Manifest(desc, data, config, layers, subject, blobs, platform=platform)
    raise LayoutError(f"{where}: media type {desc.media_type!r:.100} is neither an image manifest nor an "
                      f"image index")


def _present(layout: Path, desc: Descriptor, where: str) -> Blob:
    path = blob_path(layout, desc.digest)
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        raise LayoutError(f"{where}: blob {desc.digest} is missing from the layout ({path})")
    if size != desc.size:
        raise LayoutError(f"{where}: blob {desc.digest} is {size} bytes, its descriptor says {desc.size}")
    return Blob(desc.digest, desc.size, path)


# ---------------------------------------------------------------- one image

@dataclass(frozen=True)
class ImageLayout:
    """One image manifest of a layout and its config: what verify, diff and the SBOM read."""
    path: Path
    manifests: tuple[Descriptor, ...]  # index.json's entries
    image: Manifest
    config: dict

    @property
    def manifest(self) -> Descriptor:
        return self.image.descriptor

    @property
    def manifest_digest(self) -> str:
        return self.image.digest

    @property
    def layers(self) -> tuple[Descriptor, ...]:
        return self.image.layers

    @property
    def referrers(self) -> tuple[Manifest, ...]:
        return tuple(self.image.referrers)

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(self.config["rootfs"]["diff_ids"])

    def blob(self, digest: str) -> Path:
        return blob_path(self.path, digest)


def read_image(path: str | Path, ref_name: str | None = None) -> ImageLayout:
    """read_layout for one image manifest: its config checked (one diff_id per layer), every layer here."""
    contents = read_layout(path, ref_name)
    image, where = contents.image, str(blob_path(contents.path, contents.image.digest))
    if image.is_index:
        raise LayoutError(f"{contents.path}/index.json: {image.digest} is an image index, not one image's "
                          f"manifest (read it with imagebuild.image.index)")
    if len(image.blobs) != 1 + len(image.layers):
        raise LayoutError(f"{where}: a layer or the config lives elsewhere (urls): the layout must hold them all")
    config = load_json(read_blob(contents.path, image.config, where=f"{where}.config"), f"{where}.config")
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if (not isinstance(diff_ids, list) or len(diff_ids) != len(image.layers)
            or not all(is_digest(d) and d.startswith("sha256:") for d in diff_ids)):
        raise LayoutError(f"{blob_path(contents.path, image.config.digest)}: rootfs.diff_ids must list one "
                          f"sha256 per layer")
    return ImageLayout(contents.path, contents.entries, image, config)


@contextlib.contextmanager
def layer_stream(layout: ImageLayout, desc: Descriptor) -> Iterator[IO[bytes]]:
    """A layer blob of a layout as an uncompressed tar stream."""
    with open(layout.blob(desc.digest), "rb") as handle:
        if desc.media_type.endswith(("+gzip", ".tar.gzip")):  # OCI's and Docker's names for it
            with decompressed(handle, GZIP, str(layout.blob(desc.digest))) as plain:
                yield plain
        elif desc.media_type.endswith("+zstd"):
            with decompressed(handle, ZSTD, str(layout.blob(desc.digest))) as plain:
                yield plain
        else:
            yield handle
