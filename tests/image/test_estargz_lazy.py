"""eStargz layers on a real lazy consumer: stargz-snapshotter 0.12 (Debian's library, tools/stargz-grpc) under
a private containerd (tests/lazy_node.py), pulling from the loopback registry. imagebuild pushes a small
image with Python in it as eStargz, its `import csv` files prefetched (--prefetch-import, recorded in the image
by the real engine); the snapshotter must verify each layer's TOC against imagebuild's annotation, mount it
remotely and run the import while the registry has served only part of the blobs, in ranges. Controls: the
same image as plain gzip is not mounted remotely (the snapshotter falls back and the blobs travel whole),
and a manifest whose TOC digest annotation is wrong is refused the lazy mount. The reader, in turn, reads
what the real converter (`ctr-remote image convert --estargz`) writes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from imagebuild.flows.prefetch import import_reads
from imagebuild.image import estargz, export
from imagebuild.image.compression import ESTARGZ
from imagebuild.registry import Connection, push
from tests.conftest import cannot_run
from tests.image.test_zstd import isolated  # noqa: F401  (fixture)

sys.path.insert(0, str(Path(__file__).parent.parent))
import lazy_node  # noqa: E402

MARK = "imagebuild-lazy-imported"
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def node():
    why = lazy_node.why_not()
    if why:
        cannot_run(why, "scripts/host.sh")
    with lazy_node.running("noprefetch = false\nno_background_fetch = true\n") as started:
        yield started


@pytest.fixture(scope="module")
def python_image(engine, tmp_path_factory):
    """An image FROM scratch with this machine's Debian Python 3.11 (interpreter, standard library, the
    libraries it links): two layers, so a prefetch list meets more than one."""
    python = "/usr/bin/python3.11"
    if not os.path.exists(python):
        cannot_run("Debian's python3.11 is needed to make the test image", "apt-get install -y python3")
    context = tmp_path_factory.mktemp("python-image")
    ctypes_so = next(Path("/usr/lib/python3.11/lib-dynload").glob("_ctypes.*.so"))  # the recorder's mincore
    libraries = [part for binary in (python, str(ctypes_so))
                 for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines()
                 for part in line.split() if part.startswith("/")]
    for name in [python, *libraries]:
        target = context / "rootfs" / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(name), target)
    (context / "rootfs" / "usr/bin/python3").symlink_to("python3.11")
    shutil.copytree("/usr/lib/python3.11", context / "stdlib" / "usr/lib/python3.11", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "test", "tests", "idlelib", "tkinter", "dist-packages"))
    (context / "Dockerfile").write_text("FROM scratch\nCOPY rootfs/ /\nCOPY stdlib/ /\nENV PATH=/usr/bin\n"
                                        'CMD ["/usr/bin/python3"]\n')
    tag = f"imagebuild-test/estargz-python-{os.getpid()}:1"
    engine.tag(engine.build(context), tag)
    try:
        yield tag
    finally:
        engine.remove(tag)


def pushed(engine, image: str, tmp_path: Path, server, tag: str, kind) -> tuple[export.LayoutResult, str]:
    layout = export.export_layout(engine, image, tmp_path / tag, compression=kind, cache=False)
    ref = f"{server.host}/team/lazy:{tag}"
    assert push(tmp_path / tag, ref, Connection(insecure_http=True)).digest == layout.manifest_digest
    return layout, ref


def test_the_snapshotter_verifies_imagebuild_s_toc_mounts_lazily_and_runs_the_import(
        engine, python_image, registry, node, tmp_path):
    reads = import_reads(engine, python_image, ["csv"])
    assert "/usr/lib/python3.11/csv.py" in reads.files and "/usr/bin/python3.11" in reads.files, reads.files
    assert import_reads(engine, python_image, ["csv"]).files == reads.files  # a second container: the same layers
    kind = ESTARGZ.with_prioritized(path.lstrip("/") for path in reads.files)
    layout, ref = pushed(engine, python_image, tmp_path, registry, "estargz", kind)
    blobs = {d.digest: d.size for d in layout.layers}
    assert len(blobs) == 2
    since, logged = registry.log.stat().st_size, node.log_size()
    node.rpull(ref)
    said = node.run(ref, "python3", "-c", f"import csv; print({MARK!r}, csv.__name__)")
    assert f"{MARK} csv" in said
    assert node.prepared(logged) == (2, []), node.log.read_text()[-3000:]  # both layers verified, mounted remotely
    gets = registry.blob_gets_since(since, blobs)
    assert all({status for status, _ in gets[digest]} == {206} for digest in blobs), gets  # ranges, never a blob
    fetched = {digest: sum(n for _, n in gets[digest]) for digest in blobs}
    stdlib = max(blobs, key=blobs.get)  # the interpreter's layer is all prefetched (all of it is read)
    assert 0 < fetched[stdlib] < blobs[stdlib] // 2, (blobs, gets)
    print(f"lazy: {len(reads.files)} files prefetched; served {sum(n for g in gets.values() for _, n in g):,} of "
          f"{sum(blobs.values()):,} layer bytes, in ranges")


def test_a_plain_gzip_image_is_not_mounted_remotely_and_travels_whole(engine, python_image, registry, node, tmp_path):
    layout, ref = pushed(engine, python_image, tmp_path, registry, "gzip", "gzip")
    blobs = {d.digest: d.size for d in layout.layers}
    since, logged = registry.log.stat().st_size, node.log_size()
    node.rpull(ref)  # ctr-remote falls back to fetching and unpacking each layer
    assert f"{MARK} csv" in node.run(ref, "python3", "-c", f"import csv; print({MARK!r}, csv.__name__)")
    done, failed = node.prepared(logged)
    assert done == 0 and len(failed) == 2, (done, failed)
    gets = registry.blob_gets_since(since, blobs)
    assert all((200, size) in gets[digest] for digest, size in blobs.items()), gets


def test_a_wrong_toc_digest_annotation_is_refused_the_lazy_mount(engine, python_image, registry, node, tmp_path):
    """The snapshotter checks the TOC against the manifest's annotation: the annotation imagebuild writes is
    what lets it mount, and a wrong one sends it back to a whole pull."""
    layout, ref = pushed(engine, python_image, tmp_path, registry, "estargz-wrong", "estargz")
    manifest = json.loads(export.blob_path(tmp_path / "estargz-wrong", layout.manifest_digest).read_bytes())
    for layer in manifest["layers"]:
        layer["annotations"][estargz.TOC_DIGEST] = "sha256:" + hashlib.sha256(b"not the toc").hexdigest()
    body = json.dumps(manifest).encode()
    put = requests.put(f"{registry.url}/v2/team/lazy/manifests/wrong-toc", data=body,
                       headers={"Content-Type": manifest["mediaType"]}, timeout=30)
    assert put.status_code == 201, put.text
    wrong = f"{registry.host}/team/lazy:wrong-toc"
    node.forget()
    logged = node.log_size()
    node.rpull(wrong)
    assert f"{MARK} csv" in node.run(wrong, "python3", "-c", f"import csv; print({MARK!r}, csv.__name__)")
    done, failed = node.prepared(logged)
    assert done == 0 and len(failed) == 2 and all("invalid TOC JSON" in why for why in failed), (done, failed)


def test_the_reader_reads_what_ctr_remote_s_converter_writes(engine, python_image, registry, node, tmp_path):
    layout, ref = pushed(engine, python_image, tmp_path, registry, "source", "gzip")
    node.pull(ref)
    converted = f"{registry.host}/team/lazy:converted"
    node.ctr("image", "convert", "--estargz", "--oci", ref, converted, remote=True)
    manifest_digest = node.ctr("image", "ls").stdout
    target = [line.split() for line in manifest_digest.splitlines() if line.startswith(converted)][0]
    digest = next(part for part in target if part.startswith("sha256:"))
    manifest = json.loads(node.ctr("content", "get", digest).stdout)
    checked = 0
    for layer in manifest["layers"]:
        blob = subprocess.run(["ctr", "--address", node.address, "-n", node.namespace, "content", "get",
                               layer["digest"]], capture_output=True, check=True).stdout
        toc = estargz.read_toc(io.BytesIO(blob), layer["digest"])
        assert toc.digest == layer["annotations"][estargz.TOC_DIGEST]
        checked += estargz.verify_chunks(io.BytesIO(blob), toc, layer["digest"])
        damaged = bytearray(blob)
        largest = max((e for e in toc.entries if e.get("type") == "reg"), key=lambda e: e.get("size", 0))
        damaged[largest["offset"] + 200] ^= 0xFF  # inside its deflate data
        with pytest.raises(estargz.EstargzError):
            estargz.verify_chunks(io.BytesIO(bytes(damaged)), estargz.read_toc(io.BytesIO(bytes(damaged)), "d"), "d")
    assert checked > 100, checked  # the standard library's files, each inflated from its own offset
