"""The bench scripts import: each names modules of imagebuild that must still exist (bench/flagship.py
imported a module that a refactor deleted, and nothing noticed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_the_bench_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    name = f"imagebuild_bench_{script[:-3]}"
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)  # runs the imports, not main()
    assert callable(getattr(module, "main", None))
