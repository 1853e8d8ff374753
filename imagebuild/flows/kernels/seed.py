"""A fresh runner's engine starts with an empty kernel cache mount: `seed_engine` fills it, before the build,
from a folder of cache entries (layer.py reads them out of a registry build cache), by a small build of its
own (render/kernel-seed.Dockerfile.j2, rendered by render.templates.seed_dockerfile) that mounts the same cache and prints what it added (step.parse_seeded reads it).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.flows.kernels.step import parse_seeded
from imagebuild.payload.probe.kernels import kernel_cache
from imagebuild.render.templates import seed_dockerfile

def seed_engine(engine, entries: Path, *, base_ref: str, python: str, platform: str | None = None,
                cache_id: str = kernel_cache.MOUNT_ID, cache_dir: str = kernel_cache.MOUNT_DIR,
                progress: Progress = quiet) -> dict:
    """Add the cache entries under `entries` to the engine's kernel cache mount; returns what was added
    (flashinfer, sglang), already there (present) and refused. The build's image is removed."""
    context = Path(tempfile.mkdtemp(prefix="imagebuild-kernel-seed-"))
    try:
        (context / "Dockerfile").write_text(seed_dockerfile(base_ref=base_ref, python=python, cache_id=cache_id,
                                                            cache_dir=cache_dir))
        shutil.copyfile(kernel_cache.__file__, context / "kernel_cache.py")
        shutil.copytree(entries, context / "entries")
        (context / "run").write_text(secrets.token_hex(16))  # runs every time: the mount may have lost entries
        found: list = []

        def watch(line: str) -> None:
            counts = parse_seeded(line)
            if counts is not None:
                found.append(counts)
            progress(line)

        image = engine.build(context, progress=watch, platform=platform)
        engine.remove(image)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    if not found:
        raise ImagebuildError("the kernel seed build printed no counts: its output was not the seed script's")
    return found[-1]
