"""The ML stack tiers: imports, torch's CUDA, FlashInfer under Dynamo, and the GPU check.

Each tier runs in its own process under this interpreter, so one that crashes or hangs costs only
its own check. Without a GPU, a module whose native code links libcuda.so.1 is imported against a
no-device driver stand-in built in the scratch folder.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ..report import FAIL, PASS, SKIP, WARN, make_check
from ..system import last_line, major_minor, package_dir, run_command, run_python_json

_IMPORT = ("import importlib, json, sys, time; t = time.time(); m = importlib.import_module(sys.argv[1]); "
           "print(json.dumps({'version': str(getattr(m, '__version__', '') or ''), "
           "'seconds': round(time.time() - t, 2)}))")
_TORCH_CUDA = "import json, torch; print(json.dumps({'cuda': torch.version.cuda, 'torch': torch.__version__}))"

# The seed bug (sglang issue 23386): FlashInfer's get_cuda_version() spawned nvcc, which Dynamo cannot
# trace, so piecewise CUDA graph capture died. fullgraph=True turns any graph break into an error.
_DYNAMO = """
import json, torch
from flashinfer.jit import cpp_ext
def uses_cuda_version(x):
    return x + cpp_ext.get_cuda_version().major
try:
    out = torch.compile(uses_cuda_version, fullgraph=True, backend="eager")(torch.ones(2))
    print(json.dumps({"ok": True, "value": out.tolist()}))
except Exception as error:
    print(json.dumps({"ok": False, "error": type(error).__name__ + ": " + str(error)[:600]}))
"""
CUDA_ERROR_NO_DEVICE = 100  # what every call of the no-device driver stand-in answers


def gpu_visible() -> bool:
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def driver_symbols(package_dir: str) -> list:
    """The CUDA driver API functions (cu*) that a package's shared libraries import."""
    nm = shutil.which("nm")
    symbols = set()
    for root, _, files in os.walk(package_dir) if nm else ():
        for name in files:
            if ".so" in name:
                status, output = run_command([nm, "-D", "--undefined-only", os.path.join(root, name)])
                symbols.update(re.findall(r"\bU (cu[A-Z]\w*)", output or "") if status == 0 else ())
    return sorted(symbols | {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount"})


def build_no_device_driver(package_dir: str, workdir: str) -> str | None:
    """A stand-in libcuda.so.1 whose every call answers CUDA_ERROR_NO_DEVICE, built in the probe's scratch
    folder and only put on the import's library path: what a host driver with no GPU would say. It never
    enters the image (the container must use the host's own driver)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    folder = os.path.join(workdir, "no-device-driver")
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(folder, "libcuda.c")
    with open(source, "w") as handle:
        handle.writelines(f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n"
                          for name in driver_symbols(package_dir))
    status, _ = run_command([cc, "-shared", "-fPIC", "-o", os.path.join(folder, "libcuda.so.1"), source])
    return folder if status == 0 else None


def import_module(module: str, workdir: str) -> tuple:
    """(answer or None, error tail, how): import in a fresh process; without a GPU, retry a module whose
    native code links libcuda.so.1 directly against a no-device driver."""
    answer, status, tail = run_python_json(_IMPORT, module)
    if answer is not None and status == 0:
        return answer, None, "plain"
    top = package_dir(module.split(".")[0]) or ""
    if "libcuda.so.1" not in tail or gpu_visible() or not top:
        return None, last_line(tail) or f"exit {status}", "plain"
    stub = build_no_device_driver(top, workdir)
    if stub is None:
        return None, last_line(tail) + " (and no C compiler to build a no-device driver stand-in)", "plain"
    env = dict(os.environ, LD_LIBRARY_PATH=stub + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
    answer, status, tail = run_python_json(_IMPORT, module, env=env)
    if answer is not None and status == 0:
        return answer, None, "no-device driver"
    return None, last_line(tail) or f"exit {status}", "no-device driver"


def check_imports(expect: dict, workdir: str | None = None, jobs: int = 1) -> dict:
    """Each module imported in its own process, `jobs` at a time (each stand-in driver in its own
    folder); the seconds are each import's wall time, so they grow with jobs on a busy machine."""
    modules = expect.get("imports") or []
    if not modules:
        return make_check("imports", SKIP, "the recipe asks for no import checks")
    imported, failed, stubbed = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="probe-imports-", dir=workdir) as scratch:
        def one(numbered):
            number, module = numbered
            return import_module(module, os.path.join(scratch, str(number)))

        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(modules)))) as pool:
            answers = list(pool.map(one, enumerate(modules)))
        for module, (answer, error, how) in zip(modules, answers):
            if answer is None:
                failed[module] = error
            else:
                imported[module] = answer
            if how == "no-device driver":
                stubbed.append(module)
    if failed:
        return make_check("imports", FAIL, "; ".join(f"{m}: {e}" for m, e in failed.items()),
                          imported=imported, failed=failed, no_device_driver=stubbed)
    summary = ", ".join(f"{m} {a['version'] or ''} ({a['seconds']} s)".replace("  ", " ")
                        for m, a in imported.items())
    note = (f"; {', '.join(stubbed)} links libcuda.so.1 and was imported against a no-device driver "
            "stand-in (no GPU here)") if stubbed else ""
    return make_check("imports", PASS, f"imported without a GPU: {summary}{note}", imported=imported,
                      no_device_driver=stubbed)


def check_torch_cuda(expect: dict) -> dict:
    wanted = expect.get("torch_cuda")
    if not wanted:
        return make_check("torch-cuda", SKIP, "no torch in the lock")
    answer, status, tail = run_python_json(_TORCH_CUDA)
    if answer is None:
        return make_check("torch-cuda", FAIL, f"torch did not import: {last_line(tail)}")
    if major_minor(answer.get("cuda")) != major_minor(wanted):
        return make_check("torch-cuda", FAIL, f"torch {answer.get('torch')} is built for CUDA "
                          f"{answer.get('cuda')}, the recipe's toolkit is {wanted}", **answer)
    return make_check("torch-cuda", PASS, f"torch {answer['torch']} built for CUDA {answer['cuda']}", **answer)


def check_flashinfer_dynamo(expect: dict) -> dict:
    name = "flashinfer-dynamo"
    if not expect.get("flashinfer_dynamo"):
        return make_check(name, SKIP, "no FlashInfer with torch in the lock")
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_CUDA_VERSION"}
    answer, status, tail = run_python_json(_DYNAMO, env=env)
    if answer is None:
        return make_check(name, FAIL, f"the Dynamo probe did not run: {last_line(tail)}")
    if not answer.get("ok"):
        return make_check(name, FAIL, "torch.compile(fullgraph=True) of a function calling FlashInfer's "
                          f"get_cuda_version() failed: {answer.get('error')}", **answer)
    return make_check(name, PASS, "torch.compile(fullgraph=True) traces FlashInfer's get_cuda_version() "
                      "without a subprocess", **answer)


def check_gpu() -> dict:
    smi = shutil.which("nvidia-smi")
    if smi is None and not os.path.exists("/dev/nvidiactl"):
        return make_check("gpu", SKIP, "no GPU visible")
    if smi is None:
        return make_check("gpu", WARN, "/dev/nvidiactl exists but nvidia-smi is not on PATH")
    status, output = run_command([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
    if status != 0:
        return make_check("gpu", FAIL, f"nvidia-smi failed: {output.strip()[-200:]}", nvidia_smi=smi)
    gpus = [dict(zip(("name", "driver", "compute_cap"), (part.strip() for part in line.split(","))))
            for line in output.splitlines() if line.strip()]
    if not gpus:  # the driver's tool is here and sees no device: nothing was checked, and a GPU was expected
        return make_check("gpu", FAIL, "nvidia-smi listed no GPU: the driver is visible but no device is (in a "
                          "container: docker run --gpus all)", nvidia_smi=smi, gpus=gpus, output=output.strip()[-200:])
    detail = "; ".join(f"{g.get('name')} (compute {g.get('compute_cap')}, driver {g.get('driver')})" for g in gpus)
    return make_check("gpu", PASS, detail, nvidia_smi=smi, gpus=gpus)
