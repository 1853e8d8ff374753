"""push: an OCI layout or an engine image to a registry. An image this machine built from a lock and
smoke-tested also goes up under its lock tag, its smoke report attached first, so the next runner's
`build --registry` finds it (by_lock.py); a derived image never does, since its lock label is inherited.
What is said to the registry is registry/'s; this module keeps the policy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.flows.built import record_push
from imagebuild.flows.by_lock import RegistryTarget, lock_tag, tag_for_lock
from imagebuild.flows.prefetch import prefetching
from imagebuild.flows.smoke import lock_built, smoke_on_record
from imagebuild.registry import Connection, PushOptions, export_engine_image, parse_reference, push


def publish(source: str, reference: str, connection: Connection, options: PushOptions, *,
            compression: str = "gzip", engine=None, progress: Progress = quiet, prefetch_import=()):
    """Push `source` (an OCI layout folder, or an image of `engine`, default the default engine) to
    `reference`; returns registry's push report with the source, how it was exported and its lock tag.
    prefetch_import: modules whose import's files eStargz layers put first (flows/prefetch.py)."""
    folder = Path(source)
    locked = passed = info = reads = None
    with tempfile.TemporaryDirectory(prefix="imagebuild-push-") as tmp:
        exported = ""
        if not folder.is_dir():
            if engine is None and not folder.exists():
                from imagebuild.engine import default_engine
                engine = default_engine()
            if engine is None or folder.exists() or not engine.image_exists(source):
                raise ImagebuildError(f"{source} is neither an OCI layout directory nor an image in the engine")
            info = engine.inspect(source)
            locked = lock_built(info)
            passed = smoke_on_record(info.id) if locked else None
            folder = Path(tmp) / "layout"
            kind, reads = prefetching(compression, engine, source, prefetch_import)
            if reads:
                progress(f"importing {', '.join(reads.modules)} in {source} read {len(reads.files)} files, which "
                         f"each eStargz layer puts first, and touched {reads.chunks[0]} of {reads.chunks[1]} chunks "
                         f"of {len(reads.lazy)} libraries left to be read as needed")
            exported = export_engine_image(engine, source, folder, progress, compression=kind)
        elif prefetch_import:
            raise ImagebuildError(f"{source} is an OCI layout: --prefetch-import records an import in an engine "
                                  "image, so push the engine image")
        ref = parse_reference(reference)
        report = push(folder, reference, connection, options, progress)
        report.source, report.exported_with = source, exported
        report.prefetch = reads.to_dict() if reads else None
        if locked and passed:  # its smoke report attached first, so the lock tag never names an image without it
            target = RegistryTarget(f"{ref.registry}/{ref.repository}", connection)
            tag_for_lock(target.client(progress), ref, report.digest, locked, passed, image_id=info.id,
                         compression=compression)
            report.lock_tag = lock_tag(locked, compression)
            record_push(locked, f"{ref.registry}/{ref.repository}", report.digest, compression)
    return report
