"""Artifacts attached to a manifest in a registry, as the OCI distribution spec 1.1 describes: an image
manifest whose `subject` is the manifest it is about, listed by the referrers API
(`GET /v2/<name>/referrers/<digest>`), or, where a registry has no such API (Docker's distribution 2.8),
by the referrers tag schema: an image index tagged `sha256-<hex>` of the subject, which the pusher keeps.

Also the few small reads and writes this needs: a manifest by tag or digest, a small blob checked
against its digest, a blob uploaded in one request.
"""

from __future__ import annotations

import hashlib
import json

from imagebuild.image.oci import (DOCKER_LIST, DOCKER_MANIFEST, MEDIA_EMPTY, MEDIA_INDEX, MEDIA_MANIFEST, Descriptor,
                                  canonical_json, parse_image_index, parse_manifest)
from imagebuild.registry.auth import RegistryError
from imagebuild.registry.client import RegistryClient, describe, with_query

ACCEPT = ", ".join((MEDIA_MANIFEST, MEDIA_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
SMALL = 4 << 20  # what is read into memory here: manifests, configs, reports
EMPTY = b"{}"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for a subject: `sha256:<hex>` -> `sha256-<hex>`."""
    return digest.replace(":", "-", 1)


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


def get_blob(client: RegistryClient, repository: str, desc: Descriptor) -> bytes:
    """A small blob, checked against its descriptor's size and digest."""
    if desc.size > SMALL:
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


def put_manifest(client: RegistryClient, repository: str, reference: str, data: bytes, media_type: str):
    response = client.request("PUT", f"/v2/{repository}/manifests/{reference}", body=data,
                              headers={"Content-Type": media_type})
    if response.status_code != 201:
        raise RegistryError(f"{client.registry} refused a manifest for {repository}:{reference} ({describe(response)})")
    return response


def attach(client: RegistryClient, repository: str, subject: Descriptor, artifact_type: str, payload: bytes,
           annotations: dict[str, str] | None = None) -> Descriptor:
    """Push `payload` as an artifact whose subject is `subject` (a manifest in repository), and list it
    where readers look: a registry that takes the subject says so (OCI-Subject); otherwise the index at
    the subject's fallback tag gains it. Returns the artifact manifest's descriptor."""
    config = put_blob(client, repository, EMPTY, MEDIA_EMPTY)
    layer = put_blob(client, repository, payload, artifact_type)
    manifest = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "artifactType": artifact_type,
                "config": config.to_dict(), "layers": [layer.to_dict()],
                "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_dict(),
                **({"annotations": dict(annotations)} if annotations else {})}
    data = canonical_json(manifest)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    response = put_manifest(client, repository, digest, data, MEDIA_MANIFEST)
    artifact = Descriptor(MEDIA_MANIFEST, digest, len(data), dict(annotations or {}), artifact_type)
    if response.headers.get("OCI-Subject") == subject.digest:
        return artifact  # the registry lists it under its referrers API itself
    tag = fallback_tag(subject.digest)
    found = get_manifest(client, repository, tag)
    entries = [desc.to_dict() for desc, _ in parse_image_index(found[0], f"{repository}:{tag}", None)] if found else []
    if any(entry.get("digest") == digest for entry in entries):
        return artifact  # listed already
    entries.append(artifact.to_dict())
    index = canonical_json({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries})
    put_manifest(client, repository, tag, index, MEDIA_INDEX)
    return artifact


def referrers(client: RegistryClient, repository: str, digest: str, artifact_type: str | None = None
              ) -> list[Descriptor]:
    """The artifacts whose subject is `digest`: from the referrers API, else from the fallback tag's index
    (none when neither exists). Filtered by artifact_type here, whatever the registry filtered."""
    path = f"/v2/{repository}/referrers/{digest}"
    response = client.request("GET", with_query(path, artifactType=artifact_type) if artifact_type else path,
                              headers={"Accept": MEDIA_INDEX})
    if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(MEDIA_INDEX):
        data, where = response.content, f"{client.registry} referrers of {digest}"
    elif response.status_code in (200, 404):  # no referrers API (a 200 that is no index is a catch-all page)
        found = get_manifest(client, repository, fallback_tag(digest))
        if found is None:
            return []
        data, where = found[0], f"{repository}:{fallback_tag(digest)}"
    else:
        raise RegistryError(f"{client.registry}: GET of the referrers of {repository}@{digest} gave "
                            f"{describe(response)}")
    entries = [desc for desc, _ in parse_image_index(data, where, None)]
    return [desc for desc in entries if artifact_type is None or desc.artifact_type == artifact_type]


def read_artifact(client: RegistryClient, repository: str, desc: Descriptor, subject: str) -> bytes:
    """The one payload of the artifact `desc` lists, after checking that its subject is `subject`."""
    found = get_manifest(client, repository, desc.digest)
    if found is None:
        raise RegistryError(f"{client.registry}: the artifact {desc.digest} listed for {subject} is not in {repository}")
    _, layers, about = parse_manifest(found[0], f"{repository}@{desc.digest}")
    if about is None or about.digest != subject:
        raise RegistryError(f"the artifact {desc.digest} is listed for {subject} but its subject is "
                            f"{about.digest if about else 'absent'}")
    if len(layers) != 1:
        raise RegistryError(f"the artifact {desc.digest} has {len(layers)} payloads, not one")
    return get_blob(client, repository, layers[0])
