"""expect.json, written by the renderer (imagebuild/render.py `expectations`): what the image promises.

validate_expect checks its shape and normalises package names; load_expect reads the file.
"""

from __future__ import annotations

import json

from .system import canonical_name, major_minor

NO_EXPECTATIONS = {"python": {}, "packages": {}, "cuda": None, "deep_gemm": {"compile": False},
                   "imports": [], "torch_cuda": None, "flashinfer_dynamo": False, "aot": None}


def validate_expect(raw) -> tuple:
    """(expectations, []) for a valid expect document, (None, [problems]) otherwise."""
    if not isinstance(raw, dict):
        return None, ["the expect file must hold a JSON object"]
    errors = []
    python = raw.get("python")
    if not (isinstance(python, dict) and all(isinstance(python.get(key), str) for key in ("executable", "version"))):
        errors.append('"python" must be {"executable": "<path>", "version": "<major.minor>"}')
    packages = raw.get("packages")
    if not (isinstance(packages, dict)
            and all(isinstance(name, str) and isinstance(version, str) for name, version in packages.items())):
        errors.append('"packages" must map distribution names to exact version strings')
    cuda = raw.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, dict) and major_minor(cuda.get("toolkit")) is not None and isinstance(cuda.get("home"), str)
        and isinstance(cuda.get("archs", []), list) and all(isinstance(a, str) for a in cuda.get("archs", []))
        and isinstance(cuda.get("toolchain", []), list) and all(isinstance(n, str) for n in cuda.get("toolchain", []))
    ):
        errors.append('"cuda" must be null or {"toolkit": "13.0", "archs": [...], "home": "<path>"}')
    deep_gemm = raw.get("deep_gemm")
    if deep_gemm is not None and not (
        isinstance(deep_gemm, dict) and isinstance(deep_gemm.get("compile", False), bool)
    ):
        errors.append('"deep_gemm" must be null or {"compile": true|false}')
    imports = raw.get("imports", [])
    if not (isinstance(imports, list) and all(isinstance(m, str) for m in imports)):
        errors.append('"imports" must be a list of module names')
    torch_cuda = raw.get("torch_cuda")
    if torch_cuda is not None and major_minor(torch_cuda) is None:
        errors.append('"torch_cuda" must be null or a CUDA version like "13.0"')
    if not isinstance(raw.get("flashinfer_dynamo", False), bool):
        errors.append('"flashinfer_dynamo" must be true or false')
    aot = raw.get("aot")
    if aot is not None and not (
        isinstance(aot, dict) and isinstance(aot.get("manifest"), str) and isinstance(aot.get("sglang"), bool)
        and isinstance(aot.get("archs"), list) and aot["archs"] and all(isinstance(a, str) for a in aot["archs"])
        and isinstance(aot.get("shapes"), list) and aot["shapes"]
        and all(isinstance(shape, dict) for shape in aot["shapes"])
    ):
        errors.append('"aot" must be null or {"manifest": "<path>", "archs": [...], "sglang": bool, "shapes": [...]}')
    if errors:
        return None, errors
    return {
        "python": python,
        "packages": {canonical_name(name): version for name, version in packages.items()},
        "cuda": cuda,
        "deep_gemm": deep_gemm or {"compile": False},
        "imports": imports,
        "torch_cuda": torch_cuda,
        "flashinfer_dynamo": raw.get("flashinfer_dynamo", False),
        "aot": aot,
    }, []


def load_expect(path: str) -> tuple:
    """(expectations, None) or (None, why not)."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        return None, f"cannot read expect file {path}: {type(error).__name__}: {error}"
    expect, errors = validate_expect(raw)
    return (expect, None) if expect is not None else (None, f"invalid expect file {path}: " + "; ".join(errors))
