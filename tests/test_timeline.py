"""tests/timeline.py: the plugin records what a real pytest run ran, per worker; the reader takes any file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, strategies as st

from tests import timeline
from tests.conftest import REPO


def test_a_real_run_with_two_workers_is_recorded_per_worker_and_summed_per_file(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_one.py").write_text("import time\ndef test_a():\n    time.sleep(0.3)\ndef test_b():\n    pass\n")
    (folder / "test_two.py").write_text("def test_c():\n    pass\n")
    record = tmp_path / "timeline.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.timeline", "-n", "2", "--dist", "loadfile",
                           "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)],
                          cwd=REPO, env=dict(os.environ, **{timeline.ENV: str(record)}), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = timeline.read(str(record))
    assert sorted(row["test"].split("::")[-1] for row in rows) == ["test_a", "test_b", "test_c"]
    assert {row["worker"] for row in rows} <= {"gw0", "gw1"} and all(row["end"] >= row["start"] for row in rows)
    for name in {row["test"].split("::")[0] for row in rows}:  # --dist loadfile: a file runs on one worker
        assert len({row["worker"] for row in rows if row["test"].startswith(name + "::")}) == 1
    lines = timeline.summary(rows, shortest=0.2)
    assert any(line.endswith("test_one.py") and " 2  " in line for line in lines), lines
    assert not any(line.endswith("test_two.py") for line in lines)  # under `shortest`: left out of the file rows
    assert sum(line.startswith("gw") and "busy" in line for line in lines) == len({row["worker"] for row in rows})


def test_an_empty_timeline_says_so():
    assert timeline.summary([]) == ["no tests recorded"]


@given(st.lists(st.one_of(st.text(), st.dictionaries(st.sampled_from(["worker", "test", "start", "end"]),
                                                      st.one_of(st.text(), st.floats(allow_nan=False), st.integers(),
                                                                st.none())).map(json.dumps))))
def test_any_file_is_read_as_records_or_skipped(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("timeline") / "t.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    rows = timeline.read(str(path))
    assert all(isinstance(row["start"], float) for row in rows)
    assert timeline.summary(rows)


def test_a_build_a_test_calls_is_recorded_with_its_test_and_a_failed_one_with_its_error(tmp_path):
    """flows.build, called by a test as the suite's tests call it, leaves a build record naming the test; a build
    that raises is recorded with its error's type, and the test still sees the error."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_builds.py").write_text(
        "import pytest\nfrom imagebuild import flows\nfrom imagebuild.errors import ImagebuildError\n"
        "def test_missing_recipe(tmp_path):\n"
        "    with pytest.raises(ImagebuildError):\n"
        "        flows.build(tmp_path / 'absent.toml', None)\n")
    record = tmp_path / "timeline.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.timeline", "-p", "no:cacheprovider",
                           "--rootdir", str(folder), str(folder)],
                          cwd=REPO, env=dict(os.environ, **{timeline.ENV: str(record)}), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (build,) = timeline.read(str(record), builds=True)
    assert build["build"] == "absent" and build["test"].endswith("::test_missing_recipe"), build
    assert build["error"] and build["steps"] == {}
    assert [row["test"].split("::")[-1] for row in timeline.read(str(record))] == ["test_missing_recipe"]
    assert timeline.build_summary([build], build["start"], shortest=0.0)[1].endswith(": no report")


def test_the_build_list_keeps_builds_of_a_minute_with_their_steps_in_order():
    builds = [{"worker": "gw1", "test": "tests/slow/t.py::test_b", "build": "b", "start": 200.0, "end": 290.0,
               "error": None, "steps": {"lock": 6.2, "build": 70.4, "kernels": 40.0, "smoke": 12.0}},
              {"worker": "gw0", "test": "tests/slow/t.py::test_a", "build": "a", "start": 100.0, "end": 130.0,
               "error": None, "steps": {"build": 25.0}}]
    lines = timeline.build_summary(builds, 100.0)
    assert len(lines) == 2 and "build b in test_b: lock 6, build 70, kernels 40, smoke 12" in lines[1]
    assert lines[1].split()[:3] == ["gw1", "100", "90"]
    assert timeline.build_summary(builds, 100.0, shortest=10.0)[1].startswith("gw0")
    assert timeline.build_summary([], 0.0) == []


@given(st.lists(st.dictionaries(st.sampled_from(["worker", "test", "start", "end", "build", "error", "steps"]),
                                st.one_of(st.text(), st.floats(allow_nan=False), st.none(),
                                          st.dictionaries(st.text(), st.one_of(st.floats(allow_nan=False), st.text())))
                                ).map(json.dumps)))
def test_any_file_is_read_as_build_records_or_skipped(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("timeline") / "t.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    builds = timeline.read(str(path), builds=True)
    assert all(isinstance(row["steps"], dict) for row in builds)
    timeline.build_summary(builds, 0.0, shortest=0.0)
