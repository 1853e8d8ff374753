"""Time to a ready node with lazy pulling: one engine image pushed by imagebuild as gzip (the baseline, in the
same run) and as eStargz with the files `import MODULE` reads put first (`--prefetch-import MODULE`), then, on
a private containerd (Debian's 1.6) with stargz-snapshotter 0.12 (tools/stargz-grpc; tests/lazy_node.py):

    gzip     `ctr image pull` (every layer fetched and unpacked onto overlayfs), then `ctr run` the import
    estargz  `ctr-remote image rpull` (each layer mounted from its TOC), then `ctr run --snapshotter stargz`
             the import: the prioritized files come in one range per layer, the rest as it is read, and
             the rest of each layer in the background (the snapshotter's defaults)
    estargz-no-background  the same with `no_background_fetch = true`

    .venv/bin/python bench/lazy.py IMAGE [--module sglang] [--runs 1] [--json]

Each pass starts from an empty namespace and a new snapshotter, and is checked, not trusted: the import must
print its mark; a gzip pass must have been served every layer whole; an eStargz pass must have every layer
mounted remotely (the snapshotter's log) and be served ranges only. The bytes are what the registry's access
log shows served until the import printed; the snapshotter keeps fetching the rest in the background after
(its default), which is counted apart. Needs root, docker-registry, containerd, ctr-remote, the built
tools/stargz-grpc, and the image in the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from node import MARK, PassError, image_layers, import_command, push  # noqa: E402
from tests import lazy_node, registry_server  # noqa: E402

KINDS = ("gzip", "estargz")
# The snapshotter's settings for each eStargz pass: its defaults (prefetch, then the rest of each layer fetched
# in the background), and without the background fetch, which competes with the import's own reads here.
SETTINGS = {"estargz": "", "estargz-no-background": "no_background_fetch = true\n"}


def served(log_text: str, layers: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """(status, bytes) of each GET of each layer blob in an access-log excerpt."""
    return registry_server.blob_gets(log_text, layers)


def check_pass(kind: str, gets: dict[str, list[tuple[int, int]]], layers: dict[str, int], output: str,
               prepared: tuple[int, list[str]]) -> None:
    """gzip: every layer served whole, none mounted remotely; eStargz: every layer mounted remotely and
    served in ranges only; both: the import printed its mark."""
    if MARK not in output:
        raise PassError(f"{kind}: the import did not print {MARK!r}: {output[-500:]!r}")
    done, failed = prepared
    if kind == "gzip":
        whole = [d for d, size in layers.items() if (200, size) in gets[d]]
        if len(whole) != len(layers) or done:
            raise PassError(f"gzip: {len(whole)} of {len(layers)} layers served whole, {done} mounted remotely")
        return
    if done != len(layers) or failed:
        raise PassError(f"estargz: {done} of {len(layers)} layers mounted remotely; refused: {failed[:3]!r}")
    statuses = {status for g in gets.values() for status, _ in g}
    if statuses - {206}:
        raise PassError(f"estargz: the registry served whole blobs ({sorted(statuses)}), not ranges only")


def one_pass(kind: str, ref: str, layers: dict[str, int], log: Path, command: list[str]) -> dict:
    with lazy_node.running(SETTINGS.get(kind, "")) as node:
        offset = log.stat().st_size
        started = time.monotonic()
        (node.pull if kind == "gzip" else node.rpull)(ref)
        pulled = time.monotonic()
        output = node.run(ref, *command, lazy=kind != "gzip")
        ready = time.monotonic()
        time.sleep(0.2)  # the access log line is written after the response
        text = log.read_bytes()[offset:].decode(errors="replace")
        prepared, prefetched = node.prepared(), node.prefetched()
    gets = served(text, layers)
    check_pass("gzip" if kind == "gzip" else "estargz", gets, layers, output, prepared)
    served_bytes = sum(n for g in gets.values() for _, n in g)
    said = output.strip().splitlines()[-1]
    print(f"  {kind:8} pull {pulled - started:.2f} s, start+import {ready - pulled:.2f} s; served {served_bytes:,} B "
          f"by ready; {prepared[0]} layers mounted remotely; said {said!r}", file=sys.stderr)
    return {"pull_s": pulled - started, "start_import_s": ready - pulled, "ready_s": ready - started,
            "bytes_by_ready": served_bytes, "remote_layers": prepared[0], "said": said,
            "prefetch_bytes": sum(n for _, _, n in prefetched),
            "prefetch_s_longest": round(max((s for _, s, _ in prefetched), default=0.0), 2)}


def median(passes: list[dict]) -> dict:
    pick = lambda key: round(statistics.median(p[key] for p in passes), 2)
    return {"pull_s": pick("pull_s"), "start_import_s": pick("start_import_s"), "ready_s": pick("ready_s"),
            "bytes_by_ready": int(statistics.median(p["bytes_by_ready"] for p in passes)), "runs": len(passes),
            "prefetch_bytes": passes[0].get("prefetch_bytes", 0),
            "each": [[round(p["pull_s"], 2), round(p["start_import_s"], 2)] for p in passes]}


def ratio(rows: dict, kind: str = "estargz") -> dict | None:
    gz, lazy = rows.get("gzip"), rows.get(kind)
    if not (gz and lazy):
        return None
    return {key: round(lazy[key] / gz[key], 3) for key in ("bytes_by_ready", "ready_s")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", help="an image in the engine")
    parser.add_argument("--module", default="sglang", help="what the container imports (default: sglang)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    why = lazy_node.why_not()
    if why:
        raise SystemExit(f"bench/lazy.py cannot run here: {why}")
    command = import_command(args.module)
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-lazy-") as tmp:
        tmp = Path(tmp)
        server = registry_server.start_registry(tmp / "registry")
        try:
            refs, pushed, layers = {}, {}, {}
            for kind in KINDS:
                repo = f"imagebuild-bench/lazy-{kind}"
                refs[kind] = f"{server.host}/{repo}:bench"
                started = time.monotonic()
                extra = ("--prefetch-import", args.module) if kind == "estargz" else ()
                report = push(args.image, refs[kind], kind, tmp / "cache", *extra)
                layers[kind] = image_layers(server.url, repo, "bench")
                pushed[kind] = {"bytes_sent": report["bytes_sent"], "digest": report["digest"],
                                "layer_bytes": sum(layers[kind].values()),
                                "layers": len(layers[kind]), "push_s": round(time.monotonic() - started, 1),
                                **({"prefetch": report["prefetch"]} if report.get("prefetch") else {})}
                print(f"pushed {kind}: {pushed[kind]}", file=sys.stderr)
            kinds = ("gzip", *SETTINGS)
            passes = {kind: [] for kind in kinds}
            for n in range(args.runs):
                for kind in (kinds if n % 2 == 0 else kinds[::-1]):  # none always goes first
                    pushed_as = "gzip" if kind == "gzip" else "estargz"
                    passes[kind].append(one_pass(kind, refs[pushed_as], layers[pushed_as], server.log, command))
        finally:
            server.stop()
    rows = {kind: {**median(done), "said": done[-1]["said"]} for kind, done in passes.items()}
    result = {"image": args.image, "module": args.module, "runs": args.runs, "pushed": pushed, "passes": rows,
              "over_gzip": {kind: ratio(rows, kind) for kind in SETTINGS}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for kind in KINDS:
        print(f"pushed {kind}: {pushed[kind]['layer_bytes']:,} B in {pushed[kind]['layers']} layers")
    for kind, row in rows.items():
        print(f"{kind:22} pull {row['pull_s']:.2f} s, start+import {row['start_import_s']:.2f} s, ready "
              f"{row['ready_s']:.2f} s, served {row['bytes_by_ready']:,} B by ready")
    for kind, over in result["over_gzip"].items():
        if over:
            print(f"{kind}/gzip: ready {over['ready_s']}, bytes by ready {over['bytes_by_ready']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
