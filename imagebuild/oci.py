"""OCI export: an engine image written as a deterministic OCI image layout, and such a layout read back.

The engine's own image (`docker save`) carries build-time noise: every file's mtime is the moment it
was written, the config has `created` stamps and the parent's id. The layout written here keeps only
what the lock decides: each layer normalized by imagebuild.oci_normalize (sorted, mtimes clamped to
the lock's epoch, numeric owners, deterministic gzip); a config with `created` = the epoch and
history without dates. Two builds of one lock then give the same diff_ids and the same manifest
digest (docs/reproducibility.md says what that covers).

Everything streams: the saved image is read once as a tar stream and each layer is spilled to a
temp file on its way to its blob. No layer is held in memory.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, BinaryIO, Callable, Iterator, TypeVar

from imagebuild.bases import BOOTSTRAP_EPOCH, sha256_file
from imagebuild.errors import BuildFailed, ImagebuildError
from imagebuild.files import write_atomic
from imagebuild.oci_normalize import (
    GZIP_LEVEL,
    TAR_ERRORS,
    LayerError,
    clean_path,
    spilled,
    write_layer_blob,
)

# The lock's epoch: the one the Debian bases are bootstrapped with, the same for every lock, so a
# layer shared by two recipes (same base, same wheels) keeps one digest in a registry.
REPRO_EPOCH = BOOTSTRAP_EPOCH
LAYOUT_VERSION = "1.0.0"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
# The config keys that decide how a container runs; the rest of Docker's config is build noise.
CONFIG_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels",
               "StopSignal")
_CHUNK = 1 << 20
_SMALL = 16 << 20  # a saved image's JSON files are read into memory up to this size
T = TypeVar("T")


class LayoutError(ImagebuildError):
    """An OCI layout or saved image whose JSON or blobs are missing or malformed."""


def lock_epoch(lock=None) -> int:
    """SOURCE_DATE_EPOCH for an image built from this lock: a constant, see REPRO_EPOCH.

    Takes the lock so that a lock format which records its own epoch can be honoured here."""
    return REPRO_EPOCH


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # sha256:<hex>
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    artifact_type: str | None = None

    def to_dict(self) -> dict:
        out = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out


@dataclass(frozen=True)
class LayerBlob:
    diff_id: str  # sha256 of the normalized, uncompressed tar
    descriptor: Descriptor  # the gzip blob


@dataclass(frozen=True)
class LayoutResult:
    path: Path
    manifest_digest: str
    config_digest: str
    diff_ids: tuple[str, ...]
    layers: tuple[Descriptor, ...]
    ref_name: str
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"layout": str(self.path), "ref_name": self.ref_name,
                "manifest_digest": self.manifest_digest, "config_digest": self.config_digest,
                "diff_ids": list(self.diff_ids), "layers": [d.to_dict() for d in self.layers],
                "seconds": round(self.seconds, 2)}


def normalize_layer(raw: BinaryIO, blob_dir: Path, *, epoch: int) -> LayerBlob:
    """A seekable layer tar (plain or gzip) -> a normalized gzip blob in blob_dir/sha256/."""
    layer = write_layer_blob(raw, blob_dir, epoch=epoch)
    return LayerBlob(layer.diff_id, Descriptor(MEDIA_LAYER, layer.digest, layer.size))


# ---------------------------------------------------------------- reading a saved image

@dataclass
class SavedImage:
    """A `docker save` archive: the config, and one result per layer in the manifest's order."""

    config: dict
    layers: list
    repo_tags: list[str]


def read_saved(stream: BinaryIO, on_layer: Callable[[str, IO[bytes]], T]) -> SavedImage:
    """Read a saved image once, as a stream. JSON members are kept (small); each other member is
    handed to on_layer(name, stream) as it comes, before the manifest that orders them."""
    small: dict[str, bytes] = {}
    results: dict[str, T] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = clean_path(member.name)
                handle = tar.extractfile(member)
                head = handle.read(1) if member.size else b""
                # docker ≤ 24: <id>/layer.tar; buildah: <diff_id>.tar; docker ≥ 25: an OCI blobs/ tree
                if name.endswith(".tar") or (name.startswith("blobs/") and head != b"{"):
                    results[name] = on_layer(name, _Prefixed(head, handle))
                elif member.size <= _SMALL:
                    small[name] = head + handle.read()
    except (LayoutError, LayerError):
        raise
    except TAR_ERRORS as err:
        raise LayoutError(f"not a readable saved image: {type(err).__name__}: {err}") from None
    manifest = _json(small.get("manifest.json"), "manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        raise LayoutError("manifest.json: expected exactly one image in the saved archive")
    entry = manifest[0]
    config_name = entry.get("Config")
    if not isinstance(config_name, str) or clean_path(config_name) not in small:
        raise LayoutError(f"manifest.json: config {config_name!r} is not in the archive")
    config = _json(small[clean_path(config_name)], config_name)
    if not isinstance(config, dict):
        raise LayoutError(f"{config_name}: expected an object")
    names = entry.get("Layers")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise LayoutError("manifest.json: Layers must be a list of paths")
    missing = [n for n in names if clean_path(n) not in results]
    if missing:
        raise LayoutError(f"manifest.json: layer {missing[0]!r} is not in the archive")
    tags = entry.get("RepoTags") or []
    return SavedImage(config, [results[clean_path(n)] for n in names],
                      [t for t in tags if isinstance(t, str)])


class _Prefixed:
    """A read stream with bytes already taken from its front put back."""

    def __init__(self, head: bytes, rest: IO[bytes]):
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(size)
        if size is None or size < 0:
            data, self.head = self.head + self.rest.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        if len(data) < size:
            data += self.rest.read(size - len(data))
        return data


def _json(data: bytes | None, name: str):
    if data is None:
        raise LayoutError(f"{name} is missing")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise LayoutError(f"{name}: not valid JSON ({err})") from None


@contextlib.contextmanager
def saved_image(engine, image: str) -> Iterator[BinaryIO]:
    """The engine's image as a `docker save` stream (the engine contract's save)."""
    with engine.save(image) as stream:
        yield stream


@contextlib.contextmanager
def command_stream(argv: list[str], what: str) -> Iterator[BinaryIO]:
    """A command's stdout as a stream. When the command itself failed (an image that does not exist
    gives an empty stream), its message is the error, not what reading the empty stream raised."""
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)
        except OSError as err:
            raise BuildFailed(f"{what}: cannot run {argv[0]}: {err}") from None
        try:
            yield proc.stdout
            while proc.stdout.read(_CHUNK):  # drain in pieces: the producer never blocks on us
                pass
            code = proc.wait()
        except ImagebuildError:
            try:
                code = proc.wait(timeout=2)  # done writing already: its own exit code tells
            except subprocess.TimeoutExpired:
                raise  # still writing, so the stream itself was bad
            if code == 0:
                raise
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if code != 0:
            errors.seek(0)
            raise BuildFailed(f"{what} failed (exit {code}): "
                              f"{errors.read().decode('utf-8', 'replace').strip()}") from None


# ---------------------------------------------------------------- config and layout

def normalized_config(config: dict, diff_ids: list[str], epoch: int) -> dict:
    """The OCI config: what runs the container, the normalized diff_ids, undated history."""
    run = config.get("config") if isinstance(config.get("config"), dict) else {}
    kept = {key: run[key] for key in CONFIG_KEYS if run.get(key)}
    history = []
    items = config.get("history")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            entry = {}
            if item.get("created_by"):
                entry["created_by"] = str(item["created_by"])
            if item.get("empty_layer"):
                entry["empty_layer"] = True
            history.append(entry)
    if sum(not h.get("empty_layer") for h in history) != len(diff_ids):
        history = []  # history that does not line up with the layers is dropped, not guessed at
    out = {"architecture": str(config.get("architecture") or "amd64"),
           "os": str(config.get("os") or "linux"), "created": rfc3339(epoch), "config": kept,
           "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}
    if config.get("variant"):
        out["variant"] = str(config["variant"])
    if history:
        out["history"] = history
    return out


def canonical_json(data) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def write_blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(data)
    return "sha256:" + digest


def image_manifest(config: Descriptor, layers: list[Descriptor]) -> dict:
    return {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "config": config.to_dict(),
            "layers": [d.to_dict() for d in layers]}


def write_index(layout: Path, manifests: list[Descriptor]) -> None:
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
             "manifests": [d.to_dict() for d in manifests]}
    write_atomic(Path(layout) / "index.json", canonical_json(index))
    write_atomic(Path(layout) / "oci-layout", canonical_json({"imageLayoutVersion": LAYOUT_VERSION}))


def ref_name_of(image: str) -> str:
    """The index's ref.name for an image reference: its tag (`name:13.0` -> `13.0`), else `latest`."""
    name, sep, tag = image.rpartition(":")
    if sep and "/" not in tag and not image.startswith("sha256:"):
        return tag
    return "latest"


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """A fresh directory that replaces out_dir only when the block finishes."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
        os.replace(staging, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


class LayerCache:
    """Normalized blobs keyed by the engine layer's own sha256 (plus epoch, level and format):
    the output is a pure function of those, so a base layer is compressed once, not per export."""

    FORMAT = 1  # bump whenever normalization changes, or stale blobs would be reused

    def __init__(self, root: Path):
        self.root = Path(root)

    def _record(self, engine_digest: str, epoch: int) -> Path:
        return self.root / "layers" / f"{engine_digest}-{epoch}-{GZIP_LEVEL}-{self.FORMAT}.json"

    def get(self, engine_digest: str, epoch: int, blob_dir: Path) -> LayerBlob | None:
        try:
            record = json.loads(self._record(engine_digest, epoch).read_text())
            desc = Descriptor(MEDIA_LAYER, record["digest"], int(record["size"]))
            cached = blob_path(self.root, desc.digest)
            target = blob_path(blob_dir.parent, desc.digest)
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(cached, target)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if target.stat().st_size != desc.size or "sha256:" + sha256_file(target) != desc.digest:
            target.unlink()
            return None
        return LayerBlob(str(record["diff_id"]), desc)

    def put(self, engine_digest: str, epoch: int, layer: LayerBlob, blob_dir: Path) -> None:
        cached = blob_path(self.root, layer.descriptor.digest)
        cached.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(blob_path(blob_dir.parent, layer.descriptor.digest), cached)
        record = self._record(engine_digest, epoch)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"diff_id": layer.diff_id, "digest": layer.descriptor.digest,
                                      "size": layer.descriptor.size}))


def _link_or_copy(source: Path, target: Path) -> None:
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copyfile(source, target)


def default_layer_cache() -> LayerCache:
    from imagebuild.bases import cache_dir
    return LayerCache(cache_dir() / "oci")


def export_layout(engine, image: str, out_dir: Path, *, epoch: int = REPRO_EPOCH,
                  ref_name: str | None = None, cache: LayerCache | None | bool = True) -> LayoutResult:
    """Write `image` from the engine as a deterministic OCI layout at out_dir (replaced atomically).

    cache: True for the user's layer cache, a LayerCache, or None/False for none."""
    started = time.monotonic()
    if engine.inspect(image) is None:
        raise ImagebuildError(f"no image {image!r} in the {engine.name} engine")
    out_dir = Path(out_dir)
    cache = default_layer_cache() if cache is True else (cache or None)
    with staged_dir(out_dir) as staging:
        blob_dir = staging / "blobs"
        spill = Path(tempfile.mkdtemp(prefix=".spill-", dir=staging))

        def normalize(name: str, stream: IO[bytes]) -> LayerBlob:
            with spilled(stream, spill) as (raw, key):
                found = cache.get(key, epoch, blob_dir) if cache else None
                if found is not None:
                    return found
                layer = normalize_layer(raw, blob_dir, epoch=epoch)
                if cache:
                    cache.put(key, epoch, layer, blob_dir)
                return layer

        with saved_image(engine, image) as stream:
            saved = read_saved(stream, normalize)
        shutil.rmtree(spill)
        result = write_image(staging, saved.config, saved.layers, epoch=epoch,
                             ref_name=ref_name or ref_name_of(image))
    return LayoutResult(out_dir, result.manifest_digest, result.config_digest, result.diff_ids,
                        result.layers, result.ref_name, time.monotonic() - started)


def write_image(layout: Path, engine_config: dict, layers: list[LayerBlob], *, epoch: int,
                ref_name: str) -> LayoutResult:
    """Config, manifest and index.json for layers already in layout/blobs."""
    diff_ids = [layer.diff_id for layer in layers]
    config = canonical_json(normalized_config(engine_config, diff_ids, epoch))
    config_desc = Descriptor(MEDIA_CONFIG, write_blob(layout, config), len(config))
    descriptors = [layer.descriptor for layer in layers]
    manifest = canonical_json(image_manifest(config_desc, descriptors))
    manifest_digest = write_blob(layout, manifest)
    write_index(layout, [Descriptor(MEDIA_MANIFEST, manifest_digest, len(manifest),
                                    annotations={REF_NAME: ref_name})])
    return LayoutResult(layout, manifest_digest, config_desc.digest, tuple(diff_ids),
                        tuple(descriptors), ref_name)


# ---------------------------------------------------------------- reading a layout

@dataclass(frozen=True)
class Layout:
    path: Path
    manifests: tuple[Descriptor, ...]  # index.json's entries
    manifest: Descriptor  # the image manifest chosen
    config: dict
    layers: tuple[Descriptor, ...]
    referrers: tuple[Descriptor, ...]  # entries whose manifest names the image as its subject

    @property
    def manifest_digest(self) -> str:
        return self.manifest.digest

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(self.config["rootfs"]["diff_ids"])

    def blob(self, digest: str) -> Path:
        return blob_path(self.path, digest)


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return Path(layout) / "blobs" / algorithm / hexdigest


def _is_digest(value) -> bool:
    return (isinstance(value, str) and value.startswith("sha256:") and len(value) == 71
            and all(c in "0123456789abcdef" for c in value[7:]))


def parse_descriptor(value, where: str) -> Descriptor:
    if not isinstance(value, dict):
        raise LayoutError(f"{where}: expected a descriptor object")
    media, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(media, str) or not media:
        raise LayoutError(f"{where}.mediaType: expected a media type")
    if not _is_digest(digest):
        raise LayoutError(f"{where}.digest: expected sha256:<64 lowercase hex>, got {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise LayoutError(f"{where}.size: expected a whole number ≥ 0")
    annotations = value.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise LayoutError(f"{where}.annotations: expected string -> string")
    artifact = value.get("artifactType")
    return Descriptor(media, digest, size, dict(annotations), artifact if isinstance(artifact, str) else None)


def parse_index(data: bytes, where: str = "index.json") -> tuple[Descriptor, ...]:
    index = _json(data, where)
    if not isinstance(index, dict) or index.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected an object with schemaVersion 2")
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise LayoutError(f"{where}.manifests: expected a list")
    return tuple(parse_descriptor(m, f"{where}.manifests[{i}]") for i, m in enumerate(manifests))


def parse_manifest(data: bytes, where: str) -> tuple[Descriptor, tuple[Descriptor, ...], Descriptor | None]:
    """An image manifest -> (config, layers, subject)."""
    manifest = _json(data, where)
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise LayoutError(f"{where}: expected a manifest object with schemaVersion 2")
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise LayoutError(f"{where}.layers: expected a list")
    subject = manifest.get("subject")
    return (parse_descriptor(manifest.get("config"), f"{where}.config"),
            tuple(parse_descriptor(d, f"{where}.layers[{i}]") for i, d in enumerate(layers)),
            parse_descriptor(subject, f"{where}.subject") if subject is not None else None)


def read_blob(layout: Path, desc: Descriptor, limit: int = _SMALL) -> bytes:
    """A small blob, checked against its descriptor's size and digest."""
    if desc.size > limit:
        raise LayoutError(f"{desc.digest}: {desc.size} bytes is too large to read as JSON")
    path = blob_path(layout, desc.digest)
    try:
        data = path.read_bytes()
    except OSError:
        raise LayoutError(f"{layout}: blob {desc.digest} is missing") from None
    if len(data) != desc.size or "sha256:" + hashlib.sha256(data).hexdigest() != desc.digest:
        raise LayoutError(f"{layout}: blob {desc.digest} does not match its digest or size")
    return data


def read_layout(layout: Path, ref_name: str | None = None) -> Layout:
    """Read and check an OCI layout's index, image manifest and config (layer blobs: present, sized)."""
    layout = Path(layout)
    marker = _json(_read(layout / "oci-layout"), f"{layout}/oci-layout")
    if not isinstance(marker, dict) or not isinstance(marker.get("imageLayoutVersion"), str):
        raise LayoutError(f"{layout}/oci-layout: expected {{\"imageLayoutVersion\": ...}}")
    manifests = parse_index(_read(layout / "index.json"), f"{layout}/index.json")
    images = [d for d in manifests if d.media_type == MEDIA_MANIFEST and not d.artifact_type
              and (ref_name is None or d.annotations.get(REF_NAME) == ref_name)]
    if len(images) != 1:
        wanted = f" named {ref_name!r}" if ref_name else ""
        raise LayoutError(f"{layout}/index.json: expected one image manifest{wanted}, found {len(images)}")
    chosen = images[0]
    config_desc, layers, _ = parse_manifest(read_blob(layout, chosen), chosen.digest)
    config = _json(read_blob(layout, config_desc), config_desc.digest)
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if (not isinstance(diff_ids, list) or len(diff_ids) != len(layers)
            or not all(_is_digest(d) for d in diff_ids)):
        raise LayoutError(f"{config_desc.digest}: rootfs.diff_ids must list one sha256 per layer")
    for layer in layers:
        path = blob_path(layout, layer.digest)
        if not path.is_file() or path.stat().st_size != layer.size:
            raise LayoutError(f"{layout}: layer blob {layer.digest} is missing or has the wrong size")
    referrers = []
    for desc in manifests:
        if desc is chosen or desc.media_type != MEDIA_MANIFEST:
            continue
        _, _, subject = parse_manifest(read_blob(layout, desc), desc.digest)
        if subject is not None and subject.digest == chosen.digest:
            referrers.append(desc)
    return Layout(layout, manifests, chosen, config, layers, tuple(referrers))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        raise LayoutError(f"{path} is missing: not an OCI image layout") from None


@contextlib.contextmanager
def layer_stream(layout: Layout, desc: Descriptor) -> Iterator[IO[bytes]]:
    """A layer blob of a layout as an uncompressed tar stream."""
    with open(layout.blob(desc.digest), "rb") as handle:
        if desc.media_type.endswith("+gzip"):
            with gzip.GzipFile(fileobj=handle, mode="rb") as plain:
                yield plain
        else:
            yield handle
