"""DockerEngine.read_file, on the real engine: one file of an image, read through a created (never started)
container's archive, is the file the whole image read (verify.image_files, a `docker save` stream) finds, for
a file in a lower layer, one an upper layer replaced, and a name with spaces and non-ASCII; a deleted file, a
directory, a symlink and a missing path are None; an image that is not there is ImageNotFound; and no
container is left behind. `sbom IMAGE` and an image's own lock are read this way: two small files, not the
image twice (the flagship's 8.4 GB)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.engine.docker import only_file
from imagebuild.errors import BuildFailed, ImageNotFound
from imagebuild.image.verify import container_files, image_file, image_files


NAMES = ["etc/lower.txt", "etc/replaced.txt", "opt/a dir/naïve file.json", "gone.txt", "opt/a dir", "opt/link",
         "nowhere/at/all"]


def tools(context: Path) -> None:
    """This machine's rm and ln and the libraries they link, for RUN steps in exec form (no shell)."""
    names = ["/bin/rm", "/bin/ln"]
    libraries = [part for binary in names
                 for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines()
                 for part in line.split() if part.startswith("/")]
    for name in names + libraries:
        target = context / "tools" / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(name), target)


@pytest.fixture(scope="module")
def layered(engine, tmp_path_factory):
    """Layers that replace a file, delete one (a whiteout) and add a symlink."""
    context = tmp_path_factory.mktemp("read-file")
    tools(context)
    (context / "lower.txt").write_text("from the first layer\n")
    (context / "first.txt").write_text("first\n")
    (context / "second.txt").write_text("second, in an upper layer\n")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY tools/ /\n"
        "COPY lower.txt /etc/lower.txt\nCOPY first.txt /etc/replaced.txt\nCOPY first.txt /gone.txt\n"
        "COPY second.txt /etc/replaced.txt\n"
        'COPY ["second.txt", "/opt/a dir/naïve file.json"]\n'
        'RUN ["/bin/rm", "/gone.txt"]\n'
        'RUN ["/bin/ln", "-s", "/opt/a dir/naïve file.json", "/opt/link"]\n')
    ref = f"imagebuild-test/read-file-{os.getpid()}:1"
    engine.tag(engine.build(context), ref)
    yield ref
    engine.remove(ref)


def containers(engine) -> list:
    return engine.client.api.containers(all=True, filters={"label": "io.imagebuild.role=read"})


@pytest.mark.engine
def test_one_file_is_what_the_whole_image_read_finds(engine, layered):
    before = containers(engine)
    whole = image_files(engine, layered, keep=lambda path: True).contents
    for name in NAMES:
        assert engine.read_file(layered, "/" + name) == whole.get(name), name
        assert image_file(engine, layered, name) == whole.get(name), name
    assert engine.read_file(layered, "/etc/replaced.txt") == b"second, in an upper layer\n"
    assert engine.read_file(layered, "/opt/a dir/naïve file.json") == b"second, in an upper layer\n"
    for name in ("/etc", "/gone.txt", "/opt/link", "/nowhere/at/all"):  # a folder, deleted, a link, missing
        assert engine.read_file(layered, name) is None, name
    assert whole.get("opt/link") is None and "gone.txt" not in whole
    assert containers(engine) == before  # each read's container removed


# What Docker puts in every container's filesystem, beside the image's own files.
CONTAINER_ADDS = {".dockerenv", "dev", "dev/console", "dev/pts", "dev/shm", "etc/hostname", "etc/hosts", "etc/mtab",
                  "etc/resolv.conf", "proc", "sys"}


@pytest.mark.engine
def test_the_container_export_verify_reads_is_the_merge_of_the_saved_layers(engine, layered):
    """verify reads a container's export (one stream of the merged tree) instead of saving every layer: every
    path the layers merge to is there with the same kind, mode, owner, size, hash and link; the file a later layer
    deleted is not; beyond them only what the engine adds to every container."""
    layers = image_files(engine, layered, keep=lambda path: True)
    tree = container_files(engine, layered, keep=lambda path: True)
    assert "gone.txt" not in tree.files and "gone.txt" not in layers.files
    assert tree.contents["etc/replaced.txt"] == b"second, in an upper layer\n"
    assert set(tree.files) - set(layers.files) <= CONTAINER_ADDS, set(tree.files) - set(layers.files)
    missing = set(layers.files) - set(tree.files)
    assert not missing, missing
    same = lambda e: (e.kind, e.mode, e.uid, e.gid, e.size, e.sha256, e.link)  # noqa: E731
    differ = [p for p in layers.files if same(layers.files[p]) != same(tree.files[p])]
    assert not differ, [(p, layers.files[p], tree.files[p]) for p in differ]
    assert len([e for e in layers.files.values() if e.kind == "file"]) >= 5  # tools, libraries and the copies
    assert tree.labels == layers.labels
    assert not engine.client.api.containers(all=True, filters={"label": "io.imagebuild.role=export"})


@pytest.mark.engine
def test_an_image_that_is_not_there_is_image_not_found(engine):
    with pytest.raises(ImageNotFound):
        engine.read_file(f"imagebuild-test/no-such-image-{os.getpid()}:1", "/etc/os-release")
    with pytest.raises(ImageNotFound):
        container_files(engine, f"imagebuild-test/no-such-image-{os.getpid()}:1")


def one_path_archive(name: str, data: bytes | None, kind: bytes = tarfile.REGTYPE) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.type = kind
        member.size = len(data or b"")
        tar.addfile(member, io.BytesIO(data or b"") if kind == tarfile.REGTYPE else None)
    out.seek(0)
    return out


def test_only_file_reads_a_regular_file_and_nothing_else():
    assert only_file(one_path_archive("lock.json", b"{}"), "x") == b"{}"
    assert only_file(one_path_archive("lock.json", b""), "x") == b""  # an empty file is a file
    assert only_file(one_path_archive("lock.json", None, tarfile.DIRTYPE), "x") is None
    assert only_file(one_path_archive("lock.json", None, tarfile.SYMTYPE), "x") is None
    with pytest.raises(BuildFailed, match="the engine's copy of image:/x is not a readable tar"):
        only_file(io.BytesIO(b""), "image:/x")  # no archive at all is the engine's fault, not a missing file


@given(st.binary(max_size=4096))
@settings(max_examples=200, deadline=None)
def test_any_engine_reply_is_a_file_none_or_one_error(reply):
    try:
        found = only_file(io.BytesIO(reply), "image:/opt/imagebuild/lock.json")
    except BuildFailed as error:
        assert "image:/opt/imagebuild/lock.json" in str(error)
    else:
        assert found is None or isinstance(found, bytes)


@given(st.binary(max_size=2048), st.integers(min_value=0, max_value=1500))
@settings(max_examples=200, deadline=None)
def test_a_real_archive_cut_or_damaged_is_a_file_none_or_one_error(data, cut):
    archive = one_path_archive("aot-manifest.json", data).getvalue()
    damaged = archive[:cut] + bytes([archive[cut] ^ 0xFF]) + archive[cut + 1:] if cut < len(archive) else archive
    for reply in (archive[:cut], damaged):
        try:
            found = only_file(io.BytesIO(reply), "x")
        except BuildFailed:
            continue
        assert found is None or isinstance(found, bytes)
