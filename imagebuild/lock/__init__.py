"""Stage 3, lock: the recipe resolved with uv for the base's Python and glibc, every wheel hashed.

    lockfile.py  Lock and LockedWheel; resolve_lock (uv), read_lock / write_lock, ensure_fresh (stale?)
    patches.py   whether a recipe's patches still apply to the locked or another release's wheel

May import: recipe, knowledge, bases (the base identity the lock records), payload (its checksum),
common, errors. No engine, registry or CLI code.
"""

from imagebuild.lock.lockfile import (Lock, LockedPatch, LockedWheel, default_lock_path, ensure_fresh, parse_lock,
                                      read_lock, stale_reasons, template_path, write_lock)
from imagebuild.lock.resolve import compile_command, parse_pylock, resolve_lock, target_tags, uv_binary

__all__ = ["Lock", "LockedPatch", "LockedWheel", "compile_command", "default_lock_path", "ensure_fresh",
           "parse_lock", "parse_pylock", "read_lock", "resolve_lock", "stale_reasons", "target_tags",
           "template_path", "uv_binary", "write_lock"]
