"""The report's vocabulary: check statuses, the dicts a check or a doctor finding is, and the report.

Every check and finding is a plain dict (name, status, detail, evidence; a finding adds severity and
fix); the report wraps them with the host's facts. REPORT_FORMAT changes when this shape does, and so
does imagebuild/knowledge/finding.py, which reads a finding of this shape at one boundary (from_probe).
"""

from __future__ import annotations

import os
import platform
import sys

REPORT_FORMAT = 1
PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"
UNKNOWN = "unknown"  # the check could not tell, and says why: neither a pass nor a guess
ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY = {FAIL: ERROR, WARN: WARNING, UNKNOWN: WARNING, PASS: INFO, SKIP: INFO}


def make_check(name: str, status: str, detail: str, **evidence) -> dict:
    return {"name": name, "status": status, "detail": " ".join(detail.split()), "evidence": evidence}


def make_finding(name: str, status: str, detail: str, fix: str = "", **evidence) -> dict:
    """A doctor finding: a probe check plus its severity and the exact fix (empty when none is needed)."""
    finding = make_check(name, status, detail, **evidence)
    finding.update(severity=SEVERITY[status], fix=" ".join(fix.split()))
    return finding


def shell_fix(commands, notes=()) -> str:
    """Commands to paste into a shell, one after the other, with notes as a trailing comment."""
    fix = " && ".join(dict.fromkeys(command for command in commands if command))
    notes = "; ".join(dict.fromkeys(note for note in notes if note))
    return f"{fix}  # {notes}" if fix and notes else fix or notes


def host_facts() -> dict:
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        glibc = None
    return {"python": platform.python_version(), "executable": sys.executable,
            "platform": platform.platform(), "glibc": glibc}


def make_report(checks: list) -> dict:
    """ok: no check failed and at least one passed; a report of skips alone (or of nothing) saw nothing."""
    ok = all(check["status"] != FAIL for check in checks) and any(check["status"] == PASS for check in checks)
    return {"probe": REPORT_FORMAT, "ok": ok, "checks": checks, "host": host_facts()}
