"""What a push sends, and where: the destination reference parsed, and an engine image first written
as an OCI layout. The layout (one image or an image index, with its SBOMs) is read, every manifest
checked against its digest and every blob found at its size, by imagebuild.image.layout before
anything is sent; registry.py pushes it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.image import export


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


# ---------------------------------------------------------------- an engine image

def export_engine_image(engine, image: str, out_dir: Path, progress: Progress = quiet, *,
                        build_cache: bool = False, compression: str = "gzip") -> str:
    """Write an engine image as an OCI layout (SOURCE_DATE_EPOCH, if set, clamps its times; gzip or
    zstd layers); returns the writer's name for the report. build_cache keeps BuildKit's cache metadata."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    progress(f"writing {image} as an OCI layout with {compression} layers (imagebuild.image.oci)")
    export.export_layout(engine, image, out_dir, build_cache=build_cache, compression=compression,
                         **({"epoch": int(epoch)} if epoch.isdigit() else {}))
    return "imagebuild.oci"
