"""A multi-platform OCI layout: one engine image per platform, under one OCI image index.

Docker 20.10 keeps one image per platform (`NAME:TAG-amd64`, `NAME:TAG-arm64`). Each is exported
exactly as the single-image path does (export.py: same normalization, same manifest digest) into a
part of the staged layout, its SBOM attached there; the parts' blobs are then pooled and an image
index names each platform's manifest with its `platform` (os, architecture, variant when the config
has one), sorted by platform, so the same images always give the same index digest. index.json
names the index (with the ref name) and, beside it, each platform's SBOM artifact (whose subject is
that platform's manifest), as the single-image layout lists its SBOM beside its manifest. Read back
by read_index_layout, through layout.py's reader.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from imagebuild.common import REPRO_EPOCH
from imagebuild.errors import ImagebuildError
from imagebuild.image import oci, sbom
from imagebuild.image.export import LayerCache, LayoutResult, export_layout, ref_name_of, staged_dir
from imagebuild.image.layout import read_image, read_layout
from imagebuild.image.oci import MEDIA_INDEX, MEDIA_MANIFEST, REF_NAME, Descriptor, LayoutError, Platform


class DuplicatePlatform(ImagebuildError):
    """Two images for one platform: an index holds one manifest per platform."""


@dataclass(frozen=True)
class PlatformImage:
    platform: Platform
    manifest: Descriptor  # the platform's image manifest
    sbom: Descriptor | None = None  # the SBOM artifact whose subject it is
    image: str = ""  # the engine image it was exported from
    sbom_document: dict | None = None

    def to_dict(self) -> dict:
        return {"platform": str(self.platform), "image": self.image or None,
                "manifest_digest": self.manifest.digest,
                "sbom_artifact": self.sbom.digest if self.sbom else None}


@dataclass(frozen=True)
class IndexLayout:
    path: Path
    index: Descriptor  # index.json's entry for the image index (carries the ref name)
    platforms: tuple[PlatformImage, ...]
    seconds: float = 0.0

    @property
    def ref_name(self) -> str:
        return self.index.annotations.get(REF_NAME, "")

    def manifest_for(self, platform: str) -> Descriptor:
        for item in self.platforms:
            if str(item.platform) == platform:
                return item.manifest
        raise LayoutError(f"{self.path}: no manifest for {platform} "
                          f"(has {', '.join(str(p.platform) for p in self.platforms)})")

    def to_dict(self) -> dict:
        return {"layout": str(self.path), "ref_name": self.ref_name, "media_type": MEDIA_INDEX,
                "index_digest": self.index.digest,
                "platforms": [p.to_dict() for p in self.platforms], "seconds": round(self.seconds, 2)}


# ---------------------------------------------------------------- writing

# hook: (the part's single-image layout, the engine image, its export) -> its SBOM document
SbomFor = Callable[[Path, str, LayoutResult], dict]


def check_platforms(engine, images: list[str]) -> dict[str, Platform]:
    """Each image's platform, from its config; two images of one platform are an error."""
    found: dict[str, Platform] = {}
    for image in images:
        info = engine.require(image)
        platform = Platform.parse(info.platform or "linux/amd64")
        same = [other for other, p in found.items() if p == platform]
        if same:
            raise DuplicatePlatform(f"{same[0]} and {image} are both {platform}: give one image per "
                                    f"platform")
        found[image] = platform
    return found


def shared_ref_name(images: dict[str, Platform]) -> str:
    """The tag the images share once their `-ARCH[-VARIANT]` suffix is dropped (`1.0-arm64` -> `1.0`)."""
    names = set()
    for image, platform in images.items():
        tag = ref_name_of(image)
        variant = f"(?:-?{re.escape(platform.variant)})?" if platform.variant else ""
        names.add(re.sub(f"-{re.escape(platform.architecture)}{variant}$", "", tag) or tag)
    if len(names) != 1:
        raise ImagebuildError(f"the images' tags do not share one name once their platform suffix is "
                              f"dropped ({', '.join(sorted(names))}): pass --ref-name NAME")
    return names.pop()


def export_index(engine, images: list[str], out_dir: Path, *, ref_name: str | None = None,
                 epoch: int = REPRO_EPOCH, cache: LayerCache | None | bool = True,
                 sbom_for: SbomFor | None = None, compression: str = "gzip") -> IndexLayout:
    """Write one image per platform as one OCI layout under an image index (out_dir replaced
    atomically; nothing is written when two images share a platform)."""
    started = time.monotonic()
    platforms = check_platforms(engine, images)
    ref_name = ref_name or shared_ref_name(platforms)
    out_dir = Path(out_dir)
    done: list[PlatformImage] = []
    with staged_dir(out_dir) as staging:
        parts = staging / ".parts"
        for n, (image, platform) in enumerate(sorted(platforms.items(), key=lambda item: item[1])):
            part = parts / str(n)
            result = export_layout(engine, image, part, epoch=epoch, ref_name=ref_name, cache=cache,
                                   compression=compression)
            written = read_image(part)
            config = written.config
            saved = Platform(config["os"], config["architecture"], config.get("variant", ""))
            if saved != platform:  # what the engine's inspect said, and what its saved config says
                raise LayoutError(f"{image}: the engine says {platform}, its saved config {saved}")
            document = sbom_for(part, image, result) if sbom_for else None
            artifact = sbom.attach_sbom(part, document, epoch=epoch) if document else None
            _pool_blobs(part, staging)
            manifest = Descriptor(MEDIA_MANIFEST, written.manifest.digest, written.manifest.size)
            done.append(PlatformImage(platform, manifest, artifact, image, document))
        shutil.rmtree(parts)
        index = oci.canonical_json(image_index(done))
        entry = Descriptor(MEDIA_INDEX, oci.write_blob(staging, index), len(index),
                           annotations={REF_NAME: ref_name})
        oci.write_index(staging, [entry] + [p.sbom for p in done if p.sbom])
    return IndexLayout(out_dir, entry, tuple(done), time.monotonic() - started)


def image_index(platforms: list[PlatformImage]) -> dict:
    return {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
            "manifests": [{**p.manifest.to_dict(), "platform": p.platform.to_dict()}
                          for p in sorted(platforms, key=lambda p: p.platform)]}


def _pool_blobs(part: Path, staging: Path) -> None:
    """Move a part's blobs into the layout's one blob folder (a blob two platforms share, once)."""
    target = staging / "blobs" / "sha256"
    target.mkdir(parents=True, exist_ok=True)
    for blob in sorted((part / "blobs" / "sha256").iterdir()):
        if not (target / blob.name).exists():
            os.replace(blob, target / blob.name)


# ---------------------------------------------------------------- reading

def read_index_layout(layout: Path, ref_name: str | None = None) -> IndexLayout:
    """An index layout read back (image/layout.py reads and checks it): the image index, each
    platform's manifest and its SBOM artifact."""
    contents = read_layout(layout, ref_name)
    top = contents.image
    if top.media_type != MEDIA_INDEX:
        raise LayoutError(f"{contents.path}/index.json: {top.digest} is {top.media_type}, not an OCI image index")
    found = []
    for n, child in enumerate(top.children):
        if child.media_type != MEDIA_MANIFEST or child.platform is None:
            raise LayoutError(f"{oci.blob_path(contents.path, top.digest)}.manifests[{n}]: expected an image "
                              f"manifest with its platform")
        sboms = [r.descriptor for r in child.referrers if r.artifact_type == sbom.MEDIA_CYCLONEDX]
        found.append(PlatformImage(child.platform, child.descriptor, sboms[-1] if sboms else None))
    return IndexLayout(contents.path, top.descriptor, tuple(found))
