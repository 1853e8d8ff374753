"""Doctor: every CUDA toolkit in sight, and which one each consumer would use.

torch.utils.cpp_extension, deep_gemm and FlashInfer each resolve CUDA_HOME their own way, and Triton
runs its own ptxas; here each rule is followed (and confirmed against the consumer's source) without
importing it. Also FlashInfer's get_cuda_version() as read in its source, and the JIT cache folders.
"""

from __future__ import annotations

import ast
import glob
import os
import shutil
import tempfile

from ..checks.deep_gemm_release import SM120, Unreadable, jit_command, jit_generators
from ..system import (cuda_home_rule, deep_gemm_cuda_home, locate_package, parse_nvcc_release, read_text,
                     run_command, same_path)
from ..checks.toolchain import inspect_toolkit, nvcc_script_target

FLASHINFER_DISTRIBUTIONS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
_SOURCE_MARKERS = {  # a consumer's CUDA lookup, as read in its source; checked so a changed rule shows
    "torch": ("torch/utils/cpp_extension.py", ("def _find_cuda_home", "CUDA_HOME", 'which("nvcc")')),
    "flashinfer": ("flashinfer/jit/cpp_ext.py", ("def get_cuda_path", "CUDA_HOME", '"which", "nvcc"')),
    "deep_gemm": ("deep_gemm/cuda_helpers.py", ("def find_cuda_home",)),
}


def pip_toolchain_dirs(site_dirs: list) -> list:
    return [path for site in site_dirs for path in sorted(glob.glob(os.path.join(site, "nvidia", "cu[0-9]*")))
            if os.path.isdir(path)]


def find_toolkits(site_dirs: list) -> list:
    """Every CUDA toolkit folder in sight, once each (by real path), with every way it was found."""
    nvcc = shutil.which("nvcc")
    candidates = [(os.environ.get("CUDA_HOME"), "$CUDA_HOME"), (os.environ.get("CUDA_PATH"), "$CUDA_PATH")]
    if nvcc:
        candidates.append((os.path.dirname(os.path.dirname(nvcc)), f"`which nvcc` = {nvcc}"))
        real_nvcc = os.path.realpath(nvcc)
        if real_nvcc != nvcc:
            candidates.append((os.path.dirname(os.path.dirname(real_nvcc)), f"{nvcc} links to {real_nvcc}"))
        script = nvcc_script_target(nvcc)
        if script:
            candidates.append((script, f"{nvcc} is a script that runs {script}/bin/nvcc"))
    candidates += [(path, "/usr/local/cuda*") for path in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"))]
    candidates += [(path, "pip toolchain in site-packages") for path in pip_toolchain_dirs(site_dirs)]
    by_real = {}
    for home, how in candidates:
        if not home or not os.path.isdir(home):
            continue
        real = os.path.realpath(home)
        if real in by_real:
            by_real[real]["found_as"].append({"path": home, "how": how})
        else:
            by_real[real] = dict(inspect_toolkit(home), found_as=[{"path": home, "how": how}])
    return list(by_real.values())


def consumer_homes(stack: dict) -> dict:
    """Which CUDA home torch.utils.cpp_extension, deep_gemm and FlashInfer would use, each by its own rule,
    and which ptxas Triton runs."""
    dirs = stack["dirs"]
    rule_home, rule_how = cuda_home_rule()
    consumers = {}
    for name, package in (("torch", "torch"), ("deep_gemm", "deep_gemm"), ("flashinfer", "flashinfer")):
        location = locate_package(package, dirs)
        relative, markers = _SOURCE_MARKERS[name]
        rule_file = os.path.join(os.path.dirname(location), relative) if location else None
        source = read_text(rule_file) if rule_file else None
        entry = {"installed": location is not None, "package": location, "rule_file": rule_file,
                 "rule_confirmed": bool(source) and all(marker in source for marker in markers)}
        if name == "deep_gemm" and location:
            entry["home"], answered_by = deep_gemm_cuda_home(location)
            entry["how"] = f"{rule_how}; answered by {answered_by}" if entry["home"] and same_path(
                entry["home"], rule_home) else answered_by
        elif name == "flashinfer" and rule_home is None:
            entry["home"] = None
            entry["how"] = "get_cuda_path() raises: Could not find nvcc and /usr/local/cuda doesn't exist"
        else:
            entry["home"], entry["how"] = rule_home, rule_how
        # Resolved here, where the paths exist: doctor reads these facts on another machine.
        entry["real"] = os.path.realpath(entry["home"]) if entry["home"] else None
        consumers[name] = entry
    consumers["triton"] = triton_ptxas(locate_package("triton", dirs))
    return consumers


def triton_ptxas(package: str | None) -> dict:
    """Triton compiles with its bundled ptxas (ptxas-blackwell for sm_100 and newer, since 3.5) unless
    TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH name one that runs (triton/knobs.py env_nvidia_tool)."""
    if package is None:
        return {"installed": False}
    knobs = read_text(os.path.join(package, "knobs.py")) or ""
    tools = {}
    for tool, key in (("ptxas", "TRITON_PTXAS_PATH"), ("ptxas-blackwell", "TRITON_PTXAS_BLACKWELL_PATH")):
        if tool == "ptxas-blackwell" and "ptxas-blackwell" not in knobs:
            continue
        bundled = os.path.join(package, "backends", "nvidia", "bin", tool)
        chosen, how = None, None
        for path, origin in ((os.environ.get(key), f"${key}"), (bundled, "bundled with triton")):
            if path:
                status, output = run_command([path, "--version"], timeout=30)
                release = parse_nvcc_release(output) if status == 0 else None
                if release:
                    chosen, how = {"path": path, "release": release}, origin
                    break
        tools[tool] = {"env": key, "env_value": os.environ.get(key), "bundled": bundled,
                       "chosen": chosen, "how": how}
    return {"installed": True, "package": package, "tools": tools}


def triton_ptxas_for(tools: dict, compute_cap: str) -> str:
    """Which of the tools triton_ptxas found Triton runs for a GPU of compute capability `compute_cap`
    ("12.0"): ptxas-blackwell for sm_100 and newer where this Triton has one, ptxas otherwise (its
    backends/nvidia/compiler.py get_ptxas). The one place this is decided: doctor asks it too."""
    major = str(compute_cap).split(".")[0]
    blackwell = major.isdigit() and int(major) >= 10
    return "ptxas-blackwell" if blackwell and "ptxas-blackwell" in tools else "ptxas"


def deep_gemm_jit_facts(stack: dict) -> dict:
    """Whether the installed deep_gemm JITs SM120 kernels, and the arch its JIT names for sm_120."""
    package = locate_package("deep_gemm", stack["dirs"])
    facts = {"installed": package is not None, "library": os.path.join(package, "_C.so") if package else None,
             "sm120_kernels": [], "arch": None, "unreadable": None}
    if package is None:
        return facts
    try:
        command = jit_command(package, SM120)
    except Unreadable as error:
        return dict(facts, unreadable=str(error))
    generators = jit_generators(command.pop("library"))
    facts["sm120_kernels"] = sorted(kernel for kernel in generators if kernel.startswith("sm120_"))
    facts["arch"] = command["arch"] if facts["sm120_kernels"] else None
    return facts


def cuda_version_is_patched(source) -> dict:
    """Whether FlashInfer's get_cuda_version() answers without a subprocess when torch knows its CUDA.
    Unpatched (0.7.2), its first statement runs `nvcc --version`, which torch Dynamo cannot trace."""
    try:
        tree = ast.parse(source) if isinstance(source, str) else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    function = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                     and node.name == "get_cuda_version"), None) if tree else None
    if function is None:
        return {"found": False, "patched": None, "line": None}

    def mentions(node, words) -> bool:
        text = ast.dump(node)
        return any(word in text for word in words)

    for statement in function.body:
        spawns = mentions(statement, ("'subprocess'", "'check_output'", "'Popen'"))
        answers_early = mentions(statement, ("'FLASHINFER_CUDA_VERSION'", "attr='cuda'")) and any(
            isinstance(node, ast.Return) for node in ast.walk(statement))
        if answers_early and not spawns:
            return {"found": True, "patched": True, "line": statement.lineno}
        if spawns:
            return {"found": True, "patched": False, "line": statement.lineno}
    return {"found": True, "patched": True, "line": function.lineno}


def flashinfer_facts(stack: dict) -> dict:
    package = locate_package("flashinfer", stack["dirs"])
    if package is None:
        return {"installed": False}
    source_file = os.path.join(package, "jit", "cpp_ext.py")
    dists = stack["distributions"]
    versions = {name: dists[name] for name in FLASHINFER_DISTRIBUTIONS if name in dists}
    return dict(cuda_version_is_patched(read_text(source_file)), installed=True, source=source_file,
                versions=versions, arch_list=os.environ.get("FLASHINFER_CUDA_ARCH_LIST"))


def jit_caches(stack: dict) -> list:
    """The JIT cache folders the installed packages would write to, from the variables they read."""
    home = os.path.expanduser("~")
    env = os.environ.get
    caches = []
    if "sgl-deep-gemm" in stack["distributions"] or locate_package("deep_gemm", stack["dirs"]):
        caches.append({"package": "deep_gemm", "path": env("DG_JIT_CACHE_DIR") or os.path.join(home, ".deep_gemm"),
                       "variable": "DG_JIT_CACHE_DIR", "default": "~/.deep_gemm"})
        sglang = locate_package("sglang", stack["dirs"])
        redirect = read_text(os.path.join(sglang, "srt", "layers", "deep_gemm_wrapper", "compile_utils.py")) \
            if sglang else None
        if redirect and 'os.environ["DG_JIT_CACHE_DIR"] = envs.SGLANG_DG_CACHE_DIR' in redirect:
            base = env("SGLANG_CACHE_DIR") or os.path.join(home, ".cache", "sglang")
            caches.append({"package": "deep_gemm under sglang",
                           "path": env("SGLANG_DG_CACHE_DIR") or os.path.join(os.path.expanduser(base), "deep_gemm"),
                           "variable": "SGLANG_DG_CACHE_DIR", "default": "$SGLANG_CACHE_DIR/deep_gemm",
                           "note": "sglang overwrites DG_JIT_CACHE_DIR with this"})
    if locate_package("flashinfer", stack["dirs"]):
        caches.append({"package": "flashinfer", "variable": "FLASHINFER_WORKSPACE_BASE",
                       "default": "~/.cache/flashinfer",
                       "path": os.path.join(env("FLASHINFER_WORKSPACE_BASE") or home, ".cache", "flashinfer")})
    if locate_package("triton", stack["dirs"]):
        caches.append({"package": "triton", "variable": "TRITON_CACHE_DIR", "default": "~/.triton/cache",
                       "path": env("TRITON_CACHE_DIR") or os.path.join(env("TRITON_HOME") or home, ".triton", "cache")})
    for cache in caches:
        cache["writable"], cache["why"] = writable(cache["path"])
    return caches


def writable(path: str) -> tuple:
    """(True, how) when a file can be made there, or in the folder that would be created there."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return False, f"{folder} is a file, so {path} cannot be created"
    try:  # a real write: root passes every permission test, but not a read-only file system
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return False, f"cannot write in {folder}: {error.strerror or error}"
    return True, "exists and is writable" if folder == os.path.abspath(path) else f"can be created in {folder}"
