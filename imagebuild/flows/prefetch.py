"""`--prefetch-import MODULES`: the files an import reads in an image, for eStargz layers to put first.

The payload's recorder (payload/record_reads.py) runs on the image's own Python, with no network, imports the
modules and lists the regular files it opened or mapped. Those files go before `.prefetch.landmark` in each
eStargz layer (image/estargz.py), so a lazy consumer fetches them in one range per layer as it mounts the
image, and the rest only as it is read. The list is sorted, so the same image gives the same layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from imagebuild.errors import ImagebuildError
from imagebuild.image.compression import ESTARGZ, Compression, compression as compression_named
from imagebuild.payload import RECORDER


class PrefetchError(ImagebuildError):
    """The import to record failed, or the recorder said nothing usable."""


@dataclass(frozen=True)
class ImportReads:
    modules: tuple[str, ...]
    files: tuple[str, ...]  # absolute real paths in the image, sorted

    def to_dict(self) -> dict:
        return {"modules": list(self.modules), "files": len(self.files)}


def parse_reads(stdout: str, modules: tuple[str, ...], image: str) -> ImportReads:
    """The recorder's last line as ImportReads; anything else is one PrefetchError naming the image."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        said = json.loads(lines[-1])
        imported, failed, files = said["imported"], said["failed"], said["files"]
        if not (isinstance(imported, list) and isinstance(failed, dict) and isinstance(files, list)
                and all(isinstance(f, str) for f in files)):
            raise TypeError("unexpected types")
    except (IndexError, ValueError, KeyError, TypeError) as err:
        tail = "\n".join(lines[-3:])
        raise PrefetchError(f"{image}: the import recorder printed no report ({type(err).__name__}); its "
                            f"output ended with: {tail!r}") from None
    if failed:
        named = "; ".join(f"{name}: {why}" for name, why in sorted(failed.items()))
        raise PrefetchError(f"{image}: importing for --prefetch-import failed ({named!r}): name modules the image "
                            "can import")
    if sorted(imported) != sorted(modules):
        raise PrefetchError(f"{image}: the recorder imported {imported!r}, not {list(modules)!r}")
    absolute = sorted({f for f in files if f.startswith("/")})
    if not absolute:
        raise PrefetchError(f"{image}: importing {', '.join(modules)} read no file the recorder could see")
    return ImportReads(modules, tuple(absolute))


def import_reads(engine, image: str, modules) -> ImportReads:
    """Run the recorder in a fresh container of `image` (no network) and read its report."""
    modules = tuple(m for m in modules if m)
    if not modules:
        raise PrefetchError("--prefetch-import needs at least one module name")
    result = engine.run(image, ["python3", "-c", RECORDER.read_text(), *modules])
    if result.timed_out:
        raise PrefetchError(f"{image}: importing {', '.join(modules)} did not finish in time")
    if result.exit_code not in (0, 1):  # 1: an import failed, which the report names
        raise PrefetchError(f"{image}: the import recorder exited with {result.exit_code}: "
                            f"{result.stderr.strip()[-2000:]!r}")
    return parse_reads(result.stdout, modules, image)


def prefetching(kind: str | Compression, engine, image: str, modules) -> tuple[Compression, ImportReads | None]:
    """The compression to export with: eStargz with the import's files first when modules are named."""
    kind = compression_named(kind)
    if not modules:
        return kind, None
    if kind.name != ESTARGZ.name:
        raise PrefetchError(f"--prefetch-import orders eStargz layers: use it with --compression estargz, not "
                            f"{kind.name}")
    reads = import_reads(engine, image, modules)
    return kind.with_prioritized(path.lstrip("/") for path in reads.files), reads
