"""The reproducibility commands: export-oci, verify, diff, sbom (registered through cli.EXTENSIONS), each a
handler over one flow of imagebuild.flows.repro.

Each handler is fn(args, out, err) -> exit code: 0 ok, 1 a mismatch or a difference; errors raise
ImagebuildError and the CLI maps them to their exit codes.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from imagebuild.cli.options import compression_option, engine_option
from imagebuild.cli.output import line
from imagebuild.engine import default_engine
from imagebuild.errors import EXIT_FAILED, EXIT_OK
from imagebuild.flows import repro
from imagebuild.render import paths


def add_commands(command) -> None:
    cmd = command("export-oci", "write an image as a deterministic OCI layout (with its SBOM attached); "
                                "several images, one per platform, as one multi-platform image index")
    cmd.add_argument("image", nargs="+",
                     help="engine image reference or id; several: one per platform (NAME:TAG-amd64 "
                          "NAME:TAG-arm64), written under one OCI image index")
    cmd.add_argument("-o", "--out", type=Path, required=True, help="layout folder (replaced)")
    cmd.add_argument("--lock", type=Path,
                     help="the image's lock (default: the one inside the image); only with one image: "
                          f"several images each use their own {paths.LOCK}")
    cmd.add_argument("--ref-name", help="the layout's ref name (default: the image's tag; several images: "
                                        "their tag without its -ARCH suffix)")
    cmd.add_argument("--no-sbom", action="store_true", help="write no SBOM")
    compression_option(cmd, "the layers")
    engine_option(cmd)
    cmd.set_defaults(handler=export_command)

    cmd = command("verify", "check an image against its lock: labels, versions, RECORD hashes, patches")
    cmd.add_argument("image", help="engine image, or an OCI layout (oci:DIR)")
    cmd.add_argument("--lock", type=Path, required=True)
    engine_option(cmd)
    cmd.set_defaults(handler=verify_command)

    cmd = command("diff", "name the first files that differ between two images")
    cmd.add_argument("a", help="engine image, or an OCI layout (oci:DIR)")
    cmd.add_argument("b")
    cmd.add_argument("--raw", action="store_true",
                     help="compare mtimes as they are (default: clamped to the lock epoch, as export-oci does)")
    cmd.add_argument("--limit", type=int, default=20, help="how many differing files to list")
    engine_option(cmd)
    cmd.set_defaults(handler=diff_command)

    cmd = command("sbom", "write a CycloneDX 1.5 SBOM for an image, from its lock")
    cmd.add_argument("image", help="engine image, or an OCI layout (oci:DIR; the SBOM is attached to it)")
    cmd.add_argument("-o", "--out", type=Path, required=True, help="SBOM file (.cdx.json)")
    cmd.add_argument("--lock", type=Path, help="the image's lock (default: the one inside the image)")
    engine_option(cmd)
    cmd.set_defaults(handler=sbom_command)


def export_command(args, out: Console, err: Console) -> int:
    engine = default_engine(args.engine)
    with err.status(line("exporting ", " ".join(args.image))):
        report = repro.export_oci(engine, args.image, args.out, lock=args.lock, ref_name=args.ref_name,
                                  with_sbom=not args.no_sbom, compression=args.compression)
    if args.json:
        out.print_json(data=report.to_dict())
    elif isinstance(report, repro.IndexExportReport):
        print_index_export(out, report, args.out)
    else:
        result = report.layout
        out.print(line(("exported", "green"), " ", args.image[0], " -> ", str(args.out), "  manifest ",
                       result.manifest_digest, f"  ({len(result.layers)} layers, {result.seconds:.1f} s)"))
        if report.sbom_file is not None:
            out.print(line("  SBOM ", report.sbom_file, " (attached as ", report.sbom_artifact, ")"))
    return EXIT_OK


def print_index_export(out: Console, report, layout: Path) -> None:
    result = report.layout
    out.print(line(("exported", "green"), f" {len(result.platforms)} platforms -> ", str(layout),
                   "  index ", result.index.digest, f"  ({result.seconds:.1f} s)"))
    for entry in report.to_dict()["platforms"]:
        out.print(line("  ", entry["platform"], " ", entry["image"], "  manifest ", entry["manifest_digest"],
                       *(("  SBOM ", entry["sbom_file"]) if "sbom_file" in entry else ())))


def verify_command(args, out: Console, err: Console) -> int:
    with err.status(line("verifying ", args.image)):
        report = repro.verify_image(default_engine(args.engine), args.image, args.lock)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        for m in report.mismatches:
            out.print(line(("mismatch", "red"), " ", str(m.what), " ", str(m.subject), ": expected ",
                           str(m.expected), ", found ", str(m.actual)))
        for f in report.shared:
            out.print(line("note: ", f.path, " is installed by ", " and ".join(f.owners), "; the image holds ",
                           f.kept, "'s copy (installed last)"))
        counts = ", ".join(f"{v} {k}" for k, v in report.checked.items())
        verdict = ("matches", "green") if report.ok else (f"{len(report.mismatches)} mismatch(es)", "red")
        out.print(line(args.image, " against ", str(args.lock), ": ", verdict, f" (checked {counts})"))
    return EXIT_OK if report.ok else EXIT_FAILED


def diff_command(args, out: Console, err: Console) -> int:
    with err.status(line("comparing ", args.a, " and ", args.b)):
        report = repro.diff_images(default_engine(args.engine), args.a, args.b, raw=args.raw, limit=args.limit)
    if args.json:
        out.print_json(data=report.to_dict())
        return EXIT_OK if report.same else EXIT_FAILED
    for d in report.differences:
        out.print(line(d.path, ": ", ", ".join(d.fields)))
    if report.config:
        out.print(line("config: ", ", ".join(report.config), " differ"))
    out.print(line("the same files" if report.same else
                   f"{report.total} path(s) differ" + (f" (first {len(report.differences)} shown)"
                                                       if report.total > len(report.differences) else "")))
    return EXIT_OK if report.same else EXIT_FAILED


def sbom_command(args, out: Console, err: Console) -> int:
    engine = default_engine(args.engine)
    with err.status(line("reading ", args.image)):
        report = repro.image_sbom(engine, args.image, args.out, lock=args.lock)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        out.print(line("SBOM written to ", str(report.path), f" ({report.components} components",
                       *(("; attached to ", str(report.layout), " as ", report.attached, ")") if report.attached
                         else (")",))))
    return EXIT_OK
