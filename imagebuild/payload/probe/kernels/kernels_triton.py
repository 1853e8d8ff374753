"""Triton's kernels on SGLang's forward path, compiled into the image's Triton cache without a GPU.

Triton compiles a kernel at its first launch, with its own ptxas, and keeps it in TRITON_CACHE_DIR under a key
made of Triton's own bytes (libtriton.so and its Python), the kernel's source, its argument specialization
(dtypes, 16-byte alignment, ints equal to 1), the compile options and the GPU target; a later launch with the
same key loads the cached cubin and compiles nothing (triton/compiler/compiler.py `compile`, 3.8). No part of
that key needs a GPU but the target, so a stand-in driver (StubDriver) answers "a CUDA GPU of compute
capability N" and launches nothing: SGLang's own wrapper runs on CPU tensors of the dtypes SGLang gives it,
Triton specializes and compiles exactly as it would on that GPU, and writes the cache. The cache's group files
name their files by absolute path, so the seed runs at the image's own TRITON_CACHE_DIR, after every layer
that could change Triton's files.

Which kernels a forward launches is read in SGLang's source (LAUNCHES, each with where it was read): no artifact
says it. Whether each launch is served from the cache is asked of Triton itself, through its compilation
listener (knobs.compilation.listener: cache_hit), in a process of its own.

    python kernels_triton.py seed AOT_JSON              compile every launch of every shape for every [aot] arch
    python kernels_triton.py prove AOT_JSON MANIFEST    the same launches, each must be a cache hit at a key the
                                                        manifest's seed wrote; an undeclared target must miss
    python kernels_triton.py run SHAPES_JSON CAPABILITY (internal) one target's launches, in a process of its own

Standard library only at import time; torch, triton and sglang are imported where they are used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from .kernel_cache import sha256_file
    from .kernels_moe import arch_target
except ImportError:  # run as a script from the [aot] step's folder
    from kernel_cache import sha256_file
    from kernels_moe import arch_target

# A batch as SGLang's scheduler hands it over: three requests, the first with no cached prefix, one longer than
# the kernels' 512-wide blocks (a GPU's answer then covers their loops). The values are data to Triton, not part
# of any key: these kernels take tensors and constexprs, and the one int (the table's row stride) is fixed below.
PREFIX_LENS, EXTEND_LENS = (0, 5, 700), (3, 600, 1)


def _compute_position(shape: dict, device: str = "cpu") -> list:
    """Extend batches' positions: ForwardBatch.init_new hands compute_position int32 tensors of the prefix and
    extend lengths, one per request (SGLang 0.5.23 model_executor/forward_batch_info.py:1234-1255, :2378-2390),
    and a FlashInfer backend takes the Triton path (support_triton). Returns [(what, got, torch's answer)]."""
    import torch
    from sglang.kernels.ops.attention.position import compute_position_triton
    positions, starts = compute_position_triton(torch.tensor(PREFIX_LENS, dtype=torch.int32, device=device),
                                                torch.tensor(EXTEND_LENS, dtype=torch.int32, device=device),
                                                sum(EXTEND_LENS))
    want_positions = torch.cat([torch.arange(p, p + e) for p, e in zip(PREFIX_LENS, EXTEND_LENS)])
    want_starts = torch.tensor([sum(EXTEND_LENS[:i]) for i in range(len(EXTEND_LENS))], dtype=torch.int32)
    return [("positions", positions, want_positions), ("extend_start_loc", starts, want_starts)]


# ReqToTokenPool's row width: the context length plus 4 (SGLang 0.5.23 mem_cache/kv_cache_configurator.py:884,
# more with speculative decoding). Triton specializes an int on whether it is 1 or a multiple of 16 and on its
# width, not on its value, so any context length that is a multiple of 16 gives this key; 131072 is Llama 3.1's.
REQ_TO_TOKEN_WIDTH = 131072 + 4
# Where the releases read keep the kernel: 0.5.23, then 0.5.22 (each imported by mem_cache/kv_index_translator.py).
KV_INDICES_MODULES = ("sglang.kernels.ops.attention.kv_indices", "sglang.kernels.ops.kvcache.kv_indices")


def _kv_indices(shape: dict, device: str = "cpu") -> list:
    """The KV index stream FlashInfer's paged wrappers plan over, gathered from the request-to-token table:
    FlashInfer's indices updaters call the translator's pack_read_stream (flashinfer_backend.py:1801-1809 decode,
    :2256-2264 prefill), whose pass-through read launches create_flashinfer_kv_indices_triton as written here
    (mem_cache/kv_index_translator.py:600-610: the int32 table, int64 request rows, int32 indptr from offset 0, no
    start offsets, an int32 output, the table's row stride, one token per entry, one block per request, no
    mapping). The lengths are int64 seq_lens in CUDA-graph capture and at decode, int32 extend prefix lengths at
    a prefill (forward_batch_info.py:1237): a server's first prefill compiled the int32 one (read 2026-12-06).
    Returns [(what, got, torch's answer)]."""
    import importlib
    import torch
    kernel = None
    for module in KV_INDICES_MODULES:
        with contextlib.suppress(ModuleNotFoundError):
            kernel = importlib.import_module(module).create_flashinfer_kv_indices_triton
            break
    if kernel is None:
        raise ModuleNotFoundError(f"create_flashinfer_kv_indices_triton is in none of {', '.join(KV_INDICES_MODULES)}")
    # keywords as the translator passes them, those this release's kernel takes (0.5.22 has no TOKEN_BLOCK_PARALLEL)
    keywords = {k: v for k, v in {"ENTRY_PAGE_SIZE": 1, "TOKEN_BLOCK_PARALLEL": False, "token_mapping": None}.items()
                if k in kernel.arg_names}
    generator = torch.Generator().manual_seed(0)
    table = torch.randint(0, 1 << 30, (4, REQ_TO_TOKEN_WIDTH), dtype=torch.int32, generator=generator)
    rows = torch.tensor((1, 2, 3), dtype=torch.int64)
    answers = []
    for lens_dtype in (torch.int64, torch.int32):
        lens = torch.tensor(PREFIX_LENS, dtype=lens_dtype)
        indptr = torch.zeros(len(PREFIX_LENS) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(lens, 0)
        out = torch.empty(int(indptr[-1]) or 1, dtype=torch.int32, device=device)
        on = [tensor.to(device) for tensor in (table, rows, lens, indptr)]
        kernel[(len(PREFIX_LENS),)](on[0], on[1], on[2], on[3], None, out, table.stride(0), **keywords)
        want = torch.cat([table[row, :length] for row, length in zip(rows.tolist(), PREFIX_LENS)])
        answers.append((f"kv indices ({str(lens_dtype).rpartition('.')[2]} lengths)", out[:len(want)], want))
    return answers


# The extra rows of ReqToTokenPool beyond the context length (SGLang 0.5.23 mem_cache/allocation_sizing.py:96-116
# get_req_to_token_extra_context_len: 4, more with speculative decoding or pages over 1 with it).
REQ_TO_TOKEN_EXTRA = 4


def _req_to_token(shape: dict, device: str = "cpu") -> list:
    """An extend's token allocation writes each request's cached prefix and new token slots into its row of the
    request-to-token table: alloc_for_extend -> write_cache_indices launches write_req_to_token_pool_triton
    (SGLang 0.5.23 mem_cache/allocation.py:73-88, 392-464: the int32 table, int64 request rows, uint64 pointers
    to each request's int64 prefix slots, int64 prefix, sequence and extend lengths, int64 new slots, and the
    table's width as a constexpr, which makes one kernel per context length: the shape's context_lengths).
    Returns [(what, got, torch's answer)]."""
    import torch
    from sglang.kernels.ops.memory.common import write_req_to_token_pool_triton
    answers = []
    for context_length in shape.get("context_lengths") or ():
        width = context_length + REQ_TO_TOKEN_EXTRA
        table = torch.zeros((4, width), dtype=torch.int32, device=device)
        rows = torch.tensor((1, 2, 3), dtype=torch.int64, device=device)
        prefixes = [torch.arange(1000 + 1000 * i, 1000 + 1000 * i + n, dtype=torch.int64, device=device)
                    for i, n in enumerate(PREFIX_LENS)]
        pointers = torch.tensor([t.data_ptr() for t in prefixes], dtype=torch.uint64, device=device)
        pre = torch.tensor(PREFIX_LENS, dtype=torch.int64, device=device)
        extend = torch.tensor(EXTEND_LENS, dtype=torch.int64, device=device)
        slots = torch.arange(50_000, 50_000 + sum(EXTEND_LENS), dtype=torch.int64, device=device)
        write_req_to_token_pool_triton[(len(PREFIX_LENS),)](table, rows, pointers, pre, pre + extend, extend, slots,
                                                            width)
        want = torch.zeros((4, width), dtype=torch.int64)
        start = 0
        for row, prefix, n in zip((1, 2, 3), prefixes, EXTEND_LENS):
            want[row, :len(prefix)] = prefix.cpu()
            want[row, len(prefix):len(prefix) + n] = slots[start:start + n].cpu()
            start += n
        answers.append((f"token table ({context_length} tokens)", table, want))
    return answers


# Decode's logits land in the CUDA graph's shared float32 buffer (model_executor/graph_shared_output.py:62-73), and
# SGLang 0.5.23's logits processor casts bf16 and fp16 logits into it with a Triton kernel (layers/logits_processor.py
# :1356-1364, cast_to_float32_logits), first at CUDA-graph capture; 0.5.22 copies them with torch (:1174-1180),
# which compiles nothing. The kernel reads the logits as one flat row (kernels/ops/activation/softcap.py
# _softcap_logits), so its key holds their dtype and whether rows x vocabulary is a multiple of 16: the first
# batch below gives the key of every batch of a vocabulary that is one (Llama 3's 128256, Qwen3's 151936), the
# second that of the other batches of one that is not. Not seeded (left to first use): a padded vocabulary under
# TP whose real width is not a multiple of 16 (its row stride differs), and the softcapping variants (models with
# final_logit_softcapping).
LOGITS_BATCHES = ((2, 1024), (1, 1001))  # rows x vocabulary: 2048 is a multiple of 16, 1001 is not
LOGITS_PROCESSOR = ("srt", "layers", "logits_processor.py")  # under the sglang package
LOGITS_CAST_CALL = "cast_to_float32_logits("


def _logits_cast(shape: dict, device: str = "cpu") -> list:
    """Logits of the shape's dtype cast into a float32 buffer of the same shape, through SGLang's own op.
    Returns [(what, got, torch's answer)]: the cast is exact, so each value must equal torch's."""
    import torch
    from sglang.kernels.ops.activation.softcap import cast_to_float32_logits
    dtype = getattr(torch, str(shape.get("dtype") or "bfloat16"))
    generator = torch.Generator().manual_seed(0)
    answers = []
    for rows, vocabulary in LOGITS_BATCHES:
        logits = (torch.randn((rows, vocabulary), generator=generator) * 8).to(dtype)
        out = torch.empty((rows, vocabulary), dtype=torch.float32, device=device)
        cast_to_float32_logits(logits.to(device), out)
        answers.append((f"logits cast ({rows} x {vocabulary} {dtype})", out, logits.float()))
    return answers


def logits_cast_reached() -> bool:
    """Whether the installed SGLang's logits processor casts logits with its Triton kernel (0.5.23) rather than
    torch's copy (0.5.22), read in its source (importing it would import the server); an SGLang without the file
    cannot say, and is refused rather than taken as either."""
    import importlib.util
    found = importlib.util.find_spec("sglang")
    for root in list(getattr(found, "submodule_search_locations", None) or []):
        path = os.path.join(root, *LOGITS_PROCESSOR)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                return LOGITS_CAST_CALL in handle.read()
    raise FileNotFoundError(f"sglang/{'/'.join(LOGITS_PROCESSOR)} is not installed: whether a server casts its "
                            "logits with Triton cannot be read")


# (name, call): the Triton launches a forward of a shape reaches on SGLang's FlashInfer backend; call(shape,
# device) launches on that device's tensors and returns [(what, got, torch's answer)] (under StubDriver nothing
# runs and the answers are left unread; gpu_launch.py compares them on a GPU).
LAUNCHES = (("compute-position", _compute_position), ("kv-indices", _kv_indices), ("req-to-token", _req_to_token),
            ("logits-cast", _logits_cast))


def launches(shape: dict, casts_logits: bool) -> list:
    """LAUNCHES for the shape: the token-table writer only where the shape states its context lengths, the logits
    cast only where the SGLang installed makes it (casts_logits: logits_cast_reached())."""
    return [(name, call) for name, call in LAUNCHES
            if (name != "req-to-token" or shape.get("context_lengths")) and (name != "logits-cast" or casts_logits)]


class StubDriver:
    """Triton's CUDA driver for a GPU that is not there: the target is `capability` (120 for sm_120), the
    device 0 on stream 0; a compiled kernel is 'loaded' without a handle and its launch does nothing but say
    which kernel it was (`launched`: name, key)."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", capability, 32)
        self.utils = _StubUtils()
        self.launched: list = []
        launched = self.launched

        class Launcher:
            def __init__(self, src, metadata):
                self.kernel = (str(getattr(metadata, "name", getattr(src, "name", "?"))),
                               getattr(metadata, "hash", None))

            def __call__(self, *args, **kwargs):
                launched.append(self.kernel)

        self.launcher_cls = Launcher

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        return None

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return divmod(self.target.arch, 10)

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp
        return ty_to_cpp(ty)

    @staticmethod
    def is_active():
        return True


class _StubUtils:
    def load_binary(self, name, kernel, shared, device):
        return 0, 0, 0, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 1 << 30, "multiprocessor_count": 1, "max_num_regs": 65536, "warpSize": 32}


def compiling_for(capability: int) -> tuple:
    """From now on, in this process, Triton answers for a GPU of `capability`: returns (the compiles it does or
    finds in its cache, the kernels launched), lists that fill as it goes. For good: each JIT function keeps the
    target it first saw, so one process serves one target (run_all spawns one per target)."""
    from triton.runtime import driver
    events: list = []
    listen(events)
    stub = StubDriver(capability)
    driver.set_active(stub)
    return events, stub.launched


def capabilities(archs: list) -> list:
    """The Triton targets of the [aot] archs: `12.0f` and `12.0a` are compute capability 12.0, Triton's 120."""
    return sorted({arch_target(arch)[0] for arch in archs})


# What a server imports before its forward that decides Triton's key: FlashInfer's flashinfer.triton points
# TRITON_PTXAS_BLACKWELL_PATH at the ptxas on PATH when it is CUDA 13 or newer (flashinfer/triton/__init__.py,
# 0.7.1-0.7.4), which SGLang's FlashInfer backend imports; the ptxas's version is part of every sm_100+ key
# (backends/nvidia/compiler.py CUDABackend.hash). Imported here as a server does, never inherited by chance.
SERVER_IMPORTS = ("flashinfer.triton",)


def import_as_server() -> None:
    """SERVER_IMPORTS, those whose package is installed."""
    import importlib
    import importlib.util
    for module in SERVER_IMPORTS:
        if importlib.util.find_spec(module.partition(".")[0]) is not None:
            importlib.import_module(module)


def listen(events: list) -> None:
    """Triton's compilation listener appends {kernel, hash, hit} to events for every compile or cache hit."""
    from triton import knobs
    if not hasattr(getattr(knobs, "compilation", None), "listener"):
        raise RuntimeError("this Triton has no compilation listener (triton.knobs.compilation.listener): "
                           "what it compiled cannot be seen")

    def listener(src, metadata, metadata_group, times, cache_hit):
        events.append({"kernel": str(getattr(src, "name", "?")), "hash": metadata.get("hash"), "hit": bool(cache_hit)})

    knobs.compilation.listener = listener


def ptxas_for(capability: int) -> str | None:
    """The ptxas Triton runs for this target (its path), as Triton itself resolves it."""
    import inspect
    from triton.backends.nvidia import compiler
    ask = compiler.get_ptxas
    found = ask(capability) if inspect.signature(ask).parameters else ask()
    path = getattr(found, "path", None) or (found[0] if isinstance(found, tuple) else found)
    return str(path) if path else None


def run(shapes: list, capability: int) -> list:
    """(in a process of its own) every launch of every shape for one target: [{shape, launch, target, ptxas,
    kernels: [event], seconds, error}]; a kernel two shapes share is listed once, by the first."""
    import_as_server()
    events, launched = compiling_for(capability)
    ptxas = ptxas_for(capability)
    casts_logits = logits_cast_reached()
    results, seen = [], set()
    for shape in shapes:
        for name, call in launches(shape, casts_logits):
            del events[:], launched[:]
            started = time.monotonic()
            try:
                call(shape)
                error = None
            except Exception as caught:  # a release without the wrapper, or Triton refusing it
                error = f"{type(caught).__name__}: {caught}"[:600]
            fresh = [dict(e, target=capability) for e in events if (e["kernel"], e["hash"]) not in seen]
            seen |= {(e["kernel"], e["hash"]) for e in events}
            results.append({"shape": shape["name"], "launch": name, "target": capability, "ptxas": ptxas,
                            "kernels": fresh,
                            "launched": sorted({kernel for kernel, _ in launched}),
                            "seconds": round(time.monotonic() - started, 2), "error": error})
    return results


def run_all(shapes: list, targets: list, cache: str | None = None) -> list:
    """run() for each target, each in a child process of this interpreter (with Triton's cache at `cache`),
    the children at once."""
    children = [(capability, start(shapes, capability, cache)) for capability in targets]
    return [result for capability, child in children for result in finish(child, capability)]


def start(shapes: list, capability: int, cache: str | None = None) -> subprocess.Popen:
    """run(shapes, capability) in a child of this interpreter, started and not waited for (finish() waits)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if cache:
        env["TRITON_CACHE_DIR"] = cache
    return subprocess.Popen([*_self_command(), "run", json.dumps(shapes), str(capability)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(child: subprocess.Popen, capability: int) -> list:
    """A started child's results, or one failed result saying why there are none."""
    stdout, stderr = child.communicate()
    answer = [line for line in stdout.splitlines() if line.startswith("[")][-1:]
    if child.returncode != 0 or not answer:
        return [{"shape": "every shape", "launch": "every launch", "target": capability, "kernels": [], "launched": [],
                 "seconds": 0.0, "error": f"no result for sm_{capability} (exit {child.returncode}): {stderr[-1500:]}"}]
    return json.loads(answer[0])


def _self_command() -> list:
    """This module's main() in a new interpreter: from its package inside the probe's zipapp, else as the script."""
    if __package__:
        return [sys.executable, "-B", "-c", f"import sys; from {__package__}.kernels_triton import main; "
                "sys.exit(main(sys.argv[1:]))"]
    return [sys.executable, "-B", os.path.abspath(__file__)]


def cache_dir() -> str:
    from triton import knobs
    return os.path.realpath(knobs.cache.dir)


def seed(spec: dict) -> dict:
    """Compile every launch into the image's cache; what the manifest keeps: each kernel's target, key and
    files (sha256), nothing about this run."""
    results = run_all(spec["shapes"], capabilities(spec["archs"]))
    failed = [r for r in results if r["error"] or not r["launched"]]
    if failed:
        raise RuntimeError("Triton's kernels did not compile for the image's targets: " + "; ".join(
            f"{r['shape']} {r['launch']} sm_{r['target']}: {r['error'] or 'launched no Triton kernel'}"
            for r in failed))
    root = cache_dir()
    kernels = []
    for result in results:
        for event in result["kernels"]:
            folder = _folder(root, event["hash"])
            files = {name: sha256_file(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
            kernels.append({"kernel": event["kernel"], "launch": result["launch"], "shape": result["shape"],
                            "target": event["target"], "hash": event["hash"], "folder": folder, "files": files})
    return {"cache_dir": root, "kernels": kernels, "ptxas": _ptxas(results),
            "logits_cast": "triton" if logits_cast_reached() else "torch (nothing to seed)"}


def _ptxas(results: list) -> dict:
    """Target -> the ptxas Triton ran for it (part of the key)."""
    return {str(r["target"]): r.get("ptxas") for r in results if r.get("ptxas")}


def prove(spec: dict, seeded: dict) -> dict:
    """The launches again, as a server's first request makes them: each kernel must come from the cache, at
    the key the seed recorded; a target no arch declares must miss (the check can tell a hit from a compile)."""
    control_target = next(n for n in (80, 90, 100, 120, 86) if n not in capabilities(spec["archs"]))
    with tempfile.TemporaryDirectory(prefix="imagebuild-triton-control-") as scratch:
        copy = os.path.join(scratch, "cache")  # the image's cache as it is; its compile lands in the copy
        if os.path.isdir(cache_dir()):
            shutil.copytree(cache_dir(), copy, symlinks=True)
        controlling = start(spec["shapes"][:1], control_target, cache=copy)  # beside the targets' children
        results = run_all(spec["shapes"], capabilities(spec["archs"]))
        control = finish(controlling, control_target)[0]
    seeded_keys = {_label(k): k for k in seeded.get("kernels", [])}
    served = [dict(e, launch=r["launch"], shape=r["shape"]) for r in results for e in r["kernels"]]
    return {"cache_dir": cache_dir(), "served": served, "ptxas": _ptxas(results),
            "errors": [f"{r['shape']} {r['launch']} sm_{r['target']}: {r['error']}" for r in results if r["error"]],
            "unlaunched": sorted(set(seeded_keys) - {_label(e) for e in served}),
            "rekeyed": sorted(_label(e) for e in served if _label(e) not in seeded_keys),
            "control": {"launch": control["launch"], "target": control_target, "error": control["error"],
                        "missed": bool(control["kernels"]) and not any(e["hit"] for e in control["kernels"]),
                        "kernels": [e["kernel"] for e in control["kernels"]]}}


def _label(kernel: dict) -> str:
    """A compiled variant by name, target and key: `create_flashinfer_kv_indices_triton sm_120 498b5c7a1f2e`."""
    return f"{kernel.get('kernel')} sm_{kernel.get('target')} {str(kernel.get('hash'))[:12]}"


def _folder(root: str, key: str) -> str:
    """Triton's cache folder for a kernel's key: the key's sha256 in base32 (runtime/cache.py FileCacheManager)."""
    import base64
    return os.path.join(root, base64.b32encode(bytes.fromhex(key)).decode().rstrip("="))


def main(argv: list) -> int:
    if len(argv) == 3 and argv[0] == "run":
        print(json.dumps(run(json.loads(argv[1]), int(argv[2]))))
        return 0
    if len(argv) == 2 and argv[0] == "seed":
        with open(argv[1], encoding="utf-8") as handle:
            print(json.dumps(seed(json.load(handle))))
        return 0
    if len(argv) == 3 and argv[0] == "prove":
        with open(argv[1], encoding="utf-8") as handle, open(argv[2], encoding="utf-8") as manifest:
            print(json.dumps(prove(json.load(handle), json.load(manifest).get("triton") or {})))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
