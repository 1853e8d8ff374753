"""The rules over a live host's facts, as the doctor probe reports them (flows/doctor.py runs it): the
newest CUDA the driver runs, glibc against nvcc, and whether nvcc and ptxas can target the GPUs here; and
whether an image's platform runs on this host (platform_finding, over what flows/doctor.py gathers).

Each is the recipe rules (rules/recipe.py) applied to what the host has, merged into one doctor check.
The probe's own vocabulary (its consumers, which ptxas Triton runs) is the payload's, read from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from imagebuild.knowledge.facts import native_toolkit
from imagebuild.knowledge.finding import Finding, Status, has_errors
from imagebuild.knowledge.rules.recipe import check_archs, check_driver, check_glibc
from imagebuild.payload import probe
from imagebuild.recipe.cuda import CudaVersion, parse_driver

BINFMT_FIX = "apt-get install qemu-user-static binfmt-support"


def compat_findings(facts: Mapping) -> list[Finding]:
    """What compat.toml says about these facts: pure, so a test can hand it any host."""
    return [_driver_cuda(facts), _glibc_nvcc(facts), _arch_targets(facts)]


def native_cuda(driver: str) -> CudaVersion | None:
    """The newest toolkit whose first release this driver runs natively (compat.toml [[driver]])."""
    try:
        version = parse_driver(driver)
    except (ValueError, AttributeError):
        return None
    return native_toolkit(version)


def cuda_in_use(facts: Mapping) -> dict[CudaVersion, list[str]]:
    """Each CUDA version in play and who brings it: torch's build, the nvcc each consumer finds."""
    found: dict[CudaVersion, list[str]] = {}

    def add(version, who: str) -> None:
        try:
            found.setdefault(CudaVersion.parse(version), []).append(who)
        except (ValueError, AttributeError, TypeError):
            pass

    add((facts.get("torch") or {}).get("cuda"), "torch")
    for release, who in nvcc_in_use(facts).items():
        add(release, f"nvcc {release} ({', '.join(who)})")
    return found


def nvcc_in_use(facts: Mapping) -> dict[str, list[str]]:
    """nvcc release -> the consumers that would run it (all of them when none is installed)."""
    consumers = {name: entry for name, entry in (facts.get("consumers") or {}).items()
                 if name in probe.CONSUMER_LABELS and entry.get("home")}
    installed = {name: entry for name, entry in consumers.items() if entry.get("installed")} or consumers
    toolkits = {t.get("real"): t for t in facts.get("toolkits") or []}
    found: dict[str, list[str]] = {}
    for name, entry in installed.items():
        real = entry.get("real") or os.path.realpath(entry["home"])  # facts from an older probe lack it
        release = (toolkits.get(real) or {}).get("release")
        if release:
            found.setdefault(release, []).append(probe.CONSUMER_LABELS[name])
    return found


def _merge(name: str, findings: list[Finding], passed: str) -> Finding:
    """The rules' findings as one doctor check: an error where one is, else a warning; every message and
    fix, the rules' own findings in its evidence."""
    if not findings:
        return Finding.check(name, Status.PASS, passed)
    worst = Status.ERROR if has_errors(findings) else Status.WARNING
    if len(findings) == 1:
        (finding,) = findings
        return Finding.check(name, worst, finding.message, finding.fix, rule=finding.rule, facts=finding.evidence,
                             source=finding.source)
    return Finding.check(name, worst, " ".join(f.message for f in findings),
                         "; ".join(dict.fromkeys(f.fix for f in findings)), rules=[f.to_dict() for f in findings])


def _driver_cuda(facts: Mapping) -> dict:
    driver = (facts.get("driver") or {}).get("version")
    if not driver:
        return Finding.check("driver-cuda", Status.SKIP, "no driver version known")
    native = native_cuda(driver)
    in_use = cuda_in_use(facts)
    findings = [f for cuda in sorted(in_use) for f in check_driver(cuda, driver)]
    runs = f"driver {driver} runs CUDA {native} and older natively" if native else \
        f"driver {driver} is older than every CUDA release imagebuild knows"
    used = "; ".join(f"CUDA {cuda}: {', '.join(who)}" for cuda, who in sorted(in_use.items()))
    merged = _merge("driver-cuda", findings, f"{runs}; in use: {used or 'nothing'}")
    return replace(merged, message=f"{runs}. {merged.message}" if findings else merged.message,
                   evidence={**merged.evidence, "native_cuda": str(native) if native else None, "driver": driver,
                             "in_use": {str(c): who for c, who in in_use.items()}})


def _glibc_nvcc(facts: Mapping) -> dict:
    glibc = facts.get("glibc")
    releases = nvcc_in_use(facts)
    if not glibc or not releases:
        return Finding.check("glibc-nvcc", Status.SKIP, "no glibc or no nvcc to compare", glibc=glibc)
    findings = [f for release in sorted(releases) for f in check_glibc(glibc, CudaVersion.parse(release))]
    return _merge("glibc-nvcc", findings, f"glibc {glibc} and nvcc {', '.join(sorted(releases))} work together")


def _arch_targets(facts: Mapping) -> Finding:
    """Can the nvcc each consumer finds, and the ptxas Triton runs, compile for the GPUs here? Which
    ptxas Triton runs for a GPU is the payload's answer (probe.triton_ptxas_for)."""
    caps = sorted({gpu.get("compute_cap") for gpu in (facts.get("driver") or {}).get("gpus") or []} - {None})
    compilers = {f"nvcc {release}": (release, None) for release in nvcc_in_use(facts)}
    tools = ((facts.get("consumers") or {}).get("triton") or {}).get("tools") or {}
    for tool, entry in tools.items():
        if entry.get("chosen"):
            compilers[f"Triton's {tool} {entry['chosen']['release']}"] = (entry["chosen"]["release"], tool)
    if not caps or not compilers:
        return Finding.check("gpu-targets", Status.SKIP, "no GPU compute capability or no compiler to compare")
    findings = []
    for cap in caps:
        target = "sm_" + cap.replace(".", "")
        for who, (release, tool) in compilers.items():
            if tool is not None and tool != probe.triton_ptxas_for(tools, cap):
                continue  # Triton runs the other one for this GPU
            findings += [replace(f, message=f"{who}: {f.message}")
                         for f in check_archs(CudaVersion.parse(release), [target])]
    return _merge("gpu-targets", findings, f"{', '.join(compilers)} can compile for "
                  + ", ".join("sm_" + cap.replace(".", "") for cap in caps))


def platform_finding(runs: Mapping) -> Finding:
    """The `platform` finding: the host's own; emulated (slow, no GPU); or cannot run (no handler)."""
    image, host, binfmt = runs["image"], runs["host"], runs["binfmt"]
    if not runs["emulated"]:
        return Finding.check("platform", Status.PASS, f"{image}, the host's own", image=image, host=host)
    if binfmt["enabled"]:
        return Finding.check(
            "platform", Status.WARNING, f"{image} on a {host} host: runs under emulation ({binfmt['handler']}, "
            "binfmt handler enabled), slowly, and without the GPU, whose driver libraries here are "
            f"{host.split('/')[1]}", image=image, host=host, binfmt=binfmt)
    if binfmt["handler"] is None:
        return Finding.check("platform", Status.ERROR, f"{image or 'an unknown platform'} on a {host} "
                             "host: imagebuild knows no qemu handler that runs it, so the image cannot "
                             "run here", f"run doctor on a {image or 'matching'} host", image=image,
                             host=host, binfmt=binfmt)
    registered = binfmt["registered"]
    fix = f"update-binfmts --enable {binfmt['handler']}" if registered else BINFMT_FIX
    return Finding.check(
        "platform", Status.ERROR, f"{image} on a {host} host needs emulation, and its binfmt handler "
        f"{binfmt['handler']} {'is disabled' if registered else 'is not registered'} ({binfmt['path']}): "
        "the image cannot run here", probe.shell_fix([fix], [f"or run doctor on a {image} host"]),
        image=image, host=host, binfmt=binfmt)
