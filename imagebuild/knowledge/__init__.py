"""What imagebuild knows about CUDA, drivers, GPUs, torch, Debian and glibc, with sources, and the rules
that apply it.

    compat.toml   the data table: only what no artifact states (driver <-> CUDA, arch <-> CUDA, ...)
    facts.py      compat.toml loaded and validated once (every entry names its source and date); the lookups
    finding.py    the one Finding type and its Status (error, warning, note, pass, skip, unknown), and
                  from_probe: the probe's findings read at one boundary
    rules/        the rules: a recipe, its lock, its wheels and a live host against the facts -> Findings

knowledge sits above recipe/ (a leaf of plain types, the CUDA vocabulary in recipe/cuda.py included), which
is what it judges: it imports recipe, never the other way; the flows gather facts and call the rules. This
face re-exports finding.py's names; `from imagebuild.knowledge import rules` reads the rules. No engine,
registry, image or CLI code. A new fact goes into compat.toml with its source; a new lookup into facts.py;
a new rule into rules/.
"""

from imagebuild.knowledge.finding import STOPS_BUILD, Finding, MalformedProbeFinding, Status, from_probe, has_errors

__all__ = ["STOPS_BUILD", "Finding", "MalformedProbeFinding", "Status", "from_probe", "has_errors"]
