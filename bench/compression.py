"""gzip against zstd layers for one engine image: `export-oci`'s time (no layer cache), the layers' bytes
(what a push sends and a node pulls), and the time to decompress them all (what a node spends unpacking,
one core, as containerd and Podman do per layer), each the median of --runs.

    .venv/bin/python bench/compression.py IMAGE [--runs 3] [--json]

Needs the zstd CLI (scripts/host.sh installs it) and the image in the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from imagebuild.engine import default_engine
from imagebuild.image import export
from imagebuild.image.layout import layer_stream, read_image

_CHUNK = 1 << 20


def unpack_seconds(layout: Path) -> float:
    """Every layer of the layout decompressed (into nothing), as a node's unpack reads it."""
    image = read_image(layout)
    started = time.monotonic()
    for desc in image.layers:
        with layer_stream(image, desc) as plain:
            while plain.read(_CHUNK):
                pass
    return time.monotonic() - started


def measure(engine, image: str, compression: str, runs: int, folder: Path) -> dict:
    exports, unpacks, digests, result = [], [], set(), None
    for n in range(runs):
        out = folder / f"{compression}-{n}"
        started = time.monotonic()
        result = export.export_layout(engine, image, out, compression=compression, cache=False)
        exports.append(time.monotonic() - started)
        unpacks.append(unpack_seconds(out))
        digests.add(result.manifest_digest)
    return {"compression": compression, "manifest": result.manifest_digest, "runs": runs,
            "layer_bytes": sum(d.size for d in result.layers), "layers": len(result.layers),
            "export_s": round(statistics.median(exports), 2), "unpack_s": round(statistics.median(unpacks), 2),
            "reproducible": len(digests) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    engine = default_engine()
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        rows = [measure(engine, args.image, kind, args.runs, Path(tmp)) for kind in ("gzip", "zstd")]
    gz, zs = rows
    ratios = {"bytes": round(zs["layer_bytes"] / gz["layer_bytes"], 3),
              "export": round(zs["export_s"] / gz["export_s"], 3),
              "unpack": round(zs["unpack_s"] / gz["unpack_s"], 3)}
    if args.json:
        print(json.dumps({"image": args.image, "rows": rows, "zstd_over_gzip": ratios}, indent=2))
        return 0
    for row in rows:
        print(f"{row['compression']:5} {row['layer_bytes']:>13,} B in {row['layers']} layers  export "
              f"{row['export_s']:6.2f} s  unpack {row['unpack_s']:6.2f} s  {row['manifest']}")
    print(f"zstd/gzip: bytes {ratios['bytes']}, export {ratios['export']}, unpack {ratios['unpack']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
