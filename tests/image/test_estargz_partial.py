"""eStargz layers on Podman 4.3 (Debian's), whose containers-storage pulls them partially: with partial pulls on
(`pull_options = {enable_partial_images = "true"}` in storage.conf), it reads each layer's footer and TOC by
range, checks the TOC against imagebuild's digest annotation, takes every file whose digest a layer it holds
already has from that layer, and fetches only the other files' chunks. So a node that holds one image of a
gallery pulls only the files the next one changes, even inside a layer that differs (Docker 20.10 fetches such
a layer whole, and every layer above it). Two images FROM scratch, one layer each: three files, two of them the
same in both. The second pull must be served ranges only, about one file's bytes, and the files must be the
ones pushed. Controls: the same images pushed as gzip, and the eStargz ones pulled with partial pulls off, each
send the second image's layer whole."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from imagebuild.image import export
from imagebuild.registry import Connection, push
from tests.conftest import cannot_run
from tests.podman_store import PodmanStore

pytestmark = pytest.mark.engine
FILE_BYTES = 6 << 20
SHARED = ("data/x", "data/y")


class PodmanNode:
    """Podman on a store of its own (tests/podman_store.py), partial pulls on or off, removed afterwards."""

    def __init__(self, partial: bool):
        if shutil.which("podman") is None:
            cannot_run("podman is not installed", "scripts/host.sh (apt-get install -y podman)")
        self.store = PodmanStore.create(partial=partial)

    def podman(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(self.store.command(*args), capture_output=True, text=False, env=self.store.env,
                              timeout=300)
        assert done.returncode == 0, f"podman {' '.join(args)!r}: {done.stderr.decode(errors='replace')[-1500:]}"
        return done

    def pull(self, ref: str) -> None:
        self.podman("pull", "-q", "--tls-verify=false", ref)

    def files(self, ref: str) -> dict[str, str]:
        """sha256 of every file under data/ as Podman stores the image (a container's export, never run)."""
        name = f"ib-pp-{os.getpid()}"
        self.podman("create", "--name", name, ref, "/none")
        try:
            exported = self.podman("export", name).stdout
        finally:
            self.podman("rm", "-f", name)
        with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
            return {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar
                    if m.isfile() and m.name.startswith("data/")}  # an eStargz blob unpacked whole has its TOC too

    def close(self) -> None:
        self.store.remove()


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    """Two images FROM scratch of one layer each: x, y and z; then x, y and w. Yields ({name: tag}, {name: {path:
    sha256}})."""
    folder = tmp_path_factory.mktemp("partial")
    made, expected = {}, {}
    x, y = os.urandom(FILE_BYTES), os.urandom(FILE_BYTES)
    for name, own in (("first", "z"), ("second", "w")):
        context = folder / name
        (context / "data").mkdir(parents=True)
        contents = {"data/x": x, "data/y": y, f"data/{own}": os.urandom(FILE_BYTES)}
        for path, data in contents.items():
            (context / path).write_bytes(data)
        (context / "Dockerfile").write_text("FROM scratch\nCOPY data/ /data/\n")
        made[name] = f"imagebuild-test/estargz-partial-{name}-{os.getpid()}:1"
        engine.tag(engine.build(context), made[name])
        expected[name] = {path: hashlib.sha256(data).hexdigest() for path, data in contents.items()}
    try:
        yield made, expected
    finally:
        for tag in made.values():
            engine.remove(tag)


def pushed(engine, images, registry, tmp_path: Path, compression: str) -> dict[str, tuple[str, str, int]]:
    """Both images pushed by imagebuild: {name: (reference, layer digest, layer size)}."""
    made, _ = images
    refs = {}
    for name, image in made.items():
        layout = export.export_layout(engine, image, tmp_path / f"{compression}-{name}", compression=compression,
                                      cache=False)
        ref = f"{registry.host}/team/partial:{compression}-{name}"
        assert push(tmp_path / f"{compression}-{name}", ref, Connection(insecure_http=True)).digest == layout.manifest_digest
        (layer,) = layout.layers
        refs[name] = (ref, layer.digest, layer.size)
    return refs


def second_pull(node: PodmanNode, refs, registry) -> list[tuple[int, int]]:
    """The first image pulled, then the second: the (status, bytes) of each GET of the second's layer."""
    node.pull(refs["first"][0])
    since = registry.log.stat().st_size
    node.pull(refs["second"][0])
    return registry.blob_gets_since(since, [refs["second"][1]])[refs["second"][1]]


def test_podman_pulls_only_the_files_the_second_image_changes(engine, images, registry, tmp_path):
    refs = pushed(engine, images, registry, tmp_path, "estargz")
    node = PodmanNode(partial=True)
    try:
        gets = second_pull(node, refs, registry)
        _, digest, size = refs["second"]
        assert gets and {status for status, _ in gets} == {206}, gets  # footer, TOC, chunks: ranges, never the blob
        fetched = sum(n for _, n in gets)
        # w's chunks (random bytes: gzip keeps their size) and the TOC; x and y come from the first image's layer
        assert FILE_BYTES <= fetched < FILE_BYTES + (FILE_BYTES // 2), (fetched, size)
        assert size > 2.9 * FILE_BYTES
        assert node.files(refs["second"][0]) == images[1]["second"]  # the bytes pushed, x and y taken locally
        print(f"partial: the second image's layer ({size:,} B) was served {fetched:,} B in {len(gets)} ranges")
    finally:
        node.close()


@pytest.mark.parametrize("compression, partial", [("gzip", True), ("estargz", False)])
def test_without_a_toc_or_without_partial_pulls_the_layer_travels_whole(engine, images, registry, tmp_path,
                                                                         compression, partial):
    refs = pushed(engine, images, registry, tmp_path, compression)
    node = PodmanNode(partial=partial)
    try:
        gets = second_pull(node, refs, registry)
        # the whole blob once (with partial pulls off, Podman still reads an eStargz footer and TOC first)
        assert [get for get in gets if get[0] == 200] == [(200, refs["second"][2])], gets
        assert all(status == 206 and n < 4096 for status, n in gets if status != 200), gets
        assert node.files(refs["second"][0]) == images[1]["second"]
    finally:
        node.close()
