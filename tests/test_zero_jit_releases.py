"""[aot] against the newest FlashInfer release, and the kernel step's cache and repeatability, on one shape.

The step asks FlashInfer 0.7.4 (the newest on the index; the flagship's SGLang pins 0.7.2) for a shape's
modules, compiles them, and the smoke proof loads them from FlashInfer's AOT folder with JIT disabled and
nvcc hidden, while an undeclared shape misses. The previous release (0.7.1, with SGLang 0.5.22) is built by
test_gallery's pin move, the pinned one by test_flagship. On the same image: a library-only pin move reruns
the kernel step and compiles nothing (the kernel cache), and the step run again on an empty kernel cache of
its own compiles the module again to the same bytes, so the image's OCI manifest digest is the same.
Slow: a real build with torch and one prefill module compiled for sm_120f (about 3 min on 2 cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagebuild import pipeline
from imagebuild.image import export
from imagebuild.kernels import KernelStepWatch
from imagebuild.lock import read_lock, uv_binary
from imagebuild.pipeline import ca_bundle
from imagebuild.recipe.model import load_recipe
from imagebuild.render import AOT_MANIFEST, KERNEL_CACHE_ID, render_context

REPO = Path(__file__).resolve().parent.parent
NEWEST = "0.7.4"

RECIPE = """\
[image]
name = "imagebuild-test/flashinfer-aot-{slug}"
tag = "{version}"

[base]
debian = "bookworm"
packages = ["g++"]

[python]
requirements = [
  "torch==2.14.1",
  "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0",
  "flashinfer-python=={version}",{extra}
]
constraints = ["nvidia-cuda-nvcc==13.0.*", "nvidia-cuda-crt==13.0.*", "nvidia-nvvm==13.0.*",
               "nvidia-cuda-cccl==13.0.*", "nvidia-nvjitlink==13.0.*", "nvidia-cuda-runtime==13.0.*",
               # as the flagship resolves them: equal releases, which do not overwrite each other's files
               "cuda-python==13.4.4", "cuda-bindings==13.4.4"]
exclude = ["nvidia-cutlass-dsl-libs-cu12"]

[cuda]
toolkit = "13.0"
archs = ["12.0f"]
min_driver = "595.71.05"

[[patches]]
package = "flashinfer-python"
file = "{patch}"

[aot]
sglang = false

[[aot.shapes]]
name = "gqa4-bf16"
head_dim = 128
q_heads = 32
kv_heads = 8
prefix_cache = false
sampling = false

[env]
FLASHINFER_CUDA_ARCH_LIST = "12.0f"
"""

pytestmark = [pytest.mark.slow, pytest.mark.engine]
LIBRARY_ONLY = '\n  "six==1.17.0",  # pure Python, in the application layer: no kernel imports it'


def write(folder: Path, slug: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"flashinfer-{slug}.toml"
    recipe.write_text(RECIPE.format(slug=slug, version=NEWEST, extra=extra,
                                    patch=REPO / "recipes" / "patches" / "flashinfer-cuda-version.patch"))
    return recipe


def manifest_of(engine, image: str) -> dict:
    return json.loads(engine.run(image, ["cat", AOT_MANIFEST]).stdout)


@pytest.fixture(scope="module")
def newest(engine, tmp_path_factory):
    """The one-shape recipe on FlashInfer 0.7.4, built (never reused by lock) and smoke-tested, then removed."""
    slug = NEWEST.replace(".", "-") + f"-{os.getpid()}"
    recipe = write(tmp_path_factory.mktemp("newest") / "recipes", slug)
    report = pipeline.build(recipe, engine, tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}", relock=True,
                            rebuild=True)
    yield recipe, report
    engine.remove(report.image)


def test_the_newest_flashinfer_prebuilds_and_is_found_with_jit_off(engine, newest):
    _, report = newest
    assert not report.reused and not report.smoke.cached
    assert report.smoke.ok, [c["detail"] for c in report.smoke.report["checks"] if c["status"] == "fail"]
    check = next(c for c in report.smoke.report["checks"] if c["name"] == "zero-jit")
    assert check["status"] == "pass", check["detail"]
    manifest = manifest_of(engine, report.image)
    assert manifest["versions"]["flashinfer-python"] == NEWEST
    # GQA 4 in bf16: one prefill module serves prefill and decode; no cascade, no sampling declared.
    (artifact,) = manifest["artifacts"]
    assert artifact["kind"] == "flashinfer" and artifact["name"].startswith("batch_prefill_")
    assert 120 in artifact["sass"] and len(artifact["key"]) == 64
    proof = check["evidence"]["proof"]["flashinfer"]
    assert {e["module"] for e in proof["loaded"]} == {artifact["name"]}
    assert proof["undeclared"]["missed"], proof["undeclared"]
    kernels = report.kernels
    assert kernels["compiled"] + kernels["reused"] == 1, kernels  # compiled here, or by an earlier run's build


def test_a_library_only_pin_move_reruns_the_kernel_step_and_compiles_nothing(engine, newest, tmp_path):
    _, first = newest
    slug = NEWEST.replace(".", "-") + f"-six-{os.getpid()}"
    recipe = write(tmp_path / "recipes", slug, LIBRARY_ONLY)
    report = pipeline.build(recipe, engine, tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}", relock=True,
                            rebuild=True, run_smoke=False)
    try:
        assert report.image_id != first.image_id
        # The step ran (a layer below it changed) and found its one module in the kernel cache.
        assert report.kernels["step"] == "ran" and report.kernels["compiled"] == 0, report.kernels
        assert report.kernels["reused"] == 1 and report.kernels["seconds"] == 0.0
        (artifact,) = manifest_of(engine, report.image)["artifacts"]
        (before,) = manifest_of(engine, first.image)["artifacts"]
        assert (artifact["name"], artifact["key"], artifact["sha256"]) == (before["name"], before["key"], before["sha256"])
    finally:
        engine.remove(report.image)


def test_the_kernel_step_on_an_empty_kernel_cache_gives_the_same_image_digest(engine, newest, tmp_path):
    """Two cold compiles, one image digest: the same lock's context, its kernel cache mount renamed to one of
    this test's own (empty), so the step reruns and compiles; every other step is the same. The kernel
    bytes and the exported OCI manifest digest must equal those of the fixture's image."""
    recipe_path, first = newest
    recipe, lock = load_recipe(recipe_path), read_lock(Path(first.lock_path))
    context = render_context(lock, recipe, tmp_path / "context", uv_path=uv_binary(),
                             lock_text=Path(first.lock_path).read_text())
    private = f"imagebuild-test-kernels-{os.getpid()}"
    dockerfile = context / "Dockerfile"
    assert dockerfile.read_text().count(f"id={KERNEL_CACHE_ID},") == 1
    dockerfile.write_text(dockerfile.read_text().replace(f"id={KERNEL_CACHE_ID},", f"id={private},"))
    watch = KernelStepWatch(lambda _: None)
    bundle = ca_bundle()
    image_id = engine.build(context, secrets={"ca": bundle} if bundle else {}, progress=watch)
    ref = f"imagebuild-test/flashinfer-aot-cold:{os.getpid()}"
    engine.tag(image_id, ref)
    try:
        cold = watch.report(lambda: None)
        assert cold["step"] == "ran" and cold["compiled"] == 1 and cold["reused"] == 0, cold
        (artifact,) = manifest_of(engine, ref)["artifacts"]
        (before,) = manifest_of(engine, first.image)["artifacts"]
        assert artifact["sha256"] == before["sha256"], "two compiles of one module gave different bytes"
        cache = export.LayerCache(tmp_path / "oci-cache")
        a = export.export_layout(engine, first.image, tmp_path / "layout-a", cache=cache)
        b = export.export_layout(engine, ref, tmp_path / "layout-b", cache=cache)
        print(f"\nKERNELS one module compiled cold in {cold['seconds']:.1f} s: sha256 {artifact['sha256'][:16]}…; "
              f"manifests {a.manifest_digest} and {b.manifest_digest}")
        assert a.diff_ids == b.diff_ids
        assert a.manifest_digest == b.manifest_digest
    finally:
        engine.remove(ref)
        for mount in engine.cache_mounts():
            if private in mount["description"]:
                engine.remove_cache_mount(mount["id"])
