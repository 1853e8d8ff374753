"""The `imagebuild` command: argument parsing, printing and exit codes over the stages' library API.

    app.py      the parser, the core commands (check, lock, render, build, smoke, patches), main()
    doctor.py, lxc.py, publish.py, repro.py   command groups, each beside the stage it drives

Nothing outside cli/ imports it.
"""

from imagebuild.cli.app import main

__all__ = ["main"]
