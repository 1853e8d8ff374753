"""`--prefetch-import MODULES`: the files an import reads in an image, for eStargz layers to put first.

The payload's recorder (payload/record_reads.py) runs on the image's own Python, with no network, imports the
modules and lists the regular files it opened or mapped, and for each mapped one how many of its 4 MiB chunks
the import touched. Files read whole, and mapped files the import touched at least half of, go before
`.prefetch.landmark` in each eStargz layer (image/estargz.py): a lazy consumer fetches them in one range per
layer as it mounts the image. A mapped library touched in a few chunks (a CUDA library's loader tables, not
its GPU code) stays out: fetching it whole would cost more than the chunks it is read in. The list is sorted,
so the same image gives the same layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from imagebuild.errors import ImagebuildError
from imagebuild.image.compression import ESTARGZ, Compression, compression as compression_named
from imagebuild.payload import RECORDER


class PrefetchError(ImagebuildError):
    """The import to record failed, or the recorder said nothing usable."""


# A mapped file touched in fewer than this share of its chunks is left to be fetched as it is read.
WHOLE_SHARE = 0.5


@dataclass(frozen=True)
class ImportReads:
    modules: tuple[str, ...]
    files: tuple[str, ...]  # absolute real paths in the image, sorted: to prefetch
    lazy: tuple[str, ...] = ()  # mapped, but touched in under WHOLE_SHARE of their chunks: left out
    chunks: tuple[int, int] = (0, 0)  # of the lazy files: chunks touched, chunks in all

    def to_dict(self) -> dict:
        return {"modules": list(self.modules), "files": len(self.files), "lazy_files": len(self.lazy),
                "lazy_chunks_touched": self.chunks[0], "lazy_chunks": self.chunks[1]}


def _chunk_counts(value) -> dict[str, tuple[int, int]]:
    if not isinstance(value, dict):
        raise TypeError("chunks is not an object")
    counts = {}
    for path, pair in value.items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(n) is int and n >= 0 for n in pair)
                and pair[0] <= pair[1]):
            raise TypeError(f"chunks of {path!r} is not [touched, total]")
        counts[path] = (pair[0], pair[1])
    return counts


def parse_reads(stdout: str, modules: tuple[str, ...], image: str) -> ImportReads:
    """The recorder's last line as ImportReads; anything else is one PrefetchError naming the image."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        said = json.loads(lines[-1])
        imported, failed, files = said["imported"], said["failed"], said["files"]
        if not (isinstance(imported, list) and isinstance(failed, dict) and isinstance(files, list)
                and all(isinstance(f, str) for f in files)):
            raise TypeError("unexpected types")
        chunks = _chunk_counts(said.get("chunks", {}))
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
    lazy = [f for f in absolute if f in chunks and chunks[f][1] > 1 and chunks[f][0] < WHOLE_SHARE * chunks[f][1]]
    left = set(lazy)
    whole = tuple(f for f in absolute if f not in left)
    counted = (sum(chunks[f][0] for f in lazy), sum(chunks[f][1] for f in lazy))
    return ImportReads(modules, whole, tuple(lazy), counted)


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
    try:
        return parse_reads(result.stdout, modules, image)
    except PrefetchError as err:
        raise PrefetchError(f"{err}; its stderr ended with: {result.stderr.strip()[-1500:]!r}") from None


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
