"""[[aot.shapes]]'s quantized MoE part (recipe/aot_moe.py) and `model_config`, a shape read from the model's own
config.json (recipe/model_config.py): published configs of three MoE classes, each bad key one located
RecipeError, and arbitrary bytes or JSON in config.json never a traceback."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.errors import RecipeError
from imagebuild.lock.lockfile import model_configs, parse_lock, payload_sha256, recipe_sha256, stale_reasons
from imagebuild.recipe.model import Recipe, load_recipe
from imagebuild.render import template_sha256
from imagebuild.recipe.model_config import ModelConfigProblem, parse_model_config
from tests.json_fuzz import json_values, replace_one_field
from tests.lock.test_lock import _lock
from tests.recipe.test_aot_recipe import DOC as AOT_DOC
from tests.recipe.test_aot_recipe import parse_or_error
from tests.recipe.test_recipe import ANY_VALUE, PROPERTY, line_of

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"

HEAD = """\
[image]
name = "imagebuild/sglang-nvfp4"

[base]
debian = "bookworm"

[python]
requirements = ["sglang==0.5.23"]

[cuda]
toolkit = "13.0"
archs = ["12.0f"]
min_driver = "595.71.05"

[aot]

[[aot.shapes]]
name = "glm-4.5-nvfp4-tp8"
"""
EXPLICIT = HEAD + """\
head_dim = 128
q_heads = 96
kv_heads = 8
tp = [8]
hidden_size = 5120
quantization = "nvfp4"
experts = 160
top_k = 8
moe_intermediate_size = 1536
rotary_dim = 64
"""
FROM_CONFIG = HEAD + 'model_config = "glm/config.json"\ntp = [8]\n'


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "glm").mkdir()
    shutil.copy(CONFIGS / "glm-4.5-nvfp4.json", tmp_path / "glm" / "config.json")
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "nvfp4.toml"
    path.write_text(text)
    return path


def error_of(path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    return caught.value


def test_explicit_moe_keys_and_the_glm_config_give_the_same_shape(folder):
    explicit = load_recipe(write(folder, EXPLICIT)).aot.shapes[0]
    assert (explicit.quantization, explicit.experts, explicit.top_k, explicit.moe_intermediate_size,
            explicit.ep, explicit.tp) == ("nvfp4", 160, 8, 1536, (1,), (8,))
    recipe = load_recipe(write(folder, FROM_CONFIG))
    assert replace(recipe.aot.shapes[0], model_config=None) == explicit
    (read,) = recipe.aot.model_configs
    assert read.to_json()["sources"] == {
        "hidden_size": "hidden_size", "moe_intermediate_size": "moe_intermediate_size", "experts": "n_routed_experts",
        "top_k": "num_experts_per_tok", "q_heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
        "head_dim": "head_dim", "rotary_dim": "partial_rotary_factor x head_dim",
        "quantization": "quantization_config.quant_method and quant_algo"}
    assert read.shape == "glm-4.5-nvfp4-tp8" and read.file == "glm/config.json" and len(read.dims.sha256) == 64


def test_check_prints_each_value_read_with_its_config_key(folder):
    from imagebuild.flows.check import check
    report = check(write(folder, FROM_CONFIG))
    (note,) = [f for f in report.findings if f.rule == "aot-model-config"]
    assert note.status.value == "note" and not report.findings[0].stops_build
    assert "experts 160 (n_routed_experts)" in note.message and "top_k 8 (num_experts_per_tok)" in note.message
    assert note.evidence.startswith("glm/config.json (sha256 ")


def test_a_dense_shape_writes_no_moe_field_into_aot_json(folder):
    dense = HEAD + "head_dim = 128\nq_heads = 32\nkv_heads = 8\n"
    assert set(load_recipe(write(folder, dense)).aot.shapes[0].to_json()) == {
        "name", "head_dim", "q_heads", "kv_heads", "tp", "dtype", "kv_dtype", "sliding_window", "logits_soft_cap",
        "rope", "qk_norm", "hidden_size", "prefix_cache", "sampling"}
    moe = load_recipe(write(folder, EXPLICIT)).aot.shapes[0].to_json()
    assert (moe["quantization"], moe["experts"], moe["top_k"], moe["moe_intermediate_size"]) == ("nvfp4", 160, 8, 1536)
    assert "ep" not in moe and "model_config" not in moe


def test_explicit_keys_that_agree_with_the_config_are_kept(folder):
    shape = load_recipe(write(folder, FROM_CONFIG + "experts = 160\nquantization = \"nvfp4\"\n")).aot.shapes[0]
    assert shape.experts == 160


def test_an_explicit_key_that_disagrees_with_the_config_names_both_values(folder):
    text = FROM_CONFIG + "top_k = 6\n"
    error = error_of(write(folder, text))
    assert error.key == "aot.shapes[0].top_k" and error.line == line_of(text, "top_k = 6")
    assert "top_k = 6 disagrees with" in error.reason and "num_experts_per_tok = 8" in error.reason
    assert str(folder / "glm" / "config.json") in error.reason and "remove top_k" in error.hint


def test_qwen3_moe_names_its_experts_num_experts(folder):
    shutil.copy(CONFIGS / "qwen3-30b-a3b.json", folder / "glm" / "config.json")
    recipe = load_recipe(write(folder, FROM_CONFIG.replace("tp = [8]", "tp = [4]")))
    shape, (read,) = recipe.aot.shapes[0], recipe.aot.model_configs
    assert (shape.experts, shape.top_k, shape.moe_intermediate_size, shape.hidden_size) == (128, 8, 768, 2048)
    assert (shape.q_heads, shape.kv_heads, shape.head_dim, shape.quantization) == (32, 4, 128, "none")
    assert read.dims.sources["experts"] == "num_experts" and "quantization" not in read.dims.values


def test_deepseek_mla_attention_is_not_read_and_the_shape_must_write_it(folder):
    shutil.copy(CONFIGS / "deepseek-v2.json", folder / "glm" / "config.json")
    error = error_of(write(folder, FROM_CONFIG))
    assert error.key == "aot.shapes[0].head_dim" and "missing required key head_dim" in error.reason
    text = FROM_CONFIG + "head_dim = 128\nq_heads = 128\nkv_heads = 128\n"
    recipe = load_recipe(write(folder, text))
    assert (recipe.aot.shapes[0].experts, recipe.aot.shapes[0].top_k) == (160, 6)
    assert "MLA" in recipe.aot.model_configs[0].dims.sources["head_dim"]


def test_a_mixtral_style_config_takes_the_expert_size_from_intermediate_size():
    dims = parse_model_config(json.dumps({"hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
                                          "num_experts_per_tok": 2, "num_attention_heads": 32}).encode())
    assert dims.values["moe_intermediate_size"] == 14336 and dims.values["kv_heads"] == 32
    assert dims.values["head_dim"] == 128 and "no head_dim" in dims.sources["head_dim"]


def test_a_multimodal_config_is_read_from_its_text_config():
    inner = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    dims = parse_model_config(json.dumps({"architectures": ["X"], "text_config": inner}).encode())
    assert dims.values["experts"] == 128


@pytest.mark.parametrize("config, rotary_dim, source", [
    ({"head_dim": 128, "partial_rotary_factor": 0.5}, 64, "partial_rotary_factor x head_dim"),
    ({"head_dim": 128, "partial_rotary_factor": 0.25, "rope_scaling": {"partial_rotary_factor": 0.5}}, 64,
     "rope_scaling.partial_rotary_factor x head_dim"),  # SGLang's glm4_moe.py reads rope_scaling's first
    ({"head_dim": 128, "partial_rotary_factor": 1.0}, None, None),  # all of head_dim: the shape's default
    ({"head_dim": 128}, None, None),  # not stated: a model's code may default it, the config does not say
])
def test_partial_rope_is_read_where_sglang_reads_it(config, rotary_dim, source):
    dims = parse_model_config(json.dumps(config).encode())
    assert dims.values.get("rotary_dim") == rotary_dim and dims.sources.get("rotary_dim") == source


def test_rotary_dim_is_at_most_head_dim_and_reaches_aot_json_only_when_partial(folder):
    error = error_of(write(folder, EXPLICIT.replace("rotary_dim = 64", "rotary_dim = 192")))
    assert error.key == "aot.shapes[0].rotary_dim" and "from 2 to 128" in error.reason
    shape = load_recipe(write(folder, EXPLICIT)).aot.shapes[0]
    assert shape.to_json()["rotary_dim"] == 64
    dense = load_recipe(write(folder, EXPLICIT.replace("rotary_dim = 64\n", ""))).aot.shapes[0]
    assert "rotary_dim" not in dense.to_json()


@pytest.mark.parametrize("section, expected", [
    ({"quant_method": "modelopt_fp4"}, "nvfp4"),
    ({"quant_method": "modelopt", "quant_algo": "nvfp4"}, "nvfp4"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8-block"),
])
def test_quantization_follows_sglangs_loader_names(section, expected):
    assert parse_model_config(json.dumps({"quantization_config": section}).encode()).values["quantization"] == expected


def test_a_config_value_that_breaks_a_shape_rule_is_blamed_on_the_config(folder):
    config = json.loads((CONFIGS / "glm-4.5-nvfp4.json").read_text())
    (folder / "glm" / "config.json").write_text(json.dumps(dict(config, head_dim=100)))
    error = error_of(write(folder, FROM_CONFIG))
    assert error.key == "aot.shapes[0].model_config"
    assert "config.json: head_dim = 100: 100 is not a multiple of 16" in error.reason


BAD_CONFIGS = [
    (b"{", "is not JSON", None),
    (b"[1, 2]", "holds a JSON array, not an object", None),
    (b'{"hidden_size": "5120"}', "is string \"5120\", not a whole number", "hidden_size"),
    (b'{"hidden_size": 0}', "not a positive size", "hidden_size"),
    (b'{"n_routed_experts": 8, "moe_intermediate_size": 64}', "names n_routed_experts but no num_experts_per_tok",
     "num_experts_per_tok"),
    (b'{"quantization_config": {"quant_method": "awq"}}', 'quant_method "awq" is not one [aot] declares',
     "quantization_config.quant_method"),
    (b'{"quantization_config": {"quant_method": "fp8"}}', "per-tensor FP8", "quantization_config"),
    (b'{"hidden_size": NaN}', "is not JSON", None),
    (b'{"head_dim": 128, "partial_rotary_factor": 1.5}', "not a fraction in (0, 1]", "partial_rotary_factor"),
    (b'{"head_dim": 128, "rope_scaling": {"partial_rotary_factor": "half"}}', "not a fraction",
     "rope_scaling.partial_rotary_factor"),
    (b"\xff\xfe", "is not JSON", None),
]


@pytest.mark.parametrize("data, message, config_key", BAD_CONFIGS)
def test_a_bad_config_is_one_error_naming_the_file_and_its_key(folder, data, message, config_key):
    (folder / "glm" / "config.json").write_bytes(data)
    text = FROM_CONFIG
    error = error_of(write(folder, text))
    assert error.key == "aot.shapes[0].model_config" and error.line == line_of(text, "model_config =")
    assert message in error.reason and str(folder / "glm" / "config.json") in error.reason
    assert (f" key {config_key}:" in error.reason) if config_key else " key " not in error.reason
    assert error.hint


@pytest.mark.parametrize("change, where", [(None, "does not exist"), ("folder", "is a directory"),
                                           ("device", "is not a regular file")])
def test_a_missing_config_file_is_one_error(folder, change, where):
    shutil.rmtree(folder / "glm")
    if change == "folder":
        (folder / "glm" / "config.json").mkdir(parents=True)
    if change == "device":
        (folder / "glm").mkdir()
        (folder / "glm" / "config.json").symlink_to("/dev/zero")
    error = error_of(write(folder, FROM_CONFIG))
    assert error.key == "aot.shapes[0].model_config" and where in error.reason


MOE_ERRORS = [
    ("top_k = 8\n", "", "top_k", "missing required key top_k", "num_experts_per_tok"),
    ("hidden_size = 5120\n", "", "hidden_size", "missing required key hidden_size", "hidden_size = 5120"),
    ("top_k = 8\n", "top_k = 161\n", "top_k", "top_k 161 is more than the 160 experts", None),
    ("experts = 160\n", 'experts = "160"\n', "experts", "expected an integer", "remove the quotes"),
    ("moe_intermediate_size = 1536\n", "moe_intermediate_size = 1000\n", "moe_intermediate_size",
     "not a multiple of 16", None),
    ('quantization = "nvfp4"\n', 'quantization = "fp4"\n', "quantization", "'fp4' is not one of none, nvfp4, fp8-block",
     None),
    ("top_k = 8\n", "top_k = 8\nep = [3]\n", "ep[0]", "ep 3 does not divide 160 experts", None),
    ("top_k = 8\n", "top_k = 8\nep = [16]\n", "ep[0]", "ep 16 does not divide tp 8", "ep divides tp"),
    ("moe_intermediate_size = 1536\n", "moe_intermediate_size = 1552\n", "moe_intermediate_size",
     "1552 does not split over the 32 ranks", None),
    ("top_k = 8\n", "top_k = 8\nep = 8\n", "ep", "expected a list of integers", None),
]


@pytest.mark.parametrize("old, new, key, message, hint", MOE_ERRORS, ids=[c[2] + str(i) for i, c in enumerate(MOE_ERRORS)])
def test_moe_errors_name_file_key_line_and_hint(folder, old, new, key, message, hint):
    text = EXPLICIT.replace(old, new, 1)
    if "1552" in new:  # 1552 splits over 8 ranks, not over 32
        text = text.replace("tp = [8]", "tp = [32]")
    error = error_of(write(folder, text))
    assert error.key == f"aot.shapes[0].{key}", str(error)
    assert message in str(error), str(error)
    assert str(error).startswith(f"{folder / 'nvfp4.toml'}:")
    if new and not new.startswith("top_k = 8\nep"):
        assert error.line == line_of(text, new.strip())
    assert error.hint and (hint is None or hint in error.hint), error.hint


def test_fp4_gemm_backend_is_for_nvfp4_shapes_and_reaches_aot_json_only_when_not_the_default(folder):
    error = error_of(write(folder, HEAD + 'head_dim = 128\nq_heads = 32\nkv_heads = 8\n'
                                          'fp4_gemm_backend = "flashinfer_cudnn"\n'))
    assert error.key == "aot.shapes[0].fp4_gemm_backend" and "quantization none" in error.reason
    error = error_of(write(folder, EXPLICIT + 'fp4_gemm_backend = "cudnn"\n'))
    assert error.key == "aot.shapes[0].fp4_gemm_backend" and "flashinfer_cutlass, flashinfer_cudnn" in str(error)
    cudnn = load_recipe(write(folder, EXPLICIT + 'fp4_gemm_backend = "flashinfer_cudnn"\n')).aot.shapes[0]
    assert cudnn.to_json()["fp4_gemm_backend"] == "flashinfer_cudnn"
    assert "fp4_gemm_backend" not in load_recipe(write(folder, EXPLICIT)).aot.shapes[0].to_json()


def test_ep_without_experts_is_an_error(folder):
    error = error_of(write(folder, HEAD + "head_dim = 128\nq_heads = 32\nkv_heads = 8\nep = [2]\n"))
    assert error.key == "aot.shapes[0].ep" and "without experts" in error.reason


def test_ep_sizes_are_kept_sorted(folder):
    assert load_recipe(write(folder, EXPLICIT + "ep = [8, 1, 2]\n")).aot.shapes[0].ep == (1, 2, 8)


# --- the lock ------------------------------------------------------------------------------------

def test_the_config_files_sha256_is_locked_and_an_edit_makes_the_lock_stale(folder):
    path = write(folder, FROM_CONFIG)
    recipe = load_recipe(path)
    lock = replace(_lock(), recipe_sha256=recipe_sha256(recipe), template_sha256=template_sha256(),
                   payload_sha256=payload_sha256(), model_configs=model_configs(recipe))
    again = parse_lock(lock.to_json(), "x.lock")
    assert again == lock and json.loads(lock.to_json())["model_configs"] == [
        {"shape": "glm-4.5-nvfp4-tp8", "file": "glm/config.json", "sha256": recipe.aot.model_configs[0].dims.sha256}]
    assert stale_reasons(lock, recipe, template_sha256=template_sha256()) == []
    config = folder / "glm" / "config.json"
    config.write_text(config.read_text().replace('"rope_theta": 1000000', '"rope_theta": 10000'))
    assert stale_reasons(lock, load_recipe(path), template_sha256=template_sha256()) == [
        "a shape's model_config (config.json) changed since the lock was made"]
    # A lock with no model_config writes no key: the committed locks read and write as before.
    assert "model_configs" not in _lock().to_json()


# --- arbitrary input -----------------------------------------------------------------------------

def read_or_problem(data: bytes):
    try:
        return parse_model_config(data)
    except ModelConfigProblem as problem:
        assert problem.message
        return problem


@PROPERTY
@given(st.binary(max_size=600))
def test_arbitrary_bytes_are_a_config_or_one_problem(data):
    read_or_problem(data)


@PROPERTY
@given(json_values)
def test_arbitrary_json_is_a_config_or_one_problem(value):
    read_or_problem(json.dumps(value).encode())


@PROPERTY
@given(st.data())
def test_a_real_config_with_one_field_replaced_is_a_config_or_one_problem(data):
    doc = json.loads((CONFIGS / data.draw(st.sampled_from(["glm-4.5-nvfp4.json", "qwen3-30b-a3b.json",
                                                           "deepseek-v2.json"]))).read_text())
    replace_one_field(doc, data)
    read_or_problem(json.dumps(doc).encode())


@PROPERTY
@given(json_values)
def test_a_recipe_whose_config_holds_arbitrary_json_loads_or_is_one_recipe_error(tmp_path_factory, value):
    folder = tmp_path_factory.mktemp("arbitrary")
    (folder / "glm").mkdir()
    (folder / "glm" / "config.json").write_text(json.dumps({"hidden_size": value, "n_routed_experts": value,
                                                            "num_experts_per_tok": 2, "moe_intermediate_size": value,
                                                            "num_attention_heads": 32, "head_dim": 128}))
    try:
        load_recipe(write(folder, FROM_CONFIG.replace("tp = [8]", "tp = [1]")))
    except RecipeError as error:
        assert error.key and error.key.startswith("aot.shapes[0]")


@PROPERTY
@given(st.binary(max_size=600))
def test_a_recipe_whose_config_holds_arbitrary_bytes_loads_or_is_one_recipe_error(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("bytes")
    (folder / "glm").mkdir()
    (folder / "glm" / "config.json").write_bytes(data)
    try:
        load_recipe(write(folder, FROM_CONFIG))
    except RecipeError as error:
        assert error.key and error.key.startswith("aot.shapes[0]")


MOE_DOC_SHAPE = {"quantization": "nvfp4", "experts": 160, "top_k": 8, "moe_intermediate_size": 1536, "ep": [1, 8],
                 "hidden_size": 5120, "tp": [8], "q_heads": 96, "kv_heads": 8, "head_dim": 128}
MOE_NEAR = st.sampled_from([0, 1, 2, 7, 8, 16, 160, 161, 1536, 4097, -1, "nvfp4", "fp8-block", "8", [], [1], [3],
                            [16], [1, 8, 8], "flashinfer_cudnn"])


@PROPERTY
@given(st.sampled_from(["quantization", "fp4_gemm_backend", "experts", "top_k", "moe_intermediate_size", "ep",
                        "hidden_size", "tp", "rotary_dim"]),
       MOE_NEAR | ANY_VALUE, st.booleans(), st.booleans())
def test_any_value_for_a_moe_key_is_a_shape_or_one_located_error(key, value, sections, multiline):
    doc = copy.deepcopy(AOT_DOC)
    doc["aot"]["shapes"][0].update(MOE_DOC_SHAPE)
    doc["aot"]["shapes"][0][key] = value
    result = parse_or_error(doc, sections, multiline)
    if isinstance(result, Recipe):
        shape = result.aot.shapes[0]
        assert shape.top_k <= shape.experts and all(shape.experts % ep == 0 for ep in shape.ep)
        assert all(tp % ep == 0 and shape.moe_intermediate_size % (tp // ep) == 0 for tp in shape.tp for ep in shape.ep)


def test_check_stops_a_quantization_whose_kernels_are_not_prebuilt_before_the_build_does(folder):
    """fp8-block is declared and checked, but the kernel step does not read its kernels: check says so at the
    shape's key, as an error (a build stops before it starts); nvfp4 and unquantized shapes raise nothing."""
    from imagebuild.flows.check import check
    text = EXPLICIT.replace('quantization = "nvfp4"', 'quantization = "fp8-block"')
    (found,) = [f for f in check(write(folder, text)).findings if f.rule == "aot-quantization-not-prebuilt"]
    assert found.status.value == "error" and found.key == "aot.shapes[0].quantization"
    assert found.where.endswith(f":{line_of(text, 'quantization = ')}")
    assert "'glm-4.5-nvfp4-tp8' declares quantization 'fp8-block'" in found.message
    assert not [f for f in check(write(folder, EXPLICIT)).findings if f.rule == "aot-quantization-not-prebuilt"]
