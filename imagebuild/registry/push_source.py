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

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.image import export, oci
from imagebuild.image.oci import LayoutError

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
    platform: str = ""  # an index child's os/architecture[/variant], as the index says

    def walk(self) -> Iterator[Manifest]:
        """Children before parents: the order they must reach the registry in."""
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
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise LayoutError(f"{where}: manifest {descriptor['digest']} is not JSON") from None
    if not isinstance(body, dict):
        raise LayoutError(f"{where}: manifest {descriptor['digest']} is not a JSON object")
    media_type = descriptor.get("mediaType") or body.get("mediaType") or ""
    manifest = Manifest(descriptor["digest"], media_type if isinstance(media_type, str) else "", data)
    if media_type in INDEX_TYPES:
        children = body.get("manifests", [])
        if not isinstance(children, list):
            raise LayoutError(f"{where}: index {descriptor['digest']} has no `manifests` list")
        for child in children:
            manifest.children.append(_load_manifest(root, child, where))
            manifest.children[-1].platform = platform_text(child.get("platform"))
    elif media_type in MANIFEST_TYPES:
        layers = body.get("layers") or []
        if not isinstance(layers, list):
            raise LayoutError(f"{where}: manifest {descriptor['digest']} has no `layers` list")
        for entry in [body.get("config")] + layers:
            if isinstance(entry, dict) and entry.get("urls"):
                continue  # a foreign layer lives elsewhere; registries do not take it
            blob_path = _blob_path(root, entry, where)
            size = entry.get("size")
            if not isinstance(size, int) or blob_path.stat().st_size != size:
                raise LayoutError(f"{where}: blob {entry['digest']} is {blob_path.stat().st_size} "
                                  f"bytes, its descriptor says {size}")
            manifest.blobs.append(Blob(entry["digest"], size, blob_path))
    else:
        raise LayoutError(f"{where}: manifest {descriptor['digest']} has media type {media_type!r:.100}, "
                          f"not an image manifest or index")
    return manifest


def platform_text(value) -> str:
    """An index entry's platform as `os/architecture[/variant]`; "" when it names none."""
    if not isinstance(value, dict):
        return ""
    parts = [value.get(key) for key in ("os", "architecture", "variant")]
    return "/".join(p for p in parts if isinstance(p, str) and p)


def _subject(manifest: Manifest) -> str | None:
    subject = json.loads(manifest.data).get("subject")
    digest = subject.get("digest") if isinstance(subject, dict) else None
    return digest if isinstance(digest, str) else None


def read_layout(root: str | Path, name: str | None = None) -> Manifest:
    """The image in an OCI layout directory; `name` picks one by org.opencontainers.image.ref.name."""
    root = Path(root)
    if not (root / "oci-layout").is_file() or not (root / "index.json").is_file():
        raise LayoutError(f"{root} is not an OCI image layout (no oci-layout and index.json)")
    try:
        entries = json.loads((root / "index.json").read_text())["manifests"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        raise LayoutError(f"{root}/index.json has no `manifests` list") from None
    if not isinstance(entries, list):
        raise LayoutError(f"{root}/index.json has no `manifests` list")
    names = [(_ref_name(e), e) for e in entries if isinstance(e, dict)]
    # without a name, the one image (or image index); artifacts such as SBOMs are not candidates
    chosen = [e for n, e in names if (n == name if name is not None else not e.get("artifactType"))]
    if len(chosen) != 1:
        listed = ", ".join(str(n) for n, _ in names) or "none"
        raise LayoutError(f"{root} holds {len(chosen)} image(s) "
                          f"{'named ' + repr(name) if name else 'in index.json'}; pick one with "
                          f"--layout-name (names: {listed})")
    image = _load_manifest(root, chosen[0], str(root))
    subjects = {m.digest: m for m in image.walk()}
    for entry in entries:  # artifacts that name the image (or a platform's manifest) travel with it
        if entry is not chosen[0] and isinstance(entry, dict) and entry.get("mediaType") == OCI_MANIFEST:
            try:
                other = _load_manifest(root, entry, str(root))
            except LayoutError:
                continue  # another image's damage is not this push's business
            if _subject(other) in subjects:
                subjects[_subject(other)].referrers.append(other)
    return image


def _ref_name(entry: dict) -> str | None:
    annotations = entry.get("annotations")
    found = annotations.get(oci.REF_NAME) if isinstance(annotations, dict) else None
    return found if isinstance(found, str) else None


def export_engine_image(engine, image: str, out_dir: Path, progress: Progress = quiet, *,
                        build_cache: bool = False) -> str:
    """Write an engine image as an OCI layout (SOURCE_DATE_EPOCH, if set, clamps its times);
    returns the writer's name for the report. build_cache keeps BuildKit's cache metadata."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    progress(f"writing {image} as an OCI layout (imagebuild.image.oci)")
    export.export_layout(engine, image, out_dir, build_cache=build_cache,
                         **({"epoch": int(epoch)} if epoch.isdigit() else {}))
    return "imagebuild.oci"
