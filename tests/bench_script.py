"""A bench/ script loaded as a module for tests of its own logic (its main() is not run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

BENCH = Path(__file__).resolve().parent.parent / "bench"


def loaded(script: str) -> Iterator[ModuleType]:
    """bench/SCRIPT.py under a module name of its own for the length of a fixture, then forgotten."""
    spec = importlib.util.spec_from_file_location(f"imagebuild_bench_{script}_logic", BENCH / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
