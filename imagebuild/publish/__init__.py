"""Build by lock against a registry: what a build does with a registry besides pushing its result.

    by_lock.py       the image pushed for a lock found by one HEAD, tagged, pushed with its lock tag
    build_cache.py   a build pushed with BuildKit's inline cache metadata, for the next runner's --cache-from
    kernel_layer.py  the [aot] layer of such an image read back as kernel cache entries (a fresh runner's seed)

Public surface: by_lock.RegistryTarget, lock_tag, reuse_by_lock, push_by_lock;
build_cache.push_build_cache; kernel_layer.read_kernel_layer. The registry protocol itself is
imagebuild.registry's.

May import: registry, image, engine, common, errors.
"""
