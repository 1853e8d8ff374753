"""Time to a ready node: one engine image pushed by imagebuild as gzip and as zstd to a loopback
docker-registry, then, for each consumer that runs here, from an empty store to the stack importing
inside a container: the pull (download and unpack, as that consumer does it) and the container's
start with its first import (`python3 -c 'import MODULE'`), each the median of --runs.

    .venv/bin/python bench/node.py IMAGE [--module nvidia.cu13] [--runs 3] [--json]

Consumers: Podman (a fresh --root per pass, overlay), containerd through `ctr` (its own namespace,
emptied after each pass) and Docker (gzip only: Docker 20.10 cannot read zstd layers; one zstd pull is
tried and its refusal recorded). Every pass states what it saw: the blob bytes and layers the registry
served to it (its access log) and the import's output. A pass whose pull was not served every layer
(the consumer had some already) or whose import did not print its mark is an error, not a number.

Needs docker-registry, podman, ctr (containerd, here Docker's own at --containerd-address) and the
image in the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from registry_server import ACCESS, start_registry  # noqa: E402  (the tests' loopback registry, as bench/push.py)

COMPRESSIONS = ("gzip", "zstd")
MARK = "imagebuild-bench-imported"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER = os.environ.get("IMAGEBUILD_DOCKER_CLI", "docker")

class PassError(RuntimeError):
    """A pass that did not measure what it claims: a partial pull, an import that did not run."""


@dataclass
class Served:
    bytes: int = 0
    layers: set[str] = field(default_factory=set)  # served whole
    touched: set[str] = field(default_factory=set)  # served anything: whole, or ranges of it (a partial pull)


def served_blobs(log_text: str, layers: dict[str, int]) -> Served:
    """The bytes and the layers (of `layers`: digest -> size) the registry's access log shows served."""
    served = Served()
    for digest, status, size in ACCESS.findall(log_text):
        if digest in layers:
            served.bytes += int(size)
            served.touched.add(digest)
            if status == "200" and int(size) == layers[digest]:
                served.layers.add(digest)
    return served


def check_pass(consumer: str, compression: str, served: Served, layers: dict[str, int], output: str) -> None:
    """A cold pull is served every layer whole; a ready node printed the import's mark."""
    missing = set(layers) - served.layers
    if missing:
        raise PassError(f"{consumer}/{compression}: the registry served {len(served.layers)} of {len(layers)} "
                        f"layers ({served.bytes:,} bytes): the consumer was not empty (or the pull failed)")
    if MARK not in output:
        raise PassError(f"{consumer}/{compression}: the import did not print {MARK!r}: {output[-500:]!r}")


def median_pass(passes: list[dict]) -> dict:
    """Median pull, start+import and their sum over one consumer's passes of one compression, and each pass's."""
    pick = lambda key: round(statistics.median(p[key] for p in passes), 2)
    return {"pull_s": pick("pull_s"), "start_import_s": pick("start_import_s"), "ready_s": pick("ready_s"),
            "bytes_pulled": passes[0]["bytes_pulled"], "layers": passes[0]["layers"], "runs": len(passes),
            "each": [[round(p["pull_s"], 2), round(p["start_import_s"], 2)] for p in passes]}  # the spread


def ratios(rows: dict[str, dict]) -> dict | None:
    """zstd over gzip for one consumer, both measured in this run; None where one side was not."""
    gz, zs = rows.get("gzip"), rows.get("zstd")
    if not (isinstance(gz, dict) and isinstance(zs, dict)):
        return None
    return {key: round(zs[key] / gz[key], 3) for key in ("bytes_pulled", "pull_s", "ready_s")}


def run(*command: str, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if proc.returncode != 0:
        raise PassError(f"{' '.join(command)} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return proc


def import_command(module: str) -> list[str]:
    code = f"import importlib, sys; m = importlib.import_module(sys.argv[1]); print({MARK!r}, m.__name__)"
    return ["python3", "-c", code, module]


# ---------------------------------------------------------------- consumers

class Podman:
    name = "podman"
    reads_zstd = True
    env = None  # the environment podman runs in (None: this process's)

    def __init__(self, folder: Path, driver: str):
        self.folder, self.driver = folder, driver

    def empty(self) -> None:
        root = self.folder / f"podman-{uuid.uuid4().hex[:8]}"
        self.runroot = tempfile.mkdtemp(prefix="ib-node-")  # podman wants a runroot path under 50 characters
        self.cli = ["podman", "--root", str(root), "--runroot", self.runroot, "--storage-driver", self.driver,
                    "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
        self.root = root

    def pull(self, ref: str) -> None:
        run(*self.cli, "pull", "-q", "--tls-verify=false", ref, env=self.env)

    def start_import(self, ref: str, command: list[str]) -> str:
        limits = ["--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024", "--network", "none"]
        return run(*self.cli, "run", "--rm", *limits, ref, *command, env=self.env).stdout

    def clean(self) -> None:
        subprocess.run([*self.cli, "rmi", "-a", "-f"], capture_output=True)
        subprocess.run([*self.cli, "system", "reset", "-f"], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.runroot, ignore_errors=True)


class Containerd:
    name = "containerd"
    reads_zstd = True

    def __init__(self, address: str, namespace: str):
        self.cli = ["ctr", "--address", address, "-n", namespace]
        self.namespace = namespace

    def empty(self) -> None:
        left = run(*self.cli, "images", "ls", "-q").stdout.split() + run(*self.cli, "snapshots", "ls").stdout.splitlines()[1:]
        if left:
            raise PassError(f"containerd namespace {self.namespace} is not empty: {left[:5]}")

    def pull(self, ref: str) -> None:
        run(*self.cli, "images", "pull", "--plain-http", ref)  # fetches and unpacks (overlayfs)

    def start_import(self, ref: str, command: list[str]) -> str:
        return run(*self.cli, "run", "--rm", ref, f"bench-{uuid.uuid4().hex[:8]}", *command).stdout

    def clean(self) -> None:
        refs = run(*self.cli, "images", "ls", "-q").stdout.split()
        if refs:
            run(*self.cli, "images", "rm", "--sync", *refs)  # the image's content and snapshots go with it

    def close(self) -> None:
        subprocess.run([*self.cli[:3], "namespaces", "rm", self.namespace], capture_output=True)


class Docker:
    name = "docker"
    reads_zstd = False  # Docker 20.10: zstd arrived in Docker 23

    def empty(self) -> None:
        pass  # the reference is new (its registry's port); the served bytes show whether layers were there

    def pull(self, ref: str) -> None:
        self._ref = ref
        run(DOCKER, "pull", "-q", ref)

    def start_import(self, ref: str, command: list[str]) -> str:
        return run(DOCKER, "run", "--rm", "--network", "none", ref, *command).stdout

    def clean(self) -> None:
        subprocess.run([DOCKER, "rmi", "-f", *self.refs()], capture_output=True)

    def refs(self) -> list[str]:
        return [self._ref] if getattr(self, "_ref", None) else []

    def cannot(self, ref: str) -> str:
        """Docker's own refusal of the zstd image, one attempt, recorded as it said it."""
        self._ref = ref
        proc = subprocess.run([DOCKER, "pull", "-q", ref], capture_output=True, text=True, check=False)
        self.clean()
        if proc.returncode == 0:
            return ""
        return (proc.stderr.strip().splitlines() or ["(no message)"])[-1]


# ---------------------------------------------------------------- one pass, the image, the table

def push(image: str, ref: str, compression: str, cache: Path, *extra: str) -> dict:
    env = {**os.environ, "IMAGEBUILD_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "imagebuild", "push", image, ref, "--insecure-http",
                           "--compression", compression, *extra, "--json"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PassError(f"imagebuild push {compression} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def image_manifest(url: str, repo: str, tag: str) -> dict:
    """The pushed image's manifest (an index's amd64 one), read back from the registry."""
    accept = {"Accept": f"{MEDIA_INDEX}, {MEDIA_MANIFEST}"}
    top = requests.get(f"{url}/v2/{repo}/manifests/{tag}", headers=accept, timeout=30).json()
    if "manifests" in top:
        amd64 = [m for m in top["manifests"] if m.get("platform", {}).get("architecture") == "amd64"]
        top = requests.get(f"{url}/v2/{repo}/manifests/{amd64[0]['digest']}", headers=accept, timeout=30).json()
    return top


def image_layers(url: str, repo: str, tag: str) -> dict[str, int]:
    """The pushed image's layers (digest -> size), read back from the registry."""
    return {layer["digest"]: layer["size"] for layer in image_manifest(url, repo, tag)["layers"]}


def one_pass(consumer, ref: str, compression: str, layers: dict[str, int], log: Path, command: list[str]) -> dict:
    consumer.empty()
    try:
        offset = log.stat().st_size
        started = time.monotonic()
        consumer.pull(ref)
        pulled = time.monotonic()
        output = consumer.start_import(ref, command)
        ready = time.monotonic()
        time.sleep(0.2)  # the access log line is written after the response
        with open(log, "rb") as f:
            f.seek(offset)
            served = served_blobs(f.read().decode(errors="replace"), layers)
    finally:
        consumer.clean()
    check_pass(consumer.name, compression, served, layers, output)
    said = output.strip().splitlines()[-1]
    print(f"  {consumer.name:10} {compression}: served {len(served.layers)} layers, {served.bytes:,} B; pull "
          f"{pulled - started:.2f} s, start+import {ready - pulled:.2f} s; said {said!r}", file=sys.stderr)
    return {"pull_s": pulled - started, "start_import_s": ready - pulled, "ready_s": ready - started,
            "bytes_pulled": served.bytes, "layers": len(served.layers), "said": said}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", help="an image in the engine")
    parser.add_argument("--module", default="nvidia.cu13",
                        help="what the container imports (default: the CUDA toolchain's nvidia.cu13; "
                             "the flagship: sglang)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumers", default="podman,containerd,docker")
    parser.add_argument("--podman-driver", default="overlay")
    parser.add_argument("--containerd-address", default="/run/containerd/containerd.sock")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    command = import_command(args.module)
    with tempfile.TemporaryDirectory(prefix="imagebuild-bench-node-") as tmp:
        tmp = Path(tmp)
        known = {"podman": lambda: Podman(tmp, args.podman_driver),
                 "containerd": lambda: Containerd(args.containerd_address, f"imagebuild-bench-{uuid.uuid4().hex[:6]}"),
                 "docker": Docker}
        consumers = [known[name]() for name in args.consumers.split(",")]
        server = start_registry(tmp / "registry")
        try:
            refs, pushed, layers = {}, {}, {}
            for kind in COMPRESSIONS:
                repo = f"imagebuild-bench/node-{kind}"
                refs[kind] = f"{server.host}/{repo}:bench"
                report = push(args.image, refs[kind], kind, tmp / "cache")
                layers[kind] = image_layers(server.url, repo, "bench")
                pushed[kind] = {"bytes_sent": report["bytes_sent"], "digest": report["digest"],
                                "layer_bytes": sum(layers[kind].values()), "layers": len(layers[kind])}
                print(f"pushed {kind}: {report['bytes_sent']:,} B, {len(layers[kind])} layers", file=sys.stderr)
            passes = {c.name: {k: [] for k in COMPRESSIONS} for c in consumers}
            results = {c.name: {} for c in consumers}
            for consumer in consumers:
                if not consumer.reads_zstd:
                    refusal = consumer.cannot(refs["zstd"])
                    results[consumer.name]["zstd"] = f"cannot: {refusal}" if refusal else "pulled (unexpected)"
            for n in range(args.runs):
                print(f"run {n + 1} of {args.runs}", file=sys.stderr)
                order = COMPRESSIONS if n % 2 == 0 else COMPRESSIONS[::-1]  # neither always goes first
                for consumer in consumers:
                    for kind in order:
                        if kind == "zstd" and not consumer.reads_zstd:
                            continue
                        passes[consumer.name][kind].append(
                            one_pass(consumer, refs[kind], kind, layers[kind], server.log, command))
        finally:
            server.stop()
            for consumer in consumers:
                getattr(consumer, "close", lambda: None)()
    for name, by_kind in passes.items():
        for kind, done in by_kind.items():
            if done:
                results[name][kind] = {**median_pass(done), "said": done[-1]["said"]}
        results[name]["zstd_over_gzip"] = ratios(results[name])
    if args.json:
        print(json.dumps({"image": args.image, "module": args.module, "runs": args.runs, "pushed": pushed,
                          "consumers": results}, indent=2))
        return 0
    for kind in COMPRESSIONS:
        print(f"pushed {kind}: {pushed[kind]['bytes_sent']:,} B sent, {pushed[kind]['layer_bytes']:,} B in "
              f"{pushed[kind]['layers']} layers")
    print(f"{'consumer':<11}{'layers':<6}{'bytes pulled':>14}{'pull s':>9}{'start+import s':>16}{'ready s':>9}")
    for name, by_kind in results.items():
        for kind in COMPRESSIONS:
            row = by_kind.get(kind)
            if isinstance(row, dict):
                print(f"{name:<11}{kind:<6}{row['bytes_pulled']:>14,}{row['pull_s']:>9.2f}"
                      f"{row['start_import_s']:>16.2f}{row['ready_s']:>9.2f}")
            elif row:
                print(f"{name:<11}{kind:<6}  {row}")
        if by_kind["zstd_over_gzip"]:
            r = by_kind["zstd_over_gzip"]
            print(f"{name:<11}zstd/gzip: bytes {r['bytes_pulled']}, pull {r['pull_s']}, ready {r['ready_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
