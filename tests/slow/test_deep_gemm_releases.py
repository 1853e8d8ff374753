"""The deep_gemm tier holds as the pin moves: the cuda-toolchain recipe built with each real sgl-deep-gemm
release (previous ones, the pinned 0.2.3.post2, the newest 0.2.5) passes its smoke test, and inside a
built image the tier still fails when the toolchain truly cannot compile (CUDA headers removed, an arch
nvcc cannot target). Slow: four real builds on the engine, each removed afterwards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagebuild import flows

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cuda-toolchain.toml"
RELEASES = ("0.2.2", "0.2.3", "0.2.3.post2", "0.2.5")
PINNED = "0.2.3.post2"

pytestmark = [pytest.mark.slow, pytest.mark.engine]


@pytest.fixture(scope="module")
def built(engine, tmp_path_factory):
    """{release: image ref}, each built from the cuda-toolchain recipe with that pin; removed at the end."""
    folder, refs = tmp_path_factory.mktemp("deep-gemm") / "recipes", {}  # locks go to ../lockfiles
    folder.mkdir()
    try:
        for version in RELEASES:
            name = f"dg-{version.replace('.', '-')}-{os.getpid()}"
            text = RECIPE.read_text().replace(f'"sgl-deep-gemm=={PINNED}"', f'"sgl-deep-gemm=={version}"')
            assert f"sgl-deep-gemm=={version}" in text
            recipe = folder / f"{name}.toml"
            recipe.write_text(text.replace('name = "imagebuild/cuda-toolchain"', f'name = "imagebuild-test/{name}"'))
            ref = f"imagebuild-test/{name}:13.0"
            try:
                report = flows.build(recipe, engine, flows.BuildOptions(tag=ref, relock=True, rebuild=True))
                assert not report.reused and not report.smoke.cached
            except Exception as error:  # a failed smoke is the finding: keep it for the test to show
                refs[version] = error
                continue
            refs[version] = report
        yield refs
    finally:
        for report in refs.values():
            if hasattr(report, "image"):
                engine.remove(report.image)


@pytest.mark.parametrize("version", RELEASES)
def test_the_deep_gemm_tier_passes_on_each_release(built, version):
    report = built[version]
    assert not isinstance(report, Exception), f"sgl-deep-gemm {version}: {report}"
    check = next(c for c in report.smoke.report["checks"] if c["name"] == "deep-gemm-sm120")
    assert check["status"] == "pass", check["detail"]
    assert check["evidence"]["version"] == version
    assert {k["kernel"] for k in check["evidence"]["kernels"]} == {"sm120_bf16_gemm_impl",
                                                                     "sm120_fp8_fp4_gemm_1d1d_impl"}
    assert all(k["elf"]["arch"] == 120 for k in check["evidence"]["kernels"])


def run_probe(engine, image: str, prepare: str) -> dict:
    """The image's own probe after a shell step that breaks something, with its own expect.json."""
    command = (f"{prepare} && python /opt/imagebuild/probe.pyz --expect /tmp/expect.json --workdir /tmp/probe; "
               "true")
    result = engine.run(image, ["sh", "-c", command], network=False, timeout=900)
    report = json.loads(result.stdout)
    return next(c for c in report["checks"] if c["name"] == "deep-gemm-sm120")


def with_archs(archs: list) -> str:
    script = ("import json; e = json.load(open('/opt/imagebuild/expect.json')); "
              f"e['cuda']['archs'] = {archs!r}; json.dump(e, open('/tmp/expect.json', 'w'))")
    return f'python -c "{script}"'


def test_removed_cuda_headers_fail_the_tier_for_that_reason(engine, built):
    image = built[PINNED].image
    check = run_probe(engine, image, with_archs(["sm_120a"]) + " && rm -f \"$CUDA_HOME/include/cuda_runtime.h\"")
    assert check["status"] == "fail"
    assert "cuda_runtime.h: No such file or directory" in check["detail"]


def test_an_arch_the_nvcc_cannot_target_fails_the_tier_for_that_reason(engine, built):
    check = run_probe(engine, built["0.2.5"].image, with_archs(["sm_129"]))
    assert check["status"] == "fail"
    assert "Unsupported gpu architecture 'sm_129f'" in check["detail"]
