"""`imagebuild doctor`: a thin layer over imagebuild.flows.doctor."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from imagebuild.cli.options import engine_option
from imagebuild.cli.output import line, print_doctor
from imagebuild.errors import EXIT_FAILED, EXIT_OK, ImagebuildError


def add_commands(command) -> None:
    cmd = command("doctor", "diagnose a live host, venv or image: driver and GPUs, every CUDA toolkit and "
                            "which one torch, deep_gemm, FlashInfer and Triton use, CUDA versions, the "
                            "interpreter, FlashInfer's Dynamo patch, JIT caches")
    cmd.add_argument("--python", metavar="PATH",
                     help="run the probe under this interpreter (default: python3 on PATH; with --image, the "
                          "image's python3)")
    cmd.add_argument("--image", help="run the probe in a throwaway container of this image (network off)")
    engine_option(cmd)
    cmd.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="run the probe with this variable set, to try a fix before making it (repeatable)")
    cmd.add_argument("--unset", action="append", default=[], metavar="KEY",
                     help="run the probe with this variable unset (repeatable)")
    cmd.add_argument("--driver-file", metavar="PATH",
                     help="read the driver version from this file instead of /proc/driver/nvidia/version")
    cmd.set_defaults(handler=run_doctor)


def _variables(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ImagebuildError(f"--env {pair!r}: write KEY=VALUE")
        found[key] = value
    return found


def run_doctor(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.flows import doctor

    variables = _variables(args.env)
    with err.status(line("doctor: gathering facts")):
        if args.image:
            from imagebuild.engine import default_engine
            if args.driver_file:
                raise ImagebuildError("--driver-file reads a host file; with --image the container's is used")
            report = doctor.diagnose_image(args.image, default_engine(args.engine), python=args.python,
                                           env=variables, unset=args.unset)
        else:
            env = {key: value for key, value in os.environ.items() if key not in set(args.unset)}
            env.update(variables)
            report = doctor.diagnose(args.python, env=env, driver_file=args.driver_file)
    if args.json:
        out.print_json(data=report.to_dict())
        return EXIT_OK if report.ok else EXIT_FAILED
    print_doctor(out, report)
    return EXIT_OK if report.ok else EXIT_FAILED
