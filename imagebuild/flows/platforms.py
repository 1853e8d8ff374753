"""A recipe's platforms, as every flow walks them: one single-platform recipe per platform (apko's
MultiArch: N single-architecture contexts), a recipe without [platforms.*] being the N=1 case.

    each_platform(recipe)     arch -> the single-platform recipe that platform builds
    platform_ref(ref, arch)   NAME:TAG -> NAME:TAG-arm64 (Docker 20.10 keeps one platform per tag)
    engine_for(spec, engine)  the platform's own builder ([platforms.ARCH].engine), else the default engine
    copy_image(...)           an image built on a platform's own builder, copied back into the default engine
"""

from __future__ import annotations

import shutil

from imagebuild.common import Progress
from imagebuild.engine import Engine, default_engine, engine_names
from imagebuild.engine.contract import split_ref
from imagebuild.errors import ImagebuildError
from imagebuild.recipe.model import DebianBase, PlatformSpec, Recipe


def each_platform(recipe: Recipe) -> dict[str, Recipe]:
    """Every platform the recipe builds, by Debian arch, as its own single-platform recipe; a recipe
    without [platforms.*] is its one platform, its [base].arch (an image base's: amd64)."""
    if not recipe.platforms:
        return {recipe.base.arch if isinstance(recipe.base, DebianBase) else "amd64": recipe}
    return {spec.arch: recipe.for_platform(spec.arch) for spec in recipe.platforms}


def platform_ref(ref: str, arch: str) -> str:
    """NAME:TAG -> NAME:TAG-arm64: one platform's image in an engine that holds one per tag."""
    name, tag = split_ref(ref)
    return f"{name}:{tag}-{arch}"


def engine_for(spec: PlatformSpec, default: Engine) -> Engine:
    """The platform's own builder when the recipe names one (an endpoint of the default engine's kind),
    else the default."""
    if spec.engine is None:
        return default
    if not default.reaches_endpoints():
        able = [name for name in engine_names() if default_engine(name).reaches_endpoints()]
        raise ImagebuildError(f"[platforms.{spec.arch}] engine = {spec.engine!r} is another machine's endpoint, "
                              f"which the {default.name} engine cannot reach: build with "
                              f"{' or '.join(f'--engine {name}' for name in able)}")
    return default.at(spec.engine)


def copy_image(source: Engine, target: Engine, ref: str, progress: Progress) -> None:
    """The image saved on the platform's builder, streamed into the local engine's load."""
    progress(f"copying {ref} from its builder into the local engine")
    with source.save(ref) as stream:
        target.load(lambda sink: shutil.copyfileobj(stream, sink, 1 << 20), f"{ref} from its builder")
