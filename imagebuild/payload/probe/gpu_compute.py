"""Tier 4, only where a GPU is visible: a small deep_gemm GEMM against a torch reference and a
FlashInfer op against its formula, on whatever GPU this is (deep_gemm has kernels for SM90, SM100
and SM120; other archs skip that part). Never run on the machines imagebuild is developed on,
which have no GPU: the GPU runs in the task's device checks.
"""

from __future__ import annotations

from .report import FAIL, PASS, SKIP, make_check
from .system import last_line, run_python_json

_COMPUTE = """
import json, torch
report = {"device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0))}
torch.manual_seed(0)

def relative_error(got, want):
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()

major = report["capability"][0]
if major not in (9, 10, 12):
    report["deep_gemm"] = {"skipped": "deep_gemm has no kernels for sm_%d%d" % tuple(report["capability"])}
else:
    try:
        import deep_gemm
        a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
        d = torch.empty(256, 384, device="cuda", dtype=torch.bfloat16)
        deep_gemm.bf16_gemm_nt(a, b, d)
        torch.cuda.synchronize()
        error = relative_error(d, a.float() @ b.float().t())
        report["deep_gemm"] = {"ok": error < 2e-2, "relative_error": error, "op": "bf16_gemm_nt 256x384x512"}
    except Exception as exc:
        report["deep_gemm"] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, str(exc)[:400])}
try:
    import flashinfer
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    y = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
    torch.cuda.synchronize()
    xf = x.float()
    want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    error = relative_error(y, want)
    report["flashinfer"] = {"ok": error < 2e-2, "relative_error": error, "op": "norm.rmsnorm 64x1024"}
except Exception as exc:
    report["flashinfer"] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, str(exc)[:400])}
print(json.dumps(report))
"""
COMPUTE_TIMEOUT_S = 900  # FlashInfer JIT-compiles its kernel on first use


def check_gpu_compute(expect: dict, gpu_visible: bool) -> dict:
    name = "gpu-compute"
    if not gpu_visible:
        return make_check(name, SKIP, "no GPU visible")
    if not expect.get("torch_cuda"):
        return make_check(name, SKIP, "no torch in the lock")
    answer, status, tail = run_python_json(_COMPUTE, timeout=COMPUTE_TIMEOUT_S)
    if answer is None:
        return make_check(name, FAIL, f"the GPU run did not finish: {last_line(tail)}")
    parts = {k: answer[k] for k in ("deep_gemm", "flashinfer") if k in answer}
    failed = [f"{k}: {v.get('error') or 'relative error %.3g' % v.get('relative_error', -1)}"
              for k, v in parts.items() if "skipped" not in v and not v.get("ok")]
    where = f"{answer.get('device')} (sm_{''.join(map(str, answer.get('capability', [])))})"
    if failed:
        return make_check(name, FAIL, f"on {where}: " + "; ".join(failed), **answer)
    done = ", ".join(f"{k} {v['op']} (error {v['relative_error']:.2g})" if "op" in v else f"{k} {v['skipped']}"
                     for k, v in parts.items())
    return make_check(name, PASS, f"on {where}: {done}", **answer)
