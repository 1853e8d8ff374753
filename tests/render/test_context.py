"""Render: golden Dockerfiles for fixed locks, the layer plan's promise, and the context on disk.

Regenerate the golden files after an intended template change with UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from imagebuild.errors import RecipeError
from imagebuild.lock import LockedPatch, LockedWheel, parse_pylock
from imagebuild.payload.probe import bundle
from imagebuild.recipe.cuda import Arch, CudaVersion
from imagebuild.recipe.layers import LayerPlan
from imagebuild.recipe.model import CudaSpec, DebianBase, Patch, Prune, PythonSpec, Recipe
from imagebuild.render import docker_quote, render_context, render_dockerfile, render_values
from tests.lock.test_lock import FIXTURES, _lock

GOLDEN = Path(__file__).parent / "golden"
PLAN = LayerPlan(overrides={}, application=frozenset({"sgl-deep-gemm"}))


def _recipe(tmp_path: Path, **changes) -> Recipe:
    recipe = Recipe(path=tmp_path / "recipes" / "cuda-toolchain.toml", name="imagebuild/cuda-toolchain",
                    tag="13.0", base=DebianBase("bookworm", ("g++",)),
                    python=PythonSpec(requirements=("cuda-toolkit==13.0.3.0", "sgl-deep-gemm==0.2.3.post2")),
                    cuda=CudaSpec(CudaVersion(13, 0), (Arch.parse("sm_120a"),), "595.71.05"),
                    env={"DG_JIT_CACHE_DIR": "/var/cache/deep_gemm"},
                    labels={"org.opencontainers.image.description": 'say "hi" for $5'})
    return replace(recipe, **changes)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1 to accept)"


def _app_wheels(version: str = "1.16.0", sha: str = "d" * 64) -> tuple[LockedWheel, ...]:
    wheels = parse_pylock((FIXTURES / "cuda-toolchain.pylock.toml").read_text(), PLAN)
    return wheels + (LockedWheel("six", version, f"six-{version}-py2.py3-none-any.whl", sha, 11000,
                                 "application"),)


def test_cuda_toolchain_dockerfile_matches_golden(tmp_path):
    _check_golden("cuda-toolchain.Dockerfile", render_dockerfile(render_values(_lock(), _recipe(tmp_path))))


def test_patched_recipe_dockerfile_matches_golden(tmp_path):
    patch_file = tmp_path / "fix.patch"
    patch_file.write_text("--- a/x\n+++ b/x\n")
    lock = replace(_lock(_app_wheels()), patches=(
        LockedPatch("sgl-deep-gemm", "01-fix.patch", "f" * 64, 1, "0.2.3.post2"),))
    recipe = _recipe(tmp_path, patches=(Patch("sgl-deep-gemm", patch_file, 1),))
    _check_golden("patched.Dockerfile", render_dockerfile(render_values(lock, recipe)))


PRUNE = (Prune("nvidia-cuda-nvcc", remove=("nvidia/cu13/lib/*_static.a",), reason="read only by a linker"),
         Prune("sgl-deep-gemm", strip_debug=("deep_gemm/*.so",), reason="debug sections"))


def test_pruned_recipe_dockerfile_matches_golden(tmp_path):
    _check_golden("pruned.Dockerfile", render_dockerfile(render_values(_lock(), _recipe(tmp_path, prune=PRUNE))))


def test_pruning_runs_in_the_install_step_of_the_layer_holding_the_package(tmp_path):
    values = render_values(_lock(), _recipe(tmp_path, prune=PRUNE))
    by_layer = {layer.name: [entry["package"] for entry in layer.prune] for layer in values.layers}
    assert by_layer == {"framework": ["nvidia-cuda-nvcc"], "kernels": ["sgl-deep-gemm"]}
    assert values.labels["io.imagebuild.pruned"] == "nvidia-cuda-nvcc,sgl-deep-gemm"
    context = render_context(_lock(), _recipe(tmp_path, prune=PRUNE), tmp_path / "ctx", uv_path=None)
    spec = json.loads((context / "prune" / "1-framework.json").read_text())
    assert spec == [{"package": "nvidia-cuda-nvcc", "remove": ["nvidia/cu13/lib/*_static.a"], "strip_debug": [],
                     "reason": "read only by a linker"}]
    assert (context / "prune" / "prune.py").exists() and (context / "prune" / "apply_patch.py").exists()
    assert json.loads((context / "prune" / "2-kernels.json").read_text())[0]["strip_debug"] == ["deep_gemm/*.so"]
    # Bind-mounted, not copied: nothing of the pruner lands in a layer.
    assert "COPY prune" not in (context / "Dockerfile").read_text()


def test_pruning_a_package_the_lock_lacks_names_the_entry(tmp_path):
    recipe = _recipe(tmp_path, prune=(Prune("six", remove=("six.py",), reason="r"),))
    with pytest.raises(RecipeError, match=r"prune\[0\].package.*six"):
        render_values(_lock(), recipe)


def test_bumping_the_application_pin_changes_only_the_last_layer(tmp_path):
    """The promise behind layer order: everything above the application layer renders identically."""
    recipe = _recipe(tmp_path)
    before = render_values(_lock(_app_wheels("1.16.0", "d" * 64)), recipe)
    after = render_values(_lock(_app_wheels("1.17.0", "e" * 64)), recipe)
    assert [layer.name for layer in before.layers] == ["framework", "kernels", "application"]
    assert before.layers[:2] == after.layers[:2]
    assert before.layers[2].lines != after.layers[2].lines
    old, new = render_dockerfile(before), render_dockerfile(after)
    cut = old.index("# Layer 3/3: application")
    assert old[:cut] == new[:cut]


def test_toolchain_is_usable_from_the_environment(tmp_path):
    values = render_values(_lock(), _recipe(tmp_path))
    home = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13"
    assert values.env_base["CUDA_HOME"] == home
    assert values.env_base["PATH"].startswith(f"/opt/venv/bin:{home}/bin:")
    (framework,) = [layer for layer in values.layers if layer.links]
    assert framework.name == "framework"
    assert [link.command for link in framework.links][:2] == [
        f"ln -sfn lib {home}/lib64", f"ln -sfn libcudart.so.13 {home}/lib/libcudart.so"]
    assert values.expect["cuda"]["home"] == home and values.expect["deep_gemm"] == {"compile": True}


def test_libraries_get_their_link_names_in_the_toolchain_step(tmp_path):
    lock = _lock(_app_wheels())
    nvrtc = {"nvidia/cu13/lib/libnvrtc.so": "libnvrtc.so.13"}
    lock = replace(lock, cuda={**lock.cuda, "unversioned": {**lock.cuda["unversioned"], **nvrtc}})
    values = render_values(lock, _recipe(tmp_path))
    home = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13"
    (framework,) = [layer for layer in values.layers if layer.links]
    # libcudart.so once, by the runtime's own version; then the lock's names, in the same step
    assert [link.command for link in framework.links] == [
        f"ln -sfn lib {home}/lib64", f"ln -sfn libcudart.so.13 {home}/lib/libcudart.so",
        f"ln -sfn libnvrtc.so.13 {home}/lib/libnvrtc.so", f"ln -sfn libnvvm.so.4 {home}/lib/libnvvm.so"]
    text = render_dockerfile(values)
    assert text.count("imagebuild-step=links") == 1 and text.index("imagebuild-step=links") < text.index("# Layer 2/3")
    # an application pin bump leaves the step as it was (test_bumping_the_application_pin_changes_only_the_last_layer)
    # the negative control: a lock that names none links only the toolchain's two
    bare = render_values(replace(lock, cuda={k: v for k, v in lock.cuda.items() if k != "unversioned"}), _recipe(tmp_path))
    assert len(next(layer for layer in bare.layers if layer.links).links) == 2


def test_no_cuda_home_without_a_pip_nvcc(tmp_path):
    wheels = tuple(w for w in _lock().wheels if w.name != "nvidia-cuda-nvcc")
    lock = _lock(wheels)  # its cuda facts as the RECORDs would have them: no bin/nvcc anywhere
    values = render_values(replace(lock, cuda={k: v for k, v in lock.cuda.items() if k != "nvcc"}), _recipe(tmp_path))
    assert "CUDA_HOME" not in values.env_base and values.expect["cuda"] is None
    assert not any(layer.links for layer in values.layers)


def test_labels_carry_checksums_and_reject_our_prefix(tmp_path):
    lock = _lock()
    values = render_values(lock, _recipe(tmp_path))
    assert values.labels["io.imagebuild.lock.sha256"] == lock.sha256
    assert values.labels["io.imagebuild.recipe.sha256"] == "a" * 64
    assert values.labels["io.imagebuild.version"]
    with pytest.raises(RecipeError, match=r"labels.io.imagebuild.lock.sha256.*reserved"):
        render_values(lock, _recipe(tmp_path, labels={"io.imagebuild.lock.sha256": "forged"}))


def test_multiline_env_is_refused_with_its_key(tmp_path):
    with pytest.raises(RecipeError, match=r"\[env.BAD\].*span lines"):
        render_values(_lock(), _recipe(tmp_path, env={"BAD": "a\nb"}))


@pytest.mark.parametrize("value, quoted", [
    ("plain", '"plain"'), ('say "hi"', '"say \\"hi\\""'), ("$HOME", '"\\$HOME"'), ("a\\b", '"a\\\\b"')])
def test_docker_quote_leaves_nothing_to_expand(value, quoted):
    assert docker_quote(value) == quoted


def test_context_holds_hashed_requirements_probe_and_lock(tmp_path):
    lock = _lock()
    out = render_context(lock, _recipe(tmp_path), tmp_path / "ctx", uv_path=None)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["Dockerfile", "imagebuild/expect.json", "imagebuild/lock.json", "imagebuild/probe.pyz",
                     "requirements/1-framework.txt", "requirements/2-kernels.txt"]
    probe_bytes = (out / "imagebuild/probe.pyz").read_bytes()
    assert probe_bytes == bundle.zipapp_bytes() and probe_bytes.startswith(b"PK")
    for line in (out / "requirements/1-framework.txt").read_text().splitlines():
        assert " --hash=sha256:" in line and "==" in line
    assert json.loads((out / "imagebuild/lock.json").read_text()) == json.loads(lock.to_json())
    # Rendering again replaces the folder whole, leaving no staging folder behind.
    render_context(lock, _recipe(tmp_path), tmp_path / "ctx", uv_path=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]
    assert (out / "imagebuild/probe.pyz").read_bytes() == probe_bytes  # the image layer stays reproducible


def test_renders_racing_for_one_folder_each_finish_and_leave_one_whole_context(tmp_path):
    """Two builds of one lock render into one folder at once (two CI jobs on one machine): each render ends, the
    folder is a whole context afterwards, and no staging or set-aside folder is left. Negative control: the old
    remove-then-rename swap fails this race ('Directory not empty' or a missing folder)."""
    import threading
    lock, recipe = _lock(), _recipe(tmp_path)
    errors: list[BaseException] = []

    def render() -> None:
        try:
            for _ in range(15):
                render_context(lock, recipe, tmp_path / "ctx", uv_path=None)
        except BaseException as error:  # noqa: BLE001 - the test reports any
            errors.append(error)

    threads = [threading.Thread(target=render) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]
    assert (tmp_path / "ctx" / "Dockerfile").is_file() and (tmp_path / "ctx" / "imagebuild" / "probe.pyz").is_file()
