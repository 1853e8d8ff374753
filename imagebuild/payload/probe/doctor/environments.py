"""Doctor: the interpreters and environments in sight, and which one holds the ML stack.

Distributions are read from .dist-info folder names, never by importing, so a full SGLang stack
answers in milliseconds.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

from ..system import canonical_name, locate_package, read_text, run_command, same_path

# What makes an interpreter "hold the stack"; torch first, since it decides the CUDA version.
STACK_DISTRIBUTIONS = ("torch", "sglang", "vllm", "flashinfer-python", "sgl-deep-gemm", "sglang-kernel",
                       "triton", "cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime",
                       "nvidia-cuda-runtime-cu12")


def parse_dist_dir(entry: str) -> tuple | None:
    """(canonical name, version) from `sgl_deep_gemm-0.2.3.post2.dist-info`; None for anything else."""
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix) and "-" in entry:
            name, _, version = entry[:-len(suffix)].rpartition("-")
            if name and version:
                return canonical_name(name), version
    return None


def distributions_in(directories) -> dict:
    """Canonical name -> version of every distribution in these folders, first one wins (import order);
    from the .dist-info folder names alone, which is fast enough for a 200-package stack."""
    found = {}
    for directory in directories:
        try:
            entries = sorted(os.listdir(directory))
        except (OSError, TypeError):
            continue
        for entry in entries:
            parsed = parse_dist_dir(entry)
            if parsed and parsed[0] not in found:
                found[parsed[0]] = parsed[1]
    return found


def stack_in(distributions: dict) -> dict:
    return {name: distributions[name] for name in STACK_DISTRIBUTIONS if name in distributions}


def stack_summary(stack: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in stack.items()) or "nothing of the ML stack"


def interpreter_facts(executable: str) -> dict | None:
    """Prefix, version and sys.path of another interpreter (one short run of it)."""
    code = "import sys, json; print(json.dumps([sys.prefix, sys.version.split()[0], [p for p in sys.path if p]]))"
    status, output = run_command([executable, "-c", code], timeout=30)
    try:
        prefix, version, path = json.loads(output.strip().splitlines()[-1]) if status == 0 else (None,) * 3
    except (ValueError, IndexError, TypeError):
        prefix = version = path = None
    if prefix is None:
        return None
    return {"executable": executable, "real": os.path.realpath(executable), "prefix": prefix, "version": version,
            "stack": stack_in(distributions_in(path))}


def is_environment(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg")) or os.path.isdir(os.path.join(path, "conda-meta"))


def venv_candidates(cwd: str, home: str) -> list:
    """Environments where people keep them: $VIRTUAL_ENV, $CONDA_PREFIX, cwd and its parents (and their
    .venv, venv, env), ~/, its folders and ~/.virtualenvs/*, /opt/*."""
    candidates = [os.environ.get("VIRTUAL_ENV"), os.environ.get("CONDA_PREFIX")]
    folder = os.path.abspath(cwd)
    while True:
        candidates += [folder] + [os.path.join(folder, name) for name in (".venv", "venv", "env")]
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for root, hidden in ((home, False), (os.path.join(home or "/nonexistent", ".virtualenvs"), True), ("/opt", True)):
        try:
            children = sorted(os.listdir(root))[:500] if root else []
        except OSError:
            children = []
        for child in children:
            if hidden or not child.startswith(".") or child == ".venv":
                base = os.path.join(root, child)
                candidates += [base, os.path.join(base, ".venv"), os.path.join(base, "venv")]
    seen, found = set(), []
    for path in candidates:
        if path and os.path.isdir(path) and is_environment(path):
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                found.append(os.path.normpath(path))
    return found


def venv_site_dirs(prefix: str) -> list:
    return sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")))


def venv_facts(prefix: str) -> dict:
    config = read_text(os.path.join(prefix, "pyvenv.cfg")) or ""
    match = re.search(r"^version(?:_info)?\s*=\s*([0-9.]+)", config, re.MULTILINE)
    dirs = venv_site_dirs(prefix)
    return {"path": prefix, "python": os.path.join(prefix, "bin", "python"),
            "version": match.group(1) if match else None, "site_dirs": dirs, "stack": stack_in(distributions_in(dirs))}


def choose_stack(running: dict, venvs: list) -> dict:
    """The interpreter whose packages the rest of the diagnosis inspects: the running one when it holds
    the stack, else the nearby environment holding the most of it (torch first)."""
    if running["stack"]:
        return dict(running, how="the interpreter running the probe")
    holders = [venv for venv in venvs if venv["stack"] and not same_path(venv["path"], running["prefix"])]
    best = max(holders, key=lambda venv: ("torch" in venv["stack"], len(venv["stack"])), default=None)
    if best is None:
        return dict(running, how="the interpreter running the probe (no stack found)")
    return {"executable": best["python"], "prefix": best["path"], "version": best["version"],
            "dirs": best["site_dirs"], "stack": best["stack"], "distributions": distributions_in(best["site_dirs"]),
            "how": "an environment nearby, not the interpreter running the probe"}


def install_command(facts: dict, *requirements: str) -> str:
    """How to add requirements to the stack's environment: uv when it is on PATH or the environment has
    no pip (uv makes venvs without one), else that environment's pip."""
    python, wanted = facts["stack"]["executable"], " ".join(f"'{requirement}'" for requirement in requirements)
    if shutil.which("uv") or not locate_package("pip", facts["stack"]["dirs"]):
        return f"uv pip install --python {python} {wanted}"
    return f"{python} -m pip install {wanted}"
