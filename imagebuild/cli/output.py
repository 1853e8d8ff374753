"""What a person reads: our own words may be styled, every text from outside is printed literally.

The consoles made here read no markup and no emoji codes, and text from outside (recipe keys and
values, paths, build tool output, registry replies, probe details, exception messages) goes through
`literal()`: printed as it is, except control characters, which are shown escaped (`\\x1b`, `\\r`,
`\\t`), so a tool's output can neither recolour nor rewrite the terminal. A line is built with
`line()`: a plain str part is outside text, a (str, style) pair is ours.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from typing import IO

from rich.console import Console
from rich.text import Text

# C0 controls but the newline, DEL, C1 controls, and the bidirectional overrides that reorder text.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\r": "\\r"}

def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def literal(text: object) -> str:
    """Outside text as it will appear: unchanged but for control characters, shown escaped."""
    return _CONTROL.sub(_escape, str(text))


def line(*parts) -> Text:
    """A line of output: each str part is outside text (printed literally), each (str, style) pair
    is our own words with a rich style ("red", "bold cyan", ...); outside text that should be styled
    goes in a pair as (literal(text), style)."""
    text = Text()
    for part in parts:
        if isinstance(part, tuple):
            words, style = part
            text.append(words, style=style)
        else:
            text.append(literal(part))
    return text


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console that prints strings as they are: no markup, no emoji codes, no highlighting, no wrapping."""
    return Console(stderr=stderr, file=file, markup=False, emoji=False, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------- the human printers

def print_error(console: Console, error: BaseException) -> None:
    console.print(line(("error:", "red"), " ", str(error)))


def print_findings(console: Console, findings: Iterable) -> None:
    for f in findings:
        colour = {"error": "red", "warning": "yellow"}.get(f.status, "cyan")
        console.print(line((f.status.value, colour), " ", f.rule, ": ", f.message))
        if getattr(f, "where", None):
            console.print(line(("  at: ", "dim"), (literal(f.where), "dim"), ("  [", "dim"), (literal(f.key), "dim"),
                               ("]", "dim")))
        for label, value in (("evidence", f.evidence), ("fix", f.fix), ("source", f.source)):
            if value:  # a note needs no fix: no empty "fix:" line
                console.print(line((f"  {label}: ", "dim"), (literal(value), "dim")))


_MARKS = {"pass": ("pass", "green"), "fail": ("FAIL", "red"), "skip": ("skip", "dim"), "warn": ("warn", "yellow"),
          "unknown": ("unknown", "yellow")}


def status_mark(status: object):
    """A check's status as printed: our word for the statuses we know, the value itself otherwise."""
    return _MARKS.get(status, str(status)) if isinstance(status, str) else str(status)


def print_smoke(console: Console, report: dict) -> None:
    for check in report.get("checks", []) if isinstance(report, dict) else []:
        if not isinstance(check, dict):
            continue
        seconds = check.get("seconds")
        took = f" ({seconds:.1f} s)" if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else ""
        console.print(line("  ", status_mark(check.get("status")), " ", str(check.get("name")), (took, "dim"), ": ",
                           str(check.get("detail", ""))))


def print_patch_results(console: Console, results: Iterable) -> None:
    for r in results:
        verdict = ("applies", "green") if r.applies else ("does not apply", "red")
        console.print(line(r.patch, f" ({r.package} {r.checked}, locked {r.locked}): ", verdict))
        for problem in r.problems:
            console.print(line("  ", (literal(problem), "dim")))


def print_base_moves(console: Console, moves: list, *, asked: bool) -> None:
    """What moving the base changed, one package a line; said also when nothing moved."""
    if asked and not moves:
        console.print(line(("base: nothing moved", "green"), " (every locked package is the newest its suites have)"))
    for move in moves:
        arch = f"linux/{move['arch']}: " if move.get("arch") else ""
        old, new = move.get("old") or "(not installed)", move.get("new") or "(removed)"
        console.print(line(("base: ", "cyan"), arch, str(move["package"]), " ", str(old), " -> ", str(new),
                           ("  from ", "dim"), (literal(move.get("suite")), "dim")))


def print_package_moves(console: Console, moves: list, *, asked: bool) -> None:
    """Python versions that moved from the old lock, one a line; said also when `--upgrade` moved none."""
    if asked and not moves:
        console.print(line(("python: nothing moved", "green"), " (every locked version is still the newest allowed)"))
    for move in moves:
        arch = f"linux/{move['arch']}: " if move.get("arch") else ""
        old, new = move.get("old") or "(not locked)", move.get("new") or "(removed)"
        console.print(line(("python: ", "cyan"), arch, str(move["name"]), " ", str(old), " -> ", str(new)))


def print_doctor(console: Console, report) -> None:
    """doctor's report: the target, then each finding with its fix, then the verdict."""
    host = report.host
    console.print(line("doctor: ", str(report.target), ", probe under ", str(report.python), " (Python ",
                       str(host.get("python", "?")), ", glibc ", str(report.facts.get("glibc") or "?"), ")",
                       f", {report.seconds:.1f} s"))
    for finding in (f.to_probe() for f in report.findings):  # in the probe's words, as --json has them
        console.print(line("  ", status_mark(finding["status"]), " ", finding["name"], ": ", finding["detail"]))
        if finding["fix"]:
            console.print(line(("       fix: ", "cyan"), (literal(finding["fix"]), "cyan")))
    verdict = ("no errors", "green") if report.ok else (f"{len(report.errors)} error(s)", "red")
    console.print(line(verdict, f", {len(report.warnings)} warning(s)"))


class Progress:
    """Long steps: stage lines and build-step headers are printed; the rest updates a spinner.
    Every line is a build tool's or a stage's text, so each is printed literally."""

    STEP = re.compile(r"^#\d+ \[[^\]]*\] ")

    def __init__(self, console: Console):
        self.console = console
        self.status = None

    def __call__(self, text: str) -> None:
        if not text.startswith("#"):
            self.console.print(line(("›", "bold cyan"), " ", text))
        elif self.STEP.match(text):
            self.console.print(line(("  ", "dim"), (literal(text.split(" ", 1)[1][:160]), "dim")))
        elif self.status is not None:
            self.status.update(line(text[:120]))

    def spinning(self, title: str):
        return _Spinning(self, title)


class JsonProgress:
    """--json's progress on stderr: one JSON object a line, {"progress": TEXT} for a line of text and
    {"event": KIND, ...} for a structured event (each kernel module as the kernel step reuses or compiles it),
    so a tool reading a long build follows it without parsing text; stdout keeps the one report."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def __call__(self, text: str) -> None:
        self._write({"progress": text})

    def event(self, kind: str, event: dict) -> None:
        self._write(dict(event, event=kind))

    def _write(self, value: dict) -> None:
        self.stream.write(json.dumps(value, sort_keys=True) + "\n")
        self.stream.flush()

    def spinning(self, title: str):
        self(title)
        return contextlib.nullcontext(self)


class _Spinning:
    def __init__(self, progress: Progress, title: str):
        self.progress, self.title, self.status = progress, title, None

    def __enter__(self) -> Progress:
        self.status = self.progress.console.status(line(self.title))
        self.status.__enter__()
        self.progress.status = self.status
        return self.progress

    def __exit__(self, *exc) -> None:
        self.progress.status = None
        self.status.__exit__(*exc)
