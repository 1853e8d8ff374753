"""The OCI image layout: media types, descriptors, index and manifest, blobs written and read back.

Writing a layout from an engine image is export.py; this module is the format both sides share
(export, verify, diff, SBOM, push, the LXC OCI archive). Everything is validated as it is read: a
layout from elsewhere is outside input, so anything off is one LayoutError naming the file.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Iterator

from imagebuild.common import REPRO_EPOCH, write_atomic
from imagebuild.errors import ImagebuildError

# The lock's epoch: the one the Debian bases are bootstrapped with, the same for every lock, so a
# layer shared by two recipes (same base, same wheels) keeps one digest in a registry.
LAYOUT_VERSION = "1.0.0"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
# The config keys that decide how a container runs; the rest of Docker's config is build noise.
CONFIG_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels",
               "StopSignal")
_CHUNK = 1 << 20
JSON_LIMIT = 16 << 20  # JSON files (index, manifest, config) are read into memory up to this size


class LayoutError(ImagebuildError):
    """An OCI layout or saved image whose JSON or blobs are missing or malformed."""


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # sha256:<hex>
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    artifact_type: str | None = None

    def to_dict(self) -> dict:
        out = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out


# ---------------------------------------------------------------- config and layout

def canonical_json(data) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def write_blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(data)
    return "sha256:" + digest


def image_manifest(config: Descriptor, layers: list[Descriptor]) -> dict:
    return {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "config": config.to_dict(),
            "layers": [d.to_dict() for d in layers]}


def write_index(layout: Path, manifests: list[Descriptor]) -> None:
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
             "manifests": [d.to_dict() for d in manifests]}
    write_atomic(Path(layout) / "index.json", canonical_json(index))
    write_atomic(Path(layout) / "oci-layout", canonical_json({"imageLayoutVersion": LAYOUT_VERSION}))


# ---------------------------------------------------------------- reading a layout

@dataclass(frozen=True)
class Layout:
    path: Path
    manifests: tuple[Descriptor, ...]  # index.json's entries
    manifest: Descriptor  # the image manifest chosen
    config: dict
    layers: tuple[Descriptor, ...]
    referrers: tuple[Descriptor, ...]  # entries whose manifest names the image as its subject

    @property
    def manifest_digest(self) -> str:
        return self.manifest.digest

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(self.config["rootfs"]["diff_ids"])

    def blob(self, digest: str) -> Path:
        return blob_path(self.path, digest)


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return Path(layout) / "blobs" / algorithm / hexdigest


def _is_digest(value) -> bool:
    return (isinstance(value, str) and value.startswith("sha256:") and len(value) == 71
            and all(c in "0123456789abcdef" for c in value[7:]))


def parse_descriptor(value, where: str) -> Descriptor:
    if not isinstance(value, dict):
        raise LayoutError(f"{where}: expected a descriptor object")
    media, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(media, str) or not media:
        raise LayoutError(f"{where}.mediaType: expected a media type")
    if not _is_digest(digest):
        raise LayoutError(f"{where}.digest: expected sha256:<64 lowercase hex>, got {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise LayoutError(f"{where}.size: expected a whole number ≥ 0")
    annotations = value.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise LayoutError(f"{where}.annotations: expected string -> string")
    artifact = value.get("artifactType")
    return Descriptor(media, digest, size, dict(annotations), artifact if isinstance(artifact, str) else None)


def parse_index(data: bytes, where: str = "index.json") -> tuple[Descriptor, ...]:
    index = load_json(data, where)
    if not isinstance(index, dict) or index.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected an object with schemaVersion 2")
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise LayoutError(f"{where}.manifests: expected a list")
    return tuple(parse_descriptor(m, f"{where}.manifests[{i}]") for i, m in enumerate(manifests))


def parse_manifest(data: bytes, where: str) -> tuple[Descriptor, tuple[Descriptor, ...], Descriptor | None]:
    """An image manifest -> (config, layers, subject)."""
    manifest = load_json(data, where)
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected a manifest object with schemaVersion 2")
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise LayoutError(f"{where}.layers: expected a list")
    subject = manifest.get("subject")
    return (parse_descriptor(manifest.get("config"), f"{where}.config"),
            tuple(parse_descriptor(d, f"{where}.layers[{i}]") for i, d in enumerate(layers)),
            parse_descriptor(subject, f"{where}.subject") if subject is not None else None)


def read_blob(layout: Path, desc: Descriptor, limit: int = JSON_LIMIT) -> bytes:
    """A small blob, checked against its descriptor's size and digest."""
    if desc.size > limit:
        raise LayoutError(f"{desc.digest}: {desc.size} bytes is too large to read as JSON")
    path = blob_path(layout, desc.digest)
    try:
        data = path.read_bytes()
    except OSError:
        raise LayoutError(f"{layout}: blob {desc.digest} is missing") from None
    if len(data) != desc.size or "sha256:" + hashlib.sha256(data).hexdigest() != desc.digest:
        raise LayoutError(f"{layout}: blob {desc.digest} does not match its digest or size")
    return data


def read_layout(layout: Path, ref_name: str | None = None) -> Layout:
    """Read and check an OCI layout's index, image manifest and config (layer blobs: present, sized)."""
    layout = Path(layout)
    marker = load_json(_read(layout / "oci-layout"), f"{layout}/oci-layout")
    if not isinstance(marker, dict) or not isinstance(marker.get("imageLayoutVersion"), str):
        raise LayoutError(f"{layout}/oci-layout: expected {{\"imageLayoutVersion\": ...}}")
    manifests = parse_index(_read(layout / "index.json"), f"{layout}/index.json")
    images = [d for d in manifests if d.media_type == MEDIA_MANIFEST and not d.artifact_type
              and (ref_name is None or d.annotations.get(REF_NAME) == ref_name)]
    if len(images) != 1:
        wanted = f" named {ref_name!r}" if ref_name else ""
        raise LayoutError(f"{layout}/index.json: expected one image manifest{wanted}, found {len(images)}")
    chosen = images[0]
    config_desc, layers, _ = parse_manifest(read_blob(layout, chosen), chosen.digest)
    config = load_json(read_blob(layout, config_desc), config_desc.digest)
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if (not isinstance(diff_ids, list) or len(diff_ids) != len(layers)
            or not all(_is_digest(d) for d in diff_ids)):
        raise LayoutError(f"{config_desc.digest}: rootfs.diff_ids must list one sha256 per layer")
    for layer in layers:
        path = blob_path(layout, layer.digest)
        if not path.is_file() or path.stat().st_size != layer.size:
            raise LayoutError(f"{layout}: layer blob {layer.digest} is missing or has the wrong size")
    referrers = []
    for desc in manifests:
        if desc is chosen or desc.media_type != MEDIA_MANIFEST:
            continue
        _, _, subject = parse_manifest(read_blob(layout, desc), desc.digest)
        if subject is not None and subject.digest == chosen.digest:
            referrers.append(desc)
    return Layout(layout, manifests, chosen, config, layers, tuple(referrers))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        raise LayoutError(f"{path} is missing: not an OCI image layout") from None


@contextlib.contextmanager
def layer_stream(layout: Layout, desc: Descriptor) -> Iterator[IO[bytes]]:
    """A layer blob of a layout as an uncompressed tar stream."""
    with open(layout.blob(desc.digest), "rb") as handle:
        if desc.media_type.endswith("+gzip"):
            with gzip.GzipFile(fileobj=handle, mode="rb") as plain:
                yield plain
        else:
            yield handle


def load_json(data: bytes | None, name: str):
    if data is None:
        raise LayoutError(f"{name} is missing")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise LayoutError(f"{name}: not valid JSON ({err})") from None
