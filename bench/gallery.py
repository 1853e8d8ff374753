"""A gallery's second image on a node that holds the first: imagebuild pushes two engine images (say the
flagship and its Hopper variant) into one repository of a loopback docker-registry, then, for each consumer
that runs here, measures the second image's pull on an empty node (the baseline, in the same run) and on a
node that already pulled the first. The layers both images hold byte for byte (the same digest) should not
travel again: the second pull must be served exactly the layers the first lacks, no more, no fewer.

    .venv/bin/python bench/gallery.py FIRST SECOND [--module sglang] [--compression gzip] [--json]

It prints which layers the two images share (named by the step that made them, from the image config's
history), what the registry stores for both against what the two cost apart, what the second push sent,
and per consumer: the second image's pull and start+import, cold and after the first, with the ratios
(after / cold). Each pass states what it saw (the registry's access log: layers and bytes served to it;
the import's mark). A cold pull not served every layer, a second pull not served a layer of its own, or an
import that did not print its mark is an error, not a number; shared layers a consumer fetched again are
reported by name (Docker 20.10 does: it keys a layer by its chain, every layer below it included).

`--compression estargz --consumers podman-partial,...` adds Podman with containers-storage's partial pulls on:
it reads each eStargz layer by range and fetches only the files no layer it holds has (by digest), so the
second pull's bytes can be under its own layers' size; its passes must be served ranges only.

Needs docker-registry, podman, ctr (containerd, here Docker's own at --containerd-address) and both images
in the engine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from imagebuild.render.markers import parse_marker  # noqa: E402  (`: imagebuild-step=install layer=kernels ...`)
from node import (MARK, Containerd, Docker, PassError, Podman, image_manifest, import_command, push,  # noqa: E402
                  served_blobs, start_registry)
from podman_store import PodmanStore  # noqa: E402  (tests/: a Podman store of its own)

REPOSITORY = "imagebuild-bench/gallery"
TAGS = ("first", "second")


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    step: str  # what made it, from the config's history


class PartialPodman(Podman):
    """Podman whose store pulls partially (containers-storage's `enable_partial_images`): an eStargz layer's
    footer and TOC by range, then only the chunks of files no layer it holds has (by digest). Its store is a
    temp folder's (tests/podman_store.py)."""

    name = "podman-partial"
    partial = True

    def __init__(self, folder: Path, driver: str, ranges_only: bool = False):
        super().__init__(folder, driver)
        self.ranges_only = ranges_only  # eStargz images: every layer must be read by range, none whole

    def empty(self) -> None:
        self.store = PodmanStore.create(partial=True, driver=self.driver)
        self.cli, self.env = self.store.command(), self.store.env

    def clean(self) -> None:
        self.store.remove()


class DockerNode(Docker):
    """Docker as a node that pulls two references: both are removed after the pass."""

    def empty(self) -> None:
        self.pulled: list[str] = []

    def pull(self, ref: str) -> None:
        self.pulled.append(ref)
        super().pull(ref)

    def refs(self) -> list[str]:
        return list(getattr(self, "pulled", []))


def step_name(created_by: str) -> str:
    """A history line as a short name: imagebuild's marker where there is one (`install layer=kernels`),
    else the instruction with its sources (`COPY requirements/1-framework.txt`), cut at 80 characters."""
    found = parse_marker(created_by)
    if found:
        return " ".join([found.kind, *(f"{key}={value}" for key, value in found.fields.items())])
    text = re.sub(r"^/bin/sh -c (#\(nop\) )?", "", created_by.strip())
    text = re.sub(r"\s+", " ", re.sub(r"\s*# buildkit$", "", text)).strip()
    if text.startswith(("COPY ", "ADD ")) and text.count(" ") >= 2:
        text = text.rsplit(" ", 1)[0]  # the sources, not where they went
    return text[:80] or "(no history)"


def layer_steps(config: dict) -> list[str]:
    """The step of each layer, in order: the history entries that made a layer (not `empty_layer`)."""
    history = config.get("history") if isinstance(config, dict) else None
    if not isinstance(history, list):
        return []
    return [step_name(str(h.get("created_by", ""))) for h in history
            if isinstance(h, dict) and not h.get("empty_layer")]


def image_layers(url: str, repo: str, tag: str) -> list[Layer]:
    """The pushed image's layers (amd64 of an index), in order, each with the step that made it."""
    top = image_manifest(url, repo, tag)
    config = requests.get(f"{url}/v2/{repo}/blobs/{top['config']['digest']}", timeout=30).json()
    steps = layer_steps(config)
    if len(steps) != len(top["layers"]):
        steps = ["?"] * len(top["layers"])  # a config whose history does not match its layers: names unknown
    return [Layer(d["digest"], d["size"], step) for d, step in zip(top["layers"], steps)]


def sharing(first: list[Layer], second: list[Layer]) -> dict:
    """What the two images share by digest, what the second holds alone, and what a registry stores."""
    held = {layer.digest for layer in first}
    shared = [layer for layer in second if layer.digest in held]
    own = [layer for layer in second if layer.digest not in held]
    unique = {layer.digest: layer.size for layer in first + second}
    apart = sum(layer.size for layer in first) + sum(layer.size for layer in second)
    return {"first": {"layers": len(first), "bytes": sum(layer.size for layer in first)},
            "second": {"layers": len(second), "bytes": sum(layer.size for layer in second)},
            "shared": {"layers": len(shared), "bytes": sum(layer.size for layer in shared),
                       "steps": [layer.step for layer in shared]},
            "second_only": {"layers": len(own), "bytes": sum(layer.size for layer in own),
                            "steps": [layer.step for layer in own]},
            "registry_stores": sum(unique.values()), "apart": apart,
            "stored_over_apart": round(sum(unique.values()) / apart, 3) if apart else None}


def check_second(consumer: str, served: set[str], first: list[Layer], second: list[Layer]) -> list[Layer]:
    """After the first image, the second pull must be served each of the second's own layers; returns the shared
    layers it was served again (Docker 20.10 keys a pulled layer by its chain, the layers below it included, so
    a shared layer above a differing one travels again; Podman and containerd take it from what they hold)."""
    held = {layer.digest for layer in first}
    own = {layer.digest for layer in second} - held
    if own - served:
        raise PassError(f"{consumer}: the second pull was not served {len(own - served)} of the second image's "
                        f"{len(own)} own layer(s): the pull failed or the node was not the first image's")
    return [layer for layer in second if layer.digest in held and layer.digest in served]


def check_second_push(blobs: list[dict], first: list[Layer], second: list[Layer]) -> int:
    """The second push (`imagebuild push --json`'s blobs) found every shared layer in the registry and sent
    each of its own; returns the layer bytes it sent."""
    held = {layer.digest for layer in first}
    actions = {b.get("digest"): b for b in blobs if isinstance(b, dict)}
    sent_again = [d for d in held if d in actions and actions[d].get("action") != "exists"]
    if sent_again:
        raise PassError(f"the second push did not find {len(sent_again)} shared layer(s) in the registry "
                        f"({sorted(sent_again)[:3]}): they were {actions[sent_again[0]].get('action')!r}")
    own = [layer.digest for layer in second if layer.digest not in held]
    not_sent = [d for d in own if actions.get(d, {}).get("action") != "uploaded"]
    if not_sent:
        raise PassError(f"the second push did not upload {len(not_sent)} of its own layer(s) ({not_sent[:3]})")
    return sum(int(actions[d].get("bytes_sent", 0)) for d in own)


def check_cold(consumer: str, what: str, served: set[str], layers: list[Layer]) -> None:
    missing = {layer.digest for layer in layers} - served
    if missing:
        raise PassError(f"{consumer}: the cold pull of the {what} image was served {len(layers) - len(missing)} "
                        f"of {len(layers)} layers: the consumer was not empty (or the pull failed)")


def timed_pull(consumer, ref: str, sizes: dict[str, int], log: Path) -> tuple[float, set[str], int]:
    """The pull's seconds, the layers it was served (whole; for a partial consumer, any part of) and the bytes."""
    offset = log.stat().st_size
    started = time.monotonic()
    consumer.pull(ref)
    seconds = time.monotonic() - started
    time.sleep(0.2)  # the access log line is written after the response
    with open(log, "rb") as f:
        f.seek(offset)
        served = served_blobs(f.read().decode(errors="replace"), sizes)
    if getattr(consumer, "partial", False):
        if served.layers and consumer.ranges_only:
            raise PassError(f"{consumer.name}: {len(served.layers)} layer(s) served whole: the partial pull did not "
                            "happen (partial pulls off, or a layer without a TOC)")
        return seconds, served.touched, served.bytes
    return seconds, served.layers, served.bytes


def started(consumer, ref: str, command: list[str]) -> tuple[float, str]:
    begun = time.monotonic()
    output = consumer.start_import(ref, command)
    if MARK not in output:
        raise PassError(f"{consumer.name}: the import did not print its mark: {output[-500:]!r}")
    return time.monotonic() - begun, output.strip().splitlines()[-1]


def measure(consumer, refs: dict[str, str], layers: dict[str, list[Layer]], log: Path, command: list[str]) -> dict:
    """The second image cold (the baseline), then the first and the second after it, each on an empty node."""
    sizes = {layer.digest: layer.size for each in layers.values() for layer in each}
    consumer.empty()
    try:
        cold_s, served, cold_bytes = timed_pull(consumer, refs["second"], sizes, log)
        check_cold(consumer.name, "second", served, layers["second"])
        cold_import, _ = started(consumer, refs["second"], command)
    finally:
        consumer.clean()
    consumer.empty()
    try:
        first_s, served, first_bytes = timed_pull(consumer, refs["first"], sizes, log)
        check_cold(consumer.name, "first", served, layers["first"])
        after_s, served, after_bytes = timed_pull(consumer, refs["second"], sizes, log)
        again = check_second(consumer.name, served, layers["first"], layers["second"])
        after_import, said_after = started(consumer, refs["second"], command)
    finally:
        consumer.clean()
    row = {"cold": {"pull_s": round(cold_s, 2), "bytes": cold_bytes, "start_import_s": round(cold_import, 2)},
           "first": {"pull_s": round(first_s, 2), "bytes": first_bytes},
           "after_first": {"pull_s": round(after_s, 2), "bytes": after_bytes, "layers": len(served),
                           "start_import_s": round(after_import, 2),
                           "shared_served_again": {"layers": len(again), "bytes": sum(x.size for x in again),
                                                   "steps": [x.step for x in again]}},
           "said": said_after}
    row["after_over_cold"] = {"bytes": round(after_bytes / cold_bytes, 3) if cold_bytes else None,
                              "pull_s": round(after_s / cold_s, 3) if cold_s else None,
                              "ready_s": round((after_s + after_import) / (cold_s + cold_import), 3)}
    print(f"  {consumer.name:10} second cold: {cold_bytes:,} B, pull {cold_s:.2f} s; after the first: "
          f"{len(served)} layers, {after_bytes:,} B, pull {after_s:.2f} s; said {said_after!r}", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="an image in the engine (the one a node already holds)")
    parser.add_argument("second", help="an image in the engine (the one the node pulls next)")
    parser.add_argument("--module", default="nvidia.cu13", help="what the container imports (the flagship: sglang)")
    parser.add_argument("--compression", default="gzip", choices=("gzip", "zstd", "estargz"))
    parser.add_argument("--consumers", default="podman,containerd,docker")
    parser.add_argument("--podman-driver", default="overlay")
    parser.add_argument("--containerd-address", default="/run/containerd/containerd.sock")
    parser.add_argument("--layer-cache", type=Path,
                        help="imagebuild's cache folder for the pushes' normalized layers (default: a temp one); "
                             "a second run of the bench then skips the exports")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    command = import_command(args.module)
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-gallery-") as tmp:
        tmp = Path(tmp)
        layer_cache = args.layer_cache or tmp / "cache"
        known = {"podman": lambda: Podman(tmp, args.podman_driver),
                 "podman-partial": lambda: PartialPodman(tmp, args.podman_driver, args.compression == "estargz"),
                 "containerd": lambda: Containerd(args.containerd_address, f"imagebuild-bench-{uuid.uuid4().hex[:6]}"),
                 "docker": DockerNode}
        consumers = [known[name]() for name in args.consumers.split(",")]
        if args.compression == "zstd" and any(not c.reads_zstd for c in consumers):
            parser.error("Docker 20.10 reads no zstd layers: leave it out of --consumers")
        server = start_registry(tmp / "registry")
        try:
            refs, layers, pushes, reports = {}, {}, {}, {}
            for tag, image in zip(TAGS, (args.first, args.second)):
                refs[tag] = f"{server.host}/{REPOSITORY}:{tag}"
                report = reports[tag] = push(image, refs[tag], args.compression, layer_cache)
                layers[tag] = image_layers(server.url, REPOSITORY, tag)
                pushes[tag] = {"image": image, "digest": report["digest"], "bytes_sent": report["bytes_sent"]}
                print(f"pushed {image} as {tag}: {report['bytes_sent']:,} B sent, {len(layers[tag])} layers",
                      file=sys.stderr)
            shared = sharing(layers["first"], layers["second"])
            pushes["second"]["layer_bytes_sent"] = check_second_push(reports["second"]["blobs"], layers["first"],
                                                                    layers["second"])
            results = {c.name: measure(c, refs, layers, server.log, command) for c in consumers}
        finally:
            server.stop()
            for consumer in consumers:
                getattr(consumer, "close", lambda: None)()
    out = {"first": args.first, "second": args.second, "compression": args.compression, "module": args.module,
           "pushed": pushes, "sharing": shared, "consumers": results,
           "layers": {tag: [[layer.step, layer.size, layer.digest] for layer in each] for tag, each in layers.items()}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"shared: {shared['shared']['layers']} layers, {shared['shared']['bytes']:,} B "
          f"({', '.join(shared['shared']['steps'])})")
    print(f"the second's own: {shared['second_only']['layers']} layers, {shared['second_only']['bytes']:,} B "
          f"({', '.join(shared['second_only']['steps'])})")
    print(f"registry stores {shared['registry_stores']:,} B for both, {shared['apart']:,} B apart "
          f"({shared['stored_over_apart']}); the second push sent {pushes['second']['layer_bytes_sent']:,} B of layers")
    print(f"{'consumer':<11}{'cold bytes':>15}{'cold pull s':>12}{'after bytes':>15}{'after pull s':>13}"
          f"{'after/cold: bytes, pull, ready':>32}")
    for name, row in results.items():
        r = row["after_over_cold"]
        print(f"{name:<11}{row['cold']['bytes']:>15,}{row['cold']['pull_s']:>12.2f}{row['after_first']['bytes']:>15,}"
              f"{row['after_first']['pull_s']:>13.2f}{'':>6}{r['bytes']}, {r['pull_s']}, {r['ready_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
