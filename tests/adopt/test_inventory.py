"""The probe's report read back (imagebuild/adopt/inventory.py): a real report from a real venv reads,
and any report altered anywhere either reads or is one AdoptError naming the key — never a crash."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuild.adopt.inventory import AdoptError, origin_of, read_inventory
from imagebuild.adopt.plan import AdoptOptions, plan_recipe
from imagebuild.payload.probe import bundle
from tests.conftest import missing_tool
from tests.json_fuzz import json_values, replace_one_field
from tests.venvs import SMALL, SYSTEM_PYTHON, make_venv, site_packages


@pytest.fixture(scope="module")
def real_report(tmp_path_factory):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    python = make_venv(tmp_path_factory.mktemp("report") / "venv", *SMALL)
    with open(site_packages(python) / "six.py", "ab") as handle:
        handle.write(b"# edited\n")
    done = subprocess.run([str(python), "-c", bundle.BOOTSTRAP, *bundle.inline_args(), "--inventory"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_real_report_reads(real_report):
    found = read_inventory(real_report, "--python venv/bin/python")
    assert found.by_name["six"].modified[0].content.endswith(b"# edited\n")
    assert found.interpreter.version_info[:2] == (3, 11) and found.markers["sys_platform"] == "linux"


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_report_altered_anywhere_reads_or_is_one_clear_error(real_report, data):
    raw = copy.deepcopy(real_report)
    replace_one_field(raw, data)
    try:
        found = read_inventory(raw, "--python venv/bin/python")
    except AdoptError as err:
        assert str(err).startswith("--python venv/bin/python: the inventory probe's report cannot be read: [")
        return
    try:
        plan_recipe(found, AdoptOptions(archs=("sm_120a",), without_torch=True), "2026-12-01T00:00:00Z")
    except AdoptError:
        pass


@given(json_values)
def test_any_json_value_is_no_report(value):
    with pytest.raises(AdoptError, match=r"cannot be read: \[(mode|format)\]"):
        read_inventory(value, "image x")


@pytest.mark.parametrize("direct_url, record, kind", [
    (None, True, "index"), (None, False, "unrecorded"),
    ({"url": "file:///p", "dir_info": {"editable": True}}, True, "editable"),
    ({"url": "file:///p", "dir_info": {}}, True, "path"),
    ({"url": "git+https://h/r", "vcs_info": {"vcs": "git", "commit_id": "c0ffee"}}, True, "vcs"),
    ({"url": "https://h/x.whl", "archive_info": {"hash": "sha256=00"}}, True, "url"),
    ({"url": "file:///x.whl", "archive_info": {}}, True, "path"),
    ({"unreadable": "ValueError: x"}, True, "unknown"), ({"url": 3}, True, "unknown"), ([1], True, "unknown"),
])
def test_direct_url_json_says_where_a_distribution_came_from(direct_url, record, kind):
    assert origin_of(direct_url, record).kind == kind


def test_a_probe_that_stopped_says_why():
    with pytest.raises(AdoptError, match="image x: the inventory probe stopped: OSError: disk gone"):
        read_inventory({"mode": "inventory", "format": 1, "error": "OSError: disk gone"}, "image x")
