"""A model's own config.json, read into the [[aot.shapes]] fields it decides (`model_config = "..."`).

The key names are those SGLang 0.5.23's model classes read from the Hugging Face config
(`config.<name>` in sglang/srt/models/glm4_moe.py, deepseek_v2.py and qwen3_moe.py):

    hidden_size            hidden_size                          all three
    moe_intermediate_size  moe_intermediate_size                all three
    experts                n_routed_experts                     GLM-4.x MoE (glm4_moe.py:390), DeepSeek (deepseek_v2.py:511)
                           num_experts                          Qwen3-MoE (qwen3_moe.py:246)
                           num_local_experts                    Mixtral (mixtral.py:228), whose experts are
    moe_intermediate_size  intermediate_size                    intermediate_size wide (mixtral.py:231)
    top_k                  num_experts_per_tok                  all three
    q_heads                num_attention_heads                  all three
    kv_heads               num_key_value_heads                  (absent: num_attention_heads, transformers' rule)
    head_dim               head_dim                             (absent: hidden_size // num_attention_heads)
    (none of the three)    kv_lora_rank present                 DeepSeek MLA (deepseek_v2.py): its attention is
                                                                not an MHA/GQA shape, so the shape writes its own
    quantization           quantization_config                  SGLang's loaders: see quantization_of() below
                                                                (absent: not stated; ModelOpt may keep it in
                                                                hf_quant_config.json, so nothing is assumed)

Every problem is one ModelConfigProblem naming the key and what to do; the recipe reader turns it
into a RecipeError naming the config file and the recipe's key. Bytes from outside are data: nothing
here raises anything else, whatever the file holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

# shape field -> config.json keys, the first present wins (see the table above)
FIELD_KEYS = {
    "hidden_size": ("hidden_size",),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "top_k": ("num_experts_per_tok",),
    "q_heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
}
LIMIT_BYTES = 4 * 1024 * 1024  # a config.json is a few kB; more is not a model config
INTEGER_LIMIT = 1 << 31


class ModelConfigProblem(ValueError):
    """config.json cannot give a shape's fields: `key` is the config key at fault (None: the whole file)."""

    def __init__(self, message: str, key: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message, self.key, self.hint = message, key, hint


@dataclass(frozen=True)
class ModelDims:
    """What one config.json says: shape field -> (value, the config key it came from)."""

    sha256: str
    values: dict  # field -> value
    sources: dict  # field -> config key, e.g. "experts" -> "n_routed_experts"; derived and skipped ones say how

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "values": dict(self.values), "sources": dict(self.sources)}


def read_model_config(path: Path) -> ModelDims:
    """The shape fields config.json at `path` decides; ModelConfigProblem when it cannot be read as one."""
    try:
        if path.exists() and not path.is_dir() and not path.is_file():  # a device or a pipe could block or never end
            raise ModelConfigProblem("is not a regular file", hint="name the model's config.json file")
        with open(path, "rb") as handle:
            data = handle.read(LIMIT_BYTES + 1)
    except FileNotFoundError:
        raise ModelConfigProblem("does not exist", hint="write model_config as a path relative to the recipe, "
                                                        "to the model's config.json") from None
    except IsADirectoryError:
        raise ModelConfigProblem("is a directory", hint="name the config.json file inside it") from None
    except (OSError, ValueError) as err:
        raise ModelConfigProblem(f"cannot be read: {getattr(err, 'strerror', None) or err}") from None
    return parse_model_config(data)


def parse_model_config(data: bytes) -> ModelDims:
    """The shape fields a config.json's bytes decide."""
    if len(data) > LIMIT_BYTES:
        raise ModelConfigProblem(f"is larger than {LIMIT_BYTES // (1024 * 1024)} MiB: not a model's config.json",
                                 hint="point model_config at the model's config.json")
    try:
        config = json.loads(data.decode("utf-8-sig"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ModelConfigProblem(f"is not JSON: {str(err)[:200]}",
                                 hint="point model_config at the model's config.json") from None
    if not isinstance(config, dict):
        raise ModelConfigProblem(f"holds a JSON {_kind(config)}, not an object",
                                 hint="point model_config at the model's config.json")
    config = _text_config(config)
    values, sources = {}, {}
    for field, names in FIELD_KEYS.items():
        for name in names:
            if name in config and config[name] is not None:
                values[field], sources[field] = _positive(config[name], name), name
                break
    if sources.get("experts") == "num_local_experts" and "moe_intermediate_size" not in values \
            and config.get("intermediate_size") is not None:
        values["moe_intermediate_size"] = _positive(config["intermediate_size"], "intermediate_size")
        sources["moe_intermediate_size"] = "intermediate_size (num_local_experts: each expert's size)"
    if "experts" in values:
        for field in ("top_k", "moe_intermediate_size"):
            if field not in values:
                raise ModelConfigProblem(f"names {sources['experts']} but no {' or '.join(FIELD_KEYS[field])}",
                                         key=FIELD_KEYS[field][0],
                                         hint="a MoE config states experts, experts per token and the expert size; "
                                              "write experts, top_k and moe_intermediate_size on the shape instead")
    if config.get("kv_lora_rank") is not None:  # DeepSeek-style MLA: its heads are not a paged MHA/GQA shape
        for field in ("q_heads", "kv_heads", "head_dim"):
            values.pop(field, None)
            sources[field] = "not read: MLA attention (kv_lora_rank), which [aot] does not declare"
    elif "q_heads" in values and "kv_heads" not in values:
        values["kv_heads"], sources["kv_heads"] = values["q_heads"], "num_attention_heads (no num_key_value_heads)"
    if "head_dim" not in values and "head_dim" not in sources and "hidden_size" in values and "q_heads" in values:
        if values["hidden_size"] % values["q_heads"] == 0:
            values["head_dim"] = values["hidden_size"] // values["q_heads"]
            sources["head_dim"] = "hidden_size / num_attention_heads (no head_dim)"
    rotary = _rotary_factor(config)
    if rotary is not None and "head_dim" in values and rotary[0] < 1:
        values["rotary_dim"] = int(values["head_dim"] * rotary[0])
        sources["rotary_dim"] = f"{rotary[1]} x head_dim"
    if config.get("quantization_config") is not None:
        values["quantization"], sources["quantization"] = quantization_of(config["quantization_config"])
    return ModelDims(sha256=hashlib.sha256(data).hexdigest(), values=values, sources=sources)


def quantization_of(section) -> tuple[str, str]:
    """[aot]'s quantization name for a config.json's quantization_config, and the keys that said so.

    nvfp4: SGLang's modelopt_fp4 (ModelOptFp4Config), chosen for quant_method "modelopt_fp4", or "modelopt"
    with quant_algo NVFP4 (base_config.py _modelopt_override_quantization_method). fp8-block: SGLang's fp8
    (Fp8Config) with a two-dimensional weight_block_size (fp8.py)."""
    if not isinstance(section, dict):
        raise ModelConfigProblem(f"is a JSON {_kind(section)}, not an object", key="quantization_config",
                                 hint="fix the config, or write quantization on the shape and remove model_config")
    method = section.get("quant_method")
    algo = section.get("quant_algo")
    algo = algo.upper() if isinstance(algo, str) else None
    if method == "modelopt_fp4" or (method == "modelopt" and algo == "NVFP4"):
        return "nvfp4", "quantization_config.quant_method" + (" and quant_algo" if method == "modelopt" else "")
    if method == "fp8":
        block = section.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2:
            return "fp8-block", "quantization_config.quant_method and weight_block_size"
        raise ModelConfigProblem("quant_method \"fp8\" without a two-number weight_block_size is per-tensor FP8, "
                                 "which [aot] does not declare yet", key="quantization_config",
                                 hint="[aot] knows nvfp4 (ModelOpt NVFP4) and fp8-block (weight_block_size [128, 128])")
    shown = json.dumps(method)[:60] + (f" (quant_algo {json.dumps(algo)[:40]})" if algo else "")
    raise ModelConfigProblem(f"quant_method {shown} is not one [aot] declares", key="quantization_config.quant_method",
                             hint="[aot] knows nvfp4 (modelopt_fp4, or modelopt with quant_algo NVFP4) and fp8-block "
                                  "(fp8 with weight_block_size); serve another quantization without [aot] kernels")


def _rotary_factor(config: dict) -> tuple | None:
    """(factor, key) of partial RoPE, where SGLang looks (models/glm4_moe.py: rope_scaling's first, then the
    config's own); None when neither states one. Only what the config states: a model's code may default it."""
    for key, holder in (("rope_scaling.partial_rotary_factor", config.get("rope_scaling")),
                        ("partial_rotary_factor", config)):
        if isinstance(holder, dict) and holder.get("partial_rotary_factor") is not None:
            value = holder["partial_rotary_factor"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ModelConfigProblem(f"is {json.dumps(value)[:40]}, not a fraction in (0, 1]", key=key,
                                         hint="fix the config, or write rotary_dim on the shape without model_config")
            return float(value), key
    return None


def _text_config(config: dict) -> dict:
    """A multimodal config keeps its language model's keys in text_config (Qwen3-VL-MoE, GLM-4.xV)."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and not any(name in config for names in FIELD_KEYS.values() for name in names):
        return dict(inner, quantization_config=config.get("quantization_config", inner.get("quantization_config")))
    return config


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())):
        raise ModelConfigProblem(f"is {_kind(value)} {json.dumps(value)[:40]}, not a whole number", key=name,
                                 hint="fix the config, or write the shape's keys without model_config")
    number = int(value)
    if not 0 < number < INTEGER_LIMIT:
        raise ModelConfigProblem(f"is {str(number)[:24]}, not a positive size", key=name,
                                 hint="fix the config, or write the shape's keys without model_config")
    return number


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)
