"""What each flow returns: plain values with `to_dict()` for `--json` (the keys are the CLI's contract)."""

from __future__ import annotations

from dataclasses import dataclass, field

from imagebuild.knowledge import has_errors


@dataclass
class CheckReport:
    recipe: str
    findings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

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
    platforms: dict | None = None  # a multi-platform lock: linux/<arch> -> its packages and lock_sha256
    base_moves: list = field(default_factory=list)  # what moved in the base: package, old, new, suite (and arch)
    package_moves: list = field(default_factory=list)  # Python versions that moved from the old lock: name, old, new

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "lock": self.lock_path, "changed": self.changed,
                "packages": self.packages, "seconds": round(self.seconds, 2),
                "lock_sha256": self.lock_sha256, "findings": [f.to_dict() for f in self.findings],
                "base_moves": self.base_moves, "package_moves": self.package_moves,
                **({"platforms": self.platforms} if self.platforms else {})}


@dataclass
class SmokeReport:
    image: str
    ok: bool
    report: dict
    cached: bool = False
    unknown: list = field(default_factory=list)  # checks that ended `unknown` and were not accepted

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "cached": self.cached, "unknown_refused": self.unknown,
                "probe": self.report}


@dataclass
class BuildReport:
    """One platform's image."""

    recipe: str
    image: str
    image_id: str
    size: int
    seconds: dict
    smoke: SmokeReport | None
    lock_path: str
    findings: list = field(default_factory=list)
    reused: bool = False  # an image built from this lock was already in the engine or registry: no build ran
    registry: dict | None = None  # with --registry: where the image is, and whether this run pushed it
    cache: dict | None = None  # with --cache-from/--cache-to: where layers came from and went
    accepted_unknown: list = field(default_factory=list)  # smoke checks that ended `unknown`, accepted by name
    kernels: dict | None = None  # with [aot], when a build ran: what its kernel step compiled and reused

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "image": self.image, "image_id": self.image_id, "reused": self.reused,
                "registry": self.registry, "cache": self.cache, "accepted_unknown": self.accepted_unknown,
                "kernels": self.kernels,
                "size_bytes": self.size, "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
                "lock": self.lock_path, "smoke": self.smoke.to_dict() if self.smoke else None,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class PlatformsBuildReport:
    """What `build` of a multi-platform recipe did: one BuildReport per platform."""

    recipe: str
    image: str  # NAME:TAG; each platform's image is NAME:TAG-<arch>
    lock_path: str
    platforms: dict[str, BuildReport]
    findings: list = field(default_factory=list)
    native: str | None = None  # the platform also tagged NAME:TAG (this machine's own), if built

    @property
    def seconds(self) -> dict:
        return {arch: sum(report.seconds.values()) for arch, report in self.platforms.items()}

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "image": self.image, "lock": self.lock_path, "native": self.native,
                "platforms": {f"linux/{arch}": report.to_dict() for arch, report in self.platforms.items()},
                "findings": [f.to_dict() for f in self.findings]}
