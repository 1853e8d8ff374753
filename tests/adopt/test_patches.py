"""Hand edits -> patches (imagebuild/adopt/patches.py): the diff of any two texts, applied by the image's
own patcher and by GNU patch, gives the edited file byte for byte; an edit that cannot be a patch is
listed with why. The wheel's copy comes through `read` (a real wheel in tests/adopt/test_adopt.py)."""

from __future__ import annotations

import base64
import hashlib
import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from imagebuild.adopt.inventory import read_inventory
from imagebuild.adopt.patches import _proved, make_patches, unified_diff
from imagebuild.lock.lockfile import LockedWheel
from imagebuild.payload.apply_patch import check_patch
from tests.adopt.inventories import dist, modified, report
from tests.conftest import missing_tool

ORIGINAL = b"import os\n\n\ndef get_cuda_version():\n    return run('nvcc --version')\n"
EDITED = b"import os\n\n\ndef get_cuda_version():\n    return os.environ.get('CUDA_VERSION') or run('nvcc --version')\n"


def record(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(name: str, version: str) -> LockedWheel:
    return LockedWheel(name, version, f"{name}-{version}-py3-none-any.whl", "0" * 64, 1, "libraries", "https://x/y.whl")


lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "\n", "x\r\n", "d", "é\n", "\tz\n"]), max_size=30)


@settings(max_examples=300)
@given(lines, lines)
def test_the_diff_of_any_two_texts_gives_the_edit_exactly(old, new):
    a, b = "".join(old), "".join(new)
    assume(a != b)  # a file whose hash differs from its RECORD's differs
    diff = unified_diff("pkg/mod.py", a, b)
    assert _proved(diff, "pkg/mod.py", a, b) is None
    assert check_patch(diff, lambda path: a if path == "pkg/mod.py" else None) == []


@settings(max_examples=40, deadline=None)
@given(lines, lines)
def test_gnu_patch_reads_the_diff_the_same_way(tmp_path_factory, old, new):
    missing_tool("patch", package="patch")
    folder = tmp_path_factory.mktemp("gnu")
    (folder / "pkg").mkdir()
    target = folder / "pkg" / "mod.py"
    a, b = "".join(old), "".join(new)
    assume(a != b)
    target.write_bytes(a.encode())
    done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-s"],
                          input=unified_diff("pkg/mod.py", a, b).encode(), cwd=folder, capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_bytes() == b.encode()


def patches_of(mods, member=ORIGINAL, pinned=True):
    raw = report([dist("flashinfer-python", "0.7.2", modified=mods)], torch=("2.14.1", "13.0"))
    found = read_inventory(raw, "--python /env/bin/python")
    pins = {"flashinfer-python": "0.7.2"} if pinned else {}
    return make_patches(found, pins, {"flashinfer-python": wheel("flashinfer-python", "0.7.2")},
                        lambda w, path: member if path == "flashinfer/jit/cpp_ext.py" else None)


def test_an_edited_file_of_an_index_distribution_becomes_its_patch():
    (patch,), unpatched = patches_of([modified("flashinfer/jit/cpp_ext.py", EDITED, record(ORIGINAL))])
    assert unpatched == [] and patch.filename == "flashinfer-python-0.7.2.patch"
    assert patch.files == ("flashinfer/jit/cpp_ext.py",)
    text = patch.data.decode()
    assert text.startswith("flashinfer-python 0.7.2: hand edits adopted from --python /env/bin/python")
    assert check_patch(text, lambda p: ORIGINAL.decode() if p == "flashinfer/jit/cpp_ext.py" else None) == []


@pytest.mark.parametrize("mods, member, why", [
    ([modified("flashinfer/jit/cpp_ext.py", EDITED, record(b"another build\n"))], ORIGINAL,
     "holds another copy than the one installed"),
    ([modified("flashinfer/jit/gone.py", EDITED, record(ORIGINAL))], ORIGINAL, "not in the locked wheel"),
    ([modified("flashinfer/jit/cpp_ext.py", b"\x7fELF\x00\x01", record(ORIGINAL))], ORIGINAL, "a binary file"),
    ([modified("../../../bin/flashinfer", EDITED, record(ORIGINAL), inside=False)], ORIGINAL, "outside site-packages"),
    ([modified("flashinfer_python-0.7.2.dist-info/METADATA", EDITED, record(ORIGINAL))], ORIGINAL,
     "in the distribution's metadata"),
    ([dict(modified("flashinfer/jit/cpp_ext.py", EDITED, record(ORIGINAL)), content=None, omitted="too big")],
     ORIGINAL, "the probe did not carry its bytes (too big)"),
])
def test_an_edit_that_cannot_be_a_patch_is_listed_with_why(mods, member, why):
    patches, (unpatched,) = patches_of(mods, member)
    assert patches == [] and why in unpatched.why and unpatched.fix


def test_an_edit_of_a_distribution_left_out_is_listed():
    patches, (unpatched,) = patches_of([modified("flashinfer/jit/cpp_ext.py", EDITED, record(ORIGINAL))],
                                       pinned=False)
    assert patches == [] and "left out of the recipe" in unpatched.why
