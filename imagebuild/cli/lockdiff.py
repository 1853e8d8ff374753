"""`imagebuild diff-lock OLD NEW`: what moved between two locks (files, or git revisions of one), what a
build of the new one redoes, and, judged by the recipe, the findings that appeared or cleared and the
patches that no longer apply. A thin layer over imagebuild.flows.lockdiff."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from imagebuild.cli.output import line
from imagebuild.errors import EXIT_OK
from imagebuild.flows.lockdiff import diff_locks
from imagebuild.lock.diff import LocksDiff


def add_commands(command) -> None:
    cmd = command("diff-lock", "what moved between two locks of a recipe (packages, [cuda], the base's .debs, "
                               "patches) and what a build of the new one redoes: which steps, which kernels")
    cmd.add_argument("old", help="a lock file, or REV:PATH for a git revision of one (HEAD~1:lockfiles/x.lock)")
    cmd.add_argument("new", help="a lock file, or REV:PATH")
    cmd.add_argument("--recipe", type=Path, default=None,
                     help="the recipe whose rules and patches judge both locks (default: recipes/NAME.toml beside "
                          "the new lock's lockfiles/ folder, NAME being the recipe the lock names)")
    cmd.set_defaults(handler=run_diff_lock)


def run_diff_lock(args: argparse.Namespace, out: Console, err: Console) -> int:
    report, looked = diff_locks(args.old, args.new, args.recipe)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_diff(out, report)
        if report.judged_by is None:
            out.print(line(("  not judged: ", "yellow"), f"no recipe at {looked}, so findings and patches were not "
                                                         "compared; name one with --recipe"))
    return EXIT_OK


def print_diff(out: Console, report: LocksDiff) -> None:
    out.print(line(("diff-lock", "bold"), f" {report.old} -> {report.new}"))
    for arch in report.added_platforms:
        out.print(line(("+ platform ", "green"), arch))
    for arch in report.removed_platforms:
        out.print(line(("- platform ", "red"), arch))
    for diff in report.platforms:
        head = f"linux/{diff.arch}" if len(report.platforms) > 1 or report.added_platforms else ""
        if head:
            out.print(line((head, "bold")))
        if not diff.changed:
            out.print(line("  no change: a build of the new lock is the old one's"))
            continue
        for m in diff.moved:
            out.print(line(("  ~ ", "yellow"), f"{m['name']} {m['old']} -> {m['new']} ({m['layer']})"))
        for a in diff.added:
            out.print(line(("  + ", "green"), f"{a['name']} {a['version']} ({a['layer']})"))
        for r in diff.removed:
            out.print(line(("  - ", "red"), f"{r['name']} {r['version']} ({r['layer']})"))
        for r in diff.rehashed:
            out.print(line(("  # ", "yellow"), f"{r['name']} {r['version']}: another wheel, {r['old']} -> {r['new']}"))
        for c in diff.cuda:
            out.print(line(("  cuda ", "cyan"), f"{c['key']}: {c['old']} -> {c['new']}"))
        for b in diff.base:
            out.print(line(("  base ", "cyan"), f"{b['package']} {b['old'] or '(none)'} -> {b['new'] or '(none)'} "
                                               f"({b['suite']})"))
        for p in diff.patches:
            out.print(line(("  patch ", "cyan"), f"{p['package']} {p['file']} "
                                                f"{'changed' if p['old'] and p['new'] else 'added' if p['new'] else 'removed'}"))
        for i in diff.imagebuild:
            out.print(line(("  imagebuild ", "cyan"), f"{i['key']} changed"))
        for f in (diff.findings or {}).get("appeared", []):
            out.print(line(("  finding + ", "red" if f["severity"] == "error" else "yellow"),
                           f"{f['severity']} {f['rule']}: {f['message']}"))
        for f in (diff.findings or {}).get("cleared", []):
            out.print(line(("  finding - ", "green"), f"{f['severity']} {f['rule']}: {f['message']}"))
        unread = (diff.findings or {}).get("unread", [])
        if unread:
            out.print(line(("  files unread ", "yellow"), f"{len(unread)} wheel(s) the rules that read wheels' files "
                                                          "could not see (no index serves them): " + ", ".join(unread)))
        for b in diff.patches_broken or []:
            out.print(line(("  patch no longer applies ", "red"),
                           f"{b['patch']} to {b['package']} {b['new'] or '(not in the new lock)'} "
                           f"(was {b['old'] or 'not locked'}): " + "; ".join(b["problems"])))
        redone = [s for s in diff.rebuilds if s["rebuilds"]]
        out.print(line(f"  a build redoes {len(redone)} of {len(diff.rebuilds)} steps:"))
        for step in diff.rebuilds:
            mark = ("    rebuilds ", "yellow") if step["rebuilds"] else ("    cached   ", "green")
            out.print(line(mark, f"{step['step']}: {step['why']}"))
        out.print(line(("  kernels: ", "bold"), f"{diff.kernels['recompile']} ({diff.kernels['why']})"))
