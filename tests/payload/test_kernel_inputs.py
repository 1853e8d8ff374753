"""What a FlashInfer module's compile reads (payload/probe/kernels/kernel_inputs.py), and its kernel cache key.

On real releases: flashinfer-python 0.7.1 (previous), 0.7.2 (pinned by lockfiles/sglang-blackwell.lock) and 0.7.4
(newest), each in a venv of its own with a CPU torch and the pip CUDA toolchain, its modules planned for the flagship's
[aot] shapes by the kernel step's own code (no compile). Then, in the venv: a header edit, a patch applied by the
image's patcher, a torch header and unrelated files, each with the hit or miss a build must see. Unit cases and
hypothesis over the scanner's inputs (file bytes, build.ninja text) without FlashInfer.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.lock.resolve import uv_binary
from imagebuild.payload import apply_patch
from imagebuild.payload.probe.kernels import kernel_inputs
from imagebuild.recipe.model import load_recipe
from tests.conftest import missing_tool

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "imagebuild" / "payload" / "probe"
# The [aot] step runs kernels_aot.py beside the kernel modules and waste.py: both folders, as one search path.
AOT_PATH = os.pathsep.join([str(PROBE / "kernels"), str(PROBE)])
RELEASES = ("0.7.1", "0.7.2", "0.7.4")
CPU_TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
# What importing FlashInfer and planning its modules needs besides torch (flashinfer-python goes in with --no-deps:
# its own requirements name the CUDA torch and cuDNN, GBs no plan reads), pinned: the same bytes every run.
STACK = ("apache-tvm-ffi==0.1.15.post2", "numpy==2.4.6", "jinja2==3.1.6", "einops==0.8.2", "click==8.5.1",
         "tqdm==4.70.1", "requests==2.34.2", "tabulate==0.10.0", "ninja==1.13.2", "nvidia-ml-py==13.615.71",
         "packaging==26.4", "filelock==4.3.2", "typing-extensions==4.16.0", "sympy==1.14.0", "networkx==3.6.1",
         "fsspec==2026.9.0", "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0")
KEYS = r"""
import json, os, sys
sys.path[:0] = sys.argv[1].split(os.pathsep)
import kernels_aot, kernel_inputs
from flashinfer.jit import env
spec = json.loads(sys.argv[2])
planned = kernels_aot.flashinfer_modules(spec["shapes"], spec["archs"], dry=True)
generated = str(getattr(env, "FLASHINFER_GEN_SRC_DIR", env.FLASHINFER_WORKSPACE_DIR))
for line in sys.stdin:
    keys = {name: kernel_inputs.flashinfer_key(e["spec"], {"build-wide": "fixed"}, generated) for name, e in planned.items()}
    search = sorted({d for e in planned.values() for d in kernel_inputs.module_inputs(
        open(e["spec"].ninja_path).read(), [])["search"][1]}) if line.strip() == "search" else []
    print(json.dumps({"keys": keys, "search": search}), flush=True)
"""


class Keyer:
    """A process of the venv's interpreter that plans the flagship's modules once and prints their keys on each
    request, as the kernel step computes them (its per-process file memo included)."""

    def __init__(self, python: Path, workspace: Path, cuda_home: Path):
        spec = load_recipe(REPO / "recipes" / "sglang-blackwell.toml").aot.to_json()
        spec["sglang"] = False
        env = dict(os.environ, CUDA_HOME=str(cuda_home), FLASHINFER_WORKSPACE_BASE=str(workspace),
                   FLASHINFER_CUDA_ARCH_LIST="12.0f", PYTHONDONTWRITEBYTECODE="1")
        self.process = subprocess.Popen([str(python), "-c", KEYS, AOT_PATH, json.dumps(spec)], env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __call__(self, request: str = "keys") -> dict:
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, self.process.stderr.read()[-3000:]
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module", params=RELEASES)
def release(request, tmp_path_factory):
    if not CPU_TORCH_WHEEL.is_file():
        missing_tool(str(CPU_TORCH_WHEEL))  # PyPI has no CPU-only torch; PyTorch's own index is not reachable here
    root = tmp_path_factory.mktemp(f"flashinfer-{request.param}")
    python = root / "venv" / "bin" / "python"
    # Hard links into uv's cache (seconds, not a GB copied per release): every edit below replaces a file through a
    # rename (put; apply_patch does the same), which breaks the link and leaves uv's cache as it was.
    env = dict(os.environ, UV_NO_PROGRESS="1", UV_LINK_MODE="hardlink")
    for args in (["venv", "-q", "--python", sys.executable, str(root / "venv")],
                 ["pip", "install", "-q", "--no-config", "--python", str(python), *STACK],
                 ["pip", "install", "-q", "--no-config", "--no-deps", "--python", str(python),
                  f"flashinfer-python=={request.param}", str(CPU_TORCH_WHEEL)]):
        done = subprocess.run([uv_binary(), *args], capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    keyer = Keyer(python, root / "workspace", site / "nvidia" / "cu13")
    yield request.param, site, keyer
    keyer.close()
    shutil.rmtree(root, ignore_errors=True)


def moved(before: dict, after: dict) -> list:
    return sorted(name for name in before if before[name] != after[name])


def short(name: str) -> str:
    return name.split("_dtype_q_")[0] + ("(fp8 kv)" if "dtype_kv_e4m3" in name else "")


def test_each_release_plans_the_flagships_modules_and_keys_them_the_same_twice(release):
    version, _, keys = release
    first = keys()
    assert sorted(map(short, first["keys"])) == ["batch_prefill_with_kv_cache", "batch_prefill_with_kv_cache(fp8 kv)",
                                                 "cascade", "sampling"], version
    assert all(len(key) == 64 for key in first["keys"].values())
    assert keys() == first


BACKENDS = r"""
import json, os, sys
sys.path[:0] = sys.argv[1].split(os.pathsep)
import kernels_aot
shape = {"dtype": "bfloat16", "kv_dtype": "fp8_e4m3", "head_dim": 128, "sliding_window": False, "logits_soft_cap": False}
cases = {"hopper": ["9.0a"], "sm120": ["12.0f"], "both": ["9.0a", "12.0f"]}
answer = {name: kernels_aot.ragged_backends(shape, archs) for name, archs in cases.items()}
answer["hopper, head dim 96"] = kernels_aot.ragged_backends(dict(shape, head_dim=96), ["9.0a"])
print(json.dumps(answer))
"""


def test_ragged_prefill_is_built_on_the_backend_sglang_gets_on_each_arch(release):
    """SGLang's ragged wrapper asks for "auto": FA3 on sm_90a where the installed FlashInfer's own FA3 rules take
    the dtypes and head dim (FA3 prefill has no head dim 96: the control), FA2 elsewhere; the H200 run proved the
    FA3 module is what a Hopper server loads (docs/zero-jit.md, "On a GPU")."""
    version, site, _ = release
    python = site.parents[2] / "bin" / "python"
    done = subprocess.run([str(python), "-c", BACKENDS, AOT_PATH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"hopper": ["fa3"], "sm120": ["fa2"], "both": ["fa2", "fa3"],
                                                        "hopper, head dim 96": ["fa2"]}, version


def put(path: Path, data: bytes) -> None:
    """Write through a temporary name and a rename: an installed file is a hard link into uv's cache."""
    temporary = path.with_name(path.name + ".imagebuild-test")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def edit(path: Path, old: bytes, new: bytes) -> bytes:
    before = path.read_bytes()
    assert old in before, f"{path} no longer holds {old!r}"
    put(path, before.replace(old, new, 1))
    return before


def test_a_header_edit_moves_exactly_the_modules_that_include_it(release):
    """The issue's case: a sampling.cuh edit recompiles sampling and reuses cascade and the prefill modules."""
    version, site, keys = release
    before = keys()["keys"]
    header = site / "flashinfer" / "data" / "include" / "flashinfer" / "sampling.cuh"
    original = edit(header, b"#include", b"// one line changed by a recipe's patch\n#include")
    try:
        assert [short(n) for n in moved(before, keys()["keys"])] == ["sampling"], version
    finally:
        put(header, original)
    assert keys()["keys"] == before  # the same bytes again: every module hits
    # A header every module reads moves every module: the control that the keys can all move.
    shared = site / "flashinfer" / "data" / "include" / "flashinfer" / "utils.cuh"
    original = edit(shared, b"#include", b"// changed\n#include")
    try:
        assert moved(before, keys()["keys"]) == sorted(before), version
    finally:
        put(shared, original)


def test_a_recipe_patch_applied_as_the_image_applies_it_moves_only_what_reads_the_patched_file(release, tmp_path):
    version, site, keys = release
    before = keys()["keys"]
    relative = "flashinfer/data/include/flashinfer/sampling.cuh"
    old = (site / relative).read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(old) if "BlockScanAlgorithm" in line or "BLOCK_SCAN" in line)
    new = old[:at] + [old[at].replace("WARP_SCANS", "RAKING") if "WARP_SCANS" in old[at] else "// patched\n" + old[at]] \
        + old[at + 1:]
    patch = tmp_path / "sampling-raking.patch"
    patch.write_text("".join(difflib.unified_diff(old, new, f"a/{relative}", f"b/{relative}")))
    backup = (site / relative).read_bytes()
    done = subprocess.run([sys.executable, apply_patch.__file__, "--strip", "1", "--package", "flashinfer-python",
                           "--sha256", hashlib.sha256(patch.read_bytes()).hexdigest(), str(site), str(patch)],
                          capture_output=True, text=True)
    try:
        assert done.returncode == 0, done.stderr
        assert (site / relative).read_bytes() != backup
        assert [short(n) for n in moved(before, keys()["keys"])] == ["sampling"], version
    finally:
        put(site / relative, backup)


def test_a_torch_header_moves_nothing_since_no_flagship_module_searches_torchs_headers(release):
    """FlashInfer 0.7 compiles its modules against TVM-FFI, not torch: no build.ninja names torch's include folder
    (asserted), so an edit there moves no key; the header edit above is this case's control."""
    version, site, keys = release
    state = keys("search")
    assert not [d for d in state["search"] if "/torch/" in d + "/"], state["search"]
    assert any(d.endswith("tvm_ffi/include") for d in state["search"]), state["search"]
    header = site / "torch" / "include" / "ATen" / "ATen.h"
    original = edit(header, b"#pragma once", b"#pragma once\n// changed")
    try:
        assert moved(state["keys"], keys()["keys"]) == [], version
    finally:
        put(header, original)


def test_unrelated_files_move_nothing(release):
    version, site, keys = release
    before = keys()["keys"]
    unrelated = [site / "flashinfer" / "data" / "include" / "flashinfer" / "imagebuild_unrelated.cuh",
                 site / "flashinfer" / "imagebuild_unrelated.py", site / "nvidia" / "cu13" / "include" / "unrelated.h"]
    try:
        for path in unrelated:
            path.write_text("// nothing includes this\n")
        put(site / "flashinfer" / "__init__.py", (site / "flashinfer" / "__init__.py").read_bytes() + b"\n")
        assert moved(before, keys()["keys"]) == [], version
    finally:
        for path in unrelated:
            path.unlink(missing_ok=True)
        init = site / "flashinfer" / "__init__.py"
        put(init, init.read_bytes()[:-1])
    assert keys()["keys"] == before


# --- the scanner, on files of the test's own -----------------------------------------------------------------

NINJA = """ninja_required_version = 1.3
cuda_home = {home}
common_cflags = -I{top}/first $
    -isystem $cuda_home/include $
    -isystem {top}/second
cuda_cflags = $common_cflags -O3
ldflags = -shared -L{top}/lib -lthing -lmissing
rule cuda_compile
  command = nvcc $cuda_cflags -c $in -o $out
build {top}/out/a.o: cuda_compile {top}/src/a.cu
build {top}/out/m.so: link {top}/out/a.o
"""


def tree(top: Path, files: dict) -> None:
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)


def inputs(top: Path) -> dict:
    return kernel_inputs.module_inputs(NINJA.format(top=top, home=top / "cuda"), [])


def test_the_scanner_follows_includes_in_the_compilers_order(tmp_path):
    tree(tmp_path, {"src/a.cu": '#include "local.h"\n#include <lib.h>\n#include <absent.h>\n'
                                '#if __has_include(<maybe.h>)\n#endif\n',
                    "src/local.h": "#pragma once\n", "first/lib.h": "#include_next <lib.h>\n",
                    "second/lib.h": "// shadowed by first/, reached by include_next\n",
                    "second/unused.h": "// nothing includes it\n", "cuda/include/cuda_runtime.h": "#include <crt.h>\n",
                    "cuda/include/crt.h": "\n", "lib/libthing.so": "ELF"})
    found = inputs(tmp_path)
    files = {os.path.relpath(path, tmp_path) for path, _ in found["files"]}
    assert files == {"src/a.cu", "src/local.h", "first/lib.h", "second/lib.h", "cuda/include/cuda_runtime.h",
                     "cuda/include/crt.h"}
    assert ("<", "absent.h") in [tuple(u) for u in found["unresolved"]]
    assert ("<", "maybe.h") in [tuple(u) for u in found["unresolved"]]
    assert [(n, p is not None) for n, p, _ in found["libraries"]] == [("thing", True), ("missing", False)]
    # A file where a searched name would be found changes what is read: the inputs move.
    tree(tmp_path, {"second/maybe.h": "\n"})
    assert inputs(tmp_path) != found
    # An edit to a file nothing includes does not.
    again = inputs(tmp_path)
    (tmp_path / "second" / "unused.h").write_text("// edited\n")
    assert inputs(tmp_path) == again


def test_a_macro_include_takes_its_include_folder_whole(tmp_path):
    tree(tmp_path, {"src/a.cu": "#include <sys/tag.h>\n", "second/sys/tag.h": "#include SYSTEM_HEADER\n",
                    "second/sys/cuda/policy.h": "// named only by a macro\n", "first/other.h": "\n"})
    found = inputs(tmp_path)
    files = {os.path.relpath(path, tmp_path) for path, _ in found["files"]}
    assert "second/sys/cuda/policy.h" in files and "first/other.h" not in files
    assert [os.path.relpath(p, tmp_path) for p in found["macro_includes"]] == ["second/sys/tag.h"]


@given(st.binary(max_size=400) | st.text(max_size=400).map(lambda t: ("#include " + t).encode(errors="surrogatepass")
                                                              if "\ud800" not in t else b""))
def test_any_file_bytes_parse_to_includes_or_nothing(data):
    for directive, quote, name in kernel_inputs.parse_includes(data):
        assert directive in ("include", "include_next", "import") and quote in "<\"" and isinstance(name, str)


@given(st.text(max_size=600))
def test_any_build_ninja_text_reads_to_flags_and_libraries_without_a_traceback(text):
    variables, builds = kernel_inputs.ninja_variables(text)
    kernel_inputs.search_paths(kernel_inputs.compile_flags(variables))
    kernel_inputs.link_inputs(variables)
    assert all(isinstance(value, str) for value in variables.values())
    found = kernel_inputs.module_inputs(text, [])
    assert all(isinstance(path, str) for path, _ in found["files"])


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["a.h", "b.h", "c.h", "d/e.h"]),
                       st.lists(st.sampled_from(["a.h", "b.h", "c.h", "d/e.h", "x.h"]), max_size=4), min_size=1))
def test_the_closure_is_what_is_reachable_from_the_roots(tmp_path_factory, graph):
    """Against a reference: the files reachable by following the graph from a.cu, and only those."""
    top = tmp_path_factory.mktemp("graph")
    tree(top, {"src/a.cu": "#include <a.h>\n"})
    for name, includes in graph.items():
        tree(top, {f"second/{name}": "".join(f"#include <{i}>\n" for i in includes)})
    reachable, pending = set(), ["a.h"]
    while pending:
        name = pending.pop()
        if name in graph and name not in reachable:
            reachable.add(name)
            pending += graph[name]
    files = {os.path.relpath(p, top / "second") for p, _ in inputs(top)["files"] if p.startswith(str(top / "second"))}
    assert files == reachable
