"""The zero-JIT check: the kernels [aot] prebuilt are in the image, hold SASS for the recipe's GPUs,
and are what the runtime loads with JIT impossible.

It runs after every other check (it hides nvcc, which the deep_gemm compile needs):
- each manifest artifact is where the manifest says, with its sha256, and its fat binary holds SASS for
  every [aot] arch (read from the ELF's .nv_fatbin, as `probe --waste` does);
- in a child process with FLASHINFER_DISABLE_JIT=1, SGLANG_CRASH_ON_JIT_COMPILE=1, an empty FlashInfer
  workspace and nvcc replaced by a stand-in that only answers `--version` (SGLang's cache key hashes
  that text), FlashInfer's own loaders find every declared shape's modules in its AOT folder and
  SGLang's kernel builders return from its cache;
- a shape no one declared misses (the negative control), and nothing asked nvcc to compile.
nvcc is moved aside only inside the smoke test's throwaway container, and put back afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from ..kernels.kernel_cache import sha256_file
from ..kernels.kernels_aot import describe
from ..gpus import sm_number
from ..report import FAIL, PASS, SKIP, make_check
from ..system import run_command, run_python_json

PROVE_TIMEOUT_S = 900
PACKAGE = __name__.rsplit(".", 2)[0]  # the probe: imagebuild_probe in the zipapp, imagebuild.payload.probe in the tree
_NVCC_STANDIN = """#!/bin/sh
# imagebuild's zero-JIT proof: nvcc may say its version (SGLang's cache key hashes it) and the archs it
# knows (FlashInfer 0.7.2's get_nvcc_flags_list asks, compilation_context.py), never compile.
if [ "$#" -eq 1 ] && [ "$1" = "--version" ]; then exec cat "{version}"; fi
if [ "$#" -eq 1 ] && [ "$1" = "--list-gpu-arch" ]; then echo "$1" >> "{queries}"; exec cat "{archs}"; fi
printf '%s\\n' "$*" >> "{log}"
echo "nvcc is hidden by imagebuild's zero-JIT proof: a kernel was about to be compiled" >&2
exit 1
"""


def package_root() -> str:
    """The folder to put on sys.path so that this package imports by its own name (zip or source tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in __name__.split(".")[:-1]:
        here = os.path.dirname(here)
    return here


def arch_number(arch: str) -> int:
    """`12.0f` -> 120, the number a fat binary's entry carries."""
    number = sm_number(arch)
    if number is None:
        raise ValueError(f"{arch!r} is not a GPU arch")
    return number


def check_artifacts(manifest: dict, archs: list) -> list:
    """Problems with the built files themselves: missing, changed, or without SASS for an arch."""
    problems = []
    wanted = {arch_number(arch) for arch in archs}
    for artifact in manifest.get("artifacts", []):
        path = artifact.get("path", "")
        if not os.path.isfile(path):
            problems.append(f"{artifact.get('name')}: {path} is missing")
            continue
        found = describe(path)
        if found["sha256"] != artifact.get("sha256"):
            problems.append(f"{artifact.get('name')}: sha256 {found['sha256']} differs from the manifest's")
        lacking = sorted(wanted - set(found["sass"]))
        if lacking:
            problems.append(f"{artifact.get('name')}: no SASS for {', '.join(f'sm_{a}' for a in lacking)} "
                            f"(it holds {', '.join(f'sm_{a}' for a in found['sass']) or 'none'})")
    return problems + triton_file_problems(manifest.get("triton") or {})


def triton_file_problems(triton) -> list:
    """Each seeded Triton kernel's files are in its cache folder with the sha256 the seed recorded."""
    problems = []
    for kernel in _dicts(triton.get("kernels") if isinstance(triton, dict) else None):
        label = f"Triton's {kernel.get('kernel')} for sm_{kernel.get('target')}"
        files = kernel.get("files")
        if not isinstance(files, dict) or not files:
            problems.append(f"{label}: the manifest lists no file")
            continue
        for name, sha256 in sorted(files.items()):
            path = os.path.join(str(kernel.get("folder", "")), str(name))
            if not os.path.isfile(path):
                problems.append(f"{label}: {path} is missing")
            elif sha256_file(path) != sha256:
                problems.append(f"{label}: {path} is not the file the seed wrote")
    return problems


def _dicts(value) -> list:
    """The dicts of a list read from JSON; anything else, nothing."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _strings(value) -> list:
    return [str(item) for item in value] if isinstance(value, list) else [str(value)] if value else []


def triton_problems(proof: dict, manifest: dict) -> list:
    """The seeded Triton kernels, launched again as a first request launches them: each a cache hit at the key
    the seed recorded, none left unlaunched, and an undeclared target a miss."""
    recorded = manifest.get("triton")
    seeded = _dicts(recorded.get("kernels")) if isinstance(recorded, dict) else []
    triton = proof.get("triton")
    if not seeded:
        return [] if not recorded else ["the manifest's Triton entry lists no kernel"]
    if not isinstance(triton, dict):
        return [f"the manifest lists {len(seeded)} Triton kernel(s) but the proof launched none"]
    problems = [f"a Triton launch failed: {error}" for error in _strings(triton.get("errors"))]
    served = _dicts(triton.get("served"))
    if not served:
        problems.append("no Triton kernel was launched")
    compiled = sorted({f"{e.get('kernel')} sm_{e.get('target')}" for e in served if e.get("hit") is not True})
    if compiled:
        problems.append("Triton compiled at first use what the seed should have served: " + ", ".join(compiled))
    if triton.get("unlaunched"):
        problems.append("seeded Triton kernels no launch reached: " + ", ".join(_strings(triton["unlaunched"])))
    if triton.get("rekeyed"):
        problems.append("Triton asked for other keys than the seed wrote: " + ", ".join(_strings(triton["rekeyed"])))
    seeded_ptxas, ptxas = recorded.get("ptxas"), triton.get("ptxas")
    if isinstance(seeded_ptxas, dict):
        ran = ptxas if isinstance(ptxas, dict) else {}
        problems += [f"Triton runs {ran.get(target) or 'no ptxas'} for sm_{target} where the seed ran {path}: "
                     "the ptxas's version is in every key" for target, path in sorted(seeded_ptxas.items())
                     if ran.get(target) != path]
    control = triton.get("control") if isinstance(triton.get("control"), dict) else {}
    if control.get("missed") is not True:
        seen = control.get("error") or "launched " + (", ".join(_strings(control.get("kernels"))) or "nothing")
        problems.append(f"the undeclared Triton target sm_{control.get('target')} did not miss ({seen}): "
                        "the proof cannot tell a hit from a compile")
    return problems


class HiddenNvcc:
    """Swap $CUDA_HOME/bin/nvcc for the version-only stand-in for the duration of a `with` block."""

    def __init__(self, cuda_home: str, version_text: str, scratch: str):
        self.nvcc = os.path.join(cuda_home, "bin", "nvcc")
        self.aside = self.nvcc + ".imagebuild-hidden"
        self.log = os.path.join(scratch, "nvcc-calls.log")
        self.query_log = os.path.join(scratch, "nvcc-queries.log")
        self.version = os.path.join(scratch, "nvcc-version.txt")
        self.archs = os.path.join(scratch, "nvcc-archs.txt")
        with open(self.version, "w") as handle:
            handle.write(version_text)

    def __enter__(self):
        with open(self.archs, "w") as handle:  # the real nvcc's answer, asked before it is moved aside
            handle.write(_stdout(run_command([self.nvcc, "--list-gpu-arch"], timeout=60)))
        os.replace(self.nvcc, self.aside)
        with open(self.nvcc, "w") as handle:
            handle.write(_NVCC_STANDIN.format(version=self.version, archs=self.archs, queries=self.query_log,
                                              log=self.log))
        os.chmod(self.nvcc, 0o755)
        return self

    def __exit__(self, *exc):
        os.replace(self.aside, self.nvcc)

    def calls(self) -> list:
        """What nvcc was asked to do beyond saying its version and archs: each a compile attempt."""
        return _lines(self.log)

    def queries(self) -> list:
        """The --list-gpu-arch questions nvcc answered: a spawn at load, not a compile."""
        return _lines(self.query_log)


def _stdout(result: tuple) -> str:
    """run_command's output when the command succeeded; nothing when nvcc could not answer."""
    status, output = result
    return output if status == 0 else ""


def _lines(path: str) -> list:
    try:
        with open(path) as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def check_aot(expect: dict) -> dict:
    spec = expect.get("aot")
    if not spec:
        return make_check("zero-jit", SKIP, "the recipe has no [aot] table: kernels compile on first use")
    manifest, error = read_manifest(spec)
    if error:
        return make_check("zero-jit", FAIL, error, path=spec.get("manifest", ""))
    problems = check_artifacts(manifest, spec["archs"])
    cuda_home = cuda_home_of(expect)
    if not hideable(cuda_home):
        return make_check("zero-jit", FAIL, f"cannot hide {cuda_home}/bin/nvcc for the proof (missing or read-only)",
                          problems=problems)
    proof, status, errors, nvcc_calls, nvcc_queries = run_jit_off("kernels.kernels_aot", ["prove"], spec, manifest, cuda_home,
                                                                  PROVE_TIMEOUT_S)
    return _verdict(proof, status, errors, problems, nvcc_calls, manifest, nvcc_queries)


def read_manifest(spec: dict) -> tuple:
    """([aot]'s manifest, None), or (None, why it cannot be read)."""
    path = spec.get("manifest", "")
    try:
        with open(path) as handle:
            return json.load(handle), None
    except (OSError, ValueError) as error:
        return None, f"the kernel manifest {path} is unreadable: {error}"


def cuda_home_of(expect: dict) -> str:
    return (expect.get("cuda") or {}).get("home") or os.environ.get("CUDA_HOME", "")


def hideable(cuda_home: str) -> bool:
    return os.path.isfile(os.path.join(cuda_home, "bin", "nvcc")) and os.access(os.path.join(cuda_home, "bin"), os.W_OK)


def run_jit_off(module: str, args: list, spec: dict, manifest: dict, cuda_home: str, timeout: float) -> tuple:
    """The probe's MODULE.main(ARGS + [aot.json, manifest]) in a child with FlashInfer's and SGLang's JIT off,
    an empty FlashInfer workspace and nvcc behind the stand-in: (its JSON answer, exit status, stderr's tail,
    the compiles nvcc was asked for, the arch lists it gave)."""
    with tempfile.TemporaryDirectory(prefix=f"imagebuild-{module.rpartition('.')[2]}-") as scratch:
        spec_path = os.path.join(scratch, "aot.json")
        with open(spec_path, "w") as handle:
            json.dump(spec, handle)
        env = dict(os.environ, FLASHINFER_DISABLE_JIT="1", SGLANG_CRASH_ON_JIT_COMPILE="1",
                   FLASHINFER_WORKSPACE_BASE=os.path.join(scratch, "workspace"),
                   PYTHONPATH=package_root(), PYTHONDONTWRITEBYTECODE="1")
        code = f"import sys; from {PACKAGE}.{module} import main; sys.exit(main(sys.argv[1:]))"
        with HiddenNvcc(cuda_home, manifest.get("nvcc_version", ""), scratch) as hidden:
            answer, status, errors = run_python_json(code, *args, spec_path, spec.get("manifest", ""), timeout=timeout,
                                                     env=env)
            return answer, status, errors, hidden.calls(), hidden.queries()


# What SGLang raises, in the releases read (0.5.22, 0.5.23: kernels/jit/utils/compile/loader.py), when a
# module misses its cache and SGLANG_CRASH_ON_JIT_COMPILE forbids the compile: the control must see it.
SGLANG_REFUSAL = ("RuntimeError", "SGLANG_CRASH_ON_JIT_COMPILE")


def _real(path: str) -> str:
    return os.path.realpath(path) if path else path


def coverage_problems(proof: dict, manifest: dict) -> list:
    """What the proof left unproved: a manifest module no load asked for or the process never mapped, a
    load that asked for nothing, SGLang kernels not loaded from its cache, a control that failed for a
    reason other than SGLang's refusal to compile."""
    problems = []
    flashinfer = proof["flashinfer"]
    declared = {a["name"]: a for a in manifest.get("artifacts", []) if a.get("kind") == "flashinfer"}
    sglang_built = [a for a in manifest.get("artifacts", []) if a.get("kind") == "sglang"]
    if not declared and not sglang_built:
        problems.append("the manifest lists no kernel: there is nothing to prove")
    loaded = {entry["module"] for entry in flashinfer["loaded"]}
    never = sorted(set(declared) - loaded)
    if never:
        problems.append(f"no declared load asked for {', '.join(never)}: the proof does not cover them")
    for entry in flashinfer.get("asked_nothing", []):
        problems.append(f"FlashInfer's {entry['load']} for {entry['shape']} loaded no module through its JIT "
                        "specs: the proof cannot see what it loaded")
    if "mapped" in flashinfer:
        unmapped = sorted(name for name, artifact in declared.items()
                          if name in loaded and _real(artifact.get("path", "")) not in set(flashinfer["mapped"]))
        if unmapped:
            problems.append(f"{', '.join(unmapped)}: asked for, but the process never mapped its file")
    sglang = proof.get("sglang")
    if sglang_built and not sglang:
        problems.append("the manifest lists SGLang kernels but the proof ran none of SGLang's builders")
    if sglang:
        mapped = set(sglang.get("mapped", []))
        if not mapped:
            problems.append("no SGLang kernel was loaded from its cache")
        elif sglang_built:  # every target's kernels (the proof ran SGLang's builders for each [aot] arch)
            expected = {_real(a["path"]) for a in sglang_built}
            if mapped - expected:
                problems.append("SGLang loaded kernels the manifest does not list: " + ", ".join(sorted(mapped - expected)))
            if expected - mapped:
                problems.append("SGLang kernels of the manifest that no declared builder loaded: "
                                + ", ".join(sorted(expected - mapped)))
        wrong = [f"{what}: {error or 'returned'}"[:300] for _, what, error in sglang.get("undeclared", [])
                 if not (error and error.startswith(SGLANG_REFUSAL[0]) and SGLANG_REFUSAL[1] in error)]
        if sglang.get("undeclared") and wrong:
            problems.append("the SGLang control did not end in SGLang's refusal to compile: " + "; ".join(wrong))
    return problems


def _verdict(proof: dict | None, status, errors: str, problems: list, nvcc_calls: list, manifest: dict,
             nvcc_queries: list = ()) -> dict:
    evidence = {"artifacts": len(manifest.get("artifacts", [])), "problems": problems, "nvcc_calls": nvcc_calls,
                "nvcc_queries": list(nvcc_queries)}
    if proof is None:
        return make_check("zero-jit", FAIL, f"the load proof printed no result (exit {status}): "
                          f"{(errors or '')[-1500:]}", **evidence)
    flashinfer = proof["flashinfer"]
    sglang = proof.get("sglang")
    evidence.update(proof=proof)
    problems.extend(coverage_problems(proof, manifest))
    problems.extend(triton_problems(proof, manifest))
    if flashinfer["misses"]:
        problems.append("FlashInfer missed: " + "; ".join(
            f"{m['shape']} {m['load']} {m.get('module')}: {m.get('error') or 'not from the manifest'}"
            for m in flashinfer["misses"]))
    if not flashinfer["undeclared"]["missed"]:
        problems.append("the undeclared shape did not miss: the proof cannot tell a hit from a compile "
                        f"({flashinfer['undeclared']['error']})")
    target = flashinfer.get("undeclared_target")
    quantized = [s["name"] for s in manifest.get("shapes", []) if s.get("quantization", "none") != "none"]
    if quantized and target is None:
        problems.append(f"shapes {', '.join(quantized)} are quantized but the proof tried no undeclared GPU target: "
                        "the FP4 and MoE modules take no shape, so only another target can miss")
    elif target is not None and not target["missed"]:
        problems.append(f"the undeclared target {target['load']} did not miss ({target['error']})")
    if sglang:
        if sglang["misses"]:
            problems.append("SGLang missed: " + "; ".join(f"{s} {w}: {e[:200]}" for s, w, e in sglang["misses"]))
        if not sglang["undeclared"] or any(error is None for _, _, error in sglang["undeclared"]):
            problems.append("an undeclared SGLang kernel returned without a compile: the cache check is not armed")
    if nvcc_calls:
        problems.append(f"nvcc was asked to compile {len(nvcc_calls)} time(s)")
    if problems:
        return make_check("zero-jit", FAIL, " | ".join(problems), **evidence)
    modules = len({entry["module"] for entry in flashinfer["loaded"]})
    detail = (f"{modules} FlashInfer modules loaded from its AOT folder with JIT disabled and nvcc hidden"
              + (f", {len(sglang['hits'])} SGLang builders served by {len(sglang.get('mapped', []))} kernels "
                 f"from its cache for {sglang['arch']}" if sglang else "")
              + f"; an undeclared shape missed ({flashinfer['undeclared']['module']})"
              + (f" and an undeclared target missed ({target['module']})" if target else "")
              + (f"; nvcc was spawned {len(nvcc_queries)} time(s) to list its archs (FlashInfer's arch check at "
                 "load, nothing compiled): the image keeps nvcc for it" if nvcc_queries else ""))
    return make_check("zero-jit", PASS, detail + triton_said(proof.get("triton"))
                      + first_use_said(sglang, proof.get("triton")), **evidence)


def triton_said(triton) -> str:
    served = [f"{e.get('kernel')} sm_{e.get('target')}" for e in _dicts((triton or {}).get("served"))] \
        if isinstance(triton, dict) else []
    if not served:
        return ""
    named = ", ".join(name + (f" x{served.count(name)}" if served.count(name) > 1 else "")
                      for name in sorted(set(served)))
    control = triton.get("control") if isinstance(triton.get("control"), dict) else {}
    ptxas = triton.get("ptxas") if isinstance(triton.get("ptxas"), dict) else {}
    return (f"; {len(served)} Triton kernel variant(s) of the forward served from Triton's cache ({named})"
            + (f" with {', '.join(sorted(set(map(str, ptxas.values()))))}" if ptxas else "")
            + f", an undeclared target missed (sm_{control.get('target')})")


def first_use_said(sglang, triton=None) -> str:
    """What a server's first request still compiles, by name: the Triton kernels of the forward path's ops that
    the seed did not serve."""
    first = (sglang or {}).get("first_use") if isinstance(sglang, dict) else None
    if not isinstance(first, dict):
        return ""
    seeded = {str(e.get("kernel")) for e in _dicts(triton.get("served"))} if isinstance(triton, dict) else set()
    names = [str(name) for name in first.get("triton") or [] if str(name).rpartition(".")[2] not in seeded]
    read = ", ".join(str(m) for m in first.get("modules") or []) or "no module"
    # A seeded kernel is seeded in the variants the declared shapes launch (docs/zero-jit.md's table); another
    # variant of it (another constexpr, such as a softcapping model's logits) still compiles at first use.
    variants = "in the variants the declared shapes launch (another variant compiles at first use)"
    if names:
        said = (f"; still compiled at first use, by Triton with its own ptxas (not seeded): {len(names)} kernel(s) "
                f"of the ops {read} import: {', '.join(names)}" + (f"; the others seeded {variants}" if seeded else ""))
    else:
        said = f"; every Triton kernel found in what {read} import is seeded, {variants}" if seeded else \
            f"; no Triton kernel found in what {read} import"
    return said + (f" (unreadable: {'; '.join(map(str, first['errors']))})" if first.get("errors") else "")
