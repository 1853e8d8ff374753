"""The OCI image format: media types, descriptors and platforms, the JSON of index.json, of an image
manifest and of an image index parsed and checked, blobs written and read back by digest.

Writing a layout from an engine image is export.py and reading one back is layout.py; this module is
the format both sides share (export, the layout reader, SBOM, push, the LXC OCI archive). Everything
is validated as it is read: JSON from elsewhere is outside input, so anything off is one LayoutError
naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from imagebuild.common import REPRO_EPOCH, write_atomic
from imagebuild.errors import ImagebuildError

LAYOUT_VERSION = "1.0.0"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"
# Docker's own manifest formats: the same shapes, found in layouts other tools wrote and in registries.
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (MEDIA_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (MEDIA_INDEX, DOCKER_LIST)
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
    urls: tuple[str, ...] = ()  # a foreign layer's: it lives there, not in the layout

    def to_dict(self) -> dict:
        out = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        if self.urls:
            out["urls"] = list(self.urls)
        return out


@dataclass(frozen=True, order=True)
class Platform:
    """An image index entry's platform; `linux/arm64/v8` as text."""
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    @property
    def slug(self) -> str:
        """`linux-arm64-v8`: a platform in a file name."""
        return str(self).replace("/", "-")

    def to_dict(self) -> dict:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out

    @classmethod
    def parse(cls, text: str) -> Platform:
        """`linux/arm64[/v8]`, as engine.contract.config_platform writes it."""
        parts = text.split("/")
        return cls(parts[0], parts[1] if len(parts) > 1 else "", "/".join(parts[2:]))


# ---------------------------------------------------------------- writing

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


# ---------------------------------------------------------------- reading the format

def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return Path(layout) / "blobs" / algorithm / hexdigest


_HEX_LENGTH = {"sha256": 64, "sha512": 128}


def is_digest(value) -> bool:
    if not isinstance(value, str):
        return False
    algorithm, _, hexdigest = value.partition(":")
    return (len(hexdigest) == _HEX_LENGTH.get(algorithm, -1)
            and all(c in "0123456789abcdef" for c in hexdigest))


def parse_descriptor(value, where: str) -> Descriptor:
    if not isinstance(value, dict):
        raise LayoutError(f"{where}: expected a descriptor object")
    media, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(media, str) or not media:
        raise LayoutError(f"{where}.mediaType: expected a media type")
    if not is_digest(digest):
        raise LayoutError(f"{where}.digest: expected sha256:<64 lowercase hex> (or sha512:<128>), "
                          f"got {digest!r:.200}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise LayoutError(f"{where}.size: expected a whole number ≥ 0")
    annotations = value.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise LayoutError(f"{where}.annotations: expected string -> string")
    urls = value.get("urls") or []
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise LayoutError(f"{where}.urls: expected a list of URLs")
    artifact = value.get("artifactType")
    return Descriptor(media, digest, size, dict(annotations), artifact if isinstance(artifact, str) else None,
                      tuple(urls))


def parse_platform(value, where: str) -> Platform:
    if not isinstance(value, dict):
        raise LayoutError(f"{where}: expected a platform object")
    os_name, architecture, variant = value.get("os"), value.get("architecture"), value.get("variant", "")
    if not isinstance(os_name, str) or not os_name or not isinstance(architecture, str) or not architecture:
        raise LayoutError(f"{where}: expected os and architecture as text")
    if not isinstance(variant, str):
        raise LayoutError(f"{where}.variant: expected text")
    return Platform(os_name, architecture, variant)


def parse_index(data: bytes, where: str = "index.json") -> tuple[Descriptor, ...]:
    """index.json -> its entries."""
    index = load_json(data, where)
    if not isinstance(index, dict) or index.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected an object with schemaVersion 2")
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise LayoutError(f"{where}.manifests: expected a list")
    return tuple(parse_descriptor(m, f"{where}.manifests[{i}]") for i, m in enumerate(manifests))


def _body(data: bytes, where: str, what: str, media_type: str | None) -> dict:
    body = load_json(data, where)
    if not isinstance(body, dict) or body.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected {what} object with schemaVersion 2")
    if media_type is not None and body.get("mediaType", media_type) != media_type:
        raise LayoutError(f"{where}.mediaType: {body.get('mediaType')!r:.100} is not {media_type}, "
                          f"the media type its descriptor gives")
    return body


def parse_manifest(data: bytes, where: str, media_type: str | None = None
                   ) -> tuple[Descriptor, tuple[Descriptor, ...], Descriptor | None]:
    """An image manifest -> (config, layers, subject); media_type: the one its descriptor gives."""
    manifest = _body(data, where, "a manifest", media_type)
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise LayoutError(f"{where}.layers: expected a list")
    subject = manifest.get("subject")
    return (parse_descriptor(manifest.get("config"), f"{where}.config"),
            tuple(parse_descriptor(d, f"{where}.layers[{i}]") for i, d in enumerate(layers)),
            parse_descriptor(subject, f"{where}.subject") if subject is not None else None)


def parse_image_index(data: bytes, where: str, media_type: str | None = MEDIA_INDEX
                      ) -> tuple[tuple[Descriptor, Platform | None], ...]:
    """An image index (or Docker's manifest list) -> its entries, each with the platform it names."""
    body = _body(data, where, "an image index", media_type)
    entries = body.get("manifests")
    if not isinstance(entries, list):
        raise LayoutError(f"{where}.manifests: expected a list")
    out = []
    for i, entry in enumerate(entries):
        desc = parse_descriptor(entry, f"{where}.manifests[{i}]")
        platform = entry.get("platform")
        out.append((desc, None if platform is None else parse_platform(platform, f"{where}.manifests[{i}].platform")))
    return tuple(out)


def read_blob(layout: Path, desc: Descriptor, limit: int = JSON_LIMIT, where: str | None = None) -> bytes:
    """A small blob, checked against its descriptor's size and digest; `where` names who names it."""
    where = where or str(layout)
    if desc.size > limit:
        raise LayoutError(f"{where}: blob {desc.digest} is {desc.size} bytes, too large to read as JSON")
    path = blob_path(layout, desc.digest)
    try:
        data = path.read_bytes()
    except OSError:
        raise LayoutError(f"{where}: blob {desc.digest} is missing from the layout ({path})") from None
    if len(data) != desc.size:
        raise LayoutError(f"{where}: blob {desc.digest} is {len(data)} bytes, its descriptor says {desc.size}")
    algorithm, _, expected = desc.digest.partition(":")
    found = hashlib.new(algorithm, data).hexdigest()
    if found != expected:
        raise LayoutError(f"{where}: blob {desc.digest} does not match its digest (its bytes hash to "
                          f"{algorithm}:{found})")
    return data


def load_json(data: bytes | None, name: str):
    if data is None:
        raise LayoutError(f"{name} is missing")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise LayoutError(f"{name}: not valid JSON ({err})") from None
