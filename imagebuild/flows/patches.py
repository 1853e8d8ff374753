"""The patches flow (`imagebuild patches`): does each recipe patch apply to the locked release, to a
release named for its package, or to the newest one, before a pin moves? lock/patches.py downloads each
wheel (never installed) and checks the patch against its files, hunk by hunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.lock.patches import PatchCheck, check_patches, parse_pins

__all__ = ["PatchesReport", "parse_pins", "patches"]


@dataclass
class PatchesReport:
    results: list[PatchCheck] = field(default_factory=list)  # one per [[patches]] entry, in the recipe's order

    @property
    def ok(self) -> bool:
        return all(r.applies for r in self.results)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "patches": [r.to_dict() for r in self.results]}


def patches(recipe_path: str | Path, *, versions: dict[str, str] | None = None, latest: bool = False) -> PatchesReport:
    """Each patch against `versions[package]` where given (parse_pins reads PACKAGE==VERSION), else the
    newest release when `latest`, else the locked one."""
    return PatchesReport(check_patches(recipe_path, versions=versions, latest=latest))
