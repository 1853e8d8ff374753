"""Skips tell the truth: whatever a test cannot run here for (a missing tool, network, engine, test
dependency or local file) skips it on a developer's machine saying what to install, and fails it under
CI (CI=true, which .ci/run exports), where scripts/host.sh installs everything the suite uses. One helper
says it (tests/conftest.py `cannot_run`); a scan of tests/ finds any skip, or any reading of CI, beside it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, cannot_run, missing_tool, needs_module, under_ci

# Where a skip or a reading of CI may stand: the helper itself.
HELPER = {("tests/conftest.py", "cannot_run"), ("tests/conftest.py", "under_ci")}
SKIPS = {"skip", "skipif", "importorskip"}


def bare_skips(source: str, path: str) -> list[str]:
    """'path:line: what' for each pytest skip (a call, a mark, an import of one) and each reading of the
    CI variable outside HELPER; `pytest.skip.Exception` (what a test of the helper catches) is no skip."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def inside_helper(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef) and (path, node.name) in HELPER:
                return True
        return False

    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Attribute) and node.attr in SKIPS:
            caught = isinstance(parents.get(node), ast.Attribute) and parents[node].attr == "Exception"
            what = None if caught else f"pytest {node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("pytest", "_pytest"):
            what = next((f"import of {a.name}" for a in node.names if a.name in SKIPS), None)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            first = node.args[0]
            if name in ("get", "getenv") and isinstance(first, ast.Constant) and first.value == "CI":
                what = "a reading of CI"
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "CI":
            what = "a reading of CI"
        if what and not inside_helper(node):
            found.append(f"{path}:{node.lineno}: {what}")
    return found


def test_no_skip_in_tests_goes_around_the_helper():
    files = sorted((REPO / "tests").rglob("*.py"))
    assert len(files) > 100  # the scan saw the suite, not an empty folder
    found = [hit for file in files for hit in bare_skips(file.read_text(), str(file.relative_to(REPO)))]
    assert found == [], "skip through tests.conftest.cannot_run (it fails under CI), not directly:\n" + "\n".join(found)


@pytest.mark.parametrize("sample", [
    'import pytest\ndef test_x():\n    pytest.skip("no network")\n',
    'import pytest\n@pytest.mark.skipif(True, reason="no uv")\ndef test_x():\n    pass\n',
    'import pytest\nm = pytest.importorskip("cyclonedx")\n',
    'from pytest import skip\n',
    'import os, pytest\ndef test_x():\n    (pytest.fail if os.environ.get("CI") else print)("no engine")\n',
    'import os\nCI = os.environ["CI"]\n',
    # the helper's name in another file is no helper
    'import pytest\ndef cannot_run(why):\n    pytest.skip(why)\n',
])
def test_a_bare_skip_or_a_reading_of_ci_is_found(sample):
    """The negative control: each way around the helper, in a sample test file, is reported by line."""
    found = bare_skips(sample, "tests/sample.py")
    assert len(found) == 1 and found[0].startswith("tests/sample.py:"), found


def test_the_helper_and_a_test_of_it_are_not_reported():
    helper = (REPO / "tests" / "conftest.py").read_text()
    assert bare_skips(helper, "tests/conftest.py") == []
    assert len(bare_skips(helper, "tests/other.py")) >= 2  # the same text anywhere else is reported
    caught = "import pytest\ndef test_x():\n    with pytest.raises(pytest.skip.Exception):\n        pass\n"
    assert bare_skips(caught, "tests/sample.py") == []


def test_a_missing_tool_is_a_skip_naming_it_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs no-such-tool-imagebuild \(apt-get install -y x\)"):
        missing_tool("sh", "no-such-tool-imagebuild", package="x")


def test_a_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="needs /no/such/file"):
        missing_tool("/no/such/file")


def test_tools_that_are_there_pass(monkeypatch):
    monkeypatch.setenv("CI", "true")
    missing_tool("sh", "/bin/sh")


@pytest.mark.parametrize("value, ci", [("true", True), ("1", True), ("", False), ("false", False), ("0", False)])
def test_what_counts_as_ci(monkeypatch, value, ci):
    monkeypatch.setenv("CI", value)
    assert under_ci() is ci


def test_cannot_run_names_what_to_install_and_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no network \(a reachable PyPI\)"):
        cannot_run("no network", "a reachable PyPI")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"^no network \(a reachable PyPI\)$"):
        cannot_run("no network", "a reachable PyPI")


def test_a_missing_test_dependency_names_the_install(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"imagebuild_no_such_module.*pip install -e '\.\[test\]'"):
        needs_module("imagebuild_no_such_module")
    assert needs_module("json") is sys.modules["json"]


def test_skip_engine_is_refused_under_ci(tmp_path):
    """IMAGEBUILD_SKIP_ENGINE=1 skips the engine's tests on a developer's machine; under CI it fails them.
    Run in a pytest of its own, on a sample test asking for the `engine` fixture."""
    sample = tmp_path / "test_sample_engine.py"
    sample.write_text(textwrap.dedent("""\
        def test_needs_engine(engine):
            pass
        """))
    (tmp_path / "conftest.py").write_text("from tests.conftest import engine  # noqa: F401\n")

    def run(ci: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "IMAGEBUILD_SKIP_ENGINE": "1", "CI": ci, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "",
                               "--rootdir", str(tmp_path), "-c", os.devnull, str(sample)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)

    local, ci = run(""), run("true")
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout + local.stderr
    assert ci.returncode == 1 and "1 error" in ci.stdout and "unset IMAGEBUILD_SKIP_ENGINE" in ci.stdout, ci.stdout


def test_ci_run_exports_ci():
    text = (REPO / ".ci" / "run").read_text()
    assert "export CI=true" in text.split("scripts/host.sh test")[0]
