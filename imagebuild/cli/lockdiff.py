"""`imagebuild diff-lock OLD NEW`: what moved between two locks (files, or git revisions of one), and
what a build of the new one redoes. A thin layer over imagebuild.lock.diff."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from rich.console import Console

from imagebuild.cli.output import line
from imagebuild.errors import EXIT_OK, ImagebuildError, LockError
from imagebuild.lock.diff import LocksDiff, diff_lock_files
from imagebuild.lock.lockfile import parse_locks


def add_commands(command) -> None:
    cmd = command("diff-lock", "what moved between two locks of a recipe (packages, [cuda], the base's .debs, "
                               "patches) and what a build of the new one redoes: which steps, which kernels")
    cmd.add_argument("old", help="a lock file, or REV:PATH for a git revision of one (HEAD~1:lockfiles/x.lock)")
    cmd.add_argument("new", help="a lock file, or REV:PATH")
    cmd.set_defaults(handler=run_diff_lock)


def read_text(spec: str) -> str:
    """A lock file's text: the file, else `git show REV:PATH` in the current folder."""
    path = Path(spec)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise LockError(f"{spec}: cannot be read ({err})") from None
    rev, sep, name = spec.partition(":")
    if not sep or not rev or not name:
        raise ImagebuildError(f"{spec}: no such lock file (a git revision of one is REV:PATH, e.g. HEAD~1:{spec})")
    try:
        proc = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ImagebuildError(f"{spec}: git could not be run ({err})") from None
    if proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ImagebuildError(f"{spec}: neither a lock file nor a git revision of one "
                              f"(git: {said[-1] if said else 'exit ' + str(proc.returncode)})")
    try:
        return proc.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise LockError(f"{spec}: not UTF-8 text, so not a lock") from None


def run_diff_lock(args: argparse.Namespace, out: Console, err: Console) -> int:
    old = parse_locks(read_text(args.old), args.old)
    new = parse_locks(read_text(args.new), args.new)
    report = diff_lock_files(old, new, args.old, args.new)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_diff(out, report)
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
        redone = [s for s in diff.rebuilds if s["rebuilds"]]
        out.print(line(f"  a build redoes {len(redone)} of {len(diff.rebuilds)} steps:"))
        for step in diff.rebuilds:
            mark = ("    rebuilds ", "yellow") if step["rebuilds"] else ("    cached   ", "green")
            out.print(line(mark, f"{step['step']}: {step['why']}"))
        out.print(line(("  kernels: ", "bold"), f"{diff.kernels['recompile']} ({diff.kernels['why']})"))
