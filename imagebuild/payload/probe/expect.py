"""expect.json: what the image promises, its schema written once (SCHEMA) for both of its sides.

The renderer (imagebuild/render/context.py `expectations`) writes it and checks what it wrote with
validate_expect(strict=True): every key of SCHEMA, nothing else. The probe reads it with load_expect,
which checks the same SCHEMA leniently (a key left out reads as its default) and normalises package
names. Standard library only, as the rest of the probe.
"""

from __future__ import annotations

import copy
import json
from collections import namedtuple

from .system import canonical_name, major_minor

# One key of the document: what it must hold, the problem said otherwise, what a missing key reads as,
# and how its value is normalised for the checks.
Field = namedtuple("Field", "name accepts problem default normal")


def is_str(value) -> bool:
    return isinstance(value, str)


def is_bool(value) -> bool:
    return isinstance(value, bool)


def is_cuda_version(value) -> bool:
    """`13.0` (or `13.0.88`): major.minor first."""
    return major_minor(value) is not None


def nullable(accepts):
    return lambda value: value is None or accepts(value)


def list_of(accepts, non_empty: bool = False):
    return lambda value: (isinstance(value, list) and (bool(value) or not non_empty)
                          and all(accepts(item) for item in value))


def mapping_of(accepts_key, accepts_value):
    return lambda value: isinstance(value, dict) and all(accepts_key(k) and accepts_value(v) for k, v in value.items())


def record(required: dict, optional: dict | None = None):
    """An object holding each required key with an accepted value; an optional key, when present, too.
    Other keys are allowed (a newer renderer may add some)."""
    optional = optional or {}
    return lambda value: (isinstance(value, dict)
                          and all(key in value and accepts(value[key]) for key, accepts in required.items())
                          and all(accepts(value[key]) for key, accepts in optional.items() if key in value))


def _same(value):
    return value


SCHEMA = (
    Field("python", record({"executable": is_str, "version": is_str}),
          '"python" must be {"executable": "<path>", "version": "<major.minor>"}', None, _same),
    Field("packages", mapping_of(is_str, is_str),
          '"packages" must map distribution names to exact version strings', None,
          lambda packages: {canonical_name(name): version for name, version in packages.items()}),
    Field("cuda", nullable(record({"toolkit": is_cuda_version, "home": is_str},
                                  {"archs": list_of(is_str), "toolchain": list_of(is_str)})),
          '"cuda" must be null or {"toolkit": "13.0", "archs": [...], "home": "<path>"}', None, _same),
    Field("deep_gemm", nullable(record({}, {"compile": is_bool})),
          '"deep_gemm" must be null or {"compile": true|false}', None,
          lambda deep_gemm: deep_gemm or {"compile": False}),
    Field("imports", list_of(is_str), '"imports" must be a list of module names', [], _same),
    Field("torch_cuda", nullable(is_cuda_version), '"torch_cuda" must be null or a CUDA version like "13.0"',
          None, _same),
    Field("flashinfer_dynamo", is_bool, '"flashinfer_dynamo" must be true or false', False, _same),
    Field("aot", nullable(record({"manifest": is_str, "sglang": is_bool, "archs": list_of(is_str, non_empty=True),
                                  "shapes": list_of(lambda shape: isinstance(shape, dict), non_empty=True)})),
          '"aot" must be null or {"manifest": "<path>", "archs": [...], "sglang": bool, "shapes": [...]}', None, _same),
    Field("patches", list_of(record({"package": is_str, "sha256": is_str})),
          '"patches" must be a list of {"package": "<name>", "sha256": "<hex>"}', [], _same),
)
KEYS = tuple(field.name for field in SCHEMA)
# What the probe holds a host or an image to without an expect file (doctor, --only).
NO_EXPECTATIONS = {"python": {}, "packages": {}, "cuda": None, "deep_gemm": {"compile": False}, "imports": [],
                   "torch_cuda": None, "flashinfer_dynamo": False, "aot": None, "patches": []}


def validate_expect(raw, strict: bool = False) -> tuple:
    """(expectations, []) for a valid expect document, (None, [problems]) otherwise. strict (the
    renderer's own check): every key of SCHEMA present and no other key."""
    if not isinstance(raw, dict):
        return None, ["the expect file must hold a JSON object"]
    errors = []
    if strict:
        errors += [f'"{key}" is missing' for key in KEYS if key not in raw]
        errors += [f"{json.dumps(str(key))} is no key of expect.json" for key in raw if key not in KEYS]
    expect = {}
    for field in SCHEMA:
        value = raw[field.name] if field.name in raw else copy.deepcopy(field.default)
        if field.accepts(value):
            expect[field.name] = field.normal(value)
        else:
            errors.append(field.problem)
    return (None, errors) if errors else (expect, [])


def load_expect(path: str) -> tuple:
    """(expectations, None) or (None, why not)."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        return None, f"cannot read expect file {path}: {type(error).__name__}: {error}"
    expect, errors = validate_expect(raw)
    return (expect, None) if expect is not None else (None, f"invalid expect file {path}: " + "; ".join(errors))
