"""[aot] against the newest FlashInfer release: the step asks FlashInfer 0.7.4 (the newest on the index; the
flagship's SGLang pins 0.7.2) for a shape's modules, compiles them, and the smoke proof loads them from
FlashInfer's AOT folder with JIT disabled and nvcc hidden, while an undeclared shape misses. The previous
release (0.7.1, with SGLang 0.5.22) is built by test_gallery's pin move, the pinned one by test_flagship.
Slow: a real build with torch and one prefill module compiled for sm_120f (about 3 min on 2 cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagebuild import pipeline

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
  "flashinfer-python=={version}",
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


def test_the_newest_flashinfer_prebuilds_and_is_found_with_jit_off(engine, tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    slug = NEWEST.replace(".", "-") + f"-{os.getpid()}"
    recipe = folder / f"flashinfer-{slug}.toml"
    recipe.write_text(RECIPE.format(slug=slug, version=NEWEST,
                                    patch=REPO / "recipes" / "patches" / "flashinfer-cuda-version.patch"))
    report = pipeline.build(recipe, engine, tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}", relock=True,
                            rebuild=True)
    try:
        assert not report.reused and not report.smoke.cached
        assert report.smoke.ok, [c["detail"] for c in report.smoke.report["checks"] if c["status"] == "fail"]
        check = next(c for c in report.smoke.report["checks"] if c["name"] == "zero-jit")
        assert check["status"] == "pass", check["detail"]
        manifest = json.loads(engine.run(report.image, ["cat", "/opt/imagebuild/aot-manifest.json"]).stdout)
        assert manifest["versions"]["flashinfer-python"] == NEWEST
        # GQA 4 in bf16: one prefill module serves prefill and decode; no cascade, no sampling declared.
        (artifact,) = manifest["artifacts"]
        assert artifact["kind"] == "flashinfer" and artifact["name"].startswith("batch_prefill_")
        assert 120 in artifact["sass"]
        proof = check["evidence"]["proof"]["flashinfer"]
        assert {e["module"] for e in proof["loaded"]} == {artifact["name"]}
        assert proof["undeclared"]["missed"], proof["undeclared"]
    finally:
        engine.remove(report.image)
