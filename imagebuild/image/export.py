"""OCI export: an engine image written as a deterministic OCI image layout.

The engine's own image (`docker save`) carries build-time noise: every file's mtime is the moment it
was written, the config has `created` stamps and the parent's id. The layout written here keeps only
what the lock decides: each layer normalized by imagebuild.image.normalize (sorted, mtimes clamped to
the lock's epoch, numeric owners, deterministic gzip, or zstd on request); a config with `created` = the epoch and
history without dates. Two builds of one lock then give the same diff_ids and the same manifest
digest (docs/reproducibility.md says what that covers). The layout format itself is oci.py.

Everything streams: the saved image is read once as a tar stream and each layer is spilled to a
temp file on its way to its blob. No layer is held in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Callable, Iterator, TypeVar

from imagebuild.common import REPRO_EPOCH, cache_dir, sha256_file
from imagebuild.image.compression import (DEFAULT, Compression, cache_key, check_available,
                                          compression as compression_named)
from imagebuild.image.normalize import TAR_ERRORS, LayerError, clean_path, spilled, write_layer_blob
from imagebuild.image.oci import (CONFIG_KEYS, JSON_LIMIT, MEDIA_CONFIG, MEDIA_MANIFEST, REF_NAME,
                                  Descriptor, LayoutError, blob_path, canonical_json, image_manifest, load_json,
                                  rfc3339, write_blob, write_index)

T = TypeVar("T")


@dataclass(frozen=True)
class LayerBlob:
    diff_id: str  # sha256 of the normalized, uncompressed tar
    descriptor: Descriptor  # the compressed blob (gzip or zstd, as its media type says)


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


def normalize_layer(raw: BinaryIO, blob_dir: Path, *, epoch: int, compression: Compression = DEFAULT) -> LayerBlob:
    """A seekable layer tar (plain, gzip or zstd) -> a normalized blob (gzip or zstd) in blob_dir/sha256/."""
    layer = write_layer_blob(raw, blob_dir, epoch=epoch, compression=compression)
    return LayerBlob(layer.diff_id, Descriptor(compression.media_type, layer.digest, layer.size,
                                               dict(layer.annotations)))


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
                elif member.size <= JSON_LIMIT:
                    small[name] = head + handle.read()
    except (LayoutError, LayerError):
        raise
    except TAR_ERRORS as err:
        raise LayoutError(f"not a readable saved image: {type(err).__name__}: {err}") from None
    manifest = load_json(small.get("manifest.json"), "manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        raise LayoutError("manifest.json: expected exactly one image in the saved archive")
    entry = manifest[0]
    config_name = entry.get("Config")
    if not isinstance(config_name, str) or clean_path(config_name) not in small:
        raise LayoutError(f"manifest.json: config {config_name!r} is not in the archive")
    config = load_json(small[clean_path(config_name)], config_name)
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


@contextlib.contextmanager
def saved_image(engine, image: str) -> Iterator[BinaryIO]:
    """The engine's image as a `docker save` stream (the engine contract's save)."""
    with engine.save(image) as stream:
        yield stream


# BuildKit's inline cache: which build step made which layer, with dates. Never in a released image
# (it would change the digest from run to run); kept only in the image pushed as a build cache.
BUILDKIT_CACHE_KEY = "moby.buildkit.cache.v0"


def normalized_config(config: dict, diff_ids: list[str], epoch: int, *, build_cache: bool = False) -> dict:
    """The OCI config: what runs the container, the normalized diff_ids, undated history; with
    build_cache, BuildKit's inline cache metadata too (its layer indexes still line up)."""
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
    if build_cache and isinstance(config.get(BUILDKIT_CACHE_KEY), str):
        out[BUILDKIT_CACHE_KEY] = config[BUILDKIT_CACHE_KEY]
    if history:
        out["history"] = history
    return out


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
    """Normalized blobs keyed by the engine layer's own sha256 (plus epoch, compressor and level, format):
    the output is a pure function of those, so a base layer is compressed once, not per export."""

    FORMAT = 1  # bump whenever normalization changes, or stale blobs would be reused

    def __init__(self, root: Path):
        self.root = Path(root)

    def _record(self, engine_digest: str, epoch: int, compression: Compression) -> Path:
        return self.root / "layers" / f"{engine_digest}-{epoch}-{cache_key(compression)}-{self.FORMAT}.json"

    def get(self, engine_digest: str, epoch: int, blob_dir: Path,
            compression: Compression = DEFAULT) -> LayerBlob | None:
        try:
            record = json.loads(self._record(engine_digest, epoch, compression).read_text())
            desc = Descriptor(compression.media_type, record["digest"], int(record["size"]),
                              {str(k): str(v) for k, v in record.get("annotations", {}).items()})
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

    def put(self, engine_digest: str, epoch: int, layer: LayerBlob, blob_dir: Path,
            compression: Compression = DEFAULT) -> None:
        cached = blob_path(self.root, layer.descriptor.digest)
        cached.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(blob_path(blob_dir.parent, layer.descriptor.digest), cached)
        record = self._record(engine_digest, epoch, compression)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"diff_id": layer.diff_id, "digest": layer.descriptor.digest,
                                      "size": layer.descriptor.size,
                                      "annotations": layer.descriptor.annotations}))


def _link_or_copy(source: Path, target: Path) -> None:
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copyfile(source, target)


def default_layer_cache() -> LayerCache:
    return LayerCache(cache_dir() / "oci")


def export_layout(engine, image: str, out_dir: Path, *, epoch: int = REPRO_EPOCH,
                  ref_name: str | None = None, cache: LayerCache | None | bool = True,
                  build_cache: bool = False, compression: str | Compression = DEFAULT) -> LayoutResult:
    """Write `image` from the engine as a deterministic OCI layout at out_dir (replaced atomically).

    cache: True for the user's layer cache, a LayerCache, or None/False for none.
    build_cache: keep BuildKit's inline cache metadata (for the image pushed as a build cache).
    compression: gzip (default), zstd or eStargz layers (compression.py)."""
    started = time.monotonic()
    compression = compression_named(compression)
    check_available(compression)
    engine.require(image)
    out_dir = Path(out_dir)
    cache = default_layer_cache() if cache is True else (cache or None)
    with staged_dir(out_dir) as staging:
        blob_dir = staging / "blobs"
        spill = Path(tempfile.mkdtemp(prefix=".spill-", dir=staging))

        def normalize(name: str, stream: IO[bytes]) -> LayerBlob:
            with spilled(stream, spill) as (raw, key):
                found = cache.get(key, epoch, blob_dir, compression) if cache else None
                if found is not None:
                    return found
                layer = normalize_layer(raw, blob_dir, epoch=epoch, compression=compression)
                if cache:
                    cache.put(key, epoch, layer, blob_dir, compression)
                return layer

        with saved_image(engine, image) as stream:
            saved = read_saved(stream, normalize)
        shutil.rmtree(spill)
        result = write_image(staging, saved.config, saved.layers, epoch=epoch,
                             ref_name=ref_name or ref_name_of(image), build_cache=build_cache)
    return LayoutResult(out_dir, result.manifest_digest, result.config_digest, result.diff_ids,
                        result.layers, result.ref_name, time.monotonic() - started)


def write_image(layout: Path, engine_config: dict, layers: list[LayerBlob], *, epoch: int,
                ref_name: str, build_cache: bool = False) -> LayoutResult:
    """Config, manifest and index.json for layers already in layout/blobs."""
    diff_ids = [layer.diff_id for layer in layers]
    config = canonical_json(normalized_config(engine_config, diff_ids, epoch, build_cache=build_cache))
    config_desc = Descriptor(MEDIA_CONFIG, write_blob(layout, config), len(config))
    descriptors = [layer.descriptor for layer in layers]
    manifest = canonical_json(image_manifest(config_desc, descriptors))
    manifest_digest = write_blob(layout, manifest)
    write_index(layout, [Descriptor(MEDIA_MANIFEST, manifest_digest, len(manifest),
                                    annotations={REF_NAME: ref_name})])
    return LayoutResult(layout, manifest_digest, config_desc.digest, tuple(diff_ids),
                        tuple(descriptors), ref_name)
