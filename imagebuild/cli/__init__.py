"""The `imagebuild` command: argument parsing, printing and exit codes over the stages' library API.

    app.py      the parser, a handler per core command over its flow (CORE_COMMANDS: check, lock, render,
                build, smoke, patches), main()
    cache.py, doctor.py, lockdiff.py, lxc.py, publish.py, repro.py   command groups, each beside the stage it drives
    examples.py the examples at the end of every --help
    options.py  options several commands take (--engine, its choices read from imagebuild.engine)
    output.py   printing: outside text kept literal, findings, reports, progress

Nothing outside cli/ imports it.
"""

from imagebuild.cli.app import main

__all__ = ["main"]
