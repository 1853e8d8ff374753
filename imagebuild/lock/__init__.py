"""Stage 3, lock: the recipe resolved with uv for the base's Python and glibc, every wheel hashed.

    lockfile.py  Lock and LockedWheel, PlatformLocks (one Lock per platform); read / write, ensure_fresh (stale?)
    resolve.py   resolve_lock (uv for the base's Python, glibc and CPU); the uv binary a build runs
    patches.py   whether a recipe's patches still apply to the locked or another release's wheel

May import: recipe, knowledge, bases (the base identity the lock records), payload (its checksum),
common, errors. No engine, registry or CLI code.
"""

from imagebuild.lock.lockfile import (Lock, LockedPatch, LockedWheel, PlatformLocks, default_lock_path, ensure_fresh,
                                      parse_lock, parse_locks, read_lock, read_locks, stale_reasons,
                                      write_lock, write_locks)
from imagebuild.lock.resolve import compile_command, parse_pylock, resolve_lock, target_tags, uv_binary, uv_binary_for

__all__ = ["Lock", "LockedPatch", "LockedWheel", "PlatformLocks", "compile_command", "default_lock_path",
           "ensure_fresh", "parse_lock", "parse_locks", "parse_pylock", "read_lock", "read_locks", "resolve_lock",
           "stale_reasons", "target_tags", "uv_binary", "uv_binary_for", "write_lock",
           "write_locks"]
