"""What imagebuild knows about CUDA, drivers, GPUs, torch, Debian and glibc, with sources, and the rules
that apply it.

    cuda.py       the vocabulary: CudaVersion, Arch (sm_120a), driver versions
    compat.toml   the data table: only what no artifact states (driver <-> CUDA, arch <-> CUDA, ...)
    facts.py      compat.toml loaded and validated once (every entry names its source and date); the lookups
    finding.py    the one Finding type and its Status (error, warning, note, pass, skip, unknown), and
                  from_probe: the probe's findings read at one boundary
    rules.py      the rules: a recipe, its lock and its wheels against the facts -> Findings

Two layers: the facts (cuda, facts, finding) import nothing of ours but errors; the rules import the facts and recipe's
model, since a recipe is what they judge. recipe imports the facts, never the rules, and so this package
imports nothing of the rules: it re-exports finding.py's names, and `from imagebuild.knowledge import rules`
reads the rules. No engine,
registry, image or CLI code. A new fact goes into compat.toml with its source; a new lookup into facts.py;
a new rule into rules.py.
"""

from imagebuild.knowledge.finding import STOPS_BUILD, Finding, MalformedProbeFinding, Status, from_probe, has_errors

__all__ = ["STOPS_BUILD", "Finding", "MalformedProbeFinding", "Status", "from_probe", "has_errors"]
