"""Doctor speed on a full SGLang stack: `imagebuild doctor --image` against `python -c "import torch"` in the
same image, each in a fresh container (network off), plus an empty container for the engine's own cost.

    .venv/bin/python bench/doctor.py [--image imagebuild/sglang-blackwell:0.5.23-cu130] [--runs 5]

The first run of each is the coldest (with --drop-caches, truly cold); the table shows it apart from the
median of the warm runs. Target: doctor answers in 5 s or less.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from imagebuild.flows import doctor
from imagebuild.engine import default_engine

DEFAULT_IMAGE = "imagebuild/sglang-blackwell:0.5.23-cu130"


def timed(run) -> tuple[float, object]:
    started = time.monotonic()
    result = run()
    return time.monotonic() - started, result


def drop_caches() -> bool:
    """Cold start for real: needs root; without it the first run is only as cold as it happens to be."""
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--runs", type=int, default=5, help="warm runs of each (after one cold run)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the whole machine's page cache before each cold run (root; slows everyone)")
    args = parser.parse_args()
    engine = default_engine()
    engine.check()
    if engine.inspect(args.image) is None:
        print(f"no image {args.image}: build it first (imagebuild build recipes/sglang-blackwell.toml)",
              file=sys.stderr)
        return 3
    cases = {
        "empty container (true)": lambda: engine.run(args.image, ["true"]),
        'python -c "import torch"': lambda: engine.run(args.image, ["python", "-c", "import torch"]),
        "imagebuild doctor --image": lambda: doctor.diagnose_image(args.image, engine),
    }
    results: dict[str, dict] = {}
    for name, run in cases.items():
        cold_dropped = drop_caches() if args.drop_caches else False
        cold, outcome = timed(run)
        warm = [timed(run) for _ in range(args.runs)]
        results[name] = {"cold": cold, "cold_dropped": cold_dropped, "warm": [w for w, _ in warm],
                         "last": warm[-1][1] if warm else outcome}
        print(f"  {name}: cold {cold:.2f} s, warm {', '.join(f'{w:.2f}' for w, _ in warm)} s", file=sys.stderr)

    report = results["imagebuild doctor --image"]["last"]
    torch_import = results['python -c "import torch"']
    print(f"\nimage {args.image}; {args.runs} warm runs each (median), one cold run "
          f"({'page cache dropped first' if results['empty container (true)']['cold_dropped'] else 'page cache kept'})")
    print(f"{'':28} {'cold s':>8} {'warm s':>8}")
    for name, result in results.items():
        print(f"{name:28} {result['cold']:8.2f} {statistics.median(result['warm']):8.2f}")
    doctor_warm = statistics.median(results["imagebuild doctor --image"]["warm"])
    empty_warm = statistics.median(results["empty container (true)"]["warm"])
    torch_warm = statistics.median(torch_import["warm"])
    print(f"\ndoctor / import torch: {doctor_warm / torch_warm:.2f} warm, "
          f"{results['imagebuild doctor --image']['cold'] / torch_import['cold']:.2f} cold")
    print(f"minus the empty container: doctor {doctor_warm - empty_warm:.2f} s, import torch "
          f"{torch_warm - empty_warm:.2f} s")
    print(f"the probe measured itself in the container: {report.probe_seconds} s; "
          f"{len(report.findings)} findings, {len(report.errors)} errors")
    target_met = max(doctor_warm, results["imagebuild doctor --image"]["cold"]) <= 5
    print(f"target (<= 5 s, cold and warm): {'met' if target_met else 'MISSED'}")
    return 0 if target_met else 1


if __name__ == "__main__":
    sys.exit(main())
