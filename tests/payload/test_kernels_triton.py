"""Triton's forward kernels seeded into its cache without a GPU (payload/probe/kernels/kernels_triton.py), and the
zero-JIT verdict on them.

On real releases, no GPU: Triton 3.7.1 (previous), 3.8.0 (pinned by lockfiles/sglang-blackwell.lock) and 3.9.0
(newest), each in a venv of its own with a CPU torch, compile SGLang's own kernel source (its `position.py` from the
0.5.22 and 0.5.23 wheels, the newest) for sm_120 and sm_90 through the stand-in driver, as the [aot] step runs it;
then a process of its own launches them again and Triton itself says each came from its cache, while a target no
arch declares compiles. Controls: a removed cache entry compiles again and the verdict names it; an SGLang without
the op fails the seed naming it. The verdict on recorded answers (each way it can fail) and hypothesis over what
the proof's child may answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.lock.resolve import uv_binary
from imagebuild.payload.probe.checks import zero_jit
from imagebuild.payload.probe.kernels import kernels_triton
from tests.conftest import missing_tool
from tests.json_fuzz import json_values
from tests.releases import published_file

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "imagebuild" / "payload" / "probe" / "kernels"
TRITON_RELEASES = ("3.7.1", "3.8.0", "3.9.0")
PINNED_TRITON = "3.8.0"
SGLANG_RELEASES = ("0.5.22", "0.5.23")
PINNED_SGLANG = "0.5.23"
CPU_TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
TORCH_NEEDS = ("filelock==3.20.0", "typing-extensions==4.15.0", "sympy==1.14.0", "mpmath==1.3.0", "networkx==3.5",
               "jinja2==3.1.6", "markupsafe==3.0.3", "fsspec==2025.9.0")  # torch's own requirements, pinned
# The op's module and the packages above it, as the wheel lays them out; the packages' own __init__ files import
# SGLang's server (its dependencies are GBs no kernel reads), so they are written empty.
# The op modules the launches import: the position op, and the KV-index kernel wherever the release keeps it.
# The logits processor is only read (which cast it makes), never imported.
OPS = ("sglang/kernels/ops/attention/position.py", "sglang/kernels/ops/attention/kv_indices.py",
       "sglang/kernels/ops/kvcache/kv_indices.py", "sglang/kernels/ops/memory/common.py",
       "sglang/kernels/ops/activation/softcap.py", "sglang/srt/layers/logits_processor.py")
# In the seed's order: per launch, then per variant (KV indices: int64 then int32 lengths; the token-table writer:
# one per context length, shortest first; the logits cast: rows x vocabulary a multiple of 16, then not). SGLang
# 0.5.22 copies its logits with torch: no cast to seed.
VARIANTS = ("compute_position_kernel", "create_flashinfer_kv_indices_triton", "create_flashinfer_kv_indices_triton",
            "write_req_to_token_pool_triton", "write_req_to_token_pool_triton", "softcap_inplace_logits_kernel",
            "softcap_inplace_logits_kernel")
RELEASE_VARIANTS = {"0.5.22": VARIANTS[:5], "0.5.23": VARIANTS}
LOGITS_CAST = {"0.5.22": "torch (nothing to seed)", "0.5.23": "triton"}
# Llama 3.1 8B's and Qwen3-8B's context lengths; the second shape's is the first's second: one kernel, listed once.
SPEC = {"archs": ["12.0f", "9.0a"], "sglang": True,
        "shapes": [{"name": "llama-3.1-8b", "dtype": "bfloat16", "context_lengths": [40960, 131072]},
                   {"name": "qwen3-8b", "dtype": "bfloat16", "context_lengths": [40960]}]}


_VENVS: dict = {}


def triton_venv(version: str, tmp_path_factory) -> Path:
    """A venv holding Triton `version` and a CPU torch (made once per run)."""
    if version in _VENVS:
        return _VENVS[version]
    if not CPU_TORCH_WHEEL.is_file():
        missing_tool(str(CPU_TORCH_WHEEL))  # PyPI has no CPU-only torch; PyTorch's own index is not reachable here
    root = tmp_path_factory.mktemp(f"triton-{version}")
    python = root / "venv" / "bin" / "python"
    env = dict(os.environ, UV_NO_PROGRESS="1", UV_LINK_MODE="hardlink")  # nothing below edits an installed file
    for args in (["venv", "-q", "--python", sys.executable, str(root / "venv")],
                 ["pip", "install", "-q", "--no-config", "--no-deps", "--python", str(python),
                  f"triton=={version}", str(CPU_TORCH_WHEEL), *TORCH_NEEDS]):
        done = subprocess.run([uv_binary(), *args], capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
    _VENVS[version] = python
    return python


@pytest.fixture(scope="module", params=TRITON_RELEASES)
def triton_python(request, tmp_path_factory):
    return request.param, triton_venv(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def pinned_python(tmp_path_factory):
    return triton_venv(PINNED_TRITON, tmp_path_factory)


def sglang_source(folder: Path, version: str, with_op: bool = True) -> Path:
    """SGLang `version`'s op modules from its wheel under folder, their packages' __init__ files empty
    (without_op: the first left out)."""
    with zipfile.ZipFile(published_file("sglang", version)) as wheel:
        sources = {op: wheel.read(op) for op in OPS if op in wheel.namelist()}
    assert len(sources) == 5, f"sglang {version} keeps its ops elsewhere: {sorted(sources)}"
    for op in sources:
        parts = Path(op).parent.parts
        for depth in range(1, len(parts) + 1):
            (folder.joinpath(*parts[:depth])).mkdir(parents=True, exist_ok=True)
            (folder.joinpath(*parts[:depth]) / "__init__.py").write_text("")
    for op, source in sources.items():
        if with_op or op != OPS[0]:
            (folder / op).write_bytes(source)
    return folder


def run_step(python: Path, sglang: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """kernels_triton.py as the [aot] step runs it: a script beside kernels_moe.py, the image's TRITON_CACHE_DIR."""
    env = dict(os.environ, PYTHONPATH=str(sglang), TRITON_CACHE_DIR=str(cache), HOME=str(cache.parent))
    return subprocess.run([str(python), "-B", str(KERNELS / "kernels_triton.py"), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def seed(python: Path, sglang: Path, tmp_path: Path, cache: Path, spec: dict = SPEC) -> dict:
    (tmp_path / "aot.json").write_text(json.dumps(spec))
    seeded = run_step(python, sglang, cache, "seed", str(tmp_path / "aot.json"))
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    manifest = {"triton": json.loads(seeded.stdout)}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def seed_and_prove(python: Path, sglang: Path, tmp_path: Path, cache: Path, spec: dict = SPEC) -> tuple:
    seed(python, sglang, tmp_path, cache, spec)
    spec, manifest = tmp_path / "aot.json", tmp_path / "manifest.json"
    proved = run_step(python, sglang, cache, "prove", str(spec), str(manifest))
    assert proved.returncode == 0, proved.stderr[-3000:]
    return json.loads(manifest.read_text()), json.loads(proved.stdout)


def test_each_triton_release_serves_the_seeded_kernel_from_its_cache_and_compiles_an_undeclared_target(
        triton_python, tmp_path):
    version, python = triton_python
    sglang = sglang_source(tmp_path / "src", PINNED_SGLANG)
    # two targets with the pinned release (one process each), the flagship's one with the others (each child
    # process imports torch: seconds on two cores)
    spec = SPEC if version == PINNED_TRITON else dict(SPEC, archs=["12.0f"])
    targets = [90, 120] if version == PINNED_TRITON else [120]
    manifest, proof = seed_and_prove(python, sglang, tmp_path, tmp_path / "cache", spec)
    kernels = manifest["triton"]["kernels"]
    # per target: the position kernel, the KV-index kernel twice (int64 lengths as in capture and decode, int32 as
    # at a prefill), the token-table writer per context length and the logits cast twice
    assert sorted((k["kernel"], k["target"]) for k in kernels) == sorted(
        (name, t) for t in targets for name in VARIANTS)
    assert all(k["files"] and any(name.endswith(".cubin") for name in k["files"]) for k in kernels), kernels
    # two shapes, one kernel: the second shape's launch finds the first's compile and lists nothing new
    assert {k["shape"] for k in kernels} == {"llama-3.1-8b"}
    served = sorted((e["kernel"], e["target"], e["hit"]) for e in proof["served"])
    assert served == sorted((name, t, True) for t in targets for name in VARIANTS), proof
    assert proof["control"] == {"launch": "compute-position", "target": 80, "error": None, "missed": True,
                                "kernels": ["compute_position_kernel"]}
    assert proof["unlaunched"] == [] and proof["rekeyed"] == []
    assert zero_jit.triton_problems({"triton": proof}, manifest) == [] and zero_jit.triton_file_problems(manifest["triton"]) == []
    print(f"triton {version}: seeded {len(kernels)} kernels, served {sorted(served)}")

    # control: the sm_120 entry gone, the next launch compiles it again, and the verdict says so by name
    sm120 = next(k for k in kernels if k["target"] == 120 and k["kernel"] == "compute_position_kernel")
    shutil.rmtree(sm120["folder"])
    assert "is missing" in " ".join(zero_jit.triton_file_problems(manifest["triton"]))
    again = run_step(python, sglang, tmp_path / "cache", "prove", str(tmp_path / "aot.json"),
                     str(tmp_path / "manifest.json"))
    problems = zero_jit.triton_problems({"triton": json.loads(again.stdout)}, manifest)
    assert problems == ["Triton compiled at first use what the seed should have served: compute_position_kernel sm_120"]


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_each_sglang_release_s_op_seeds_the_same_way_and_twice_to_the_same_bytes(version, pinned_python, tmp_path):
    python = pinned_python
    sglang = sglang_source(tmp_path / "src", version)
    spec = dict(SPEC, archs=["12.0f"])
    first = seed(python, sglang, tmp_path, tmp_path / "cache", spec)
    shutil.move(tmp_path / "cache", tmp_path / "first")
    second = seed(python, sglang, tmp_path, tmp_path / "cache", spec)
    assert first == second  # same keys, same folders, same sha256 of every file: the layer repeats
    assert [(k["kernel"], k["target"], len(k["files"])) for k in first["triton"]["kernels"]] == [
        (name, 120, 8) for name in RELEASE_VARIANTS[version]]
    assert first["triton"]["logits_cast"] == LOGITS_CAST[version]


SERVER_BATCHES = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import kernels_triton
events, _ = kernels_triton.compiling_for(120)
from sglang.kernels.ops.activation.softcap import cast_to_float32_logits
asked = []
for rows, vocabulary, dtype in json.loads(sys.argv[2]):
    del events[:]
    out = torch.empty((rows, vocabulary), dtype=torch.float32)
    cast_to_float32_logits(torch.zeros((rows, vocabulary), dtype=getattr(torch, dtype)), out)
    asked.append([rows, vocabulary, dtype, [e["hit"] for e in events]])
print(json.dumps(asked))
"""


def test_the_two_seeded_logits_casts_are_the_keys_a_server_s_batches_ask_for(pinned_python, tmp_path):
    """The seed casts 2 x 1024 and 1 x 1001 logits; a server casts a batch of its vocabulary. Each real batch,
    in a fresh process, must be served from the seeded cache: Llama 3's and Qwen3's vocabularies at 1, 3 and 160
    rows, and a vocabulary not a multiple of 16 (32001) at 1, 2 and 16 rows. Control: fp16 logits from a bf16
    shape's seed compile (the dtype is in the key)."""
    sglang = sglang_source(tmp_path / "src", PINNED_SGLANG)
    spec = dict(SPEC, archs=["12.0f"])
    seed(pinned_python, sglang, tmp_path, tmp_path / "cache", spec)
    batches = [[1, 128256, "bfloat16"], [3, 128256, "bfloat16"], [160, 151936, "bfloat16"], [1, 32001, "bfloat16"],
               [2, 32001, "bfloat16"], [16, 32001, "bfloat16"], [3, 128256, "float16"]]
    env = dict(os.environ, PYTHONPATH=str(sglang), TRITON_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path))
    done = subprocess.run([str(pinned_python), "-B", "-c", SERVER_BATCHES, str(KERNELS), json.dumps(batches)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    asked = json.loads(done.stdout.splitlines()[-1])
    # a batch whose key this process already loaded lists no event: the first of each key says hit or compile
    assert [hits for *_, hits in asked] == [[True], [], [], [True], [], [], [False]], asked


def test_an_sglang_whose_logits_processor_is_missing_fails_the_seed_naming_it(pinned_python, tmp_path):
    """Which cast a server makes is read in its logits processor; without that file the seed cannot tell, and
    stops rather than guess either way."""
    sglang = sglang_source(tmp_path / "src", PINNED_SGLANG)
    (sglang / OPS[-1]).unlink()
    (tmp_path / "aot.json").write_text(json.dumps(dict(SPEC, archs=["12.0f"])))
    done = run_step(pinned_python, sglang, tmp_path / "cache", "seed", str(tmp_path / "aot.json"))
    assert done.returncode != 0
    assert "sglang/srt/layers/logits_processor.py is not installed" in done.stderr, done.stderr[-2000:]


def test_an_sglang_without_the_op_fails_the_seed_naming_the_launch(pinned_python, tmp_path):
    python = pinned_python
    sglang = sglang_source(tmp_path / "src", PINNED_SGLANG, with_op=False)
    (tmp_path / "aot.json").write_text(json.dumps(SPEC))
    done = run_step(python, sglang, tmp_path / "cache", "seed", str(tmp_path / "aot.json"))
    assert done.returncode != 0
    assert "llama-3.1-8b compute-position sm_120: ModuleNotFoundError" in done.stderr, done.stderr[-2000:]


def test_the_ptxas_flashinfer_points_triton_at_is_in_the_key_and_the_seed_takes_it_as_a_server_does(
        pinned_python, tmp_path):
    """FlashInfer's flashinfer.triton sets TRITON_PTXAS_BLACKWELL_PATH at import (to PATH's CUDA 13 ptxas); a
    server imports it, so the seed does. Here a stand-in flashinfer points Triton at a ptxas that says another
    version: the seed's sm_120 keys are made with it, and a proof without that import compiles every kernel
    again and names the ptxas it ran instead."""
    sglang = sglang_source(tmp_path / "src", PINNED_SGLANG)
    real = next(pinned_python.parent.parent.glob("lib/python3*/site-packages/triton/backends/nvidia/bin/ptxas-blackwell"))
    wrapper = tmp_path / "ptxas-13"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then "{real}" --version; echo "a CUDA 13 toolkit\'s ptxas"; '
                       f'exit 0; fi\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    (sglang / "flashinfer" / "triton").mkdir(parents=True)
    (sglang / "flashinfer" / "__init__.py").write_text("")
    (sglang / "flashinfer" / "triton" / "__init__.py").write_text(
        f"import os\nos.environ.setdefault('TRITON_PTXAS_BLACKWELL_PATH', {str(wrapper)!r})\n")
    spec = dict(SPEC, archs=["12.0f"])
    manifest = seed(pinned_python, sglang, tmp_path, tmp_path / "cache", spec)
    assert manifest["triton"]["ptxas"] == {"120": str(wrapper)}
    shutil.rmtree(sglang / "flashinfer")
    proved = run_step(pinned_python, sglang, tmp_path / "cache", "prove", str(tmp_path / "aot.json"),
                      str(tmp_path / "manifest.json"))
    proof = json.loads(proved.stdout)
    assert proof["ptxas"] == {"120": str(real)} and not any(e["hit"] for e in proof["served"])
    problems = zero_jit.triton_problems({"triton": proof}, manifest)
    assert f"Triton runs {real} for sm_120 where the seed ran {wrapper}: the ptxas's version is in every key" in problems
    assert any(p.startswith("Triton compiled at first use") for p in problems), problems


# --- the verdict on recorded answers -------------------------------------------------------------------

SEEDED = {"cache_dir": "/var/cache/triton", "ptxas": {"120": "/opt/venv/cu13/bin/ptxas"}, "kernels": [
    {"kernel": "compute_position_kernel", "target": 120, "hash": "aa", "folder": "/var/cache/triton/X", "files": {}}]}


def triton_proof(**changes) -> dict:
    base = {"cache_dir": "/var/cache/triton", "errors": [], "unlaunched": [], "rekeyed": [],
            "ptxas": {"120": "/opt/venv/cu13/bin/ptxas"},
            "served": [{"kernel": "compute_position_kernel", "target": 120, "hash": "aa", "hit": True,
                        "launch": "compute-position", "shape": "a"}],
            "control": {"launch": "compute-position", "target": 80, "error": None, "missed": True,
                        "kernels": ["compute_position_kernel"]}}
    return dict(base, **changes)


EXACT = """
import json, sys, torch
from imagebuild.payload.probe.checks.gpu_launch import _exact
from imagebuild.payload.probe.kernels import kernels_triton
positions = torch.arange(607)
off_by_one = positions.clone()
off_by_one[300] += 1
logits = (torch.randn(2, 1024) * 8).bfloat16()
cast = logits.float()
one_ulp = cast.clone()
one_ulp[1, 7] = torch.nextafter(one_ulp[1, 7], torch.tensor(float("inf")))
print(json.dumps([_exact([(positions, positions.clone())]), _exact([(off_by_one, positions)]),
                  _exact([(positions[:-1], positions)]), _exact([(positions.int(), positions)]),
                  _exact([(cast.clone(), cast)]), _exact([(one_ulp, cast)])]))
"""


def test_a_gpu_s_integer_answer_must_match_torch_s_entry_for_entry(pinned_python):
    """gpu_launch compares the Triton launches' (and clamp_position's) integer results exactly: one entry off or
    one missing is a wrong launch, whatever the float tolerance; int32 against int64 is the same answer."""
    done = subprocess.run([str(pinned_python), "-B", "-c", EXACT], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    right, one_off, short, narrower, cast, one_ulp = json.loads(done.stdout)
    assert right == {"relative_error": 0.0, "entries_wrong": 0, "entries": 607} == narrower
    assert one_off == {"relative_error": 1.0, "entries_wrong": 1, "entries": 607}
    assert short["relative_error"] == 1.0 and short["entries_wrong"] == 607
    # the logits cast is exact too: float32 values compared as they are, not truncated to integers
    assert cast == {"relative_error": 0.0, "entries_wrong": 0, "entries": 2048}
    assert one_ulp == {"relative_error": 1.0, "entries_wrong": 1, "entries": 2048}


def test_a_clean_triton_proof_has_no_problem_and_the_pass_names_what_was_served():
    assert zero_jit.triton_problems({"triton": triton_proof()}, {"triton": SEEDED}) == []
    said = zero_jit.triton_said(triton_proof())
    assert said == ("; 1 Triton kernel variant(s) of the forward served from Triton's cache (compute_position_kernel "
                    "sm_120) with /opt/venv/cu13/bin/ptxas, an undeclared target missed (sm_80)")


@pytest.mark.parametrize("changes, says", [
    ({"served": [dict(triton_proof()["served"][0], hit=False)]},
     "Triton compiled at first use what the seed should have served: compute_position_kernel sm_120"),
    ({"served": []}, "no Triton kernel was launched"),
    ({"unlaunched": ["compute_position_kernel sm_90"]}, "seeded Triton kernels no launch reached"),
    ({"rekeyed": ["compute_position_kernel sm_120"]}, "Triton asked for other keys than the seed wrote"),
    ({"errors": ["a compute-position sm_120: ImportError: x"]}, "a Triton launch failed: a compute-position"),
    ({"control": {"target": 80, "missed": False, "kernels": ["compute_position_kernel"]}},
     "the undeclared Triton target sm_80 did not miss (launched compute_position_kernel)"),
    ({"ptxas": {"120": "/triton/bin/ptxas-blackwell"}},
     "Triton runs /triton/bin/ptxas-blackwell for sm_120 where the seed ran /opt/venv/cu13/bin/ptxas"),
    ({"ptxas": None}, "Triton runs no ptxas for sm_120 where the seed ran /opt/venv/cu13/bin/ptxas"),
])
def test_each_way_the_triton_proof_can_fail_fails(changes, says):
    problems = zero_jit.triton_problems({"triton": triton_proof(**changes)}, {"triton": SEEDED})
    assert any(says in problem for problem in problems), problems


def test_a_manifest_with_triton_kernels_and_a_proof_without_them_fails():
    assert zero_jit.triton_problems({}, {"triton": SEEDED}) == [
        "the manifest lists 1 Triton kernel(s) but the proof launched none"]
    assert zero_jit.triton_problems({}, {"triton": None}) == []  # an image built before the seed: nothing to prove


def test_first_use_leaves_out_what_the_seed_served():
    first = {"triton": ["position.compute_position_kernel", "merge_state.merge_state_kernel"],
             "modules": ["sglang.srt.layers.attention.flashinfer_backend"], "errors": []}
    said = zero_jit.first_use_said({"first_use": first}, triton_proof())
    assert said.startswith("; still compiled at first use, by Triton with its own ptxas (not seeded): 1 kernel(s)")
    variants = "in the variants the declared shapes launch (another variant compiles at first use)"
    assert said.endswith(f"import: merge_state.merge_state_kernel; the others seeded {variants}")
    every = zero_jit.first_use_said({"first_use": dict(first, triton=first["triton"][:1])}, triton_proof())
    assert every == f"; every Triton kernel found in what sglang.srt.layers.attention.flashinfer_backend import is seeded, {variants}"
    unseeded = zero_jit.first_use_said({"first_use": first}, {"served": []})
    assert unseeded.endswith("import: position.compute_position_kernel, merge_state.merge_state_kernel")  # nothing seeded: no claim


def test_file_problems_name_a_changed_and_a_missing_file(tmp_path):
    (tmp_path / "k.cubin").write_bytes(b"kernel")
    seeded = {"kernels": [{"kernel": "k", "target": 120, "folder": str(tmp_path),
                           "files": {"k.cubin": "0" * 64, "k.json": "1" * 64}}]}
    problems = zero_jit.triton_file_problems(seeded)
    assert problems == [f"Triton's k for sm_120: {tmp_path}/k.cubin is not the file the seed wrote",
                        f"Triton's k for sm_120: {tmp_path}/k.json is missing"]
    assert zero_jit.triton_file_problems({"kernels": [{"kernel": "k", "target": 120}]}) == [
        "Triton's k for sm_120: the manifest lists no file"]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values, json_values)
def test_no_answer_of_the_proof_s_child_ends_in_a_traceback(answer, seeded):
    """What the child prints and what the manifest holds are read, never trusted: any JSON gives problems or none."""
    for proof, manifest in (({"triton": answer}, {"triton": SEEDED}), ({"triton": triton_proof()}, {"triton": seeded})):
        try:
            zero_jit.triton_problems(proof, manifest)
            zero_jit.triton_file_problems(manifest["triton"] if isinstance(manifest["triton"], dict) else {})
            zero_jit.triton_said(proof["triton"])
        except (TypeError, AttributeError, KeyError, ValueError) as error:
            pytest.fail(f"{type(error).__name__}: {error} on {proof!r} / {manifest!r}")


def test_the_token_table_writer_is_launched_only_for_the_context_lengths_a_shape_states():
    """Its row stride is a constexpr, so a shape without context_lengths has no key to seed: it is left to the
    first use (and the proof lists it), never seeded for a guessed length."""
    named = lambda shape, casts=False: [name for name, _ in kernels_triton.launches(shape, casts)]  # noqa: E731
    assert named({"name": "a"}) == ["compute-position", "kv-indices"]
    assert named({"name": "a", "context_lengths": []}) == ["compute-position", "kv-indices"]
    assert named({"name": "a", "context_lengths": [40960]}) == ["compute-position", "kv-indices", "req-to-token"]
    # the logits cast where the SGLang installed makes it with Triton (0.5.23), not where torch copies (0.5.22)
    assert named({"name": "a"}, True) == ["compute-position", "kv-indices", "logits-cast"]


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.binary(max_size=4096))
def test_any_logits_processor_file_reads_as_one_cast_or_the_other(tmp_path, monkeypatch, data):
    """The file is outside input: whatever bytes it holds, the reader answers a bool (the call named, or not)."""
    folder = tmp_path / "any" / "sglang"
    (folder / "srt" / "layers").mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    (folder / "srt" / "layers" / "logits_processor.py").write_bytes(data)
    monkeypatch.syspath_prepend(str(folder.parent))
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    assert kernels_triton.logits_cast_reached() is (kernels_triton.LOGITS_CAST_CALL in data.decode("utf-8", "replace"))


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_which_logits_cast_a_release_makes_is_read_in_its_logits_processor(version, tmp_path, monkeypatch):
    sglang = sglang_source(tmp_path / "src", version)
    monkeypatch.syspath_prepend(str(sglang))
    monkeypatch.delitem(sys.modules, "sglang", raising=False)  # another test's stand-in package, if one was imported
    assert kernels_triton.logits_cast_reached() is (LOGITS_CAST[version] == "triton")


def test_capabilities_are_triton_s_numbers_for_the_aot_archs():
    assert kernels_triton.capabilities(["12.0f", "12.0a", "9.0a", "10.0a"]) == [90, 100, 120]
