"""[aot] against the newest FlashInfer release, and the kernel step's cache and repeatability, on one shape.

The step asks FlashInfer 0.7.4 (the newest on the index; the flagship's SGLang pins 0.7.2) for a shape's
modules, compiles them, and the smoke proof loads them from FlashInfer's AOT folder with JIT disabled and
nvcc hidden, while an undeclared shape misses. The previous release (0.7.1, with SGLang 0.5.22) is built by
test_gallery's pin move, the pinned one by test_flagship. On the same image: a library-only pin move reruns
the kernel step and compiles nothing (the kernel cache); an empty kernel cache of its own is seeded from the
image in a registry (a fresh runner's --cache-from) and compiles nothing; and the step run again on an empty
kernel cache compiles the module again to the same bytes, so the image's layers are the same.
Slow: a real build with torch and one prefill module compiled for sm_120f (about 2 min on 2 cores), twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tomllib
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.engine import BuildCache
from imagebuild.image import export
from imagebuild.image.layout import layer_stream, read_image
from imagebuild.image.oci import blob_path
from imagebuild.flows.kernels import KernelStepWatch
from imagebuild.lock import read_lock, uv_binary
from imagebuild.flows import ca_bundle
from imagebuild.registry import Connection, PushOptions, push
from imagebuild.recipe.model import load_recipe
from imagebuild.render import AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID, render_context
from imagebuild.render.paths import OWN_STEP
from tests import registry_server

REPO = Path(__file__).resolve().parents[2]
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
  "flashinfer-python=={version}",{extra}{framework}
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
{prune}
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


def flagship_framework() -> tuple[str, str]:
    """The flagship's framework layer as requirement lines and [[prune]] entries for RECIPE: the same wheels,
    pruned the same way, below the same base, make the same layer, so the engine installs and commits torch and
    its CUDA libraries (4 GB) once for the flagship and these images (torchvision, torchaudio and the libraries
    SGLang pulls in are in it), and a pin move of the flagship moves this recipe's layer with it."""
    lock = read_lock(REPO / "lockfiles" / "sglang-blackwell.lock")
    framework = [w for w in lock.wheels if w.layer == "framework"]
    names = {w.name for w in framework}
    pins = "".join(f'\n  "{w.name}=={w.version}",' for w in framework if w.name not in ("torch", "cuda-toolkit"))
    flagship = tomllib.loads((REPO / "recipes" / "sglang-blackwell.toml").read_text())
    prune = "".join(f"\n[[prune]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items())
                    for entry in flagship.get("prune", []) if entry["package"] in names)
    return pins, prune


def recipe_text(slug: str, extra: str = "") -> str:
    """RECIPE on FlashInfer NEWEST, with the flagship's framework layer."""
    pins, prune = flagship_framework()
    return RECIPE.format(slug=slug, version=NEWEST, extra=extra, framework=pins, prune=prune,
                         patch=REPO / "recipes" / "patches" / "flashinfer-cuda-version.patch")


def write(folder: Path, slug: str, extra: str = "", env: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"flashinfer-{slug}.toml"
    recipe.write_text(recipe_text(slug, extra) + env)
    return recipe


def manifest_of(engine, image: str) -> dict:
    return json.loads(engine.run(image, ["cat", AOT_MANIFEST]).stdout)


@pytest.fixture(scope="module")
def newest(engine, tmp_path_factory):
    """The one-shape recipe on FlashInfer 0.7.4, built (never reused by lock) and smoke-tested, then removed."""
    slug = NEWEST.replace(".", "-") + f"-{os.getpid()}"
    recipe = write(tmp_path_factory.mktemp("newest") / "recipes", slug)
    report = flows.build(recipe, engine, flows.BuildOptions(tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}", relock=True,
                            rebuild=True))
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


def private_mount(name: str) -> tuple[str, str]:
    """A kernel cache mount of this module's own (empty): its id, and its folder, which names it in the
    engine's list of mounts."""
    return f"imagebuild-test-kernels-{name}-{os.getpid()}", f"{KERNEL_CACHE_DIR}-test-{name}-{os.getpid()}"


def build_on_mount(engine, newest, folder: Path, mount: tuple[str, str]) -> tuple[str, dict]:
    """The fixture's lock built again with its kernel cache mount renamed to `mount`: the kernel step reruns
    (its Dockerfile line is new); every other step is the same. Returns (image id, the step's stats)."""
    recipe_path, first = newest
    recipe, lock = load_recipe(recipe_path), read_lock(Path(first.lock_path))
    context = render_context(lock, recipe, folder / "context", uv_path=uv_binary(),
                             lock_text=Path(first.lock_path).read_text())
    dockerfile = context / "Dockerfile"
    text = dockerfile.read_text()
    assert text.count(f"id={KERNEL_CACHE_ID},") == 1 and text.count(KERNEL_CACHE_DIR) == 2
    dockerfile.write_text(text.replace(f"id={KERNEL_CACHE_ID},", f"id={mount[0]},").replace(KERNEL_CACHE_DIR, mount[1]))
    watch = KernelStepWatch(lambda _: None)
    bundle = ca_bundle()
    image_id = engine.build(context, secrets={"ca": bundle} if bundle else {}, progress=watch)
    return image_id, watch.report(lambda: None)


def remove_mount(engine, mount: tuple[str, str]) -> None:
    for found in engine.cache_mounts(OWN_STEP):
        if f"cached mount {mount[1]} " in found["description"]:
            engine.remove_cache_mount(found["id"])


@pytest.fixture(scope="module")
def cold(engine, newest, tmp_path_factory):
    """The fixture's lock built again on an empty kernel cache of its own: the step compiles. Yields (ref, stats)."""
    mount = private_mount("cold")
    image_id, stats = build_on_mount(engine, newest, tmp_path_factory.mktemp("cold"), mount)
    ref = f"imagebuild-test/flashinfer-aot-cold:{os.getpid()}"
    engine.tag(image_id, ref)
    yield ref, stats
    engine.remove(ref)
    remove_mount(engine, mount)


# zstd: the 4 GB layout is written in two thirds of gzip's time here, and the seed reads a kernel layer pushed
# with --compression zstd as a runner's cache made that way holds it.
LAYOUT_COMPRESSION = "zstd"


@pytest.fixture(scope="module")
def newest_layout(engine, newest, tmp_path_factory):
    """The fixture's image as an OCI layout (imagebuild's own export, zstd, its layers kept in the cache)."""
    folder = tmp_path_factory.mktemp("layout")
    yield export.export_layout(engine, newest[1].image, folder / "newest", compression=LAYOUT_COMPRESSION)
    shutil.rmtree(folder, ignore_errors=True)


def test_an_empty_kernel_cache_takes_the_kernels_of_the_registry_build_cache(engine, newest, newest_layout, tmp_path):
    """A fresh runner: the previous run left its smoke-tested image in a registry (--cache-to pushes it, with
    BuildKit's cache metadata beside what is read here: the history and the layers); the next build's kernel
    cache is empty (a mount of its own), and is seeded from that image's [aot] layer before the step runs,
    which then compiles nothing. The negative control is `cold` below: the same build on an empty mount
    compiles one."""
    _, first = newest
    (before,) = manifest_of(engine, first.image)["artifacts"]
    server = registry_server.start_registry(tmp_path / "registry")
    mount = private_mount("seeded")
    image_id = None
    try:
        target = f"{server.host}/team/flashinfer-aot:buildcache"
        push(newest_layout.path, target, Connection(insecure_http=True), PushOptions(remember=False))
        # A gallery's sibling recipe with the same kernel left its cache under a tag of its own (the workflow's
        # buildcache-<recipe>-<ref>): the runner seeds from the union, the same key taken once.
        sibling = f"{server.host}/team/flashinfer-aot:buildcache-sibling"
        push(newest_layout.path, sibling, Connection(insecure_http=True), PushOptions(remember=False))
        missing = f"{server.host}/team/flashinfer-aot:buildcache-none"  # a first run's reference: skipped
        seeded = flows.seed_kernels(read_lock(Path(first.lock_path)),
                                    BuildCache(sources=(missing, target, sibling), insecure_http=True), engine, None,
                                    mount=mount, connection=Connection(insecure_http=True))
        taken = seeded["taken"]
        assert [(t["source"], t["flashinfer"], t["refused"], t["given_already"]) for t in taken] == [
            (target, 1, [], 0), (sibling, 1, [], 1)], seeded
        assert seeded["added"] == {"flashinfer": 1, "sglang": 0, "present": 0, "refused": 0}, seeded
        assert [t["source"] for t in seeded["tried"]] == [missing] and "no image" in seeded["tried"][0]["why"]
        assert 0 < taken[0]["bytes"] < 64 << 20  # one layer read, not the image
        assert {layer.media_type for layer in newest_layout.layers} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
        image_id, stats = build_on_mount(engine, newest, tmp_path, mount)
        assert stats["step"] == "ran" and stats["compiled"] == 0 and stats["reused"] == 1, stats
        (artifact,) = manifest_of(engine, image_id)["artifacts"]
        assert (artifact["key"], artifact["sha256"]) == (before["key"], before["sha256"])
    finally:
        server.stop()
        shutil.rmtree(tmp_path / "registry", ignore_errors=True)  # gigabytes of blobs: the suite's disk is not free
        if image_id:
            engine.remove(image_id)
        remove_mount(engine, mount)


def test_on_an_empty_kernel_cache_the_step_compiles_the_same_module(engine, newest, cold):
    ref, stats = cold
    assert stats["step"] == "ran" and stats["compiled"] == 1 and stats["reused"] == 0, stats
    (artifact,) = manifest_of(engine, ref)["artifacts"]
    (before,) = manifest_of(engine, newest[1].image)["artifacts"]
    assert (artifact["name"], artifact["key"], artifact["sass"]) == (before["name"], before["key"], before["sass"])


def layer_entries(layout, index: int) -> dict:
    """Every entry of one layer of an OCI layout: name -> (type, mode, mtime, owner, sha256 of the bytes, link)."""
    image = read_image(layout.path)
    with layer_stream(image, image.layers[index]) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        return {m.name: (m.type, m.mode, m.mtime, m.uid, m.gid, m.linkname,
                         hashlib.sha256(tar.extractfile(m).read()).hexdigest() if m.isfile() else None) for m in tar}


SECTION_DIGESTS = ("import hashlib, json, sys; sys.path.insert(0, '/opt/imagebuild/probe.pyz'); "
                   "from imagebuild_probe.waste import elf_sections; data = open(sys.argv[1], 'rb').read(); "
                   "print(json.dumps({n: hashlib.sha256(data[o:o + z]).hexdigest() "
                   "for n, (o, z) in elf_sections(sys.argv[1]).items()}))")


def differing_sections(engine, image_a: str, image_b: str, path: str) -> list[str]:
    """The ELF sections in which one file of two images differs, read in each image by the probe's reader."""
    a, b = (json.loads(engine.run(image, ["python", "-c", SECTION_DIGESTS, path]).stdout) for image in (image_a, image_b))
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def test_two_cold_compiles_give_the_same_bytes_and_image_digest(engine, newest, newest_layout, cold, tmp_path,
                                                                 request):
    """The fixture's module (compiled by its build, or by an earlier run's: the kernel cache) and the one compiled
    again on an empty cache, in another build step: the same bytes, so the same layers, and the same image but
    for the one history line that names this test's own cache mount. The negative controls are
    tests/payload/test_kernel_cache.py's (the process id, the source's modification time)."""
    ref, stats = cold
    assert stats["compiled"] == 1
    (artifact,) = manifest_of(engine, ref)["artifacts"]
    (before,) = manifest_of(engine, newest[1].image)["artifacts"]
    if artifact["sha256"] != before["sha256"]:
        sections = differing_sections(engine, newest[1].image, ref, artifact["path"])
        pytest.fail(f"{artifact['name']}: two cold compiles differ in {', '.join(sections)}")
    a, b = newest_layout, export.export_layout(engine, ref, tmp_path / "layout-cold", compression=LAYOUT_COMPRESSION)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path / "layout-cold", ignore_errors=True))
    assert len(a.diff_ids) == len(b.diff_ids) > 5
    mount_id, mount_dir = private_mount("cold")
    # The kernel step's layer keeps its cache mount's target as an empty folder: this test's mount has a name
    # of its own, and that one name is all that may differ; every other layer is the same bytes.
    differ = [i for i, (x, y) in enumerate(zip(a.diff_ids, b.diff_ids)) if x != y]
    assert len(differ) <= 1, differ
    for index in differ:
        ours = {name.replace(mount_dir.lstrip("/"), KERNEL_CACHE_DIR.lstrip("/")): entry
                for name, entry in layer_entries(b, index).items()}
        assert ours == layer_entries(a, index)
    configs = [json.loads(blob_path(layout.path, layout.config_digest).read_text()) for layout in (a, b)]
    history = [[step.get("created_by", "") for step in config["history"]] for config in configs]
    moved = [i for i, (x, y) in enumerate(zip(*history)) if x != y]
    assert len(moved) == 1 and "kernels_aot.py build" in history[0][moved[0]], moved
    assert history[1][moved[0]].replace(mount_id, KERNEL_CACHE_ID).replace(mount_dir, KERNEL_CACHE_DIR) == history[0][moved[0]]
    configs[1]["history"][moved[0]] = configs[0]["history"][moved[0]]
    configs[1]["rootfs"] = configs[0]["rootfs"]  # its one other layer differs by the mount's folder name alone
    assert configs[0] == configs[1]  # so with the default mount, the same config: the same manifest digest


# Last in this file: its kernel step takes the engine's shared kernel cache mount (sharing=locked), which the
# flagship's compile holds for minutes when both files start together on the two workers; run first, it
# waited out that compile (256 s of its 264 s, 2026-12-07). The tests above use mounts of their own.
def test_a_library_only_pin_move_reruns_the_kernel_step_and_compiles_nothing(engine, newest, tmp_path):
    _, first = newest
    slug = NEWEST.replace(".", "-") + f"-six-{os.getpid()}"
    # This run's own value below the kernel step too, so an engine that built this move before (a warm CI
    # machine) cannot take the step from its builder cache: the step must run to show the kernel cache.
    recipe = write(tmp_path / "recipes", slug, LIBRARY_ONLY, env=f'IMAGEBUILD_TEST_RUN = "{os.getpid()}"\n')
    report = flows.build(recipe, engine, flows.BuildOptions(tag=f"imagebuild-test/flashinfer-aot-{slug}:{NEWEST}", relock=True,
                            rebuild=True, run_smoke=False))
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
