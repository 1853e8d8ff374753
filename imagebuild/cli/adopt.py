"""`imagebuild adopt`: a working environment becomes a recipe. A thin layer over imagebuild.adopt."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from imagebuild.cli.options import engine_option
from imagebuild.cli.output import line, print_findings
from imagebuild.errors import EXIT_OK

SHOWN = 20  # files listed per kind; the rest are counted


def add_commands(command) -> None:
    cmd = command("adopt", "write a recipe (and patches for hand edits) that rebuilds a working environment: "
                           "its distributions pinned as installed, [cuda] from torch, the toolchain wheels and "
                           "the GPUs, and a list of what cannot be rebuilt and what to do")
    cmd.add_argument("--python", metavar="PATH", help="the environment's interpreter (a venv's VENV/bin/python); "
                     "with --image, the interpreter inside the image (default there: its python3)")
    cmd.add_argument("--image", help="an image in the engine: the probe runs in a throwaway container of it "
                     "(network off)")
    cmd.add_argument("-o", "--output", type=Path, required=True, metavar="RECIPE",
                     help="the recipe to write; its patches go to patches/ beside it")
    cmd.add_argument("--arch", action="append", default=[], metavar="TARGET",
                     help="a GPU target for [cuda] archs (sm_120a, 12.0f; repeatable), instead of the GPUs "
                          "nvidia-smi names here; needed where no GPU answers")
    cmd.add_argument("--min-driver", metavar="VERSION",
                     help="the oldest driver on the hosts (as nvidia-smi prints it), instead of this host's")
    cmd.add_argument("--exclude", action="append", default=[], metavar="NAME",
                     help="leave this installed distribution out of the recipe (repeatable)")
    cmd.add_argument("--extra-index-url", action="append", default=[], metavar="URL", dest="extra_index_urls",
                     help="another index the environment's distributions came from (repeatable)")
    cmd.add_argument("--without-torch", action="store_true",
                     help="adopt an environment that has no torch on purpose ([cuda] then comes from the CUDA "
                          "toolchain wheels)")
    cmd.add_argument("--force", action="store_true", help="replace the recipe (and its patches) if they exist")
    engine_option(cmd)
    cmd.set_defaults(handler=run_adopt)


def run_adopt(args: argparse.Namespace, out: Console, err: Console) -> int:
    from imagebuild.adopt import AdoptOptions, adopt
    from imagebuild.cli.output import Progress

    engine = None
    if args.image:
        from imagebuild.engine import default_engine
        engine = default_engine(args.engine)
    options = AdoptOptions(archs=tuple(args.arch), min_driver=args.min_driver, without_torch=args.without_torch,
                           exclude=tuple(args.exclude), extra_index_urls=tuple(args.extra_index_urls))
    progress = Progress(err)
    with progress.spinning("adopting"):
        report = adopt(args.output, python=args.python, image=args.image,
                       engine=engine, options=options, force=args.force, progress=progress)
    if args.json:
        out.print_json(data=report.to_dict())
    else:
        print_adopt(out, report)
    return EXIT_OK


def _listed(out: Console, title: str, files: list, total: int, fix: str) -> None:
    if not total:
        return
    out.print(line((title, "yellow"), f" ({total}):"))
    for path in files[:SHOWN]:
        out.print(line("  ", path))
    if total > SHOWN:
        out.print(line((f"  ... and {total - SHOWN} more (--json lists up to {len(files)})", "dim")))
    out.print(line(("  fix: ", "dim"), (fix, "dim")))


def print_adopt(out: Console, adopted) -> None:
    report = adopted.to_dict()
    read = report["read"]
    out.print(line(("read ", "bold"), read["executable"], f" (Python {read['python']}, prefix ", read["prefix"],
                   f", {'a venv' if read['in_venv'] else 'not a venv'})", (f" [{read['where']}]", "dim")))
    cuda = report["cuda"]
    said = f"[cuda] {cuda['toolkit']} for {', '.join(cuda['archs'])}, driver {cuda['min_driver']} or newer" \
        if cuda else "no [cuda]"
    out.print(line(("wrote ", "green"), report["recipe"], f": {len(report['requirements'])} requirements, "
                   f"{len(report['constraints'])} constraints, {said}"))
    for patch in report["patches"]:
        out.print(line(("  patch ", "green"), patch["file"], ": ", ", ".join(patch["files"])))
    if report["left_out"]:
        out.print(line(("left out of the recipe", "yellow"), f" ({len(report['left_out'])}):"))
        for entry in report["left_out"]:
            out.print(line("  ", f"{entry['name']} {entry['version']}: ", entry["why"]))
            out.print(line(("    fix: ", "dim"), (entry["fix"], "dim")))
    if report["unpatched"]:
        out.print(line(("hand edits not made into patches", "yellow"), f" ({len(report['unpatched'])}):"))
        for entry in report["unpatched"]:
            out.print(line("  ", f"{entry['package']} {entry['version']} ", entry["path"], ": ", entry["why"]))
            out.print(line(("    fix: ", "dim"), (entry["fix"], "dim")))
    added = report["added_files"]
    _listed(out, "files no RECORD lists, added by hand (not rebuilt)", added["files"], added["total"], added["fix"])
    links = report["added_links"]
    _listed(out, "symbolic links no RECORD lists", [f"{link['path']} -> {link['target']}" for link in links["links"]],
            len(links["links"]), links["fix"])
    missing = report["missing_files"]
    _listed(out, "files a RECORD lists that are gone (the image keeps them)",
            [f"{m['package']}: {m['path']}" for m in missing], len(missing),
            "a [[prune]] entry (package, remove = [path], reason) drops each from the image too")
    if report["added_by_lock"]:
        out.print(line(("the resolve adds what the environment lacks: ", "yellow"), ", ".join(report["added_by_lock"])))
    for note in report["notes"]:
        out.print(line(("note: ", "cyan"), note))
    print_findings(out, adopted.findings)
    out.print(line(("next: ", "bold"), f"imagebuild lock {report['recipe']} && imagebuild build {report['recipe']}"))

