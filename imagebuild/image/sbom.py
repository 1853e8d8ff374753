"""SBOM: a CycloneDX 1.5 JSON bill of materials for an image, made from its lock.

What goes in: the Debian base (the OS and every package the lock pins), every Python distribution
with its version and its wheel's sha256, the CUDA toolkit the recipe targets (depending on the
toolchain distributions that provide it) and each patch as pedigree of the distribution it changes.
Nothing in it is read from a clock: the same lock (and manifest digest) give the same bytes.

`attach_sbom` adds it to an OCI layout as an artifact: a manifest with artifactType
application/vnd.cyclonedx+json whose `subject` is the image manifest (OCI 1.1 referrers); the image
manifest itself, and so its digest, is untouched.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from urllib.parse import quote

from imagebuild import __version__
from imagebuild.common import write_atomic
from imagebuild.errors import ImagebuildError
from imagebuild.image import oci
from imagebuild.image.layout import read_image
from imagebuild.lock import Lock
from imagebuild.render import AOT_MANIFEST

MEDIA_CYCLONEDX = "application/vnd.cyclonedx+json"
SPEC_VERSION = "1.5"
# Distributions that make up the pip CUDA toolchain (FACTS: PyPI CUDA toolchain wheels).
CUDA_PREFIXES = ("nvidia-cuda-", "nvidia-nvvm", "nvidia-nvjitlink", "nvidia-cublas", "cuda-toolkit")
_NAMESPACE = uuid.UUID("6f1c7f0e-2b1e-4c55-9d7a-3f0c2a9e51b4")  # imagebuild's SBOM serial numbers


def _purl_part(text: str) -> str:
    return quote(text, safe=".-_~")


def deb_purl(name: str, version: str, arch: str, suite: str | None) -> str:
    qualifiers = f"?arch={arch}" + (f"&distro=debian-{suite}" if suite else "")
    return f"pkg:deb/debian/{_purl_part(name)}@{_purl_part(version)}{qualifiers}"


def pypi_purl(name: str, version: str) -> str:
    return f"pkg:pypi/{_purl_part(name)}@{_purl_part(version)}"


def oci_purl(name: str, manifest_digest: str, tag: str | None) -> str:
    base = f"pkg:oci/{_purl_part(name.rsplit('/', 1)[-1])}@{_purl_part(manifest_digest)}"
    return base + (f"?tag={_purl_part(tag)}" if tag else "")


def _props(**values: str) -> list[dict]:
    return [{"name": f"imagebuild:{k.replace('_', '-')}", "value": str(v)} for k, v in values.items()]


def is_cuda_component(name: str) -> bool:
    return name.startswith(CUDA_PREFIXES)


KERNEL_MANIFEST = AOT_MANIFEST.lstrip("/")  # the [aot] step's manifest, as a path inside a layer
_SHA256_HEX = frozenset("0123456789abcdef")


def parse_kernel_manifest(data: bytes, where: str) -> list[dict]:
    """The artifacts of an image's kernel manifest: [{kind, name, path, sha256, bytes, sass, ptx}, ...].

    It comes from inside an image, so anything malformed is one ImagebuildError naming it."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ImagebuildError(f"{where}: the kernel manifest is not JSON: {err}") from None
    artifacts = document.get("artifacts") if isinstance(document, dict) else None
    if not isinstance(artifacts, list):
        raise ImagebuildError(f"{where}: the kernel manifest has no artifacts list")
    found = []
    for index, item in enumerate(artifacts):
        ok = isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("kind", "name", "path", "sha256")) \
            and len(item["sha256"]) == 64 and set(item["sha256"]) <= _SHA256_HEX \
            and isinstance(item.get("bytes"), int) and not isinstance(item.get("bytes"), bool) \
            and all(isinstance(item.get(k), list) and all(isinstance(a, int) and not isinstance(a, bool)
                                                           for a in item[k]) for k in ("sass", "ptx"))
        if not ok:
            raise ImagebuildError(f"{where}: artifacts[{index}] is not a kernel entry "
                                  "(kind, name, path, sha256, bytes, sass, ptx)")
        found.append({k: item[k] for k in ("kind", "name", "path", "sha256", "bytes", "sass", "ptx")})
    return found


def kernel_components(artifacts: list[dict]) -> list[dict]:
    """One CycloneDX file component per prebuilt kernel module, with its hash and GPU code."""
    return [{"type": "file", "bom-ref": f"kernel:{a['kind']}:{a['name']}", "name": a["name"],
             "hashes": [{"alg": "SHA-256", "content": a["sha256"]}],
             "properties": _props(kernel_kind=a["kind"], path=a["path"], bytes=a["bytes"],
                                  sass=",".join(f"sm_{n}" for n in a["sass"]),
                                  ptx=",".join(f"compute_{n}" for n in a["ptx"]))}
            for a in sorted(artifacts, key=lambda a: (a["kind"], a["name"], a["path"]))]


def build_sbom(lock: Lock, *, image_name: str, image_tag: str | None = None,
               manifest_digest: str | None = None, epoch: int = oci.REPRO_EPOCH,
               kernels: list[dict] | None = None) -> dict:
    """The CycloneDX 1.5 document for an image built from `lock`, with its prebuilt kernels if any."""
    image_ref = "image"
    image = {"type": "container", "bom-ref": image_ref, "name": image_name,
             "properties": _props(recipe=lock.recipe, recipe_sha256=lock.recipe_sha256,
                                  lock_sha256=lock.sha256)}
    if image_tag:
        image["version"] = image_tag
    if manifest_digest:
        image["hashes"] = [{"alg": "SHA-256", "content": manifest_digest.split(":", 1)[1]}]
        image["purl"] = oci_purl(image_name, manifest_digest, image_tag)

    components, depends = [], {image_ref: []}
    base = lock.base
    if base.kind == "debian":
        os_ref = f"os:debian-{base.suite}"
        components.append({"type": "operating-system", "bom-ref": os_ref, "name": "debian",
                           "version": str(base.suite),
                           "properties": _props(rootfs_sha256=base.rootfs_sha256, arch=base.arch,
                                                glibc=base.glibc)})
        depends[image_ref].append(os_ref)
        depends[os_ref] = []
        for deb in base.debs:
            purl = deb_purl(deb.name, deb.version, deb.arch, base.suite)
            components.append({"type": "library", "bom-ref": purl, "name": deb.name, "version": deb.version,
                               "purl": purl, "hashes": [{"alg": "SHA-256", "content": deb.sha256}],
                               "properties": _props(suite=deb.suite, filename=deb.filename)})
            depends[os_ref].append(purl)
    else:
        components.append({"type": "container", "bom-ref": "base", "name": str(base.ref),
                           "properties": _props(python=base.python, glibc=base.glibc)})
        depends[image_ref].append("base")

    patches: dict[str, list] = {}
    for patch in lock.patches:
        patches.setdefault(patch.package, []).append(patch)
    cuda_parts = []
    for wheel in lock.wheels:
        purl = pypi_purl(wheel.name, wheel.version)
        item = {"type": "library", "bom-ref": purl, "name": wheel.name, "version": wheel.version,
                "purl": purl, "hashes": [{"alg": "SHA-256", "content": wheel.sha256}],
                "properties": _props(wheel=wheel.filename, layer=wheel.layer)}
        if wheel.name in patches:
            item["pedigree"] = {"patches": [
                {"type": "unofficial", "diff": {"url": f"patches/{p.file}"}} for p in patches[wheel.name]]}
            item["properties"] += [{"name": "imagebuild:patch", "value": f"{p.file} sha256:{p.sha256}"}
                                   for p in patches[wheel.name]]
        components.append(item)
        depends[image_ref].append(purl)
        if is_cuda_component(wheel.name):
            cuda_parts.append(purl)

    if lock.cuda:
        cuda_ref = f"cuda:{lock.cuda['toolkit']}"
        components.append({
            "type": "framework", "bom-ref": cuda_ref, "name": "CUDA Toolkit",
            "version": str(lock.cuda["toolkit"]), "supplier": {"name": "NVIDIA"},
            "properties": _props(archs=",".join(lock.cuda.get("archs", [])),
                                 min_driver=lock.cuda.get("min_driver") or "")})
        depends[image_ref].append(cuda_ref)
        depends[cuda_ref] = cuda_parts

    for component in kernel_components(kernels or []):
        components.append(component)
        depends[image_ref].append(component["bom-ref"])

    key = manifest_digest or lock.sha256
    return {
        "bomFormat": "CycloneDX", "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(_NAMESPACE, key)}", "version": 1,
        "metadata": {"timestamp": oci.rfc3339(epoch),
                     "tools": {"components": [{"type": "application", "name": "imagebuild",
                                               "version": __version__}]},
                     "component": image},
        "components": components,
        "dependencies": [{"ref": ref, "dependsOn": sorted(set(refs))}
                         for ref, refs in depends.items()],
    }


def sbom_bytes(document: dict) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write_sbom(document: dict, path: Path) -> Path:
    """Temp file + rename."""
    return write_atomic(path, sbom_bytes(document))


def attach_sbom(layout_dir: Path, document: dict, *, epoch: int = oci.REPRO_EPOCH) -> oci.Descriptor:
    """Add the SBOM to an OCI layout as an artifact whose subject is the image manifest.

    A previous SBOM artifact for the same image is replaced; index.json is rewritten atomically."""
    layout_dir = Path(layout_dir)
    layout = read_image(layout_dir)
    data = sbom_bytes(document)
    sbom = oci.Descriptor(MEDIA_CYCLONEDX, oci.write_blob(layout_dir, data), len(data))
    empty = oci.Descriptor(oci.MEDIA_EMPTY, oci.write_blob(layout_dir, b"{}"), 2)
    subject = oci.Descriptor(layout.manifest.media_type, layout.manifest.digest, layout.manifest.size)
    manifest = oci.canonical_json({
        "schemaVersion": 2, "mediaType": oci.MEDIA_MANIFEST, "artifactType": MEDIA_CYCLONEDX,
        "config": empty.to_dict(), "layers": [sbom.to_dict()], "subject": subject.to_dict(),
        "annotations": {"org.opencontainers.image.created": oci.rfc3339(epoch)}})
    entry = oci.Descriptor(oci.MEDIA_MANIFEST, oci.write_blob(layout_dir, manifest), len(manifest),
                           artifact_type=MEDIA_CYCLONEDX)
    stale = {d.digest for d in layout.referrers if d.artifact_type == MEDIA_CYCLONEDX}
    kept = [d for d in layout.manifests if d.digest not in stale]
    oci.write_index(layout_dir, kept + [entry])
    for digest in stale - {entry.digest}:
        oci.blob_path(layout_dir, digest).unlink(missing_ok=True)
    return entry


def read_attached(layout_dir: Path) -> dict | None:
    """The SBOM attached to a layout's image, or None."""
    layout = read_image(Path(layout_dir))
    for artifact in layout.referrers:
        if artifact.artifact_type == MEDIA_CYCLONEDX and artifact.layers:
            where = f"{oci.blob_path(layout.path, artifact.digest)}.layers[0]"
            return oci.load_json(oci.read_blob(layout.path, artifact.layers[0], limit=256 << 20, where=where), where)
    return None
