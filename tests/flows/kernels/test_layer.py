"""Reading a registry build cache's kernel layer (flows/kernels/layer.py): which layer, what is taken from it,
and that no reply, config or tar stream ends in a traceback. The positive path on a real [aot] image pushed
to a real registry is tests/slow/test_zero_jit_releases.py (an empty kernel cache seeded, nothing compiled)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from imagebuild.flows.kernels.layer import (KernelLayer, STEP_MARK, entry_names, find_kernel_layer, lay_out, merge_entries,
                                            read_kernel_layer)
from imagebuild.registry import Connection
from tests.conftest import cannot_run
from tests.json_fuzz import json_values, replace_one_field
from tests.registry_server import start_registry

MANIFEST = "/opt/imagebuild/kernels.json"
MODULE = b"\x7fELF a module"
KEY = "c" * 64


def image(steps: list[str]) -> tuple[dict, dict]:
    layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": f"sha256:{i:064x}", "size": 10 + i}
              for i in range(len(steps))]
    history = [{"created_by": "ENV A=1", "empty_layer": True}] + [{"created_by": step} for step in steps]
    return {"layers": layers}, {"history": history}


def test_the_kernel_layer_is_the_one_the_aot_step_made():
    manifest, config = image(["RUN uv venv", f"RUN set -eu; python -B /run/imagebuild/aot/{STEP_MARK} x y", "COPY probe"])
    assert find_kernel_layer(manifest, config) == manifest["layers"][1]


def test_no_kernel_layer_is_guessed_at():
    manifest, config = image(["RUN uv venv", "COPY probe"])
    assert "no layer" in find_kernel_layer(manifest, config)
    manifest, config = image(["RUN uv venv", STEP_MARK])
    assert "no build history" in find_kernel_layer(manifest, {})
    config["history"].append({"created_by": "RUN one more"})  # history that does not line up with the layers
    assert "do not line up" in find_kernel_layer(manifest, config)
    manifest, config = image([STEP_MARK])
    manifest["layers"][0]["size"] = 5 << 30
    assert "over the" in find_kernel_layer(manifest, config)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_manifest_and_config_give_a_layer_or_a_reason(data):
    manifest, config = image(["RUN uv venv", STEP_MARK])
    replace_one_field(data.draw(st.sampled_from([manifest, config])), data)
    found = find_kernel_layer(manifest, config)
    assert isinstance(found, str) or (isinstance(found, dict) and isinstance(found["digest"], str))
    assert isinstance(find_kernel_layer(data.draw(json_values), data.draw(json_values)), (str, dict))


def layer(files: dict[str, bytes], compress: bool = True) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if compress else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


NAMESPACE = "0123456789abcdef"


def kernel_manifest(sha: str = hashlib.sha256(MODULE).hexdigest(), **changes) -> bytes:
    artifact = {"kind": "flashinfer", "name": "batch_prefill_x", "key": KEY, "sha256": sha,
                "path": "/opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so"}
    return json.dumps({"artifacts": [artifact, {"kind": "sglang", "name": "rope", "path": "/var/cache/sglang/jit/x"}],
                       "sglang_jit_cache_dir": "/var/cache/sglang/jit", "sglang_cache_namespace": NAMESPACE,
                       **changes}).encode()


def test_a_layer_is_laid_out_as_cache_entries(tmp_path):
    blob = layer({"opt/imagebuild/kernels.json": kernel_manifest(),
                  "./opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE,
                  "var/cache/sglang/jit/sm120/rope/deps-1/rope.so": b"\x7fELF rope",
                  "etc/passwd": b"not a kernel"})
    result = lay_out(blob, tmp_path / "out", MANIFEST, KernelLayer("registry/x:y"))
    assert (result.flashinfer, result.sglang, result.refused, result.why) == (1, 1, [], None)
    entry = tmp_path / "out" / "flashinfer" / KEY
    assert (entry / "batch_prefill_x.so").read_bytes() == MODULE
    assert json.loads((entry / "entry.json").read_text())["sha256"] == hashlib.sha256(MODULE).hexdigest()
    assert (tmp_path / "out" / "sglang" / NAMESPACE / "sm120" / "rope" / "deps-1" / "rope.so").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["flashinfer", "sglang"]


def test_two_caches_give_one_union_and_the_same_name_is_taken_once(tmp_path):
    """A gallery's recipes each leave a cache: a runner seeds from all of them. The flagship's layer and a
    sibling's that shares one module (the same key) and one SGLang file, and has a module of its own."""
    other_key, other_module = "b" * 64, b"\x7fELF other module"
    other = {"kind": "flashinfer", "name": "sampling_y", "key": other_key, "sha256": hashlib.sha256(other_module).hexdigest(),
             "path": "/opt/venv/flashinfer/data/aot/sampling_y/sampling_y.so"}
    first = layer({"opt/imagebuild/kernels.json": kernel_manifest(),
                   "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE,
                   "var/cache/sglang/jit/sm120/rope/deps-1/rope.so": b"\x7fELF rope"})
    manifest = json.loads(kernel_manifest())
    manifest["artifacts"].append(other)
    second = layer({"opt/imagebuild/kernels.json": json.dumps(manifest).encode(),
                    "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE,
                    "opt/venv/flashinfer/data/aot/sampling_y/sampling_y.so": other_module,
                    "var/cache/sglang/jit/sm120/rope/deps-1/rope.so": b"\x7fELF rope, the sibling's copy",
                    "var/cache/sglang/jit/sm120/norm/deps-1/norm.so": b"\x7fELF norm"})
    union = tmp_path / "union"
    held = []
    for index, blob in enumerate((first, second)):
        result = lay_out(blob, tmp_path / str(index), MANIFEST, KernelLayer(f"registry/x:{index}"))
        assert result.why is None and result.refused == []
        held.append(merge_entries(tmp_path / str(index), union))
    assert held == [[], [f"flashinfer/{KEY}", f"sglang/{NAMESPACE}/sm120/rope/deps-1/rope.so"]]
    assert entry_names(union) == sorted([f"flashinfer/{KEY}", f"flashinfer/{other_key}"]) + [
        f"sglang/{NAMESPACE}/sm120/norm/deps-1/norm.so", f"sglang/{NAMESPACE}/sm120/rope/deps-1/rope.so"]
    assert (union / "sglang" / NAMESPACE / "sm120" / "rope" / "deps-1" / "rope.so").read_bytes() == b"\x7fELF rope"
    assert (union / "flashinfer" / other_key / "sampling_y.so").read_bytes() == other_module
    assert merge_entries(tmp_path / "nothing-laid-out", union) == []  # a source that gave nothing adds nothing


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sets(st.sampled_from([f"flashinfer/{c * 64}" for c in "abc"] +
                                        [f"sglang/{NAMESPACE}/sm90/{n}.so" for n in ("x", "y", "sub/z")])),
                min_size=1, max_size=4))
def test_any_caches_merge_to_the_union_of_their_names(tmp_path_factory, caches):
    root = tmp_path_factory.mktemp("caches")
    union, seen = root / "union", set()
    for index, names in enumerate(caches):
        for name in names:
            path = root / str(index) / name / "module.so" if name.startswith("flashinfer/") else root / str(index) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{index}".encode())
        assert sorted(merge_entries(root / str(index), union)) == sorted(names & seen)
        seen |= names
    assert sorted(entry_names(union)) == sorted(seen)


def test_a_zstd_kernel_layer_is_laid_out_too_and_a_damaged_one_says_why(tmp_path):
    """An [aot] image pushed with --compression zstd: its kernel layer is read as the gzip one is."""
    if shutil.which("zstd") is None:
        cannot_run("needs the zstd command", "apt-get install zstd (scripts/host.sh installs it)")
    plain = layer({"opt/imagebuild/kernels.json": kernel_manifest(),
                   "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE})
    blob = subprocess.run(["zstd", "-q", "-c"], input=plain, capture_output=True, check=True).stdout
    result = lay_out(blob, tmp_path / "out", MANIFEST, KernelLayer("registry/x:y"))
    assert (result.flashinfer, result.refused, result.why) == (1, [], None)
    assert (tmp_path / "out" / "flashinfer" / KEY / "batch_prefill_x.so").read_bytes() == MODULE
    damaged = blob[:len(blob) // 2] + bytes([blob[len(blob) // 2] ^ 0xFF]) + blob[len(blob) // 2 + 1:]
    result = lay_out(damaged, tmp_path / "bad", MANIFEST, KernelLayer("registry/x:y"))
    assert result.flashinfer == 0 and "a zstd blob that does not decompress" in result.why
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("namespace", [None, "../../etc", "ABC", 7])
def test_sglang_files_without_a_namespace_of_their_build_are_not_taken(tmp_path, namespace):
    """An image built before namespaces (or a manifest naming a bad one): nothing says which build-wide key
    its SGLang kernels were built under, so they are left out; FlashInfer's, keyed, are still taken."""
    blob = layer({"opt/imagebuild/kernels.json": kernel_manifest(sglang_cache_namespace=namespace),
                  "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE,
                  "var/cache/sglang/jit/sm120/rope/deps-1/rope.so": b"\x7fELF rope"})
    result = lay_out(blob, tmp_path / "out", MANIFEST, KernelLayer("registry/x:y"))
    assert (result.flashinfer, result.sglang, result.refused) == (1, 0, [])
    assert not (tmp_path / "out" / "sglang").exists()


def test_a_module_that_is_not_its_manifest_bytes_is_refused_and_a_path_never_leaves_the_folder(tmp_path):
    blob = layer({"opt/imagebuild/kernels.json": kernel_manifest(sha="d" * 64, sglang_jit_cache_dir="/"),
                  "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE,
                  "../../outside.so": b"x"}, compress=False)
    result = lay_out(blob, tmp_path / "out", MANIFEST, KernelLayer("registry/x:y"))
    assert result.refused == ["batch_prefill_x"] and result.flashinfer == 0
    assert not (tmp_path / "outside.so").exists() and not (tmp_path.parent / "outside.so").exists()


def test_a_layer_without_its_manifest_or_kernels_says_why(tmp_path):
    assert "no manifest" in lay_out(layer({"a": b"b"}), tmp_path, MANIFEST, KernelLayer("r/x")).why
    assert "not a readable tar" in lay_out(b"\x1f\x8b" + b"x" * 100, tmp_path, MANIFEST, KernelLayer("r/x")).why
    empty = layer({"opt/imagebuild/kernels.json": json.dumps({"artifacts": []}).encode()})
    assert "no kernel" in lay_out(empty, tmp_path, MANIFEST, KernelLayer("r/x")).why


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_end_in_a_reason_never_a_traceback(blob):
    result = lay_out(blob, Path("/nonexistent-never-written"), MANIFEST, KernelLayer("r/x"))
    assert result.why and not result.entries


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_manifest_in_a_layer_ends_in_entries_or_a_reason(tmp_path_factory, data):
    doc = json.loads(kernel_manifest())
    replace_one_field(doc, data)
    blob = layer({"opt/imagebuild/kernels.json": json.dumps(doc).encode(),
                  "opt/venv/flashinfer/data/aot/batch_prefill_x/batch_prefill_x.so": MODULE})
    result = lay_out(blob, tmp_path_factory.mktemp("out"), MANIFEST, KernelLayer("r/x"))
    assert bool(result.why) != bool(result.entries)


@pytest.mark.needs_tool("docker-registry", package="docker-registry")
def test_a_reference_with_no_image_yet_is_a_first_run_not_an_error(tmp_path):
    server = start_registry(tmp_path / "registry")
    try:
        result = read_kernel_layer(f"{server.host}/team/none:buildcache", tmp_path / "out", manifest_path=MANIFEST,
                                   connection=Connection(insecure_http=True))
        assert "no image" in result.why and not result.entries
    finally:
        server.stop()
    gone = read_kernel_layer(f"{server.host}/team/none:buildcache", tmp_path / "out", manifest_path=MANIFEST,
                             connection=Connection(insecure_http=True))
    assert gone.why and not gone.entries  # the registry went away: a reason, and a cold build
