"""Check gpu-kernels, where a GPU is visible: the image's kernels run on this GPU and give torch's answers.

With [aot]: every kernel of the manifest is launched through the library's own public call (gpu_launch.py, in a
child with FLASHINFER_DISABLE_JIT=1, SGLANG_CRASH_ON_JIT_COMPILE=1 and nvcc hidden) against a float32 torch
reference. It fails when the GPU's arch is not one [aot].archs runs on, when a launch fails or is over tolerance,
when a manifest kernel was never launched, when the child exits non-zero or answers nothing, and when nvcc was
asked to compile; where [aot] seeded Triton's cache, when a seeded kernel for this GPU was compiled rather than
served from it. deep_gemm: its FP8 and bf16 GEMMs where the image keeps its JIT (first-call seconds are its
compile), proof that SGLang sees it off where [aot] disables it.
Without [aot]: FlashInfer's rmsnorm and deep_gemm's bf16 GEMM, compiled on the spot by JIT, and the check says so.
Never run on the machines imagebuild is developed on, which have no GPU; the verdict is tested on recorded answers.
"""

from __future__ import annotations

import os

from ..gpus import runs_on
from ..report import FAIL, PASS, SKIP, make_check
from ..system import last_line, run_python_json
from .zero_jit import cuda_home_of, hideable, read_manifest, run_jit_off

NAME = "gpu-kernels"
TOLERANCE = 2e-2  # bf16 output against float32: the H200 run measured 0.002-0.005
LAUNCH_TIMEOUT_S = 900  # deep_gemm compiles its GEMMs on first use where its JIT is kept


def check_gpu_kernels(expect: dict, gpu_visible: bool) -> dict:
    if not gpu_visible:
        return make_check(NAME, SKIP, "no GPU visible")
    if not expect.get("torch_cuda"):
        return make_check(NAME, SKIP, "no torch in the lock")
    spec = expect.get("aot")
    if not spec:
        return check_jit_compute()
    manifest, error = read_manifest(spec)
    if error:
        return make_check(NAME, FAIL, error, path=spec.get("manifest", ""))
    cuda_home = cuda_home_of(expect)
    if not hideable(cuda_home):
        return make_check(NAME, FAIL, f"cannot hide {cuda_home}/bin/nvcc for the launches (missing or read-only)")
    answer, status, errors, nvcc_calls, _ = run_jit_off("checks.gpu_launch", [], spec, manifest, cuda_home, LAUNCH_TIMEOUT_S)
    return kernels_verdict(answer, status, errors, manifest, spec, nvcc_calls)


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _real(path: str) -> str:
    return os.path.realpath(path) if path else ""


def arch_problem(answer: dict, archs: list) -> str | None:
    """The GPUs [aot].archs has no code for, named with the archs."""
    gpus = [gpu for gpu in _list(answer.get("gpus")) if isinstance(gpu, dict)] or [{"name": answer.get("device"),
                                                                 "capability": answer.get("capability")}]
    uncovered = [gpu for gpu in gpus if not runs_on([f"sm_{a.replace('.', '')}" for a in archs], str(gpu.get("capability")))]
    if not uncovered:
        return None
    named = ", ".join(f"{gpu.get('name')} (compute capability {gpu.get('capability')})" for gpu in uncovered)
    return (f"{named}: [aot].archs {', '.join(archs)} holds no code this GPU runs; add its arch to [aot].archs "
            "and rebuild")


def kernels_verdict(answer, status, errors: str, manifest: dict, spec: dict, nvcc_calls: list = ()) -> dict:
    """The check from the child's answer: every problem found, or what ran, on which GPU, how close to torch."""
    if not isinstance(answer, dict):
        return make_check(NAME, FAIL, f"the GPU launches printed no result (exit {status}): {(errors or '')[-1500:]}")
    launches = [entry for entry in _list(answer.get("launches")) if isinstance(entry, dict)]
    evidence = {"device": answer.get("device"), "capability": answer.get("capability"), "gpus": answer.get("gpus"),
                "launches": launches, "deep_gemm": answer.get("deep_gemm"), "nvcc_calls": list(nvcc_calls)}
    problems = []
    if status != 0:
        problems.append(f"the launches exited {status}: {last_line(errors or '')}")
    uncovered = arch_problem(answer, [str(arch) for arch in spec.get("archs") or []])
    if uncovered:
        problems.append(uncovered)
    if not launches:
        problems.append("nothing was launched")
    for entry in launches:
        where = f"{entry.get('shape')} {entry.get('call')}"
        error = entry.get("relative_error")
        if entry.get("error"):
            problems.append(f"{where}: {entry['error']}")
        elif not isinstance(error, (int, float)) or error != error:
            problems.append(f"{where}: no relative error reported")
        elif error > TOLERANCE:
            problems.append(f"{where}: relative error {error:.3g} over {TOLERANCE}")
    problems.extend(coverage_problems(launches, manifest))
    problems.extend(triton_problems(launches, manifest, answer.get("capability")))
    problems.extend(deep_gemm_problems(answer.get("deep_gemm"), spec, launches))
    if nvcc_calls:
        problems.append(f"nvcc was asked to compile {len(nvcc_calls)} time(s)")
    where = f"{answer.get('device')} (compute capability {answer.get('capability')})"
    if problems:
        return make_check(NAME, FAIL, f"on {where}: " + " | ".join(problems), **evidence)
    worst = max(launches, key=lambda entry: entry["relative_error"])
    kernels = [a for a in manifest.get("artifacts", []) if a.get("kind") in ("flashinfer", "sglang")]
    return make_check(NAME, PASS, (
        f"on {where}: {len(launches)} launches through FlashInfer's wrappers and SGLang's ops with JIT off and nvcc "
        f"hidden ran all {len(kernels)} prebuilt kernels of the manifest; worst relative error "
        f"{worst['relative_error']:.2g} ({worst.get('shape')} {worst.get('call')}); {_triton_said(launches)}"
        f"{_deep_gemm_said(answer.get('deep_gemm'))}"), **evidence)


def coverage_problems(launches: list, manifest: dict) -> list:
    """Manifest kernels no successful launch loaded; prebuilt files loaded that the manifest does not list."""
    kernels = {_real(str(a.get("path", ""))): a for a in _list(manifest.get("artifacts"))
               if isinstance(a, dict) and a.get("kind") in ("flashinfer", "sglang")}
    if not kernels:
        return ["the manifest lists no kernel: there is nothing to launch"]
    launched = set()
    for entry in launches:
        if not entry.get("error"):
            launched |= {_real(path) for path in _list(entry.get("loaded")) if isinstance(path, str)}
    problems = []
    never = sorted(f"{a.get('name')} ({a.get('kind')})" for path, a in kernels.items() if path not in launched)
    if never:
        problems.append("never launched: " + ", ".join(never))
    unlisted = sorted(launched - set(kernels))
    if unlisted:
        problems.append("launched prebuilt files the manifest does not list: " + ", ".join(unlisted))
    return problems


def _triton_events(launches: list) -> list:
    """(launch, event) for each compile or cache hit Triton's listener recorded during a Triton launch."""
    return [(entry, event) for entry in launches if isinstance(entry, dict) and str(entry.get("call", "")).startswith("triton ")
            for event in _list(entry.get("triton")) if isinstance(event, dict)]


def triton_target(capability) -> int | None:
    """Triton's target number for a compute capability: "9.0" -> 90, "12.0" -> 120."""
    major, _, minor = str(capability).partition(".")
    return int(major) * 10 + int(minor or 0) if major.isdigit() and (minor or "0").isdigit() else None


def triton_problems(launches: list, manifest: dict, capability) -> list:
    """With a seeded Triton cache: every kernel the seed wrote for this GPU's target was served from it (Triton's
    own listener said cache hit, at the seeded key) and nothing was compiled here."""
    seeded = manifest.get("triton")
    if not isinstance(seeded, dict):
        return []
    launches = [entry for entry in _list(launches) if isinstance(entry, dict)]
    target = triton_target(capability)
    keys = {k.get("hash"): k for k in _list(seeded.get("kernels")) if isinstance(k, dict) and k.get("target") == target}
    if not any(str(entry.get("call", "")).startswith("triton ") for entry in launches):
        return ["the image seeds Triton's cache but no Triton launch ran"]
    events = _triton_events(launches)
    problems = []
    compiled = sorted({f"{event.get('kernel')} ({entry.get('call')})" for entry, event in events if not event.get("hit")})
    if compiled:
        problems.append("Triton compiled on this GPU what the image's cache did not serve: " + ", ".join(compiled))
    served = {event.get("hash") for _, event in events if event.get("hit")}
    never = sorted(f"{k.get('kernel')} {str(key)[:12]}" for key, k in keys.items() if key not in served)
    if never:
        problems.append(f"seeded for sm_{target} but not served from the cache here: " + ", ".join(never))
    return problems


def _triton_said(launches: list) -> str:
    hits = sorted({f"{event.get('kernel')}" for _, event in _triton_events(launches) if event.get("hit")})
    if not hits:
        return ""
    return f"Triton served {len(hits)} seeded kernel(s) from the image's cache ({', '.join(hits)}); "


def deep_gemm_problems(state, spec: dict, launches: list) -> list:
    mode = spec.get("deep_gemm", "jit")
    state = state if isinstance(state, dict) else {}
    if mode == "disabled":
        if state.get("SGLANG_ENABLE_JIT_DEEPGEMM") != "0":
            return ["[aot] disables deep_gemm but SGLANG_ENABLE_JIT_DEEPGEMM is "
                    f"{state.get('SGLANG_ENABLE_JIT_DEEPGEMM')!r} in the image, not '0'"]
        if spec.get("sglang") and state.get("sglang_enabled") is not False:
            return [f"[aot] disables deep_gemm but SGLang reads it as on: {state.get('sglang_error') or state.get('sglang_enabled')}"]
        return []
    if not any(str(entry.get("call", "")).startswith("deep_gemm") for entry in launches):
        return ["the image keeps deep_gemm's JIT but no deep_gemm GEMM was launched"]
    return []


def _deep_gemm_said(state) -> str:
    if isinstance(state, dict) and state.get("mode") == "disabled":
        return "deep_gemm's JIT is off (SGLANG_ENABLE_JIT_DEEPGEMM=0" + \
            (", and SGLang reads it so)" if state.get("sglang_enabled") is False else ")")
    return "deep_gemm's GEMMs compiled on first use (their first_s)"


# --- without [aot]: what the image compiles on first use, compiled and checked here -----------------

_JIT_COMPUTE = """
import json, os, time, torch
report = {"device": torch.cuda.get_device_name(0), "capability": "%d.%d" % torch.cuda.get_device_capability(0)}
torch.manual_seed(0)
def relative_error(got, want):
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
runs = []
try:
    import flashinfer
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    started = time.monotonic()
    y = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
    torch.cuda.synchronize()
    xf = x.float()
    want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    runs.append({"call": "flashinfer norm.rmsnorm 64x1024", "relative_error": relative_error(y, want),
                 "first_s": round(time.monotonic() - started, 1)})
except Exception as exc:
    runs.append({"call": "flashinfer norm.rmsnorm 64x1024", "error": "%s: %s" % (type(exc).__name__, str(exc)[:400])})
if torch.cuda.get_device_capability(0)[0] in (9, 10, 12):
    try:
        import deep_gemm
        a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
        d = torch.empty(256, 384, device="cuda", dtype=torch.bfloat16)
        started = time.monotonic()
        deep_gemm.bf16_gemm_nt(a, b, d)
        torch.cuda.synchronize()
        runs.append({"call": "deep_gemm bf16_gemm_nt 256x384x512", "relative_error": relative_error(d, a.float() @ b.float().t()),
                     "first_s": round(time.monotonic() - started, 1)})
    except Exception as exc:
        runs.append({"call": "deep_gemm bf16_gemm_nt 256x384x512", "error": "%s: %s" % (type(exc).__name__, str(exc)[:400])})
report["launches"] = runs
report["flashinfer_arch_list"] = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
print(json.dumps(report))
"""


def check_jit_compute() -> dict:
    """No [aot]: the image compiles its kernels on first use; compile two and check them against torch."""
    answer, status, tail = run_python_json(_JIT_COMPUTE, timeout=LAUNCH_TIMEOUT_S)
    return jit_verdict(answer, status, tail)


def jit_verdict(answer, status, errors: str) -> dict:
    if not isinstance(answer, dict):
        return make_check(NAME, FAIL, f"the GPU run printed no result (exit {status}): {last_line(errors or '')}")
    launches = [entry for entry in _list(answer.get("launches")) if isinstance(entry, dict)]
    problems = [f"the GPU run exited {status}: {last_line(errors or '')}"] if status != 0 else []
    listed = str(answer.get("flashinfer_arch_list") or "").split()
    if listed and not runs_on([f"sm_{a.replace('.', '')}" for a in listed], str(answer.get("capability"))):
        problems.append(f"FLASHINFER_CUDA_ARCH_LIST {' '.join(listed)} compiles nothing compute capability "
                        f"{answer.get('capability')} runs")
    if not launches:
        problems.append("nothing was launched")
    for entry in launches:
        error = entry.get("relative_error")
        if entry.get("error"):
            problems.append(f"{entry.get('call')}: {entry['error']}")
        elif not isinstance(error, (int, float)) or error != error or error > TOLERANCE:
            problems.append(f"{entry.get('call')}: relative error {error} over {TOLERANCE}")
    where = f"{answer.get('device')} (compute capability {answer.get('capability')})"
    evidence = {"device": answer.get("device"), "capability": answer.get("capability"), "launches": launches}
    if problems:
        return make_check(NAME, FAIL, f"on {where}: " + " | ".join(problems), **evidence)
    done = ", ".join(f"{e['call']} (error {e['relative_error']:.2g}, {e.get('first_s')} s with its compile)" for e in launches)
    return make_check(NAME, PASS, f"on {where}: the recipe has no [aot] table, so its kernels compile on first use; "
                                  f"compiled and ran {done}", **evidence)
