"""How a build is asked for: one value the build flow hands down to every step, instead of a parameter
list each step repeats (apko's options as one value)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagebuild.common import Progress, quiet
from imagebuild.engine import BuildCache
from imagebuild.flows.by_lock import RegistryTarget
from imagebuild.registry import Connection


@dataclass(frozen=True)
class BuildOptions:
    lock_path: Path | None = None  # the lock file; None: lockfiles/NAME.lock beside the recipes folder
    relock: bool = False  # resolve afresh before building (else a missing lock is written, a stale one refused)
    run_smoke: bool = True  # run the image's probe before tagging it
    ca: str | None = None  # CA bundle handed to the build as a secret (build.ca_bundle says where else it looks)
    keep_failed: bool = False  # keep an image whose smoke test failed (under its hold name), to look into
    gpus: bool | tuple | None = None  # smoke with GPUs (True: all, or a tuple of GPU numbers); None: when this machine has them
    tag: str | None = None  # NAME:TAG instead of the recipe's (tests build under names of their own)
    rebuild: bool = False  # build and smoke again even when an image built from this lock is on record
    registry: RegistryTarget | None = None  # reuse or push by lock there
    cache: BuildCache | None = None  # --cache-from / --cache-to
    connection: Connection = Connection()  # how the cache's registries are reached (--registry-ca-cert, --insecure-http)
    accept_unknown: bool = False  # smoke checks that end `unknown` do not stop the tag
    progress: Progress = quiet
