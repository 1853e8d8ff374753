"""The package's names, read from the source (docs/architecture.md): a stage's API is its public names,
so no module imports another's underscore names; and one Finding type, defined in knowledge/ alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGE, _tree, from_module, is_our_module, module_name, sources


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> list[str] | None:
    """a.b.c as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_name_violations(root: Path = PACKAGE) -> list[str]:
    """Another module's underscore names reached from outside it: `from X import _name`, or `X._name`
    on a module of ours imported under a name. Dunders (__version__) are public."""
    bad = []
    for path in sources(root):
        here = module_name(path, root)
        where = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound = {}  # a local name -> the module of ours it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                module = from_module(node, path, root)
                if not (module == root.name or module.startswith(root.name + ".")):
                    continue
                for alias in node.names:
                    if _private(alias.name) and module != here:
                        bad.append(f"{where}:{node.lineno} imports {alias.name} from {module}")
                    if is_our_module(f"{module}.{alias.name}", root):
                        bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain = _dotted(node.value)
            if not chain or chain[0] not in bound:
                continue
            module = ".".join([bound[chain[0]], *chain[1:]])
            if module != here and is_our_module(module, root):
                bad.append(f"{where}:{node.lineno} reads {node.attr} of {module}")
    return bad


def finding_definitions(root: Path = PACKAGE) -> list[str]:
    """Where a type named Finding is defined (a class, or a name bound to one): "path:line"."""
    found = []
    for path in sources(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            named = node.name == "Finding" if isinstance(node, ast.ClassDef) else isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "Finding" for t in node.targets)
            if named:
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


# ---------------------------------------------------------------- the package as it is

def test_no_module_imports_another_modules_private_names():
    assert private_name_violations() == []


def test_the_one_finding_type_is_defined_in_knowledge():
    definitions = finding_definitions()
    assert definitions and all(d.startswith("knowledge/") for d in definitions), definitions
    assert len(definitions) == 1, definitions


# ---------------------------------------------------------------- the checks catch what they should

@pytest.mark.parametrize("text, found", [
    ("from imagebuild.knowledge.facts import _version\n", "imports _version from imagebuild.knowledge.facts"),
    ("from imagebuild.knowledge.facts import (DATA_FILE,\n    _NOT_CUDA)\n", "imports _NOT_CUDA"),
    ("from .knowledge.facts import _version\n", "imports _version from imagebuild.knowledge.facts"),
    ("from imagebuild.knowledge import facts\nfacts._version('1')\n", "reads _version of imagebuild.knowledge.facts"),
    ("import imagebuild.knowledge.facts as f\nf._load_facts.cache_clear()\n", "reads _load_facts"),
    ("import imagebuild.knowledge.facts\nimagebuild.knowledge.facts._version('1')\n", "reads _version"),
    ("from imagebuild import knowledge\nknowledge.facts._version('1')\n", "reads _version"),
])
def test_a_private_name_from_another_module_is_reported(tmp_path, text, found):
    root = _tree(tmp_path, {"knowledge/facts.py": "_version = _NOT_CUDA = _load_facts = DATA_FILE = None\n",
                            "doctor.py": text})
    bad = private_name_violations(root)
    assert len(bad) == 1 and bad[0].startswith("imagebuild/doctor.py:") and found in bad[0], bad


def test_public_names_dunders_and_a_modules_own_privates_pass(tmp_path):
    root = _tree(tmp_path, {"knowledge/facts.py": "_x = 1\ndef f():\n    return _x\n",
                            "doctor.py": "from imagebuild.knowledge.facts import f\nfrom imagebuild import __version__\n"
                                         "from imagebuild.knowledge import facts\nimport os\nos._exit\n"
                                         "facts.f()\nclass A:\n    def _g(self):\n        return self._h\n"})
    assert private_name_violations(root) == []


@pytest.mark.parametrize("where, text, line", [
    ("doctor.py", "from dataclasses import dataclass\n@dataclass\nclass Finding:\n    status: str\n", 3),
    ("payload/probe/report.py", "import collections\nFinding = collections.namedtuple('Finding', 'name status')\n", 2),
])
def test_a_finding_type_outside_knowledge_is_reported(tmp_path, where, text, line):
    root = _tree(tmp_path, {"knowledge/finding.py": "class Finding:\n    pass\n", where: text})
    assert sorted(finding_definitions(root)) == sorted(["knowledge/finding.py:1", f"{where}:{line}"])
