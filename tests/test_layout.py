"""The tests mirror the package (docs/architecture.md): each folder of tests/ is a stage of imagebuild/
(tests/<stage>/test_<module>.py), and the slow tier, the tests that build the big images, is tests/slow/
and nothing else: a slow test anywhere else, or a test in tests/slow/ that is not slow, is reported.
Read from the sources with ast, as the architecture test reads imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "imagebuild"
# Folders of tests/ that are no stage: the slow tier, and the data tests read.
NOT_STAGES = {"slow", "fixtures", "golden"}


def stages(package: Path = PACKAGE) -> set[str]:
    return {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}


def folders_of(tests: Path = TESTS) -> set[str]:
    return {path.name for path in tests.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}


def folder_violations(tests: Path = TESTS, package: Path = PACKAGE) -> list[str]:
    """Folders of tests/ named for no stage of the package."""
    return sorted(folders_of(tests) - NOT_STAGES - stages(package))


def _is_slow_mark(node: ast.AST) -> bool:
    """pytest.mark.slow, or a call of it; a list of marks holds it when any of them is."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(item) for item in node.elts)
    if isinstance(node, ast.Call):
        return _is_slow_mark(node.func)
    return isinstance(node, ast.Attribute) and node.attr == "slow" and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "mark"


def slow_marks(path: Path) -> tuple[bool, dict[str, bool]]:
    """Whether the module is slow as a whole (pytestmark), and each test function's own mark."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                     for t in node.targets) and _is_slow_mark(node.value)
                 for node in tree.body)
    tests = {node.name: any(_is_slow_mark(d) for d in node.decorator_list) for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}
    return module, tests


def slow_tier_violations(tests: Path = TESTS) -> list[str]:
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        module, marks = slow_marks(path)
        in_tier = path.relative_to(tests).parts[0] == "slow"
        for name, own in marks.items():
            slow = module or own
            if slow and not in_tier:
                bad.append(f"{path.relative_to(tests.parent)}::{name} is slow outside tests/slow/")
            elif in_tier and not slow:
                bad.append(f"{path.relative_to(tests.parent)}::{name} is in tests/slow/ but not marked slow")
    return bad


def test_every_test_folder_is_a_stage_of_the_package():
    found = folders_of()
    assert "flows" in found and "slow" in found  # the folders were read: an empty set would pass anything
    assert folder_violations() == []


def test_the_slow_tier_is_tests_slow_and_nothing_else():
    module, marks = slow_marks(TESTS / "slow" / "test_flagship.py")
    assert marks and all(marks.values()) or module  # the marks were read
    assert slow_tier_violations() == []


# ---------------------------------------------------------------- the checks catch what they should

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tests"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        (path.parent / "__init__.py").touch()
    return root


@pytest.mark.parametrize("files, found", [
    ({"flows/test_x.py": "import pytest\n@pytest.mark.slow\ndef test_big():\n    pass\n"},
     "tests/flows/test_x.py::test_big is slow outside tests/slow/"),
    ({"lock/test_y.py": "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.engine]\ndef test_a():\n    pass\n"},
     "tests/lock/test_y.py::test_a is slow outside tests/slow/"),
    ({"slow/test_z.py": "import pytest\n@pytest.mark.engine\ndef test_quick():\n    pass\n"},
     "tests/slow/test_z.py::test_quick is in tests/slow/ but not marked slow"),
])
def test_a_test_on_the_wrong_side_of_the_slow_tier_is_reported(tmp_path, files, found):
    assert slow_tier_violations(_tree(tmp_path, files)) == [found]


def test_slow_tests_in_the_tier_and_quick_ones_outside_pass(tmp_path):
    root = _tree(tmp_path, {"slow/test_a.py": "import pytest\n@pytest.mark.slow\n@pytest.mark.engine\ndef test_a():\n"
                                              "    pass\n",
                            "slow/test_b.py": "import pytest\npytestmark = pytest.mark.slow\ndef test_b():\n    pass\n",
                            "lock/test_c.py": "import pytest\n@pytest.mark.engine\ndef test_c():\n    pass\n"})
    assert slow_tier_violations(root) == []


def test_a_test_folder_named_for_no_stage_is_reported(tmp_path):
    root = _tree(tmp_path, {"flows/test_a.py": "", "publishing/test_b.py": "", "slow/test_c.py": ""})
    package = tmp_path / "imagebuild"
    (package / "flows").mkdir(parents=True)
    (package / "flows" / "__init__.py").touch()
    assert folder_violations(root, package) == ["publishing"]
