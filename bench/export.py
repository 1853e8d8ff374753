"""Export throughput: `imagebuild export-lxc` against a raw `docker export | zstd -T0` of the same
image in the same run, with the peak RSS of each (all its processes together, sampled every 20 ms;
the engine's own work is the same for both and not counted). Optionally a third row: the raw stream
compressed by the `zstandard` package with threads, to compare with the zstd CLI the export uses.

    .venv/bin/python bench/export.py [IMAGE] [--runs 3] [--zstandard-path DIR] [--json]

IMAGE defaults to imagebuild/cuda-toolchain:13.0 (`imagebuild build recipes/cuda-toolchain.toml`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPORT = "import sys, imagebuild.cli.app as c; sys.exit(c.main(sys.argv[1:]))"
ZSTANDARD = ("import sys, zstandard\n"
             "with zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(sys.stdout.buffer) as w:\n"
             "    while block := sys.stdin.buffer.read(1 << 20): w.write(block)")


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return pids


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(command: list[str], env: dict | None = None) -> dict:
    """Wall time and the peak of the summed RSS of command's process tree."""
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_rss(p) for p in _tree(proc.pid)))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    seconds = time.monotonic() - started
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"seconds": seconds, "peak_rss": peak[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", nargs="?", default="imagebuild/cuda-toolchain:13.0")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--zstandard-path", help="a folder holding the zstandard package "
                        "(e.g. `uv pip install --target DIR zstandard`) for the third row")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    container = subprocess.run(["docker", "create", args.image, "/bench"], capture_output=True,
                               text=True, check=True).stdout.strip()
    rows: dict[str, list[dict]] = {"raw docker export | zstd -T0": [], "imagebuild export-lxc": []}
    if args.zstandard_path:
        rows["raw docker export | zstandard threads"] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-export-") as scratch:
            raw, ours, zs = Path(scratch) / "raw.tar.zst", Path(scratch) / "t.tar.zst", Path(scratch) / "zs.zst"
            commands = {
                "raw docker export | zstd -T0": (
                    ["sh", "-c", f"docker export {container} | zstd -T0 -q -c > {raw}"], None, raw),
                "imagebuild export-lxc": (
                    [sys.executable, "-c", EXPORT, "export-lxc", args.image, "-o", str(ours)], None, ours),
                "raw docker export | zstandard threads": (
                    ["sh", "-c", f"docker export {container} | {sys.executable} -c {shlex.quote(ZSTANDARD)} "
                     f"> {zs}"], {**os.environ, "PYTHONPATH": args.zstandard_path or ""}, zs),
            }
            for run in range(args.runs):
                order = list(rows) if run % 2 == 0 else list(reversed(rows))  # alternate who goes first
                for name in order:
                    command, env, out = commands[name]
                    result = measure(command, env)
                    result["size"] = out.stat().st_size
                    out.unlink()
                    rows[name].append(result)
                    print(f"run {run + 1} {name}: {result['seconds']:.1f} s, "
                          f"{result['peak_rss'] / 2**20:.0f} MiB", file=sys.stderr)
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)

    summary = {name: {key: statistics.median(r[key] for r in results)
                      for key in ("seconds", "peak_rss", "size")} for name, results in rows.items()}
    info = json.loads(subprocess.run(["docker", "image", "inspect", args.image], capture_output=True,
                                     text=True, check=True).stdout)[0]
    raw_row, ours_row = summary["raw docker export | zstd -T0"], summary["imagebuild export-lxc"]
    ratios = {"time": ours_row["seconds"] / raw_row["seconds"],
              "peak_rss": ours_row["peak_rss"] / raw_row["peak_rss"],
              "size": ours_row["size"] / raw_row["size"]}
    if args.json:
        print(json.dumps({"image": args.image, "image_bytes": info["Size"], "runs": args.runs,
                          "cpus": os.cpu_count(), "median": summary, "ratios_ours_to_raw": ratios},
                         indent=2))
        return 0
    print(f"{args.image}: {info['Size'] / 1e9:.2f} GB, {os.cpu_count()} CPUs, median of {args.runs}")
    for name, row in summary.items():
        print(f"  {name:40s} {row['seconds']:6.1f} s  {info['Size'] / row['seconds'] / 1e6:6.0f} MB/s  "
              f"peak RSS {row['peak_rss'] / 2**20:5.0f} MiB  {row['size'] / 1e6:5.0f} MB")
    print(f"ours / raw: time x{ratios['time']:.2f}, peak RSS x{ratios['peak_rss']:.2f}, "
          f"size x{ratios['size']:.3f}")
    print(f"throughput ours / raw: {1 / ratios['time']:.2f}x (target >= 0.8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
