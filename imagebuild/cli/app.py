"""The `imagebuild` command: a thin layer over imagebuild.flows.

Exit codes: 0 ok, 1 findings with errors / failed build / failed smoke test, 2 bad input,
3 engine or host tool unavailable. Every report has --json (stdout); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from imagebuild import __version__, flows
from imagebuild.cli.examples import HelpFormatter, epilog
from imagebuild.cli.options import compression_option, engine_option, gpus_chosen, gpus_options
from imagebuild.cli.output import (JsonProgress, Progress, line, make_console, print_base_moves, print_error, print_findings,
                                   print_package_moves, print_patch_results, print_smoke)
from imagebuild.engine.contract import BuildCache
from imagebuild.errors import EXIT_FAILED, EXIT_OK, FindingsFailed, ImagebuildError, SmokeFailed
from imagebuild.flows.kernels import summary as kernel_summary
from imagebuild.flows.by_lock import RegistryTarget
from imagebuild.recipe.model import image_ref_problem
from imagebuild.registry import Connection

# Command groups that live beside their stage: each module's add_commands(command) adds subparsers
# whose defaults carry handler=fn(args, out, err) -> exit code.
EXTENSIONS: tuple[str, ...] = ("imagebuild.cli.publish", "imagebuild.cli.lxc", "imagebuild.cli.repro",
                               "imagebuild.cli.doctor", "imagebuild.cli.cache", "imagebuild.cli.lockdiff",
                               "imagebuild.cli.adopt")


def registry_ref(text: str) -> str:
    """--cache-from/--cache-to HOST[:PORT]/REPO[:TAG]: a registry host is never guessed."""
    from imagebuild.registry import parse_reference
    try:
        parse_reference(text)
    except ImagebuildError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def upgrade_spec(text: str) -> tuple[str, str | None]:
    from imagebuild.recipe.pins import parse_upgrade
    try:
        return parse_upgrade(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def image_ref(text: str) -> str:
    """--tag NAME:TAG, checked with the recipe's own rules for [image] name and tag."""
    problem = image_ref_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return text


class UsageError(ImagebuildError):
    """Arguments argparse refused; the parser that refused them prints the usage."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        self.parser = parser
        super().__init__(f"{parser.prog}: {message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting, so that --json still gets its error object
        raise UsageError(self, message)


def _parser(command_name: str | None = None) -> argparse.ArgumentParser:
    """All commands; for a core command, only the core (the command groups' imports cost time)."""
    parser = _Parser(prog="imagebuild", description=(
        "Build reproducible GPU ML container images: recipe -> check -> lock -> render -> build -> smoke."))
    parser.add_argument("--version", action="version", version=f"imagebuild {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_, description=help_, epilog=epilog(name),
                             formatter_class=HelpFormatter)
        cmd.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
        if name in CORE_COMMANDS:
            cmd.set_defaults(handler=CORE_COMMANDS[name])
        return cmd

    cmd = command("check", "validate a recipe and print compatibility findings (no build); with its lock, "
                           "whether the lock is fresh and which base packages have updates waiting")
    cmd.add_argument("recipe", type=Path)
    cmd.add_argument("--lock", type=Path, help="lock path (default: lockfiles/NAME.lock beside recipes/)")

    cmd = command("lock", "resolve a recipe into lockfiles/NAME.lock (every wheel hashed)")
    cmd.add_argument("recipe", type=Path)
    cmd.add_argument("--lock", type=Path, help="lock path (default: lockfiles/NAME.lock beside recipes/)")
    cmd.add_argument("--upgrade-base", action="store_true",
                     help="move the Debian base to its suites' current state (security fixes included), "
                          "keeping every Python pin, and print what moved")
    cmd.add_argument("--upgrade", action="store_true",
                     help="resolve every Python package afresh (within exclude_newer) instead of keeping the "
                          "old lock's versions where the recipe still allows them, and print what moved")
    cmd.add_argument("--upgrade-package", action="append", default=[], type=upgrade_spec, metavar="NAME[==VERSION]",
                     help="move this [python].requirements pin in the recipe in place (no version: the newest "
                          "that resolves with the rest), relock, and print the lock diff (repeatable)")

    cmd = command("render", "write the Dockerfile and build context to inspect")
    cmd.add_argument("recipe", type=Path)
    cmd.add_argument("-o", "--out", type=Path, required=True, help="output folder (replaced)")
    cmd.add_argument("--lock", type=Path)
    cmd.add_argument("--relock", action="store_true", help="refresh the lock first")
    cmd.add_argument("--platform", choices=["amd64", "arm64"],
                     help="which platform's context, for a recipe with [platforms]")

    cmd = command("build", "build the image on the engine, smoke-test it, then tag it")
    cmd.add_argument("recipe", type=Path)
    cmd.add_argument("--lock", type=Path)
    cmd.add_argument("--relock", action="store_true", help="refresh a stale or missing lock first")
    cmd.add_argument("--no-smoke", action="store_true", help="tag without running the smoke test")
    cmd.add_argument("--keep-failed", action="store_true",
                     help="keep the image when the smoke test fails, under its hold name "
                          "(imagebuild-hold/…), not the recipe's tag")
    cmd.add_argument("--ca-bundle", help="CA roots for a TLS-intercepting proxy, passed as a build "
                     "secret (default: $IMAGEBUILD_CA_BUNDLE, $SSL_CERT_FILE, Debian's bundle)")
    engine_option(cmd)
    gpus_options(cmd, "smoke-test")
    cmd.add_argument("--accept-unknown", action="store_true",
                     help="tag even when a smoke check ended unknown (nothing proved it); the report lists them. "
                          "The recipe's [smoke] accept_unknown accepts checks by name instead")
    cmd.add_argument("--rebuild", action="store_true",
                     help="build even when the engine holds an image built from this very lock")
    cmd.add_argument("--tag", metavar="NAME:TAG", type=image_ref,
                     help="tag the image NAME:TAG instead of the recipe's [image] name and tag")
    cmd.add_argument("--registry", metavar="HOST[:PORT]/REPO",
                     help="build by lock there too: an image pushed for this lock (tag lock-<sha256>) is "
                          "found by a manifest HEAD and tagged, with no build and no download; otherwise the "
                          "smoke-tested image is pushed under the recipe's tag and its lock tag")
    cmd.add_argument("--cache-from", metavar="HOST[:PORT]/REPO[:TAG]", type=registry_ref, action="append",
                     default=[], help="take unchanged layers from this build cache (repeatable; a missing "
                                      "one is skipped). The engine's daemon pulls them itself")
    cmd.add_argument("--cache-to", metavar="HOST[:PORT]/REPO[:TAG]", type=registry_ref,
                     help="leave this build's layers there for the next runner's --cache-from")
    cmd.add_argument("--registry-ca-cert", metavar="PATH",
                     help="CA that signed the certificate of --registry and --cache-to")
    compression_option(cmd, "the layers --registry pushes (under lock-<sha256>-zstd for zstd)")
    cmd.add_argument("--insecure-http", action="store_true",
                     help="plain HTTP to --registry and --cache-to, only for a registry on this machine")

    cmd = command("smoke", "re-run the in-image smoke test of a built image")
    cmd.add_argument("image")
    engine_option(cmd)
    gpus_options(cmd, "run")

    cmd = command("patches", "check that a recipe's patches apply to the locked or another release")
    cmd.add_argument("recipe", type=Path)
    cmd.add_argument("--version", action="append", default=[], metavar="PACKAGE==VERSION",
                     help="check against this release instead of the locked one (repeatable)")
    cmd.add_argument("--latest", action="store_true", help="check against the newest release")

    if command_name not in CORE_COMMANDS:
        for module in EXTENSIONS:
            importlib.import_module(module).add_commands(command)
    return parser


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    return args.handler(args, out, err)


def progress_for(args: argparse.Namespace, err: Console):
    """Progress on stderr: a spinner for people, JSON lines beside --json."""
    return JsonProgress(err.file) if args.json else Progress(err)


def check_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    progress = progress_for(args, err)
    with progress.spinning("checking"):
        report = flows.check(args.recipe, lock_path=args.lock, progress=progress)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_findings(out, report.findings)
        out.print(line(report.recipe, f": {'ok' if report.ok else 'errors found'} "
                                      f"({len(report.findings)} finding(s))"))
    return EXIT_OK if report.ok else EXIT_FAILED


def lock_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.upgrade_package:
        return upgrade_package_command(args, out, err)
    progress = progress_for(args, err)
    with progress.spinning("locking"):
        report = flows.lock(args.recipe, lock_path=args.lock, upgrade_base=args.upgrade_base,
                            upgrade=args.upgrade, progress=progress)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_findings(out, report.findings)
        print_base_moves(out, report.base_moves, asked=args.upgrade_base)
        print_package_moves(out, report.package_moves, asked=args.upgrade)
        for name, entry in (report.platforms or {}).items():
            out.print(line(f"  {name}: {entry['packages']} wheels for ", entry["python_platform"]))
        print_lock_summary(out, report)
    return EXIT_OK


def upgrade_package_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """`lock --upgrade-package`: the pins moved in the recipe, relocked, and the lock diff."""
    if args.upgrade_base:
        raise ImagebuildError("--upgrade-package and --upgrade-base: move the pins and the base in two locks, "
                              "so each diff says what one move did")
    if args.upgrade:
        raise ImagebuildError("--upgrade-package and --upgrade: --upgrade already moves every package; "
                              "give one of them")
    progress = progress_for(args, err)
    with progress.spinning("moving pins"):
        report, diff, moved = flows.upgrade_packages(args.recipe, args.upgrade_package, lock_path=args.lock,
                                                     progress=progress)
    if args.json:
        out.print_json(data={**report.to_dict(), "upgraded": moved, "diff": diff.to_dict() if diff else None})
        return EXIT_OK
    from imagebuild.cli.lockdiff import print_diff
    print_findings(out, report.findings)
    for pin in moved:
        out.print(line(report.recipe, f": {pin['name']} {pin['old'] or '(not locked)'} -> {pin['new']}"))
    if diff is not None:
        print_diff(out, diff)
    print_lock_summary(out, report)
    return EXIT_OK


def render_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    progress = progress_for(args, err)
    with progress.spinning("rendering"):
        path = flows.render(args.recipe, args.out, lock_path=args.lock, relock=args.relock,
                            platform=args.platform, progress=progress)
    if args.json:
        out.print_json(data={"context": str(path), "dockerfile": str(path / "Dockerfile")})
    else:
        out.print(line("build context written to ", str(path), " (Dockerfile: ", str(path / "Dockerfile"), ")"))
    return EXIT_OK


def patches_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.flows.patches import parse_pins, patches
    progress = progress_for(args, err)
    with progress.spinning("downloading the releases to check"):
        report = patches(args.recipe, versions=parse_pins(args.version), latest=args.latest)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_patch_results(out, report.results)
    return EXIT_OK if report.ok else EXIT_FAILED


def build_options(args: argparse.Namespace, progress) -> flows.BuildOptions:
    """build's flags as the build flow's one options value."""
    connection = Connection(ca_cert=args.registry_ca_cert, insecure_http=args.insecure_http)
    registry = RegistryTarget(args.registry, connection, args.compression) if args.registry else None
    cache = BuildCache(tuple(args.cache_from), args.cache_to, insecure_http=args.insecure_http) \
        if args.cache_from or args.cache_to else None
    return flows.BuildOptions(lock_path=args.lock, relock=args.relock, run_smoke=not args.no_smoke,
                              ca=args.ca_bundle, keep_failed=args.keep_failed, gpus=gpus_chosen(args),
                              accept_unknown=args.accept_unknown, tag=args.tag, rebuild=args.rebuild,
                              registry=registry, cache=cache, connection=connection, progress=progress)


def build_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.engine import default_engine
    progress = progress_for(args, err)
    engine = default_engine(args.engine)
    options = build_options(args, progress)
    with progress.spinning("building"):
        report = flows.build(args.recipe, engine, options)
    if args.json:
        out.print_json(data=report.to_dict())
    elif isinstance(report, flows.PlatformsBuildReport):
        print_findings(out, report.findings)
        for arch, one in report.platforms.items():
            out.print(line((f"linux/{arch}", "bold")))
            print_build(out, one)
        if report.native:
            out.print(line("tagged ", report.image, f" (linux/{report.native}, this machine's platform)"))
    else:
        print_findings(out, report.findings)
        print_build(out, report)
    return EXIT_OK


def smoke_command(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.engine import default_engine
    progress = progress_for(args, err)
    engine = default_engine(args.engine)
    with progress.spinning("smoke test"):
        report = flows.smoke(args.image, engine, gpus=gpus_chosen(args), progress=progress)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_smoke(out, report.report)
        out.print(line(args.image, f": smoke {'passed' if report.ok else 'FAILED'}"))
    return EXIT_OK if report.ok else EXIT_FAILED


# The core commands, each a handler fn(args, out, err) -> exit code over one flow; the command groups
# in EXTENSIONS set theirs in add_commands.
CORE_COMMANDS = {"check": check_command, "lock": lock_command, "render": render_command, "build": build_command,
                 "smoke": smoke_command, "patches": patches_command}


def print_lock_summary(out, report) -> None:
    out.print(line(report.lock_path, f": {report.packages} wheels, "
                                     f"{'written' if report.changed else 'unchanged'} in {report.seconds:.1f} s"))


def print_build(out, report) -> None:
    """One image's build: its smoke result, where it is, how long each step took."""
    if report.smoke:
        out.print(line(f"smoke test{' (cached result for this image id)' if report.smoke.cached else ''}:"))
        print_smoke(out, report.smoke.report)
    times = ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
    out.print(line(("reused" if report.reused else "built", "green"), " ", report.image, "  ", report.image_id,
                   f"  {report.size / 1e9:.2f} GB  ({times})" if report.size else f"  ({times})"))
    if report.kernels:
        out.print(line(kernel_summary(report.kernels)))
    if report.registry:
        out.print(line("registry: ", report.registry["reference"], "@", report.registry["digest"],
                       " (pushed, and as " if report.registry["pushed"] else " (found as ",
                       report.registry["lock_reference"], ")"))
    if report.cache and report.cache["to"]:
        out.print(line("build cache: ", report.cache["to"],
                       *(("@", report.cache["digest"]) if report.cache["digest"] else ()),
                       f" (written by {report.cache['written_by']})"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    out = make_console()
    err = make_console(stderr=True)
    try:
        args = _parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    except UsageError as error:
        if "--json" in argv:
            print(json.dumps(error_object(error), indent=2, sort_keys=True))
        else:
            error.parser.print_usage(sys.stderr)
            print_error(err, error)
        return error.exit_code
    try:
        return run(args, out, err)
    except ImagebuildError as error:
        if getattr(args, "json", False):
            print(json.dumps(error_object(error), indent=2, sort_keys=True))
        else:
            if isinstance(error, SmokeFailed) and error.report:
                print_smoke(err, error.report)
            print_error(err, error)
        return error.exit_code
    except KeyboardInterrupt:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": "Interrupted", "message": "interrupted"}, indent=2))
        err.print(line(("interrupted", "red")))
        return 130
    except Exception as error:  # noqa: BLE001 -- a bug of ours: still one error object, never silence
        if os.environ.get("IMAGEBUILD_DEBUG") == "1":
            raise
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": "InternalError", "type": type(error).__name__,
                              "message": str(error)}, indent=2, sort_keys=True))
        err.print(line(("internal error:", "red"), f" {type(error).__name__}: ", str(error)))
        err.print(line(("  this is a bug in imagebuild; IMAGEBUILD_DEBUG=1 shows the traceback", "dim")))
        return EXIT_FAILED


def error_object(error: ImagebuildError) -> dict:
    """What --json prints for an error: its type, message and structured details."""
    payload = {"ok": False, "error": type(error).__name__, "message": str(error), **error.details()}
    if isinstance(error, FindingsFailed):
        payload["findings"] = [f.to_dict() for f in error.findings]
    if isinstance(error, SmokeFailed) and error.report:
        payload["probe"] = error.report
    return payload


if __name__ == "__main__":
    sys.exit(main())
