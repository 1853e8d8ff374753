"""The package's two boundaries and its one-way imports, read from the source (docs/architecture.md).

- payload/ (copied into images, run on the image's own Python) imports only the standard library
  and itself;
- each stage imports only the stages below it (ALLOWED); nothing outside cli/ imports cli/;
- no import cycle between modules, nor between stages;
- only render/ (paths.py) and payload/ write an in-image path (/opt/imagebuild/..., /run/imagebuild/...);
  every Dockerfile template (*.j2) sits in render/.
- (test_architecture_names.py) no module imports another's underscore names, and one Finding type;
- (test_architecture_targets.py) the two publish targets, registry/ and lxc/, do not import each other.
- (test_architecture_registry.py) only registry/ speaks the registry protocol: no other module imports its
  modules (only its face) or writes a /v2/ path, and an HTTP client is imported only where a reason is listed.

Every import counts, those inside functions included: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "imagebuild"

# Stage -> the stages it may import ("" is imagebuild/__init__.py: the version). errors and common
# are the low modules every stage may use; they import nothing of ours. recipe/ is a leaf of plain types
# (the CUDA vocabulary included); knowledge/ sits above it, since a recipe is what its rules judge.
LOW = {"", "errors", "common"}
ALLOWED = {
    "errors": set(),
    "common": set(),
    "payload": set(),
    "recipe": LOW,
    "knowledge": LOW | {"payload", "recipe"},
    "engine": LOW,
    "base": LOW,
    "bootstrap": LOW | {"base", "engine", "recipe"},
    "lock": LOW | {"base", "knowledge", "payload", "recipe"},
    "render": LOW | {"lock", "payload", "recipe"},
    "image": LOW | {"engine", "lock", "render"},
    "registry": LOW | {"image"},
    "lxc": LOW | {"engine", "image"},
    "flows": LOW | {"base", "bootstrap", "engine", "image", "knowledge", "lock", "payload", "recipe", "registry",
                    "render"},
    "adopt": LOW | {"base", "engine", "knowledge", "lock", "payload", "recipe"},
    "cli": LOW | {"adopt", "base", "bootstrap", "engine", "flows", "image", "knowledge", "lock", "lxc",
                  "payload", "recipe", "registry", "render"},
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def from_module(node: ast.ImportFrom, path: Path, root: Path = PACKAGE) -> str:
    """The absolute module a `from ... import` statement in `path` names, relative ones resolved."""
    if not node.level:
        return node.module or ""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    if node.level - 1 > len(package.split(".")) - 1:
        base = ["<outside>"]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, root: Path = PACKAGE, faces: bool = False) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import statement in the file, relative ones resolved.
    `from X import name` counts as X.name when that is a module of ours, else as X. With faces, every
    package's __init__ the import runs counts too: X itself for `from X import module` (the name is
    looked up on X's face first), and each package above the module imported that does not hold this file
    (`import a.b.c` runs a/__init__ and a/b/__init__ first)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = module_name(path, root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = from_module(node, path, root)
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.append((candidate if is_our_module(candidate, root) else module, node.lineno))
                if faces and is_our_module(candidate, root):
                    found.append((module, node.lineno))
    if faces:
        parents = {(".".join(module.split(".")[:end]), line) for module, line in found
                   for end in range(2, module.count(".") + 1)}
        found += sorted((parent, line) for parent, line in parents
                        if not (here == parent or here.startswith(parent + ".")))
    return found


def is_our_module(name: str, root: Path = PACKAGE) -> bool:
    if not name.startswith(root.name + ".") and name != root.name:
        return False
    relative = Path(*name.split(".")[1:]) if "." in name else Path()
    return (root / relative).with_suffix(".py").is_file() or (root / relative / "__init__.py").is_file()


def sources(root: Path = PACKAGE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def stage_of(module: str) -> str:
    """imagebuild.lock.resolve -> lock; imagebuild.flows.build -> flows; imagebuild -> ''.
    `python -m imagebuild` (__main__) is the command line's entry."""
    parts = module.split(".")
    stage = parts[1] if len(parts) > 1 else ""
    return "cli" if stage == "__main__" else stage


# The payload modules whose job is to drive the image's own stack ([aot] builds and loads kernels through
# FlashInfer's and SGLang's loaders; the GPU check launches them through their wrappers and ops): they may
# import that stack, inside functions only, so the probe package still imports on a bare interpreter.
STACK_DRIVERS = {"kernels_aot.py": {"torch", "flashinfer", "sglang"}, "kernels_moe.py": {"torch"},
                 "kernels_triton.py": {"torch", "triton", "sglang"},
                 "gpu_launch.py": {"torch", "flashinfer", "sglang", "deep_gemm"}}


def function_import_lines(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {node.lineno for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}


def payload_violations(root: Path = PACKAGE) -> list[str]:
    """Imports in root/payload that are neither the standard library nor the payload itself."""
    bad = []
    # A script run beside copies of payload modules (prune.py beside apply_patch.py; kernels_aot.py in the
    # [aot] step's aot/ folder) imports them by their bare names.
    names = {path.stem for path in sources(root / "payload")}
    for path in sources(root / "payload"):
        stack = STACK_DRIVERS.get(path.name, set())
        lazy = function_import_lines(path) if stack else set()
        for module, line in imports_of(path, root):
            top = module.split(".")[0]
            inside = module == f"{root.name}.payload" or module.startswith(f"{root.name}.payload.")
            sibling = module in names
            if inside or sibling or (top != root.name and top in sys.stdlib_module_names):
                continue
            if top in stack and line in lazy:
                continue
            bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return bad


def stage_violations(root: Path = PACKAGE, allowed: dict = ALLOWED) -> list[str]:
    bad = []
    for path in sources(root):
        stage = stage_of(module_name(path, root))
        for module, line in imports_of(path, root):
            if not (module == root.name or module.startswith(root.name + ".")):
                continue
            target = stage_of(module)
            if target == stage or target in allowed.get(stage, set()):
                continue
            bad.append(f"{path.relative_to(root.parent)}:{line}: {stage or root.name} imports {module}")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan's algorithm)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, a package's __init__ (its face) a module too: an import
    through a face depends on everything the face imports."""
    graph = {}
    for path in sources(root):
        name = module_name(path, root)
        graph[name] = {m for m, _ in imports_of(path, root, faces=True) if is_our_module(m, root) and m != name}
    return graph


def stage_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph(root).items():
        stage = stage_of(module)
        graph.setdefault(stage, set()).update(stage_of(t) for t in targets if stage_of(t) != stage)
    return graph


def engine_registry(root: Path = PACKAGE) -> dict[str, str]:
    """engine/__init__.py's ENGINES, read from its source: engine name -> "module:class"."""
    tree = ast.parse((root / "engine" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ENGINES" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def engine_violations(root: Path = PACKAGE) -> list[str]:
    """Outside engine/, an engine named: an import of an engine's own module, or its name as a string (a
    comparison, a default, a list of choices). Those read imagebuild.engine's ENGINES, DEFAULT_ENGINE
    and the contract instead, so a new engine is one module and one line."""
    registry = engine_registry(root)
    modules = {target.partition(":")[0] for target in registry.values()}
    bad = []
    for path in sources(root):
        if path.relative_to(root).parts[0] in ("engine", "payload"):
            continue
        where = path.relative_to(root.parent)
        for module, line in imports_of(path, root):
            if any(module == m or module.startswith(m + ".") for m in modules):
                bad.append(f"{where}:{line} imports {module}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in registry:
                bad.append(f"{where}:{node.lineno} names the {node.value} engine")
    return bad


# The in-image paths: render/paths.py names them (the templates get them as values); the payload, standard
# library only, keeps its own copies of the few it reads at run time. Every root of ours inside an image, what
# it keeps and what a build step borrows; without the leading slash, a tar member is caught too.
IN_IMAGE = ("opt/imagebuild", "run/imagebuild", "tmp/imagebuild", "var/cache/imagebuild")
PATH_OWNERS = ("render", "payload")
TEMPLATE_OWNER = "render"


def in_image_path_violations(root: Path = PACKAGE) -> list[str]:
    """Outside render/ and payload/, a file of the package (code, comment, template) writing an in-image path."""
    bad = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".pyc", ".so")):
        if path.relative_to(root).parts[0] in PATH_OWNERS:
            continue
        for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            bad += [f"{path.relative_to(root.parent)}:{number} writes {r}" for r in IN_IMAGE if r in text]
    return bad


def template_violations(root: Path = PACKAGE) -> list[str]:
    """A Dockerfile template (*.j2) of the package outside render/."""
    return [f"{path.relative_to(root.parent)} is a template outside {TEMPLATE_OWNER}/"
            for path in sorted(root.rglob("*.j2")) if path.relative_to(root).parts[0] != TEMPLATE_OWNER]


# ---------------------------------------------------------------- the package as it is

def test_payload_imports_only_the_standard_library_and_itself():
    assert payload_violations() == []


def test_each_stage_imports_only_the_stages_below_it():
    assert stage_violations() == []


def test_every_stage_is_in_the_table():
    stages = {stage_of(module_name(path)) for path in sources()} - {""}
    assert stages == set(ALLOWED), "a new top-level module or package needs its row in ALLOWED"


def test_nothing_outside_cli_imports_cli():
    importers = {stage for stage, targets in stage_graph().items() if "cli" in targets}
    assert importers == set()


def test_only_cli_imports_the_flows():
    graph = stage_graph()
    assert "flows" in graph.get("cli", set())  # the graph was read: the CLI is a layer over the flows
    assert {stage for stage, targets in graph.items() if "flows" in targets} - {"flows"} == {"cli"}


def test_recipe_and_knowledge_import_no_engine_registry_or_cli_code():
    graph = stage_graph()
    assert {"knowledge", "recipe"} <= set(graph)  # both were read: absent ones would pass
    assert "recipe" in graph["knowledge"]  # the rules judge a recipe
    for stage in ("recipe", "knowledge"):
        assert not graph.get(stage, set()) & {"engine", "registry", "lxc", "image", "cli", "flows", "bootstrap"}, stage


def test_nothing_outside_engine_names_an_engine():
    assert len(engine_registry()) >= 2  # the registry was read: an empty one would pass anything
    assert engine_violations() == []


def test_only_render_and_the_payload_write_an_in_image_path():
    assert (PACKAGE / "render" / "paths.py").read_text().count('"/opt/imagebuild"') == 1  # the rule reads a real tree
    assert in_image_path_violations() == []


def test_every_in_image_root_of_ours_is_guarded():
    from imagebuild.render import paths
    ours = {value for name, value in vars(paths).items()
            if name.isupper() and isinstance(value, str) and value.startswith("/") and "imagebuild" in value}
    assert len(ours) >= 10  # paths.py was read: an empty set would pass anything
    assert {value for value in ours if not value.lstrip("/").startswith(IN_IMAGE)} == set()


def test_every_dockerfile_template_is_in_render():
    assert {p.name for p in (PACKAGE / TEMPLATE_OWNER).glob("*.j2")} >= {"Dockerfile.j2", "kernel-seed.Dockerfile.j2"}
    assert template_violations() == []


def test_no_import_cycle_between_modules():
    assert cycles(module_graph()) == []


def test_no_import_cycle_between_stages():
    assert cycles(stage_graph()) == []


# ---------------------------------------------------------------- the checks catch what they should

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "imagebuild"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")} | {root}:
        (folder / "__init__.py").touch()
    return root


@pytest.mark.parametrize("line, reason", [
    ("import requests", "a third-party package"),
    ("from imagebuild.errors import ImagebuildError", "host code"),
    ("from ...errors import ImagebuildError", "a relative import that climbs out of payload"),
    ("import imagebuild.lock", "host code, plain import"),
    ("import report_helpers", "a top-level module that is not a sibling file"),
])
def test_a_payload_import_from_outside_is_reported(tmp_path, line, reason):
    root = _tree(tmp_path, {"errors.py": "", "lock.py": "",
                            "payload/probe/check.py": f"import os\nfrom .report import x\n{line}\n",
                            "payload/probe/report.py": "x = 1\n"})
    assert [v.split(" imports ")[0] for v in payload_violations(root)] == ["imagebuild/payload/probe/check.py:3"], reason


@pytest.mark.parametrize("name, text, reason", [
    ("kernels_aot.py", "import os\nimport json\nimport torch\n", "the stack at module level: the probe would not import"),
    ("kernels_aot.py", "import os\ndef f():\n    import requests\n", "in a function, but not the stack it drives"),
    ("check.py", "import os\ndef f():\n    import torch\n", "the stack, in a function, in a module that drives nothing"),
])
def test_stack_imports_only_lazily_in_the_stack_driver(tmp_path, name, text, reason):
    root = _tree(tmp_path, {f"payload/probe/{name}": text})
    assert [v.split(" imports ")[0] for v in payload_violations(root)] == [f"imagebuild/payload/probe/{name}:3"], reason


def test_the_stack_driver_may_import_the_stack_inside_functions(tmp_path):
    root = _tree(tmp_path, {"payload/probe/kernels_aot.py": "import os\ndef f():\n    import torch\n"
                                                            "    from flashinfer.jit import core\n"})
    assert payload_violations(root) == []


def test_payload_stdlib_and_own_imports_pass(tmp_path):
    root = _tree(tmp_path, {"payload/probe/check.py": "import os, json\nfrom .report import x\n"
                                                      "from imagebuild.payload.probe import report\n",
                            "payload/probe/report.py": "x = 1\n"})
    assert payload_violations(root) == []


def test_a_stage_importing_above_itself_is_reported(tmp_path):
    root = _tree(tmp_path, {"recipe/model.py": "def f():\n    from imagebuild.engine import docker\n",
                            "engine/docker.py": ""})
    assert stage_violations(root, {"recipe": set(), "engine": set()}) == [
        "imagebuild/recipe/model.py:2: recipe imports imagebuild.engine.docker"]


def test_adopt_importing_a_flow_or_the_cli_is_reported(tmp_path):
    """adopt's row: the stages a recipe is made from, never the flows above them or the command line."""
    root = _tree(tmp_path, {"adopt/run.py": "from imagebuild.lock import resolve\nfrom imagebuild.pipeline import check\n"
                                            "def f():\n    from imagebuild.cli import app\n",
                            "lock/resolve.py": "", "pipeline.py": "", "cli/app.py": ""})
    assert stage_violations(root) == ["imagebuild/adopt/run.py:2: adopt imports imagebuild.pipeline",
                                      "imagebuild/adopt/run.py:4: adopt imports imagebuild.cli.app"]


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    root = _tree(tmp_path, {"bases.py": "from imagebuild.engine import run\n",
                            "engine/__init__.py": "def run():\n    from imagebuild.image import oci\n",
                            "image/oci.py": "from imagebuild.bases import x\n"})
    assert cycles(module_graph(root)) == [["imagebuild.bases", "imagebuild.engine", "imagebuild.image.oci"]]
    assert cycles(stage_graph(root)) == [["bases", "engine", "image"]]


@pytest.mark.parametrize("files, cycle", [
    ({"pkg/__init__.py": "from imagebuild.pkg.a import f\n", "pkg/a.py": "from imagebuild.pkg import b\n",
      "pkg/b.py": ""}, ["imagebuild.pkg", "imagebuild.pkg.a"]),
    ({"pkg/__init__.py": "from imagebuild.pkg.a import f\n", "pkg/a.py": "from . import b\n", "pkg/b.py": ""},
     ["imagebuild.pkg", "imagebuild.pkg.a"]),
    ({"pkg/__init__.py": "from imagebuild.pkg.a import f\n", "pkg/a.py": "import imagebuild.other\n",
      "other.py": "from imagebuild.pkg.b import g\n", "pkg/b.py": ""},
     ["imagebuild.other", "imagebuild.pkg", "imagebuild.pkg.a"]),
])
def test_a_cycle_through_a_package_face_is_found(tmp_path, files, cycle):
    """A sibling imported through its package's face (`from imagebuild.pkg import b`, `from . import b`), or a
    module of the package imported from outside it, runs the face, which imports the importer."""
    root = _tree(tmp_path, files)
    assert cycles(module_graph(root)) == [cycle]


def test_siblings_imported_directly_make_no_cycle(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "from imagebuild.pkg.a import f\n",
                            "pkg/a.py": "from imagebuild.pkg.b import g\nimport imagebuild.pkg.c as c\n",
                            "pkg/b.py": "from .c import h\n", "pkg/c.py": ""})
    assert cycles(module_graph(root)) == []


ENGINE_INIT = 'ENGINES = {"docker": "imagebuild.engine.docker:DockerEngine", "buildah": "imagebuild.engine.buildah:B"}\n'


@pytest.mark.parametrize("text, found", [
    ("def f():\n    from imagebuild.engine.docker import DockerEngine\n", "imports imagebuild.engine.docker"),
    ("import imagebuild.engine.buildah\n", "imports imagebuild.engine.buildah"),
    ("def f(engine):\n    return engine.name != 'docker'\n", "names the docker engine"),
    ("CHOICES = ['docker', 'buildah']\n", "names the docker engine"),
])
def test_an_engine_named_outside_engine_is_reported(tmp_path, text, found):
    root = _tree(tmp_path, {"engine/__init__.py": ENGINE_INIT, "engine/docker.py": "NAME = 'docker'\n",
                            "engine/buildah.py": "", "platforms.py": text})
    bad = engine_violations(root)
    assert bad and all(v.startswith("imagebuild/platforms.py:") for v in bad) and found in bad[0], bad


def test_the_registry_and_the_contract_name_no_engine(tmp_path):
    root = _tree(tmp_path, {"engine/__init__.py": ENGINE_INIT + "DEFAULT_ENGINE = 'docker'\n",
                            "engine/docker.py": "", "engine/buildah.py": "",
                            "platforms.py": "from imagebuild.engine import DEFAULT_ENGINE, default_engine\n"
                                            "def f(name=DEFAULT_ENGINE):\n    return default_engine(name).at('ssh://x')\n"
                                            "HELP = 'run docker login first'\n"})
    assert engine_violations(root) == []


def docker_sdk_violations(root: Path = PACKAGE) -> list[str]:
    """Outside engine/, an import of the docker SDK (`docker`, `docker.errors`, ...): what an engine's
    client says (its errors, its image JSON) reaches the rest only through the contract."""
    return [f"{path.relative_to(root.parent)}:{line} imports {module}"
            for path in sources(root) if path.relative_to(root).parts[0] != "engine"
            for module, line in imports_of(path, root) if module == "docker" or module.startswith("docker.")]


def test_no_docker_sdk_import_outside_engine():
    assert any(module == "docker" for module, _ in imports_of(PACKAGE / "engine" / "docker.py"))  # imports are read
    assert docker_sdk_violations() == []


@pytest.mark.parametrize("text", ["def config(engine, image):\n    import docker.errors\n",
                                  "from docker.errors import NotFound\n", "import docker\n",
                                  "from docker import errors\n"])
def test_a_docker_sdk_import_outside_engine_is_reported(tmp_path, text):
    root = _tree(tmp_path, {"engine/docker.py": "import docker\nimport docker.errors\n", "lxc/lxc.py": text,
                            "lxc/docker_notes.py": "from imagebuild.engine import default_engine\n"})
    assert [v.split(" imports ")[0] for v in docker_sdk_violations(root)] == [
        f"imagebuild/lxc/lxc.py:{text.count(chr(10))}"]


def test_an_in_image_path_written_outside_render_is_reported(tmp_path):
    root = _tree(tmp_path, {"render/paths.py": 'LOCK = "/opt/imagebuild/lock.json"\n',
                            "payload/probe/findings_kernels.py": 'MANIFEST = "/opt/imagebuild/aot-manifest.json"\n',
                            "pipeline.py": 'from imagebuild.render.paths import LOCK\n'
                                           'PROBE = ("python", "/opt/imagebuild/probe.pyz")\n',
                            "cli/repro.py": 'MEMBER = "opt/imagebuild/lock.json"  # a tar member\n'})
    (root / "seed.Dockerfile.j2").write_text("FROM x\nCOPY a /opt/imagebuild/a\n")
    assert in_image_path_violations(root) == ["imagebuild/cli/repro.py:1 writes opt/imagebuild",
                                              "imagebuild/pipeline.py:2 writes opt/imagebuild",
                                              "imagebuild/seed.Dockerfile.j2:2 writes opt/imagebuild"]


@pytest.mark.parametrize("text, root", [('SEED = "/run/imagebuild/seed"\n', "run/imagebuild"),
                                         ('WORK = "/tmp/imagebuild-aot"\n', "tmp/imagebuild"),
                                         ('KERNELS = "/var/cache/imagebuild/kernels"\n', "var/cache/imagebuild")])
def test_each_in_image_root_written_outside_render_is_reported(tmp_path, text, root):
    root_dir = _tree(tmp_path, {"render/paths.py": text, "flows/kernels/step.py": text})
    assert in_image_path_violations(root_dir) == [f"imagebuild/flows/kernels/step.py:1 writes {root}"]


def test_a_dockerfile_template_outside_render_is_reported(tmp_path):
    root = _tree(tmp_path, {"render/paths.py": "", "flows/kernels/step.py": ""})
    (root / "render" / "Dockerfile.j2").write_text("FROM x\n")
    (root / "flows" / "kernels" / "kernel-seed.Dockerfile.j2").write_text("FROM {{ base_ref }}\n")
    assert template_violations(root) == ["imagebuild/flows/kernels/kernel-seed.Dockerfile.j2 is a template outside render/"]


def test_in_image_paths_read_from_render_pass(tmp_path):
    root = _tree(tmp_path, {"render/paths.py": 'ROOT = "/opt/imagebuild"\n',
                            "pipeline.py": "from imagebuild.render.paths import PROBE_COMMAND\n"
                                           "HELP = 'the image carries /opt/venv and its lock'\n"})
    assert in_image_path_violations(root) == []


# ---------------------------------------------------------------- knowledge above recipe

@pytest.mark.parametrize("files, expected", [
    ({"recipe/model.py": "from imagebuild.knowledge.rules import check_recipe\n"},
     "imagebuild/recipe/model.py:1: recipe imports imagebuild.knowledge.rules"),
    ({"recipe/model.py": "def f():\n    from imagebuild.knowledge.facts import load_facts\n"},
     "imagebuild/recipe/model.py:2: recipe imports imagebuild.knowledge.facts"),
])
def test_recipe_importing_knowledge_is_reported(tmp_path, files, expected):
    root = _tree(tmp_path, {"knowledge/rules/recipe.py": "from imagebuild.recipe.model import Recipe\n",
                            "knowledge/facts.py": "", "recipe/model.py": "", **files})
    assert stage_violations(root) == [expected]


def test_knowledge_may_import_recipe(tmp_path):
    root = _tree(tmp_path, {"knowledge/rules/recipe.py": "from imagebuild.recipe.model import Recipe\n"
                                                         "from imagebuild.knowledge.facts import x\n",
                            "knowledge/facts.py": "from imagebuild.recipe.cuda import Arch\n",
                            "recipe/model.py": "from imagebuild.recipe.cuda import Arch\n", "recipe/cuda.py": ""})
    assert stage_violations(root) == []
    assert cycles(stage_graph(root)) == []
