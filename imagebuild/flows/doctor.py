"""`imagebuild doctor`: the image probe's doctor mode, pointed at a live host, a venv or an image.

The probe (imagebuild/payload/probe/, stdlib only) gathers facts and makes the findings that need nothing
else; it runs under the interpreter in question, or in a throwaway container of an image, shipped
there as its zipapp inside the command line (payload/probe/bundle.py). This module runs it there, reads
its findings into knowledge's Finding (knowledge.from_probe, the one boundary), and adds the rules over
the facts it reports (knowledge/rules/host.py: the newest CUDA the driver runs, glibc against nvcc, and
whether nvcc and ptxas can target the GPU).

    diagnose(python=None)            the host: python3 on PATH, or the interpreter given
    diagnose_image(image, engine)    the same probe inside a container of the image

An image of another platform than the host's runs under emulation (a qemu binfmt handler); without a
registered handler it cannot run at all, which the `platform` finding says instead of the probe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from imagebuild import payload
from imagebuild.common import host_arch
from imagebuild.engine import Engine
from imagebuild.errors import ImagebuildError, ToolMissing
from imagebuild.knowledge import Finding, MalformedProbeFinding, Status, from_probe
from imagebuild.knowledge.rules.host import compat_findings, platform_finding
from imagebuild.payload import probe
from imagebuild.payload.probe import bundle

APPLY_PATCH = payload.PATCHER
FLASHINFER_PATCH = Path(__file__).resolve().parents[2] / "recipes" / "patches" / "flashinfer-cuda-version.patch"
PROBE_TIMEOUT_S = 120
# One argv string may hold at most 128 KiB on Linux (MAX_ARG_STRLEN): the zipapp travels as one argument.
_FIND_PYTHON = ('for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$@" '
                '--doctor; fi; done; echo "imagebuild doctor: no python3 or python on PATH in this image" >&2; '
                'exit 127')


BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
QEMU_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "arm": "arm", "386": "i386", "ppc64le": "ppc64le",
             "s390x": "s390x", "riscv64": "riscv64"}  # GOARCH -> qemu-user's name, as binfmt-support registers it


class DoctorFailed(ImagebuildError):
    """The probe could not run, or printed no report: nothing was diagnosed."""


@dataclass
class DoctorReport:
    target: str  # "host" or "image NAME"
    python: str  # the interpreter the probe ran under
    findings: list[Finding]
    facts: dict
    host: dict
    seconds: float  # the whole diagnosis, container start included
    probe_seconds: float | None = None  # the probe alone, as it measured itself
    platform: dict | None = None  # images: their platform, the host's, and how a foreign one runs

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.status is Status.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status is Status.WARNING]

    def to_dict(self) -> dict:
        return {"target": self.target, "python": self.python, "ok": self.ok, "errors": len(self.errors),
                "warnings": len(self.warnings), "seconds": round(self.seconds, 2),
                "probe_seconds": self.probe_seconds, "findings": [f.to_probe() for f in self.findings],
                "facts": self.facts, "host": self.host, "platform": self.platform}


# ---- running the probe ----------------------------------------------------------------------

def diagnose(python: str | None = None, *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
             driver_file: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> DoctorReport:
    """Run the doctor probe under `python` (default: python3, else python, on env's PATH) and add the
    compatibility rules. env and cwd are the process's (default: this one's)."""
    started = time.monotonic()
    env = dict(os.environ if env is None else env)
    path = env.get("PATH")
    interpreter = python or shutil.which("python3", path=path) or shutil.which("python", path=path)
    if interpreter is None:
        raise ToolMissing("no python3 or python on PATH: give the interpreter to diagnose with --python PATH")
    argv = [interpreter, "-c", bundle.BOOTSTRAP, *inline_probe(), "--doctor"]
    argv += ["--driver-file", str(driver_file)] if driver_file else []
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)
    except FileNotFoundError:
        raise DoctorFailed(f"{interpreter}: no such interpreter") from None
    except PermissionError:
        raise DoctorFailed(f"{interpreter} is not executable") from None
    except subprocess.TimeoutExpired:
        raise DoctorFailed(f"the doctor probe under {interpreter} did not finish in {timeout:.0f} s") from None
    where = f"under {interpreter}"
    raw = _report(done.stdout, done.returncode, done.stderr, where)
    report = _finish(raw, where, "host", raw.get("host", {}).get("executable") or interpreter,
                     time.monotonic() - started)
    _exact_patch_fix(report)
    return report


def diagnose_image(image: str, engine: Engine, *, python: str | None = None, env: Mapping[str, str] | None = None,
                   unset: Iterable[str] = (), gpus: bool | None = None,
                   timeout: float = PROBE_TIMEOUT_S, binfmt_dir: Path | None = None) -> DoctorReport:
    """Run the same probe in a throwaway container of the image (network off), under `python` or the image's
    python3; env and unset change the container's variables first, as `docker run -e` would. An image of
    another platform runs emulated through the qemu handler registered under binfmt_dir (default
    BINFMT_DIR), or not at all."""
    started = time.monotonic()
    engine.check()
    info = engine.require(image)
    runs = image_platform(info.platform or "linux/amd64", binfmt_dir=binfmt_dir)
    if runs["emulated"] and not runs["binfmt"]["enabled"]:  # the container could not even start
        return DoctorReport(f"image {image}", python or "python3", [platform_finding(runs)], {}, {},
                            time.monotonic() - started, platform=runs)
    payload = inline_probe()
    changes = [f"-u{key}" for key in unset] + [f"{key}={value}" for key, value in (env or {}).items()]
    run = [python, "-c", bundle.BOOTSTRAP, *payload, "--doctor"] if python else \
        ["sh", "-c", _FIND_PYTHON, "sh", bundle.BOOTSTRAP, *payload]
    command = (["env", *changes] if changes else []) + run
    if gpus is None:  # the host's driver libraries are of the host's architecture, useless when emulated
        gpus = os.path.exists("/dev/nvidiactl") and not runs["emulated"]
    result = engine.run(image, command, network=False, gpus=gpus, timeout=timeout)
    if result.timed_out:
        raise DoctorFailed(f"the doctor probe in {image} did not finish in {timeout:.0f} s")
    raw = _report(result.stdout, result.exit_code, result.stderr, f"in {image}")
    report = _finish(raw, f"in {image}", f"image {image}", raw.get("host", {}).get("executable") or python or "python3",
                     time.monotonic() - started)
    report.findings.insert(0, platform_finding(runs))
    report.platform = runs
    return report


# ---- the image's platform against the host's ------------------------------------------------

def binfmt_handler(arch: str, binfmt_dir: Path | None = None) -> dict:
    """The qemu binfmt handler that runs `arch` binaries here: its name (None for an arch qemu-user
    does not know), its file, and whether it is registered and enabled (its first line says so)."""
    name = f"qemu-{QEMU_ARCH[arch]}" if arch in QEMU_ARCH else None
    path = Path(binfmt_dir or BINFMT_DIR) / name if name else None
    try:
        first = path.read_text(errors="replace").split("\n", 1)[0].strip() if path else None
    except OSError:  # not registered, or no binfmt_misc mounted
        first = None
    return {"handler": name, "path": str(path) if path else None, "registered": first is not None,
            "enabled": first == "enabled"}


def image_platform(image: str, machine: str | None = None, binfmt_dir: Path | None = None) -> dict:
    """How an image of `image` (ImageInfo.platform, linux/arm64[/v8]) runs on this host."""
    parts = str(image).split("/")
    arch = parts[1] if len(parts) > 1 and parts[1] else str(image)
    host = host_arch(machine)
    emulated = arch != host
    return {"image": str(image), "host": f"linux/{host}", "emulated": emulated,
            "binfmt": binfmt_handler(arch, binfmt_dir) if emulated else None}


def inline_probe() -> list:
    """The probe's zipapp as the arguments bundle.BOOTSTRAP unpacks."""
    try:
        return bundle.inline_args()
    except ValueError as err:
        raise DoctorFailed(str(err)) from None


def _report(stdout: str, status: int, stderr: str, where: str) -> dict:
    try:
        raw = json.loads(stdout)
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict) or raw.get("mode") != "doctor":
        tail = (stderr or stdout).strip()[-2000:]
        raise DoctorFailed(f"the doctor probe {where} printed no report (exit {status}): {tail}"
                           + ("; the probe needs Python 3.9 or newer" if "SyntaxError" in tail else ""))
    return raw


def _finish(raw: dict, where: str, target: str, python: str, seconds: float) -> DoctorReport:
    facts = raw.get("facts") or {}
    checks = raw.get("checks") or []
    try:
        if not isinstance(checks, list):
            raise MalformedProbeFinding(f"its checks are a {type(checks).__name__}, not a JSON list")
        found = [from_probe(check) for check in checks]
    except MalformedProbeFinding as error:
        raise DoctorFailed(f"the doctor probe {where} printed a malformed report: {error}") from None
    findings = found + (compat_findings(facts) if facts else [])
    return DoctorReport(target, python, findings, facts, raw.get("host") or {}, seconds, raw.get("seconds"))


def _exact_patch_fix(report: DoctorReport) -> None:
    """On a host with imagebuild's source tree, the FlashInfer fix becomes the exact command."""
    at = next((i for i, f in enumerate(report.findings) if f.rule == "flashinfer-cuda-version"
               and f.status in (Status.ERROR, Status.WARNING) and f.evidence.get("found")), None)
    if at is None or not FLASHINFER_PATCH.is_file():
        return
    finding = report.findings[at]
    site = Path(finding.evidence["source"]).parents[2]
    sha = hashlib.sha256(FLASHINFER_PATCH.read_bytes()).hexdigest()
    command = (f"{report.facts['stack']['executable']} {APPLY_PATCH} --strip 1 --package flashinfer-python "
               f"--sha256 {sha} {site} {FLASHINFER_PATCH}")
    report.findings[at] = replace(finding, fix=probe.shell_fix([command], [
        "written for flashinfer-python 0.7.2",
        'in a recipe: [[patches]] package = "flashinfer-python", file = "patches/flashinfer-cuda-version.patch"']))
