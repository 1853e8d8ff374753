"""`imagebuild push`: the publish stage's command, a thin layer over imagebuild.registry.push."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rich.console import Console

from imagebuild.cli.options import compression_option
from imagebuild.cli.output import line
from imagebuild.errors import EXIT_OK
from imagebuild.flows.publish import publish
from imagebuild.registry import DEFAULT_CHUNK, Connection, PushOptions

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def byte_size(text: str) -> int:
    """`64M`, `512k`, `1G` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?)i?b?\s*", text.lower())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 64M, 512k or 1G")
    return int(match.group(1)) * _UNITS[match.group(2)]


def add_commands(command) -> None:
    cmd = command("push", "push an image (an OCI layout folder or an engine image) to a registry; "
                          "prints the pushed digest (an image index: with each platform's manifest)")
    cmd.add_argument("source", help="an OCI image layout directory, or an image in the engine")
    cmd.add_argument("reference", help="where to: HOST[:PORT]/REPOSITORY[:TAG]")
    cmd.add_argument("--ca-cert", type=Path, metavar="PATH",
                     help="CA that signed the registry's certificate (default: $REQUESTS_CA_BUNDLE, "
                          "$SSL_CERT_FILE, the system's roots)")
    cmd.add_argument("--insecure-http", action="store_true",
                     help="plain HTTP, only for a registry on this machine (localhost, 127.0.0.1, ::1)")
    cmd.add_argument("--mount-from", action="append", default=[], metavar="REPO",
                     help="a repository of the same registry that may hold the layers: they are "
                          "mounted, not uploaded (repeatable; pushes remember where blobs went too)")
    cmd.add_argument("--digest-file", type=Path, metavar="PATH",
                     help="write the pushed manifest digest there (for CI)")
    cmd.add_argument("--layout-name", metavar="NAME",
                     help="the image to push from a layout holding several "
                          "(org.opencontainers.image.ref.name)")
    cmd.add_argument("--chunk-size", type=byte_size, default=DEFAULT_CHUNK, metavar="SIZE",
                     help=f"layers larger than this go up in resumable chunks of it "
                          f"(default {DEFAULT_CHUNK >> 20}M)")
    compression_option(cmd, "an engine image's layers")
    cmd.add_argument("--prefetch-import", metavar="MODULES", type=lambda text: tuple(text.split(",")), default=(),
                     help="with --compression estargz: import these modules (comma-separated) in the image first "
                          "and put the files they read at the front of each layer, for a lazy consumer to "
                          "prefetch as it mounts the image")
    cmd.add_argument("--retries", type=int, default=5,
                     help="retries of a request after 5xx, 429 or a lost connection (default 5)")
    cmd.set_defaults(handler=run_push)


def run_push(args: argparse.Namespace, out: Console, err: Console) -> int:
    def progress(text: str) -> None:
        err.print(line(("›", "bold cyan"), " ", text))

    connection = Connection(ca_cert=args.ca_cert, insecure_http=args.insecure_http, retries=args.retries)
    options = PushOptions(layout_name=args.layout_name, mount_from=args.mount_from, chunk_size=args.chunk_size)
    report = publish(args.source, args.reference, connection, options, compression=args.compression,
                     progress=progress, prefetch_import=args.prefetch_import)
    if args.digest_file:
        args.digest_file.write_text(report.digest + "\n")
    if args.json:
        out.print_json(data=report.to_dict())
        return EXIT_OK
    counts = {a: sum(b.action == a for b in report.blobs) for a in ("uploaded", "mounted", "exists")}
    out.print(line(f"blobs: {counts['uploaded']} uploaded, {counts['mounted']} mounted, "
                   f"{counts['exists']} already there; {report.bytes_sent} bytes sent in {report.seconds:.1f} s"))
    for entry in report.platforms:
        out.print(line("  ", entry["platform"] or "(no platform)", "  ", entry["digest"]))
    if report.lock_tag:
        out.print(line("also tagged ", report.lock_tag, ": built here from that lock and smoke-tested; "
                       "the smoke report is attached to it"))
    out.print(line(report.pinned))
    return EXIT_OK
