"""imagebuild.image.verify on images made here as OCI layouts: merged files, verify against a lock, diff.

Engine-built images are verified and diffed in test_repro_build.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fake_base import debian_identity
from imagebuild.image import oci, verify
from imagebuild.image.normalize import LayerError
from imagebuild.lock import Lock, LockedPatch, LockedWheel, write_lock
from tests.image.test_oci import _VALID, export_archive, make_tar, member, saved_archive

SITE = "opt/venv/lib/python3.11/site-packages"
PATCH_SHA = "c" * 64


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def dist_members(name="demo", version="1.0", code=b"print('hi')\n", patched=False, record_code=None):
    info = f"{SITE}/{name}-{version}.dist-info"
    record = "\n".join([record_line(f"{name}/__init__.py", record_code or code),
                        f"{name}-{version}.dist-info/RECORD,,",
                        f"{name}-{version}.dist-info/METADATA,,"]) + "\n"
    members = [member(f"{SITE}/{name}/__init__.py", data=code),
               member(f"{info}/METADATA", data=f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode()),
               member(f"{info}/RECORD", data=record.encode())]
    if patched:
        members.append(member(f"{info}/IMAGEBUILD_PATCHES", data=f"{PATCH_SHA}  01-fix.patch\n".encode()))
    return members


def demo_lock(patches=()) -> Lock:
    base = debian_identity({"libc6": "2.36-9"})
    wheel = LockedWheel(name="demo", version="1.0", filename="demo-1.0-py3-none-any.whl",
                        sha256="d" * 64, size=10, layer="application")
    return Lock(recipe="demo", recipe_sha256="f" * 64, tool_version="0.1.0", template_sha256="a" * 64,
                base=base, python_platform="x86_64-manylinux_2_36", resolver="uv", wheels=(wheel,),
                patches=tuple(patches))


def layout_of(tmp_path: Path, layers: list[list], labels: dict, name="layout") -> str:
    config = {"architecture": "amd64", "os": "linux", "config": {"Labels": labels}}
    export_archive(saved_archive([make_tar(m) for m in layers], config), tmp_path / name)
    return f"oci:{tmp_path / name}"


def labels_for(lock: Lock) -> dict:
    return {"io.imagebuild.lock.sha256": lock.sha256, "io.imagebuild.recipe.sha256": lock.recipe_sha256}


def run_verify(tmp_path, lock, layers, labels=None):
    ref = layout_of(tmp_path, layers, labels_for(lock) if labels is None else labels)
    write_lock(lock, tmp_path / "demo.lock")
    return verify.verify_image(None, ref, tmp_path / "demo.lock")


def test_an_image_that_matches_its_lock_verifies(tmp_path):
    report = run_verify(tmp_path, demo_lock(), [dist_members()])
    assert report.ok, report.mismatches
    assert report.checked == {"labels": 2, "packages": 1, "files": 1, "patches": 0, "kernels": 0}


def test_a_changed_file_is_named(tmp_path):
    report = run_verify(tmp_path, demo_lock(), [dist_members(code=b"evil\n", record_code=b"good\n")])
    assert [(m.what, m.subject) for m in report.mismatches] == [("file", f"/{SITE}/demo/__init__.py")]


def test_wrong_version_labels_and_unlocked_packages_are_named(tmp_path):
    layers = [dist_members(version="2.0") + dist_members(name="extra")]
    report = run_verify(tmp_path, demo_lock(), layers, labels={"io.imagebuild.lock.sha256": "0" * 64})
    found = {(m.what, m.subject) for m in report.mismatches}
    assert {("label", "io.imagebuild.lock.sha256"), ("label", "io.imagebuild.recipe.sha256"),
            ("package", "demo"), ("package", "extra")} <= found


def test_patches_must_be_the_locked_ones(tmp_path):
    patch = LockedPatch(package="demo", file="01-fix.patch", sha256=PATCH_SHA, strip=1, version="1.0")
    assert run_verify(tmp_path / "a", demo_lock([patch]), [dist_members(patched=True)]).ok
    unpatched = run_verify(tmp_path / "b", demo_lock([patch]), [dist_members()])
    assert [(m.what, m.actual) for m in unpatched.mismatches] == [("patch", "(no patches)")]
    unlocked = run_verify(tmp_path / "c", demo_lock(), [dist_members(patched=True)])
    assert [(m.what, m.expected) for m in unlocked.mismatches] == [("patch", "(no patches)")]


def kernel_members(code: bytes, listed: bytes) -> list:
    """A prebuilt kernel outside every RECORD, and the [aot] manifest that lists it with the hash of `listed`."""
    path = f"{SITE}/flashinfer/data/aot/cascade/cascade.so"
    manifest = {"artifacts": [{"kind": "flashinfer", "name": "cascade", "path": f"/{path}", "bytes": len(listed),
                               "sha256": hashlib.sha256(listed).hexdigest(), "sass": [120], "ptx": []}]}
    return [member(path, data=code), member("opt/imagebuild/aot-manifest.json", data=json.dumps(manifest).encode())]


def test_prebuilt_kernels_must_hash_as_their_manifest_says(tmp_path):
    good = run_verify(tmp_path / "a", demo_lock(), [dist_members() + kernel_members(b"sass", b"sass")])
    assert good.ok and good.checked["kernels"] == 1
    changed = run_verify(tmp_path / "b", demo_lock(), [dist_members() + kernel_members(b"other", b"sass")])
    assert [(m.what, m.subject) for m in changed.mismatches] == [
        ("kernel", f"/{SITE}/flashinfer/data/aot/cascade/cascade.so")]
    gone = run_verify(tmp_path / "c", demo_lock(), [dist_members() + kernel_members(b"sass", b"sass")[1:]])
    assert [m.actual for m in gone.mismatches] == ["(missing)"]


def test_a_file_removed_by_a_later_layer_is_missing(tmp_path):
    report = run_verify(tmp_path, demo_lock(), [dist_members(), [member(f"{SITE}/demo/.wh.__init__.py")]])
    assert [m.actual for m in report.mismatches] == ["(missing; demo)"]


def test_merge_honours_whiteouts_and_opaque_folders():
    def layer(members):
        return verify.read_layer_files(io.BytesIO(make_tar(members)))
    lower = layer([member("a/", tarfile.DIRTYPE), member("a/x", data=b"1"), member("a/y", data=b"2"),
                   member("b/", tarfile.DIRTYPE), member("b/z", data=b"3"), member("c", data=b"4")])
    upper = layer([member("a/.wh.x"), member("b/.wh..wh..opq"), member("b/new", data=b"5"),
                   member("c", data=b"44")])
    files, _ = verify.merge_layers([lower, upper])
    assert sorted(files) == ["a", "a/y", "b", "b/new", "c"]
    assert files["c"].sha256 == hashlib.sha256(b"44").hexdigest()


def test_diff_names_what_differs_and_ignores_build_time(tmp_path):
    late = oci.REPRO_EPOCH + 100
    a = layout_of(tmp_path, [[member("etc/same", data=b"x", mtime=late), member("etc/date", data=b"1"),
                              member("etc/mode", data=b"m", mode=0o644),
                              member("etc/link", tarfile.SYMTYPE, link="same")]], {}, "a")
    b = layout_of(tmp_path, [[member("etc/same", data=b"x", mtime=late + 5), member("etc/date", data=b"2"),
                              member("etc/mode", data=b"m", mode=0o755),
                              member("etc/link", tarfile.SYMTYPE, link="date")]], {"x": "1"}, "b")
    report = verify.diff_images(None, a, b)
    assert [(d.path, d.fields) for d in report.differences] == [
        ("/etc/date", ("content",)), ("/etc/link", ("link",)), ("/etc/mode", ("mode",))]
    assert report.config == ["Labels"] and not report.same
    assert verify.diff_images(None, a, a).same


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_record_parsing_takes_any_text(text):
    for path, digest, size in verify.parse_record(text):
        assert path and isinstance(digest, str) and isinstance(size, str)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048), cut=st.integers(0, len(_VALID)),
       edits=st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=6))
def test_garbled_layer_streams_are_read_or_refused(data, cut, edits):
    garbled = bytearray(_VALID[:cut])
    for offset, value in edits:
        if offset < len(garbled):
            garbled[offset] = value
    for stream in (data, bytes(garbled)):
        try:
            verify.read_layer_files(io.BytesIO(stream))
        except LayerError:
            pass


def two_owner_members(name: str, shared: bytes, on_disk: bytes | None = None) -> list:
    """A distribution that also installs a top-level build_backend.py (as flashinfer-python 0.7.2
    and torch-c-dlpack-ext 0.1.5 both do)."""
    info = f"{SITE}/{name}-1.0.dist-info"
    record = "\n".join([record_line(f"{name}/__init__.py", b""), record_line("build_backend.py", shared),
                        f"{name}-1.0.dist-info/RECORD,,", f"{name}-1.0.dist-info/METADATA,,"]) + "\n"
    return [member(f"{SITE}/{name}/__init__.py"), member(f"{SITE}/build_backend.py", data=on_disk or shared),
            member(f"{info}/METADATA", data=f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\n".encode()),
            member(f"{info}/RECORD", data=record.encode())]


def two_owner_lock() -> Lock:
    wheels = tuple(LockedWheel(name=n, version="1.0", filename=f"{n}-1.0-py3-none-any.whl", sha256="d" * 64,
                               size=10, layer=layer) for n, layer in (("first", "kernels"), ("second", "libraries")))
    return replace(demo_lock(), wheels=wheels)


def test_a_path_two_distributions_install_is_a_note_not_a_mismatch(tmp_path):
    report = run_verify(tmp_path, two_owner_lock(), [two_owner_members("first", b"A = 1\n"),
                                                     two_owner_members("second", b"B = 2\n")])
    assert report.ok, report.mismatches
    assert [f.to_dict() for f in report.shared] == [
        {"path": f"/{SITE}/build_backend.py", "owners": ["first", "second"], "kept": "second"}]


def test_a_shared_path_holding_neither_owners_copy_is_a_mismatch(tmp_path):
    report = run_verify(tmp_path, two_owner_lock(), [two_owner_members("first", b"A = 1\n"),
                                                     two_owner_members("second", b"B = 2\n", on_disk=b"evil\n")])
    assert {m.subject for m in report.mismatches} == {f"/{SITE}/build_backend.py"}
    assert report.shared == []
