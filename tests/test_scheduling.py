"""tests/scheduling.py: in a real pytest-xdist run, the last worker runs at low priority and takes only the pure
files; the engine and slow files go to the other workers; without the switch every worker is as xdist makes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, strategies as st

from tests import scheduling
from tests.conftest import REPO

RECORD = """
import json, os
def record(name):
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "nice": os.nice(0)}) + "\\n")
"""
HEAVY = """
import time, pytest
from record import record
pytestmark = pytest.mark.{mark}
def test_{name}():
    time.sleep(1.0)
    record("{name}")
"""
PURE = """
from record import record
def test_{name}_a():
    record("{name}_a")
def test_{name}_b():
    record("{name}_b")
"""


def run_suite(tmp_path, background: bool) -> list[dict]:
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "record.py").write_text(RECORD)
    (folder / "conftest.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n")
    for name, mark in (("heavy_engine", "engine"), ("heavy_slow", "slow"), ("heavy_more", "engine")):
        (folder / f"test_{name}.py").write_text(HEAVY.format(name=name, mark=mark))
    for number in range(6):
        (folder / f"test_pure{number}.py").write_text(PURE.format(name=f"pure{number}"))
    record = tmp_path / "record.jsonl"
    env = {key: value for key, value in os.environ.items() if key not in (scheduling.ENV, scheduling.FILES_ENV)}
    env.update(RECORD=str(record), **({scheduling.ENV: "1"} if background else {}))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.scheduling", "-n", "3", "--dist", "loadfile",
                           "--no-loadscope-reorder", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           "--rootdir", str(folder), str(folder)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(rows) == 3 + 6 * 2, rows  # every test ran once
    return rows


def test_the_last_worker_runs_pure_files_only_at_low_priority(tmp_path):
    rows = run_suite(tmp_path, background=True)
    background = [row for row in rows if row["worker"] == "gw2"]
    assert background and all(row["test"].startswith("pure") for row in background), rows
    assert {row["nice"] for row in background} == {scheduling.BACKGROUND_NICE}
    heavy = [row for row in rows if row["test"].startswith("heavy")]
    assert {row["worker"] for row in heavy} <= {"gw0", "gw1"} and {row["nice"] for row in heavy} == {0}


def test_without_the_switch_no_worker_is_reniced(tmp_path):
    rows = run_suite(tmp_path, background=False)
    assert {row["nice"] for row in rows} == {0}
    assert len({row["worker"] for row in rows}) >= 2


def test_the_pure_files_are_written_whole_and_read_back(tmp_path):
    path = tmp_path / "pure.json"
    scheduling.write_pure_files(str(path), ["tests/b.py", "tests/a.py"])
    assert scheduling.read_pure_files(str(path)) == {"tests/a.py", "tests/b.py"}
    assert [p.name for p in tmp_path.iterdir()] == ["pure.json"]  # no temp file left
    assert scheduling.read_pure_files(str(tmp_path / "missing.json")) == frozenset()
    assert scheduling.read_pure_files(None) == frozenset()


@given(st.binary(max_size=200))
def test_any_file_reads_as_a_set_of_names_or_nothing(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("pure") / "pure.json"
    path.write_bytes(data)
    found = scheduling.read_pure_files(str(path))
    assert isinstance(found, frozenset) and all(isinstance(name, str) for name in found)


def test_marks_that_make_a_file_heavy():
    assert scheduling.is_pure(set()) and scheduling.is_pure({"parametrize", "needs_tool"})
    assert not scheduling.is_pure({"engine"}) and not scheduling.is_pure({"slow", "parametrize"})
