"""docs/architecture.md stays true where a claim is checkable: every path it names exists (a table row's
bare file names inside that row's package), and every dotted name of ours it gives (`engine.ENGINES`,
`flows.BuildOptions`, `payload.checksum()`) resolves to something that is there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "imagebuild"
DOC = REPO / "docs" / "architecture.md"

CODE = re.compile(r"`([^`\n]+)`")
FILE_SUFFIXES = (".py", ".j2", ".toml", ".sh", ".md", ".json", ".c")
NOT_OURS = {"expect.json", "index.json", "aot-manifest.json"}  # files inside images or layouts, not the repo's


def _is_path(token: str) -> bool:
    return bool(re.fullmatch(r"[\w.\-/]+", token)) and ("/" in token or token.endswith(FILE_SUFFIXES))


def _exists(token: str, where: Path, files: list[str]) -> bool:
    """A path names something of the repo's: from the root, from imagebuild/, from the row's package, or as
    the tail of a path under imagebuild/ or tests/ (`rules/host.py`, `probe/expect.py`)."""
    bare = token.rstrip("/")
    if "/" not in token:
        inside = "" if where == REPO else str(where.relative_to(REPO)) + "/"
        return any(Path(name).name == bare for name in files if name.startswith(inside))
    if any((base / bare).exists() for base in (REPO, PACKAGE, where)):
        return True
    return any(name == bare or name.endswith("/" + bare) for name in files)


def _resolves(token: str) -> bool | None:
    """True or False for a dotted name under imagebuild/ (`flows.each_platform(recipe)`); None when the first
    word names no module of ours (`markers.explain` inside a sentence about render/, `Engine.at`)."""
    name = re.sub(r"\(.*\)$", "", token)
    if not re.fullmatch(r"[a-z_]+(\.[A-Za-z_]\w*)+", name):
        return None
    parts = name.split(".")
    if not ((PACKAGE / parts[0]).is_dir() or (PACKAGE / f"{parts[0]}.py").is_file()):
        return None
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module("imagebuild." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def doc_violations(text: str, root: Path = REPO) -> list[str]:
    """Every name in the doc's backticks that is a path or a dotted name of ours and is not there."""
    files = [str(path.relative_to(root)) for base in ("imagebuild", "tests", "docs", "scripts", "recipes")
             for path in (root / base).rglob("*") if "__pycache__" not in path.parts]
    bad = []
    for number, text_line in enumerate(text.splitlines(), 1):
        row = re.match(r"\| `([\w/]+/)` \|", text_line)
        where = root / "imagebuild" / row.group(1) if row else root
        for token in CODE.findall(text_line):
            if token in NOT_OURS or token.startswith(("/", "opt/", "run/", "tmp/", "var/")):
                continue
            if _is_path(token) and not _exists(token, where, files):
                bad.append(f"docs/architecture.md:{number}: `{token}` is not there")
            elif not _is_path(token) and _resolves(token) is False:
                bad.append(f"docs/architecture.md:{number}: `{token}` names nothing of imagebuild's")
    return bad


def test_every_path_and_name_the_architecture_doc_gives_is_there():
    text = DOC.read_text()
    assert doc_violations(text) == []
    paths = [t for t in CODE.findall(text) if _is_path(t)]
    names = [t for t in CODE.findall(text) if not _is_path(t) and _resolves(t)]
    assert len(paths) > 50 and len(names) > 10, (len(paths), len(names))  # what it saw: the check read the doc


def test_where_a_new_thing_goes_names_paths_that_exist():
    """The list a contributor follows: each entry names at least one path, and all of them exist."""
    section = DOC.read_text().split("## Where a new thing goes", 1)[1]
    entries = re.findall(r"^- \*\*(.+?)\*\*(.*?)(?=^- \*\*|\Z)", section, flags=re.S | re.M)
    assert len(entries) >= 10, [title for title, _ in entries]
    for title, body in entries:
        assert any(_is_path(token) for token in CODE.findall(body)), f"{title}: names no path"
    assert doc_violations(section) == []


@pytest.mark.parametrize("line, said", [
    ("| `engine/` | the engines (`podman_sock.py`) | — |", "`podman_sock.py` is not there"),
    ("- **A new engine**: a module in `engines/`", "`engines/` is not there"),
    ("- **A new rule**: in `knowledge/rules/nope.py`", "`knowledge/rules/nope.py` is not there"),
    ("read through `engine.ENGINE_TABLE`", "`engine.ENGINE_TABLE` names nothing"),
    ("see `flows.BuildOption`", "`flows.BuildOption` names nothing"),
])
def test_a_path_or_name_that_is_gone_is_reported(line, said):
    """Negative controls: a file moved away, a folder renamed, a name dropped from a module."""
    bad = doc_violations(line)
    assert len(bad) == 1 and said in bad[0], bad


def test_a_bare_file_name_counts_only_inside_its_rows_package():
    """`lxc.py` exists (lxc/lxc.py) but not in engine/: a row cannot name another package's module."""
    assert doc_violations("| `lxc/` | templates (`lxc.py`) | engine |") == []
    assert doc_violations("| `engine/` | templates (`lxc.py`) | — |") == [
        "docs/architecture.md:1: `lxc.py` is not there"]
