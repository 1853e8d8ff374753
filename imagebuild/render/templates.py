"""The Dockerfile texts imagebuild writes, both here: the image's (Dockerfile.j2) and the kernel seed build's.

The lock records the image template's sha256 (`template_sha256`), handed to it by the flows: a change to the
template makes every lock stale. The in-image paths both write come from paths.py as values.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import imagebuild.render.paths as paths  # not via the package's face, which imports this module

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "Dockerfile.j2"  # the image's build steps
SEED_TEMPLATE = HERE / "kernel-seed.Dockerfile.j2"  # fills an engine's kernel cache mount before a build


def template_sha256() -> str:
    """The sha256 of Dockerfile.j2's bytes, which a lock records."""
    return hashlib.sha256(TEMPLATE.read_bytes()).hexdigest()


def seed_dockerfile(*, base_ref: str, python: str, cache_id: str, cache_dir: str) -> str:
    """The kernel seed build's Dockerfile: the context (kernel_cache.py and its entries/) bind-mounted at
    paths.SEED, the script run into the engine's kernel cache mount."""
    import jinja2  # only the commands that render pay for it
    template = jinja2.Template(SEED_TEMPLATE.read_text(), undefined=jinja2.StrictUndefined, autoescape=False)
    return template.render(base_ref=base_ref, python=python, cache_id=cache_id, cache_dir=cache_dir,
                           **paths.seed_values()) + "\n"
