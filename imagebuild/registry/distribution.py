"""The OCI distribution protocol's reads and writes of one repository, for the flows that reuse, push and
seed through a registry: a manifest's digest by HEAD, a manifest read (checked against a digest asked for)
or put, one tag's manifest put under another, an image index's manifest for one platform, a blob read
checked against its descriptor, a small blob uploaded. Every manifest is parsed by image/oci.py.
"""

from __future__ import annotations

import hashlib
import json

from imagebuild.image.oci import (DOCKER_LIST, DOCKER_MANIFEST, INDEX_TYPES, MEDIA_INDEX, MEDIA_MANIFEST, Descriptor,
                                  Platform, parse_image_index)
from imagebuild.registry.auth import RegistryError
from imagebuild.registry.client import RegistryClient, describe, with_query

ACCEPT = ", ".join((MEDIA_MANIFEST, MEDIA_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
SMALL = 4 << 20  # what is read into memory unless asked for more: manifests, configs, reports


def head_manifest(client: RegistryClient, repository: str, reference: str) -> str | None:
    """The digest of the manifest at a tag or digest, by a HEAD request; None when there is none."""
    response = client.request("HEAD", f"/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
    if response.status_code == 404:
        return None
    digest = response.headers.get("Docker-Content-Digest", "")
    if response.status_code != 200 or not digest.startswith("sha256:"):
        raise RegistryError(f"{client.registry}: HEAD of {repository}:{reference} gave {describe(response)}")
    return digest


def get_manifest(client: RegistryClient, repository: str, reference: str) -> tuple[bytes, str, str] | None:
    """A manifest by tag or digest: (its bytes, media type, digest), checked against a digest asked for;
    None when the registry has none there."""
    response = client.request("GET", f"/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise RegistryError(f"{client.registry}: GET of {repository} manifest {reference} gave {describe(response)}")
    data = response.content
    if len(data) > SMALL:
        raise RegistryError(f"{client.registry}: the {repository} manifest {reference} is {len(data)} bytes")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise RegistryError(f"{client.registry}: the {repository} manifest {reference} has bytes hashing to {digest}")
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    try:
        said = json.loads(data).get("mediaType")
    except (ValueError, AttributeError):
        said = None
    return data, (said if isinstance(said, str) and said else media_type), digest


def put_manifest(client: RegistryClient, repository: str, reference: str, data: bytes, media_type: str):
    response = client.request("PUT", f"/v2/{repository}/manifests/{reference}", body=data,
                              headers={"Content-Type": media_type})
    if response.status_code != 201:
        raise RegistryError(f"{client.registry} refused a manifest for {repository}:{reference} ({describe(response)})")
    return response


def copy_manifest(client: RegistryClient, repository: str, source: str, tag: str) -> str:
    """Put the manifest at `source` (a tag or digest; its own bytes, a few KB) under `tag` too; returns its digest."""
    found = get_manifest(client, repository, source)
    if found is None:
        raise RegistryError(f"{client.registry}: {repository} has no manifest {source} to tag {tag}")
    data, media_type, digest = found
    if tag != source:
        put_manifest(client, repository, tag, data, media_type)
    return digest


def platform_manifest(client: RegistryClient, repository: str, reference: str, platform: str
                      ) -> tuple[bytes, str, str] | None:
    """The manifest at `reference` as get_manifest gives it; for an image index, its entry's manifest for
    `platform` (`linux/arm64`: os and architecture, whatever the variant). None when there is none there."""
    found = get_manifest(client, repository, reference)
    if found is None or found[1] not in INDEX_TYPES:
        return found
    wanted = Platform.parse(platform)
    for desc, named in parse_image_index(found[0], f"{repository}:{reference}", found[1]):
        if named is not None and (named.os, named.architecture) == (wanted.os, wanted.architecture):
            child = get_manifest(client, repository, desc.digest)
            if child is None:
                raise RegistryError(f"{client.registry}: {repository}:{reference} lists {desc.digest} for "
                                    f"{platform}, which it does not hold")
            return child
    raise RegistryError(f"{repository}:{reference} is an index with no image for {platform}")


def get_blob(client: RegistryClient, repository: str, desc: Descriptor, limit: int = SMALL) -> bytes:
    """A blob of at most `limit` bytes, checked against its descriptor's size and digest."""
    if desc.size > limit:
        raise RegistryError(f"{client.registry}: blob {desc.digest} is {desc.size} bytes, more than is read here")
    response = client.request("GET", f"/v2/{repository}/blobs/{desc.digest}")
    if response.status_code != 200:
        raise RegistryError(f"{client.registry}: GET of {repository} blob {desc.digest} gave {describe(response)}")
    data = response.content
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    if found != desc.digest or len(data) != desc.size:
        raise RegistryError(f"{client.registry}: blob {desc.digest} of {repository} came back as {len(data)} bytes "
                            f"hashing to {found}")
    return data


def put_blob(client: RegistryClient, repository: str, data: bytes, media_type: str) -> Descriptor:
    """A small blob uploaded in one request (or found there already)."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    desc = Descriptor(media_type, digest, len(data))
    if client.request("HEAD", f"/v2/{repository}/blobs/{digest}").status_code == 200:
        return desc
    started = client.request("POST", f"/v2/{repository}/blobs/uploads/")
    location = started.headers.get("Location")
    if started.status_code != 202 or not location:
        raise RegistryError(f"{client.registry} would not start an upload to {repository}: {describe(started)}")
    put = client.request("PUT", with_query(location, digest=digest), body=data,
                         headers={"Content-Type": "application/octet-stream"})
    if put.status_code != 201:
        raise RegistryError(f"{client.registry} refused blob {digest} for {repository} ({describe(put)})")
    return desc
