"""What a push sends, and where: the destination reference parsed, and the source (an OCI layout, or an
engine image first written as one) read into one manifest and the blobs it names, each checked
against its descriptor before anything is sent. registry.py pushes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.errors import ImagebuildError
from imagebuild.image import export, oci
from imagebuild.image.oci import LayoutError
from imagebuild.publish.registry_client import Progress, _quiet

OCI_MANIFEST, OCI_INDEX = oci.MEDIA_MANIFEST, oci.MEDIA_INDEX
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)


# ---------------------------------------------------------------- references

@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str = ""
    digest: str = ""

    def __str__(self) -> str:
        return (f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))


_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha(256:[a-f0-9]{64}|512:[a-f0-9]{128})")


def parse_reference(text: str) -> Reference:
    """HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]; the registry host is never guessed."""
    rest, _, digest = text.partition("@")
    host, slash, path = rest.partition("/")
    if not slash or not ("." in host or ":" in host or host == "localhost"):
        raise ImagebuildError(f"{text!r} names no registry host: write HOST[:PORT]/REPOSITORY[:TAG], "
                              "e.g. 127.0.0.1:5000/team/image:1.0")
    name, tag = path, ""
    if ":" in path.rsplit("/", 1)[-1]:
        name, tag = path.rsplit(":", 1)
    if not _REPOSITORY.fullmatch(name):
        raise ImagebuildError(f"{name!r} is not a repository name: lower-case letters, digits and "
                              "separators (. _ __ -), components joined by /")
    if tag and not _TAG.fullmatch(tag):
        raise ImagebuildError(f"{tag!r} is not a tag: up to 128 of letters, digits, _ . - ")
    if digest and not _DIGEST.fullmatch(digest):
        raise ImagebuildError(f"{digest!r} is not a digest (sha256:<64 hex>)")
    return Reference(host, name, tag or ("" if digest else "latest"), digest)


# ---------------------------------------------------------------- the layout

@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    path: Path


@dataclass
class Manifest:
    digest: str
    media_type: str
    data: bytes
    blobs: list[Blob] = field(default_factory=list)  # config, then layers
    children: list[Manifest] = field(default_factory=list)  # an index's manifests
    referrers: list[Manifest] = field(default_factory=list)  # manifests whose subject this is (SBOMs)

    def walk(self) -> Iterator[Manifest]:
        """Children before parents: the order they must reach the registry in."""
        for child in self.children:
            yield from child.walk()
        yield self


def _blob_path(root: Path, descriptor: dict, where: str) -> Path:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise LayoutError(f"{where}: a descriptor without a sha256/sha512 digest: {descriptor!r:.200}")
    path = oci.blob_path(root, digest)
    if not path.is_file():
        raise LayoutError(f"{where}: blob {digest} is missing ({path})")
    return path


def _load_manifest(root: Path, descriptor: dict, where: str) -> Manifest:
    path = _blob_path(root, descriptor, where)
    data = path.read_bytes()
    algorithm, _, expected = descriptor["digest"].partition(":")
    if hashlib.new(algorithm, data).hexdigest() != expected:
        raise LayoutError(f"{where}: manifest {descriptor['digest']} does not match its bytes")
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LayoutError(f"{where}: manifest {descriptor['digest']} is not JSON") from None
    media_type = descriptor.get("mediaType") or body.get("mediaType") or ""
    manifest = Manifest(descriptor["digest"], media_type, data)
    if media_type in INDEX_TYPES:
        manifest.children = [_load_manifest(root, child, where) for child in body.get("manifests", [])]
    elif media_type in MANIFEST_TYPES:
        for entry in [body.get("config")] + list(body.get("layers") or []):
            if isinstance(entry, dict) and entry.get("urls"):
                continue  # a foreign layer lives elsewhere; registries do not take it
            blob_path = _blob_path(root, entry, where)
            size = entry.get("size")
            if not isinstance(size, int) or blob_path.stat().st_size != size:
                raise LayoutError(f"{where}: blob {entry['digest']} is {blob_path.stat().st_size} "
                                  f"bytes, its descriptor says {size}")
            manifest.blobs.append(Blob(entry["digest"], size, blob_path))
    else:
        raise LayoutError(f"{where}: manifest {descriptor['digest']} has media type {media_type!r}, "
                          f"not an image manifest or index")
    return manifest


def read_layout(root: str | Path, name: str | None = None) -> Manifest:
    """The image in an OCI layout directory; `name` picks one by org.opencontainers.image.ref.name."""
    root = Path(root)
    if not (root / "oci-layout").is_file() or not (root / "index.json").is_file():
        raise LayoutError(f"{root} is not an OCI image layout (no oci-layout and index.json)")
    try:
        entries = json.loads((root / "index.json").read_text())["manifests"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise LayoutError(f"{root}/index.json has no `manifests` list") from None
    names = [((e.get("annotations") or {}).get(oci.REF_NAME), e)
             for e in entries if isinstance(e, dict)]
    chosen = [e for n, e in names if name is None or n == name]
    if len(chosen) != 1:
        listed = ", ".join(str(n) for n, _ in names) or "none"
        raise LayoutError(f"{root} holds {len(chosen)} image(s) "
                          f"{'named ' + repr(name) if name else 'in index.json'}; pick one with "
                          f"--layout-name (names: {listed})")
    image = _load_manifest(root, chosen[0], str(root))
    for entry in entries:  # artifacts that name the image as their subject travel with it
        if entry is not chosen[0] and isinstance(entry, dict) and entry.get("mediaType") == OCI_MANIFEST:
            try:
                other = _load_manifest(root, entry, str(root))
            except LayoutError:
                continue  # another image's damage is not this push's business
            subject = json.loads(other.data).get("subject")
            if isinstance(subject, dict) and subject.get("digest") == image.digest:
                image.referrers.append(other)
    return image


def export_engine_image(engine, image: str, out_dir: Path, progress: Progress = _quiet, *,
                        build_cache: bool = False) -> str:
    """Write an engine image as an OCI layout (SOURCE_DATE_EPOCH, if set, clamps its times);
    returns the writer's name for the report. build_cache keeps BuildKit's cache metadata."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    progress(f"writing {image} as an OCI layout (imagebuild.image.oci)")
    export.export_layout(engine, image, out_dir, build_cache=build_cache,
                         **({"epoch": int(epoch)} if epoch.isdigit() else {}))
    return "imagebuild.oci"
