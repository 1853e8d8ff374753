"""The reproducibility promise, end to end on the real engine: two builds of the committed lock, the
second as on a fresh machine (a private engine of this module's own, empty builder cache and image
store: tests/engine_daemon.py; an empty imagebuild cache; no relock), give one OCI manifest digest; a step that writes the date is caught and named; a changed file fails
verify; buildah builds the same context.

Every image made in the session's engine has a tag with this process's id and is removed at the end;
the fresh engine goes with everything in it. Nothing of the session engine's builder cache is pruned.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagebuild.bootstrap import ensure_base_image
from imagebuild.cli import app as cli
from imagebuild.engine.docker import DockerEngine
from imagebuild.errors import EngineUnavailable, ToolMissing
from imagebuild.image import export, oci
from imagebuild.image.layout import read_image
from imagebuild.lock import ensure_fresh, read_lock, uv_binary
from imagebuild.render import template_sha256
from imagebuild import flows
from imagebuild.flows import ca_bundle, smoke
from imagebuild.recipe.model import load_recipe
from imagebuild.render import render_context, site_packages
from tests.conftest import cannot_run, needs_module

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "cuda-toolchain.toml"
LOCK = ROOT / "lockfiles" / "cuda-toolchain.lock"
REPO = f"imagebuild-test/repro-{os.getpid()}"


@dataclass
class Build:
    ref: str
    image_id: str
    seconds: float
    layout: export.LayoutResult


@dataclass
class Builds:
    a: Build
    b: Build
    tmp: Path
    cache: export.LayerCache
    lock: Path  # a copy of the lock they were built from: others may relock meanwhile
    fresh: "pipeline.BuildReport"  # b's build report
    messages: list[str]  # b's progress


def run_cli(argv: list[str], monkeypatch, capsys) -> tuple[int, dict]:
    monkeypatch.setattr(cli, "EXTENSIONS", tuple(dict.fromkeys(cli.EXTENSIONS + ("imagebuild.cli.repro",))))
    capsys.readouterr()
    code = cli.main(argv + ["--json"])
    return code, json.loads(capsys.readouterr().out)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def engine():
    docker = DockerEngine()
    try:
        docker.check()
    except (EngineUnavailable, ToolMissing) as err:
        cannot_run(str(err), "scripts/host.sh installs docker.io and starts dockerd")
    return docker


@pytest.fixture(scope="module")
def fresh_engine(fresh_runner_for_module):
    """Where a build runs cold: a second engine, nothing in its builder cache or store."""
    return DockerEngine(host=fresh_runner_for_module.host)


def test_a_missing_image_is_bad_input_not_a_traceback(engine, monkeypatch, capsys, tmp_path):
    for argv in (["verify", f"{REPO}:missing", "--lock", str(LOCK)],
                 ["export-oci", f"{REPO}:missing", "-o", str(tmp_path / "x")]):
        code, report = run_cli(argv, monkeypatch, capsys)
        assert code == 2 and "no image" in report["message"]
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def made(engine):
    refs: list[str] = []
    yield refs
    for ref in reversed(refs):
        engine.remove(ref)


def build_tagged(engine, context: Path, ref: str, made: list[str]) -> tuple[str, float]:
    started = time.monotonic()
    bundle = ca_bundle()
    image_id = engine.build(context, secrets={"ca": bundle} if bundle else {})
    engine.tag(image_id, ref)
    made.append(ref)
    return image_id, time.monotonic() - started


@pytest.fixture(scope="module")
def builds(engine, fresh_engine, made, tmp_path_factory) -> Builds:
    """a: the committed lock rendered and built on the session's engine. b: `build` of the same
    committed lock, no relock, as on a fresh machine: a private engine (no image, no builder cache)
    and an empty imagebuild cache, so its base is bootstrapped from .debs fetched anew."""
    tmp = tmp_path_factory.mktemp("repro")
    lock_path = tmp / LOCK.name
    shutil.copyfile(LOCK, lock_path)
    recipe, lock = load_recipe(RECIPE), read_lock(lock_path)
    ensure_fresh(lock, recipe, lock_path, template_sha256=template_sha256())
    contexts = [render_context(lock, recipe, tmp / f"context-{n}", uv_path=uv_binary(),
                               lock_text=lock_path.read_text()) for n in "ab"]
    assert tree(contexts[0]) == tree(contexts[1]), "rendering the same lock twice gave two contexts"
    cache = export.LayerCache(tmp / "cache" / "oci")
    ensure_base_image(lock.base, recipe.base, engine)
    image_id, seconds = build_tagged(engine, contexts[0], f"{REPO}:a", made)
    a = Build(f"{REPO}:a", image_id, seconds, export.export_layout(engine, f"{REPO}:a", tmp / "layout-a", cache=cache))

    messages: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMAGEBUILD_CACHE", str(tmp / "empty-imagebuild-cache"))
        started = time.monotonic()
        report = flows.build(RECIPE, fresh_engine, flows.BuildOptions(lock_path=lock_path, tag=f"{REPO}:b", rebuild=True,
                                progress=messages.append))
        seconds = time.monotonic() - started
    b = Build(report.image, report.image_id, seconds,
              export.export_layout(fresh_engine, report.image, tmp / "layout-b", cache=cache))
    for one in (a, b):
        print(f"\nREPRO {one.ref}: built in {one.seconds:.1f} s (docker id {one.image_id[:19]}), exported in "
              f"{one.layout.seconds:.1f} s: manifest {one.layout.manifest_digest}")
    return Builds(a, b, tmp, cache, lock_path, report, messages)


def test_the_committed_lock_builds_and_smokes_on_a_fresh_machine(builds, fresh_engine):
    lock = read_lock(builds.lock)
    report = builds.fresh
    assert not report.reused and report.smoke.ok and not report.smoke.cached
    fetched = f"fetching {len(lock.base.debs)} of {len(lock.base.debs)} locked .debs"
    assert any(m.startswith(fetched) for m in builds.messages), builds.messages  # nothing came from a cache
    base = fresh_engine.inspect(lock.base.image_ref)
    assert base is not None and list(base.diff_ids) == [f"sha256:{lock.base.rootfs_sha256}"]
    print(f"\nFRESH {len(lock.base.debs)} .debs fetched and bootstrapped to rootfs {lock.base.rootfs_sha256[:16]}…; "
          f"{sum(1 for c in report.smoke.report['checks'] if c['status'] == 'pass')} smoke checks passed")


def test_two_builds_of_one_lock_give_one_manifest_digest(builds):
    a, b = builds.a.layout, builds.b.layout
    assert a.diff_ids == b.diff_ids
    assert a.manifest_digest == b.manifest_digest
    assert a.config_digest == b.config_digest
    assert builds.a.image_id != builds.b.image_id  # Docker's own id is not part of the promise
    assert len(a.diff_ids) == 8


@pytest.mark.needs_tool("oci-image-tool", package="oci-image-tool")
def test_the_layout_is_a_standard_oci_layout(builds):
    check = subprocess.run(["oci-image-tool", "validate", "--type", "image", str(builds.a.layout.path)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    if shutil.which("umoci"):
        stat = subprocess.run(["umoci", "stat", "--json", "--image", f"{builds.a.layout.path}:a"],
                              capture_output=True, text=True)
        assert stat.returncode == 0, stat.stderr
        assert len([h for h in json.loads(stat.stdout)["history"] if not h.get("empty_layer")]) == 8


def test_the_image_verifies_against_its_lock(builds, monkeypatch, capsys):
    code, report = run_cli(["verify", builds.a.ref, "--lock", str(builds.lock)], monkeypatch, capsys)
    assert code == 0 and report["ok"], report["mismatches"]
    assert report["checked"]["packages"] == 7 and report["checked"]["files"] > 1000


def test_sbom_of_the_layout_is_attached(builds, monkeypatch, capsys):
    validation = needs_module("cyclonedx.validation.json")
    from cyclonedx.schema import SchemaVersion
    out = builds.tmp / "b.cdx.json"
    code, report = run_cli(["sbom", f"oci:{builds.b.layout.path}", "-o", str(out)], monkeypatch, capsys)
    assert code == 0 and report["attached"]
    assert validation.JsonStrictValidator(SchemaVersion.V1_5).validate_str(out.read_text()) is None
    document = json.loads(out.read_text())
    assert document["metadata"]["component"]["hashes"][0]["content"] == \
        builds.b.layout.manifest_digest.split(":")[1]
    assert read_image(builds.b.layout.path).manifest_digest == builds.b.layout.manifest_digest


def test_a_step_that_writes_the_date_is_caught_and_named(engine, fresh_engine, builds, made, monkeypatch, capsys):
    context = builds.tmp / "dated"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {builds.a.ref}\nRUN date +%s%N > /opt/stamp && "
                                        "echo stable > /opt/stable\n")
    # The second build runs where this step never ran, FROM the fresh engine's own build of the lock
    # (layer for layer a's, as the first test shows) under a's name.
    fresh_engine.tag(builds.b.image_id, builds.a.ref)
    layouts = []
    for name, where, owned in (("dated-1", engine, made), ("dated-2", fresh_engine, [])):
        ref = f"{REPO}:{name}"
        build_tagged(where, context, ref, owned)
        layouts.append(export.export_layout(where, ref, builds.tmp / name, cache=builds.cache))
    one, two = layouts
    assert one.diff_ids[:-1] == two.diff_ids[:-1] == builds.a.layout.diff_ids
    assert one.diff_ids[-1] != two.diff_ids[-1] and one.manifest_digest != two.manifest_digest
    code, report = run_cli(["diff", f"oci:{one.path}", f"oci:{two.path}"], monkeypatch, capsys)
    assert code == 1 and report["total"] == 1
    assert [(d["path"], d["differs"]) for d in report["differences"]] == [("/opt/stamp", ["content"])]


def test_a_changed_installed_file_fails_verify(engine, builds, made, monkeypatch, capsys):
    target = f"{site_packages(read_lock(builds.lock))}/deep_gemm/__init__.py"
    context = builds.tmp / "tampered"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {builds.a.ref}\nRUN echo '# changed' >> {target}\n")
    ref = f"{REPO}:tampered"
    build_tagged(engine, context, ref, made)
    code, report = run_cli(["verify", ref, "--lock", str(builds.lock)], monkeypatch, capsys)
    assert code == 1 and not report["ok"]
    assert [(m["what"], m["subject"]) for m in report["mismatches"]] == [("file", target)]


@pytest.mark.needs_tool("buildah", package="buildah")
def test_buildah_builds_the_same_context_and_it_verifies(builds, tmp_path):
    from imagebuild.engine.buildah import BuildahEngine
    buildah = BuildahEngine()
    recipe, lock = load_recipe(RECIPE), read_lock(builds.lock)
    had_base = buildah.image_exists(lock.base.image_ref)
    ensure_base_image(lock.base, recipe.base, buildah)
    ref = f"localhost/{REPO}:buildah"
    try:
        image_id, seconds = build_tagged(buildah, builds.tmp / "context-a", ref, [])
        report = smoke(ref, buildah, gpus=False)
        assert report.ok, report.report
        layout = export.export_layout(buildah, ref, tmp_path / "layout", cache=False)
        same = [i for i, (x, y) in enumerate(zip(layout.diff_ids, builds.a.layout.diff_ids)) if x == y]
        print(f"\nREPRO buildah: built in {seconds:.1f} s, manifest {layout.manifest_digest}; "
              f"layers equal to docker's: {same} of {len(layout.diff_ids)}")
        from imagebuild.image.verify import verify_image
        verified = verify_image(buildah, f"oci:{layout.path}", builds.lock)
        assert verified.ok, verified.mismatches
    finally:
        buildah.remove(ref)
        if not had_base:
            buildah.remove(lock.base.image_ref)


@pytest.mark.needs_tool("buildah", package="buildah")
def test_buildah_engine_contract_on_a_tiny_image(tmp_path):
    import tarfile

    from imagebuild.engine.buildah import BuildahEngine
    buildah = BuildahEngine()
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx/Dockerfile").write_text("FROM scratch\nCOPY a /etc/a\nLABEL x=1\n")
    (tmp_path / "ctx/a").write_text("hi\n")
    ref = f"localhost/{REPO}:tiny"
    image_id = buildah.build(tmp_path / "ctx")
    buildah.tag(image_id, ref)
    try:
        info = buildah.inspect(ref)
        assert info.id == image_id and info.labels["x"] == "1" and len(info.diff_ids) == 1
        with buildah.export_rootfs(ref) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            assert {m.name: m.mtime for m in tar} == {"etc": oci.REPRO_EPOCH, "etc/a": oci.REPRO_EPOCH}
        layout = export.export_layout(buildah, ref, tmp_path / "layout", cache=False)
        assert read_image(layout.path).config["config"]["Labels"]["x"] == "1"
    finally:
        buildah.remove(ref)
    assert buildah.inspect(ref) is None
