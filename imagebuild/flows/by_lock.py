"""Build by lock against a registry: the image built from a lock is pushed under the tag
`lock-<lock sha256>` beside the recipe's tag, so a later run (a fresh CI runner with an empty engine)
finds it with one manifest HEAD and gives it the recipe's tag by putting the same manifest bytes under
that tag: no layer is downloaded, no build or smoke runs. Only images that passed their smoke test are
pushed, so a lock tag in the registry stands for a smoke-tested image.
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.common import Progress, quiet
from imagebuild.image.oci import DOCKER_LIST, DOCKER_MANIFEST, MEDIA_INDEX, MEDIA_MANIFEST
from imagebuild.registry.push_source import Reference, parse_reference
from imagebuild.registry.registry import push_engine_image
from imagebuild.registry.auth import RegistryError
from imagebuild.registry.client import RegistryClient, describe

ACCEPT = ", ".join((MEDIA_MANIFEST, MEDIA_INDEX, DOCKER_MANIFEST, DOCKER_LIST))


def lock_tag(lock_sha256: str) -> str:
    return f"lock-{lock_sha256}"


@dataclass(frozen=True)
class RegistryTarget:
    """Where build-by-lock looks and pushes: HOST[:PORT]/REPOSITORY (a tag in it is ignored)."""
    repository: str
    ca_cert: str | None = None
    insecure_http: bool = False

    def reference(self, tag: str) -> Reference:
        ref = parse_reference(self.repository)
        return parse_reference(f"{ref.registry}/{ref.repository}:{tag}")

    def client(self, progress: Progress = quiet) -> RegistryClient:
        ref = parse_reference(self.repository)
        client = RegistryClient(ref.registry, ca_cert=self.ca_cert, insecure_http=self.insecure_http,
                                progress=progress)
        client.ping([f"repository:{ref.repository}:pull,push"])
        return client


@dataclass(frozen=True)
class RegistryHit:
    reference: str  # HOST/REPO:TAG now pointing at the image
    digest: str
    lock_reference: str


def find_by_lock(target: RegistryTarget, lock_sha256: str, progress: Progress = quiet,
                 client: RegistryClient | None = None) -> str | None:
    """The digest of the manifest tagged for this lock, by a HEAD request; None when there is none."""
    ref = target.reference(lock_tag(lock_sha256))
    client = client or target.client(progress)
    response = client.request("HEAD", f"/v2/{ref.repository}/manifests/{ref.tag}", headers={"Accept": ACCEPT})
    if response.status_code == 404:
        return None
    digest = response.headers.get("Docker-Content-Digest", "")
    if response.status_code != 200 or not digest.startswith("sha256:"):
        raise RegistryError(f"{ref.registry}: HEAD of {ref.repository}:{ref.tag} gave {describe(response)}")
    return digest


def copy_manifest(client: RegistryClient, source: Reference, target: Reference) -> str:
    """Put source's manifest (its own bytes, a few KB) under target's tag; returns its digest."""
    what = source.digest or source.tag
    response = client.request("GET", f"/v2/{source.repository}/manifests/{what}", headers={"Accept": ACCEPT})
    digest = response.headers.get("Docker-Content-Digest", "") or source.digest
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    if response.status_code != 200 or not digest or not media_type:
        raise RegistryError(f"{source.registry}: GET of {source.repository} {what} gave {describe(response)}")
    if target.tag != source.tag:
        put = client.request("PUT", f"/v2/{target.repository}/manifests/{target.tag}", body=response.content,
                             headers={"Content-Type": media_type})
        if put.status_code != 201:
            raise RegistryError(f"{target.registry} refused the manifest {digest} for "
                                f"{target.repository}:{target.tag} ({describe(put)})")
    return digest


def reuse_by_lock(target: RegistryTarget, lock_sha256: str, tag: str, progress: Progress = quiet,
                  expected: str | None = None) -> RegistryHit | None:
    """The image pushed for this lock given the recipe's tag; None when the registry has none, or when
    its lock tag names another manifest than the one this machine pushed for the lock (`expected`)."""
    client = target.client(progress)
    found = find_by_lock(target, lock_sha256, progress, client)
    if found is None:
        return None
    if expected is not None and found != expected:
        progress(f"{target.repository}:{lock_tag(lock_sha256)} names {found}, not the {expected} pushed from "
                 "here for this lock: building instead of trusting it")
        return None
    source, wanted = target.reference(lock_tag(lock_sha256)), target.reference(tag)
    return RegistryHit(str(wanted), copy_manifest(client, source, wanted), str(source))


def push_by_lock(engine, image: str, target: RegistryTarget, lock_sha256: str, tag: str,
                 progress: Progress = quiet) -> RegistryHit:
    """Push a smoke-tested engine image under tag, then the same manifest under the lock's tag."""
    ref, locked = target.reference(tag), target.reference(lock_tag(lock_sha256))
    report = push_engine_image(engine, image, ref, ca_cert=target.ca_cert, insecure_http=target.insecure_http,
                               progress=progress)
    copy_manifest(target.client(progress), parse_reference(f"{ref.registry}/{ref.repository}@{report.digest}"),
                  locked)
    return RegistryHit(str(ref), report.digest, str(locked))
