"""CUDA vocabulary shared by recipes, rules and the probe: versions and GPU targets."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH_SM = re.compile(r"^sm_(\d{2,3})([af]?)$")
_ARCH_DOTTED = re.compile(r"^(\d{1,2})\.(\d)([af]?)$")
_CUDA = re.compile(r"^(\d{1,2})\.(\d{1,2})$")


@dataclass(frozen=True, order=True)
class CudaVersion:
    """A CUDA major.minor, as a recipe pins a toolkit (`13.0`)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> "CudaVersion":
        """Accept `13.0`; also the leading major.minor of `13.0.88` or `13.0.3.0`."""
        match = re.match(r"^(\d{1,2})\.(\d{1,2})(?:\.\d+)*$", text.strip())
        if not match:
            raise ValueError(f"{text!r} is not a CUDA version like '13.0'")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True, order=True)
class Arch:
    """A GPU compile target: compute capability plus an optional `a` (arch) or `f` (family) suffix."""

    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str) -> "Arch":
        """Accept `sm_120a`, `sm_90`, `12.0f`, `9.0a`."""
        value = text.strip()
        if match := _ARCH_SM.match(value):
            digits, suffix = match.group(1), match.group(2)
            return cls(int(digits[:-1]), int(digits[-1]), suffix)
        if match := _ARCH_DOTTED.match(value):
            return cls(int(match.group(1)), int(match.group(2)), match.group(3))
        raise ValueError(f"{text!r} is not a GPU target like 'sm_120a' or '12.0f'")

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def capability(self) -> int:
        """The number ELF e_flags and PTX use: 120 for 12.0."""
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return self.sm


def parse_driver(text: str) -> tuple[int, ...]:
    """A Linux driver version like `595.71.05` as a comparable tuple."""
    if not re.match(r"^\d{3}(\.\d{1,3}){1,2}$", text.strip()):
        raise ValueError(f"{text!r} is not a Linux driver version like '595.71.05'")
    return tuple(int(part) for part in text.strip().split("."))
