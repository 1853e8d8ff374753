"""What moved between two locks of one recipe, and what a build of the new one will redo.

    diff_locks(old, new)  -> LockDiff: Python packages moved, added, removed or re-hashed; the [cuda]
                             facts that changed; the base's .debs that moved; the patches that changed;
                             which build steps rebuild (the base, each wheel layer, the [aot] kernel step)
                             and which kernels compile again.

What the lock does not hold is not shown: whether the recipe has [aot] (the kernel step is listed when
FlashInfer or SGLang is locked) and its [[prune]] steps (a changed pruner reruns them).

Pure: two parsed locks in, plain values out (`imagebuild diff-lock` prints them; `--json` is to_dict()).
Which packages decide the kernels' bytes is the payload's own rule (payload/probe/kernels/kernel_cache.py:
the distributions whose headers the kernels include, the host toolchain's .debs), read from there, so
this says what the kernel cache will decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imagebuild.base.identity import base_moves
from imagebuild.lock.lockfile import Lock, PlatformLocks
from imagebuild.payload.probe.kernels.kernel_cache import HEADER_DISTRIBUTIONS, TOOLCHAIN_DEBS
from imagebuild.recipe.layers import LAYER_ORDER

SGLANG_DISTRIBUTIONS = ("sglang", "sgl-kernel", "sglang-kernel")  # SGLang's own key: its release


@dataclass
class LockDiff:
    """One platform's two locks compared."""

    arch: str
    moved: list[dict] = field(default_factory=list)  # name, old, new, layer
    added: list[dict] = field(default_factory=list)  # name, version, layer
    removed: list[dict] = field(default_factory=list)  # name, version, layer
    rehashed: list[dict] = field(default_factory=list)  # same version, another wheel: name, version, layer, old, new
    cuda: list[dict] = field(default_factory=list)  # key, old, new
    base: list[dict] = field(default_factory=list)  # package, old, new, suite
    base_changed: bool = False  # the base layer is another (its rootfs, image or interpreter)
    patches: list[dict] = field(default_factory=list)  # package, file, old, new (sha256 and version)
    imagebuild: list[dict] = field(default_factory=list)  # template / payload checksum: key, old, new
    rebuilds: list[dict] = field(default_factory=list)  # step, rebuilds, why
    kernels: dict = field(default_factory=dict)  # recompile: all|sglang|maybe|none, why
    # Judged by the recipe (flows/lockdiff.py); None when no recipe judged the two locks:
    findings: dict | None = None  # appeared, cleared: the rules' findings only one lock has
    patches_broken: list | None = None  # patch, package, old, new, problems: a moved wheel the patch misses

    @property
    def wheel_changes(self) -> list[dict]:
        """Every wheel entry that moved, came, went or was re-hashed (each has name and layer)."""
        return [*self.moved, *self.added, *self.removed, *self.rehashed]

    @property
    def changed(self) -> bool:
        return any((self.moved, self.added, self.removed, self.rehashed, self.cuda, self.base, self.base_changed,
                    self.patches, self.imagebuild))

    def to_dict(self) -> dict:
        return {"arch": self.arch, "changed": self.changed, "moved": self.moved, "added": self.added,
                "removed": self.removed, "rehashed": self.rehashed, "cuda": self.cuda, "base": self.base,
                "base_changed": self.base_changed, "patches": self.patches, "imagebuild": self.imagebuild,
                "rebuilds": self.rebuilds, "kernels": self.kernels, "findings": self.findings,
                "patches_broken": self.patches_broken}


@dataclass
class LocksDiff:
    """Two lock files compared: one LockDiff per platform both lock, and the platforms only one does."""

    old: str
    new: str
    platforms: list[LockDiff]
    added_platforms: list[str] = field(default_factory=list)
    removed_platforms: list[str] = field(default_factory=list)
    judged_by: str | None = None  # the recipe whose rules and patches judged both locks, if one did

    @property
    def changed(self) -> bool:
        return bool(self.added_platforms or self.removed_platforms or any(d.changed for d in self.platforms))

    def to_dict(self) -> dict:
        return {"old": self.old, "new": self.new, "changed": self.changed,
                "platforms": [d.to_dict() for d in self.platforms],
                "added_platforms": self.added_platforms, "removed_platforms": self.removed_platforms,
                "judged_by": self.judged_by}


def per_platform(locks: Lock | PlatformLocks | dict[str, Lock]) -> dict[str, Lock]:
    """A lock file's locks by platform (a dict of them is taken as it is)."""
    if isinstance(locks, dict):
        return locks
    return dict(locks.locks) if isinstance(locks, PlatformLocks) else {locks.base.arch: locks}


def diff_lock_files(old: Lock | PlatformLocks | dict[str, Lock], new: Lock | PlatformLocks | dict[str, Lock],
                    old_name: str, new_name: str) -> LocksDiff:
    before, after = per_platform(old), per_platform(new)
    return LocksDiff(old_name, new_name, [diff_locks(before[arch], after[arch]) for arch in sorted(set(before) & set(after))],
                     sorted(set(after) - set(before)), sorted(set(before) - set(after)))


def diff_locks(old: Lock, new: Lock) -> LockDiff:
    diff = LockDiff(new.base.arch)
    before, after = {w.name: w for w in old.wheels}, {w.name: w for w in new.wheels}
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if was is None:
            diff.added.append({"name": name, "version": now.version, "layer": now.layer})
        elif now is None:
            diff.removed.append({"name": name, "version": was.version, "layer": was.layer})
        elif was.version != now.version:
            diff.moved.append({"name": name, "old": was.version, "new": now.version, "layer": now.layer})
        elif (was.filename, was.sha256) != (now.filename, now.sha256):
            diff.rehashed.append({"name": name, "version": now.version, "layer": now.layer,
                                  "old": was.filename, "new": now.filename})
    for key in sorted(set(old.cuda) | set(new.cuda)):
        if old.cuda.get(key) != new.cuda.get(key):
            diff.cuda.append({"key": key, "old": old.cuda.get(key), "new": new.cuda.get(key)})
    diff.base = base_moves(old.base, new.base)
    diff.base_changed = (old.base.to_dict() != new.base.to_dict())
    patches_before = {(p.package, p.file): p for p in old.patches}
    patches_after = {(p.package, p.file): p for p in new.patches}
    for key in sorted(set(patches_before) | set(patches_after)):
        was, now = patches_before.get(key), patches_after.get(key)
        if was is None or now is None or (was.sha256, was.version) != (now.sha256, now.version):
            diff.patches.append({"package": key[0], "file": key[1],
                                 "old": {"sha256": was.sha256, "version": was.version} if was else None,
                                 "new": {"sha256": now.sha256, "version": now.version} if now else None})
    for key, a, b in (("template_sha256", old.template_sha256, new.template_sha256),
                      ("payload_sha256", old.payload_sha256, new.payload_sha256)):
        if a != b:
            diff.imagebuild.append({"key": key, "old": a, "new": b})
    diff.rebuilds = rebuilds(old, new, diff)
    diff.kernels = kernels(diff)
    return diff


def _names_by_layer(diff: LockDiff) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for entry in diff.wheel_changes:
        found.setdefault(entry["layer"], []).append(entry["name"])
    return found


def rebuilds(old: Lock, new: Lock, diff: LockDiff) -> list[dict]:
    """Each build step in the Dockerfile's order, and whether a build of the new lock redoes it: a step
    rebuilds when its own input changed or any step below it rebuilt (the engine's layer cache)."""
    steps, below = [], None
    if diff.imagebuild and any(e["key"] == "template_sha256" for e in diff.imagebuild):
        below = "imagebuild's Dockerfile template changed"
    why = below or ("the base moved: " + _packages(diff.base) if diff.base else
                    "the base is another" if diff.base_changed else None)
    steps.append({"step": "base", "rebuilds": why is not None, "why": why or "unchanged"})
    below = below or (why and "the base below it rebuilds")
    changed = _names_by_layer(diff)
    layers = [layer for layer in LAYER_ORDER if old.layer(layer) or new.layer(layer)]
    for layer in layers:
        own = changed.get(layer)
        why = f"{', '.join(own)} changed" if own else below
        steps.append({"step": f"layer {layer}", "rebuilds": why is not None, "why": why or "unchanged"})
        below = below or (own and f"layer {layer} below it rebuilds")
    payload = ("imagebuild's in-image code changed (the patcher, the pruner and the kernel step's scripts are "
               "part of it)" if any(e["key"] == "payload_sha256" for e in diff.imagebuild) else None)
    if old.patches or new.patches:
        own = ("the patches changed: " + ", ".join(p["package"] for p in diff.patches)) if diff.patches else payload
        why = own or below
        steps.append({"step": "patches", "rebuilds": why is not None, "why": why or "unchanged"})
        below = below or (own and "the patches below it rebuild")
    if _has_aot(old, new):  # the lock does not say whether the recipe has [aot]; a recipe with it runs this step
        why = below or payload
        steps.append({"step": "[aot] kernel step", "rebuilds": why is not None, "why": why or "unchanged"})
    steps.append({"step": "probe and lock", "rebuilds": True, "why": "the lock itself is copied into the image"})
    return steps


def _has_aot(old: Lock, new: Lock) -> bool:
    return any(w.name.startswith("flashinfer") or w.name in SGLANG_DISTRIBUTIONS for lock in (old, new)
               for w in lock.wheels)


def _packages(moves: list[dict]) -> str:
    shown = [f"{m['package']} {m['old'] or '(none)'} -> {m['new'] or '(none)'}" for m in moves[:3]]
    return ", ".join(shown) + (f" and {len(moves) - 3} more" if len(moves) > 3 else "")


def kernels(diff: LockDiff) -> dict:
    """Which kernels compile again, by the kernel cache's keys: every kernel when anything of their
    build-wide half moved (a distribution whose headers they include, a host toolchain .deb, the [cuda]
    archs or toolkit), SGLang's when only SGLang moved, maybe when imagebuild's in-image code changed
    (its compile shim is in every key); else none (the step may rerun and takes every kernel from the
    kernel cache)."""
    wide = [e["name"] for e in diff.wheel_changes if e["name"].startswith(HEADER_DISTRIBUTIONS)]
    wide += [m["package"] for m in diff.base if m["package"].startswith(TOOLCHAIN_DEBS)]
    wide += [f"[cuda] {c['key']}" for c in diff.cuda if c["key"] in ("archs", "toolkit")]
    if wide:
        return {"recompile": "all", "why": f"their key's build-wide half moved: {', '.join(wide)}"}
    sglang = [e["name"] for e in diff.wheel_changes if e["name"] in SGLANG_DISTRIBUTIONS]
    if sglang:
        return {"recompile": "sglang", "why": f"{', '.join(sglang)} moved: SGLang's kernels are keyed by its release"}
    if any(e["key"] == "payload_sha256" for e in diff.imagebuild):
        return {"recompile": "maybe", "why": "imagebuild's in-image code changed: every kernel compiles again "
                                             "only if its compile shim (deterministic_pid.c) did"}
    return {"recompile": "none", "why": "nothing their keys hold moved: every kernel comes from the kernel cache"}
