"""The reproducibility commands: export-oci, verify, diff, sbom (registered through cli.EXTENSIONS).

Each handler is fn(args, out, err) -> exit code: 0 ok, 1 a mismatch or a difference; errors raise
ImagebuildError and the CLI maps them to their exit codes.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from imagebuild.cli.options import compression_option, engine_option
from imagebuild.cli.output import line
from imagebuild.engine import default_engine
from imagebuild.errors import EXIT_FAILED, EXIT_OK, ImagebuildError
from imagebuild.image import export, index, oci, sbom, verify
from imagebuild.image.layout import read_image
from imagebuild.lock import Lock, parse_lock, read_lock
from imagebuild.render import paths

IMAGE_LOCK = paths.member(paths.LOCK)  # the lock every image carries


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


def image_lock(engine, image: str, explicit: Path | None) -> Lock:
    """--lock when given, else the lock.json the image carries."""
    if explicit:
        return read_lock(explicit)
    if verify.is_layout(image):
        data = verify.layout_file(Path(image.removeprefix("oci:")), IMAGE_LOCK)
    else:
        data = verify.image_files(engine, image, keep=lambda path: path == IMAGE_LOCK).contents.get(IMAGE_LOCK)
    if data is None:
        raise ImagebuildError(f"{image} carries no /{IMAGE_LOCK}: pass --lock LOCK")
    return parse_lock(data.decode("utf-8", "replace"), f"{image}:/{IMAGE_LOCK}")


def image_kernels(engine, image: str) -> list[dict]:
    """The prebuilt kernels an image's manifest lists ([aot]); [] for an image without one."""
    if verify.is_layout(image):
        data = verify.layout_file(Path(image.removeprefix("oci:")), sbom.KERNEL_MANIFEST)
    else:
        data = verify.image_files(engine, image, keep=lambda path: path == sbom.KERNEL_MANIFEST
                                  ).contents.get(sbom.KERNEL_MANIFEST)
    return [] if data is None else sbom.parse_kernel_manifest(data, f"{image}:/{sbom.KERNEL_MANIFEST}")


def _name_and_tag(labels: dict, image: str) -> tuple[str, str | None]:
    name = labels.get("org.opencontainers.image.title")
    if name:
        return name, labels.get("org.opencontainers.image.version")
    base, sep, tag = image.rpartition(":")
    return (base, tag) if sep and "/" not in tag else (image, None)


def sbom_path_for(layout: Path) -> Path:
    """Beside the layout folder: out/NAME -> out/NAME.cdx.json."""
    return layout.parent / f"{layout.name}.cdx.json"


def layout_sbom(engine, layout_dir: Path, image: str, explicit_lock: Path | None,
                manifest_digest: str) -> dict:
    """The SBOM of the one image in a layout just exported from `image`."""
    layout = read_image(layout_dir)
    lock = image_lock(engine, f"oci:{layout_dir}", explicit_lock)
    name, tag = _name_and_tag(verify.ImageFiles(layout.config, {}, {}).labels, image)
    return sbom.build_sbom(lock, image_name=name, image_tag=tag, manifest_digest=manifest_digest,
                           kernels=image_kernels(engine, f"oci:{layout_dir}"))


def export_command(args, out: Console, err: Console) -> int:
    engine = default_engine(args.engine)
    if len(args.image) > 1:
        return export_index_command(engine, args, out, err)
    image = args.image[0]
    with err.status(line("exporting ", image)):
        result = export.export_layout(engine, image, args.out, ref_name=args.ref_name,
                                      compression=args.compression)
    report = result.to_dict()
    if not args.no_sbom:
        document = layout_sbom(engine, args.out, image, args.lock, result.manifest_digest)
        path = sbom.write_sbom(document, sbom_path_for(Path(args.out)))
        attached = sbom.attach_sbom(args.out, document)
        report["sbom"] = {"file": str(path), "artifact_digest": attached.digest}
    if args.json:
        out.print_json(data=report)
    else:
        out.print(line(("exported", "green"), " ", image, " -> ", str(args.out), "  manifest ",
                       result.manifest_digest, f"  ({len(result.layers)} layers, {result.seconds:.1f} s)"))
        if "sbom" in report:
            out.print(line("  SBOM ", report["sbom"]["file"], " (attached as ", report["sbom"]["artifact_digest"], ")"))
    return EXIT_OK


def export_index_command(engine, args, out: Console, err: Console) -> int:
    """Several images, one per platform: one layout under an image index, an SBOM per platform."""
    if args.lock:
        raise ImagebuildError("--lock names one image's lock: with several images each image's own "
                              f"/{IMAGE_LOCK} is used (export them one at a time to give locks)")
    sbom_for = None if args.no_sbom else (
        lambda part, image, result: layout_sbom(engine, part, image, None, result.manifest_digest))
    with err.status(line("exporting ", " ".join(args.image))):
        result = index.export_index(engine, args.image, args.out, ref_name=args.ref_name, sbom_for=sbom_for,
                                    compression=args.compression)
    report = result.to_dict()
    for entry, item in zip(report["platforms"], result.platforms):
        if item.sbom_document is not None:
            path = Path(args.out).parent / f"{Path(args.out).name}.{item.platform.slug}.cdx.json"
            entry["sbom_file"] = str(sbom.write_sbom(item.sbom_document, path))
    if args.json:
        out.print_json(data=report)
        return EXIT_OK
    out.print(line(("exported", "green"), f" {len(result.platforms)} platforms -> ", str(args.out),
                   "  index ", result.index.digest, f"  ({result.seconds:.1f} s)"))
    for entry in report["platforms"]:
        out.print(line("  ", entry["platform"], " ", entry["image"], "  manifest ", entry["manifest_digest"],
                       *(("  SBOM ", entry["sbom_file"]) if "sbom_file" in entry else ())))
    return EXIT_OK


def verify_command(args, out: Console, err: Console) -> int:
    with err.status(line("verifying ", args.image)):
        report = verify.verify_image(default_engine(args.engine), args.image, args.lock)
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
        report = verify.diff_images(default_engine(args.engine), args.a, args.b,
                                    epoch=None if args.raw else oci.REPRO_EPOCH, limit=args.limit)
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
        lock = image_lock(engine, args.image, args.lock)
        layout_dir = Path(args.image.removeprefix("oci:")) if verify.is_layout(args.image) else None
        digest = None
        if layout_dir is not None:
            layout = read_image(layout_dir)
            digest, labels = layout.manifest_digest, verify.ImageFiles(layout.config, {}, {}).labels
        else:
            labels = engine.require(args.image).labels
        name, tag = _name_and_tag(labels, args.image)
        document = sbom.build_sbom(lock, image_name=name, image_tag=tag, manifest_digest=digest,
                                   kernels=image_kernels(engine, args.image))
        path = sbom.write_sbom(document, args.out)
        attached = sbom.attach_sbom(layout_dir, document) if layout_dir is not None else None
    if args.json:
        out.print_json(data={"sbom": str(path), "components": len(document["components"]),
                             "attached": attached.digest if attached else None})
    else:
        out.print(line("SBOM written to ", str(path), f" ({len(document['components'])} components",
                       *(("; attached to ", str(layout_dir), " as ", attached.digest, ")") if attached else (")",))))
    return EXIT_OK
