"""The one Finding (knowledge/finding.py): its statuses, its two JSON forms, and from_probe, the boundary
where the probe's findings (payload/probe/report.py's wire form) become Findings."""

from __future__ import annotations

import copy
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.flows import doctor
from imagebuild.knowledge import STOPS_BUILD, Finding, MalformedProbeFinding, Status, from_probe, has_errors
from imagebuild.knowledge.finding import PROBE_KEYS, PROBE_SEVERITY, PROBE_STATUS
from imagebuild.payload import probe
from imagebuild.payload.probe import report
from tests.json_fuzz import json_values, replace_one_field

PROBE_STATUSES = (probe.PASS, probe.FAIL, probe.WARN, probe.SKIP, probe.UNKNOWN)


def test_only_an_error_stops_a_build():
    assert STOPS_BUILD == {Status.ERROR}
    assert [s for s in Status if s.stops_build] == [Status.ERROR]
    assert has_errors([Finding("warning", "a", "m"), Finding("error", "b", "m")])
    assert not has_errors([Finding(s, "a", "m") for s in Status if s is not Status.ERROR]) and not has_errors([])


def test_a_status_is_made_from_its_value_and_the_probes_words_are_not_values():
    assert Finding("note", "r", "m").status is Status.NOTE
    with pytest.raises(ValueError):
        Finding("fail", "r", "m")  # the probe's word: only from_probe reads it


def test_the_wire_tables_are_the_probes_own():
    """Every status the probe can emit (report.py's SEVERITY keys) is read, with the severity it writes."""
    assert set(report.SEVERITY) == set(PROBE_STATUSES) == set(PROBE_STATUS)
    for word in PROBE_STATUSES:
        assert PROBE_SEVERITY[PROBE_STATUS[word]] == report.SEVERITY[word], word
    assert tuple(probe.make_finding("x", probe.PASS, "d")) == PROBE_KEYS


@pytest.mark.parametrize("word, status", [(probe.PASS, Status.PASS), (probe.FAIL, Status.ERROR),
                                          (probe.WARN, Status.WARNING), (probe.SKIP, Status.SKIP),
                                          (probe.UNKNOWN, Status.UNKNOWN)])
def test_every_probe_status_is_read_and_written_back_as_it_was(word, status):
    wire = probe.make_finding("cuda-home:torch", word, "torch finds /usr/local/cuda", "export CUDA_HOME=/x",
                              home="/usr/local/cuda", found={"torch": {"home": None}})
    finding = from_probe(wire)
    assert (finding.status, finding.rule, finding.message, finding.fix) == (
        status, "cuda-home:torch", "torch finds /usr/local/cuda", "export CUDA_HOME=/x")
    assert finding.evidence == {"home": "/usr/local/cuda", "found": {"torch": {"home": None}}}
    assert finding.stops_build is (word == probe.FAIL)
    assert list(finding.to_probe().items()) == list(wire.items())  # the same JSON, key order too


def test_the_findings_this_hosts_probe_reports_are_all_read():
    """The real probe's doctor report on this machine, not dicts written for the test."""
    done = probe.run_doctor()
    assert done["checks"]
    for wire in json.loads(json.dumps(done["checks"])):
        assert from_probe(wire).to_probe() == wire


def test_a_rules_finding_keeps_the_check_report_form():
    finding = Finding("warning", "driver-minor-compat", "m", "e", "f", "s").at("cuda.min_driver")
    assert finding.to_dict() == {"severity": "warning", "rule": "driver-minor-compat", "message": "m",
                                 "evidence": "e", "fix": "f", "source": "s", "key": "cuda.min_driver"}
    with pytest.raises(ValueError, match="no probe wire form"):
        finding.to_probe()  # evidence in words: a rule's, not a check's
    with pytest.raises(ValueError, match="no probe wire form"):
        Finding("note", "lock-fresh", "m", {}).to_probe()  # the probe has no word for a note


@settings(max_examples=200)
@given(st.sampled_from(PROBE_STATUSES), st.text(max_size=30), st.text(max_size=30), st.text(max_size=30))
def test_a_check_made_here_is_worded_as_the_probe_words_one(word, name, detail, fix):
    made = Finding.check(name, PROBE_STATUS[word], detail, fix, path="/x", n=1)
    assert made.to_probe() == probe.make_finding(name, word, detail, fix, path="/x", n=1)


GOOD = probe.make_finding("driver", probe.WARN, "driver 595.71.05", "put nvidia-smi on PATH", version="595.71.05",
                          gpus=[{"name": "NVIDIA RTX PRO 6000", "compute_cap": "12.0"}])


@pytest.mark.parametrize("data, problem", [
    ([GOOD], "a probe finding is a JSON object, not [{"),
    (None, "not None"),
    ({k: v for k, v in GOOD.items() if k != "fix"}, "probe finding driver: missing fix"),
    (dict(GOOD, extra=1), "unexpected 'extra'"),
    (dict(GOOD, status="error"), "status 'error' is none of pass, fail, warn, skip, unknown"),
    (dict(GOOD, status=["warn"]), "status ['warn'] is none of"),
    (dict(GOOD, severity="error"), "severity 'error' does not go with status warn (that is warning)"),
    (dict(GOOD, detail=3), "detail must be a string, not 3"),
    (dict(GOOD, name={"a": 1}), "a probe finding: name must be a string"),
    (dict(GOOD, evidence=[1, 2]), "evidence must be a JSON object, not [1, 2]"),
    (dict(GOOD, evidence={1: "a"}), "evidence must be a JSON object"),
    (dict(GOOD, status="x" * 10_000), "status 'xxxxxxxxxx"),
])
def test_a_malformed_probe_finding_says_what_is_wrong(data, problem):
    with pytest.raises(MalformedProbeFinding) as error:
        from_probe(data)
    assert problem in str(error.value)
    assert len(str(error.value)) < 300  # outside values are shown short


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_from_probe_on_any_json_gives_a_finding_or_a_clear_error(data):
    try:
        finding = from_probe(data)
    except MalformedProbeFinding as error:
        assert str(error)
    else:
        assert finding.to_probe() == data


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_from_probe_on_a_real_finding_with_one_field_replaced(data):
    wire = copy.deepcopy(GOOD)
    replace_one_field(wire, data)
    try:
        finding = from_probe(wire)
    except MalformedProbeFinding as error:
        assert str(error).startswith(("probe finding", "a probe finding"))
    else:
        assert finding.to_probe() == wire


@pytest.mark.parametrize("checks, problem", [
    ([dict(GOOD, status="error")], "probe finding driver: status 'error' is none of"),
    ({"driver": GOOD}, "its checks are a dict, not a JSON list"),
])
def test_doctor_says_which_probe_finding_is_malformed(tmp_path, checks, problem):
    """A probe (here a stand-in interpreter) whose report holds a malformed finding: doctor fails, naming it."""
    fake = tmp_path / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json\nprint(json.dumps({{'mode': 'doctor', 'checks': {checks!r}}}))\n")
    fake.chmod(0o755)
    with pytest.raises(doctor.DoctorFailed, match="printed a malformed report") as error:
        doctor.diagnose(str(fake), cwd=tmp_path)
    assert problem in str(error.value) and str(fake) in str(error.value)
