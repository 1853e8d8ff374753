"""[aot]: the serving shapes whose kernels the image ships prebuilt, so a server starts without JIT.

Each [[aot.shapes]] entry describes one way a model is served (head dims, heads, TP, dtypes, window,
soft cap, prefix cache, sampling) and, for a quantized mixture-of-experts model, its quantization, experts,
top-k, expert intermediate size and EP sizes (aot_moe.py); `model_config` reads those from the model's own
config.json (model_config.py). The build step (imagebuild/payload/probe/kernels/kernels_aot.py) asks the
installed FlashInfer and SGLang which kernel modules such a shape loads and compiles exactly those;
nothing here names a module. docs/recipes.md documents the table.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from imagebuild.errors import RecipeError
from imagebuild.recipe.aot_moe import MOE_DEFAULTS, MOE_KEYS, ModelConfigFile, check_moe, config_values
from imagebuild.recipe.cuda import Arch
from imagebuild.recipe.reader import Key, RecipeReader, show, toml_kind

# SGLang's --kv-cache-dtype names; "auto" is the model's dtype.
KV_DTYPES = ("auto", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("bfloat16", "float16")
ROPE_STYLES = ("neox", "gptj", "none")
DEEP_GEMM_MODES = ("jit", "disabled")


@dataclass(frozen=True)
class ServingShape:
    """One [[aot.shapes]] entry: how one class of model is served."""

    name: str  # shown in the manifest and the smoke report
    head_dim: int
    q_heads: int
    kv_heads: int
    tp: tuple[int, ...] = (1,)  # tensor-parallel sizes served; SGLang's KV-store kernel depends on heads per rank
    dtype: str = "bfloat16"  # the model's dtype: q and o
    kv_dtype: str = "auto"  # the KV cache's dtype (SGLang --kv-cache-dtype); auto = dtype
    sliding_window: bool = False
    logits_soft_cap: bool = False
    rope: str = "neox"  # SGLang's fused RoPE style; "none" seeds no RoPE kernel
    rotary_dim: int | None = None  # the dims RoPE rotates (partial RoPE, e.g. GLM-4.5's 64 of 128); None: head_dim
    qk_norm: bool = False  # Qwen3-style per-head q/k RMSNorm
    hidden_size: int | None = None  # seeds SGLang's RMSNorm kernel when given
    prefix_cache: bool = True  # radix-cache hits merge attention states: FlashInfer's cascade module
    sampling: bool = True  # FlashInfer's sampling kernels (SGLang's default sampling backend)
    quantization: str = "none"  # the checkpoint's weights: "nvfp4" (SGLang modelopt_fp4), "fp8-block" (SGLang fp8)
    fp4_gemm_backend: str = "flashinfer_cutlass"  # SGLang --fp4-gemm-backend for nvfp4 linear layers (aot_moe.py)
    experts: int | None = None  # routed experts of each MoE layer; None: a dense model
    top_k: int | None = None  # experts each token is routed to
    moe_intermediate_size: int | None = None  # one expert's intermediate size, before the TP split
    ep: tuple[int, ...] = (1,)  # expert-parallel sizes served (SGLang --ep-size), each dividing every tp size
    model_config: str | None = None  # the config.json these fields were read from, as the recipe writes it
    # The servers' context lengths (SGLang --context-length, default the model's max_position_embeddings): SGLang's
    # token-table writer is a Triton kernel specialized on the table's width, the context length plus 4, so
    # the image's Triton cache can hold it only for lengths stated here. Empty: that kernel compiles at first use.
    context_lengths: tuple[int, ...] = ()

    @property
    def resolved_kv_dtype(self) -> str:
        return self.dtype if self.kv_dtype == "auto" else self.kv_dtype

    def to_json(self) -> dict:
        """aot.json's entry; the MoE fields only when they differ from a dense, unquantized shape's."""
        data = dict(asdict(self), tp=list(self.tp), ep=list(self.ep), kv_dtype=self.resolved_kv_dtype,
                    context_lengths=list(self.context_lengths))
        for name, default in dict(MOE_DEFAULTS, rotary_dim=None, context_lengths=[]).items():
            if data[name] == default:
                del data[name]
        return data


@dataclass(frozen=True)
class AotSpec:
    """The [aot] table."""

    archs: tuple[Arch, ...]  # the targets the kernels are compiled for (FLASHINFER_CUDA_ARCH_LIST)
    shapes: tuple[ServingShape, ...]
    sglang: bool = True  # also seed SGLang's own JIT cache for the same shapes
    deep_gemm: str = "jit"  # "jit": compiles on first use on the GPU; "disabled": SGLANG_ENABLE_JIT_DEEPGEMM=0
    model_configs: tuple[ModelConfigFile, ...] = ()  # the config.json files shapes were read from (hashed in the lock)

    @property
    def arch_list(self) -> str:
        """FLASHINFER_CUDA_ARCH_LIST's form: `12.0f 9.0a`."""
        return " ".join(arch.dotted for arch in self.archs)

    def to_json(self) -> dict:
        """What the build step and the smoke check read (aot.json in the build context)."""
        return {"archs": [arch.dotted for arch in self.archs], "sglang": self.sglang,
                "deep_gemm": self.deep_gemm, "shapes": [shape.to_json() for shape in self.shapes]}


_AOT_KEYS = ("archs", "sglang", "deep_gemm", "shapes")
_SHAPE_KEYS = ("name", "head_dim", "q_heads", "kv_heads", "tp", "dtype", "kv_dtype", "sliding_window",
               "logits_soft_cap", "rope", "rotary_dim", "qk_norm", "hidden_size", "prefix_cache", "sampling",
               "context_lengths") + MOE_KEYS
_SHAPE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_ARCH_ENV = "FLASHINFER_CUDA_ARCH_LIST"
_ARCH_HINT = "sm_<major><minor>, or major.minor, with an optional a (this GPU only) or f (its family) suffix"
_SHAPE_EXAMPLE = '[[aot.shapes]] with name = "llama3-8b-bf16", head_dim = 128, q_heads = 32, kv_heads = 8'


def parse_aot(read: RecipeReader, doc: dict, cuda_archs: tuple[Arch, ...] | None, env: dict[str, str],
              multi_platform: bool) -> AotSpec | None:
    """[aot], checked against the image's GPU targets (`cuda_archs`, None without [cuda]) and its [env]."""
    table = read.table(doc, ("aot",))
    if table is None:
        return None
    key = ("aot",)
    read.known_keys(table, key, _AOT_KEYS)
    if cuda_archs is None:
        raise read.error(key, "prebuilt kernels without a [cuda] table",
                         hint="add [cuda] with toolkit, archs and min_driver, or remove [aot]")
    if multi_platform:
        raise read.error(key, "[aot] and [platforms] together are not supported yet",
                         hint="build one platform per recipe; prebuilt kernels for several platforms are not "
                              "supported yet")
    configs: list[ModelConfigFile] = []
    return AotSpec(archs=_archs(read, table, cuda_archs, env),
                   sglang=_boolean(read, table, key + ("sglang",), True),
                   deep_gemm=_choice(read, table, key + ("deep_gemm",), DEEP_GEMM_MODES, "jit"),
                   shapes=_shapes(read, table, configs), model_configs=tuple(configs))


def _archs(read: RecipeReader, table: dict, cuda_archs: tuple[Arch, ...],
           env: dict[str, str]) -> tuple[Arch, ...]:
    """aot.archs, else [env] FLASHINFER_CUDA_ARCH_LIST, else [cuda].archs; each one a target of the image."""
    if "archs" in table:
        key: Key = ("aot", "archs")
        texts = read.strings(table, key, required=True, example='["12.0f"]')
        keys = [key + (index,) for index in range(len(texts))]
    elif _ARCH_ENV in env:
        key = ("env", _ARCH_ENV)
        texts = env[_ARCH_ENV].split()
        if not texts:
            raise read.error(key, "names no GPU target", hint=f'e.g. {_ARCH_ENV} = "12.0f", or remove it')
        keys = [key] * len(texts)
    else:
        return cuda_archs
    targets = {(arch.major, arch.minor) for arch in cuda_archs}
    archs: list[Arch] = []
    for item_key, text in zip(keys, texts):
        try:
            arch = Arch.parse(text)
        except ValueError as err:
            raise read.error(item_key, str(err), hint=_ARCH_HINT) from None
        if (arch.major, arch.minor) not in targets:
            raise read.error(item_key, f"{show(text)} is not one of the image's GPU targets",
                             hint=f"[cuda] archs: {', '.join(target.sm for target in cuda_archs)}; "
                                  "compile kernels only for a GPU the image targets, or add it to [cuda] archs")
        if arch not in archs:
            archs.append(arch)
    return tuple(archs)


def _shapes(read: RecipeReader, table: dict, configs: list[ModelConfigFile]) -> tuple[ServingShape, ...]:
    key = ("aot", "shapes")
    items = table.get("shapes")
    if items is None or items == []:
        raise read.error(key, "names no serving shape", hint=f"add {_SHAPE_EXAMPLE}")
    if not isinstance(items, list):
        raise read.error(key, f"expected a list of tables ([[aot.shapes]]), got {toml_kind(items)}",
                         hint=f"write {_SHAPE_EXAMPLE}")
    shapes = []
    named_at: dict[str, int] = {}  # shape name -> index in aot.shapes
    for index, item in enumerate(items):
        where = key + (index,)
        if not isinstance(item, dict):
            raise read.error(where, f"expected a table, got {toml_kind(item)}", hint=f"write {_SHAPE_EXAMPLE}")
        read.known_keys(item, where, _SHAPE_KEYS)
        read_config = config_values(read, item, where)
        if read_config is not None:
            configs.append(read_config)
        try:
            shape = _shape(read, read_config.merged(item) if read_config else item, where)
        except RecipeError as err:
            raise (read_config.blame(read, where, err) if read_config else err) from None
        if shape.name in named_at:
            raise read.error(where + ("name",), f"shape name {show(shape.name)} is already used by "
                                                f"aot.shapes[{named_at[shape.name]}]",
                             hint="give each shape its own name")
        named_at[shape.name] = index
        shapes.append(shape)
    return tuple(shapes)


def _shape(read: RecipeReader, item: dict, key: Key) -> ServingShape:
    name = read.string(item, key + ("name",), required=True, example='"llama3-8b-bf16"')
    if not _SHAPE_NAME.fullmatch(name):
        raise read.error(key + ("name",), f"{show(name)} is not a shape name",
                         hint="1 to 63 of a-z 0-9 . _ -, starting with a letter or digit: e.g. \"llama3-8b-bf16\"")
    head_dim = _integer(read, item, key + ("head_dim",), 16, 512, multiple=16, example="128")
    q_heads = _integer(read, item, key + ("q_heads",), 1, 1024, example="32")
    kv_heads = _integer(read, item, key + ("kv_heads",), 1, 1024, example="8")
    if q_heads % kv_heads:
        raise read.error(key + ("kv_heads",), f"{kv_heads} KV heads do not divide {q_heads} query heads",
                         hint="each KV head serves the same number of query heads: kv_heads divides q_heads "
                              "(kv_heads = q_heads without grouped-query attention)")
    hidden_size = None
    if "hidden_size" in item:
        hidden_size = _integer(read, item, key + ("hidden_size",), 16, 65536, multiple=16)
    tp = _tp(read, item, key + ("tp",), q_heads, kv_heads)
    rotary_dim = None
    if "rotary_dim" in item:
        rotary_dim = _integer(read, item, key + ("rotary_dim",), 2, head_dim, multiple=2, example=str(head_dim // 2))
    return ServingShape(
        name=name, head_dim=head_dim, q_heads=q_heads, kv_heads=kv_heads, tp=tp,
        dtype=_choice(read, item, key + ("dtype",), DTYPES, "bfloat16"),
        kv_dtype=_choice(read, item, key + ("kv_dtype",), KV_DTYPES, "auto"),
        sliding_window=_boolean(read, item, key + ("sliding_window",), False),
        logits_soft_cap=_boolean(read, item, key + ("logits_soft_cap",), False),
        rope=_choice(read, item, key + ("rope",), ROPE_STYLES, "neox"), rotary_dim=rotary_dim,
        qk_norm=_boolean(read, item, key + ("qk_norm",), False),
        hidden_size=hidden_size,
        prefix_cache=_boolean(read, item, key + ("prefix_cache",), True),
        sampling=_boolean(read, item, key + ("sampling",), True),
        context_lengths=_context_lengths(read, item, key + ("context_lengths",)),
        **check_moe(read, item, key, hidden_size, tp, _integer, _choice),
    )


def _tp(read: RecipeReader, item: dict, key: Key, q_heads: int, kv_heads: int) -> tuple[int, ...]:
    """Tensor-parallel sizes: each splits the query heads evenly, and the KV heads evenly or replicated."""
    value = item.get(key[-1], [1])
    if not isinstance(value, list):
        raise read.error(key, f"expected a list of integers, got {toml_kind(value)}", hint="e.g. tp = [1, 2]")
    if not value:
        raise read.error(key, "must not be empty", hint="e.g. tp = [1, 2], or leave it out for [1]")
    for index in range(len(value)):
        size = _integer(read, value, key + (index,), 1, 1024)
        if q_heads % size:
            raise read.error(key + (index,), f"tp {size} does not divide {q_heads} query heads",
                             hint="each rank serves the same number of query heads")
        if size % kv_heads and kv_heads % size:
            raise read.error(key + (index,), f"tp {size} neither divides {kv_heads} KV heads nor is a multiple "
                                             "of them",
                             hint="ranks split the KV heads evenly (tp divides kv_heads) or each holds whole "
                                  "copies (kv_heads divides tp)")
    return tuple(sorted(set(value)))


# SGLang's context length: at least one page of tokens, at most 2**24 (16M tokens; no model served today is longer).
CONTEXT_LENGTHS = (16, 1 << 24)


def _context_lengths(read: RecipeReader, item: dict, key: Key) -> tuple[int, ...]:
    """The servers' context lengths, each once, in order; none when the key is left out."""
    if key[-1] not in item:
        return ()
    value = item[key[-1]]
    hint = ("the --context-length SGLang serves (default: the model's max_position_embeddings), "
            "e.g. context_lengths = [131072, 40960] for Llama 3.1 8B and Qwen3-8B")
    if not isinstance(value, list):
        raise read.error(key, f"expected a list of integers, got {toml_kind(value)}", hint=hint)
    if not value:
        raise read.error(key, "must not be empty", hint=hint + ", or leave it out")
    lengths = [_integer(read, value, key + (index,), *CONTEXT_LENGTHS) for index in range(len(value))]
    return tuple(sorted(set(lengths)))


def _integer(read: RecipeReader, table: dict | list, key: Key, low: int, high: int, *, multiple: int = 1,
             example: str = "") -> int:
    """A required integer from low to high, a multiple of `multiple`; `table` may be a list, key[-1] its index."""
    if isinstance(table, dict) and key[-1] not in table:
        raise read.error(key, f"missing required key {key[-1]}", hint=f"add {key[-1]} = {example}")
    value = table[key[-1]]
    rule = f"a multiple of {multiple} from {low} to {high}" if multiple > 1 else f"from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        quoted = isinstance(value, str) and value.strip().isdigit()
        raise read.error(key, f"expected an integer, got {toml_kind(value)}",
                         hint="remove the quotes" if quoted else f"a whole number {rule}, without quotes")
    if not low <= value <= high or value % multiple:
        raise read.error(key, f"{_number(value)} is not {rule}", hint=f"a whole number {rule}")
    return value


def _boolean(read: RecipeReader, table: dict, key: Key, default: bool) -> bool:
    value = table.get(key[-1], default)
    if not isinstance(value, bool):
        quoted = isinstance(value, str) and value.strip().lower() in ("true", "false")
        raise read.error(key, f"expected true or false, got {toml_kind(value)}",
                         hint=f"write {key[-1]} = true or false{' without quotes' if quoted else ''}")
    return value


def _choice(read: RecipeReader, table: dict, key: Key, choices: tuple[str, ...], default: str) -> str:
    value = read.string(table, key)
    if value is None:
        return default
    if value not in choices:
        raise read.error(key, f"{show(value)} is not one of {', '.join(choices)}",
                         hint=f"{key[-1]} = " + " or ".join(f'"{choice}"' for choice in choices))
    return value


def _number(value: int) -> str:
    """An integer for a message, its digits cut short when long."""
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}…{text[-4:]} ({len(text)} digits)"
