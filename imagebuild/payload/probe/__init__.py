"""Check a built image, or a live host, against what its lock expects.

Stdlib only, Python >= 3.9, and its modules import one another only relatively: the renderer packs
this package into every image as one zipapp, /opt/imagebuild/probe.pyz (bundle.py), the smoke stage
runs it there, and `imagebuild doctor` ships the same zipapp to a host interpreter or a container.
Each check is a small function returning a plain dict.

Split by what runs when; shared at the top:

    report.py         statuses, the check / finding / report dicts
    system.py         readers of the running system, and the text helpers they share
    gpus.py           driver, GPUs, the archs torch carries
    expect.py         expect.json's schema (SCHEMA), the renderer's promise the checks hold the image to
    waste.py          what a site-packages tree cannot use on the target GPU (prune candidates; --waste)
    cli.py            run_probe and the command line (--expect, or --doctor, --inventory, --waste)
    bundle.py         the zipapp: deterministic bytes, and the bootstrap that ships it inline
    __main__.py       `python probe.pyz`: cli.main

    checks/           what the smoke test runs in a built image (cli.py names the tiers)
      toolchain.py      checks: interpreter, packages, cuda-toolchain, cuda-home
      stack.py          checks: imports, torch-cuda, flashinfer-dynamo, gpu
      deep_gemm.py      check: deep-gemm-sm120 (kernels compiled the way deep_gemm's JIT would)
        deep_gemm_release.py  what the installed release compiles: kernel headers, template parameters, flags
        cxx_source.py         just enough C++ reading for that
      zero_jit.py       check: zero-jit (the prebuilt kernels are there, for the recipe's GPUs, and found)
      gpu_kernels.py    check: gpu-kernels, where a GPU is visible: the image's kernels run here and match torch
        gpu_launch.py   its child: every prebuilt kernel launched through FlashInfer's wrappers and SGLang's ops
    kernels/          what the [aot] build step runs (copied into its aot/ folder beside waste.py, run as scripts)
      kernels_aot.py    builds the serving shapes' kernels in the image's build step (drives the stack)
        kernels_moe.py  which FlashInfer modules a quantized MoE shape loads on SM12x, read from its source
      kernel_cache.py   the kernel cache those builds keep across builds, keyed by what decides their bytes
        kernel_inputs.py  what a FlashInfer module's compile reads (its #include closure), and its key
      compile_resume.py an interrupted compile resumes from the objects it finished
      kernels_triton.py the forward's Triton kernels, compiled into Triton's cache for the [aot] GPUs, no GPU here
      deterministic_pid.c  the C shim [aot]'s compiles run under, so their bytes repeat
    doctor/           doctor mode (--doctor): gather a live host's facts, make the findings
      doctor.py         run_doctor
      environments.py   interpreters and venvs, and which one holds the ML stack
      consumers.py      CUDA toolkits in sight and which one each consumer uses; JIT caches
      findings_cuda.py  findings on toolkits, CUDA homes and CUDA versions
      findings_host.py  findings on driver, interpreter, Triton, GPU arch, FlashInfer, caches
      findings_kernels.py  findings on prebuilt kernels: deep_gemm's JIT cache, [aot]'s kernels for this GPU
    inventory/        inventory mode (--inventory): what an environment holds, for `imagebuild adopt`

The names below are what imagebuild (flows/doctor.py, knowledge/finding.py) and the tests use.
"""

from .doctor.consumers import cuda_version_is_patched, triton_ptxas_for
from .checks.deep_gemm import EM_CUDA, check_deep_gemm_sm120, parse_cubin_header
from .checks.deep_gemm_release import (SM120, SM120_KERNELS, Unreadable, jit_command, jit_generators, kernel_arguments, kernel_plan,
                                scan_strings, sm_targets)
from .doctor.doctor import run_doctor
from .doctor.environments import parse_dist_dir
from .expect import load_expect, validate_expect
from .doctor.findings_cuda import CONSUMER_LABELS, CUDA_VERSIONED, finding_cuda_versions
from .doctor.findings_host import finding_gpu_arch
from .gpus import (arch_number, parse_arch_list, parse_driver_version_file, parse_smi_gpus, parse_torch_version_file,
                   runs_on)
from .report import ERROR, FAIL, INFO, PASS, SKIP, UNKNOWN, WARN, WARNING, make_check, make_finding, make_report, shell_fix
from .checks.stack import check_flashinfer_dynamo, check_gpu, check_imports, check_torch_cuda
from .system import canonical_name, major_minor, parse_nvcc_release
from .checks.toolchain import check_cuda_home, check_cuda_toolchain, check_interpreter, check_packages

__all__ = [
    "run_doctor", "load_expect", "validate_expect",
    "PASS", "FAIL", "SKIP", "WARN", "UNKNOWN", "ERROR", "WARNING", "INFO", "make_check", "make_finding", "make_report",
    "shell_fix", "canonical_name", "major_minor", "parse_nvcc_release",
    "check_interpreter", "check_packages", "check_cuda_toolchain", "check_cuda_home",
    "EM_CUDA", "SM120", "check_deep_gemm_sm120", "parse_cubin_header", "scan_strings",
    "SM120_KERNELS", "Unreadable", "jit_command", "jit_generators", "kernel_arguments", "kernel_plan", "sm_targets",
    "check_imports", "check_torch_cuda", "check_flashinfer_dynamo", "check_gpu",
    "parse_dist_dir", "arch_number", "parse_arch_list", "parse_driver_version_file", "parse_smi_gpus",
    "parse_torch_version_file", "runs_on", "cuda_version_is_patched", "triton_ptxas_for",
    "CONSUMER_LABELS", "CUDA_VERSIONED", "finding_cuda_versions", "finding_gpu_arch",
]
