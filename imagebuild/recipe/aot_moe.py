"""[[aot.shapes]]'s quantized mixture-of-experts part, and `model_config`: a shape read from config.json.

What decides the MoE kernels SGLang loads, read in SGLang 0.5.23: the quantization method (nvfp4 is
`modelopt_fp4`, which on SM120 runs FlashInfer's CUTLASS fused MoE: arg_groups/overrides.py
_moe_runner_backend_quant_constraints; fp8-block is `fp8` with a weight_block_size, fp8.py), the
routed experts, top-k, one expert's intermediate size, the hidden size, and the TP and EP sizes
(each rank holds experts / ep experts, fused_moe_triton/layer.py:414, split over tp / ep ranks,
distributed/parallel_state.py). FlashInfer's SM120 fused-MoE and FP4 generators take no shape at all
(jit/fused_moe.py gen_cutlass_fused_moe_sm120_module(use_fast_build)): the shape decides whether they
load, and SGLang's own kernels take the dimensions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import RecipeError
from imagebuild.recipe.model_config import ModelConfigProblem, ModelDims, read_model_config
from imagebuild.recipe.reader import Key, RecipeReader, show, toml_kind

QUANTIZATIONS = ("none", "nvfp4", "fp8-block")
SGLANG_QUANTIZATION = {"none": None, "nvfp4": "modelopt_fp4", "fp8-block": "fp8"}  # SGLang's --quantization
# SGLang's --fp4-gemm-backend for an nvfp4 shape's linear layers: flashinfer_cutlass is what its auto picks on
# SM120 (fp4_utils.initialize_fp4_gemm_config) and loads FlashInfer's CUTLASS FP4 GEMM; flashinfer_cudnn runs
# cuDNN's graphs and loads no FlashInfer module for them
FP4_GEMM_BACKENDS = ("flashinfer_cutlass", "flashinfer_cudnn")
MOE_KEYS = ("quantization", "fp4_gemm_backend", "experts", "top_k", "moe_intermediate_size", "ep", "model_config")
MOE_DEFAULTS = {"quantization": "none", "fp4_gemm_backend": "flashinfer_cutlass", "experts": None, "top_k": None,
                "moe_intermediate_size": None, "ep": [1], "model_config": None}
_TOGETHER = ("experts", "top_k", "moe_intermediate_size")
_EXAMPLES = {"experts": "160", "top_k": "8", "moe_intermediate_size": "1536", "hidden_size": "5120"}


@dataclass(frozen=True)
class ModelConfigFile:
    """One shape's `model_config`: the file as the recipe writes it, where it is, and what it says."""

    shape: str  # the shape's name
    file: str
    path: Path  # absolute
    dims: ModelDims
    explicit: frozenset = frozenset()  # the fields the shape writes itself (each agrees with the config)

    def merged(self, item: dict) -> dict:
        """The shape's keys with the config's values for those it does not write (config_values checked
        that those it writes agree)."""
        return dict(self.dims.values, **item)

    def blame(self, read: RecipeReader, where: Key, error: RecipeError) -> RecipeError:
        """A shape error about a value the config gave, told as the config's: its file and key."""
        field = (error.key or "").rpartition(".")[2]
        if field not in self.dims.values or field in self.explicit:
            return error
        return read.error(where + ("model_config",), f"{self.path}: {self.dims.sources[field]} = "
                                                    f"{self.dims.values[field]!r}: {error.reason}",
                          hint=f"write {field} on the shape to serve it otherwise, or fix the config")

    def to_json(self) -> dict:
        return {"shape": self.shape, "file": self.file, **self.dims.to_json()}


def config_values(read: RecipeReader, item: dict, where: Key) -> ModelConfigFile | None:
    """The shape's model_config read, each value it gives checked against the key the shape writes."""
    if "model_config" not in item:
        return None
    key = where + ("model_config",)
    file = read.string(item, key, required=True, example='"models/glm-4.5-nvfp4/config.json"')
    if not file.strip() or "\0" in file:
        raise read.error(key, f"{show(file)} is not a path", hint='e.g. model_config = "models/glm/config.json"')
    path = Path(os.path.abspath(Path(os.path.abspath(read.path)).parent / file))
    try:
        dims = read_model_config(path)
    except ModelConfigProblem as problem:
        at = f" key {problem.key}" if problem.key else ""
        raise read.error(key, f"{path}{at}: {problem.message}",
                         hint=problem.hint or "point model_config at the model's config.json") from None
    for field, value in dims.values.items():
        if field in item and item[field] != value:
            raise read.error(where + (field,), f"{field} = {_shown(item[field])} disagrees with {path}: "
                                               f"{dims.sources[field]} = {_shown(value)}",
                             hint=f"remove {field} from the shape to take the config's value, or point "
                                  "model_config at the config of the model you serve")
    name = item.get("name") if isinstance(item.get("name"), str) else ""
    return ModelConfigFile(shape=name, file=file, path=path, dims=dims,
                           explicit=frozenset(field for field in dims.values if field in item))


def check_moe(read: RecipeReader, item: dict, key: Key, hidden_size: int | None, tp: tuple[int, ...],
              integer, choice) -> dict:
    """The ServingShape fields of the MoE part: quantization, experts, top_k, moe_intermediate_size, ep,
    model_config. `integer` and `choice` are aot.py's readers."""
    fields = {"quantization": choice(read, item, key + ("quantization",), QUANTIZATIONS, "none"),
              "model_config": item.get("model_config")}
    if "fp4_gemm_backend" in item and fields["quantization"] != "nvfp4":
        raise read.error(key + ("fp4_gemm_backend",), f"fp4_gemm_backend on a shape of quantization "
                                                      f"{fields['quantization']}: it chooses NVFP4 linear layers' GEMM",
                         hint='remove it, or set quantization = "nvfp4"')
    fields["fp4_gemm_backend"] = choice(read, item, key + ("fp4_gemm_backend",), FP4_GEMM_BACKENDS,
                                        "flashinfer_cutlass")
    given = [name for name in _TOGETHER if name in item]
    if not given:
        if "ep" in item:
            raise read.error(key + ("ep",), "ep sizes on a shape without experts",
                             hint="add experts, top_k and moe_intermediate_size, or remove ep")
        return fields
    for name in _TOGETHER:
        if name not in item:
            raise read.error(key + (name,), f"missing required key {name}: a MoE shape names experts, top_k and "
                                            "moe_intermediate_size together",
                             hint=f"add {name} = {_EXAMPLES[name]} (config.json: {_config_key(name)}), or "
                                  "model_config = \"path/to/config.json\"")
    if hidden_size is None:
        raise read.error(key + ("hidden_size",), "missing required key hidden_size: the MoE kernels take the "
                                                 "model's hidden size",
                         hint="add hidden_size = 5120 (config.json: hidden_size)")
    experts = integer(read, item, key + ("experts",), 1, 4096, example="160")
    top_k = integer(read, item, key + ("top_k",), 1, 4096, example="8")
    if top_k > experts:
        raise read.error(key + ("top_k",), f"top_k {top_k} is more than the {experts} experts",
                         hint="top_k (config.json: num_experts_per_tok) is how many of the experts a token uses")
    size = integer(read, item, key + ("moe_intermediate_size",), 16, 65536, multiple=16, example="1536")
    return dict(fields, experts=experts, top_k=top_k, moe_intermediate_size=size,
                ep=ep_sizes(read, item, key + ("ep",), experts, size, tp, integer))


def ep_sizes(read: RecipeReader, item: dict, key: Key, experts: int, size: int, tp: tuple[int, ...],
             integer) -> tuple[int, ...]:
    """Expert-parallel sizes: each splits the experts evenly and divides every tp size, and the tp / ep ranks
    that share an expert split its intermediate size evenly."""
    value = item.get(key[-1], [1])
    if not isinstance(value, list):
        raise read.error(key, f"expected a list of integers, got {toml_kind(value)}", hint="e.g. ep = [1, 8]")
    if not value:
        raise read.error(key, "must not be empty", hint="e.g. ep = [1, 8], or leave it out for [1]")
    for index in range(len(value)):
        ep = integer(read, value, key + (index,), 1, 1024)
        if experts % ep:
            raise read.error(key + (index,), f"ep {ep} does not divide {experts} experts",
                             hint="each expert-parallel rank holds the same number of experts")
        for tp_size in tp:
            if tp_size % ep:
                raise read.error(key + (index,), f"ep {ep} does not divide tp {tp_size}",
                                 hint="SGLang's expert-parallel groups split the tensor-parallel ranks: ep divides tp")
            if size % (tp_size // ep):
                at = key + (index,) if key[-1] in item else key[:-1] + ("moe_intermediate_size",)
                raise read.error(at, f"moe_intermediate_size {size} does not split over the "
                                                 f"{tp_size // ep} ranks of tp {tp_size} / ep {ep}",
                                 hint="the ranks that share an expert split its intermediate size evenly")
    return tuple(sorted(set(value)))


def _config_key(field: str) -> str:
    return {"experts": "n_routed_experts or num_experts", "top_k": "num_experts_per_tok",
            "moe_intermediate_size": "moe_intermediate_size"}[field]


def _shown(value) -> str:
    return show(value) if isinstance(value, str) else repr(value)[:40]
