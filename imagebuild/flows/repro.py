"""The reproducibility flows behind export-oci, verify, diff and sbom: an image (engine or OCI layout)
written as a deterministic layout with its SBOM, checked against its lock, compared with another, and
described as a CycloneDX SBOM from the lock it carries. Each returns a report with `to_dict()` for --json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import ImagebuildError
from imagebuild.image import export, index, oci, sbom, verify
from imagebuild.image.layout import read_image
from imagebuild.lock import Lock, parse_lock, read_lock
from imagebuild.render import paths

IMAGE_LOCK = paths.member(paths.LOCK)  # the lock every image carries


@dataclass(frozen=True)
class ExportReport:
    """One image written as an OCI layout, and the SBOM written beside it and attached to it."""
    layout: export.LayoutResult
    sbom_file: str | None = None
    sbom_artifact: str | None = None

    def to_dict(self) -> dict:
        report = self.layout.to_dict()
        if self.sbom_file is not None:
            report["sbom"] = {"file": self.sbom_file, "artifact_digest": self.sbom_artifact}
        return report


@dataclass(frozen=True)
class IndexExportReport:
    """Several images, one per platform, written as one layout under an image index; an SBOM file per platform."""
    layout: index.IndexLayout
    sbom_files: tuple[str | None, ...] = ()  # in the order of layout.platforms

    def to_dict(self) -> dict:
        report = self.layout.to_dict()
        for entry, file in zip(report["platforms"], self.sbom_files):
            if file is not None:
                entry["sbom_file"] = file
        return report


@dataclass(frozen=True)
class SbomReport:
    path: Path
    components: int
    layout: Path | None = None  # the OCI layout the SBOM was attached to
    attached: str | None = None  # the attached artifact's digest

    def to_dict(self) -> dict:
        return {"sbom": str(self.path), "components": self.components, "attached": self.attached}


def image_lock(engine, image: str, explicit: Path | None) -> Lock:
    """--lock when given, else the lock.json the image carries."""
    if explicit:
        return read_lock(explicit)
    data = verify.image_file(engine, image, IMAGE_LOCK)
    if data is None:
        raise ImagebuildError(f"{image} carries no /{IMAGE_LOCK}: pass --lock LOCK")
    return parse_lock(data.decode("utf-8", "replace"), f"{image}:/{IMAGE_LOCK}")


def image_kernels(engine, image: str) -> list[dict]:
    """The prebuilt kernels an image's manifest lists ([aot]); [] for an image without one."""
    data = verify.image_file(engine, image, sbom.KERNEL_MANIFEST)
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


def export_oci(engine, images: list[str], out: Path, *, lock: Path | None = None, ref_name: str | None = None,
               with_sbom: bool = True, compression: str = "gzip") -> ExportReport | IndexExportReport:
    """One image as a deterministic OCI layout with its SBOM beside it and attached; several images, one
    per platform, as one layout under an image index, each platform's SBOM from its own lock."""
    if len(images) > 1:
        return export_index(engine, images, out, lock=lock, ref_name=ref_name, with_sbom=with_sbom,
                            compression=compression)
    image = images[0]
    result = export.export_layout(engine, image, out, ref_name=ref_name, compression=compression)
    if not with_sbom:
        return ExportReport(result)
    document = layout_sbom(engine, out, image, lock, result.manifest_digest)
    path = sbom.write_sbom(document, sbom_path_for(Path(out)))
    attached = sbom.attach_sbom(out, document)
    return ExportReport(result, str(path), attached.digest)


def export_index(engine, images: list[str], out: Path, *, lock: Path | None = None, ref_name: str | None = None,
                 with_sbom: bool = True, compression: str = "gzip") -> IndexExportReport:
    """Several images, one per platform: one layout under an image index, an SBOM per platform."""
    if lock:
        raise ImagebuildError("--lock names one image's lock: with several images each image's own "
                              f"/{IMAGE_LOCK} is used (export them one at a time to give locks)")
    sbom_for = None if not with_sbom else (
        lambda part, image, result: layout_sbom(engine, part, image, None, result.manifest_digest))
    result = index.export_index(engine, images, out, ref_name=ref_name, sbom_for=sbom_for, compression=compression)
    files = []
    for item in result.platforms:
        path = Path(out).parent / f"{Path(out).name}.{item.platform.slug}.cdx.json"
        files.append(None if item.sbom_document is None else str(sbom.write_sbom(item.sbom_document, path)))
    return IndexExportReport(result, tuple(files))


def verify_image(engine, image: str, lock_path: Path) -> verify.VerifyReport:
    """An image (engine or oci:DIR) against its lock: labels, versions, RECORD hashes, patches."""
    return verify.verify_image(engine, image, lock_path)


def diff_images(engine, a: str, b: str, *, raw: bool = False, limit: int = 20) -> verify.DiffReport:
    """The first files that differ between two images; mtimes clamped to the lock epoch unless raw."""
    return verify.diff_images(engine, a, b, epoch=None if raw else oci.REPRO_EPOCH, limit=limit)


def image_sbom(engine, image: str, out: Path, *, lock: Path | None = None) -> SbomReport:
    """A CycloneDX SBOM of an image from its lock (--lock, else the one it carries), written to `out`;
    an OCI layout gets it attached too."""
    lock_value = image_lock(engine, image, lock)
    layout_dir = verify.layout_path(image) if verify.is_layout(image) else None
    digest = None
    if layout_dir is not None:
        layout = read_image(layout_dir)
        digest, labels = layout.manifest_digest, verify.ImageFiles(layout.config, {}, {}).labels
    else:
        labels = engine.require(image).labels
    name, tag = _name_and_tag(labels, image)
    document = sbom.build_sbom(lock_value, image_name=name, image_tag=tag, manifest_digest=digest,
                               kernels=image_kernels(engine, image))
    path = sbom.write_sbom(document, out)
    attached = sbom.attach_sbom(layout_dir, document) if layout_dir is not None else None
    return SbomReport(path, len(document["components"]), layout_dir, attached.digest if attached else None)
