"""The GPU kernels check's child: launch every kernel [aot] prebuilt, the way the server launches it, on this GPU.

Runs on the image's interpreter (or any with the image's packages on its path) with FLASHINFER_DISABLE_JIT=1,
SGLANG_CRASH_ON_JIT_COMPILE=1 and nvcc hidden, so a kernel that is not prebuilt fails its launch instead of
compiling. Each launch goes through the library's own public call, as SGLang 0.5.23 makes it: FlashInfer's
ragged and paged prefill and paged decode wrappers (plan, then run; page size 1, scattered pages), its
cascade merge and top-k/top-p sampling, SGLang's own ops for its cached kernels, and SGLang's Triton launches
the [aot] step seeded into Triton's cache (Triton's own listener says whether each came from that cache). Every
result is compared with a float32 torch reference (integer results must match exactly). Which prebuilt files a
launch loaded is read from /proc/self/maps before and after it, so nothing here names a module: the verdict
(gpu_kernels.py) matches them to the manifest.

    python gpu_launch.py AOT_JSON MANIFEST   prints one JSON answer
"""

from __future__ import annotations

import json
import os
import sys
import time

try:
    from ..kernels import kernels_aot, kernels_triton
except ImportError:  # run as a script beside kernels_aot.py
    import kernels_aot
    import kernels_triton

REPEATS = 3  # warm runs timed after the first launch; the median is reported


class Launches:
    """Runs each launch, times it and records what it loaded; a launch that raises is a result, not a crash."""

    def __init__(self, roots: list):
        self.roots = [root for root in roots if root]
        self.results = []

    def mapped(self) -> set:
        found = set()
        for root in self.roots:
            found |= kernels_aot.mapped_under(root)
        return found

    def run(self, shape: str, what: str, launch) -> None:
        import torch
        before = self.mapped()
        started = time.monotonic()
        entry = {"shape": shape, "call": what}
        try:
            metrics, again = launch()
            torch.cuda.synchronize()
            entry["first_s"] = round(time.monotonic() - started, 3)
            entry.update(metrics)
            entry["ms"] = _median_ms(again) if again else None
        except Exception as error:  # a miss under FLASHINFER_DISABLE_JIT, a refused compile, a wrong call
            entry["error"] = f"{type(error).__name__}: {error}"[:800]
        entry["loaded"] = sorted(self.mapped() - before)
        self.results.append(entry)


def _median_ms(again) -> float:
    import torch
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        again()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(sorted(times)[len(times) // 2], 4)


def relative_error(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


# --- references, in float32 ------------------------------------------------------------------------

def attention_reference(q, k, v, causal: bool):
    """One sequence: q [Lq, Hq, D], k and v [Lk, Hkv, D]; grouped heads; causal aligned to the end (an extend)."""
    import torch
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * q.shape[-1] ** -0.5
    if causal:
        offset = k.shape[0] - q.shape[0]
        rows = torch.arange(q.shape[0], device=q.device)[:, None] + offset
        scores = scores.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > rows, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def rmsnorm_reference(x, weight, eps: float):
    import torch
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rope_reference(x, cos, sin, rotary: int, neox: bool):
    import torch
    x = x.float()
    rot, rest = x[..., :rotary], x[..., rotary:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if neox:
        first, second = rot[..., : rotary // 2], rot[..., rotary // 2:]
        out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    else:
        first, second = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


# --- FlashInfer, through its wrappers as SGLang calls them -----------------------------------------

def _dtype(name: str):
    return kernels_aot._dtype(name)


def _random(shape, dtype, device):
    """Random values in dtype; FP8 tensors are drawn in bfloat16 and cast, as SGLang's KV store casts."""
    import torch
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.randn(shape, device=device, dtype=torch.bfloat16).to(dtype)
    return torch.randn(shape, device=device, dtype=dtype)


def ragged_backend(capability: tuple) -> str:
    """SGLang 0.5.23's ragged prefill backend (flashinfer_backend.py:501-524): "fa2" on SM100, else "auto"
    (FlashInfer's pick: FA3 on sm_90a). The cutlass variant SGLang takes on SM100 for some head dims is not
    prebuilt by [aot]."""
    return "fa2" if capability[0] == 10 else "auto"


def flashinfer_launches(shape: dict, capability: tuple, launches: Launches) -> None:
    import torch
    import flashinfer
    from flashinfer import cascade, decode, prefill, sampling

    device = torch.device("cuda:0")
    dtype, kv_dtype, head_dim = _dtype(shape["dtype"]), _dtype(shape["kv_dtype"]), shape["head_dim"]
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    name = shape["name"]
    for tp in shape["tp"]:
        q_heads, kv_heads = shape["q_heads"] // tp, max(1, shape["kv_heads"] // tp)
        launches.run(name, f"prefill ragged tp{tp} ({ragged_backend(capability)})",
                     lambda: _ragged(prefill, workspace, dtype, q_heads, kv_heads, head_dim, capability))
        launches.run(name, f"prefill paged tp{tp}",
                     lambda: _paged_prefill(prefill, workspace, dtype, kv_dtype, q_heads, kv_heads, head_dim))
        tensor_cores = kernels_aot._tensor_core_decode(shape, q_heads, kv_heads)
        launches.run(name, f"decode tp{tp}{' (tensor cores)' if tensor_cores else ''}",
                     lambda: _decode(decode, workspace, dtype, kv_dtype, q_heads, kv_heads, head_dim, tensor_cores))
    q_heads, kv_heads = shape["q_heads"] // shape["tp"][0], max(1, shape["kv_heads"] // shape["tp"][0])
    if shape["prefix_cache"]:
        launches.run(name, "cascade merge_state",
                     lambda: _cascade(prefill, cascade, workspace, dtype, q_heads, kv_heads, head_dim, capability))
    if shape["sampling"]:
        launches.run(name, "sampling top_k_top_p", lambda: _sampling(sampling))
    del flashinfer


def _pages(lengths: list, pool: int, device):
    """Page size 1, pages scattered over a pool the way a running server's allocator leaves them."""
    import torch
    order = torch.randperm(pool - 1, device=device)[: sum(lengths)].int() + 1
    indptr = torch.tensor([0] + list(_cumsum(lengths)), dtype=torch.int32, device=device)
    return indptr, order, torch.ones(len(lengths), dtype=torch.int32, device=device)


def _cumsum(values: list) -> list:
    total, out = 0, []
    for value in values:
        total += value
        out.append(total)
    return out


def _ragged(prefill, workspace, dtype, q_heads, kv_heads, head_dim, capability):
    import torch
    device, lengths = workspace.device, [37, 64]
    indptr = torch.tensor([0] + _cumsum(lengths), dtype=torch.int32, device=device)
    q = _random((sum(lengths), q_heads, head_dim), dtype, device)
    k, v = (_random((sum(lengths), kv_heads, head_dim), dtype, device) for _ in range(2))
    wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=ragged_backend(capability))
    wrapper.plan(indptr, indptr, q_heads, kv_heads, head_dim, causal=True, q_data_type=dtype)
    out = wrapper.run(q, k, v)
    want = torch.cat([attention_reference(q[a:b], k[a:b], v[a:b], True)
                      for a, b in zip([0] + _cumsum(lengths)[:-1], _cumsum(lengths))])
    return {"relative_error": relative_error(out, want)}, lambda: wrapper.run(q, k, v)


def _paged_prefill(prefill, workspace, dtype, kv_dtype, q_heads, kv_heads, head_dim):
    import torch
    device, kv_lengths, q_lengths, pool = workspace.device, [80, 50], [16, 50], 512
    kv_indptr, pages, last = _pages(kv_lengths, pool, device)
    qo_indptr = torch.tensor([0] + _cumsum(q_lengths), dtype=torch.int32, device=device)
    k_cache, v_cache = (_random((pool, 1, kv_heads, head_dim), kv_dtype, device) for _ in range(2))
    q = _random((sum(q_lengths), q_heads, head_dim), dtype, device)
    wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    wrapper.plan(qo_indptr, kv_indptr, pages, last, q_heads, kv_heads, head_dim, 1, causal=True,
                 q_data_type=dtype, kv_data_type=kv_dtype)
    out = wrapper.run(q, (k_cache, v_cache))
    want = []
    for i, (q_len, kv_len) in enumerate(zip(q_lengths, kv_lengths)):
        rows = pages[kv_indptr[i]:kv_indptr[i + 1]].long()
        want.append(attention_reference(q[qo_indptr[i]:qo_indptr[i + 1]], k_cache[rows, 0].float(),
                                        v_cache[rows, 0].float(), True))
    return {"relative_error": relative_error(out, torch.cat(want))}, lambda: wrapper.run(q, (k_cache, v_cache))


def _decode(decode, workspace, dtype, kv_dtype, q_heads, kv_heads, head_dim, tensor_cores):
    import torch
    device, kv_lengths, pool = workspace.device, [33, 90, 7], 512
    indptr, pages, last = _pages(kv_lengths, pool, device)
    k_cache, v_cache = (_random((pool, 1, kv_heads, head_dim), kv_dtype, device) for _ in range(2))
    q = _random((len(kv_lengths), q_heads, head_dim), dtype, device)
    wrapper = decode.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2", use_tensor_cores=tensor_cores)
    wrapper.plan(indptr, pages, last, q_heads, kv_heads, head_dim, 1, q_data_type=dtype, kv_data_type=kv_dtype)
    out = wrapper.run(q, (k_cache, v_cache))
    want = torch.cat([attention_reference(q[i:i + 1], k_cache[pages[indptr[i]:indptr[i + 1]].long(), 0].float(),
                                          v_cache[pages[indptr[i]:indptr[i + 1]].long(), 0].float(), False)
                      for i in range(len(kv_lengths))])
    return {"relative_error": relative_error(out, want)}, lambda: wrapper.run(q, (k_cache, v_cache))


def _cascade(prefill, cascade, workspace, dtype, q_heads, kv_heads, head_dim, capability):
    """SGLang's prefix-cache extend: attention over the cached prefix and over the new tokens, merged by
    merge_state; the answer must be attention over both."""
    import torch
    device, q_len, prefix = workspace.device, 24, 40
    q = _random((q_len, q_heads, head_dim), dtype, device)
    k, v = (_random((prefix + q_len, kv_heads, head_dim), dtype, device) for _ in range(2))
    indptr = torch.tensor([0, q_len], dtype=torch.int32, device=device)
    parts = []
    for keys in (slice(0, prefix), slice(prefix, prefix + q_len)):
        wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=ragged_backend(capability))
        length = keys.stop - keys.start
        wrapper.plan(indptr, torch.tensor([0, length], dtype=torch.int32, device=device), q_heads, kv_heads, head_dim,
                     causal=keys.start == prefix, q_data_type=dtype)
        parts.append(wrapper.run(q, k[keys].contiguous(), v[keys].contiguous(), return_lse=True))
    (v_a, s_a), (v_b, s_b) = parts
    merged, _ = cascade.merge_state(v_a, s_a, v_b, s_b)
    want = attention_reference(q, k, v, True)
    return {"relative_error": relative_error(merged, want)}, lambda: cascade.merge_state(v_a, s_a, v_b, s_b)


def _sampling(sampling):
    """Top-k/top-p sampling keeps to the top k, and a one-hot distribution samples its one token."""
    import torch
    device, rows, vocab, top_k = torch.device("cuda:0"), 16, 32000, 5
    probs = torch.softmax(torch.randn(rows, vocab, device=device) * 4, dim=-1)
    hot = torch.randint(0, vocab, (rows,), device=device)
    one_hot = torch.zeros(rows, vocab, device=device).scatter_(1, hot[:, None], 1.0)
    picked = sampling.top_k_top_p_sampling_from_probs(probs, top_k, 0.9)
    allowed = probs.topk(top_k, dim=-1).indices
    outside = int((~(allowed == picked[:, None].long()).any(-1)).sum())
    exact = sampling.top_k_top_p_sampling_from_probs(one_hot, top_k, 0.9)
    wrong = int((exact.long() != hot).sum())
    return ({"relative_error": (outside + wrong) / (2 * rows), "outside_top_k": outside, "one_hot_wrong": wrong},
            lambda: sampling.top_k_top_p_sampling_from_probs(probs, top_k, 0.9))


# --- SGLang's cached kernels, through SGLang's own ops ---------------------------------------------

def sglang_launches(shape: dict, launches: Launches) -> None:
    """One launch per builder kernels_aot.sglang_builders seeds, through the op a forward calls."""
    import torch
    device, dtype, name = torch.device("cuda:0"), _dtype(shape["dtype"]), shape["name"]
    for what, _, args in kernels_aot.sglang_builders(shape):
        if what == "activation":
            launches.run(name, "sglang silu_and_mul", lambda: _silu_and_mul(dtype, device))
        elif what == "rope":
            launches.run(name, f"sglang apply_rope_inplace ({'neox' if args[0] else 'gpt-j'}, {args[1]})",
                         lambda: _rope(shape, args[0], args[1], dtype, device))
        elif what == "qk-norm":
            launches.run(name, "sglang fused_inplace_qknorm", lambda: _qknorm(shape, dtype, device))
        elif what == "rmsnorm":
            launches.run(name, "sglang rmsnorm", lambda: _rmsnorm(shape["hidden_size"], dtype, device))
        elif what == "fused-add-rmsnorm":
            launches.run(name, "sglang fused_add_rmsnorm (cast before weight)",
                         lambda: _fused_add_rmsnorm(shape["hidden_size"], dtype, device, args[1]))
        elif what.startswith("kv-store"):
            tp = int(what.rpartition("tp")[2])
            launches.run(name, f"sglang store_cache tp{tp}", lambda: _store_cache(shape, tp, device))
        elif what == "clamp-position":
            launches.run(name, "sglang clamp_position_cuda (int64 seq_lens)", lambda: _clamp_position(device))
        else:  # a builder this check has no launch for: the verdict finds its kernel never launched
            launches.results.append({"shape": name, "call": f"sglang {what}", "error": "no launch written for it",
                                     "loaded": []})


def _clamp_position(device):
    """A decode step's positions from the scheduler's int64 seq_lens (a 0 among them: the clamp's own case)."""
    import torch
    from sglang.kernels.ops.attention.clamp_position import clamp_position_cuda
    seq_lens = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randint(1, 40960, (63,))]).to(device)
    out = clamp_position_cuda(seq_lens)
    return _exact([(out, torch.clamp(seq_lens.cpu() - 1, min=0))]), lambda: clamp_position_cuda(seq_lens)


def _exact(pairs: list) -> dict:
    """Integer results (positions, indices) and exact casts (logits to float32) against torch's: one entry off,
    or a result of the wrong length, makes the launch wrong (relative error 1), so no tolerance lets it through."""
    wrong = 0
    for got, want in pairs:
        got, want = got.cpu().flatten(), want.cpu().flatten()
        if not (got.is_floating_point() or want.is_floating_point()):
            got, want = got.long(), want.long()  # int32 against int64 is the same answer
        wrong += int((got != want).sum()) if got.numel() == want.numel() else max(got.numel(), want.numel())
    return {"relative_error": 1.0 if wrong else 0.0, "entries_wrong": wrong,
            "entries": sum(want.numel() for _, want in pairs)}


def _silu_and_mul(dtype, device):
    import torch
    from sglang.kernels.ops.activation.activation import silu_and_mul
    x = torch.randn(64, 2 * 1408, device=device, dtype=dtype)
    out = silu_and_mul(x)
    gate, up = x.float().chunk(2, dim=-1)
    return {"relative_error": relative_error(out, torch.nn.functional.silu(gate) * up)}, lambda: silu_and_mul(x)


def _rope(shape, neox, rotary, dtype, device):
    import torch
    from sglang.kernels.ops.attention.rope import apply_rope_inplace
    tokens, positions = 48, torch.randint(0, 4096, (48,), device=device)
    inv = 1.0 / (10000 ** (torch.arange(0, rotary, 2, device=device).float() / rotary))
    freqs = torch.outer(torch.arange(4096, device=device).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q = torch.randn(tokens, shape["q_heads"] // shape["tp"][0], shape["head_dim"], device=device, dtype=dtype)
    k = torch.randn(tokens, max(1, shape["kv_heads"] // shape["tp"][0]), shape["head_dim"], device=device, dtype=dtype)
    cos, sin = freqs.cos()[positions], freqs.sin()[positions]
    want_q, want_k = rope_reference(q, cos, sin, rotary, neox), rope_reference(k, cos, sin, rotary, neox)
    apply_rope_inplace(q, k, cache, positions, is_neox=neox, rope_dim=rotary)
    error = max(relative_error(q, want_q), relative_error(k, want_k))
    return {"relative_error": error}, lambda: apply_rope_inplace(q, k, cache, positions, is_neox=neox, rope_dim=rotary)


def _qknorm(shape, dtype, device):
    import torch
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm
    head_dim, tokens = shape["head_dim"], 48
    q = torch.randn(tokens, shape["q_heads"] // shape["tp"][0], head_dim, device=device, dtype=dtype)
    k = torch.randn(tokens, max(1, shape["kv_heads"] // shape["tp"][0]), head_dim, device=device, dtype=dtype)
    q_weight, k_weight = (torch.randn(head_dim, device=device, dtype=dtype) for _ in range(2))
    want_q, want_k = rmsnorm_reference(q, q_weight, 1e-6), rmsnorm_reference(k, k_weight, 1e-6)
    fused_inplace_qknorm(q, k, q_weight, k_weight, 1e-6, head_dim=head_dim)
    error = max(relative_error(q, want_q), relative_error(k, want_k))
    return {"relative_error": error}, lambda: fused_inplace_qknorm(q, k, q_weight, k_weight, 1e-6, head_dim=head_dim)


def _rmsnorm(hidden, dtype, device):
    import torch
    from sglang.kernels.ops.layernorm.norm import rmsnorm
    x, weight = torch.randn(64, hidden, device=device, dtype=dtype), torch.randn(hidden, device=device, dtype=dtype)
    out = torch.empty_like(x)
    rmsnorm(x, weight, out, 1e-6)
    return {"relative_error": relative_error(out, rmsnorm_reference(x, weight, 1e-6))}, lambda: rmsnorm(x, weight, out, 1e-6)


def _fused_add_rmsnorm(hidden, dtype, device, cast):
    import torch
    from sglang.kernels.ops.layernorm.norm import fused_add_rmsnorm
    x, residual = (torch.randn(64, hidden, device=device, dtype=dtype) for _ in range(2))
    weight = torch.randn(hidden, device=device, dtype=dtype)
    total = x.float() + residual.float()
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (normed.to(dtype).float() if cast else normed) * weight.float()
    fused_add_rmsnorm(x, residual, weight, 1e-6, cast_x_before_out_mul=cast)
    error = max(relative_error(x, want), relative_error(residual, total))
    again_x, again_r = x.clone(), residual.clone()
    return {"relative_error": error}, lambda: fused_add_rmsnorm(again_x, again_r, weight, 1e-6, cast_x_before_out_mul=cast)


def _store_cache(shape, tp, device):
    """SGLang's KV store writes each token's K and V rows (already in the cache's dtype) where the indices say."""
    import torch
    from sglang.kernels.ops.kvcache.kvcache import store_cache
    kv_dtype, width = _dtype(shape["kv_dtype"]), max(1, shape["kv_heads"] // tp) * shape["head_dim"]
    pool, tokens = 256, 40
    k, v = (_random((tokens, width), kv_dtype, device) for _ in range(2))
    k_cache, v_cache = (torch.zeros(pool, width, device=device, dtype=kv_dtype) for _ in range(2))
    indices = torch.randperm(pool - 1, device=device)[:tokens] + 1  # slot 0 is SGLang's reserved padding slot
    store_cache(k, v, k_cache, v_cache, indices)
    torch.cuda.synchronize()
    as_bytes = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)  # noqa: E731
    wrong = int((as_bytes(k_cache[indices]) != as_bytes(k)).any(-1).sum() + (as_bytes(v_cache[indices]) != as_bytes(v)).any(-1).sum())
    return ({"relative_error": wrong / (2 * tokens), "rows_wrong": wrong},
            lambda: store_cache(k, v, k_cache, v_cache, indices))


# --- Triton's kernels, where the [aot] step seeded its cache -------------------------------------------

def triton_launches(shape: dict, launches: Launches) -> None:
    """SGLang's Triton launches (kernels_triton.LAUNCHES) on this GPU, each result against torch's; Triton's own
    listener records, per launch, every kernel it compiled or found in its cache (the verdict wants each kernel
    the seed wrote for this GPU's target served from the cache, none compiled)."""
    events: list = []
    kernels_triton.import_as_server()  # what a server imports before its forward decides the ptxas, so the key
    kernels_triton.listen(events)
    for name, call in kernels_triton.launches(shape, kernels_triton.logits_cast_reached()):
        launches.run(shape["name"], f"triton {name}", lambda call=call: _triton(call, shape, events))


def _triton(call, shape: dict, events: list):
    del events[:]
    answers = call(shape, "cuda")
    metrics = _exact([(got, want) for _, got, want in answers])
    metrics["triton"] = [dict(event) for event in events]
    return metrics, lambda: call(shape, "cuda")


# --- deep_gemm, where the image keeps its JIT -----------------------------------------------------

def deep_gemm_launches(mode: str, launches: Launches) -> dict:
    """"disabled": what SGLang reads says it is off. "jit": SGLang's FP8 block-scaled GEMM (per-token scales for
    the activations, 128x128 blocks for the weights) and the bf16 GEMM, each compiled on its first call."""
    if mode == "disabled":
        state = {"mode": mode, "SGLANG_ENABLE_JIT_DEEPGEMM": os.environ.get("SGLANG_ENABLE_JIT_DEEPGEMM")}
        try:  # the gate SGLang's deep_gemm_wrapper/configurer.py reads before anything else (0.5.22, 0.5.23)
            from sglang.srt.environ import envs
            state["sglang_enabled"] = bool(envs.SGLANG_ENABLE_JIT_DEEPGEMM.get())
        except Exception as error:
            state["sglang_error"] = f"{type(error).__name__}: {error}"[:300]
        return state
    launches.run("deep_gemm", "deep_gemm fp8_gemm_nt (1x128 and 128x128 scales)", _deep_gemm_fp8)
    launches.run("deep_gemm", "deep_gemm bf16_gemm_nt", _deep_gemm_bf16)
    return {"mode": mode}


def _deep_gemm_fp8():
    import torch
    import deep_gemm
    m, n, k, device = 128, 4096, 7168, torch.device("cuda:0")
    a, b = torch.randn(m, k, device=device, dtype=torch.bfloat16), torch.randn(n, k, device=device, dtype=torch.bfloat16)
    a_blocks = a.float().view(m, k // 128, 128)
    a_scale = a_blocks.abs().amax(-1).clamp_min(1e-4) / 448.0
    a_fp8 = (a_blocks / a_scale[..., None]).to(torch.float8_e4m3fn).view(m, k)
    b_blocks = b.float().view(n // 128, 128, k // 128, 128)
    b_scale = b_blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4) / 448.0
    b_fp8 = (b_blocks / b_scale[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((a_fp8, a_scale), (b_fp8, b_scale), out)
    deq_a = (a_fp8.float().view(m, k // 128, 128) * a_scale[..., None]).view(m, k)
    deq_b = (b_fp8.float().view(n // 128, 128, k // 128, 128) * b_scale[:, None, :, None]).view(n, k)
    return ({"relative_error": relative_error(out, deq_a @ deq_b.t())},
            lambda: deep_gemm.fp8_gemm_nt((a_fp8, a_scale), (b_fp8, b_scale), out))


def _deep_gemm_bf16():
    import torch
    import deep_gemm
    device = torch.device("cuda:0")
    a, b = torch.randn(256, 512, device=device, dtype=torch.bfloat16), torch.randn(384, 512, device=device, dtype=torch.bfloat16)
    out = torch.empty(256, 384, device=device, dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_nt(a, b, out)
    return {"relative_error": relative_error(out, a.float() @ b.float().t())}, lambda: deep_gemm.bf16_gemm_nt(a, b, out)


# --- the run ---------------------------------------------------------------------------------------

def launch_all(spec: dict, manifest: dict) -> dict:
    import torch
    torch.manual_seed(0)
    capability = torch.cuda.get_device_capability(0)
    answer = {"device": torch.cuda.get_device_name(0), "capability": "%d.%d" % capability,
              "gpus": [{"name": torch.cuda.get_device_name(i), "capability": "%d.%d" % torch.cuda.get_device_capability(i)}
                       for i in range(torch.cuda.device_count())],
              "torch": torch.__version__}
    roots = [manifest.get("flashinfer_aot_dir"), manifest.get("sglang_jit_cache_dir")]
    launches = Launches([os.path.realpath(root) for root in roots if root])
    for shape in spec["shapes"]:
        flashinfer_launches(shape, capability, launches)
        if spec.get("sglang"):
            sglang_launches(shape, launches)
        if manifest.get("triton"):
            triton_launches(shape, launches)
    answer["deep_gemm"] = deep_gemm_launches(spec.get("deep_gemm", "jit"), launches)
    answer["launches"] = launches.results
    answer["mapped"] = sorted(launches.mapped())
    return answer


def main(argv: list) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)
    with open(argv[1], encoding="utf-8") as handle:
        manifest = json.load(handle)
    print(json.dumps(launch_all(spec, manifest)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
