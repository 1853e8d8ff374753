"""Render: a Lock (plus the recipe's env and labels) -> Dockerfile.j2 -> a build context on disk.

    context.py  the values the template gets (layers, links, env, labels, expect.json) and the context written
    paths.py    every path inside an image that the build steps use, and the smoke probe's command
    markers.py  the marker each RUN step carries, and a failed step explained from its marker
    templates.py  the Dockerfile texts: Dockerfile.j2 (its sha256, which a lock records) and the kernel seed's

The names below are the stage's API; jinja2 is imported only when a Dockerfile is rendered.
"""

from imagebuild.render.context import (LABEL_PREFIX, LayerValues, Link, RenderValues, assignments, aot_env,
                                       aot_values, base_env, cuda_home, docker_quote, expectations, labels,
                                       layer_values, prune_specs, render_context, render_dockerfile,
                                       render_values, site_packages, toolchain_links)
from imagebuild.render.paths import AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID, SGLANG_JIT_CACHE, VENV
from imagebuild.render.templates import seed_dockerfile, template_sha256

__all__ = [
    "AOT_MANIFEST", "KERNEL_CACHE_DIR", "KERNEL_CACHE_ID", "LABEL_PREFIX", "SGLANG_JIT_CACHE", "VENV",
    "LayerValues", "Link", "RenderValues", "assignments", "aot_env", "aot_values", "base_env", "cuda_home",
    "docker_quote", "expectations", "labels", "layer_values", "prune_specs", "render_context",
    "render_dockerfile", "render_values", "seed_dockerfile", "site_packages", "template_sha256", "toolchain_links",
]
