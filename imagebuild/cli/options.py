"""Options more than one command takes, written once."""

from __future__ import annotations

import argparse

from imagebuild.engine import DEFAULT_ENGINE, engine_names


def engine_option(cmd: argparse.ArgumentParser) -> None:
    """--engine, its choices the engines imagebuild has (imagebuild.engine.ENGINES)."""
    cmd.add_argument("--engine", default=DEFAULT_ENGINE, choices=engine_names(),
                     help=f"the container engine (default: {DEFAULT_ENGINE})")
