"""The core path on the real Docker engine: build, smoke, tag; and every way a build must not tag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.engine.docker import DockerEngine
from imagebuild.errors import BuildFailed, EngineUnavailable, SmokeFailed
from imagebuild.flows.smoke import HOLD_REPOSITORY
from imagebuild.lock import read_lock

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cuda-toolchain.toml"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = pytest.mark.engine


@pytest.fixture
def cleanup(engine):
    refs: list[str] = []
    yield refs
    for ref in refs:
        engine.remove(ref)


def _copy_recipe(write_recipe, name: str, env_extra: str = "", requirements_extra: str = "") -> Path:
    text = RECIPE.read_text().replace('name = "imagebuild/cuda-toolchain"', f'name = "imagebuild-test/{name}"')
    text = text.replace('  "sgl-deep-gemm==0.2.3.post2",\n', f'  "sgl-deep-gemm==0.2.3.post2",\n{requirements_extra}')
    text = text.replace("[env]\n", "[env]\n" + env_extra)
    return write_recipe(text, name)


def test_cuda_toolchain_builds_smokes_and_keeps_the_ca_out_of_its_layers(engine, cleanup, tmp_path, user_image):
    user_image("imagebuild/cuda-toolchain:13.0")  # the README's image, if the user built it, stays
    marker = f"imagebuild-ca-marker-{uuid.uuid4().hex}"
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text(HOST_CA.read_text() + f"\n# {marker}\n")
    ref = f"imagebuild-test/cuda-toolchain:{os.getpid()}"
    report = flows.build(RECIPE, engine, flows.BuildOptions(ca=str(bundle), tag=ref))
    cleanup.append(report.image)
    assert report.image == ref
    assert report.smoke.ok
    checks = {c["name"]: c for c in report.smoke.report["checks"]}
    assert {name: checks[name]["status"] for name in
            ("interpreter", "packages", "cuda-toolchain", "cuda-home", "deep-gemm-sm120")} == dict.fromkeys(
        ("interpreter", "packages", "cuda-toolchain", "cuda-home", "deep-gemm-sm120"), "pass")
    info = engine.inspect(report.image)
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    assert info.labels["io.imagebuild.lock.sha256"] == lock.sha256
    assert info.labels["io.imagebuild.recipe.sha256"] == lock.recipe_sha256
    # The CA bundle was a build secret: no file in the image holds it.
    found = engine.run(report.image, ["sh", "-c", f"grep -rl {marker} / --exclude-dir=proc --exclude-dir=sys"
                                      " 2>/dev/null; ls -A /run/secrets 2>/dev/null | wc -l"])
    assert found.stdout.strip() == "0", found.stdout

    # A no-op rebuild gives the same image and reuses the smoke result recorded for that image id.
    again = flows.build(RECIPE, engine, flows.BuildOptions(ca=str(bundle), tag=ref))
    assert again.image_id == report.image_id
    assert again.smoke.cached


def test_a_failed_build_tags_nothing(engine, write_recipe, cleanup):
    name = f"broken-{os.getpid()}"
    recipe = _copy_recipe(write_recipe, name)
    lock_report = flows.lock(recipe)
    lock_path = Path(lock_report.lock_path)
    data = json.loads(lock_path.read_text())
    data["packages"][-1]["wheel"]["sha256"] = "0" * 64  # the index will serve other bytes
    lock_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    cleanup.append(f"imagebuild-test/{name}:13.0")
    with pytest.raises(BuildFailed, match="no image was tagged"):
        flows.build(recipe, engine)
    assert engine.inspect(f"imagebuild-test/{name}:13.0") is None


def test_a_failed_smoke_test_tags_nothing_and_removes_the_image(engine, write_recipe, cleanup):
    name = f"wrong-cuda-home-{os.getpid()}"
    recipe = _copy_recipe(write_recipe, name, env_extra='CUDA_HOME = "/usr/local/cuda"\n')
    cleanup.append(f"imagebuild-test/{name}:13.0")
    with pytest.raises(SmokeFailed, match=r"cuda-home.*was not tagged") as failure:
        flows.build(recipe, engine)
    checks = {c["name"]: c["status"] for c in failure.value.report["checks"]}
    assert checks["cuda-home"] == "fail"
    assert engine.inspect(f"imagebuild-test/{name}:13.0") is None
    assert hold_names(engine) == []  # the image went with its hold, the one name it had


def hold_names(engine) -> list[str]:
    """This process's hold names left in the engine."""
    return sorted(tag for image in engine.client.images.list(filters={"reference": f"{HOLD_REPOSITORY}/*"})
                  for tag in image.tags if f":{os.getpid()}-" in tag)


def test_the_build_holds_its_image_by_a_name_of_its_own_until_the_tag(engine, cleanup, monkeypatch):
    ref = f"imagebuild-test/held:{os.getpid()}"
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    seen: list[str] = []
    probe_run = engine.run

    def another_holder_comes_and_goes(image, command, **options):
        seen.extend(engine.inspect(image).tags)
        other = f"imagebuild-test/another-holder:{os.getpid()}"
        engine.tag(image, other)
        engine.remove(other)
        return probe_run(image, command, **options)

    monkeypatch.setattr(engine, "run", another_holder_comes_and_goes)
    report = flows.build(RECIPE, engine, flows.BuildOptions(tag=ref, rebuild=True))  # rebuild: the probe runs
    cleanup.append(report.image)
    held = [tag for tag in seen if tag.startswith(f"{HOLD_REPOSITORY}/{lock.sha256[:12]}:{os.getpid()}-")]
    assert report.smoke.ok and not report.smoke.cached and len(held) == 1, seen
    assert report.image in engine.inspect(report.image_id).tags and hold_names(engine) == []


def test_bumping_the_application_pin_rebuilds_only_the_last_layers(engine, write_recipe, cleanup):
    name = f"bump-{os.getpid()}"
    recipe = _copy_recipe(write_recipe, name, requirements_extra='  "six==1.16.0",\n')
    first = flows.build(recipe, engine)
    first_layers = engine.inspect(first.image_id).diff_ids
    cleanup.append(first.image_id)
    recipe.write_text(recipe.read_text().replace("six==1.16.0", "six==1.17.0"))
    second = flows.build(recipe, engine, flows.BuildOptions(relock=True))
    cleanup.append(second.image)
    second_layers = engine.inspect(second.image_id).diff_ids
    assert len(first_layers) == len(second_layers)
    # Shared: base, venv, framework (+ toolchain links), kernels. Rebuilt: the application's
    # requirements file and install, then the probe files (they carry the new lock).
    assert first_layers[:-3] == second_layers[:-3]
    assert first_layers[-3] != second_layers[-3] and first_layers[-2] != second_layers[-2]


def test_no_engine_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineUnavailable, match="dockerd"):
        DockerEngine().check()


@pytest.mark.parametrize("gpus", [True, ("0", "1")], ids=["all", "by-number"])
def test_gpus_without_an_nvidia_runtime_is_one_clear_error(engine, gpus):
    """This engine has no NVIDIA runtime (no GPU here): asking for GPUs, all or by number, reaches the daemon,
    which refuses it, and the error says what to install."""
    with pytest.raises(EngineUnavailable, match="nvidia-container-toolkit.*--no-gpus"):
        engine.run(read_lock(REPO / "lockfiles" / "cuda-toolchain.lock").base.image_ref, ["true"], gpus=gpus)


def test_pruned_files_never_reach_a_layer_and_leave_a_tombstone(engine, write_recipe, cleanup):
    """markupsafe without its C speedups: the file is removed in the install step, RECORD stays
    true, importing it names the reason, and markupsafe falls back to its pure-Python escape."""
    name = f"prune-{os.getpid()}"
    recipe = _copy_recipe(write_recipe, name, requirements_extra='  "markupsafe==3.0.2",\n')
    recipe.write_text(recipe.read_text() + '\n[[prune]]\npackage = "MarkupSafe"\n'
                      'remove = ["markupsafe/_speedups*.so"]\nreason = "pure-Python escaping is enough here"\n')
    report = flows.build(recipe, engine)
    cleanup.append(report.image)
    assert report.smoke.ok
    assert engine.inspect(report.image).labels["io.imagebuild.pruned"] == "markupsafe"
    script = (
        "import base64, csv, hashlib, importlib.metadata as m, markupsafe\n"
        "d = m.distribution('markupsafe')\n"
        "bad = [str(f) for f in d.files if f.hash and base64.urlsafe_b64encode(hashlib.sha256("
        "f.locate().read_bytes()).digest()).rstrip(b'=').decode() != f.hash.value]\n"
        "print(markupsafe._escape_inner.__module__, bad, markupsafe.escape('<a>'))\n"
        "try:\n    import markupsafe._speedups\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    done = engine.run(report.image, ["python", "-c", script])
    assert done.exit_code == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert first == "markupsafe._native [] &lt;a&gt;"
    assert second.startswith("ImportError: markupsafe/_speedups.") and "pure-Python escaping" in second
    # Removed in the step that installed it: no layer of the image carries the library.
    seen: list[str] = []
    strays: list[str] = []
    with engine.save(report.image) as stream, tarfile.open(fileobj=stream, mode="r|") as saved:
        for member in saved:
            if member.isfile() and member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=saved.extractfile(member), mode="r|") as layer:
                    for entry in layer:
                        seen += [entry.name] if "markupsafe" in entry.name else []
                        strays += [entry.name] if entry.name.startswith("run/") and not entry.isdir() else []
    assert any(n.endswith("markupsafe/_speedups.py") for n in seen)  # the layer that installed it was read
    assert not [n for n in seen if "_speedups" in n and n.endswith(".so")]
    # The pruner runs from a bind mount under /run/imagebuild and leaves no bytecode of itself there.
    assert strays == []


def test_a_failed_build_step_is_one_error_naming_the_step_and_its_cause(engine, write_recipe):
    """A [[prune]] glob that matches nothing in the release stops its install step: `build` says which
    table and why, in text and in JSON, exits 1, and tags nothing."""
    name = f"failed-step-{os.getpid()}"
    recipe = _copy_recipe(write_recipe, name, requirements_extra='  "markupsafe==3.0.2",\n')
    recipe.write_text(recipe.read_text() + '\n[[prune]]\npackage = "markupsafe"\n'
                      'remove = ["markupsafe/_no_such_module*.so"]\nreason = "a glob that matches nothing"\n')
    ref = f"imagebuild-test/{name}:1"
    command = [sys.executable, "-m", "imagebuild", "build", str(recipe), "--tag", ref, "--no-smoke"]
    as_json = subprocess.run(command + ["--json"], capture_output=True, text=True)
    assert as_json.returncode == 1, as_json.stderr[-2000:]
    error = json.loads(as_json.stdout)
    assert error["error"] == "BuildFailed" and error["ok"] is False
    assert error["message"].startswith("[[prune]] failed in the application layer: prune: error: [[prune]] remove "
                                       "'markupsafe/_no_such_module*.so' matches no file of MarkupSafe 3.0.2")
    assert "prune.py" in error["step"]["instruction"] and error["step"]["exit_code"] == 1
    as_text = subprocess.run(command, capture_output=True, text=True)
    assert as_text.returncode == 1 and "Traceback" not in as_text.stderr
    assert "error: [[prune]] failed in the application layer: prune: error:" in as_text.stderr
    assert engine.inspect(ref) is None


class CountingEngine(DockerEngine):
    """The real Docker engine, counting the builds it is asked for."""

    builds = 0

    def build(self, *args, **kwargs):
        self.builds += 1
        return super().build(*args, **kwargs)


def test_an_image_from_the_same_lock_is_reused_without_a_build_and_rebuild_forces_one(engine, cleanup):
    first = flows.build(RECIPE, engine, flows.BuildOptions(tag=f"imagebuild-test/reuse-a:{os.getpid()}"))
    cleanup.append(first.image)
    counting = CountingEngine()
    second = flows.build(RECIPE, counting, flows.BuildOptions(tag=f"imagebuild-test/reuse-b:{os.getpid()}"))
    cleanup.append(second.image)
    assert (second.reused, counting.builds, second.image_id) == (True, 0, first.image_id)
    assert second.smoke.cached and "build" not in second.seconds  # the smoke result on record for the id
    assert engine.inspect(second.image).labels["io.imagebuild.lock.sha256"] == read_lock(
        REPO / "lockfiles" / "cuda-toolchain.lock").sha256
    third = flows.build(RECIPE, counting, flows.BuildOptions(tag=f"imagebuild-test/reuse-c:{os.getpid()}", rebuild=True))
    cleanup.append(third.image)
    assert (third.reused, counting.builds) == (False, 1)


def test_a_changed_lock_is_not_reused(engine, write_recipe, cleanup):
    recipe = _copy_recipe(write_recipe, f"reuse-env-{os.getpid()}", env_extra='IMAGEBUILD_TEST_MARK = "1"\n')
    counting = CountingEngine()
    report = flows.build(recipe, counting, flows.BuildOptions(run_smoke=False))
    cleanup.append(report.image)
    assert (report.reused, counting.builds) == (False, 1)


def _docker(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["/usr/bin/docker", *args], input=stdin, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_derived_image_carrying_the_lock_label_is_never_reused(engine, cleanup, tmp_path, monkeypatch):
    """Docker copies labels into every image made FROM an image or committed from it: the label says
    which lock an image descends from, not that the lock built it. Only the image on record is reused."""
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    real = flows.build(RECIPE, engine, flows.BuildOptions(tag=f"imagebuild-test/reuse-real:{os.getpid()}", run_smoke=False))
    cleanup.append(real.image)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {real.image}\nRUN echo app > /opt/app.txt\n")
    derived = f"imagebuild-test/reuse-derived:{os.getpid()}"
    _docker("build", "-q", "-t", derived, str(tmp_path / "ctx"))
    cleanup.append(derived)
    container = _docker("create", real.image, "true")
    committed = f"imagebuild-test/reuse-committed:{os.getpid()}"
    try:
        _docker("commit", container, committed)
    finally:
        _docker("rm", container)
    cleanup.append(committed)
    impostors = {engine.inspect(derived).id, engine.inspect(committed).id}
    for ref in (derived, committed):  # the negative control: both carry the label, and are newer
        assert engine.inspect(ref).labels["io.imagebuild.lock.sha256"] == lock.sha256
    assert engine.find_labelled("io.imagebuild.lock.sha256", lock.sha256) in impostors

    messages: list[str] = []
    again = flows.build(RECIPE, CountingEngine(), flows.BuildOptions(tag=f"imagebuild-test/reuse-again:{os.getpid()}",
                           run_smoke=False, progress=messages.append))
    cleanup.append(again.image)
    assert again.reused and again.image_id == real.image_id and again.image_id not in impostors

    # With nothing on record (another machine's cache), the label alone reuses nothing: it builds.
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "other-cache"))
    counting, messages = CountingEngine(), []
    fresh = flows.build(RECIPE, counting, flows.BuildOptions(tag=f"imagebuild-test/reuse-fresh:{os.getpid()}", run_smoke=False,
                           progress=messages.append))
    cleanup.append(fresh.image)
    assert (fresh.reused, counting.builds) == (False, 1) and fresh.image_id not in impostors
    assert any("carries this lock's label but is not one built here" in m for m in messages)


def test_a_check_that_ends_unknown_stops_the_tag_unless_accepted_by_name(engine, write_recipe, cleanup, monkeypatch):
    """deep_gemm's tier ends `unknown` when it cannot read the release (here: its headers are removed
    after install by a [[prune]] of the recipe's own): no tag, unless the recipe or the caller accepts it."""
    name = f"unknown-{os.getpid()}"
    prune = '\n[[prune]]\npackage = "sgl-deep-gemm"\nremove = ["deep_gemm/include/**"]\nreason = "test"\n'
    recipe = _copy_recipe(write_recipe, name)
    recipe.write_text(recipe.read_text() + prune)
    ref = f"imagebuild-test/{name}:13.0"
    with pytest.raises(SmokeFailed) as failed:
        flows.build(recipe, engine, flows.BuildOptions(tag=ref))
    unknown = [c["name"] for c in failed.value.report["checks"] if c["status"] == "unknown"]
    assert unknown and all(c["status"] != "fail" for c in failed.value.report["checks"]), failed.value.report
    assert f"accept_unknown = {json.dumps(unknown)}" in str(failed.value) and engine.inspect(ref) is None

    accepted = flows.build(recipe, engine, flows.BuildOptions(tag=ref, accept_unknown=True))
    cleanup.append(accepted.image)
    assert accepted.accepted_unknown == unknown and engine.inspect(ref) is not None
    engine.remove(ref)
    recipe.write_text(recipe.read_text().replace("[env]\n", f"[smoke]\naccept_unknown = {json.dumps(unknown)}\n\n[env]\n"))
    by_name = flows.build(recipe, engine, flows.BuildOptions(tag=ref))
    assert by_name.accepted_unknown == unknown and by_name.to_dict()["accepted_unknown"] == unknown


def test_a_smoke_pass_on_record_is_one_images_with_or_without_gpus(engine, cleanup, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    first = flows.build(RECIPE, engine, flows.BuildOptions(tag=f"imagebuild-test/smoke-key:{os.getpid()}", gpus=False))
    cleanup.append(first.image)
    assert first.smoke.ok and not first.smoke.cached
    assert flows.smoke(first.image, engine, use_cache=True, gpus=False).cached
    with_gpus = flows.smoke_cache_path(first.image_id, True)  # None where nvidia-smi lists no GPU (here)
    assert with_gpus != flows.smoke_cache_path(first.image_id, False)
    assert with_gpus is None or not with_gpus.exists()  # a pass without GPUs says nothing of them
    rebuilt = flows.build(RECIPE, engine, flows.BuildOptions(tag=f"imagebuild-test/smoke-key:{os.getpid()}", gpus=False, rebuild=True))
    assert not rebuilt.reused and not rebuilt.smoke.cached  # --rebuild runs the smoke test again
