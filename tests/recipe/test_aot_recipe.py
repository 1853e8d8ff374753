"""[aot]: the serving shapes whose kernels an image ships prebuilt, parsed into AotSpec; every bad
input becomes one located RecipeError."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.errors import RecipeError
from imagebuild.recipe.aot import DEEP_GEMM_MODES, DTYPES, KV_DTYPES, ROPE_STYLES, AotSpec, ServingShape
from imagebuild.recipe.cuda import Arch
from imagebuild.recipe.model import Recipe, parse_recipe
from tests.recipe.test_recipe import ANY_VALUE, PROPERTY, line_of, toml_document

PATH = Path("recipes/sglang-aot.toml")

HEAD = """\
[image]
name = "imagebuild/sglang-aot"

[base]
debian = "bookworm"

[python]
requirements = ["sglang==0.5.6", "flashinfer-python==0.5.3"]

[cuda]
toolkit = "13.0"
archs = ["sm_120a", "12.0f"]
min_driver = "580.65.06"

[env]
FLASHINFER_CUDA_ARCH_LIST = "12.0f"
"""

# A valid [aot] with every key set; the error cases below each break it in one place.
AOT = """
[aot]
archs = ["12.0f", "sm_120f", "12.0a"]
sglang = false
deep_gemm = "disabled"

[[aot.shapes]]
name = "llama3-8b-fp8kv"
head_dim = 128
q_heads = 32
kv_heads = 8
tp = [4, 1, 2, 1]
dtype = "float16"
kv_dtype = "fp8_e4m3"
sliding_window = true
logits_soft_cap = true
rope = "gptj"
qk_norm = true
hidden_size = 4096
prefix_cache = false
sampling = false

[[aot.shapes]]
name = "qwen3-32b"
head_dim = 128
q_heads = 64
kv_heads = 8
tp = [16]
context_lengths = [40960, 32768, 40960]
"""

BASE = HEAD + AOT
ARCH_ENV = 'FLASHINFER_CUDA_ARCH_LIST = "12.0f"'

MINIMAL_AOT = """
[aot]

[[aot.shapes]]
name = "llama3-8b-bf16"
head_dim = 128
q_heads = 32
kv_heads = 8
"""


def parse(text: str) -> Recipe:
    return parse_recipe(text, PATH)


def recipe_error(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        parse(text)
    return caught.value


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def without_env(text: str) -> str:
    return edit(f"[env]\n{ARCH_ENV}\n", "", text)


# --- valid tables --------------------------------------------------------------------------------

def test_every_key():
    aot = parse(BASE).aot
    assert aot.archs == (Arch(12, 0, "f"), Arch(12, 0, "a"))  # sm_120f repeats 12.0f; order kept
    assert (aot.sglang, aot.deep_gemm) == (False, "disabled")
    assert aot.shapes == (
        ServingShape(name="llama3-8b-fp8kv", head_dim=128, q_heads=32, kv_heads=8, tp=(1, 2, 4),
                     dtype="float16", kv_dtype="fp8_e4m3", sliding_window=True, logits_soft_cap=True,
                     rope="gptj", qk_norm=True, hidden_size=4096, prefix_cache=False, sampling=False),
        ServingShape(name="qwen3-32b", head_dim=128, q_heads=64, kv_heads=8, tp=(16,), context_lengths=(32768, 40960)),
    )


def test_defaults_take_the_archs_from_flashinfer_cuda_arch_list():
    recipe = parse(edit(ARCH_ENV, 'FLASHINFER_CUDA_ARCH_LIST = "12.0f  sm_120a\t12.0f"', HEAD) + MINIMAL_AOT)
    aot = recipe.aot
    assert aot.archs == (Arch(12, 0, "f"), Arch(12, 0, "a"))
    assert (aot.sglang, aot.deep_gemm) == (True, "jit")
    assert aot.shapes == (ServingShape(name="llama3-8b-bf16", head_dim=128, q_heads=32, kv_heads=8),)
    shape = aot.shapes[0]
    assert (shape.tp, shape.dtype, shape.kv_dtype, shape.rope, shape.hidden_size) == ((1,), "bfloat16", "auto",
                                                                                       "neox", None)
    assert (shape.sliding_window, shape.logits_soft_cap, shape.qk_norm) == (False, False, False)
    assert (shape.prefix_cache, shape.sampling) == (True, True)


def test_defaults_take_the_archs_from_cuda_without_the_env_key():
    recipe = parse(without_env(HEAD) + MINIMAL_AOT)
    assert recipe.aot.archs == recipe.cuda.archs == (Arch(12, 0, "a"), Arch(12, 0, "f"))


def test_aot_archs_win_over_the_env_key():
    assert parse(HEAD + edit("[aot]\n", '[aot]\narchs = ["sm_120a"]\n', MINIMAL_AOT)).aot.archs == (Arch(12, 0, "a"),)


def test_an_arch_matches_a_cuda_arch_by_major_and_minor():
    text = edit('archs = ["sm_120a", "12.0f"]', 'archs = ["sm_120a", "sm_90a"]', HEAD)
    text = edit("[aot]\n", '[aot]\narchs = ["12.0f", "9.0"]\n', text + MINIMAL_AOT)
    assert parse(text).aot.archs == (Arch(12, 0, "f"), Arch(9, 0))


def test_inline_and_dotted_forms():
    text = 'aot.deep_gemm = "jit"\naot.shapes = [{ name = "a", head_dim = 64, q_heads = 8, kv_heads = 8 }]\n' + HEAD
    aot = parse(text).aot
    assert (aot.deep_gemm, aot.shapes[0].head_dim, aot.shapes[0].tp) == ("jit", 64, (1,))


def test_a_recipe_without_aot():
    assert parse(HEAD).aot is None


def test_to_json_and_arch_list():
    aot = parse(BASE).aot
    assert aot.arch_list == "12.0f 12.0a"
    data = aot.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data == {
        "archs": ["12.0f", "12.0a"], "sglang": False, "deep_gemm": "disabled",
        "shapes": [
            {"name": "llama3-8b-fp8kv", "head_dim": 128, "q_heads": 32, "kv_heads": 8, "tp": [1, 2, 4],
             "dtype": "float16", "kv_dtype": "fp8_e4m3", "sliding_window": True, "logits_soft_cap": True,
             "rope": "gptj", "qk_norm": True, "hidden_size": 4096, "prefix_cache": False, "sampling": False},
            {"name": "qwen3-32b", "head_dim": 128, "q_heads": 64, "kv_heads": 8, "tp": [16],
             "dtype": "bfloat16", "kv_dtype": "bfloat16", "sliding_window": False, "logits_soft_cap": False,
             "rope": "neox", "qk_norm": False, "hidden_size": None, "prefix_cache": True, "sampling": True,
             "context_lengths": [32768, 40960]},
        ],
    }
    assert parse(without_env(HEAD) + MINIMAL_AOT).aot.arch_list == "12.0a 12.0f"


# --- errors: (old, new, key, line snippet, message part, hint part) -----------------------------

AOT_ERRORS = [
    ('archs = ["12.0f", "sm_120f", "12.0a"]', 'arch = ["12.0f"]', "aot.arch", "arch =",
     "unknown key 'arch' in [aot]", "did you mean 'archs'?"),
    ('archs = ["12.0f", "sm_120f", "12.0a"]', 'archs = "12.0f"', "aot.archs", 'archs = "12.0f"',
     "expected a list of strings, got string", None),
    ('archs = ["12.0f", "sm_120f", "12.0a"]', "archs = []", "aot.archs", "archs = []", "must not be empty",
     '["12.0f"]'),
    ('archs = ["12.0f", "sm_120f", "12.0a"]', 'archs = ["12.0f", "sm_12x"]', "aot.archs[1]", "sm_12x",
     "'sm_12x' is not a GPU target", "sm_<major><minor>"),
    ('archs = ["12.0f", "sm_120f", "12.0a"]', 'archs = ["12.0f", "9.0a"]', "aot.archs[1]", "9.0a",
     "'9.0a' is not one of the image's GPU targets", "[cuda] archs: sm_120a, sm_120f"),
    ('archs = ["12.0f", "sm_120f", "12.0a"]\n', "", "env.FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST",
     "'sm_121a' is not one of the image's GPU targets", "[cuda] archs: sm_120a, sm_120f"),
    ('sglang = false', 'sglang = "false"', "aot.sglang", "sglang =", "expected true or false, got string",
     "without quotes"),
    ('deep_gemm = "disabled"', 'deep_gemm = "off"', "aot.deep_gemm", "deep_gemm =",
     "'off' is not one of jit, disabled", 'deep_gemm = "jit" or "disabled"'),
    ('deep_gemm = "disabled"', "deep_gemm = false", "aot.deep_gemm", "deep_gemm =",
     "expected a string, got boolean", None),
    ('name = "llama3-8b-fp8kv"\n', "", "aot.shapes[0].name", "[[aot.shapes]]", "missing required key name",
     'add name = "llama3-8b-bf16"'),
    ('name = "llama3-8b-fp8kv"', 'name = "Llama3"', "aot.shapes[0].name", "Llama3", "'Llama3' is not a shape name",
     "a-z 0-9"),
    ('name = "llama3-8b-fp8kv"', f'name = "{"a" * 64}"', "aot.shapes[0].name", "aaa", "is not a shape name", None),
    ('name = "qwen3-32b"', 'name = "llama3-8b-fp8kv"  # again', "aot.shapes[1].name", "# again",
     "shape name 'llama3-8b-fp8kv' is already used by aot.shapes[0]", "its own name"),
    ("head_dim = 128\nq_heads = 32", "head_dims = 128\nq_heads = 32", "aot.shapes[0].head_dims", "head_dims",
     "unknown key 'head_dims' in [aot.shapes[0]]", "did you mean 'head_dim'?"),
    ("head_dim = 128\nq_heads = 32", "q_heads = 32", "aot.shapes[0].head_dim", "[[aot.shapes]]",
     "missing required key head_dim", "add head_dim = 128"),
    ("head_dim = 128\nq_heads = 32", "head_dim = 100\nq_heads = 32", "aot.shapes[0].head_dim", "head_dim = 100",
     "100 is not a multiple of 16 from 16 to 512", None),
    ("head_dim = 128\nq_heads = 32", "head_dim = 528\nq_heads = 32", "aot.shapes[0].head_dim", "head_dim = 528",
     "528 is not a multiple of 16 from 16 to 512", None),
    ("head_dim = 128\nq_heads = 32", "head_dim = 0\nq_heads = 32", "aot.shapes[0].head_dim", "head_dim = 0",
     "0 is not a multiple of 16", None),
    ("head_dim = 128\nq_heads = 32", 'head_dim = "128"\nq_heads = 32', "aot.shapes[0].head_dim", "head_dim",
     "expected an integer, got string", "remove the quotes"),
    ("head_dim = 128\nq_heads = 32", "head_dim = true\nq_heads = 32", "aot.shapes[0].head_dim", "head_dim",
     "expected an integer, got boolean", "without quotes"),
    ("head_dim = 128\nq_heads = 32", "head_dim = 128.0\nq_heads = 32", "aot.shapes[0].head_dim", "head_dim",
     "expected an integer, got float", None),
    ("q_heads = 32", "q_heads = 0", "aot.shapes[0].q_heads", "q_heads = 0", "0 is not from 1 to 1024", None),
    ("q_heads = 32", "q_heads = 2048", "aot.shapes[0].q_heads", "q_heads = 2048", "2048 is not from 1 to 1024",
     None),
    ("q_heads = 32", "q_heads = 1_000_000_000_000_000_000_000_000_000_000", "aot.shapes[0].q_heads", "q_heads",
     "10000000…0000 (31 digits) is not from 1 to 1024", None),
    ("kv_heads = 8\ntp = [4", "kv_heads = 3\ntp = [4", "aot.shapes[0].kv_heads", "kv_heads = 3",
     "3 KV heads do not divide 32 query heads", "kv_heads divides q_heads"),
    ("kv_heads = 8\ntp = [4", "kv_heads = 0\ntp = [4", "aot.shapes[0].kv_heads", "kv_heads = 0",
     "0 is not from 1 to 1024", None),
    ("tp = [4, 1, 2, 1]", "tp = 2", "aot.shapes[0].tp", "tp = 2", "expected a list of integers, got integer",
     "tp = [1, 2]"),
    ("tp = [4, 1, 2, 1]", "tp = []", "aot.shapes[0].tp", "tp = []", "must not be empty", "leave it out"),
    ("tp = [4, 1, 2, 1]", "tp = [1, 3]", "aot.shapes[0].tp[1]", "tp = [1, 3]", "tp 3 does not divide 32 query heads",
     None),
    ("tp = [4, 1, 2, 1]", "tp = [1, 0]", "aot.shapes[0].tp[1]", "tp = [1, 0]", "0 is not from 1 to 1024", None),
    ("tp = [4, 1, 2, 1]", "tp = [1, true]", "aot.shapes[0].tp[1]", "tp = [1, true]",
     "expected an integer, got boolean", None),
    ("q_heads = 32\nkv_heads = 8\ntp = [4, 1, 2, 1]", "q_heads = 24\nkv_heads = 6\ntp = [1, 4]",
     "aot.shapes[0].tp[1]", "tp = [1, 4]", "tp 4 neither divides 6 KV heads nor is a multiple of them",
     "kv_heads divides tp"),
    ('dtype = "float16"', 'dtype = "float32"', "aot.shapes[0].dtype", "dtype = \"float32\"",
     "'float32' is not one of bfloat16, float16", None),
    ('kv_dtype = "fp8_e4m3"', 'kv_dtype = "fp8"', "aot.shapes[0].kv_dtype", "kv_dtype",
     "'fp8' is not one of auto, bfloat16, float16, fp8_e4m3, fp8_e5m2", None),
    ('rope = "gptj"', 'rope = "yarn"', "aot.shapes[0].rope", "rope", "'yarn' is not one of neox, gptj, none", None),
    ("sliding_window = true", "sliding_window = 1", "aot.shapes[0].sliding_window", "sliding_window",
     "expected true or false, got integer", None),
    ("logits_soft_cap = true", "logits_soft_cap = 30.0", "aot.shapes[0].logits_soft_cap", "logits_soft_cap",
     "expected true or false, got float", None),
    ("qk_norm = true", 'qk_norm = "yes"', "aot.shapes[0].qk_norm", "qk_norm", "expected true or false", None),
    ("prefix_cache = false", "prefix_cache = []", "aot.shapes[0].prefix_cache", "prefix_cache",
     "expected true or false, got list", None),
    ("sampling = false", "sampling = 0", "aot.shapes[0].sampling", "sampling", "expected true or false", None),
    ("hidden_size = 4096", "hidden_size = 4100", "aot.shapes[0].hidden_size", "hidden_size",
     "4100 is not a multiple of 16 from 16 to 65536", None),
    ("hidden_size = 4096", "hidden_size = 131072", "aot.shapes[0].hidden_size", "hidden_size",
     "131072 is not a multiple of 16 from 16 to 65536", None),
    ("context_lengths = [40960, 32768, 40960]", "context_lengths = 40960", "aot.shapes[1].context_lengths",
     "context_lengths = 40960", "expected a list of integers, got integer", "max_position_embeddings"),
    ("context_lengths = [40960, 32768, 40960]", "context_lengths = []", "aot.shapes[1].context_lengths",
     "context_lengths = []", "must not be empty", "leave it out"),
    ("context_lengths = [40960, 32768, 40960]", "context_lengths = [40960, 8]", "aot.shapes[1].context_lengths[1]",
     "context_lengths = [40960, 8]", "8 is not from 16 to 16777216", None),
    ("context_lengths = [40960, 32768, 40960]", 'context_lengths = ["128k"]', "aot.shapes[1].context_lengths[0]",
     "context_lengths", "expected an integer, got string", None),
    ("context_lengths = [40960, 32768, 40960]", "context_length = [40960]", "aot.shapes[1].context_length",
     "context_length =", "unknown key 'context_length' in [aot.shapes[1]]", "did you mean 'context_lengths'?"),
    ("[aot]", "[aott]", "aott", "[aott]", "unknown key 'aott'", "did you mean 'aot'?"),
]


@pytest.mark.parametrize("old, new, key, line_snippet, message, hint", AOT_ERRORS,
                         ids=[f"{case[2]}-{index}" for index, case in enumerate(AOT_ERRORS)])
def test_errors_name_file_key_line_and_hint(old, new, key, line_snippet, message, hint):
    text = edit(old, new)
    if key.startswith("env."):  # the archs come from the env key, which names another GPU
        text = edit(ARCH_ENV, 'FLASHINFER_CUDA_ARCH_LIST = "12.0f sm_121a"', text)
    error = recipe_error(text)
    assert error.key == key
    assert error.line == line_of(text, line_snippet)
    assert message in str(error), str(error)
    assert str(error).startswith(f"{PATH}:{error.line}: [{key}] ")
    assert error.hint
    if hint:
        assert hint in error.hint, error.hint


@pytest.mark.parametrize("value, message", [
    ('""', "names no GPU target"),
    ('"   "', "names no GPU target"),
    ('"12.0f sm_12x"', "'sm_12x' is not a GPU target"),
    ('"12.0f 10.0a"', "'10.0a' is not one of the image's GPU targets"),
])
def test_errors_in_the_env_arch_list(value, message):
    text = edit(ARCH_ENV, f"FLASHINFER_CUDA_ARCH_LIST = {value}", HEAD) + MINIMAL_AOT
    error = recipe_error(text)
    assert (error.key, error.line) == ("env.FLASHINFER_CUDA_ARCH_LIST", line_of(text, "FLASHINFER_CUDA_ARCH_LIST"))
    assert message in error.reason and error.hint


@pytest.mark.parametrize("shapes, message, hint", [
    ("", "names no serving shape", "[[aot.shapes]] with name ="),
    ("shapes = []\n", "names no serving shape", "head_dim = 128"),
    ("shapes = 3\n", "expected a list of tables ([[aot.shapes]]), got integer", "[[aot.shapes]] with name ="),
    ('shapes = { name = "a" }\n', "expected a list of tables ([[aot.shapes]]), got table", None),
])
def test_shapes_are_required(shapes, message, hint):
    text = HEAD + "\n[aot]\n" + shapes
    error = recipe_error(text)
    assert (error.key, error.line) == ("aot.shapes", line_of(text, shapes.strip() or "[aot]"))
    assert message in str(error)
    assert hint is None or hint in error.hint


def test_a_shape_that_is_not_a_table():
    text = HEAD + "\n[aot]\nshapes = [1]\n"
    error = recipe_error(text)
    assert (error.key, error.line) == ("aot.shapes[0]", line_of(text, "shapes = [1]"))
    assert "expected a table, got integer" in str(error)


def test_aot_needs_cuda():
    text = edit("[cuda]\ntoolkit = \"13.0\"\narchs = [\"sm_120a\", \"12.0f\"]\nmin_driver = \"580.65.06\"\n", "")
    error = recipe_error(text)
    assert (error.key, error.line) == ("aot", line_of(text, "[aot]"))
    assert "prebuilt kernels without a [cuda] table" in str(error)
    assert "add [cuda]" in error.hint


def test_aot_and_platforms_are_not_supported_together():
    text = edit("[env]", "[platforms.amd64]\n\n[env]")
    error = recipe_error(text)
    assert (error.key, error.line) == ("aot", line_of(text, "[aot]"))
    assert "[aot] and [platforms] together are not supported yet" in str(error)
    assert error.hint.startswith("build one platform per recipe; prebuilt kernels for several platforms are not "
                                 "supported yet")


def test_aot_given_as_a_value():
    text = HEAD.replace("[image]", "aot = 3\n[image]")
    error = recipe_error(text)
    assert (error.key, error.line) == ("aot", 1)
    assert "[aot] expected a table, got integer" in str(error)


# --- properties: whatever [aot] holds, a Recipe or one RecipeError naming an [aot] key ------------

DOC = {
    "image": {"name": "a/b"},
    "base": {"debian": "bookworm"},
    "python": {"requirements": ["torch"]},
    "cuda": {"toolkit": "13.0", "archs": ["sm_120a", "12.0f"], "min_driver": "580.65.06"},
    "aot": {"archs": ["12.0f"], "sglang": True, "deep_gemm": "jit",
            "shapes": [{"name": "a", "head_dim": 128, "q_heads": 32, "kv_heads": 8, "tp": [1, 2],
                        "dtype": "bfloat16", "kv_dtype": "auto", "sliding_window": False,
                        "logits_soft_cap": False, "rope": "neox", "qk_norm": False, "hidden_size": 4096,
                        "prefix_cache": True, "sampling": True}]},
}
AOT_KEYS = ["archs", "sglang", "deep_gemm", "shapes", "arch", ""]
SHAPE_KEYS = list(DOC["aot"]["shapes"][0]) + ["context_lengths", "head_dims", "x"]
one = st.sampled_from
# Values near the rules' edges, alongside any TOML value.
NEAR_VALUES = one([0, 1, 3, 8, 15, 16, 32, 512, 528, 1024, 1025, 65536, -1, 2 ** 63 - 1, True, "8", "jit",
                   "disabled", "auto", "fp8_e5m2", "gptj", "none", "a", "A", [], [1], [0], [3], [1, 2, 2],
                   ["12.0f"], ["sm_90a"], ["sm_120a", "12.0a"], {}])
VALUES = NEAR_VALUES | ANY_VALUE


def parse_or_error(doc: dict, sections: bool, multiline: bool) -> Recipe | RecipeError:
    text = toml_document(doc, sections, multiline)
    try:
        recipe = parse(text)
    except RecipeError as error:
        assert error.key and (error.key.startswith("aot") or error.key == "env.FLASHINFER_CUDA_ARCH_LIST"), \
            str(error)
        assert error.line is not None and 1 <= error.line <= text.count("\n") + 1, str(error)
        assert error.hint, str(error)
        return error
    assert json.loads(json.dumps(recipe.aot.to_json())) == recipe.aot.to_json()
    return recipe


@PROPERTY
@given(one(AOT_KEYS), VALUES, st.booleans(), st.booleans())
def test_any_value_for_an_aot_key(key, value, sections, multiline):
    doc = copy.deepcopy(DOC)
    doc["aot"][key] = value
    result = parse_or_error(doc, sections, multiline)
    if isinstance(result, Recipe) and key == "sglang":
        assert result.aot.sglang is value


@PROPERTY
@given(one(SHAPE_KEYS), VALUES, st.booleans(), st.booleans())
def test_any_value_for_a_shape_key(key, value, sections, multiline):
    doc = copy.deepcopy(DOC)
    doc["aot"]["shapes"][0][key] = value
    parse_or_error(doc, sections, multiline)


@PROPERTY
@given(st.lists(st.dictionaries(one(SHAPE_KEYS), VALUES, max_size=8) | ANY_VALUE, max_size=3),
       st.booleans(), st.booleans())
def test_arbitrary_shapes_tables(shapes, sections, multiline):
    doc = copy.deepcopy(DOC)
    doc["aot"]["shapes"] = shapes
    parse_or_error(doc, sections, multiline)


@st.composite
def valid_shapes(draw) -> dict:
    kv_heads = draw(one([1, 2, 4, 8, 16]))
    q_heads = kv_heads * draw(one([1, 2, 4, 7, 8]))
    # A tp splits the query heads, and the KV heads evenly or in whole copies.
    sizes = [size for size in range(1, q_heads + 1) if q_heads % size == 0 and (size % kv_heads == 0 or
                                                                                kv_heads % size == 0)]
    shape = {"name": draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,62}", fullmatch=True)),
             "head_dim": 16 * draw(st.integers(1, 32)), "q_heads": q_heads, "kv_heads": kv_heads}
    optional = {"tp": st.lists(one(sizes), min_size=1, max_size=4), "dtype": one(DTYPES), "kv_dtype": one(KV_DTYPES),
                "rope": one(ROPE_STYLES), "hidden_size": st.integers(1, 4096).map(lambda n: 16 * n),
                "context_lengths": st.lists(st.integers(16, 1 << 24), min_size=1, max_size=4),
                **{name: st.booleans() for name in ("sliding_window", "logits_soft_cap", "qk_norm", "prefix_cache",
                                                    "sampling")}}
    for name in draw(st.lists(one(sorted(optional)), unique=True)):
        shape[name] = draw(optional[name])
    return shape


@PROPERTY
@given(st.lists(valid_shapes(), min_size=1, max_size=3, unique_by=lambda shape: shape["name"]),
       one(DEEP_GEMM_MODES), st.booleans(), st.booleans())
def test_valid_shapes_parse_to_what_they_say(shapes, deep_gemm, sections, multiline):
    doc = copy.deepcopy(DOC)
    doc["aot"] |= {"shapes": shapes, "deep_gemm": deep_gemm}
    recipe = parse_or_error(doc, sections, multiline)
    assert isinstance(recipe, Recipe), str(recipe)
    assert isinstance(recipe.aot, AotSpec) and recipe.aot.deep_gemm == deep_gemm
    for written, shape in zip(shapes, recipe.aot.to_json()["shapes"], strict=True):
        assert shape["tp"] == sorted(set(written.get("tp", [1])))
        assert shape.get("context_lengths") == (sorted(set(written["context_lengths"])) if "context_lengths" in written
                                                else None)
        listed = ("tp", "kv_dtype", "context_lengths")
        assert {name: shape[name] for name in written if name not in listed} \
            == {name: value for name, value in written.items() if name not in listed}
        assert shape["kv_dtype"] in (written.get("kv_dtype"), shape["dtype"])
