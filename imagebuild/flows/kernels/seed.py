"""A fresh runner's engine starts with an empty kernel cache mount: `seed_engine` fills it, before the build,
from a folder of cache entries (layer.py reads them out of a registry build cache), by a small build of its
own (the seed template) that mounts the same cache and prints what it added (step.parse_seeded reads it).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

import jinja2

from imagebuild.common import Progress, quiet
from imagebuild.errors import ImagebuildError
from imagebuild.flows.kernels.step import parse_seeded
from imagebuild.payload.probe import kernel_cache

# The seed build's Dockerfile template; where it lives is said here only.
SEED_TEMPLATE = Path(__file__).resolve().parent.parent / "kernel-seed.Dockerfile.j2"


def seed_engine(engine, entries: Path, *, base_ref: str, python: str, platform: str | None = None,
                cache_id: str = kernel_cache.MOUNT_ID, cache_dir: str = kernel_cache.MOUNT_DIR,
                progress: Progress = quiet) -> dict:
    """Add the cache entries under `entries` to the engine's kernel cache mount; returns what was added
    (flashinfer, sglang), already there (present) and refused. The build's image is removed."""
    context = Path(tempfile.mkdtemp(prefix="imagebuild-kernel-seed-"))
    try:
        template = jinja2.Template(SEED_TEMPLATE.read_text(), undefined=jinja2.StrictUndefined, autoescape=False)
        (context / "Dockerfile").write_text(template.render(base_ref=base_ref, python=python, cache_id=cache_id,
                                                            cache_dir=cache_dir) + "\n")
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
