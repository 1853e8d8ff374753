"""Which build step failed, and why, read from a build tool's output (BuildKit's plain progress, buildah).

BuildKit (`docker build --progress=plain`) numbers each vertex: `#6 [stage-0 3/4] RUN ...` opens it,
`#6 0.440 text` is its output, `#6 ERROR: executor failed running [...]: exit code: 1` ends it.
buildah prints `STEP 3/4: RUN ...`, the step's output as it is, then `Error: building at STEP "...": ...`.
The cause is the step's own last error line (`apply_patch: error: ...`, `error: ...` from uv), else
its last output line, else the tool's error; the output is outside text and kept as it came.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from imagebuild.errors import BuildFailed

_BUILDKIT_HEADER = re.compile(r"^#(\d+) \[(?:[^\]\s]+ )?\s*(\d+)/(\d+)\] (.*)$")
_BUILDKIT_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")
_BUILDKIT_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
_BUILDAH_HEADER = re.compile(r"^STEP (\d+)/(\d+): (.*)$")
_BUILDAH_ERROR = re.compile(r"^(?:Error: )?(?:error )?building at STEP \"(.*?)\": (.*)$", re.IGNORECASE)
_ERROR_LINE = re.compile(r"(^|: )(error|fatal)(\[[^\]]*\])?:", re.IGNORECASE)
_EXIT_CODE = re.compile(r"exit (?:code|status):? (\d+)")
KEEP = 20  # output lines kept of the failed step
CAUSE_LINES = 8  # an error line and the lines that explain it
BUILD_LOG_LINES = 4000  # lines of a build's output kept to find the failed step in
TAIL_SHOWN = 30  # lines shown when no step can be named


@dataclass(frozen=True)
class FailedStep:
    step: str  # "3/4"
    instruction: str  # the Dockerfile instruction as the tool printed it
    cause: str  # one line: why it failed
    error: str = ""  # the tool's own error line
    exit_code: int | None = None
    output: tuple[str, ...] = field(default=())  # the step's last output lines

    def to_dict(self) -> dict:
        return {"step": self.step, "instruction": self.instruction, "cause": self.cause,
                "error": self.error, "exit_code": self.exit_code, "output": list(self.output)}


def _cause(output: list[str], error: str) -> str:
    """The step's last error line and what it printed after it (a hunk's context), else its last line."""
    for index in range(len(output) - 1, -1, -1):
        if _ERROR_LINE.search(output[index]):
            return "\n".join(text.rstrip() for text in output[index:index + CAUSE_LINES]).strip()
    meaningful = [text for text in output if text.strip()]
    return (meaningful[-1] if meaningful else error).strip()


def _exit_code(error: str) -> int | None:
    match = _EXIT_CODE.search(error)
    return int(match.group(1)) if match else None


def failed_step(lines: Iterable[str]) -> FailedStep | None:
    """The step that failed in this build output, or None when no step failed (the tool itself did)."""
    lines = [str(text).rstrip("\r\n") for text in lines]
    return _buildkit(lines) or _buildah(lines)


def _buildkit(lines: list[str]) -> FailedStep | None:
    headers: dict[str, tuple[str, str]] = {}
    output: dict[str, list[str]] = {}
    for text in lines:
        if match := _BUILDKIT_HEADER.match(text):
            headers[match.group(1)] = (f"{match.group(2)}/{match.group(3)}", match.group(4))
        elif match := _BUILDKIT_ERROR.match(text):
            vertex, error = match.group(1), match.group(2)
            if vertex not in headers:  # an internal vertex (context, metadata): no step of ours
                continue
            step, instruction = headers[vertex]
            out = output.get(vertex, [])
            return FailedStep(step, instruction, _cause(out, error), error, _exit_code(error), tuple(out[-KEEP:]))
        elif match := _BUILDKIT_OUTPUT.match(text):
            output.setdefault(match.group(1), []).append(match.group(2))
    return None


def _buildah(lines: list[str]) -> FailedStep | None:
    current: tuple[str, str] | None = None
    out: list[str] = []
    for text in lines:
        if match := _BUILDAH_HEADER.match(text):
            current, out = (f"{match.group(1)}/{match.group(2)}", match.group(3)), []
        elif match := _BUILDAH_ERROR.match(text):
            error = match.group(2)
            step, instruction = current if current else ("?", match.group(1))
            return FailedStep(step, instruction, _cause(out, error), text, _exit_code(error), tuple(out[-KEEP:]))
        elif current is not None:
            out.append(text)
    return None


def build_failure(tool: str, code: int, lines: list[str]) -> BuildFailed:
    """The error for a failed build: the step and its cause when the output names one, else the tail."""
    step = failed_step(lines)
    if step is None:
        tail = "\n".join(lines[-TAIL_SHOWN:])
        return BuildFailed(f"{tool} failed (exit {code}); no image was tagged. Last lines:\n{tail}")
    instruction = step.instruction if len(step.instruction) <= 200 else step.instruction[:197] + "..."
    return BuildFailed(f"{tool} failed at step {step.step}: {step.cause}\n  step: {instruction}\n"
                       "no image was tagged.", step=step)
