"""Build by lock against a registry: the image built from a lock is pushed under the tag
`lock-<lock sha256>` beside the recipe's tag, with the smoke report that passed for it attached (an OCI
artifact whose subject is that manifest: registry.attach), so a later run (a fresh CI runner with an
empty engine) finds it and gives it the recipe's tag by putting the same manifest bytes under that tag: no
layer is downloaded, no build or smoke runs.

A lock tag is a name, and anyone who may push can point it anywhere: the manifest it names is taken only
when its config's io.imagebuild.lock.sha256 label is this lock's and a smoke report that passed for that
very manifest (and config, and lock) is attached to it; otherwise it is built, saying why.

With zstd layers (`--compression zstd`) the same lock gives another manifest, so it has a tag of its own,
`lock-<lock sha256>-zstd`: a runner that asks for zstd never takes the gzip image, nor the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.image.compression import DEFAULT, compression as compression_named
from imagebuild.image.oci import MANIFEST_TYPES, Descriptor, canonical_json, parse_manifest
from imagebuild.registry import (Connection, Reference, RegistryClient, RegistryError, attach, copy_manifest, get_blob,
                                 get_manifest, head_manifest, list_referrers, parse_reference, push_engine_image,
                                 read_artifact)

# The artifact a smoke report travels as, and the annotation that says it passed.
SMOKE_ARTIFACT = "application/vnd.imagebuild.smoke-report.v1+json"
SMOKE_OK = "io.imagebuild.smoke.ok"
SMOKE_MANIFEST = "io.imagebuild.smoke.manifest"


def lock_tag(lock_sha256: str, compression: str = DEFAULT.name) -> str:
    """`lock-<sha256>` for the default gzip layers; `lock-<sha256>-zstd` for zstd ones."""
    kind = compression_named(compression)
    return f"lock-{lock_sha256}" if kind is DEFAULT else f"lock-{lock_sha256}-{kind.name}"


@dataclass(frozen=True)
class RegistryTarget:
    """Where build-by-lock looks and pushes: HOST[:PORT]/REPOSITORY (a tag in it is ignored), and how that
    registry is reached."""
    repository: str
    connection: Connection = Connection()
    compression: str = DEFAULT.name  # of the layers pushed, and so of the lock tag looked for

    def reference(self, tag: str) -> Reference:
        ref = parse_reference(self.repository)
        return parse_reference(f"{ref.registry}/{ref.repository}:{tag}")

    def client(self, progress: Progress = quiet) -> RegistryClient:
        ref = parse_reference(self.repository)
        return self.connection.open(ref.registry, [f"repository:{ref.repository}:pull,push"], progress)


@dataclass(frozen=True)
class RegistryHit:
    reference: str  # HOST/REPO:TAG now pointing at the image
    digest: str
    lock_reference: str
    smoke: dict | None = None  # the attached smoke report that stands behind it (smoke_summary)


def find_by_lock(target: RegistryTarget, lock_sha256: str, progress: Progress = quiet,
                 client: RegistryClient | None = None) -> str | None:
    """The digest of the manifest tagged for this lock, by a HEAD request; None when there is none."""
    ref = target.reference(lock_tag(lock_sha256, target.compression))
    return head_manifest(client or target.client(progress), ref.repository, ref.tag)


def smoke_summary(payload: dict, artifact: str) -> dict:
    """What a smoke report attached to an image says, in a build's report: its artifact and its checks."""
    checks = payload.get("report", {}).get("checks", []) if isinstance(payload.get("report"), dict) else []
    return {"artifact": artifact, "ok": payload.get("ok") is True,
            "checks": [{"name": str(c.get("name")), "status": str(c.get("status"))}
                       for c in checks if isinstance(c, dict)]}


def said_checks(smoke: dict) -> str:
    checks = smoke.get("checks") or []
    return ", ".join(f"{c['name']} {c['status']}" for c in checks) or "no checks listed"


def config_label(config: bytes, key: str) -> str | None:
    """An image config's label `key` when it is text; None when the config has no such label or is no config."""
    try:
        data = json.loads(config)
    except ValueError:
        return None
    run = data.get("config") if isinstance(data, dict) else None
    labels = run.get("Labels") if isinstance(run, dict) else None
    value = labels.get(key) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


def report_refusal(payload, manifest: str, config: str, lock_sha256: str) -> str | None:
    """Why an attached smoke report does not stand behind this manifest, config and lock; None when it does."""
    if not isinstance(payload, dict):
        return "not a smoke report"
    if (payload.get("manifest"), payload.get("config"), payload.get("lock_sha256")) != (manifest, config, lock_sha256):
        return (f"it is for manifest {payload.get('manifest')!s:.80}, config {payload.get('config')!s:.80}, "
                f"lock {payload.get('lock_sha256')!s:.80}")
    report = payload.get("report")
    if payload.get("ok") is not True or not isinstance(report, dict) or report.get("ok") is not True:
        return "it does not say ok"
    return None


def vouch(client: RegistryClient, repository: str, digest: str, lock_sha256: str) -> tuple[dict | None, str]:
    """(the smoke report that stands behind the manifest `digest` for this lock, "") when its config
    carries this lock's sha256 and a smoke report that passed for this manifest, config and lock is
    attached to it; else (None, why not)."""
    from imagebuild.render import LABEL_PREFIX
    try:
        found = get_manifest(client, repository, digest)
        if found is None:
            return None, f"the registry no longer has the manifest {digest}"
        data, media_type, _ = found
        if media_type not in MANIFEST_TYPES:
            return None, f"it is a {media_type}, not one image's manifest"
        config_desc, _, _ = parse_manifest(data, f"{repository}@{digest}", media_type)
        label = config_label(get_blob(client, repository, config_desc), f"{LABEL_PREFIX}.lock.sha256")
        if label != lock_sha256:
            return None, (f"its config's {LABEL_PREFIX}.lock.sha256 label is {label if label else 'absent'}, "
                          f"not this lock's {lock_sha256}")
        listed = list_referrers(client, repository, digest, SMOKE_ARTIFACT)
        refused = []
        for desc in listed:
            try:
                payload = json.loads(read_artifact(client, repository, desc, digest))
            except (ImagebuildError, ValueError) as err:
                refused.append(f"{desc.digest}: {err}")
                continue
            why = report_refusal(payload, digest, config_desc.digest, lock_sha256)
            if why is None:
                return smoke_summary(payload, desc.digest), ""
            refused.append(f"{desc.digest}: {why}")
        return None, ("no smoke result stands behind it: no smoke report is attached to it"
                      if not refused else "no smoke result stands behind it: " + "; ".join(refused))
    except (ImagebuildError, ValueError, AttributeError, TypeError) as err:
        return None, f"it cannot be read: {err}"


def reuse_by_lock(target: RegistryTarget, lock_sha256: str, tag: str, progress: Progress = quiet,
                  expected: str | None = None) -> RegistryHit | None:
    """The image pushed for this lock given the recipe's tag; None (saying why) when the registry has
    none, when its lock tag names another manifest than the one this machine pushed for the lock
    (`expected`), or when the manifest does not prove itself (vouch)."""
    client = target.client(progress)
    found = find_by_lock(target, lock_sha256, progress, client)
    if found is None:
        return None
    source, wanted = target.reference(lock_tag(lock_sha256, target.compression)), target.reference(tag)
    if expected is not None and found != expected:
        progress(f"{target.repository}:{source.tag} names {found}, not the {expected} pushed from "
                 "here for this lock: building instead of trusting it")
        return None
    smoke, why = vouch(client, source.repository, found, lock_sha256)
    if smoke is None:
        progress(f"not taking {source} ({found}): {why}; building")
        return None
    return RegistryHit(str(wanted), copy_manifest(client, source.repository, found, wanted.tag), str(source),
                       smoke)


def attach_smoke(client: RegistryClient, ref: Reference, digest: str, lock_sha256: str, report: dict,
                 image_id: str | None = None) -> dict:
    """The smoke report that passed for the image pushed as `digest` attached to it (an artifact whose
    subject is that manifest; `image_id`: the engine image the probe ran in, whose config the push
    normalized); what it says, as smoke_summary."""
    if not isinstance(report, dict) or report.get("ok") is not True:
        raise ImagebuildError(f"only a smoke report that says ok is attached to {ref.repository}@{digest}")
    found = get_manifest(client, ref.repository, digest)
    if found is None:
        raise RegistryError(f"{ref.registry}: the manifest {digest} just pushed to {ref.repository} is not there")
    data, media_type, _ = found
    config_desc, _, _ = parse_manifest(data, f"{ref.repository}@{digest}", media_type)
    payload = {"manifest": digest, "config": config_desc.digest, "lock_sha256": lock_sha256, "ok": True,
               "report": report, **({"image_id": image_id} if image_id else {})}
    artifact = attach(client, ref.repository, Descriptor(media_type, digest, len(data)), SMOKE_ARTIFACT,
                      canonical_json(payload), {SMOKE_OK: "true", SMOKE_MANIFEST: digest})
    return smoke_summary(payload, artifact.digest)


def tag_for_lock(client: RegistryClient, ref: Reference, digest: str, lock_sha256: str, report: dict,
                 image_id: str | None = None, compression: str = DEFAULT.name) -> tuple[str, dict]:
    """The pushed image's smoke report attached, then its manifest put under the lock's tag (in that order,
    so a lock tag never names an image without its report): (the lock tag's reference, the summary)."""
    smoke = attach_smoke(client, ref, digest, lock_sha256, report, image_id)
    locked = parse_reference(f"{ref.registry}/{ref.repository}:{lock_tag(lock_sha256, compression)}")
    copy_manifest(client, ref.repository, digest, locked.tag)
    return str(locked), smoke


def push_by_lock(engine, image: str, target: RegistryTarget, lock_sha256: str, tag: str, report: dict,
                 progress: Progress = quiet, image_id: str | None = None) -> RegistryHit:
    """Push a smoke-tested engine image under tag, attach the smoke `report` that passed for it, then put
    the same manifest under the lock's tag."""
    ref = target.reference(tag)
    pushed = push_engine_image(engine, image, ref, target.connection, compression=target.compression,
                               progress=progress)
    locked, smoke = tag_for_lock(target.client(progress), ref, pushed.digest, lock_sha256, report, image_id,
                                 target.compression)
    progress(f"attached the smoke report ({said_checks(smoke)}) to {pushed.digest} and tagged it "
             f"{lock_tag(lock_sha256, target.compression)}")
    return RegistryHit(str(ref), pushed.digest, locked, smoke)
