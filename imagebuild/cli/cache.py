"""`imagebuild cache`: what imagebuild keeps (its cache folders and the BuildKit cache mounts its
builds fill), and `--trim SIZE` to bring it under a bound. A thin layer over imagebuild.flows.caches."""

from __future__ import annotations

import argparse

from rich.console import Console

from imagebuild.cli.output import line
from imagebuild.cli.publish import byte_size
from imagebuild.errors import EXIT_OK


def add_commands(command) -> None:
    cmd = command("cache", "what imagebuild keeps (bases, .debs, wheel reads, contexts, layer blobs, smoke "
                           "results, BuildKit's uv cache mount) and, with --trim SIZE, trim it oldest first")
    cmd.add_argument("--trim", metavar="SIZE", type=byte_size,
                     help="remove imagebuild's oldest cache entries until it keeps at most SIZE (e.g. 20G)")
    cmd.add_argument("--no-engine", action="store_true", help="leave the engine's BuildKit cache mounts out")
    cmd.set_defaults(handler=run_cache)


def run_cache(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.flows import caches
    engine = None
    if not args.no_engine:
        from imagebuild.engine import default_engine
        engine = default_engine()
    report = caches.kept(args.trim, engine)
    if args.json:
        out.print_json(data=report.to_dict())
        return EXIT_OK
    for folder in report.folders:
        trimmed = f", trimmed {folder.trimmed_entries} ({folder.trimmed_bytes / 1e6:.0f} MB)" if folder.trimmed_entries else ""
        out.print(line(f"{folder.bytes / 1e6:>10.1f} MB  {folder.entries:>5} entries  ", folder.where,
                       trimmed, ("  " + folder.holds, "dim")))
    for mount in report.mounts:
        out.print(line(f"{mount['bytes'] / 1e6:>10.1f} MB  BuildKit cache mount ", mount["id"],
                       ("  " + mount["description"][:80], "dim")))
    if report.engine_silent:
        out.print(line(("no Docker engine answered: its BuildKit cache mounts are not counted", "yellow")))
    limit = f" (limit {report.limit / 1e9:.1f} GB)" if report.limit else ""
    out.print(line(f"imagebuild keeps {report.total / 1e9:.2f} GB{limit} under ", report.root))
    return EXIT_OK
