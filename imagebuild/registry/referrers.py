"""Artifacts attached to a manifest in a registry, as the OCI distribution spec 1.1 describes: an image
manifest whose `subject` is the manifest it is about, listed by the referrers API
(`GET /v2/<name>/referrers/<digest>`), or, where a registry has no such API (Docker's distribution 2.8),
by the referrers tag schema: an image index tagged `sha256-<hex>` of the subject, which the pusher keeps.

The manifest and blob reads and writes this needs are distribution.py's.
"""

from __future__ import annotations

import hashlib

from imagebuild.image.oci import MEDIA_EMPTY, MEDIA_INDEX, MEDIA_MANIFEST, Descriptor, canonical_json, parse_image_index, \
    parse_manifest
from imagebuild.registry.auth import RegistryError
from imagebuild.registry.client import RegistryClient, describe, with_query
from imagebuild.registry.distribution import get_blob, get_manifest, put_blob, put_manifest

EMPTY = b"{}"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for a subject: `sha256:<hex>` -> `sha256-<hex>`."""
    return digest.replace(":", "-", 1)


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
    list_referrer(client, repository, subject.digest, artifact, response.headers.get("OCI-Subject"))
    return artifact


def list_referrer(client: RegistryClient, repository: str, subject: str, artifact: Descriptor,
                  oci_subject: str | None) -> None:
    """After an artifact manifest whose subject is `subject` was put: a registry that answered the PUT with
    OCI-Subject lists it under its referrers API itself; otherwise the index at the subject's fallback tag
    gains it (unless it lists it already)."""
    if oci_subject == subject:
        return
    tag = fallback_tag(subject)
    found = get_manifest(client, repository, tag)
    entries = [desc.to_dict() for desc, _ in parse_image_index(found[0], f"{repository}:{tag}", None)] if found else []
    if any(entry.get("digest") == artifact.digest for entry in entries):
        return
    entries.append(artifact.to_dict())
    index = canonical_json({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries})
    put_manifest(client, repository, tag, index, MEDIA_INDEX)


def list_referrers(client: RegistryClient, repository: str, digest: str, artifact_type: str | None = None
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
