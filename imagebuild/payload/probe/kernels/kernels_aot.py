"""Zero-JIT kernels: build them into the image for [aot]'s serving shapes, and prove they are found.

Runs on the image's own interpreter. Which kernel modules a shape needs is asked of the installed
FlashInfer and SGLang by calling their own loaders (FlashInfer's `get_*_module`, SGLang's kernel
builders) with the shape's arguments: no module name is written here, so a new release that renames
or re-keys a module is followed, and one that drops a loader fails loudly.

    python kernels_aot.py build AOT_JSON MANIFEST   compile into FlashInfer's AOT folder and SGLang's JIT cache
    python kernels_aot.py plan AOT_JSON              the module names the installed FlashInfer would load (no compile)
    python kernels_aot.py prove AOT_JSON MANIFEST    (the smoke check's child) load everything with JIT off
    python kernels_aot.py sglang-seed AOT_JSON ARCH PART/PARTS  (internal) one target's share of SGLang's kernels

Compiled modules are kept in the kernel cache (kernel_cache.py, IMAGEBUILD_KERNEL_CACHE) by what decides
their bytes, so a build whose kernel inputs did not change compiles nothing; what is missing compiles in
parallel (kernel_cache.jobs), under a getpid shim that makes nvcc's output repeatable byte for byte.

The smoke check (`check_aot`) loads them again with JIT disabled and nvcc hidden. Standard library
only at import time; torch, flashinfer and sglang are imported where they are used.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from . import compile_resume, kernel_cache, kernel_inputs, kernels_moe, kernels_triton
    from ..waste import elf_sections, fatbin_code
except ImportError:  # run as a script from a folder holding the modules above too (the [aot] step)
    import compile_resume
    import kernel_cache
    import kernel_inputs
    import kernels_moe
    import kernels_triton
    from waste import elf_sections, fatbin_code

MANIFEST_VERSION = 1
STATS_MARK = "imagebuild-kernels: "  # the build output line that carries what the kernel step did
TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


class AotError(RuntimeError):
    """The installed packages cannot do what the shapes ask: a loader is missing or refuses."""


# --- what a shape needs, asked of the installed packages -------------------------------------------

def _dtype(name: str):
    import torch
    return getattr(torch, TORCH_DTYPES[name])


def _positional(function, values: dict, skip: int = 0) -> list:
    """Arguments for `function` in its own order, from named values; a parameter we have no value for
    takes its default, and one without a default stops the build (a release changed the loader)."""
    args = []
    for parameter in list(inspect.signature(function).parameters.values())[skip:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in values:
            args.append(values[parameter.name])
        elif parameter.default is not parameter.empty:
            args.append(parameter.default)
        else:
            raise AotError(f"{function.__module__}.{function.__qualname__} takes {parameter.name!r}, "
                           "which no [aot] shape field gives: this FlashInfer release is not supported yet")
    return args


def _attention_values(shape: dict, kv_dtype: str) -> dict:
    import torch
    return {"dtype_q": _dtype(shape["dtype"]), "dtype_kv": _dtype(kv_dtype), "dtype_o": _dtype(shape["dtype"]),
            "dtype_idx": torch.int32, "head_dim_qk": shape["head_dim"], "head_dim_vo": shape["head_dim"],
            "head_dim": shape["head_dim"], "pos_encoding_mode": 0,  # SGLang applies RoPE itself
            "use_sliding_window": shape["sliding_window"], "use_logits_soft_cap": shape["logits_soft_cap"],
            "use_fp16_qk_reduction": False}


def _tensor_core_decode(shape: dict, q_heads: int, kv_heads: int) -> bool:
    """SGLang's own rule when SGLang is installed (flashinfer_backend.should_use_tensor_core); without it, that
    rule as SGLang 0.5.23 writes it (flashinfer_backend.py:2706-2714): an FP8 cache, or 4+ query heads per KV head."""
    try:
        from sglang.srt.layers.attention.flashinfer_backend import should_use_tensor_core
    except ImportError:
        return shape["kv_dtype"].startswith("fp8") or q_heads // kv_heads >= 4
    return bool(should_use_tensor_core(_dtype(shape["kv_dtype"]), q_heads, kv_heads))


def ragged_backends(shape: dict, archs: list) -> list:
    """The FlashInfer backends SGLang's ragged prefill runs on these archs. SGLang 0.5.23 builds that wrapper with
    backend "auto" (flashinfer_backend.py:501-524; "fa2" or "cutlass" on SM100), and FlashInfer's auto picks FA3 on
    an sm_90a GPU when FA3 supports the dtypes and head dim (utils.determine_attention_backend): a Hopper server's
    first prefill loads the FA3 module, not FA2's. Paged prefill and decode stay on "fa2" (SGLang sets them)."""
    from flashinfer import utils
    values = _attention_values(shape, shape["dtype"])
    fa3 = utils.is_fa3_backend_supported(0, False, False, values["dtype_q"], values["dtype_q"]) and \
        getattr(utils, "is_fa3_prefill_head_dim_supported", lambda qk, vo: True)(shape["head_dim"], shape["head_dim"])
    hopper = [arch for arch in archs if _arch_parts(arch)[:2] == (9, 0)]
    backends = ["fa2"] if len(hopper) < len(archs) or not fa3 else []
    return backends + (["fa3"] if hopper and fa3 else [])


def flashinfer_loads(shape: dict, archs: list) -> list:
    """(what, loader, args) for every FlashInfer module the shape makes SGLang load: its FlashInfer attention
    backend's, and for a quantized shape the FP4 and fused-MoE loaders of each target (kernels_moe.py)."""
    from flashinfer import cascade, decode, prefill, sampling
    from flashinfer.jit.attention import modules

    prefill_args = lambda kv, backend="fa2": [backend] + _positional(  # noqa: E731
        modules.get_batch_prefill_uri, _attention_values(shape, kv), skip=1)
    loads = [(f"prefill ragged{'' if backend == 'fa2' else ' (' + backend + ')'}", prefill.get_batch_prefill_module,
              prefill_args(shape["dtype"], backend)) for backend in ragged_backends(shape, archs)]
    loads.append(("prefill paged", prefill.get_batch_prefill_module, prefill_args(shape["kv_dtype"])))
    for tp in shape["tp"]:
        q_heads, kv_heads = shape["q_heads"] // tp, max(1, shape["kv_heads"] // tp)
        if _tensor_core_decode(shape, q_heads, kv_heads):
            loads.append((f"decode tp{tp} (tensor cores)", prefill.get_batch_prefill_module,
                          prefill_args(shape["kv_dtype"])))
        else:
            loads.append((f"decode tp{tp}", decode.get_batch_decode_module,
                          _positional(modules.get_batch_decode_uri, _attention_values(shape, shape["kv_dtype"]))))
    if shape["prefix_cache"]:
        loads.append(("cascade", cascade.get_cascade_module, []))
    if shape["sampling"]:
        loads.append(("sampling", sampling.get_sampling_module, []))
    quantized, problems = kernels_moe.quantized_loads(shape, archs)
    if problems:
        raise AotError("the installed FlashInfer cannot serve these shapes as SGLang does: " + "; ".join(problems))
    return loads + [(what, loader, _positional(loader, values)) for what, loader, values in quantized]


class _Recorder:
    """Wraps FlashInfer's JitSpec.build_and_load to see which specs its loaders ask for."""

    def __init__(self, dry: bool):
        from flashinfer.jit import core
        self.core, self.dry, self.specs = core, dry, []
        self.original = core.JitSpec.build_and_load

    def __enter__(self):
        recorder = self

        def build_and_load(spec, *args, **kwargs):
            recorder.specs.append(spec)
            if recorder.dry:
                return _Inert()
            return recorder.original(spec, *args, **kwargs)

        self.core.JitSpec.build_and_load = build_and_load
        return self

    def __exit__(self, *exc):
        self.core.JitSpec.build_and_load = self.original


class _Inert:
    """Stands in for a loaded module when only the names are wanted: every attribute is a no-op."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _clear_caches(loads) -> None:
    for _, loader, _ in loads:
        if hasattr(loader, "cache_clear"):
            loader.cache_clear()


def flashinfer_modules(shapes: list, archs: list, dry: bool) -> dict:
    """Module name -> {"shapes": [...], "loads": [...], "spec": JitSpec}: what the loaders asked for (dry: asked,
    never built)."""
    found: dict = {}
    for shape in shapes:
        loads = flashinfer_loads(shape, archs)
        for what, loader, args in loads:
            _clear_caches([(what, loader, args)])  # a cached loader would not ask again
            with _Recorder(dry) as recorder:
                loader(*args)
            for spec in recorder.specs:
                entry = found.setdefault(spec.name, {"shapes": [], "loads": [], "spec": spec})
                if shape["name"] not in entry["shapes"]:
                    entry["shapes"].append(shape["name"])
                entry["loads"].append(f"{shape['name']}: {what}")
        _clear_caches(loads)
    return found


# --- SGLang's own JIT kernels ----------------------------------------------------------------------

def sglang_builders(shape: dict) -> list:
    """(what, builder, args) for SGLang's JIT kernels a forward of this shape reaches."""
    import torch
    from sglang.kernels.ops.activation import activation
    from sglang.kernels.ops.attention import clamp_position, rope
    from sglang.kernels.ops.kvcache import kvcache
    from sglang.kernels.ops.layernorm import norm

    dtype = _dtype(shape["dtype"])
    builders = [("activation", activation.activation_module, (dtype,))]
    if shape["rope"] != "none":
        builders.append(("rope", rope._jit_fused_rope_module,
                         (shape["rope"] == "neox", shape.get("rotary_dim") or shape["head_dim"], dtype, dtype)))
    if shape["qk_norm"]:
        builders.append(("qk-norm", norm._jit_qknorm_module, (shape["head_dim"], dtype)))
    if shape.get("hidden_size") and norm._is_supported_rmsnorm_hidden_size(shape["hidden_size"]):
        builders.append(("rmsnorm", norm._jit_rmsnorm_module, (shape["hidden_size"], dtype)))
    # The residual RMSNorm with HF's cast order (cast_x_before_out_mul, set by Qwen2's, SDAR's and the vision
    # towers' norms): SGLang 0.5.23 takes its JIT kernel only then (layers/layernorm.py:598-617), sgl_kernel's
    # prebuilt one otherwise. Its key is the dtype and the flag, no model size.
    fused_add = getattr(norm, "_jit_fused_add_rmsnorm_module", None)
    supported = getattr(norm, "is_supported_jit_fused_add_rmsnorm_hidden_size", lambda size: False)
    if fused_add is not None and shape.get("hidden_size") and supported(shape["hidden_size"]):
        builders.append(("fused-add-rmsnorm", fused_add, (dtype, True)))
    for tp in shape["tp"]:
        row = max(1, shape["kv_heads"] // tp) * shape["head_dim"] * ELEMENT_BYTES[shape["kv_dtype"]]
        builders.append((f"kv-store tp{tp}", kvcache._jit_kvcache_module, (row, row, 0)))
    # Every decode step's positions: ForwardBatch.init_new calls clamp_position(batch.seq_lens) (SGLang 0.5.23
    # forward_batch_info.py:1226-1228), whose op takes the JIT backend first on CUDA (clamp_position.py:44-49),
    # for the scheduler's int64 seq_lens (schedule_batch.py:2786, :2876). CUDA-graph capture never calls init_new,
    # so without it a server's first decode compiled this module with nvcc (read 2026-12-06).
    builders.append(("clamp-position", clamp_position._jit_clamp_position_module, (torch.int64,)))
    return builders


def _arch_parts(arch: str) -> tuple:
    major, _, rest = arch.partition(".")
    minor = "".join(c for c in rest if c.isdigit())
    suffix = rest[len(minor):] or None
    return int(major), int(minor), suffix


def run_sglang_builders(shapes: list, arch: str, part: tuple = (0, 1)) -> list:
    """Call every builder (those of `part`: index i of n) under SGLang's arch override;
    returns [(shape, what, error or None)]."""
    from sglang.kernels.jit.utils.arch import override_jit_cuda_arch
    results = []
    calls = [(shape["name"], what, builder, args) for shape in shapes for what, builder, args in sglang_builders(shape)]
    distinct: dict = {}  # the same kernel asked by two shapes goes to one share: it compiles once
    with override_jit_cuda_arch(*_arch_parts(arch)):
        for shape, what, builder, args in calls:
            if distinct.setdefault((builder.__qualname__, repr(args)), len(distinct)) % part[1] != part[0]:
                continue
            try:
                builder(*args)
                results.append((shape, what, None))
            except Exception as error:  # a miss under SGLANG_CRASH_ON_JIT_COMPILE, or a compile failure
                results.append((shape, what, f"{type(error).__name__}: {error}"[:2000]))
    return results


def sglang_cache_dir() -> str:
    return os.path.expanduser(os.environ.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit")


# --- artifacts -------------------------------------------------------------------------------------

def describe(path: str) -> dict:
    """sha256, size and the GPU code (SASS and PTX archs, as 120 for sm_120) of one built module."""
    fatbin = elf_sections(path).get(".nv_fatbin")
    sass, ptx = fatbin_code(path, *fatbin) if fatbin else (set(), set())
    return {"sha256": kernel_cache.sha256_file(path), "bytes": os.path.getsize(path), "sass": sorted(sass), "ptx": sorted(ptx)}


def ensure_link_stub(cuda_home: str) -> str | None:
    """FlashInfer links its modules with `-L$CUDA_HOME/lib64/stubs -lcuda`; the pip CUDA wheels ship no
    libcuda.so and a build machine has no driver. An empty library with the driver's soname satisfies the
    link (the modules resolve cu* symbols from the host's libcuda.so.1 at load, as NVIDIA's stub does);
    stubs/ is never on the loader's path."""
    stubs = os.path.join(cuda_home, "lib64", "stubs")
    target = os.path.join(stubs, "libcuda.so")
    if os.path.exists(target):
        return None
    os.makedirs(stubs, exist_ok=True)
    subprocess.run(["c++", "-shared", "-x", "c", "-", "-Wl,-soname,libcuda.so.1", "-o", target],
                   input=b"", check=True)
    return target


def _versions() -> dict:
    from importlib import metadata
    found = {}
    for name in ("flashinfer-python", "sglang", "torch", "apache-tvm-ffi"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def compile_flashinfer(specs: list, jobs: int) -> None:
    """Build the modules in one ninja run of `jobs` at once (FlashInfer's build_jit_specs, as its own AOT
    build does), else one by one through each module's build_and_load."""
    if not specs:
        return
    from flashinfer.jit import core
    os.environ["MAX_JOBS"] = os.environ["FLASHINFER_JIT_PREBUILD_MAX_JOBS"] = str(jobs)
    together = getattr(core, "build_jit_specs", None)
    nvcc_kind = getattr(core, "JitSpecNvcc", None)
    if together is not None and (nvcc_kind is None or all(isinstance(one, nvcc_kind) for one in specs)):
        together(specs, **({"skip_prebuilt": False} if "skip_prebuilt" in inspect.signature(together).parameters else {}))
        return
    for one in specs:
        one.build_and_load()


def compile_times(specs: list) -> dict:
    """Per module compiled, from ninja's log beside its build folder: its objects, their compile seconds summed
    (one core's time) and the longest one (what no number of cores shortens). A resumed compile's log holds the
    earlier runs' objects too: the figures are the module's whole compile."""
    times, seen = {}, {}
    for log in sorted({os.path.join(os.path.dirname(os.path.dirname(str(one.jit_library_path))), ".ninja_log")
                       for one in specs}):
        try:
            with open(log, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        root = os.path.dirname(log) + os.sep
        for line in lines:  # a line per command run: an object built again (a resumed compile) counts once, its last
            fields = line.split("\t")
            if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit() and fields[3].endswith(".o"):
                seen[(log, fields[3])] = (root, fields[3], (int(fields[1]) - int(fields[0])) / 1000)
    for root, output, seconds in seen.values():
        module = output[len(root):].split(os.sep)[0] if output.startswith(root) else output.split("/")[0]
        entry = times.setdefault(module, {"objects": 0, "cpu_s": 0.0, "longest_s": 0.0})
        entry["objects"] += 1
        entry["cpu_s"] = round(entry["cpu_s"] + seconds, 1)
        entry["longest_s"] = max(entry["longest_s"], seconds)
    return {name: entry for name, entry in times.items() if name in {one.name for one in specs}}


def build_flashinfer(spec: dict, cache, jobs: int, build_wide: dict) -> tuple:
    """Every FlashInfer module the shapes need, from the kernel cache or compiled; returns (artifacts, compiled,
    seconds, compile_times, objects resumed from an interrupted compile)."""
    from flashinfer.jit import env as flashinfer_env
    planned = flashinfer_modules(spec["shapes"], spec["archs"], dry=True)
    generated = str(getattr(flashinfer_env, "FLASHINFER_GEN_SRC_DIR", flashinfer_env.FLASHINFER_WORKSPACE_DIR))
    keys = {name: kernel_inputs.flashinfer_key(entry["spec"], build_wide, generated) for name, entry in planned.items()}
    source = {name: cache.find(keys[name], name) for name in planned}
    missing = sorted(name for name in planned if source[name] is None)
    for name in sorted(set(planned) - set(missing)):
        compile_resume.say({"kind": "flashinfer", "name": name, "state": "reused", "seconds": 0.0})
    started = time.monotonic()
    specs = [planned[name]["spec"] for name in missing]
    workspace = str(flashinfer_env.FLASHINFER_WORKSPACE_DIR)
    with compile_resume.Resumable(cache, workspace, [keys[name] for name in missing]) as run:
        with compile_resume.Watch(specs):
            compile_flashinfer(specs, jobs)
        seconds = round(time.monotonic() - started, 1) if missing else 0.0  # the compile's wall time, all jobs
        times = compile_times(specs)
        for name in missing:
            built = str(planned[name]["spec"].jit_library_path)
            source[name] = cache.store(keys[name], name, built) or built
    aot_dir = str(flashinfer_env.FLASHINFER_AOT_DIR)
    artifacts = []
    for name, entry in sorted(planned.items()):
        target = os.path.join(aot_dir, name, f"{name}.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source[name], target + ".tmp")
        os.replace(target + ".tmp", target)
        artifacts.append(dict(kind="flashinfer", name=name, path=target, shapes=entry["shapes"], loads=entry["loads"],
                              key=keys[name], **describe(target)))
    return artifacts, len(missing), seconds, times, run.resumed


# What ninja writes beside SGLang's module: each command's start and end times. SGLang never reads it (a leaf is
# never built again once published; sglang/kernels/jit/utils/compile/cache.py), so the image's copy leaves it out.
# The module's record (kernel_cache.SGLANG_RECORD) stays: a registry's kernel layer seeds a fresh runner's cache
# (flows/kernels/layer.py), and the seed checks each leaf against it.
BUILD_LOGS = (".ninja_log",)


def _leaves(folder: str) -> set:
    """SGLang's cache leaves (the folders holding one built module) under folder."""
    return {os.path.dirname(path) for path in _shared_objects(folder)}


def build_sglang(spec: dict, cache, jobs: int, namespace: str) -> tuple:
    """SGLang's kernels built (or found) in the shared SGLang cache, their leaves copied into the image's
    cache; returns (artifacts, compiled, seconds). One process per target and share of the builders (SGLang caches
    its target once per process), `jobs` of them at once."""
    image_cache = sglang_cache_dir()
    shared = cache.sglang_root(namespace) or image_cache
    if cache.sglang_root(namespace):
        cache.check_sglang(namespace)  # a leaf not its recorded bytes is removed: SGLang compiles it again
    before = _leaves(shared)
    started = time.monotonic()
    env = dict(os.environ, SGLANG_JIT_CACHE_DIR=shared)
    runs = [(arch, (part, jobs)) for arch in spec["archs"] for part in range(jobs)]
    running = [(arch, subprocess.Popen([sys.executable, "-B", os.path.abspath(__file__), "sglang-seed",
                                        json.dumps(spec), arch, f"{part[0]}/{part[1]}"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
               for arch, part in runs]
    used = set()
    for arch, process in running:
        stdout, stderr = process.communicate()
        answer = [line for line in stdout.splitlines() if line.startswith("{")][-1:]
        if process.returncode != 0 or not answer:
            raise AotError(f"seeding SGLang's JIT cache for {arch} failed:\n{stderr[-4000:]}")
        result = json.loads(answer[0])
        failed = [r for r in result["results"] if r[2]]
        if failed:
            raise AotError("SGLang kernels did not build: " + "; ".join(f"{s} {w}: {e}" for s, w, e in failed))
        used |= {os.path.dirname(path) for path in result["mapped"]
                 if os.path.basename(os.path.dirname(path)).startswith("deps-")}  # published leaves only
    cache.used |= used
    seconds = round(time.monotonic() - started, 1)
    artifacts, compiled = [], len(used - before)
    for leaf in sorted(used):
        kernel_cache.record_sglang(leaf)
        relative = os.path.relpath(leaf, os.path.realpath(shared))
        compile_resume.say({"kind": "sglang", "name": "/".join(relative.split(os.sep)[:2]),
                            "state": "reused" if leaf in before else "compiled", "seconds": None})
        target = os.path.join(image_cache, relative)
        if os.path.realpath(target) != os.path.realpath(leaf):
            shutil.copytree(leaf, target, dirs_exist_ok=True)
            os.utime(leaf, None)
        for log in BUILD_LOGS:  # the image holds what its inputs decide: not when this build ran
            if os.path.lexists(os.path.join(target, log)):
                os.remove(os.path.join(target, log))
        for path in sorted(_shared_objects(target)):
            artifacts.append(dict(kind="sglang", name=relative.split(os.sep)[1], path=path,
                                  target=relative.split(os.sep)[0], **describe(path)))
    return artifacts, compiled, seconds


def build(spec: dict, manifest_path: str) -> tuple:
    """Compile (or take from the kernel cache) every module the shapes need, install it where the runtime
    looks, write the manifest. Returns (manifest, stats). The manifest is part of the image and holds only
    what the inputs decide; what this run did (compiled or reused, seconds, jobs) is in stats, for the log."""
    from flashinfer.jit import env as flashinfer_env

    cuda_home = os.environ["CUDA_HOME"]
    stub = ensure_link_stub(cuda_home)
    workspace = os.environ.get("FLASHINFER_WORKSPACE_BASE") or tempfile.gettempdir()
    shim = kernel_cache.build_pid_shim(os.path.join(workspace, "imagebuild-shim"))
    os.environ["LD_PRELOAD"] = " ".join(filter(None, [shim, os.environ.get("LD_PRELOAD")]))
    cache = kernel_cache.KernelCache(os.environ.get("IMAGEBUILD_KERNEL_CACHE") or None)
    jobs = kernel_cache.jobs()
    build_wide = kernel_cache.fingerprint(cuda_home)
    artifacts, compiled, seconds, times, resumed = build_flashinfer(spec, cache, jobs, build_wide)
    namespace = None
    if spec["sglang"]:
        namespace = kernel_cache.sglang_namespace(build_wide)
        found, sglang_compiled, sglang_seconds = build_sglang(spec, cache, jobs, namespace)
        artifacts, compiled, seconds = artifacts + found, compiled + sglang_compiled, seconds + sglang_seconds
    triton, triton_seconds = None, 0.0
    if spec["sglang"]:  # the Triton kernels SGLang's forward launches, compiled for each target into Triton's cache
        started = time.monotonic()
        triton = kernels_triton.seed(spec)
        triton_seconds = round(time.monotonic() - started, 1)
    manifest = {"manifest_version": MANIFEST_VERSION, "archs": spec["archs"], "shapes": spec["shapes"],
                "deep_gemm": spec["deep_gemm"], "versions": _versions(),
                "nvcc_version": build_wide["nvcc"],
                "link_stub": stub, "flashinfer_aot_dir": str(flashinfer_env.FLASHINFER_AOT_DIR),
                "sglang_jit_cache_dir": sglang_cache_dir() if spec["sglang"] else None,
                "sglang_cache_namespace": namespace, "artifacts": artifacts, "triton": triton}
    _write_json(manifest_path, manifest)
    stats = {"compiled": compiled, "reused": len(artifacts) - compiled, "seconds": round(seconds, 1), "jobs": jobs,
             "cache": cache.root, "peak_compile_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
             "cache_after": cache.trim(kernel_cache.bound()), "compile_times": times,
             "resumed_objects": resumed, "rejected": cache.rejected,
             "triton": {"kernels": len(triton["kernels"]), "seconds": triton_seconds} if triton else None}
    return manifest, stats


def _shared_objects(folder: str) -> list:
    found = []
    for root, _, files in os.walk(folder):
        found.extend(os.path.join(root, name) for name in files if name.endswith(".so"))
    return found


def _write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(value, out, indent=2, sort_keys=True)
        out.write("\n")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def plan(spec: dict) -> dict:
    """The FlashInfer module names the shapes need, asked of the installed FlashInfer without compiling."""
    modules = flashinfer_modules(spec["shapes"], spec["archs"], dry=True)
    return {name: {"shapes": entry["shapes"], "loads": entry["loads"]} for name, entry in sorted(modules.items())}


def undeclared_shape(shapes: list) -> dict:
    """The negative control: the first shape with a head dim no shape declares, nothing else. Its RoPE (the
    SGLang control) rotates all of that head dim, so a declared partial rotary dim (GLM-4.5 rotates 64 of
    128) is taken too: a control equal to a declared kernel would hit the cache and prove nothing."""
    taken = {shape["head_dim"] for shape in shapes} | {shape.get("rotary_dim") for shape in shapes}
    head_dim = next(d for d in (64, 256, 96, 192, 128) if d not in taken)
    return dict(shapes[0], name="undeclared", head_dim=head_dim, tp=[shapes[0]["tp"][0]], rope="none",
                rotary_dim=None, qk_norm=False, hidden_size=None, prefix_cache=False, sampling=False,
                quantization="none", experts=None)


def mapped_under(folder: str) -> set:
    """The shared objects under folder that this process has mapped: what the loader really loaded."""
    root = os.path.realpath(folder) + os.sep
    found = set()
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(root) and path.endswith(".so"):
                    found.add(path)
    except OSError:
        pass
    return found


def prove(spec: dict, manifest: dict) -> dict:
    """Load every declared shape's modules the way the runtime does, with JIT off (FLASHINFER_DISABLE_JIT,
    SGLANG_CRASH_ON_JIT_COMPILE set by the caller): each must come from the manifest's artifacts, and an
    undeclared shape must miss. Besides what FlashInfer's loaders asked for, the proof records each load
    that asked for nothing and which shared objects the process really mapped from the AOT folder and
    SGLang's cache."""
    built = {a["name"]: a for a in manifest["artifacts"] if a["kind"] == "flashinfer"}
    aot_dir = manifest.get("flashinfer_aot_dir") or ""
    loaded, misses, asked_nothing, mapped = [], [], [], set()
    for shape in spec["shapes"]:
        for what, loader, args in flashinfer_loads(shape, spec["archs"]):
            _clear_caches([(what, loader, args)])
            with _Recorder(dry=False) as recorder:
                try:
                    loader(*args)
                    error = None
                except Exception as caught:
                    error = f"{type(caught).__name__}: {caught}"[:600]
            if aot_dir:
                mapped |= mapped_under(aot_dir)
            if error is None and not recorder.specs:
                asked_nothing.append({"shape": shape["name"], "load": what})
            for one in recorder.specs:
                path = str(one.get_library_path()) if one.is_aot else None
                entry = {"shape": shape["name"], "load": what, "module": one.name, "aot": one.is_aot,
                         "path": path, "in_manifest": path is not None and built.get(one.name, {}).get("path") == path}
                (loaded if error is None and entry["in_manifest"] else misses).append(dict(entry, error=error))
            if error and not recorder.specs:
                misses.append({"shape": shape["name"], "load": what, "module": None, "error": error})
    control = undeclared_shape(spec["shapes"])
    loads = flashinfer_loads(control, spec["archs"])
    _clear_caches(loads)
    control_result = dict(_control(*loads[0]), shape=control)
    result = {"flashinfer": {"loaded": loaded, "misses": misses, "undeclared": control_result,
                             "asked_nothing": asked_nothing, "mapped": sorted(mapped)}}
    target = kernels_moe.undeclared_target(spec["shapes"], spec["archs"])
    if target is not None:  # the FP4 and MoE modules take no shape: the control is a GPU no arch declares
        what, loader, values = target
        _clear_caches([target])
        result["flashinfer"]["undeclared_target"] = dict(_control(what, loader, _positional(loader, values)), load=what)
    if spec["sglang"]:  # every [aot] arch: the seed compiled each, and each must load from the cache
        archs, outcomes, control_outcome, sglang_mapped = spec["archs"], [], [], set()
        for arch in archs:
            if arch == archs[0]:
                declared = run_sglang_builders(spec["shapes"], arch)
                sglang_mapped |= mapped_under(sglang_cache_dir())
                undeclared = run_sglang_builders([dict(control, rope="neox")], arch)
            else:  # SGLang keeps a module by its arguments, not its arch (cache_once): a process of its own
                code = f"import sys; from {__name__.rpartition('.')[0]}.kernels_aot import main; sys.exit(main(sys.argv[1:]))"
                shapes = json.dumps({"shapes": spec["shapes"] + [dict(control, rope="neox")]})
                done = subprocess.run([sys.executable, "-c", code, "sglang-seed", shapes, arch, "0/1"],
                                      capture_output=True, text=True, check=False,
                                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
                try:
                    child = json.loads(done.stdout)
                except ValueError:
                    child = {"mapped": [], "results": [["every shape", "SGLang's builders", f"no result from the proof "
                                                        f"for {arch} (exit {done.returncode}): {done.stderr[-1500:]}"]]}
                declared = [o for o in child["results"] if o[0] != control["name"]]
                undeclared = [o for o in child["results"] if o[0] == control["name"]]
                sglang_mapped |= set(child["mapped"])
            label = (lambda shape: f"{shape} for {arch}") if len(archs) > 1 else (lambda shape: shape)
            outcomes += [[label(shape), what, error] for shape, what, error in declared]
            control_outcome += [[label(shape), what, error] for shape, what, error in undeclared]
        result["sglang"] = {
            "arch": ", ".join(archs), "archs": archs, "cache_dir": os.path.realpath(sglang_cache_dir()),
            "mapped": sorted(sglang_mapped),
            "hits": [o for o in outcomes if o[2] is None],
            "misses": [o for o in outcomes if o[2] is not None],
            # RoPE's key holds the head dim, which no declared shape has; the control's KV-store row bytes may
            # equal a declared shape's (64 x 2 bytes = 128 x 1 byte), so it is no control.
            "undeclared": [o for o in control_outcome if o[1] == "rope"]}
        result["sglang"]["first_use"] = first_use_triton(forward_modules(spec["shapes"]))
    if manifest.get("triton"):  # each seeded Triton kernel launched again for its target: a hit, or a compile
        result["triton"] = kernels_triton.prove(spec, manifest["triton"])
    return result


# The modules a forward on SGLang's FlashInfer backend runs through that import Triton kernels (SGLang 0.5.23:
# flashinfer_backend.py:27-85, forward_batch_info.py:39-40; read 2026-12-04), and those an extend's set-up
# launches them from: mem_cache/allocation.py:79-88 (write_req_to_token_pool_triton, from prepare_for_extend) and
# mem_cache/kv_index_translator.py:600-610 (create_flashinfer_kv_indices_triton, an extend's int32 prefix lengths
# where CUDA-graph capture passed int64; read 2026-12-06), and the logits processor every forward ends in
# (layers/logits_processor.py:26-36: the logits cast and the softcapping kernels; read 2026-12-07). No artifact says
# which kernels a forward launches; these are where the kernel ops they import live.
FORWARD_MODULES = ("sglang.srt.layers.attention.flashinfer_backend", "sglang.srt.model_executor.forward_batch_info",
                   "sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.kv_index_translator",
                   "sglang.srt.layers.logits_processor")
# A MoE shape's router: SGLang's TopK routes through the Triton router of moe_fused_gate, which layers/moe/topk.py
# imports inside its functions (0.5.23 topk.py:1297-1332, 1707, 1997, 2083), so the op's module is read itself. It
# runs on SM120 with FlashInfer's CUTLASS MoE (an NVFP4 checkpoint) and with Hopper's Marlin; SM100's TensorRT-LLM
# MoE routes inside FlashInfer (read 2026-12-07). Not seeded: its key holds the model's router (experts, top-k with
# any fused shared expert, scoring, the logits' dtype), which the shape does not state.
MOE_MODULES = ("sglang.kernels.ops.moe.moe_fused_gate",)


def forward_modules(shapes: list) -> tuple:
    """FORWARD_MODULES, and MOE_MODULES where a shape routes tokens to experts."""
    return FORWARD_MODULES + (MOE_MODULES if any(shape.get("experts") for shape in shapes) else ())


def first_use_triton(modules: tuple = FORWARD_MODULES) -> dict:
    """The Triton kernels (by name) of the sglang.kernels.ops modules the forward path imports: Triton compiles
    each at its first launch with its own ptxas unless [aot] seeded it (kernels_triton.py), so the proof lists
    them and says which the seed served."""
    import importlib
    found, read, errors = set(), [], []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # a release without the module: said, never a silent empty list
            errors.append(f"{name}: {type(error).__name__}: {error}"[:300])
            continue
        read.append(name)
        sources = {getattr(value, "__module__", "") for value in vars(module).values()}
        for source in sorted(s for s in sources if isinstance(s, str) and s.startswith("sglang.kernels.ops.")):
            for attribute, value in vars(sys.modules.get(source) or module).items():
                if type(value).__name__ in ("JITFunction", "Autotuner", "Heuristics"):
                    found.add(f"{source.rpartition('.')[2]}.{attribute}")
    return {"triton": sorted(found), "modules": read, "errors": errors}


def _control(what: str, loader, args: list) -> dict:
    """Load what no one declared, with JIT off: it must miss (FlashInfer's MissingJITCacheError)."""
    with _Recorder(dry=False) as recorder:
        try:
            loader(*args)
            result = {"missed": False, "error": None}
        except Exception as caught:
            result = {"missed": type(caught).__name__ == "MissingJITCacheError",
                      "error": f"{type(caught).__name__}: {str(caught)[:300]}"}
    return dict(result, module=recorder.specs[0].name if recorder.specs else None)


def main(argv: list) -> int:
    if len(argv) >= 2 and argv[0] == "plan":
        print(json.dumps(plan(_read(argv[1])), indent=2, sort_keys=True))
        return 0
    if len(argv) == 3 and argv[0] == "build":
        manifest, stats = build(_read(argv[1]), argv[2])
        for artifact in manifest["artifacts"]:
            print(f"{artifact['kind']:10} {artifact['bytes']:>10} sass={artifact['sass']} {artifact['name']}")
        print(STATS_MARK + json.dumps(stats, sort_keys=True))  # read by flows/kernels/step.py from the build's output
        return 0
    if len(argv) == 3 and argv[0] == "prove":
        print(json.dumps(prove(_read(argv[1]), _read(argv[2]))))
        return 0
    if len(argv) == 4 and argv[0] == "sglang-seed":
        part, parts = (int(n) for n in argv[3].split("/"))
        results = run_sglang_builders(json.loads(argv[1])["shapes"], argv[2], (part, parts))
        print(json.dumps({"results": results, "mapped": sorted(mapped_under(sglang_cache_dir()))}))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main(sys.argv[1:]))
