"""apply_patch: exact unified-diff application to an installed distribution, RECORD kept true."""

from __future__ import annotations

import ast
import base64
import csv
import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.payload import apply_patch
from imagebuild.payload.apply_patch import PatchError, apply_to_text, check_patch, parse_patch
from tests.conftest import cannot_run

SCRIPT = Path(apply_patch.__file__)
FIXTURES = Path(__file__).parent.parent / "fixtures" / "patches"
REPO = Path(__file__).resolve().parents[2]
FLASHINFER_PATCH = REPO / "recipes" / "patches" / "flashinfer-cuda-version.patch"
FLASHINFER_WHEEL = "flashinfer_python-0.7.2-py3-none-any.whl"
FLASHINFER_WHEEL_SHA256 = "770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8"
CACHE = Path(os.environ.get("IMAGEBUILD_TEST_CACHE", Path.home() / ".cache" / "imagebuild-tests"))


# ---- a small installed distribution to patch ---------------------------------------------------

def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, files: dict[str, bytes], name: str = "demo-dist", version: str = "0.1") -> Path:
    """Lay out `files` and a dist-info the way pip does (RECORD with CRLF rows); return dist-info."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    rows = []
    for path, data in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
        rows.append([path, record_hash(data), str(len(data))])
    rows += [[f"{info.name}/METADATA", record_hash((info / "METADATA").read_bytes()),
              str((info / "METADATA").stat().st_size)], [f"{info.name}/RECORD", "", ""]]
    with open(info / "RECORD", "w", newline="") as record:
        csv.writer(record).writerows(rows)  # lineterminator \r\n, as pip writes it
    return info


def demo_site(tmp_path: Path) -> tuple[Path, Path]:
    site = tmp_path / "site-packages"
    before = FIXTURES / "before"
    files = {p.relative_to(before).as_posix(): p.read_bytes() for p in sorted(before.rglob("*.py"))}
    return site, install(site, files)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode)
            for p in sorted(root.rglob("*")) if p.is_file()}


def record_of(info: Path) -> dict[str, list[str]]:
    with open(info / "RECORD", newline="") as record:
        return {row[0]: row for row in csv.reader(record)}


def write_patch(tmp_path: Path, text: str, name: str = "fix.patch") -> tuple[Path, str]:
    path = tmp_path / name
    path.write_text(text)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def apply(site: Path, patch: Path, sha: str, package: str = "demo-dist", strip: int = 1):
    return apply_patch.apply_patch_file(str(site), str(patch), package=package, sha256=sha,
                                        strip=strip)


def unified(a: str, b: str, name: str = "f", n: int = 3) -> str:
    """difflib's unified diff with the '\\ No newline at end of file' marker difflib leaves out."""
    out = []
    for line in difflib.unified_diff(apply_patch.split_lines(a), apply_patch.split_lines(b),
                                     f"a/{name}", f"b/{name}", n=n):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# ---- applying to a site-packages -----------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["demo.git.patch", "demo.diff-u.patch"])
def test_clean_apply_updates_files_record_and_patches_file(tmp_path, fixture):
    site, info = demo_site(tmp_path)
    patch = FIXTURES / fixture
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()

    lines = apply(site, patch, sha)

    assert lines == ["patched demo/__init__.py (demo-dist 0.1)", "patched demo/core.py (demo-dist 0.1)",
                     "created demo/extra.py (demo-dist 0.1)", "deleted demo/legacy.py (demo-dist 0.1)"]
    after = FIXTURES / "after"
    for expected in after.rglob("*.py"):
        assert (site / expected.relative_to(after)).read_bytes() == expected.read_bytes()
    assert not (site / "demo" / "legacy.py").exists()
    record = record_of(info)
    for path in ("demo/__init__.py", "demo/core.py", "demo/extra.py",
                 f"{info.name}/IMAGEBUILD_PATCHES"):
        data = (site / path).read_bytes()
        assert record[path][1:] == [record_hash(data), str(len(data))], path
    assert "demo/legacy.py" not in record
    assert (info / "RECORD").read_bytes().count(b"\r\n") == len(record)  # pip's CRLF rows kept
    assert (info / "IMAGEBUILD_PATCHES").read_text() == f"{sha}  {fixture}\n"
    assert not list(site.rglob(".imagebuild-*"))


def test_second_patch_is_appended_and_reapplying_is_refused(tmp_path):
    site, info = demo_site(tmp_path)
    first = FIXTURES / "demo.git.patch"
    first_sha = hashlib.sha256(first.read_bytes()).hexdigest()
    apply(site, first, first_sha)
    text = (site / "demo/extra.py").read_text()
    second, second_sha = write_patch(tmp_path, unified(text, text + "\nMORE = 1\n", "demo/extra.py"))

    assert apply(site, second, second_sha) == ["patched demo/extra.py (demo-dist 0.1)"]
    assert (info / "IMAGEBUILD_PATCHES").read_text().splitlines() == [
        f"{first_sha}  demo.git.patch", f"{second_sha}  fix.patch"]
    with pytest.raises(PatchError, match="already applied to demo-dist 0.1"):
        apply(site, second, second_sha)


def test_context_mismatch_names_file_hunk_lines_and_writes_nothing(tmp_path):
    site, _ = demo_site(tmp_path)
    core = site / "demo" / "core.py"
    core.write_bytes(core.read_bytes().replace(b"whisper", b"murmur"))  # the installed file moved on
    before = snapshot(site)

    with pytest.raises(PatchError) as caught:
        apply(site, FIXTURES / "demo.git.patch",
              hashlib.sha256((FIXTURES / "demo.git.patch").read_bytes()).hexdigest())

    message = str(caught.value)
    assert message.startswith("demo/core.py: hunk 2 of 2 (@@ -7,4 +7,4 @@ def shout(name):) does "
                              "not apply at line 9:\n")
    assert "  expected: 'def whisper(name):'\n  found:    'def murmur(name):'\n" in message
    assert "regenerate the patch against the locked version" in message
    assert "installed: demo-dist 0.1" in message
    assert snapshot(site) == before  # demo/__init__.py matched, yet was not written either


def test_mismatch_past_end_of_file_and_missing_newline_are_shown(tmp_path):
    fp = parse_patch(unified("a\nb\nc\n", "a\nB\nc\n"))[0]
    with pytest.raises(PatchError, match=r"found:    end of file \(the file has 1 lines\)"):
        apply_to_text(fp, "a\n")
    with pytest.raises(PatchError, match=r"found:    'c' \(no newline at end of file\)"):
        apply_to_text(fp, "a\nb\nc")


def test_no_offset_and_no_fuzz(tmp_path):
    fp = parse_patch(unified("one\ntwo\nthree\n", "one\n2\nthree\n"))[0]
    assert apply_to_text(fp, "one\ntwo\nthree\n") == "one\n2\nthree\n"
    with pytest.raises(PatchError, match="does not apply at line 1"):
        apply_to_text(fp, "zero\none\ntwo\nthree\n")  # same lines one further down: refused
    with pytest.raises(PatchError, match=r"expected: 'two'\n  found:    'two '"):
        apply_to_text(fp, "one\ntwo \nthree\n")  # whitespace counts


def test_wrong_sha256_is_refused_before_reading_the_patch(tmp_path):
    site, _ = demo_site(tmp_path)
    before = snapshot(site)
    with pytest.raises(PatchError, match="sha256 is [0-9a-f]{64}, the lock says 0{64}: the build "
                                         "context is stale or was altered"):
        apply(site, FIXTURES / "demo.git.patch", "0" * 64)
    assert snapshot(site) == before


@pytest.mark.parametrize("path, strip", [("a/../../etc/passwd", 1), ("/etc/passwd", 0),
                                         ("a/demo/../../x", 1), ("..", 0)])
def test_paths_that_escape_site_packages_are_refused(tmp_path, path, strip):
    site, _ = demo_site(tmp_path)
    patch, sha = write_patch(tmp_path, f"--- {path}\n+++ {path}\n@@ -1 +1 @@\n-x\n+y\n")
    with pytest.raises(PatchError, match="refused"):
        apply(site, patch, sha, strip=strip)


def test_symlink_out_of_site_packages_is_refused(tmp_path):
    site, _ = demo_site(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (site / "demo" / "link").symlink_to(outside)
    patch, sha = write_patch(tmp_path, unified("", "x\n", "demo/link/evil.py"))
    with pytest.raises(PatchError, match="outside .*; refused"):
        apply(site, patch, sha)
    assert not list(outside.iterdir())


@pytest.mark.parametrize("strip, prefix", [(0, ""), (1, "a/"), (3, "x/y/z/")])
def test_strip_levels(tmp_path, strip, prefix):
    site, _ = demo_site(tmp_path)
    core = (site / "demo/core.py").read_text()
    text = unified(core, core.replace("hello", "hi")).replace("a/f", f"{prefix}demo/core.py") \
        .replace("b/f", f"{prefix}demo/core.py")
    patch, sha = write_patch(tmp_path, text)
    assert apply(site, patch, sha, strip=strip) == ["patched demo/core.py (demo-dist 0.1)"]
    assert '"hi " + name' in (site / "demo/core.py").read_text()


def test_strip_beyond_the_path_is_an_error():
    with pytest.raises(PatchError, match="cannot strip 2 leading component"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n")[0].target(2)


def test_new_file_is_created_and_recorded_but_never_overwrites(tmp_path):
    site, info = demo_site(tmp_path)
    patch, sha = write_patch(tmp_path, "diff --git a/demo/bin.py b/demo/bin.py\nnew file mode 100755\n"
                                       "--- /dev/null\n+++ b/demo/bin.py\n@@ -0,0 +1 @@\n+run()\n")
    assert apply(site, patch, sha) == ["created demo/bin.py (demo-dist 0.1)"]
    assert (site / "demo/bin.py").read_text() == "run()\n"
    assert (site / "demo/bin.py").stat().st_mode & 0o777 == 0o755
    assert record_of(info)["demo/bin.py"][1] == record_hash(b"run()\n")

    again, sha = write_patch(tmp_path, "--- /dev/null\n+++ b/demo/core.py\n@@ -0,0 +1 @@\n+x\n", "2.patch")
    with pytest.raises(PatchError, match="demo/core.py: the patch creates this file, but it already exists"):
        apply(site, again, sha)


def test_empty_file_created_and_deleted_from_git_headers(tmp_path):
    site, info = demo_site(tmp_path)
    (site / "demo/empty.txt").write_bytes(b"")
    with open(info / "RECORD", "a", newline="") as record:
        csv.writer(record).writerow(["demo/empty.txt", record_hash(b""), "0"])
    patch, sha = write_patch(tmp_path, "diff --git a/demo/py.typed b/demo/py.typed\nnew file mode 100644\n"
                                       "index 0000000..e69de29\n"
                                       "diff --git a/demo/empty.txt b/demo/empty.txt\n"
                                       "deleted file mode 100644\nindex e69de29..0000000\n")
    assert apply(site, patch, sha) == ["created demo/py.typed (demo-dist 0.1)",
                                       "deleted demo/empty.txt (demo-dist 0.1)"]
    assert (site / "demo/py.typed").read_bytes() == b"" and not (site / "demo/empty.txt").exists()
    assert "demo/empty.txt" not in record_of(info) and "demo/py.typed" in record_of(info)


def test_deletion_needs_the_whole_file_to_match(tmp_path):
    fp = parse_patch("--- a/f\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")[0]
    assert fp.is_deletion
    with pytest.raises(PatchError, match="holds more than the patch removes"):
        apply_patch.apply_file_patch(fp, "f", "a\nb\nc\n")
    assert apply_patch.apply_file_patch(fp, "f", "a\nb\n") is None


@pytest.mark.parametrize("old, new", [("a\nb", "a\nc"), ("a\nb", "a\nb\n"), ("a\nb\n", "a\nb"),
                                      ("x\n", "x\ny"), ("", "z"), ("only", "")])
def test_no_newline_at_end_of_file_both_ways(old, new):
    text = unified(old, new)
    fp = parse_patch(text)[0]
    assert "\\ No newline at end of file" in text
    assert apply_to_text(fp, old) == new


def test_marker_in_the_middle_of_a_file_is_refused():
    with pytest.raises(PatchError, match="follows a line that is not the last of its side"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+A\n\\ No newline at end of file\n b\n")
    fp = parse_patch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+A\n\\ No newline at end of file\n")[0]
    with pytest.raises(PatchError, match="would not end the file"):
        apply_to_text(fp, "a\nb\n")


def test_file_modes_are_kept(tmp_path):
    site, _ = demo_site(tmp_path)
    core = site / "demo/core.py"
    core.chmod(0o750)
    text = core.read_text()
    patch, sha = write_patch(tmp_path, unified(text, "# top\n" + text, "demo/core.py"))
    apply(site, patch, sha)
    assert core.stat().st_mode & 0o777 == 0o750


def test_files_of_another_distribution_are_refused(tmp_path):
    site, _ = demo_site(tmp_path)
    install(site, {"other/mod.py": b"x = 1\n"}, name="other-dist")
    patch, sha = write_patch(tmp_path, unified("x = 1\n", "x = 2\n", "other/mod.py"))
    with pytest.raises(PatchError, match="other/mod.py: not listed in the RECORD of demo-dist 0.1"):
        apply(site, patch, sha)
    assert apply(site, patch, sha, package="Other_Dist") == ["patched other/mod.py (other-dist 0.1)"]
    with pytest.raises(PatchError, match="nope is not installed in"):
        apply(site, patch, sha, package="nope")


def test_stale_bytecode_of_a_patched_module_is_removed(tmp_path):
    site, info = demo_site(tmp_path)
    pyc = site / "demo/__pycache__/core.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale")
    with open(info / "RECORD", "a", newline="") as record:
        csv.writer(record).writerow(["demo/__pycache__/core.cpython-311.pyc", "", ""])
    text = (site / "demo/core.py").read_text()
    patch, sha = write_patch(tmp_path, unified(text, text + "\n", "demo/core.py"))
    apply(site, patch, sha)
    assert not pyc.exists() and "demo/__pycache__/core.cpython-311.pyc" not in record_of(info)


# ---- the script as the image build runs it ---------------------------------------------------------

def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          check=False, timeout=60)


def test_script_exit_codes_and_messages(tmp_path):
    site, _ = demo_site(tmp_path)
    patch = FIXTURES / "demo.git.patch"
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    ok = run_script("--strip", "1", "--package", "demo-dist", "--sha256", sha, str(site), str(patch))
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout.splitlines()[0] == "patched demo/__init__.py (demo-dist 0.1)"

    again = run_script("--strip", "1", "--package", "demo-dist", "--sha256", sha, str(site), str(patch))
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("apply_patch: error: ") and "already applied" in again.stderr

    garbage = tmp_path / "garbage.patch"
    garbage.write_bytes(b"--- a/x\n+++ b/x\n@@ -1,99999999 +1 @@\n\xff\xfe\x00" + os.urandom(64))
    gsha = hashlib.sha256(garbage.read_bytes()).hexdigest()
    for args in (["--package", "demo-dist", "--sha256", gsha, str(site), str(garbage)],
                 ["--package", "demo-dist", "--sha256", "nothex", str(site), str(patch)],
                 ["--strip", "two", "--package", "demo-dist", "--sha256", sha, str(site), str(patch)],
                 ["--package", "demo-dist", "--sha256", sha, str(tmp_path / "missing"), str(patch)]):
        bad = run_script(*args)
        assert bad.returncode == 1, args
        assert bad.stderr.startswith("apply_patch: error: ") and "Traceback" not in bad.stderr, bad.stderr


def test_script_is_stdlib_only_and_python39_syntax():
    tree = ast.parse(SCRIPT.read_text(), feature_version=(3, 9))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


# ---- parsing and checking, without writing -------------------------------------------------------

def test_parse_git_and_plain_forms():
    git = parse_patch((FIXTURES / "demo.git.patch").read_text())
    plain = parse_patch((FIXTURES / "demo.diff-u.patch").read_text())
    assert [(p.target(1), p.is_new, p.is_deletion) for p in git] == \
        [(p.target(1), p.is_new, p.is_deletion) for p in plain] == [
            ("demo/__init__.py", False, False), ("demo/core.py", False, False),
            ("demo/extra.py", True, False), ("demo/legacy.py", False, True)]
    assert [h.lines for p in git for h in p.hunks] == [h.lines for p in plain for h in p.hunks]
    assert git[1].hunks[1].header == "@@ -7,4 +7,4 @@ def shout(name):"


def test_quoted_git_paths():
    fp = parse_patch('diff --git "a/d\\303\\251j\\303\\240 vu.py" "b/d\\303\\251j\\303\\240 vu.py"\n'
                     'new file mode 100644\n--- /dev/null\n+++ "b/d\\303\\251j\\303\\240 vu.py"\n'
                     "@@ -0,0 +1 @@\n+x\n")[0]
    assert fp.target(1) == "déjà vu.py" and fp.is_new


@pytest.mark.parametrize("text, message", [
    ("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n", "is truncated"),
    ("--- a/f\n+++ b/f\n@@ -1,999999999 +1,999999999 @@\n a\n", "is truncated"),
    ("--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n a\n-b\n+c\n", "more lines than the header counts"),
    ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n?b\n", "is not a hunk line"),
    ("--- a/f\n+++ b/f\n@@ -1,99999999999999 +1 @@\n", "malformed hunk header"),
    ("--- a/f\n+++ b/f\n@@ -0,1 +0,1 @@\n-a\n+b\n", "cannot start at line 0"),
    ("@@ -1 +1 @@\n-a\n+b\n", "comes before any file header"),
    ("--- a/f\n+++ b/f\nno hunk\n", "followed by no hunk"),
    ("diff --git a/f b/g\nrename from f\nrename to g\n", "renames are not supported"),
    ("diff --git a/f b/f\nold mode 100644\nnew mode 100755\n", "mode changes are not supported"),
    ("diff --git a/f b/f\nindex 1..2\nGIT binary patch\nliteral 1\n", "binary patches"),
])
def test_malformed_patches_are_patch_errors(text, message):
    with pytest.raises(PatchError, match=message):
        parse_patch(text)


def test_hunks_out_of_order_are_refused():
    fp = parse_patch("--- a/f\n+++ b/f\n@@ -3 +3 @@\n-c\n+C\n@@ -1 +1 @@\n-a\n+A\n")[0]
    with pytest.raises(PatchError, match=r"hunk 2 of 2 \(@@ -1 \+1 @@\) starts inside or before"):
        apply_to_text(fp, "a\nb\nc\n")


def test_check_patch_reports_every_problem_and_writes_nothing():
    text = (FIXTURES / "demo.git.patch").read_text()
    before = FIXTURES / "before"
    files = {p.relative_to(before).as_posix(): p.read_text() for p in before.rglob("*.py")}
    assert check_patch(text, files.get) == []
    files["demo/core.py"] = files["demo/core.py"].replace("hello", "hi")
    del files["demo/legacy.py"]
    problems = check_patch(text, files.get)
    assert len(problems) == 2
    assert problems[0].startswith("demo/core.py: hunk 1 of 2 (@@ -1,5 +1,5 @@) does not apply at line 2")
    assert problems[1].startswith("demo/legacy.py: not found")
    assert check_patch("", files.get) == ["the patch changes no file"]
    assert check_patch(text, files.get, strip=5)[0].startswith("b/demo/__init__.py: cannot strip 5")


# ---- properties --------------------------------------------------------------------------------

PATCHISH = st.lists(st.one_of(
    st.sampled_from(["--- a/f", "+++ b/f", "--- /dev/null", "+++ /dev/null", "@@ -1 +1 @@",
                     "@@ -1,2 +1,2 @@", "@@ -0,0 +1 @@", "@@ -1 +0,0 @@", " a", "-a", "+b", "",
                     "\\ No newline at end of file", "diff --git a/f b/f", "new file mode 100644",
                     "deleted file mode 100644", "index 1..2", 'diff --git "a/\\', '--- "a/\\777"',
                     "--- a/f\t1970-01-01 00:00:00 +0000", "diff --git a/f", "--- ../x", "+++ /abs"]),
    st.text(max_size=12)), max_size=30).map("\n".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(), PATCHISH, st.binary().map(lambda b: b.decode("utf-8", "surrogateescape"))),
       files=st.dictionaries(st.sampled_from(["f", "x", "a/f"]), st.text(alphabet="ab\n\r", max_size=10)),
       strip=st.integers(0, 2))
def test_any_input_raises_nothing_but_patch_error(text, files, strip):
    try:
        for fp in parse_patch(text):
            try:
                apply_to_text(fp, files.get("f", ""))
            except PatchError:
                pass
    except PatchError as err:
        assert str(err)
    assert isinstance(check_patch(text, files.get, strip=strip), list)


LINES = st.lists(st.text(alphabet="ab \t\r-+@\\", max_size=4), max_size=12)


@settings(max_examples=300, deadline=None)
@given(original=LINES, edited=LINES, end_a=st.booleans(), end_b=st.booleans(), n=st.integers(0, 3))
def test_difflib_diffs_apply_back_to_the_edited_text(original, edited, end_a, end_b, n):
    a = "\n".join(original) + ("\n" if end_a and original else "")
    b = "\n".join(edited) + ("\n" if end_b and edited else "")
    text = unified(a, b, n=n)
    if a == b:
        assert text == ""
        return
    [fp] = parse_patch(text)
    assert apply_to_text(fp, a) == b
    assert check_patch(text, {"f": a}.get) == []


# ---- the recipe's FlashInfer patch, against the real 0.7.2 wheel -----------------------------------

@pytest.fixture(scope="module")
def flashinfer_wheel() -> Path:
    """flashinfer-python 0.7.2 from PyPI, downloaded once into the test cache."""
    wheel = CACHE / FLASHINFER_WHEEL
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                              "flashinfer-python==0.7.2", "-d", str(CACHE)],
                             capture_output=True, text=True, check=False, timeout=600)
        if got.returncode or not wheel.exists():
            cannot_run(f"PyPI unreachable, flashinfer-python 0.7.2 not downloaded: {got.stderr[-300:]}",
                       "a reachable PyPI")
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == FLASHINFER_WHEEL_SHA256
    return wheel


@pytest.fixture
def flashinfer_site(tmp_path, flashinfer_wheel) -> Path:
    """The wheel's dist-info and cpp_ext.py, laid out as an installer would."""
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(flashinfer_wheel) as wheel:
        for name in wheel.namelist():
            if ".dist-info/" in name or name == "flashinfer/jit/cpp_ext.py":
                wheel.extract(name, site)
    return site


def test_flashinfer_patch_applies_to_the_real_wheel(flashinfer_site):
    sha = hashlib.sha256(FLASHINFER_PATCH.read_bytes()).hexdigest()
    done = run_script("--strip", "1", "--package", "flashinfer-python", "--sha256", sha,
                      str(flashinfer_site), str(FLASHINFER_PATCH))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "patched flashinfer/jit/cpp_ext.py (flashinfer-python 0.7.2)\n"
    info = flashinfer_site / "flashinfer_python-0.7.2.dist-info"
    patched = (flashinfer_site / "flashinfer/jit/cpp_ext.py").read_bytes()
    assert record_of(info)["flashinfer/jit/cpp_ext.py"][1:] == [record_hash(patched), str(len(patched))]
    assert (info / "IMAGEBUILD_PATCHES").read_text() == f"{sha}  flashinfer-cuda-version.patch\n"


def cuda_version_function(source: str, torch_cuda: str | None, nvcc_output: str):
    """get_cuda_version from cpp_ext.py source, run against stand-ins that log subprocess calls."""
    calls = []

    def check_output(args, **kwargs):
        calls.append(args)
        return nvcc_output

    def run(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 1, b"", b"")

    tree = ast.parse(source)
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                 and node.name in ("get_cuda_path", "get_cuda_version")]
    from packaging.version import Version
    namespace = {"functools": __import__("functools"), "os": os, "re": __import__("re"),
                 "Version": Version,
                 "torch": types.SimpleNamespace(version=types.SimpleNamespace(cuda=torch_cuda)),
                 "subprocess": types.SimpleNamespace(check_output=check_output, run=run,
                                                     CalledProcessError=subprocess.CalledProcessError)}
    # the function's own source, from the patched file, run here without importing flashinfer
    exec(compile(ast.Module(body=functions, type_ignores=[]), "cpp_ext.py", "exec"), namespace)  # noqa: S102
    return namespace["get_cuda_version"], calls


def test_patched_get_cuda_version_answers_without_a_subprocess(flashinfer_site, monkeypatch):
    upstream = (flashinfer_site / "flashinfer/jit/cpp_ext.py").read_text()
    [fp] = parse_patch(FLASHINFER_PATCH.read_text())
    patched = apply_to_text(fp, upstream)
    monkeypatch.delenv("FLASHINFER_CUDA_VERSION", raising=False)
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")
    nvcc = "Cuda compilation tools, release 13.5, V13.5.37\n"

    get, calls = cuda_version_function(upstream, "13.0", nvcc)
    assert (str(get()), len(calls)) == ("13.5", 1)  # upstream: nvcc first, a subprocess

    get, calls = cuda_version_function(patched, "13.0", nvcc)
    assert (str(get()), calls) == ("13.0", [])  # patched: torch's CUDA, no subprocess
    assert type(get()).__name__ == "Version"  # the return type stays packaging's Version

    monkeypatch.setenv("FLASHINFER_CUDA_VERSION", "12.9")
    get, calls = cuda_version_function(patched, "13.0", nvcc)
    assert (str(get()), calls) == ("12.9", [])

    monkeypatch.delenv("FLASHINFER_CUDA_VERSION")
    get, calls = cuda_version_function(patched, None, nvcc)  # CPU torch: nvcc, the last resort
    assert (str(get()), calls) == ("13.5", [["/opt/cuda/bin/nvcc", "--version"]])


@pytest.fixture(scope="module")
def torch_python() -> Path:
    """A cached venv with the CPU torch 2.13.0 (and packaging), for a real torch.compile check."""
    venv = CACHE / "venv-torch-2.13.0-cpu"
    python = venv / "bin" / "python"
    if not (venv / "ready").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        got = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0+cpu",
                              "packaging"], capture_output=True, text=True, check=False, timeout=900)
        if got.returncode:
            shutil.rmtree(venv, ignore_errors=True)
            cannot_run(f"CPU torch 2.13.0 not installable here: {got.stderr[-300:]}",
                       "torch-2.13.0+cpu's wheel, from PyTorch's CPU index, in a folder PIP_FIND_LINKS names")
        (venv / "ready").touch()
    return python


DYNAMO_CHECK = """
import ast, functools, os, re, subprocess, sys
import torch
from packaging.version import Version
source = open(sys.argv[1]).read()
functions = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)
             and n.name in ("get_cuda_path", "get_cuda_version")]
namespace = dict(functools=functools, os=os, re=re, subprocess=subprocess, torch=torch,
                 Version=Version)
exec(compile(ast.Module(body=functions, type_ignores=[]), "cpp_ext.py", "exec"), namespace)
torch.version.cuda = "13.0"  # what a CUDA build of torch reports
def step(x):
    return x + (1 if namespace["get_cuda_version"]() >= Version("12.8") else 0)
out = torch.compile(step, fullgraph=True, backend="eager")(torch.zeros(2))
print(out.tolist(), namespace["get_cuda_version"]())
"""


def test_patched_get_cuda_version_compiles_under_dynamo(flashinfer_site, torch_python, tmp_path):
    upstream = flashinfer_site / "flashinfer/jit/cpp_ext.py"
    patched = tmp_path / "cpp_ext.py"
    patched.write_text(apply_to_text(parse_patch(FLASHINFER_PATCH.read_text())[0], upstream.read_text()))
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"  # would answer 13.5, and leaves a trace if run
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\ntouch {tmp_path}/nvcc-ran\necho 'Cuda compilation tools, release 13.5, V13.5.37'\n")
    nvcc.chmod(0o755)
    script = tmp_path / "dynamo_check.py"
    script.write_text(DYNAMO_CHECK)
    env = {**os.environ, "CUDA_HOME": str(nvcc.parent.parent)}
    env.pop("FLASHINFER_CUDA_VERSION", None)

    good = subprocess.run([str(torch_python), str(script), str(patched)], capture_output=True,
                          text=True, env=env, check=False, timeout=300)
    assert good.returncode == 0, good.stderr[-2000:]
    assert good.stdout.strip().splitlines()[-1] == "[1.0, 1.0] 13.0"
    assert not (tmp_path / "nvcc-ran").exists()

    bad = subprocess.run([str(torch_python), str(script), str(upstream)], capture_output=True,
                         text=True, env=env, check=False, timeout=300)
    assert bad.returncode != 0 and "Unsupported" in bad.stderr  # the bug the patch fixes


@settings(max_examples=150, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 60), st.sampled_from(["drop", "double", "flip"])),
                      min_size=1, max_size=3))
def test_a_damaged_patch_applies_whole_or_not_at_all(tmp_path_factory, edits):
    lines = (FIXTURES / "demo.git.patch").read_text().splitlines(keepends=True)
    for index, edit in edits:
        index %= len(lines)
        if edit == "drop":
            del lines[index]
        elif edit == "double":
            lines.insert(index, lines[index])
        else:
            lines[index] = lines[index][::-1]
    site, _ = demo_site(tmp_path_factory.mktemp("site"))
    patch, sha = write_patch(site.parent, "".join(lines))
    before = snapshot(site)
    try:
        apply(site, patch, sha)
    except PatchError:
        assert snapshot(site) == before
