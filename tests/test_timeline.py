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
