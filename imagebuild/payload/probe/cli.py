"""The probe's command line: run every check against an expect file, or (--doctor) diagnose.

    probe [--expect PATH] [--workdir DIR] [--skip-compile] [--only CHECK ...]
    probe --doctor [--driver-file PATH]
    probe --inventory [--driver-file PATH]   (what the environment holds, for `imagebuild adopt`)
    probe --waste ARCH [--site DIR]      (prune candidates for GPU arch ARCH, e.g. 120)

prints one JSON report and exits 0 when no check failed, 1 when one did, and 2 when the expect file
is unreadable or invalid.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

from .checks.deep_gemm import check_deep_gemm_sm120
from .doctor.doctor import run_doctor
from .expect import NO_EXPECTATIONS, load_expect
from .checks.gpu_kernels import check_gpu_kernels
from .gpus import DRIVER_VERSION_FILE
from .inventory.inventory import run_inventory
from .report import FAIL, make_check, make_report
from .system import installed_distributions, parallelism
from .checks.stack import check_flashinfer_dynamo, check_gpu, check_imports, check_torch_cuda, gpu_visible
from .waste import find_waste
from .checks.zero_jit import check_aot
from .checks.toolchain import check_cuda_home, check_cuda_toolchain, check_interpreter, check_packages


CHECKS = ("interpreter", "packages", "cuda-toolchain", "cuda-home", "deep-gemm-sm120", "imports", "torch-cuda",
          "flashinfer-dynamo", "gpu", "gpu-kernels", "zero-jit")


def run_probe(expect: dict, workdir: str | None = None, skip_compile: bool = False, jobs: int | None = None,
              only: tuple = ()) -> dict:
    """Run every check (those named in `only`, when given); a check that crashes becomes a failed check,
    never a lost report.

    The checks are independent (each runs its own processes), so they run at once, and the import
    checks `jobs` modules at a time (default: the CPUs here); jobs=1 runs everything in turn."""
    jobs = jobs or parallelism()
    installed = installed_distributions()  # read once: two checks compare against it
    checks = (
        ("interpreter", lambda: check_interpreter(expect)),
        ("packages", lambda: check_packages(expect, installed)),
        ("cuda-toolchain", lambda: check_cuda_toolchain(expect, installed)),
        ("cuda-home", lambda: check_cuda_home(expect)),
        ("deep-gemm-sm120", lambda: check_deep_gemm_sm120(expect, workdir, skip_compile)),
        ("imports", lambda: check_imports(expect, workdir, jobs)),
        ("torch-cuda", lambda: check_torch_cuda(expect)),
        ("flashinfer-dynamo", lambda: check_flashinfer_dynamo(expect)),
        ("gpu", check_gpu),
    )
    checks = tuple(check for check in checks if not only or check[0] in only)

    started = time.monotonic()

    def guarded(check) -> dict:
        """The check's result, with when it started and how long it took (seconds from the probe's start)."""
        name, run = check
        began = time.monotonic()
        try:
            result = run()
        except Exception as error:
            result = make_check(name, FAIL, f"the probe itself failed: {type(error).__name__}: {error}")
        result.update(started_s=round(began - started, 1), seconds=round(time.monotonic() - began, 1))
        return result

    with ThreadPoolExecutor(max_workers=len(checks) + 1 if jobs > 1 else 1) as pool:
        futures = [pool.submit(guarded, check) for check in checks]

        def hiding_nvcc() -> list:
            # Both hide nvcc, one after the other: only the import tier, which runs no nvcc, may still be running.
            for (name, _), future in zip(checks, futures):
                if name != "imports":
                    future.result()
            last = (("gpu-kernels", lambda: check_gpu_kernels(expect, gpu_visible())),
                    ("zero-jit", lambda: check_aot(expect)))
            return [guarded(check) for check in last if not only or check[0] in only]

        last = pool.submit(hiding_nvcc)
        results = [future.result() for future in futures] + last.result()  # in the checks' order
    report = dict(make_report(results), jobs=jobs)
    if only:
        report["only"] = sorted(only)  # a report of some checks, never to be read as the whole smoke test
    return report


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check this image or host against its lock, or (--doctor) "
                                                 "diagnose a live host, venv or container.")
    parser.add_argument("--expect", help="expect.json written by the renderer")
    parser.add_argument("--workdir", help="scratch folder for kernel compiles (default: a temporary folder)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the deep_gemm SM120 compile")
    parser.add_argument("--only", action="append", choices=CHECKS, metavar="CHECK",
                        help="run this check only (repeatable): one of " + ", ".join(CHECKS))
    parser.add_argument("--jobs", type=int, help="processes at once (default: the CPUs here; 1: one check at a time)")
    parser.add_argument("--doctor", action="store_true", help="diagnose driver, CUDA toolkits, interpreter and "
                        "the ML stack as they are, without an expect file")
    parser.add_argument("--inventory", action="store_true", help="list what this environment holds (distributions, "
                        "where each came from, files changed since install, torch's CUDA, GPUs) for imagebuild adopt")
    parser.add_argument("--driver-file", default=DRIVER_VERSION_FILE,
                        help=f"the kernel module's version file (default {DRIVER_VERSION_FILE})")
    parser.add_argument("--waste", type=int, metavar="ARCH",
                        help="list what the stack cannot use on GPU arch ARCH (e.g. 120): prune candidates")
    parser.add_argument("--site", help="site-packages for --waste (default: this interpreter's)")
    args = parser.parse_args(argv)
    if args.waste is not None:
        import sysconfig
        site = args.site or sysconfig.get_paths()["purelib"]
        candidates = [c.to_dict() for c in find_waste(site, args.waste)]
        print(json.dumps({"site": site, "arch": args.waste, "candidates": candidates,
                          "bytes": sum(c["bytes"] for c in candidates)}, indent=2, sort_keys=True))
        return 0
    if args.inventory:
        try:
            report = run_inventory(args.driver_file, args.jobs if args.jobs and args.jobs > 0 else None)
        except Exception as error:  # still one report: what stopped the probe, never a bare traceback
            report = {"mode": "inventory", "format": 1, "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0 if "error" not in report else 1
    if args.doctor:
        report = run_doctor(args.driver_file)
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0 if report["ok"] else 1
    expect = NO_EXPECTATIONS
    if args.expect:
        expect, error = load_expect(args.expect)
        if error:
            report = make_report([make_check("expect", FAIL, error, path=args.expect)])
            print(json.dumps(report, indent=2, sort_keys=True))
            return 2
    report = run_probe(expect, args.workdir, args.skip_compile, args.jobs if args.jobs and args.jobs > 0 else None,
                       tuple(args.only or ()))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1
