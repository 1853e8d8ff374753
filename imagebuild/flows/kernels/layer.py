"""The kernels a registry build cache carries, for a fresh runner's empty kernel cache.

A runner that builds with --cache-to leaves its smoke-tested image (with BuildKit's cache metadata) at
the cache reference. That image holds the [aot] step's layer: every kernel the step installed, at its
image path, and the step's manifest, which gives each FlashInfer module the key of what decided its bytes.
The next runner names the reference in --cache-from; its engine's kernel cache mount is empty, so when a
layer below the step changed the step would compile everything again. Instead, this module reads that
one layer from the registry (megabytes, where the image is gigabytes) and lays its kernels out as kernel
cache entries (payload/probe/kernels/kernel_cache.py's layout), which seed.py puts into the mount. What it asks the
registry (the image's manifest for this platform, its config, that layer's blob) it asks through registry/.
Several references (a gallery's recipes, each with a cache of its own) give one union of entries (merge_entries):
an entry's name says what made its bytes, so the same name from two layers is one kernel.

Everything read here is outside input: a reference with no such image, an image without a kernel layer, a
layer whose manifest or files do not match what they claim, give a `KernelLayer` with `why` said and no
entries, never an exception the build stops on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.common import Progress, quiet, write_atomic
from imagebuild.errors import ImagebuildError
from imagebuild.image.compression import ZSTD_MAGIC, CompressionError, decompress_bytes
from imagebuild.image.oci import Descriptor, LayoutError, load_json, parse_descriptor, parse_manifest
from imagebuild.registry import Connection, RegistryClient, get_blob, parse_reference, platform_manifest

LAYER_LIMIT = 1 << 30  # a kernel layer larger than this is not read (the flagship's is about 11 MB)
STEP_MARK = "kernels_aot.py build"  # what the [aot] step's history entry (`created_by`) says
_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,200}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAMESPACE = re.compile(r"[0-9a-f]{16}")


@dataclass
class KernelLayer:
    """What one cache reference gave: its kernel layer laid out as cache entries, or why not."""
    source: str
    digest: str | None = None  # the layer blob's digest
    bytes: int = 0
    flashinfer: int = 0  # FlashInfer entries written
    sglang: int = 0  # files of SGLang's cache written
    refused: list[str] = field(default_factory=list)  # artifacts whose bytes did not match the manifest
    why: str | None = None  # set when nothing was taken

    @property
    def entries(self) -> int:
        return self.flashinfer + self.sglang

    def to_dict(self) -> dict:
        return {"source": self.source, "layer": self.digest, "bytes": self.bytes, "flashinfer": self.flashinfer,
                "sglang_files": self.sglang, "refused": self.refused, "why": self.why}


def read_kernel_layer(source: str, out_dir: Path, *, manifest_path: str, platform: str = "linux/amd64",
                      connection: Connection = Connection(), progress: Progress = quiet) -> KernelLayer:
    """The [aot] layer of the image at `source` (HOST/REPO:TAG), laid out under out_dir as kernel cache entries."""
    result = KernelLayer(source)
    try:
        ref = parse_reference(source)
        client = connection.open(ref.registry, [f"repository:{ref.repository}:pull"], progress)
        where = ref.digest or ref.tag or "latest"
        manifest = platform_manifest(client, ref.repository, where, platform)
        if manifest is None:
            result.why = "the registry has no image there (a first run has none)"
            return result
        layer = _kernel_layer(client, ref.repository, manifest[0], f"{ref.repository}@{manifest[2]}")
        if isinstance(layer, str):
            result.why = layer
            return result
        result.digest = layer.digest
        blob = get_blob(client, ref.repository, layer, LAYER_LIMIT)
        result.bytes = len(blob)
    except ImagebuildError as err:
        result.why = str(err)
        return result
    return lay_out(blob, out_dir, manifest_path, result)


def lay_out(blob: bytes, out_dir: Path, manifest_path: str, result: KernelLayer) -> KernelLayer:
    """A kernel layer's bytes (a tar, plain, gzip or zstd) as cache entries under out_dir; result says what and why not."""
    try:
        if blob.startswith(ZSTD_MAGIC):  # an image pushed with --compression zstd
            blob = decompress_bytes(blob, f"the kernel layer {result.digest}")
        _lay_out(blob, out_dir, manifest_path, result)
    except CompressionError as err:
        result.why = str(err)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        result.why = f"the kernel layer {result.digest} is not a readable tar: {type(err).__name__}: {err}"
    if result.why is None and not result.entries:
        result.why = "its kernel layer holds no kernel its manifest names"
    return result


def _kernel_layer(client: RegistryClient, repository: str, data: bytes, where: str) -> Descriptor | str:
    """The descriptor of the layer the [aot] step made, of the image manifest `data`; else why not."""
    try:
        config_desc, _, _ = parse_manifest(data, where)
    except LayoutError as err:
        return f"it is not an image manifest: {err}"
    config = load_json(get_blob(client, repository, config_desc), f"{where} config {config_desc.digest}")
    layer = find_kernel_layer(load_json(data, where), config)
    return layer if isinstance(layer, str) else parse_descriptor(layer, f"{where} kernel layer")


def find_kernel_layer(manifest, config) -> dict | str:
    """Of an image's manifest and config, the layer the [aot] step made (its history entry runs
    kernels_aot.py build), or why there is none to read."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        return "its manifest lists no layers (not an image manifest)"
    history = config.get("history") if isinstance(config, dict) else None
    if not isinstance(history, list):
        return "its config has no build history, so the kernel layer cannot be told from the others"
    made = [h for h in history if isinstance(h, dict) and not h.get("empty_layer")]
    if len(made) != len(layers):
        return f"its history names {len(made)} layers and its manifest {len(layers)}: they do not line up"
    steps = [layer for h, layer in zip(made, layers) if STEP_MARK in str(h.get("created_by", ""))]
    if not steps:
        return "no layer of it was made by an [aot] kernel step"
    layer = steps[-1]
    if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str) or \
            not isinstance(layer.get("size"), int) or isinstance(layer.get("size"), bool) or layer["size"] < 0:
        return "its kernel layer's descriptor has no digest and size"
    if layer["size"] > LAYER_LIMIT:
        return f"its kernel layer is {layer['size']} bytes, over the {LAYER_LIMIT} this reads"
    return layer


def _member_name(name: str) -> str:
    """A tar member's or image path as a clean relative path: `./a//b`, `/a/b` -> `a/b`; never above the root."""
    return posixpath.normpath("/" + name).lstrip("/")


def _lay_out(blob: bytes, out_dir: Path, manifest_path: str, result: KernelLayer) -> None:
    """The layer's kernels as cache entries: FlashInfer modules by key (their sha256 checked against the
    manifest), and the files of SGLang's cache folder by their path in it."""
    manifest = _layer_manifest(blob, _member_name(manifest_path))
    if isinstance(manifest, str):
        result.why = manifest
        return
    flashinfer = {}
    for artifact in manifest.get("artifacts") or []:
        if isinstance(artifact, dict) and artifact.get("kind") == "flashinfer":
            name, key, path, sha = (artifact.get(k) for k in ("name", "key", "path", "sha256"))
            if all(isinstance(v, str) for v in (name, key, path, sha)) and _NAME.fullmatch(name) and \
                    _HEX64.fullmatch(key) and _HEX64.fullmatch(sha):
                flashinfer[_member_name(path)] = (name, key, sha)
            else:
                result.refused.append(str(artifact.get("name"))[:200])
    sglang_dir, namespace = manifest.get("sglang_jit_cache_dir"), manifest.get("sglang_cache_namespace")
    # SGLang's files go in the namespace of the build-wide key they were built under; a manifest that names
    # none (an image built before namespaces) gives none of them, since nothing says what built them.
    sglang_prefix = _member_name(sglang_dir) + "/" if isinstance(sglang_dir, str) and _member_name(sglang_dir) and \
        isinstance(namespace, str) and _NAMESPACE.fullmatch(namespace) else None
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = _member_name(member.name)
            if name in flashinfer:
                module, key, sha = flashinfer.pop(name)
                data = tar.extractfile(member).read()
                if hashlib.sha256(data).hexdigest() != sha:
                    result.refused.append(module)
                    continue
                entry = out_dir / "flashinfer" / key
                _write(entry / f"{module}.so", data, 0o755)
                _write(entry / "entry.json", json.dumps({"name": module, "sha256": sha, "bytes": len(data)}).encode(), 0o644)
                result.flashinfer += 1
            elif sglang_prefix and name.startswith(sglang_prefix):
                relative = name[len(sglang_prefix):]
                if relative and not relative.startswith("../") and ".." not in relative.split("/"):
                    _write(out_dir / "sglang" / namespace / relative, tar.extractfile(member).read(),
                           member.mode & 0o755)
                    result.sglang += 1
    result.refused.extend(module for module, _, _ in flashinfer.values())  # named, but not in the layer


def _layer_manifest(blob: bytes, wanted: str) -> dict | str:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
        for member in tar:
            if member.isfile() and _member_name(member.name) == wanted:
                try:
                    manifest = json.loads(tar.extractfile(member).read())
                except ValueError:
                    return f"its kernel manifest /{wanted} is not JSON"
                if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts", []), list):
                    return f"its kernel manifest /{wanted} lists no artifacts"
                return manifest
    return f"its kernel layer holds no manifest at /{wanted}"


def _write(path: Path, data: bytes, mode: int) -> None:
    os.chmod(write_atomic(path, data), mode | 0o600)


def entry_names(folder: Path) -> list[str]:
    """The cache entries laid out under folder: `flashinfer/<key>` (a module's folder, named by the key of every
    byte that made it) and `sglang/<namespace>/<path>` (a file of SGLang's cache, in the namespace of the
    build-wide key it was built under)."""
    names = [f"flashinfer/{entry.name}" for entry in sorted((folder / "flashinfer").glob("*")) if entry.is_dir()]
    sglang = folder / "sglang"
    return names + sorted(str(path.relative_to(folder)) for path in sglang.rglob("*") if path.is_file())


def merge_entries(laid_out: Path, union: Path) -> list[str]:
    """Move the entries under laid_out into union, but for those union holds already (the same name is the same
    kernel: an earlier source's copy stays). Returns the names union held already."""
    held = []
    for name in entry_names(laid_out):
        target = union / name
        if target.exists():
            held.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(laid_out / name), str(target))
    return held
