"""The registry protocol has one home, read from the source (docs/architecture.md): registry/ speaks HTTP to
registries behind its package face, and the flows that use it say what they want (reuse, push, seed), not how.

- no module outside registry/ imports one of registry's modules: only the face, `imagebuild.registry`;
- no module outside registry/ writes a distribution API path (`/v2/...`);
- an HTTP client library is imported only in registry/ and in the modules HTTP_ELSEWHERE names, each with
  the reason it speaks HTTP to something that is no registry.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGE, _tree, imports_of, module_name, sources, stage_of

HTTP_LIBRARIES = ("requests", "urllib.request", "http.client", "urllib3", "httpx", "aiohttp")

# Modules outside registry/ that may import an HTTP client library, and why (none of them talks to a registry).
HTTP_ELSEWHERE = {
    "lock/artifacts.py": "downloads the locked wheels from their package index, each checked against its hash",
    "lock/remote_wheel.py": "reads a wheel's metadata from its package index with HTTP range requests",
    "bootstrap/mirror.py": "fetches Debian's indices and .debs from a mirror, each checked against its sha256",
    "engine/docker.py": "catches the Docker SDK's transport errors, which are requests' exceptions",
}


def http_imports(path: Path, root: Path) -> list[tuple[str, int]]:
    """(HTTP client library module, line) for each import of one in the file (`from urllib import request` too)."""
    found = imports_of(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found += [(f"{node.module}.{alias.name}", node.lineno) for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level for alias in node.names]
    return sorted({(m, line) for m, line in found
                   if any(m == lib or m.startswith(lib + ".") for lib in HTTP_LIBRARIES)}, key=lambda f: f[1])


def api_paths(path: Path) -> list[int]:
    """Lines of string constants (f-strings' parts included) that write a distribution API path."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/v2/" in node.value})


def registry_violations(root: Path = PACKAGE, elsewhere: dict[str, str] = HTTP_ELSEWHERE) -> list[str]:
    """Registry modules imported, distribution API paths written, or HTTP spoken, outside registry/."""
    bad = []
    for path in sources(root):
        if stage_of(module_name(path, root)) == "registry":
            continue
        where = path.relative_to(root.parent)
        for module, line in imports_of(path, root):
            if module.startswith(f"{root.name}.registry."):
                bad.append(f"{where}:{line}: imports {module}; import the package face, {root.name}.registry")
        bad += [f"{where}:{line}: writes a registry API path (/v2/); ask registry/ for it" for line in api_paths(path)]
        if path.relative_to(root).as_posix() not in elsewhere:
            bad += [f"{where}:{line}: imports {module}, an HTTP client, outside registry/"
                    for module, line in http_imports(path, root)]
    return bad


def test_the_registry_protocol_is_spoken_in_registry_only():
    assert registry_violations() == []


def test_the_rule_sees_what_it_checks():
    """Not a verdict over an empty set: registry/ itself speaks HTTP and writes /v2/ paths, and each exception
    names a module that is there and does import an HTTP client (else it is stale: drop it)."""
    registry = [p for p in sources() if stage_of(module_name(p)) == "registry"]
    assert any(http_imports(p, PACKAGE) for p in registry) and any(api_paths(p) for p in registry)
    for name in HTTP_ELSEWHERE:
        assert http_imports(PACKAGE / name, PACKAGE), f"{name} imports no HTTP client: drop it from HTTP_ELSEWHERE"


# ---------------------------------------------------------------- the check catches what it should

REGISTRY = {"registry/__init__.py": "from imagebuild.registry.client import Connection\n",
            "registry/client.py": "import requests\nPING = '/v2/'\nclass Connection: pass\n",
            "lock/artifacts.py": "import requests\n"}


@pytest.mark.parametrize("path, text, said", [
    ("flows/by_lock.py", "from imagebuild.registry.client import Connection\n", "imports imagebuild.registry.client"),
    ("flows/by_lock.py", "def f():\n    from imagebuild.registry import client\n", "imports imagebuild.registry.client"),
    ("flows/kernels/layer.py", "def f(c, r):\n    return c.request('GET', f'/v2/{r}/blobs/x')\n", "(/v2/)"),
    ("flows/by_lock.py", "import requests\n", "imports requests, an HTTP client"),
    ("cli/app.py", "from urllib import request\n", "imports urllib.request, an HTTP client"),
    ("image/export.py", "import http.client as h\n", "imports http.client, an HTTP client"),
])
def test_the_registry_protocol_spoken_outside_registry_is_reported(tmp_path, path, text, said):
    root = _tree(tmp_path, {**REGISTRY, path: "from imagebuild.registry import Connection\n" + text})
    bad = registry_violations(root, {"lock/artifacts.py": "wheels"})
    assert len(bad) == 1 and bad[0].startswith(f"imagebuild/{path}:") and said in bad[0], bad


def test_the_package_face_and_a_listed_exception_pass(tmp_path):
    root = _tree(tmp_path, {**REGISTRY, "flows/by_lock.py": "from imagebuild.registry import Connection\n"
                                                            "from urllib.parse import urlsplit\n",
                            "cli/publish.py": "from imagebuild import registry\n"})
    assert registry_violations(root, {"lock/artifacts.py": "wheels"}) == []
    assert registry_violations(root, {}) == ["imagebuild/lock/artifacts.py:1: imports requests, an HTTP client, "
                                             "outside registry/"]
