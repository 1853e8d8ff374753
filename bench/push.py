"""Push throughput: `imagebuild push` against `skopeo copy` of the same OCI layout, each to its own
fresh docker-registry on 127.0.0.1, cold (empty registry) then warm (one changed layer).

    .venv/bin/python bench/push.py [--layers-mb 256,64,8] [--chunk-mb 64]

Needs docker-registry and skopeo (Debian packages). Layers are pseudo-random bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from registry_server import start_registry

from imagebuild.image.layout import read_layout
from imagebuild.image.oci import MEDIA_MANIFEST
from imagebuild.registry import registry

OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def _blob(layout: Path, data: bytes | None = None, path: Path | None = None) -> tuple[str, int]:
    digest = hashlib.sha256()
    if data is None:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        size = path.stat().st_size
    else:
        digest.update(data)
        size = len(data)
    target = layout / "blobs" / "sha256" / digest.hexdigest()
    target.parent.mkdir(parents=True, exist_ok=True)
    if data is None:
        os.replace(path, target)
    else:
        target.write_bytes(data)
    return f"sha256:{digest.hexdigest()}", size


class _RandomFile:
    """`size` pseudo-random bytes from `seed`, read like a file: the same seed gives the same bytes."""

    def __init__(self, seed: str, size: int):
        self.rng, self.left = random.Random(seed), size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return self.rng.randbytes(n)


def _layer(layout: Path, name: str, size: int, seed: str) -> tuple[str, int]:
    spill = layout / f".{name}.tar"
    with tarfile.open(spill, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mtime = size, 0
        tar.addfile(info, _RandomFile(seed, size))
    return _blob(layout, path=spill)


def make_layout(root: Path, sizes_mb: list[int], changed_seed: str) -> Path:
    root.mkdir(parents=True)
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    layers = []
    for n, mb in enumerate(sizes_mb):
        seed = changed_seed if n == len(sizes_mb) - 1 else f"layer{n}"
        digest, size = _layer(root, f"layer{n}", mb << 20, seed)
        layers.append({"mediaType": OCI_LAYER, "digest": digest, "size": size})
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layers]}},
                        sort_keys=True).encode()
    config_digest, config_size = _blob(root, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": config_digest,
                                      "size": config_size}, "layers": layers}).encode()
    digest, size = _blob(root, manifest)
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": MEDIA_MANIFEST, "digest": digest, "size": size}]}))
    return root


def skopeo_copy(layout: Path, ref: str) -> float:
    started = time.monotonic()
    subprocess.run(["skopeo", "copy", "--insecure-policy", "--dest-tls-verify=false", "-q",
                    f"oci:{layout}", f"docker://{ref}"], check=True)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers-mb", default="256,64,8", help="layer sizes in MB (last one changes)")
    parser.add_argument("--chunk-mb", type=int, default=64)
    args = parser.parse_args()
    sizes = [int(s) for s in args.layers_mb.split(",")]
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["IMAGEBUILD_CACHE"] = str(tmp / "cache")
        print(f"writing layouts: layers of {sizes} MB ...", file=sys.stderr)
        v1 = make_layout(tmp / "v1", sizes, "first")
        v2 = make_layout(tmp / "v2", sizes, "second")
        total = sum(b.size for b in read_layout(v1).image.blobs)
        old = {b.digest for b in read_layout(v1).image.blobs}
        changed = sum(b.size for b in read_layout(v2).image.blobs if b.digest not in old)
        ours, theirs = start_registry(tmp / "ours"), start_registry(tmp / "theirs")
        try:
            rows = []
            for name, layout, size in (("cold", v1, total), ("warm", v2, changed)):
                report = registry.push(layout, f"{ours.host}/bench/image:{name}", insecure_http=True,
                                       chunk_size=args.chunk_mb << 20)
                seconds = skopeo_copy(layout, f"{theirs.host}/bench/image:{name}")
                rows.append((name, size, report.seconds, report.bytes_sent, seconds))
        finally:
            ours.stop()
            theirs.stop()
    print(f"{'push':<6}{'new bytes':>12}{'imagebuild s':>14}{'MB/s':>8}{'bytes sent':>12}"
          f"{'skopeo s':>10}{'MB/s':>8}")
    for name, size, ours_s, sent, theirs_s in rows:
        print(f"{name:<6}{size:>12}{ours_s:>14.2f}{size / 1e6 / ours_s:>8.0f}{sent:>12}"
              f"{theirs_s:>10.2f}{size / 1e6 / theirs_s:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
