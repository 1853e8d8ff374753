"""zstd layers (`--compression zstd`): the same image gives the same bytes twice, and real consumers read
them: skopeo decompresses the layout's layer to its diff_id, the real registry server takes the push,
Podman (Debian's 4.3) pulls it from the loopback registry, unpacks the files and runs `true` in it, and build by lock finds
the zstd image under its own lock tag. Docker 20.10, this machine's engine, cannot pull zstd (it reads
it as a plain tar), which is why gzip stays the default.

The reader is checked on damaged blobs (a flipped byte, a cut end, arbitrary bytes): one clear error."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.flows import built
from imagebuild.flows.by_lock import RegistryTarget, lock_tag, push_by_lock, reuse_by_lock
from imagebuild.registry import Connection
from imagebuild.image import compression, export, oci
from imagebuild.image.compression import GZIP, ZSTD, CompressionError, decompress_bytes, decompressed
from imagebuild.image.layout import layer_stream, read_image
from imagebuild.image.normalize import LayerError
from tests.conftest import cannot_run

sys.path.insert(0, str(Path(__file__).parent.parent))
import registry_server  # noqa: E402

LOCK = "c3" * 32


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No credentials, docker config or caches from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("IMAGEBUILD_REGISTRY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        cannot_run("zstd layer tests need " + ", ".join(missing), "scripts/host.sh installs them")


def layer_tar(seed: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("opt/a.txt", b"ay\n" * 5000 + seed), ("opt/b.bin", hashlib.sha256(seed).digest() * 999)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), oci.REPRO_EPOCH + 99
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def normalized(tmp_path: Path, data: bytes, kind) -> export.LayerBlob:
    tmp_path.mkdir(parents=True, exist_ok=True)
    raw = tmp_path / f"raw-{hashlib.sha256(data).hexdigest()[:8]}.tar"
    raw.write_bytes(data)
    with open(raw, "rb") as handle:
        return export.normalize_layer(handle, tmp_path / "blobs", epoch=oci.REPRO_EPOCH, compression=kind)


# ---------------------------------------------------------------- the blob itself

def test_a_zstd_layer_is_the_same_bytes_twice_with_no_content_size_and_a_checksum(tmp_path):
    _need("zstd")
    first = normalized(tmp_path / "one", layer_tar(), ZSTD)
    second = normalized(tmp_path / "two", layer_tar(), ZSTD)
    gz = normalized(tmp_path / "gz", layer_tar(), GZIP)
    assert first == second
    assert first.descriptor.media_type == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert gz.descriptor.media_type == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert first.diff_id == gz.diff_id and first.descriptor.digest != gz.descriptor.digest  # same tar, other bytes
    blob = oci.blob_path(tmp_path / "one", first.descriptor.digest).read_bytes()
    assert blob[:4] == compression.ZSTD_MAGIC
    descriptor = blob[4]  # the frame header: no content size field (piped), no single segment, checksum on
    assert (descriptor >> 6, (descriptor >> 5) & 1, (descriptor >> 2) & 1) == (0, 0, 1)
    plain = decompress_bytes(blob, "the blob")
    assert "sha256:" + hashlib.sha256(plain).hexdigest() == first.diff_id
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        assert [(m.name, m.mtime) for m in tar] == [("opt/a.txt", oci.REPRO_EPOCH), ("opt/b.bin", oci.REPRO_EPOCH)]


def test_a_zstd_layer_going_in_is_read_like_a_gzip_one(tmp_path):
    """An engine layer that is itself zstd is decompressed, normalized, and gives the plain tar's diff_id."""
    _need("zstd")
    plain = normalized(tmp_path / "plain", layer_tar(b"x"), GZIP)
    zstd_in = subprocess.run(["zstd", "-q", "-c"], input=layer_tar(b"x"), capture_output=True, check=True).stdout
    again = normalized(tmp_path / "zin", zstd_in, GZIP)
    assert again == plain


def corrupted(blob: bytes) -> bytes:
    middle = len(blob) // 2
    return blob[:middle] + bytes([blob[middle] ^ 0xFF]) + blob[middle + 1:]


def test_a_damaged_zstd_blob_is_one_clear_error_and_the_intact_one_reads(tmp_path):
    """Negative control: the same blob reads whole; a flipped byte or a cut end is refused by name."""
    _need("zstd")
    layer = normalized(tmp_path, layer_tar(), ZSTD)
    path = oci.blob_path(tmp_path, layer.descriptor.digest)
    blob = path.read_bytes()
    with open(path, "rb") as handle, decompressed(handle, ZSTD, str(path)) as plain:
        assert "sha256:" + hashlib.sha256(plain.read()).hexdigest() == layer.diff_id
    for damaged in (corrupted(blob), blob[:-7]):
        bad = tmp_path / "bad.zst"
        bad.write_bytes(damaged)
        with pytest.raises(CompressionError, match="bad.zst: a zstd blob that does not decompress"):
            with open(bad, "rb") as handle, decompressed(handle, ZSTD, str(bad)) as plain:
                while plain.read(1 << 16):
                    pass
        with pytest.raises(CompressionError, match="a zstd blob that does not decompress"):
            decompress_bytes(damaged, "bad.zst")
        with pytest.raises(LayerError, match="a zstd layer that does not decompress"):
            normalized(tmp_path / "again", damaged, ZSTD)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_any_bytes_after_zstd_s_magic_decompress_or_raise_a_compression_error(tmp_path, tail):
    _need("zstd")
    data = compression.ZSTD_MAGIC + tail
    try:
        assert isinstance(decompress_bytes(data, "input"), bytes)
    except CompressionError as err:
        assert "input: a zstd blob that does not decompress" in str(err)
    path = tmp_path / "blob"
    path.write_bytes(data)
    try:
        with open(path, "rb") as handle, decompressed(handle, ZSTD, "input") as plain:
            while plain.read(4096):
                pass
    except CompressionError as err:
        assert "input: a zstd blob that does not decompress" in str(err)


def test_compression_names_and_lock_tags():
    assert compression.compression("zstd") is ZSTD and compression.compression("gzip") is GZIP
    with pytest.raises(CompressionError, match="'lz4' is not one of gzip, zstd"):
        compression.compression("lz4")
    assert lock_tag("ab" * 32) == lock_tag("ab" * 32, "gzip") == "lock-" + "ab" * 32
    assert lock_tag("ab" * 32, "zstd") == "lock-" + "ab" * 32 + "-zstd"


def test_pushes_on_record_are_kept_apart_by_compression():
    built.record_push(LOCK, "127.0.0.1:5000/team/x", "sha256:" + "1" * 64)
    built.record_push(LOCK, "127.0.0.1:5000/team/x", "sha256:" + "2" * 64, "zstd")
    assert built.pushed_digest(LOCK, "127.0.0.1:5000/team/x") == "sha256:" + "1" * 64
    assert built.pushed_digest(LOCK, "127.0.0.1:5000/team/x", "zstd") == "sha256:" + "2" * 64


def test_the_layer_cache_keeps_gzip_and_zstd_blobs_of_one_engine_layer_apart(tmp_path):
    _need("zstd")
    cache = export.LayerCache(tmp_path / "cache")
    gz = normalized(tmp_path / "out", layer_tar(), GZIP)
    cache.put("e" * 64, oci.REPRO_EPOCH, gz, tmp_path / "out" / "blobs", GZIP)
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", ZSTD) is None
    zs = normalized(tmp_path / "out", layer_tar(), ZSTD)
    cache.put("e" * 64, oci.REPRO_EPOCH, zs, tmp_path / "out" / "blobs", ZSTD)
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", ZSTD) == zs
    assert cache.get("e" * 64, oci.REPRO_EPOCH, tmp_path / "fresh" / "blobs", GZIP) == gz


# ---------------------------------------------------------------- real consumers

@pytest.fixture(scope="module")
def true_image(engine, tmp_path_factory):
    """A tiny real image FROM scratch: /usr/bin/true and false with the libraries they load, labelled as built
    from LOCK."""
    _need("zstd", "skopeo", "ldd")
    context = tmp_path_factory.mktemp("true-image")
    files = ["/usr/bin/true", "/usr/bin/false"] + [part for line in subprocess.run(["ldd", "/usr/bin/true"], capture_output=True,
                                                                   text=True, check=True).stdout.splitlines()
                                 for part in line.split() if part.startswith("/")]
    for name in files:
        target = context / "rootfs" / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(name), target)
    (context / "Dockerfile").write_text(f'FROM scratch\nCOPY rootfs/ /\nLABEL io.imagebuild.lock.sha256="{LOCK}"\n'
                                        'CMD ["/usr/bin/true"]\n')
    tag = f"imagebuild-test/zstd-{os.getpid()}:1"
    engine.tag(engine.build(context), tag)
    built_from[tag] = context
    try:
        yield tag
    finally:
        engine.remove(tag)


built_from: dict[str, Path] = {}  # true_image's build context, for a second engine to build it again


@pytest.fixture
def server(registry):
    return registry


@pytest.mark.engine
def test_export_is_reproducible_and_skopeo_decompresses_the_layers_to_their_diff_ids(engine, true_image, tmp_path):
    cache = export.LayerCache(tmp_path / "cache")
    first = export.export_layout(engine, true_image, tmp_path / "first", compression="zstd", cache=False)
    second = export.export_layout(engine, true_image, tmp_path / "second", compression="zstd", cache=cache)
    cached = export.export_layout(engine, true_image, tmp_path / "cached", compression="zstd", cache=cache)
    gz = export.export_layout(engine, true_image, tmp_path / "gzip", cache=cache)
    assert first.manifest_digest == second.manifest_digest == cached.manifest_digest
    assert first.layers and {d.media_type for d in first.layers} == {ZSTD.media_type}
    assert gz.manifest_digest != first.manifest_digest and gz.diff_ids == first.diff_ids  # negative control
    assert {d.media_type for d in gz.layers} == {GZIP.media_type}
    image = read_image(tmp_path / "first")
    for desc, diff_id in zip(image.layers, first.diff_ids):
        with layer_stream(image, desc) as plain:
            assert "sha256:" + hashlib.sha256(plain.read()).hexdigest() == diff_id
    out = tmp_path / "skopeo-dir"
    registry_server.run("skopeo", "copy", "--insecure-policy", "--dest-decompress", f"oci:{tmp_path / 'first'}",
                        f"dir:{out}")
    written = json.loads((out / "manifest.json").read_text())
    assert [layer["digest"] for layer in written["layers"]] == list(first.diff_ids)
    for diff_id in first.diff_ids:
        assert "sha256:" + hashlib.sha256((out / diff_id[7:]).read_bytes()).hexdigest() == diff_id
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "first", damaged)
    blob = oci.blob_path(damaged, first.layers[0].digest)
    blob.write_bytes(corrupted(blob.read_bytes()))
    refused = subprocess.run(["skopeo", "copy", "--insecure-policy", "--dest-decompress", f"oci:{damaged}",
                              f"dir:{tmp_path / 'not-copied'}"], capture_output=True, text=True)
    # skopeo's zstd reader stops inside the damaged frame (before the digest check could): a refusal, no copy
    assert refused.returncode != 0 and "writing blob" in refused.stderr, refused.stderr
    assert not (tmp_path / "not-copied" / "manifest.json").exists()


@pytest.mark.engine
def test_podman_pulls_the_pushed_zstd_image_from_the_loopback_registry_and_runs_true(engine, true_image, server, tmp_path):
    _need("podman")
    layout = export.export_layout(engine, true_image, tmp_path / "layout", compression="zstd", cache=False)
    ref = f"{server.host}/team/zstd:1"
    from imagebuild.registry import push
    report = push(tmp_path / "layout", ref, Connection(insecure_http=True))
    assert report.digest == layout.manifest_digest
    raw = registry_server.run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}", text=False).stdout
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == layout.manifest_digest
    (tmp_path / "docker-config").mkdir(exist_ok=True)
    (tmp_path / "docker-config" / "config.json").write_text("{}")  # podman reads $DOCKER_CONFIG's (no credentials)
    runroot = tempfile.mkdtemp(prefix="ib-podman-")  # podman wants a runroot path under 50 characters
    podman = ["podman", "--root", str(tmp_path / "podman-root"), "--runroot", runroot,
              "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
    try:
        podman_reads(podman, ref, layout)
    finally:
        subprocess.run([*podman, "rm", "-f", "zstd-unpacked"], capture_output=True)
        subprocess.run([*podman, "rmi", "-a", "-f"], capture_output=True)  # its own storage under tmp_path
        shutil.rmtree(runroot, ignore_errors=True)


def podman_reads(podman: list[str], ref: str, layout: export.LayoutResult) -> None:
    registry_server.run(*podman, "pull", "--tls-verify=false", ref)
    layers = registry_server.run(*podman, "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout
    assert json.loads(layers) == list(layout.diff_ids)
    # Limits at or under this sandbox's own: podman's defaults are above them and runc may not raise them.
    limits = ["--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024", "--network", "none"]
    ran = subprocess.run([*podman, "run", "--rm", *limits, ref, "/usr/bin/true"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    failed = subprocess.run([*podman, "run", "--rm", *limits, ref, "/usr/bin/false"], capture_output=True, text=True)
    assert failed.returncode == 1, failed.stderr  # negative control: the image's own binary ran and said no
    registry_server.run(*podman, "create", "--name", "zstd-unpacked", ref)
    unpacked = Path(podman[2]).parent / "unpacked.tar"
    registry_server.run(*podman, "export", "-o", str(unpacked), "zstd-unpacked")
    with tarfile.open(unpacked) as tar:
        assert tar.extractfile("usr/bin/true").read() == Path("/usr/bin/true").read_bytes()


@pytest.mark.engine
def test_build_by_lock_pushes_zstd_under_its_own_lock_tag_and_finds_it_again(engine, true_image, server, tmp_path):
    zstd_target = RegistryTarget(f"{server.host}/team/by-lock", Connection(insecure_http=True), compression="zstd")
    gzip_target = RegistryTarget(f"{server.host}/team/by-lock", Connection(insecure_http=True))
    smoke = {"ok": True, "checks": [{"name": "true", "status": "pass"}]}
    hit = push_by_lock(engine, true_image, zstd_target, LOCK, "zstd-run", smoke)
    assert hit.lock_reference == f"{server.host}/team/by-lock:{lock_tag(LOCK, 'zstd')}"
    again = export.export_layout(engine, true_image, tmp_path / "again", compression="zstd", cache=False)
    assert hit.digest == again.manifest_digest  # what a second runner would push is what is there
    said: list[str] = []
    found = reuse_by_lock(zstd_target, LOCK, "next-run", said.append, expected=hit.digest)
    assert found is not None and found.digest == hit.digest and found.smoke["checks"] == smoke["checks"], said
    assert reuse_by_lock(gzip_target, LOCK, "gzip-run", said.append) is None  # no gzip image for this lock there


@pytest.mark.engine
def test_the_cli_s_export_oci_and_push_take_compression_zstd(engine, true_image, server, tmp_path, capsys):
    from imagebuild.cli import app as cli
    layout = export.export_layout(engine, true_image, tmp_path / "library", compression="zstd", cache=False)
    code = cli.main(["export-oci", true_image, "-o", str(tmp_path / "cli"), "--compression", "zstd", "--no-sbom",
                     "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["manifest_digest"] == layout.manifest_digest
    assert {layer["mediaType"] for layer in report["layers"]} == {ZSTD.media_type}
    code = cli.main(["push", true_image, f"{server.host}/team/cli:1", "--insecure-http", "--compression", "zstd",
                     "--json"])
    pushed = json.loads(capsys.readouterr().out)
    assert code == 0 and pushed["digest"] == layout.manifest_digest
    code = cli.main(["push", true_image, f"{server.host}/team/cli:gzip", "--insecure-http", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["digest"] != layout.manifest_digest  # default: gzip


@pytest.mark.engine
def test_a_second_private_engine_building_the_same_context_gives_the_same_zstd_manifest(engine, true_image,
                                                                                       fresh_runner, tmp_path):
    from imagebuild.engine.docker import DockerEngine
    second = DockerEngine(host=fresh_runner.host)
    assert second.inspect(true_image) is None  # its own empty store: the image is built there anew
    other_id = second.build(built_from[true_image])
    here = export.export_layout(engine, true_image, tmp_path / "here", compression="zstd", cache=False)
    there = export.export_layout(second, other_id, tmp_path / "there", compression="zstd", cache=False)
    assert here.manifest_digest == there.manifest_digest and here.layers == there.layers
    assert {d.media_type for d in there.layers} == {ZSTD.media_type}
