"""The render flow: one platform's build context (Dockerfile, requirements with hashes, patches,
probe) from its fresh lock, as `imagebuild render` writes it to read or to build elsewhere."""

from __future__ import annotations

from pathlib import Path

from imagebuild.common import Progress, quiet
from imagebuild.errors import RecipeError
from imagebuild.flows.lock import fresh_locks
from imagebuild.lock import default_lock_path, ensure_fresh, read_lock, uv_binary_for
from imagebuild.recipe.model import load_recipe
from imagebuild.render.templates import template_sha256


def render(recipe_path: str | Path, out_dir: Path, *, lock_path: Path | None = None,
           relock: bool = False, platform: str | None = None, progress: Progress = quiet) -> Path:
    """The build context of a single-platform recipe, or of one `platform` (amd64, arm64) of a
    multi-platform recipe's lock (which must be there and fresh)."""
    from imagebuild.render import render_context  # jinja2: only the commands that render pay for it
    recipe = load_recipe(recipe_path)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    if recipe.platforms:
        named = [spec.arch for spec in recipe.platforms]
        if platform not in named:
            raise RecipeError(recipe.path, f"names the platforms {', '.join(named)}: render one of them",
                              key="platforms", hint=f"add --platform {named[0]}")
        one = recipe.for_platform(platform)
        current = read_lock(path, platform)
        ensure_fresh(current, one, path, template_sha256=template_sha256())
        return render_context(current, one, out_dir,
                              uv_path=uv_binary_for(platform, progress), lock_text=current.to_json())
    [current] = fresh_locks(recipe, path, relock, progress).values()
    return render_context(current, recipe, out_dir, uv_path=uv_binary_for(current.base.arch, progress),
                          lock_text=path.read_text())
