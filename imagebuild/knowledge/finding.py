"""One finding, whoever finds it: a rule over a recipe or its lock (rules/), imagebuild's own checks
of a lock, or a check of a live host, venv or image (the payload's probe, read here at one boundary).

    Status            one vocabulary: error, warning, note (a rule's verdict) and pass, skip, unknown (a
                      check's); STOPS_BUILD names those that stop a build (error alone)
    Finding           status, rule, message, evidence, fix, source; key and where once located
    from_probe(data)  a finding in the probe's JSON wire form -> Finding, or MalformedProbeFinding
    has_errors(fs)    whether any finding stops a build

Two JSON forms leave a Finding, each as its reports always had it: `to_dict()` for check, lock and
build reports (severity, rule, message, evidence, fix, source, and key, where once located), and
`to_probe()` for doctor's, in the probe's own words (name, status, detail, evidence, severity, fix;
"fail" and "warn" for error and warning). The probe (payload/probe/report.py, standard library only)
writes that wire form itself; this module is the one place that reads it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from imagebuild.errors import ImagebuildError


class Status(StrEnum):
    """What a finding says. Its value is the word check, lock and build reports print."""

    ERROR = "error"  # stops a build; the probe says "fail"
    WARNING = "warning"  # worth fixing, stops nothing; the probe says "warn"
    NOTE = "note"  # worth knowing, nothing to do
    PASS = "pass"  # a check that held
    SKIP = "skip"  # a check with nothing to look at here
    UNKNOWN = "unknown"  # a check that could not tell, and says why

    @property
    def stops_build(self) -> bool:
        return self in STOPS_BUILD


STOPS_BUILD = frozenset({Status.ERROR})

# The probe's wire form (payload/probe/report.py: make_finding), read by from_probe, written by to_probe.
PROBE_STATUS = {"pass": Status.PASS, "fail": Status.ERROR, "warn": Status.WARNING, "skip": Status.SKIP,
                "unknown": Status.UNKNOWN}
PROBE_SEVERITY = {Status.PASS: "info", Status.ERROR: "error", Status.WARNING: "warning", Status.SKIP: "info",
                  Status.UNKNOWN: "warning"}
PROBE_KEYS = ("name", "status", "detail", "evidence", "severity", "fix")
_PROBE_WORD = {status: word for word, status in PROBE_STATUS.items()}


class MalformedProbeFinding(ImagebuildError):
    """A finding in the probe's report that is not in its wire form: names what is wrong with it."""


@dataclass(frozen=True)
class Finding:
    status: Status  # a Status, or its value ("error"): made a Status here
    rule: str  # short id: a rule's ("driver-too-old") or a check's name ("driver-cuda", "cuda-home:torch")
    message: str  # one sentence a user understands (a check's detail)
    evidence: str | Mapping = ""  # what triggered it: the values, in words (rules), or the facts (checks)
    fix: str = ""  # the exact change: a recipe key, a pin, an env var, a command; empty when none is needed
    source: str = ""  # the fact's source from compat.toml
    key: str | None = None  # the recipe key it is about ("cuda.min_driver"), when one is
    where: str | None = None  # "recipes/x.toml:16": the file and line of that key, once located

    def __post_init__(self):
        object.__setattr__(self, "status", Status(self.status))

    @classmethod
    def check(cls, name: str, status: Status | str, detail: str, fix: str = "", **evidence) -> "Finding":
        """A check's finding worded as the probe words its own: runs of whitespace made one space."""
        return cls(status, name, " ".join(detail.split()), evidence, " ".join(fix.split()))

    @property
    def stops_build(self) -> bool:
        return self.status.stops_build

    def at(self, key: str) -> "Finding":
        return replace(self, key=key)

    def to_dict(self) -> dict:
        """The check, lock and build reports' form; key and where only once known."""
        data = {"severity": self.status.value, "rule": self.rule, "message": self.message,
                "evidence": self.evidence, "fix": self.fix, "source": self.source}
        data.update((name, value) for name, value in (("key", self.key), ("where", self.where)) if value is not None)
        return data

    def to_probe(self) -> dict:
        """The probe's wire form, as doctor's report carries it; a check's finding (evidence a mapping,
        a status the probe has words for) only."""
        if self.status not in _PROBE_WORD or not isinstance(self.evidence, Mapping):
            raise ValueError(f"{self.rule}: a {self.status.value} finding with evidence "
                             f"{type(self.evidence).__name__} has no probe wire form")
        return {"name": self.rule, "status": _PROBE_WORD[self.status], "detail": self.message,
                "evidence": dict(self.evidence), "severity": PROBE_SEVERITY[self.status], "fix": self.fix}


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.stops_build for f in findings)


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlevel = 2
_shown = _repr.repr  # a value from outside, shown short (long strings and deep nests cut)


def from_probe(data: object) -> Finding:
    """A finding as the probe's report carries it (a make_finding dict: name, status, detail, evidence,
    severity, fix) as a Finding; anything else is a MalformedProbeFinding saying what is wrong."""
    if not isinstance(data, Mapping):
        raise MalformedProbeFinding(f"a probe finding is a JSON object, not {_shown(data)}")
    name = data.get("name")
    label = f"probe finding {name}" if isinstance(name, str) else "a probe finding"
    missing = [key for key in PROBE_KEYS if key not in data]
    unexpected = sorted(_shown(key) for key in data if key not in PROBE_KEYS)
    if missing or unexpected:
        raise MalformedProbeFinding(f"{label}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(unexpected)}"]
                                                                      if unexpected else [])))
    for key in ("name", "detail", "fix", "severity"):
        if not isinstance(data[key], str):
            raise MalformedProbeFinding(f"{label}: {key} must be a string, not {_shown(data[key])}")
    status = PROBE_STATUS.get(data["status"]) if isinstance(data["status"], str) else None
    if status is None:
        raise MalformedProbeFinding(f"{label}: status {_shown(data['status'])} is none of "
                                    f"{', '.join(PROBE_STATUS)}")
    if data["severity"] != PROBE_SEVERITY[status]:
        raise MalformedProbeFinding(f"{label}: severity {_shown(data['severity'])} does not go with status "
                                    f"{data['status']} (that is {PROBE_SEVERITY[status]})")
    evidence = data["evidence"]
    if not isinstance(evidence, Mapping) or not all(isinstance(key, str) for key in evidence):
        raise MalformedProbeFinding(f"{label}: evidence must be a JSON object, not {_shown(evidence)}")
    return Finding(status, name, data["detail"], dict(evidence), data["fix"])
