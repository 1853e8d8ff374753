"""What a person reads: every human printer prints outside text literally, whatever it holds.

The printers are the CLI's own (imagebuild/cli/output.py), rendered into a real rich Console as the
CLI makes it; the visible text is compared with the message, never with a re-rendering of it.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.cli import output
from imagebuild.cli.output import literal, make_console
from imagebuild.knowledge import Finding
from imagebuild.errors import BuildFailed, ImagebuildError, RecipeError

# Arbitrary text, with the characters that broke the old printer well represented.
TEXT = st.text(st.characters(codec="utf-8"), max_size=60) | st.text(
    st.sampled_from("[]/\\:=#@*_`'\"\n\t\r\x1b\x07\u202e e x bold red "), max_size=40)


def render(printer, *args) -> str:
    buffer = io.StringIO()
    printer(make_console(file=buffer), *args)
    return buffer.getvalue()


def test_literal_keeps_text_without_control_characters_and_escapes_the_rest():
    assert literal("u.toml:11: [bogus_section] unknown key 'x' [/x] :smile:") == \
        "u.toml:11: [bogus_section] unknown key 'x' [/x] :smile:"
    assert literal("a\x1b[2Jb\tc\rd\x07e\u202ef\nline") == "a\\x1b[2Jb\\tc\\rd\\x07e\\u202ef\nline"


@given(TEXT)
def test_literal_leaves_nothing_a_terminal_acts_on_but_the_newline(text):
    shown = literal(text)
    assert not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) <= 0x9f for c in shown)
    if not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) <= 0x9f or 0x202a <= ord(c) <= 0x202e
               or 0x2066 <= ord(c) <= 0x2069 for c in text):
        assert shown == text


@settings(max_examples=300)
@given(TEXT)
def test_errors_print_their_message_literally(message):
    assert render(output.print_error, ImagebuildError(message)) == f"error: {literal(message)}\n"
    assert render(output.print_error, BuildFailed(message)) == f"error: {literal(message)}\n"


@settings(max_examples=200)
@given(TEXT, TEXT.filter(bool), st.integers(1, 10_000))
def test_recipe_errors_keep_the_key_path_and_the_file(folder, key, line):
    error = RecipeError(f"/tmp/{folder}/u.toml", "unknown key 'bogus_section'", key=key, line=line, hint="drop it")
    assert render(output.print_error, error) == f"error: {literal(str(error))}\n"
    assert f"[{literal(key)}]" in render(output.print_error, error)


@settings(max_examples=200)
@given(st.sampled_from(["error", "warning"]), TEXT, TEXT, TEXT, TEXT, TEXT)
def test_findings_print_every_field_literally(severity, rule, message, evidence, fix, source):
    finding = Finding(severity, rule, message, evidence, fix, source)
    assert render(output.print_findings, [finding]) == (
        f"{severity} {literal(rule)}: {literal(message)}\n" + "".join(
            f"  {label}: {literal(value)}\n" for label, value in (("evidence", evidence), ("fix", fix), ("source", source))
            if value))


def test_a_note_without_a_fix_prints_no_empty_fix_line():
    text = render(output.print_findings, [Finding("note", "aot-model-config", "read", "config.json", "", "the model")])
    assert text == "note aot-model-config: read\n  evidence: config.json\n  source: the model\n"


@settings(max_examples=200)
@given(TEXT.filter(lambda t: not t.startswith("#")))
def test_progress_lines_from_a_build_tool_print_literally(text):
    assert render(lambda console, t: output.Progress(console)(t), text) == f"› {literal(text)}\n"


@settings(max_examples=200)
@given(TEXT)
def test_build_step_headers_print_literally(instruction):
    text = f"#7 [stage-0 3/9] RUN {instruction}"
    shown = render(lambda console, t: output.Progress(console)(t), text)
    assert shown == f"  {literal(text.split(' ', 1)[1][:160])}\n"


@given(TEXT)
def test_spinner_lines_are_literal_too(text):
    buffer = io.StringIO()
    progress = output.Progress(make_console(file=buffer))
    with progress.spinning(text):
        progress("#12 0.5 " + text)  # the spinner's line: rich would read markup in a plain str
    assert "Traceback" not in buffer.getvalue()


@settings(max_examples=200)
@given(st.sampled_from(["pass", "fail", "skip", "warn"]) | TEXT, TEXT, TEXT)
def test_smoke_reports_print_names_and_details_literally(status, name, detail):
    report = {"checks": [{"status": status, "name": name, "detail": detail}]}
    mark = {"pass": "pass", "fail": "FAIL", "skip": "skip", "warn": "warn"}.get(status, literal(status))
    assert render(output.print_smoke, report) == f"  {mark} {literal(name)}: {literal(detail)}\n"


@settings(max_examples=200)
@given(TEXT, TEXT, TEXT, TEXT)
def test_doctor_reports_print_findings_and_fixes_literally(target, name, detail, fix):
    report = SimpleNamespace(host={"python": "3.11"}, target=target, python="/usr/bin/python3",
                             facts={"glibc": "2.36"}, seconds=1.0, ok=False, errors=[1], warnings=[],
                             findings=[Finding("error", name, detail, {}, fix)])
    assert render(output.print_doctor, report) == (
        f"doctor: {literal(target)}, probe under /usr/bin/python3 (Python 3.11, glibc 2.36), 1.0 s\n"
        f"  FAIL {literal(name)}: {literal(detail)}\n"
        + (f"       fix: {literal(fix)}\n" if fix else "") + "1 error(s), 0 warning(s)\n")


@settings(max_examples=100)
@given(TEXT, TEXT, st.lists(TEXT, max_size=3))
def test_patch_results_print_the_file_and_each_hunk_problem_literally(patch, package, problems):
    result = SimpleNamespace(patch=patch, package=package, checked="1.0", locked="0.9", problems=problems,
                             applies=not problems)
    verdict = "does not apply" if problems else "applies"
    expected = f"{literal(patch)} ({literal(package)} 1.0, locked 0.9): {verdict}\n"
    expected += "".join(f"  {literal(p)}\n" for p in problems)
    assert render(output.print_patch_results, [result]) == expected
