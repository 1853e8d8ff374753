"""The flagship, recipes/sglang-blackwell.toml, built (slow): the image passes smoke tiers 1-3 and its
zero-JIT proof, while the same image without the FlashInfer patch demonstrably fails tier 2 (its lock:
tests/flows/test_flagship_lock.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.flows.repro import image_kernels
from imagebuild.image.sbom import build_sbom
from imagebuild.image.verify import verify_image
from imagebuild.lock import read_lock
from imagebuild.render import site_packages
from imagebuild.render.paths import PATCHER, PATCHES

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "sglang-blackwell.toml"
TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm",
             "nvidia-nvjitlink", "nvidia-cuda-nvrtc")


# ---------------------------------------------------------------- slow: the 10 GB image

TIERS = ("interpreter", "packages", "cuda-toolchain", "cuda-home", "deep-gemm-sm120", "imports", "torch-cuda",
         "flashinfer-dynamo")


@pytest.fixture(scope="module")
def flagship(engine):
    """The flagship, built once for this module's tests (a rebuild: never an image reused by lock, and its
    smoke test run, never a pass on record replayed), and removed after them."""
    report = flows.build(RECIPE, engine, flows.BuildOptions(tag=f"imagebuild-test/sglang-blackwell:{os.getpid()}", rebuild=True))
    yield report
    engine.remove(report.image)


@pytest.mark.slow
@pytest.mark.engine
def test_flagship_builds_and_passes_smoke_tiers_1_to_3(engine, user_image, flagship):
    user_image("imagebuild/sglang-blackwell:0.5.23-cu130")  # the README's first command made it: it stays
    report = flagship
    assert not report.reused and report.smoke.ok and not report.smoke.cached
    checks = {c["name"]: c for c in report.smoke.report["checks"]}
    assert {name: checks[name]["status"] for name in TIERS} == dict.fromkeys(TIERS, "pass")
    imported = checks["imports"]["evidence"]["imported"]
    assert imported["sglang"]["version"] == "0.5.23" and imported["torch"]["version"].endswith("+cu130")
    kernels = {k["kernel"]: k for k in checks["deep-gemm-sm120"]["evidence"]["kernels"]}
    assert set(kernels) == {"sm120_bf16_gemm_impl", "sm120_fp8_fp4_gemm_1d1d_impl"}
    assert all(k["elf"]["arch"] == 120 and k["elf"]["machine"] == 190 for k in kernels.values())
    # The patch is on record in the image: its labels and the installed distribution.
    info = engine.inspect(report.image)
    lock = read_lock(REPO / "lockfiles" / "sglang-blackwell.lock")
    assert info.labels["io.imagebuild.patches"] == f"flashinfer-python:{lock.patches[0].sha256}"
    # Patched and pruned, every RECORD still matches the files: verify finds nothing to report.
    verified = verify_image(engine, report.image, REPO / "lockfiles" / "sglang-blackwell.lock")
    assert verified.ok, verified.mismatches[:5]
    assert verified.checked["kernels"] >= 4  # [aot]'s kernels, outside every RECORD, hash as their manifest says
    # What the recipe prunes is gone, and the probe's waste scan no longer lists it.
    assert info.labels["io.imagebuild.pruned"] == "nvidia-nccl-cu13,sglang-kernel,torch-c-dlpack-ext,triton"
    done = engine.run(report.image, ["python", "/opt/imagebuild/probe.pyz", "--waste", "120"])
    waste = json.loads(done.stdout)
    paths = {c["path"] for c in waste["candidates"]}
    assert not paths & {"sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
                        "triton/_C/libtriton.so", "nvidia/nccl/lib/libnccl.so.2"}
    assert not [p for p in paths if p.startswith("triton/") and p.endswith("_static.a")]
    check_zero_jit(engine, report.image, checks["zero-jit"])


@contextlib.contextmanager
def derived(engine, image: str, tmp_path: Path, name: str, step: str, files: dict | None = None) -> Iterator[str]:
    """An image made FROM `image` with one RUN step (and `files` copied to /tmp/derived/ first), removed after."""
    context = tmp_path / name
    context.mkdir()
    for file_name, text in (files or {}).items():
        (context / file_name).write_text(text)
    copy = "COPY . /tmp/derived/\n" if files else ""
    (context / "Dockerfile").write_text(f"FROM {image}\n{copy}RUN {step}\n")
    ref = f"imagebuild-test/derived-{name}:{os.getpid()}"
    made = subprocess.run(["/usr/bin/docker", "build", "-q", "-t", ref, str(context)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        yield ref
    finally:
        engine.remove(ref)


def probe_only(engine, image: str, *checks: str) -> tuple[dict, object]:
    """The image's own probe running `checks` alone (--only), as the smoke test runs them: ({name: check}, the run)."""
    only = [arg for check in checks for arg in ("--only", check)]
    done = engine.run(image, ["python", "/opt/imagebuild/probe.pyz", "--expect", "/opt/imagebuild/expect.json", *only],
                      timeout=1800)
    found = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert set(found) == set(checks), found
    return found, done


def derived_zero_jit(engine, image: str, tmp_path: Path, name: str, step: str, files: dict | None = None,
                     check: str = "zero-jit") -> dict:
    """A check (zero-jit by default) of an image made FROM the flagship with one RUN step; the probe runs that
    check alone (--only): the others are not in question."""
    with derived(engine, image, tmp_path, name, step, files) as ref:
        return probe_only(engine, ref, check)[0][check]


GPU_KERNELS_TOLD_A_GPU = """
import json, os, sys
sys.path.insert(0, "/opt/imagebuild/probe.pyz")
from imagebuild_probe.expect import load_expect
from imagebuild_probe.checks.gpu_kernels import check_gpu_kernels
expect, _ = load_expect("/opt/imagebuild/expect.json")
check = check_gpu_kernels(expect, True)
nvcc = os.path.join(expect["cuda"]["home"], "bin", "nvcc")
print(json.dumps({"check": check, "nvcc": os.path.getsize(nvcc), "aside": os.path.exists(nvcc + ".imagebuild-hidden")}))
"""


@pytest.mark.slow
@pytest.mark.engine
def test_gpu_kernels_told_a_gpu_is_visible_runs_the_launches_and_fails_on_torchs_own_error(engine, flagship):
    """GPU visibility mocked (no GPU here): the check runs the image's launches in a child with JIT off and nvcc
    hidden; torch finds no GPU, the child exits non-zero, and the check fails saying so (never a pass on nothing);
    nvcc is the real one again afterwards."""
    ran = engine.run(flagship.image, ["/opt/venv/bin/python", "-c", GPU_KERNELS_TOLD_A_GPU])
    answer = json.loads(ran.stdout.splitlines()[-1])
    assert answer["check"]["status"] == "fail", answer
    assert "the GPU launches printed no result (exit 1)" in answer["check"]["detail"]
    assert "get_device_capability" in answer["check"]["detail"]
    assert answer["nvcc"] > 100_000 and not answer["aside"]  # the real binary, not the stand-in script


# A FlashInfer whose sampling loader hands back a module without going through its JIT specs (what a release that
# changes how its loaders build would look like): the proof cannot see that load.
INERT_SAMPLING = ("\nimport functools as _imagebuild_ft\n\n\n@_imagebuild_ft.cache\ndef get_sampling_module():\n"
                  "    return type('Inert', (), {'__getattr__': lambda self, name: (lambda *a, **k: None)})()\n")


@pytest.fixture(scope="module")
def doctored(engine, flagship, tmp_path_factory):
    """The zero-jit check of one image made from the flagship with three faults at once, each in a module of
    its own: a prebuilt FlashInfer module removed (not sampling's), a prebuilt SGLang kernel removed, and the
    inert sampling loader. The check reports every problem it finds, so one run (about 70 s) serves the three
    tests below, each asserting its own fault is named. Yields (check, {kind: removed artifact})."""
    manifest = json.loads(engine.run(flagship.image, ["cat", "/opt/imagebuild/aot-manifest.json"]).stdout)
    victims = {kind: next(a for a in manifest["artifacts"] if a["kind"] == kind and not a["name"].startswith("sampling"))
               for kind in ("flashinfer", "sglang")}
    site = site_packages(read_lock(REPO / "lockfiles" / "sglang-blackwell.lock"))
    step = (f"rm {victims['flashinfer']['path']} {victims['sglang']['path']} && "
            f"cat /tmp/derived/inert.py >> {site}/flashinfer/sampling.py && rm -r /tmp/derived")
    check = derived_zero_jit(engine, flagship.image, tmp_path_factory.mktemp("doctored"), "three-faults", step,
                             {"inert.py": INERT_SAMPLING})
    assert check["status"] == "fail", check["detail"]
    yield check, victims


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("kind", ["flashinfer", "sglang"])
def test_zero_jit_fails_naming_a_prebuilt_kernel_removed_from_the_image(doctored, kind):
    check, victims = doctored
    assert victims[kind]["path"] in check["detail"], check["detail"]


@pytest.mark.slow
@pytest.mark.engine
def test_zero_jit_fails_when_a_flashinfer_loader_records_nothing(doctored):
    check, _ = doctored
    said = [part for part in check["detail"].split(" | ") if "sampling" in part]
    assert any("loaded no module" in part or "no declared load asked for" in part for part in said), check["detail"]


@pytest.mark.slow
@pytest.mark.engine
def test_cuda_home_asks_each_consumer_and_names_the_one_that_disagrees(engine, flagship, tmp_path):
    checks = {c["name"]: c for c in flagship.smoke.report["checks"]}
    found = checks["cuda-home"]["evidence"]["found"]
    assert set(found) == {"deep_gemm", "torch", "flashinfer"} and checks["cuda-home"]["evidence"]["triton"]["ptxas"]
    site = site_packages(read_lock(REPO / "lockfiles" / "sglang-blackwell.lock"))
    other = "\n\ndef get_cuda_path():\n    import pathlib\n    return pathlib.Path('/usr/local/cuda-12.8')\n"
    step = f"cat /tmp/derived/other.py >> {site}/flashinfer/jit/cpp_ext.py && rm -r /tmp/derived"
    check = derived_zero_jit(engine, flagship.image, tmp_path, "flashinfer-home", step, {"other.py": other},
                             check="cuda-home")
    assert check["status"] == "fail" and "flashinfer finds /usr/local/cuda-12.8" in check["detail"], check["detail"]
    assert "torch" not in check["detail"].split(";")[0]


LINK = 'c++ -shared -o /tmp/imagebuild-link.so -x c /dev/null -L"$CUDA_HOME/lib64" '


@pytest.mark.slow
@pytest.mark.engine
def test_the_cuda_libraries_link_by_their_plain_names(engine, flagship):
    """FlashInfer's fused MoE links -lnvrtc when it compiles (0.7.2's gen_cutlass_fused_moe_module): the wheels
    ship libnvrtc.so.13 and no libnvrtc.so, and the GLM-4.5 NVFP4 build failed there (2026-12-04) before the
    image linked each library the lock reads from the wheels under its plain name. The control: without
    that link, ld cannot find the library."""
    names = [Path(path).name[len("lib"):-len(".so")] for path in read_lock(Path(flagship.lock_path)).cuda["unversioned"]]
    assert {"nvrtc", "cublas", "cudart"} <= set(names), names
    done = engine.run(flagship.image, ["sh", "-c", LINK + " ".join(f"-l{name}" for name in names)])
    assert done.exit_code == 0, done.stderr
    gone = engine.run(flagship.image, ["sh", "-c", 'rm "$CUDA_HOME/lib/libnvrtc.so" && ' + LINK + "-lnvrtc"])
    assert gone.exit_code != 0 and "cannot find -lnvrtc" in gone.stderr, gone.stderr


def check_zero_jit(engine, image: str, check: dict) -> None:
    """[aot]: what the build compiled is what FlashInfer's and SGLang's own loaders find with JIT off."""
    assert check["status"] == "pass", check["detail"]
    evidence = check["evidence"]
    assert evidence["nvcc_calls"] == [] and evidence["problems"] == []
    manifest = json.loads(engine.run(image, ["cat", "/opt/imagebuild/aot-manifest.json"]).stdout)
    built = {a["name"]: a for a in manifest["artifacts"] if a["kind"] == "flashinfer"}
    proof = evidence["proof"]["flashinfer"]
    # Both shapes: one prefill module serves bf16 prefill and GQA-4 decode; the FP8 cache adds one;
    # cascade and sampling are shared. The names are FlashInfer's, asked of it, not written here.
    assert len(built) == 4 and {e["module"] for e in proof["loaded"]} == set(built)
    assert all(e["aot"] and e["path"] == built[e["module"]]["path"] for e in proof["loaded"])
    assert proof["undeclared"]["missed"] and proof["undeclared"]["module"] not in built
    assert all(120 in a["sass"] for a in manifest["artifacts"])  # sm_120f SASS, read from each fat binary
    sglang = evidence["proof"]["sglang"]
    assert sglang["misses"] == [] and len(sglang["hits"]) >= 5
    assert sglang["undeclared"] and all(error for _, _, error in sglang["undeclared"])
    assert [a for a in manifest["artifacts"] if a["kind"] == "sglang"]
    # What a server's first request still compiles is listed by name: Triton's kernels on the forward path.
    assert "position.compute_position_kernel" in sglang["first_use"]["triton"] and not sglang["first_use"]["errors"]
    assert "still compiled at first use, by Triton" in check["detail"]
    # ... but not the one the [aot] step seeded into Triton's cache for sm_120: Triton itself said it was a hit
    triton = evidence["proof"]["triton"]
    assert sorted((e["kernel"], e["target"], e["hit"]) for e in triton["served"]) == [
        ("compute_position_kernel", 120, True), ("create_flashinfer_kv_indices_triton", 120, True),
        ("create_flashinfer_kv_indices_triton", 120, True),  # int64 lengths (capture, decode), int32 (prefill)
        # the logits cast into decode's float32 buffer: a flat row whose length is a multiple of 16, and one not
        ("softcap_inplace_logits_kernel", 120, True), ("softcap_inplace_logits_kernel", 120, True),
        ("write_req_to_token_pool_triton", 120, True), ("write_req_to_token_pool_triton", 120, True)]  # 40960, 131072
    assert triton["unlaunched"] == [] and triton["rekeyed"] == []
    # made and served with the ptxas a server runs: the toolkit's, where FlashInfer's flashinfer.triton points Triton
    toolkit_ptxas = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin/ptxas"
    assert manifest["triton"]["ptxas"] == triton["ptxas"] == {"120": toolkit_ptxas}
    assert triton["control"]["missed"] and manifest["triton"]["cache_dir"] == "/var/cache/triton"
    assert "compute_position_kernel sm_120" in check["detail"]
    still = check["detail"].partition("still compiled at first use")[2]
    assert "position.compute_position_kernel" not in still and "create_flashinfer_kv_indices_triton" not in still
    # the token-table writer, whose row stride is a constexpr (context length + 4), seeded for the recipe's
    # context_lengths (Llama 3.1 8B's 131072, Qwen3-8B's 40960)
    assert "write_req_to_token_pool_triton" not in still and "write_req_to_token_pool_triton sm_120" in check["detail"]
    assert manifest["triton"]["logits_cast"] == "triton" and "softcap_inplace_logits_kernel sm_120 x2" in check["detail"]
    assert "sglang.srt.layers.logits_processor" in sglang["first_use"]["modules"]
    # SGLang's decode positions (clamp_position, int64) are among the kernels built and loaded with JIT off
    assert any(what == "clamp-position" for _, what, _ in sglang["hits"])
    # The image's SGLang cache holds what the inputs decide: each leaf's dependency list, not ninja's build times.
    listed = engine.run(image, ["find", manifest["sglang_jit_cache_dir"], "-type", "f"]).stdout.split()
    assert [p for p in listed if p.endswith("/sgl_deps.json")] and not [p for p in listed if p.endswith("/.ninja_log")]
    # The SBOM lists every prebuilt kernel with its hash; doctor in the image knows deep_gemm is off.
    document = build_sbom(read_lock(REPO / "lockfiles" / "sglang-blackwell.lock"), image_name="flagship",
                          kernels=image_kernels(engine, image))
    files = {c["name"]: c["hashes"][0]["content"] for c in document["components"] if c["type"] == "file"}
    assert files == {a["name"]: a["sha256"] for a in manifest["artifacts"]}
    doctor = json.loads(engine.run(image, ["python", "/opt/imagebuild/probe.pyz", "--doctor"]).stdout)
    (deep_gemm,) = [f for f in doctor["checks"] if f["name"] == "deep-gemm-cache"]
    assert deep_gemm["status"] == "pass" and "SGLANG_ENABLE_JIT_DEEPGEMM=0" in deep_gemm["detail"]


# The recipe's patch taken back out of the built flagship: each hunk reversed and applied exactly by the image's own
# patcher (payload/apply_patch.py, kept in the image), so the file is FlashInfer's release as the wheel ships it.
UNPATCH = """
import os, sys
patcher, site, patch = sys.argv[1:]
sys.path.insert(0, os.path.dirname(patcher))
from apply_patch import apply_to_text, parse_patch
for file_patch in parse_patch(open(patch).read()):
    for hunk in file_patch.hunks:
        hunk.old_start, hunk.new_start, hunk.old_count, hunk.new_count = (hunk.new_start, hunk.old_start,
                                                                          hunk.new_count, hunk.old_count)
        hunk.lines = [({"-": "+", "+": "-"}.get(op, op), text) for op, text in hunk.lines]
    path = f"{site}/{file_patch.target(1)}"
    with open(path) as handle:
        text = apply_to_text(file_patch, handle.read(), path)
    with open(path, "w") as handle:
        handle.write(text)
    print("unpatched", path)
"""


@pytest.mark.slow
@pytest.mark.engine
def test_without_the_patch_the_dynamo_tier_fails(engine, flagship, tmp_path):
    """Tier 2 can fail: the same stack with FlashInfer's file as released breaks under torch.compile(fullgraph).
    The flagship with the patch reversed in one step (a build of the recipe without its patch took 145 s here)."""
    lock = read_lock(REPO / "lockfiles" / "sglang-blackwell.lock")
    (patch,) = lock.patches
    site = site_packages(lock)
    step = (f"python /tmp/derived/unpatch.py {PATCHER} {site} {PATCHES}/{patch.file} && rm -r /tmp/derived && "
            f"! grep -q FLASHINFER_CUDA_VERSION {site}/flashinfer/jit/cpp_ext.py")
    with derived(engine, flagship.image, tmp_path, "unpatched", step, {"unpatch.py": UNPATCH}) as ref:
        # The two tiers in question, run by the image's own probe as the smoke test runs them (the others pass
        # on the patched flagship and are not what this test is about).
        checks, done = probe_only(engine, ref, "flashinfer-dynamo", "torch-cuda")
        assert checks["flashinfer-dynamo"]["status"] == "fail"
        assert "get_cuda_version" in checks["flashinfer-dynamo"]["detail"]
        assert checks["torch-cuda"]["status"] == "pass" and not json.loads(done.stdout)["ok"] and done.exit_code == 1
    # The control: the flagship itself, with the patch, passes the same tier (its smoke test ran it).
    assert {c["name"]: c["status"] for c in flagship.smoke.report["checks"]}["flashinfer-dynamo"] == "pass"
