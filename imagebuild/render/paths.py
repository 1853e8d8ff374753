"""Every path inside an image that imagebuild's build steps use, named once (Dockerfile.j2 gets them as values).

Two kinds: what an image keeps (under ROOT, and the venv) and what a build step only borrows (bind and
cache mounts under RUN and the caches, never in a layer). The payload keeps its own copies of the few it
reads at run time, being standard library only; those are imported from it here, not written twice.
"""

from __future__ import annotations

from imagebuild.payload.probe.doctor import findings_kernels
from imagebuild.payload.probe.kernels import kernel_cache

# What an image keeps of imagebuild's own.
ROOT = "/opt/imagebuild"
PROBE = f"{ROOT}/probe.pyz"  # the smoke probe (payload/probe as one zipapp)
EXPECT = f"{ROOT}/expect.json"  # what the probe holds the image to (payload/probe/expect.py)
LOCK = f"{ROOT}/lock.json"  # the lock the image was built from
REQUIREMENTS = f"{ROOT}/requirements"  # each layer's hashed pins
PATCHER = f"{ROOT}/apply_patch.py"  # applies [[patches]] (payload/apply_patch.py)
PATCHES = f"{ROOT}/patches"
AOT_MANIFEST = findings_kernels.KERNEL_MANIFEST  # what the [aot] step built, with sha256s (the payload's constant)
VENV = "/opt/venv"  # every locked wheel
SGLANG_JIT_CACHE = "/var/cache/sglang/jit"  # SGLang's JIT cache, seeded by the [aot] step
TRITON_CACHE = "/var/cache/triton"  # Triton's cache, seeded by the [aot] step with the forward's Triton kernels

# What a build step borrows: bind mounts, cache mounts and scratch space.
RUN = "/run/imagebuild"
PRUNER = f"{RUN}/prune.py"  # payload/prune.py, bind-mounted into a pruned layer's install step
PRUNE_PATCHER = f"{RUN}/apply_patch.py"  # the pruner loads the patcher as the file beside it
PRUNE_SPEC = f"{RUN}/prune.json"  # that layer's [[prune]] entries
AOT_DIR = f"{RUN}/aot"  # the [aot] step's script, its modules and its spec
AOT_WORK = "/tmp/imagebuild-aot"  # the [aot] step's scratch folder, removed at its end
UV = "/usr/local/bin/uv"  # uv, bind-mounted from the context's tools/
UV_CACHE = "/root/.cache/uv"  # uv's wheel cache: a BuildKit cache mount
UV_CACHE_ID = "imagebuild-uv"
CA_SECRET = "/run/secrets/ca"  # the build's secret `ca` (a proxy's roots), where BuildKit mounts it
KERNEL_CACHE_DIR = kernel_cache.MOUNT_DIR  # the [aot] step's compiled kernels: a BuildKit cache mount
KERNEL_CACHE_ID = kernel_cache.MOUNT_ID
SEED = f"{RUN}/seed"  # the kernel seed build's context (kernel-seed.Dockerfile.j2), bind-mounted
SEED_SCRIPT = f"{SEED}/kernel_cache.py"  # payload's kernel_cache.py, copied into that context
SEED_ENTRIES = f"{SEED}/entries"  # the cache entries it adds to the kernel cache mount

PROBE_COMMAND = ("python", PROBE, "--expect", EXPECT)  # the smoke test, run in the built image
# What marks an engine's cache mount as imagebuild's: the command of the step that used it names our files.
OWN_STEP = ROOT + "/"


def member(path: str) -> str:
    """An in-image path as a member of the image's filesystem tar: `opt/imagebuild/lock.json`."""
    return path.lstrip("/")


def template_values() -> dict[str, str]:
    """The paths Dockerfile.j2 writes, by the names it uses."""
    return {"root": ROOT, "requirements": REQUIREMENTS, "patcher": PATCHER, "patches": PATCHES,
            "run": RUN, "pruner": PRUNER, "prune_patcher": PRUNE_PATCHER, "prune_spec": PRUNE_SPEC,
            "aot_dir": AOT_DIR, "aot_work": AOT_WORK, "uv": UV, "uv_cache": UV_CACHE, "uv_cache_id": UV_CACHE_ID,
            "ca_secret": CA_SECRET}


def seed_values() -> dict[str, str]:
    """The paths kernel-seed.Dockerfile.j2 writes, by the names it uses."""
    return {"seed": SEED, "seed_script": SEED_SCRIPT, "seed_entries": SEED_ENTRIES}
