"""Publish: push an OCI image layout to a registry over the OCI distribution protocol.

Blobs first (skipped when the registry has them, mounted when another repository of it does,
otherwise uploaded, in resumable chunks when large), manifests last, so a tag never names a
half-pushed image. The manifest bytes are the layout's own, so the pushed digest is the layout's.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.common import Progress, cache_dir, quiet, write_atomic
from imagebuild.errors import ImagebuildError
from imagebuild.image.layout import Blob, Manifest, read_layout
from imagebuild.image.oci import LayoutError
from imagebuild.registry.push_source import Reference, export_engine_image, parse_reference
from imagebuild.registry.auth import AuthFailed, RegistryError, parse_upload_range
from imagebuild.registry.client import RETRY_ERRORS, RETRY_STATUS, Connection, RegistryClient, describe, with_query
from imagebuild.registry.referrers import list_referrer

DEFAULT_CHUNK = 64 << 20  # a lost connection costs at most one chunk
_BLOCK = 1 << 20  # bytes read from a blob file at a time

# ---------------------------------------------------------------- what was pushed where

class MountCache:
    """Which repositories of a registry got a blob from us, so a later push can mount, not upload."""

    KEEP_REPOSITORIES = 4
    KEEP_BLOBS = 20000

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, dict[str, list[str]]] = {}
        try:
            data = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            data = {}  # a cache that cannot be read only costs uploads
        if isinstance(data, dict):
            self.data = {registry: {d: [r for r in repos if isinstance(r, str)]
                                    for d, repos in table.items() if isinstance(repos, list)}
                         for registry, table in data.items() if isinstance(table, dict)}

    def sources(self, registry: str, digest: str, repository: str) -> list[str]:
        return [r for r in self.data.get(registry, {}).get(digest, []) if r != repository]

    def record(self, registry: str, repository: str, digests: Sequence[str]) -> None:
        table = self.data.setdefault(registry, {})
        for digest in digests:
            repos = [repository] + [r for r in table.pop(digest, []) if r != repository]
            table[digest] = repos[:self.KEEP_REPOSITORIES]  # re-inserted: newest last
        for digest in list(table)[:-self.KEEP_BLOBS]:
            del table[digest]

    def save(self) -> None:
        if self.path is None:
            return
        write_atomic(self.path, json.dumps(self.data, sort_keys=True).encode())


# ---------------------------------------------------------------- pushing

@dataclass
class BlobResult:
    digest: str
    size: int
    action: str = ""  # exists | mounted | uploaded
    bytes_sent: int = 0
    mounted_from: str = ""
    resumed_at: list[int] = field(default_factory=list)  # offsets an interrupted upload went on from
    restarts: int = 0  # uploads begun again because the registry had dropped the interrupted one
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"digest": self.digest, "size": self.size, "action": self.action,
                "bytes_sent": self.bytes_sent, "mounted_from": self.mounted_from or None,
                "resumed_at": self.resumed_at, "restarts": self.restarts,
                "seconds": round(self.seconds, 3)}


@dataclass
class PushReport:
    reference: str
    digest: str
    media_type: str
    source: str
    blobs: list[BlobResult]
    manifests: int
    retries: int
    seconds: float
    exported_with: str = ""  # how an engine image became a layout, when it was one
    platforms: list[dict] = field(default_factory=list)  # an index's: platform, manifest digest, referrers
    lock_tag: str = ""  # lock-<sha256>, when the image was built here from that lock and pushed under it too
    prefetch: dict | None = None  # --prefetch-import: the modules imported and how many files went first

    @property
    def bytes_sent(self) -> int:
        return sum(b.bytes_sent for b in self.blobs)

    @property
    def pinned(self) -> str:
        return f"{self.reference.rsplit('@', 1)[0]}@{self.digest}"

    def to_dict(self) -> dict:
        return {"ok": True, "reference": self.reference, "pinned": self.pinned, "digest": self.digest,
                "media_type": self.media_type, "source": self.source,
                "exported_with": self.exported_with or None, "manifests": self.manifests,
                "bytes_sent": self.bytes_sent, "retries": self.retries,
                "seconds": round(self.seconds, 3), "blobs": [b.to_dict() for b in self.blobs],
                "lock_tag": self.lock_tag or None,
                **({"platforms": self.platforms} if self.platforms else {}),
                **({"prefetch": self.prefetch} if self.prefetch else {})}


class _FileSlice:
    """Bytes [start, end) of a blob file as a request body: a known length (Content-Length, not
    chunked encoding), read a block at a time, each block counted as sent."""

    def __init__(self, path: Path, start: int, end: int, sent: Callable[[int], None]):
        self.path, self.start, self.end, self.sent = path, start, end, sent

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            left = self.end - self.start
            while left:
                block = f.read(min(_BLOCK, left))
                if not block:
                    raise LayoutError(f"{self.path} shrank while it was being pushed")
                left -= len(block)
                self.sent(len(block))
                yield block


class _Pusher:
    """Blobs and manifests of one repository."""

    def __init__(self, client: RegistryClient, repository: str, chunk_size: int, progress: Progress):
        self.client, self.repository, self.chunk_size, self.progress = (
            client, repository, chunk_size, progress)
        self.uploads = f"/v2/{repository}/blobs/uploads/"

    def push_blob(self, blob: Blob, sources: Sequence[str]) -> BlobResult:
        started = time.monotonic()
        result = BlobResult(blob.digest, blob.size)
        response = self.client.request("HEAD", f"/v2/{self.repository}/blobs/{blob.digest}")
        if response.status_code == 200:
            result.action = "exists"
        elif response.status_code != 404:
            raise RegistryError(f"{self.client.registry}: HEAD of blob {blob.digest}: {describe(response)}")
        location = None
        for source in sources if not result.action else ():
            try:
                response = self.client.request("POST", with_query(self.uploads, mount=blob.digest,
                                                                  **{"from": source}))
            except AuthFailed:
                continue  # no pull right on that repository: upload instead
            if response.status_code == 201:
                result.action, result.mounted_from = "mounted", source
            elif response.status_code == 202:
                location = response.headers.get("Location")  # the registry began an upload instead
            if response.status_code in (201, 202):
                break
        if not result.action:
            self.progress(f"{blob.digest[:19]} uploading {blob.size / 1e6:.1f} MB")
            self._upload(blob, location or self._start_upload(), result)
            result.action = "uploaded"
        result.seconds = time.monotonic() - started
        via = f" from {result.mounted_from}" if result.mounted_from else ""
        self.progress(f"{blob.digest[:19]} {result.action}{via}: {result.bytes_sent} bytes sent "
                      f"in {result.seconds:.1f} s")
        return result

    def _start_upload(self) -> str:
        response = self.client.request("POST", self.uploads)
        if response.status_code != 202 or not response.headers.get("Location"):
            raise RegistryError(f"{self.client.registry} would not start an upload to "
                                f"{self.repository}: {describe(response)}")
        return response.headers["Location"]

    def _body(self, blob: Blob, start: int, end: int, result: BlobResult):
        last = [time.monotonic()]

        def sent(n: int) -> None:
            result.bytes_sent += n
            if time.monotonic() - last[0] >= 2:
                last[0] = time.monotonic()
                self.progress(f"{blob.digest[:19]} {result.bytes_sent / 1e6:.1f}/"
                              f"{blob.size / 1e6:.1f} MB sent")
        return lambda: _FileSlice(blob.path, start, end, sent)

    def _upload(self, blob: Blob, location: str, result: BlobResult) -> None:
        """One PUT for a small blob; PATCH chunks then PUT for a large one, continuing an interrupted
        upload from what the registry says it holds (its Range), or starting over if it dropped it."""
        chunked = blob.size > self.chunk_size
        offset, failures, octets = 0, 0, {"Content-Type": "application/octet-stream"}
        while True:
            end = min(offset + self.chunk_size, blob.size) if chunked else blob.size
            closing = not chunked or offset >= blob.size
            response, problem = None, ""
            try:
                if closing:
                    body = b"" if chunked else self._body(blob, 0, blob.size, result)
                    response = self.client.request("PUT", with_query(location, digest=blob.digest),
                                                   body=body, headers=octets, retry=False)
                else:
                    response = self.client.request(
                        "PATCH", location, body=self._body(blob, offset, end, result), retry=False,
                        headers={**octets, "Content-Range": f"{offset}-{end - 1}"})
            except RETRY_ERRORS as err:
                problem = type(err).__name__
            if response is not None:
                if closing and response.status_code == 201:
                    return
                if not closing and response.status_code == 202:
                    location = response.headers.get("Location") or location
                    held = parse_upload_range(response.headers.get("Range"))
                    new = end if held is None else held
                    failures = 0 if new > offset else failures + 1
                    offset = new
                    if failures <= self.client.retries:
                        continue
                    problem = "the registry took a chunk but kept none of it"
                elif response.status_code not in RETRY_STATUS | {404, 416}:
                    raise RegistryError(f"{self.client.registry} refused blob {blob.digest} "
                                        f"({describe(response)})")
                else:
                    problem = f"HTTP {response.status_code}"
            failures += 1
            if failures > self.client.retries:
                raise RegistryError(f"uploading blob {blob.digest} to {self.client.registry} failed "
                                    f"{failures} times in a row (last: {problem})")
            self.client.wait(failures - 1, response, f"{problem} uploading {blob.digest[:19]}")
            location, offset = self._recover(blob, location, chunked, result)
            if offset is None:
                return  # the lost reply was to a PUT that landed

    def _recover(self, blob: Blob, location: str, chunked: bool, result: BlobResult):
        """Where an interrupted upload stands: (location, bytes held), or a new upload from 0."""
        response = self.client.request("HEAD", f"/v2/{self.repository}/blobs/{blob.digest}")
        if response.status_code == 200:
            return location, None
        if chunked:
            response = self.client.request("GET", location)
            held = parse_upload_range(response.headers.get("Range"))
            if response.status_code == 204 and held is not None and held <= blob.size:
                result.resumed_at.append(held)
                self.progress(f"{blob.digest[:19]} resuming at byte {held}")
                return response.headers.get("Location") or location, held
        result.restarts += 1
        self.progress(f"{blob.digest[:19]} the registry dropped the upload; starting it again")
        return self._start_upload(), 0

    def put_manifest(self, manifest: Manifest, target: str) -> str | None:
        """PUT the manifest's bytes; returns the registry's OCI-Subject answer (None when it has none)."""
        response = self.client.request("PUT", f"/v2/{self.repository}/manifests/{target}",
                                       body=manifest.data,
                                       headers={"Content-Type": manifest.media_type})
        if response.status_code != 201:
            raise RegistryError(f"{self.client.registry} refused manifest {manifest.digest} for "
                                f"{self.repository}:{target} ({describe(response)})")
        stored = response.headers.get("Docker-Content-Digest")
        if stored and stored != manifest.digest:
            raise RegistryError(f"{self.client.registry} stored manifest {manifest.digest} as "
                                f"{stored}: it rewrote the bytes")
        return response.headers.get("OCI-Subject")


@dataclass(frozen=True)
class PushOptions:
    """What a push does besides sending the image: the layout's image named (a layout with several), the
    repositories of the same registry to mount layers from, the chunk size of a large blob's upload, whether
    the blobs' repositories are remembered for the next push to mount from, and the tags the same manifest
    goes under too."""
    layout_name: str | None = None
    mount_from: Sequence[str] = ()
    chunk_size: int = DEFAULT_CHUNK
    remember: bool = True
    also_tags: Sequence[str] = ()


def push(source: str | Path, reference: str | Reference, connection: Connection = Connection(),
         options: PushOptions = PushOptions(), progress: Progress = quiet) -> PushReport:
    """Push the image in the OCI layout `source` to `reference` (HOST[:PORT]/REPO[:TAG]), and then under
    each of `options.also_tags` in the same repository (the same manifest bytes: the same digest)."""
    started = time.monotonic()
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    image = read_layout(source, options.layout_name).image
    if ref.digest and ref.digest != image.digest:
        raise ImagebuildError(f"{ref} pins {ref.digest}, but the layout's image is {image.digest}")
    cache = MountCache(cache_dir() / "registry-blobs.json" if options.remember else None)
    everything = list(image.push_order())
    blobs = list({b.digest: b for m in everything for b in m.blobs}.values())
    sources = {b.digest: [s for s in dict.fromkeys([*options.mount_from, *cache.sources(
        ref.registry, b.digest, ref.repository)]) if s != ref.repository] for b in blobs}
    pulls = dict.fromkeys(s for found in sources.values() for s in found)
    client = connection.open(ref.registry, [f"repository:{ref.repository}:pull,push"]
                             + [f"repository:{s}:pull" for s in pulls], progress)
    pusher = _Pusher(client, ref.repository, options.chunk_size, progress)
    results = [pusher.push_blob(blob, sources[blob.digest]) for blob in blobs]
    for manifest in everything:  # referrers and children by digest, the image itself last, by tag
        oci_subject = pusher.put_manifest(manifest, (ref.tag or ref.digest) if manifest is image else manifest.digest)
        if manifest.subject is not None:  # an SBOM: found by the referrers API, or by its subject's fallback tag
            list_referrer(client, ref.repository, manifest.subject.digest, manifest.descriptor, oci_subject)
    for tag in options.also_tags:
        pusher.put_manifest(image, tag)
    cache.record(ref.registry, ref.repository, [b.digest for b in blobs])
    cache.save()
    platforms = [{"platform": str(child.platform) if child.platform else None, "digest": child.digest,
                  "referrers": [r.digest for r in child.referrers]} for child in image.children]
    return PushReport(str(ref), image.digest, image.media_type, str(source), results,
                      len(everything), client.retried, time.monotonic() - started, platforms=platforms)


def push_engine_image(engine, image: str, reference: str | Reference, connection: Connection = Connection(), *,
                      build_cache: bool = False, compression: str = "gzip", progress: Progress = quiet) -> PushReport:
    """An engine image written as an OCI layout in a temp folder (gzip or zstd layers), then pushed
    (build_cache: with BuildKit's cache metadata kept, for the image pushed as a build cache)."""
    with tempfile.TemporaryDirectory(prefix="imagebuild-push-") as tmp:
        layout = Path(tmp) / "layout"
        export_engine_image(engine, image, layout, progress, build_cache=build_cache, compression=compression)
        progress(f"pushing {image} to {reference}")
        return push(layout, reference, connection, progress=progress)
