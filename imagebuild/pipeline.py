"""The pipeline as a library API: check, lock, render, build, smoke. The CLI is a thin layer over these.

    recipe ─compat─▶ findings ─bases + lock─▶ Lock ─render─▶ context ─engine.build─▶ image ─smoke─▶ tag

Each function takes plain values and returns a report with `to_dict()` for `--json`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from imagebuild import compat
from imagebuild.bases import ensure_base_image, identify
from imagebuild.common import cache_dir
from imagebuild.engine import Engine
from imagebuild.errors import FindingsFailed, SmokeFailed
from imagebuild.lock import Lock, default_lock_path, ensure_fresh, read_lock, resolve_lock, uv_binary, write_lock
from imagebuild.recipe.model import DebianBase, Recipe, load_recipe

Progress = Callable[[str], None]
PROBE_COMMAND = ("python", "/opt/imagebuild/probe.pyz", "--expect", "/opt/imagebuild/expect.json")
# Where users behind a TLS-intercepting proxy keep the roots that proxy signs with (Debian's path).
# FlashInfer JIT-compiles on first use where a GPU is visible (tier 4): give the probe time.
SMOKE_TIMEOUT_S = 1800
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _quiet(_: str) -> None:
    pass


@dataclass
class CheckReport:
    recipe: str
    findings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not compat.has_errors(self.findings)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "ok": self.ok,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class LockReport:
    recipe: str
    lock_path: str
    changed: bool
    packages: int
    seconds: float
    findings: list = field(default_factory=list)
    lock_sha256: str = ""

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "lock": self.lock_path, "changed": self.changed,
                "packages": self.packages, "seconds": round(self.seconds, 2),
                "lock_sha256": self.lock_sha256, "findings": [f.to_dict() for f in self.findings]}


@dataclass
class SmokeReport:
    image: str
    ok: bool
    report: dict
    cached: bool = False

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "cached": self.cached, "probe": self.report}


@dataclass
class BuildReport:
    recipe: str
    image: str
    image_id: str
    size: int
    seconds: dict
    smoke: SmokeReport | None
    lock_path: str
    findings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "image": self.image, "image_id": self.image_id,
                "size_bytes": self.size, "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
                "lock": self.lock_path, "smoke": self.smoke.to_dict() if self.smoke else None,
                "findings": [f.to_dict() for f in self.findings]}


# ---------------------------------------------------------------- check

def base_glibc(recipe: Recipe) -> str:
    """The base's glibc without bootstrapping it: from the suite's facts or the recipe."""
    if isinstance(recipe.base, DebianBase):
        return compat.debian_suite(recipe.base.suite).glibc
    return recipe.base.glibc


def check(recipe_path: str | Path) -> CheckReport:
    recipe = load_recipe(recipe_path)
    return CheckReport(str(recipe.path), compat.check_recipe(recipe, base_glibc(recipe)))


def _merged(before: list, after: list) -> list:
    """Recipe-time and lock-time rules can both see one problem (glibc vs nvcc): report it once."""
    seen = {(f.rule, f.message) for f in before}
    return before + [f for f in after if (f.rule, f.message) not in seen]


def _stop_on_errors(findings: list) -> None:
    if compat.has_errors(findings):
        raise FindingsFailed(findings)


# ---------------------------------------------------------------- lock

def lock(recipe_path: str | Path, *, lock_path: Path | None = None,
         progress: Progress = _quiet) -> LockReport:
    started = time.monotonic()
    recipe = load_recipe(recipe_path)
    findings = compat.check_recipe(recipe, base_glibc(recipe))
    _stop_on_errors(findings)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    base = identify(recipe.base, progress)
    progress(f"resolving {len(recipe.python.requirements)} requirements for Python {base.python} "
             f"on {base.uv_platform}")
    new = resolve_lock(recipe, base)
    findings = _merged(findings, compat.check_resolved(recipe, new.packages, base.glibc))
    _stop_on_errors(findings)
    text = new.to_json()
    changed = not path.exists() or path.read_text() != text
    if changed:
        write_lock(new, path)
    return LockReport(str(recipe.path), str(path), changed, len(new.wheels),
                      time.monotonic() - started, findings, new.sha256)


def _fresh_lock(recipe: Recipe, path: Path, relock: bool, progress: Progress) -> Lock:
    if relock or not path.exists():
        lock(recipe.path, lock_path=path, progress=progress)
    current = read_lock(path)
    ensure_fresh(current, recipe, path)
    return current


# ---------------------------------------------------------------- render

def render(recipe_path: str | Path, out_dir: Path, *, lock_path: Path | None = None,
           relock: bool = False, progress: Progress = _quiet) -> Path:
    from imagebuild.render import render_context  # jinja2: only the commands that render pay for it
    recipe = load_recipe(recipe_path)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    current = _fresh_lock(recipe, path, relock, progress)
    return render_context(current, recipe, out_dir, uv_path=uv_binary(), lock_text=path.read_text())


# ---------------------------------------------------------------- build and smoke

def ca_bundle(explicit: str | None = None) -> Path | None:
    """The CA roots handed to the build as a secret: --ca-bundle, then the usual variables, then Debian's."""
    for candidate in (explicit, os.environ.get("IMAGEBUILD_CA_BUNDLE"), os.environ.get("SSL_CERT_FILE"),
                      os.environ.get("REQUESTS_CA_BUNDLE"), DEFAULT_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _smoke_cache(image_id: str) -> Path:
    return cache_dir() / "smoke" / (image_id.replace(":", "-") + ".json")


def smoke(image: str, engine: Engine, *, use_cache: bool = False, gpus: bool | None = None,
          progress: Progress = _quiet) -> SmokeReport:
    """Run the image's own probe against its own expectations, offline, in a throwaway container."""
    engine.check()
    info = engine.inspect(image)
    if info is None:
        raise SmokeFailed(f"no image {image!r} in the {engine.name} engine")
    cached = _smoke_cache(info.id)
    if use_cache and cached.is_file():
        return SmokeReport(image, True, json.loads(cached.read_text()), cached=True)
    gpus = os.path.exists("/dev/nvidiactl") if gpus is None else gpus
    progress(f"smoke test: running the probe in {image} (network off{', GPUs on' if gpus else ''})")
    result = engine.run(info.id, PROBE_COMMAND, network=False, gpus=gpus, timeout=SMOKE_TIMEOUT_S)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SmokeFailed(f"the probe in {image} printed no report (exit {result.exit_code}):\n"
                          f"{result.stderr[-3000:]}") from None
    ok = result.exit_code == 0 and bool(report.get("ok"))
    if ok:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(report, indent=2, sort_keys=True))
    return SmokeReport(image, ok, report)


def build(recipe_path: str | Path, engine: Engine, *, lock_path: Path | None = None,
          relock: bool = False, run_smoke: bool = True, ca: str | None = None,
          keep_failed: bool = False, gpus: bool | None = None, progress: Progress = _quiet) -> BuildReport:
    """check -> lock (fresh or refused) -> base -> render -> build untagged -> smoke -> tag."""
    from imagebuild.render import render_context
    timings: dict[str, float] = {}
    clock = time.monotonic()
    recipe = load_recipe(recipe_path)
    findings = compat.check_recipe(recipe, base_glibc(recipe))
    _stop_on_errors(findings)
    path = Path(lock_path) if lock_path else default_lock_path(recipe)
    current = _fresh_lock(recipe, path, relock, progress)
    findings = _merged(findings, compat.check_resolved(recipe, current.packages, current.base.glibc))
    _stop_on_errors(findings)
    engine.check()
    timings["lock"] = time.monotonic() - clock

    clock = time.monotonic()
    ensure_base_image(current.base, recipe.base, engine, progress)
    timings["base"] = time.monotonic() - clock

    clock = time.monotonic()
    context = render_context(current, recipe, cache_dir() / "contexts" / recipe.stem,
                             uv_path=uv_binary(), lock_text=path.read_text())
    bundle = ca_bundle(ca)
    image_id = engine.build(context, secrets={"ca": bundle} if bundle else {}, progress=progress)
    timings["build"] = time.monotonic() - clock

    ref = f"{recipe.name}:{recipe.tag}"
    report = None
    if run_smoke:
        clock = time.monotonic()
        report = smoke(image_id, engine, use_cache=True, gpus=gpus, progress=progress)
        timings["smoke"] = time.monotonic() - clock
        if not report.ok:
            if not keep_failed:
                engine.remove(image_id)
            failed = [c["name"] for c in report.report.get("checks", []) if c.get("status") == "fail"]
            raise SmokeFailed(f"smoke test failed in the image built from {recipe.path} "
                              f"({', '.join(failed) or 'no report'}); {ref} was not tagged"
                              + (f"; the image is kept as {image_id}" if keep_failed else ""),
                              report.report)
    engine.tag(image_id, ref)
    info = engine.inspect(image_id)
    return BuildReport(str(recipe.path), ref, image_id, info.size if info else 0, timings, report,
                       str(path), findings)
