"""Doctor mode: the same probe pointed at a live host, venv or container.

Facts come from reading files and running small tools (nvidia-smi, nvcc/ptxas --version); no ML
package is imported, so a full SGLang stack answers in about a second. Rules that need
imagebuild/knowledge/compat.toml (the driver's newest CUDA, glibc vs nvcc, GPU arch vs nvcc) run
host-side in imagebuild/flows/doctor.py over report["facts"]; everything here needs only these facts.
The findings leave as make_finding dicts (report.py), the wire form imagebuild/knowledge/finding.py
reads with from_probe.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time

from .consumers import (FLASHINFER_DISTRIBUTIONS, consumer_homes, deep_gemm_jit_facts, find_toolkits,
                        flashinfer_facts, jit_caches)
from .environments import (STACK_DISTRIBUTIONS, choose_stack, distributions_in, interpreter_facts, stack_in,
                           venv_candidates, venv_facts)
from .findings_cuda import (CONSUMER_LABELS, CUDA_VERSIONED, finding_consumer, finding_cuda_home_rule,
                            finding_cuda_versions, finding_toolkits)
from .findings_kernels import finding_deep_gemm_cache, finding_quantized_kernels, read_manifest
from .findings_host import (finding_driver, finding_flashinfer, finding_gpu_arch, finding_jit_cache, finding_python,
                            finding_triton)
from ..gpus import DRIVER_VERSION_FILE, read_driver, torch_facts
from ..report import FAIL, make_finding, make_report
from ..system import glibc_version


def gather_facts(driver_file: str = DRIVER_VERSION_FILE) -> dict:
    """Everything the doctor findings look at; the stack is the running interpreter's or a venv nearby."""
    running = {"executable": sys.executable, "prefix": sys.prefix, "version": platform.python_version(),
               "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
               "dirs": [path for path in sys.path if path and os.path.isdir(path)]}
    running["distributions"] = distributions_in(running["dirs"])
    running["stack"] = stack_in(running["distributions"])
    venvs = [venv_facts(path) for path in venv_candidates(os.getcwd(), os.path.expanduser("~"))]
    stack = choose_stack(running, venvs)
    on_path = {}
    for command in ("python3", "python"):
        found = shutil.which(command)
        on_path[command] = interpreter_facts(found) if found else None
    return {"driver": read_driver(driver_file), "glibc": glibc_version(), "running": running, "venvs": venvs,
            "stack": stack, "on_path": on_path, "toolkits": find_toolkits(stack["dirs"]),
            "consumers": consumer_homes(stack), "torch": torch_facts(stack),
            "deep_gemm_jit": deep_gemm_jit_facts(stack), "caches": jit_caches(stack),
            "flashinfer": flashinfer_facts(stack)}


def doctor_findings(facts: dict) -> list:
    findings = [("driver", finding_driver), ("python", finding_python), ("toolkits", finding_toolkits)]
    installed = [name for name in CONSUMER_LABELS if facts["consumers"][name]["installed"]]
    findings += [(f"cuda-home:{name}", lambda facts, name=name: finding_consumer(facts, name)) for name in installed]
    if not installed:
        findings.append(("cuda-home", finding_cuda_home_rule))
    findings += [("triton-ptxas", finding_triton), ("cuda-versions", finding_cuda_versions),
                 ("gpu-arch", finding_gpu_arch), ("flashinfer-cuda-version", finding_flashinfer)]
    findings += [(f"jit-cache:{cache['package']}", lambda facts, cache=cache: finding_jit_cache(cache, facts))
                 for cache in facts["caches"]]
    findings.append(("deep-gemm-cache", lambda facts: finding_deep_gemm_cache(facts, read_manifest())))
    findings.append(("nvfp4-kernels", finding_quantized_kernels))
    results = []
    for name, run in findings:
        try:
            results.append(run(facts))
        except Exception as error:
            results.append(make_finding(name, FAIL, f"the probe itself failed: {type(error).__name__}: {error}"))
    return results


def public_facts(facts: dict) -> dict:
    """The facts without the full package listings (the report stays readable)."""
    keep = set(STACK_DISTRIBUTIONS + CUDA_VERSIONED + FLASHINFER_DISTRIBUTIONS)
    dists = facts["stack"]["distributions"]
    stack = dict(facts["stack"], distributions={name: version for name, version in dists.items() if name in keep})
    running = {key: value for key, value in facts["running"].items() if key != "distributions"}
    return dict(facts, stack=stack, running=running)


def run_doctor(driver_file: str = DRIVER_VERSION_FILE) -> dict:
    started = time.monotonic()
    try:
        facts = gather_facts(driver_file)
    except Exception as error:  # the report still comes back, with the reason
        report = make_report([make_finding("facts", FAIL, f"the probe could not gather facts: "
                                                         f"{type(error).__name__}: {error}")])
        return dict(report, mode="doctor", facts={})
    report = make_report(doctor_findings(facts))
    return dict(report, mode="doctor", facts=public_facts(facts), seconds=round(time.monotonic() - started, 2))
