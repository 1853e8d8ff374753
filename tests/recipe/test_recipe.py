"""Recipe parsing: valid recipes become typed values; every bad input becomes one located RecipeError."""

from __future__ import annotations

import math
import re
import string
import tomllib
from datetime import date, datetime, time, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.errors import RecipeError
from imagebuild.recipe.cuda import Arch, CudaVersion
from imagebuild.recipe.model import DebianBase, ImageBase, Patch, Recipe, load_recipe, parse_recipe
from imagebuild.recipe.reader import dotted, locate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "recipes"
DIGEST = "sha256:" + "0123456789abcdef" * 4

# A valid recipe the error cases below each break in one place.
BASE = """\
[image]
name = "imagebuild/cuda-toolchain"
tag = "13.0"

[base]
debian = "bookworm"
packages = ["g++", "libc6-dev"]

[python]
requirements = [
    "cuda-toolkit[nvcc]==13.0.3.0",
    "sgl-deep-gemm==0.2.3.post2",
]
exclude = ["torch"]
exclude_newer = "2026-11-20T00:00:00Z"

[cuda]
toolkit = "13.0"
archs = ["sm_120a", "12.0f"]
min_driver = "580.65.06"

[[patches]]
package = "flashinfer-python"
file = "fix.patch"

[env]
CUDA_HOME = "/opt/cuda"
"""

IMAGE_BASE = f"""\
[base]
image = "registry.example:5000/library/debian@{DIGEST}"
python = "3.11"
glibc = "2.36"
"""


def write_recipe(folder: Path, text: str) -> Path:
    (folder / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    path = folder / "recipe.toml"
    path.write_text(text)
    return path


def recipe_error(folder: Path, text: str) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(folder, text))
    return caught.value


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def line_of(text: str, snippet: str) -> int:
    return next(number for number, line in enumerate(text.split("\n"), 1) if snippet in line)


# --- valid recipes -----------------------------------------------------------------------------

def test_full_debian_recipe():
    recipe = load_recipe(FIXTURES / "cuda-toolchain.toml")
    assert recipe.path == (FIXTURES / "cuda-toolchain.toml").absolute()
    assert recipe.stem == "cuda-toolchain"
    assert (recipe.name, recipe.tag) == ("imagebuild/cuda-toolchain", "13.0")
    assert recipe.base == DebianBase(suite="bookworm", packages=("g++", "libc6-dev"), arch="amd64")
    assert recipe.base.apt_suites == ("bookworm", "bookworm-updates", "bookworm-security")  # security fixes too
    python = recipe.python
    assert python.requirements == ("cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0", "sgl-deep-gemm==0.2.3.post2")
    assert python.constraints == ("nvidia-cuda-runtime==13.0.96",)
    assert python.exclude == ("torch", "triton")
    assert python.extra_index_urls == ("https://mirror.example/whl/cu130",)
    assert python.exclude_newer == "2026-11-20T00:00:00Z"  # a TOML datetime, written back as a string
    assert python.layers == {"framework": ("nvidia-*",), "kernels": ("sgl-deep-gemm", "flashinfer-*")}
    assert list(python.layers) == ["framework", "kernels"]
    assert recipe.cuda.toolkit == CudaVersion(13, 0)
    assert recipe.cuda.archs == (Arch(12, 0, "a"), Arch(12, 0, "f"))  # 12.0a repeats sm_120a
    assert recipe.cuda.min_driver == "580.65.06"
    assert recipe.patches == (
        Patch("flashinfer-python", FIXTURES.absolute() / "patches" / "flashinfer.patch", 1),
        Patch("sgl-deep-gemm", FIXTURES.absolute() / "patches" / "deep-gemm.patch", 0),
    )
    assert recipe.env["DG_JIT_USE_NVRTC"] == "0"
    assert recipe.labels == {"org.opencontainers.image.source": "https://example.invalid/imagebuild"}


def test_full_image_recipe():
    recipe = load_recipe(str(FIXTURES / "sglang-on-image.toml"))
    assert recipe.name == "registry.example:5000/ml/sglang"
    assert recipe.tag == "latest"
    assert recipe.base == ImageBase(ref=f"registry.example:5000/library/debian:bookworm@{DIGEST}",
                                    python="3.11", glibc="2.36", python_path="/usr/bin/python3")
    assert recipe.cuda is None
    assert recipe.python.exclude_newer == "2026-11-20"
    assert (recipe.patches, recipe.env, recipe.labels) == ((), {}, {})


def test_parse_recipe_resolves_patches_from_the_given_path(tmp_path):
    write_recipe(tmp_path, "")
    recipe = parse_recipe(BASE, tmp_path / "elsewhere.toml")
    assert recipe.path == tmp_path / "elsewhere.toml"
    assert recipe.patches[0].path == tmp_path / "fix.patch"


def test_quoted_dotted_and_inline_forms(tmp_path):
    text = f"""\
image.name = "a/b"
"base" = {{ image = "debian@{DIGEST}", python = "3.12", glibc = "2.41", python_path = "/opt/py/bin/python" }}
[python]
'requirements' = ["torch==2.14.1; python_version >= '3.11'"]
exclude_newer = 2026-11-20
[python.layers]
framework = ["torch", "nvidia-*"]
"""
    recipe = load_recipe(write_recipe(tmp_path, text))
    assert recipe.base.python_path == "/opt/py/bin/python"
    assert recipe.python.exclude_newer == "2026-11-20"
    assert recipe.python.layers == {"framework": ("torch", "nvidia-*")}


@pytest.mark.parametrize("value, stored", [
    ("2026-11-20T00:00:00Z", "2026-11-20T00:00:00Z"),
    ('"2026-11-20t01:02:03.5z"', "2026-11-20T01:02:03.5Z"),
    ('"2026-11-20 01:02:03+01:00"', "2026-11-20T01:02:03+01:00"),
    ("2026-11-20T01:02:03-05:00", "2026-11-20T01:02:03-05:00"),
    ("2026-11-20", "2026-11-20"),
])
def test_exclude_newer_is_a_stable_string(tmp_path, value, stored):
    text = edit('exclude_newer = "2026-11-20T00:00:00Z"', f"exclude_newer = {value}")
    assert load_recipe(write_recipe(tmp_path, text)).python.exclude_newer == stored


# --- errors in the recipe's keys: (old, new, key, line snippet, message part, hint part) --------

KEY_ERRORS = [
    ("requirements = [", "requirments = [", "python.requirments", "requirments",
     "unknown key 'requirments' in [python]", "did you mean 'requirements'?"),
    ("[python]", "[pyhton]", "pyhton", "[pyhton]", "unknown key 'pyhton'", "did you mean 'python'?"),
    ('archs = ["sm_120a", "12.0f"]', "archs = 5", "cuda.archs", "archs",
     "[cuda.archs] expected a list of strings, got integer", None),
    ('archs = ["sm_120a", "12.0f"]', 'archs = ["sm_120a", 120]', "cuda.archs[1]", "archs",
     "expected a string, got integer", None),
    ('archs = ["sm_120a", "12.0f"]', 'archs = ["sm_120x"]', "cuda.archs[0]", "archs",
     "'sm_120x' is not a GPU target", "sm_<major><minor>"),
    ('archs = ["sm_120a", "12.0f"]', "archs = []", "cuda.archs", "archs", "must not be empty", "e.g. archs ="),
    ('"sgl-deep-gemm==0.2.3.post2"', '"sgl-deep-gemm>=0.2,<"', "python.requirements[1]", "requirements",
     "'sgl-deep-gemm>=0.2,<' is not a PEP 508 requirement: Expected", "torch==2.14.1"),
    ('    "sgl-deep-gemm==0.2.3.post2",\n', '    "sgl-deep-gemm==0.2.3.post2",\n    "Cuda_Toolkit==13.0.2",\n',
     "python.requirements[2]", "requirements", "'cuda-toolkit' is already required by python.requirements[0]",
     "merge"),
    ('exclude = ["torch"]', 'exclude = ["torch", "SGL_deep.gemm"]', "python.exclude[1]", "exclude",
     "'sgl-deep-gemm' is excluded but python.requirements[1] requires it", None),
    ('exclude = ["torch"]', 'exclude = ["torch==2"]', "python.exclude[0]", "exclude",
     "'torch==2' is not a distribution name", None),
    ('exclude = ["torch"]', 'extra_index_urls = ["ftp://mirror/simple"]', "python.extra_index_urls[0]",
     "extra_index_urls", "is not an http(s) URL", None),
    ('"2026-11-20T00:00:00Z"', '"yesterday"', "python.exclude_newer", "exclude_newer",
     "'yesterday' is not an RFC 3339 timestamp", "2026-11-20T00:00:00Z"),
    ('"2026-11-20T00:00:00Z"', "2026-11-20T00:00:00", "python.exclude_newer", "exclude_newer",
     "a timestamp needs a UTC offset", None),
    ('"2026-11-20T00:00:00Z"', "true", "python.exclude_newer", "exclude_newer",
     "expected an RFC 3339 timestamp or a date, got boolean", None),
    ('exclude = ["torch"]', 'layers = { kernel = ["deep*"] }', "python.layers.kernel", "layers",
     "unknown layer 'kernel' in [python.layers]", "did you mean 'kernels'?"),
    ('toolkit = "13.0"', 'toolkit = "13.0.88"', "cuda.toolkit", "toolkit =",
     "'13.0.88' is not a CUDA major.minor", '"13.0"'),
    ('toolkit = "13.0"', "toolkit = 13.0", "cuda.toolkit", "toolkit =", "expected a string, got float", "quotes"),
    ('min_driver = "580.65.06"\n', "", "cuda.min_driver", "[cuda]", "missing required key min_driver",
     'add min_driver = "580.65.06"'),
    ('min_driver = "580.65.06"', 'min_driver = "580"', "cuda.min_driver", "min_driver",
     "'580' is not a Linux driver version", "nvidia-smi"),
    ('name = "imagebuild/cuda-toolchain"', 'name = "ImageBuild/CUDA"', "image.name", "name",
     "'ImageBuild/CUDA' is not a Docker repository name", "lowercase: 'imagebuild/cuda'"),
    ('name = "imagebuild/cuda-toolchain"', 'name = "imagebuild/cuda:13.0"', "image.name", "name",
     "is not a Docker repository name", "[image] tag"),
    ('tag = "13.0"', 'tag = ".13"', "image.tag", "tag", "'.13' is not a Docker tag", None),
    ('debian = "bookworm"', 'debian = "Bookworm"', "base.debian", "debian", "is not a Debian suite", None),
    ('["g++", "libc6-dev"]', '["g++", "libc6-dev=2.36"]', "base.packages[1]", "packages",
     "'libc6-dev=2.36' is not a Debian package name", "no version"),
    ('debian = "bookworm"', 'debian = "bookworm"\narch = "i386"', "base.arch", "arch",
     "'i386' is not a supported architecture", "amd64, arm64"),
    ('debian = "bookworm"', 'debian = "bookworm"\nsuites = ["bookworm", "trixie-security"]', "base.suites[1]",
     "suites", "'trixie-security' is not a suite of Debian bookworm", '"bookworm-security"'),
    ('debian = "bookworm"', 'debian = "bookworm"\nsuites = ["bookworm-updates"]', "base.suites", "suites",
     "names no bookworm suite itself", 'add "bookworm"'),
    ('debian = "bookworm"', 'debian = "bookworm"\ncomponents = ["main", "Non Free"]', "base.components[1]",
     "components", "'Non Free' is not a component name", None),
    ('debian = "bookworm"', 'debian = "bookworm"\nmirror = "mirror.invalid/debian"', "base.mirror", "mirror",
     "'mirror.invalid/debian' is not an http(s):// or file:// URL", "dists/ and pool/"),
    ('debian = "bookworm"', 'debian = "bookworm"\nsnapshot = 1', "base.snapshot", "snapshot",
     "expected a string, got integer", None),
    ('debian = "bookworm"', 'debian = "bookworm"\nkeyring = "keys/archive.gpg"', "base.keyring", "keyring",
     "does not exist", "relative to the recipe's folder"),
    ('debian = "bookworm"', 'debian = "bookworm"\nglibc = "2.36"', "base.glibc", "glibc",
     "glibc only applies to an image base", None),
    ('debian = "bookworm"', f'debian = "bookworm"\nimage = "debian@{DIGEST}"', "base", "[base]",
     "set debian or image, not both", None),
    ('debian = "bookworm"\npackages = ["g++", "libc6-dev"]', "", "base", "[base]", "missing debian or image",
     'debian = "bookworm"'),
    ('file = "fix.patch"', 'file = "patches/missing.patch"', "patches[0].file", "file",
     "patches/missing.patch does not exist", "relative to the recipe's folder"),
    ('file = "fix.patch"', 'file = "fix.patch"\nstrip = -1', "patches[0].strip", "strip", "must be 0 or more",
     None),
    ('file = "fix.patch"', 'file = "fix.patch"\nstrip = "1"', "patches[0].strip", "strip",
     "expected an integer, got string", None),
    ('file = "fix.patch"\n', 'file = "fix.patch"\n\n[[patches]]  # second\nfile = "fix.patch"\n',
     "patches[1].package", "# second", "missing required key package", None),
    ('file = "fix.patch"', 'file = "fix.patch"\npatch_level = 1', "patches[0].patch_level", "patch_level",
     "unknown key 'patch_level' in [patches[0]]", "known keys: package, file, strip"),
    ('CUDA_HOME = "/opt/cuda"', '1CUDA = "x"', "env.1CUDA", "1CUDA", "is not an environment variable name", None),
    ('CUDA_HOME = "/opt/cuda"', "CUDA_HOME = 1", "env.CUDA_HOME", "CUDA_HOME", "expected a string", "quotes"),
    ('CUDA_HOME = "/opt/cuda"', 'CUDA_HOME = "a\\u0000b"', "env.CUDA_HOME", "CUDA_HOME", "NUL", None),
    ('CUDA_HOME = "/opt/cuda"', 'CUDA_HOME = "x"\n[labels]\n"org.x" = true', 'labels."org.x"', "org.x",
     "expected a string, got boolean", None),
    ("[image]", 'dockerfile = "x"\n[image]', "dockerfile", "dockerfile", "unknown key 'dockerfile'",
     "known keys: image, base, python, cuda, patches, prune, env, labels"),
]


@pytest.mark.parametrize("old, new, key, line_snippet, message, hint", KEY_ERRORS,
                         ids=[case[2] for case in KEY_ERRORS])
def test_key_errors_name_file_key_line_and_hint(tmp_path, old, new, key, line_snippet, message, hint):
    text = edit(old, new)
    error = recipe_error(tmp_path, text)
    assert error.key == key
    assert error.line == line_of(text, line_snippet)
    assert message in str(error)
    assert str(error).startswith(f"{tmp_path / 'recipe.toml'}:{error.line}: [{key}] ")
    if hint:
        assert hint in error.hint
        assert f"\n  hint: {error.hint}" in str(error)


@pytest.mark.parametrize("base, key, line_snippet, message, hint", [
    (IMAGE_BASE.replace(f"@{DIGEST}", ":bookworm"), "base.image", "image =",
     "'registry.example:5000/library/debian:bookworm' is not pinned by digest",
     "'registry.example:5000/library/debian@sha256:<64 hex digits>'"),
    (IMAGE_BASE.replace(DIGEST, DIGEST.upper()), "base.image", "image =", "is not a sha256 digest", "lowercase"),
    (IMAGE_BASE.replace('python = "3.11"\n', ""), "base.python", "[base]", "missing required key python",
     'add python = "3.11"'),
    (IMAGE_BASE.replace('glibc = "2.36"', 'glibc = "2"'), "base.glibc", "glibc", "is not a glibc major.minor",
     "ldd --version"),
    (IMAGE_BASE + 'python_path = "python3"\n', "base.python_path", "python_path", "is not an absolute path", None),
    (IMAGE_BASE + "arch = \"arm64\"\n", "base.arch", "arch", "arch only applies to a debian base", None),
])
def test_image_base_errors(tmp_path, base, key, line_snippet, message, hint):
    text = edit('[base]\ndebian = "bookworm"\npackages = ["g++", "libc6-dev"]\n', base)
    error = recipe_error(tmp_path, text)
    assert (error.key, error.line) == (key, line_of(text, line_snippet))
    assert message in str(error)
    assert hint is None or hint in error.hint


def test_a_table_given_as_a_value(tmp_path):
    error = recipe_error(tmp_path, "env = 3\n" + BASE.split("[env]")[0])
    assert (error.key, error.line) == ("env", 1)
    assert "[env] expected a table, got integer" in str(error)


def test_missing_table_has_no_line(tmp_path):
    error = recipe_error(tmp_path, BASE.split("[python]")[0])
    assert (error.key, error.line) == ("python", None)
    assert "missing required table [python]" in str(error)
    assert "requirements" in error.hint


# --- errors in the file itself ------------------------------------------------------------------

def test_missing_file(tmp_path):
    error = recipe_error_from_path(tmp_path / "absent.toml")
    assert str(error) == f"{tmp_path / 'absent.toml'}: no such recipe file"


def test_directory(tmp_path):
    error = recipe_error_from_path(tmp_path)
    assert "is a directory" in str(error) and error.hint


def test_a_byte_order_mark_is_ignored(tmp_path):
    path = write_recipe(tmp_path, "")
    path.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    assert load_recipe(path).name == "imagebuild/cuda-toolchain"


def test_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_bytes(b'[image]\nname = "caf\xe9"\n')
    error = recipe_error_from_path(path)
    assert (error.line, error.column) == (2, 12)
    assert "not UTF-8 text (byte 0xe9)" in str(error)


def test_toml_syntax_error_has_line_and_column(tmp_path):
    text = edit('tag = "13.0"', 'tag = "13.0')
    error = recipe_error(tmp_path, text)
    # The key the broken line sets is named too, and the fix for this kind of syntax error.
    assert (error.line, error.column, error.key) == (3, 12, "image.tag")
    assert str(error).startswith(f"{tmp_path / 'recipe.toml'}:3:12: [image.tag] invalid TOML: ")
    assert error.hint.startswith("close the string's quote on the same line")


@pytest.mark.parametrize("text, message", [
    ("a = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ("a = " + "9" * 5000, "invalid TOML: Exceeds the limit"),
    ("a = 1\nb", "invalid TOML: Expected '='"),
    ("\ufeff" + BASE.replace("[cuda]", "[cuda]\n[cuda]"), "invalid TOML: Cannot declare"),
])
def test_hostile_documents(tmp_path, text, message):
    assert message in str(recipe_error(tmp_path, text))


def recipe_error_from_path(path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    return caught.value


# --- the key locator ---------------------------------------------------------------------------

LOCATOR_SOURCE = '''\
top = 1
[python]
requirements = [  # a comment with [brackets]
  "a", "fake = 1",
  [ "x" ],
]
notes = """
key = "inside a string"
[not.a.table]
"""
"odd.key" . 'inner' = 2
[[patches]]
file = "a"
[[patches]]
file = "b"
[patches.extra]
deep = 3
[ "python" . layers ]
kernels = []
'''


@pytest.mark.parametrize("key, line", [
    (("top",), 1),
    (("python",), 2),
    (("python", "requirements"), 3),
    (("python", "requirements", 1), 3),
    (("python", "fake"), 2),
    (("key",), None),
    (("not",), None),
    (("python", "odd.key", "inner"), 11),
    (("patches", 0, "file"), 13),
    (("patches", 1, "file"), 15),
    (("patches", 1, "package"), 14),
    (("patches", 1, "extra", "deep"), 17),
    (("python", "layers", "kernels"), 19),
    (("python", "layers", "framework"), 18),
    (("absent", "key"), None),
])
def test_locate(key, line):
    assert tomllib.loads(LOCATOR_SOURCE)["patches"][1]["extra"] == {"deep": 3}
    assert locate(LOCATOR_SOURCE, key) == line


def test_dotted_quotes_keys_that_are_not_bare():
    assert dotted(("patches", 0, "file")) == "patches[0].file"
    assert dotted(("labels", "org.x", "a b")) == 'labels."org.x"."a b"'


# --- properties: whatever the input, a Recipe or one RecipeError ----------------------------------

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("properties")
    (folder / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    return folder


def load_or_error(folder: Path, data: bytes) -> Recipe | RecipeError:
    path = folder / "recipe.toml"
    path.write_bytes(data)
    try:
        return load_recipe(path)
    except RecipeError as error:
        assert error.line is None or 1 <= error.line <= data.count(b"\n") + 1
        assert error.key is None or error.key.strip()
        return error


@PROPERTY
@given(st.binary(max_size=400))
def test_any_bytes_give_a_recipe_or_a_recipe_error(scratch, data):
    load_or_error(scratch, data)


@PROPERTY
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=400))
def test_any_text_gives_a_recipe_or_a_recipe_error(scratch, text):
    load_or_error(scratch, text.encode())


@PROPERTY
@given(st.lists(st.sampled_from(BASE.split("\n")), max_size=30))
def test_shuffled_recipe_lines_give_a_recipe_or_a_recipe_error(scratch, lines):
    load_or_error(scratch, "\n".join(lines).encode())


# Documents shaped like recipes: a valid one, then a few keys removed, added or given wrong values.
def choose(draw, options: dict) -> dict:
    """Some of the optional entries of `options` (name -> strategy)."""
    names = draw(st.lists(st.sampled_from(sorted(options)), unique=True)) if options else []
    return {name: draw(options[name]) for name in names}


one = st.sampled_from
NAMES = one(["image", "base", "python", "cuda", "patches", "env", "labels", "name", "debian", "requirements",
             "toolkit", "archs", "file", "strip", "kernels", "requirments", "x", "org.x", "a b", ""])
SCALARS = st.one_of(
    st.text(max_size=12), one(["a/b", "13.0", "sm_120a", "580.65.06", "torch==2.14.1", "bookworm", "fix.patch"]),
    st.integers(), st.integers(min_value=-(10 ** 40), max_value=10 ** 40), st.floats(), st.booleans(),
    st.dates(), st.datetimes(timezones=st.none() | st.just(timezone.utc)), st.times(),
)
ANY_VALUE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(NAMES | st.text(max_size=5), inner, max_size=3), max_leaves=8)


@st.composite
def valid_documents(draw) -> dict:
    doc = {"image": {"name": draw(one(["a/b", "registry.example:5000/x/y", "localhost/z"]))}
           | choose(draw, {"tag": one(["latest", "13.0"])})}
    if draw(st.booleans()):
        doc["base"] = {"debian": "bookworm"} | choose(draw, {"packages": one([["g++"], [], ["a0", "a0"]]),
                                                             "arch": one(["amd64", "arm64"]),
                                                             "suites": one([["bookworm"], ["bookworm", "bookworm-security"]]),
                                                             "components": one([["main"], ["main", "contrib"]]),
                                                             "mirror": one(["http://m.example/debian/", "file:///srv/d"]),
                                                             "snapshot": one(["https://s.example/archive"])})
    else:
        doc["base"] = {"image": f"debian@{DIGEST}", "python": "3.11", "glibc": "2.36"} \
            | choose(draw, {"python_path": st.just("/usr/bin/python3")})
    doc["python"] = {"requirements": draw(one([["torch==2.14.1"], ["a", "b>=1; python_version > '3'"]]))} \
        | choose(draw, {"constraints": one([["c<2"], []]), "exclude": one([["d"], []]),
                        "extra_index_urls": one([["https://x.example/simple"]]),
                        "exclude_newer": one(["2026-11-20", date(2026, 11, 20),
                                              datetime(2026, 11, 20, tzinfo=timezone.utc)]),
                        "layers": one([{"kernels": ["k*"]}, {}])})
    if draw(st.booleans()):
        doc["cuda"] = {"toolkit": "13.0", "archs": draw(one([["sm_120a", "12.0f"], ["9.0a"]])),
                       "min_driver": "580.65.06"}
    patch = {"package": "p", "file": "fix.patch"} | choose(draw, {"strip": one([0, 1])})
    doc |= choose(draw, {"patches": st.lists(st.just(patch), max_size=2), "env": one([{"A": "1"}, {}]),
                         "labels": one([{"org.x": "y"}])})
    return doc


@st.composite
def broken_documents(draw) -> dict:
    """A valid document with up to three tables or keys removed, added, or given any value."""
    doc = draw(valid_documents())
    for _ in range(draw(st.integers(0, 3))):
        path = [draw(one(sorted(doc)))] if doc else []
        table = doc
        while path and isinstance(table.get(path[-1]), dict) and table[path[-1]] and draw(st.booleans()):
            table = table[path[-1]]
            path.append(draw(one(sorted(table))))
        change = draw(one(["remove", "add", "replace"]))
        if change == "remove" and path:
            del table[path[-1]]
        elif change == "add":
            table[draw(NAMES)] = draw(ANY_VALUE)
        elif path:
            table[path[-1]] = draw(ANY_VALUE)
    return doc


def toml_value(value, multiline: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else {math.inf: "inf", -math.inf: "-inf"}.get(value, repr(value))
    if isinstance(value, (int, date, time)):  # datetime is a date
        return value.isoformat() if not isinstance(value, int) else str(value)
    if isinstance(value, list):
        items = [toml_value(item) for item in value]
        return "[\n" + "".join(f"  {item},\n" for item in items) + "]" if multiline else f"[{', '.join(items)}]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_string(text: str) -> str:
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or c in '\x7f"\\' else c for c in text)
    return f'"{escaped}"'


def toml_key(key: str) -> str:
    bare = key and all(c in string.ascii_letters + string.digits + "_-" for c in key)
    return key if bare else toml_string(key)


def toml_document(doc: dict, sections: bool, multiline: bool) -> str:
    """A tiny TOML writer: top-level tables as [sections] or inline, arrays one item a line or not."""
    def is_section(value) -> bool:
        return sections and (isinstance(value, dict) or isinstance(value, list) and bool(value)
                             and all(isinstance(item, dict) for item in value))

    lines = [f"{toml_key(k)} = {toml_value(v, multiline)}" for k, v in doc.items() if not is_section(v)]
    for name, value in doc.items():
        if is_section(value):
            for table in [value] if isinstance(value, dict) else value:
                lines += ["", f"[{toml_key(name)}]" if isinstance(value, dict) else f"[[{toml_key(name)}]]"]
                lines += [f"{toml_key(k)} = {toml_value(v, multiline)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


@PROPERTY
@given(valid_documents(), st.booleans(), st.booleans())
def test_valid_documents_load_in_any_layout(scratch, doc, sections, multiline):
    recipe = load_or_error(scratch, toml_document(doc, sections, multiline).encode())
    assert isinstance(recipe, Recipe), str(recipe)
    assert recipe.name == doc["image"]["name"]
    assert recipe.python.requirements == tuple(doc["python"]["requirements"])
    assert isinstance(recipe.base, DebianBase) == ("debian" in doc["base"])
    assert (recipe.cuda is None) == ("cuda" not in doc)
    assert len(recipe.patches) == len(doc.get("patches", []))


@PROPERTY
@given(broken_documents(), st.booleans(), st.booleans())
def test_broken_documents_give_one_recipe_error_at_a_line_naming_its_key(scratch, doc, sections, multiline):
    text = toml_document(doc, sections, multiline)
    result = load_or_error(scratch, text.encode())
    if isinstance(result, Recipe):
        return
    assert result.key and "invalid TOML" not in result.reason  # the writer above writes valid TOML
    parts = [part for part in re.split(r"[.\[\]]", result.key) if part]
    if result.line is not None and all(char.isprintable() and char != "\\" for char in result.key):
        line = text.split("\n")[result.line - 1]
        assert any(part in line or part.strip('"') in line for part in parts), (str(result), text)
