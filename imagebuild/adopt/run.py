"""`adopt`: an environment that works becomes a recipe (and patches) that builds it again.

    adopt(output, python=PATH | image=IMAGE, engine=...) -> AdoptReport

1. the inventory probe reads the environment (inventory.py);
2. the plan says what the recipe pins, and what it leaves out and why (plan.py);
3. the pins are resolved with uv for the base's Python and glibc, as `lock` will: a pin no index
   serves is left out and said, any other failure to resolve is one error;
4. each hand-edited file of a pinned distribution is diffed against the wheel that resolve chose
   (patches.py);
5. the recipe is written beside its patches in a staging folder, parsed with the recipe's own parser
   and checked with the knowledge rules, and only then moved into place: a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from imagebuild.knowledge import has_errors, rules
from imagebuild.knowledge.facts import debian_suite
import imagebuild.adopt.inventory as inv  # not via the package's face, which imports this module
from imagebuild.adopt.inventory import AdoptError, Inventory
from imagebuild.adopt.patches import PatchFile, Unpatched, make_patches, missing_files
from imagebuild.adopt.plan import AdoptOptions, Plan, plan_recipe, without
from imagebuild.adopt.text import PatchEntry, render
from imagebuild.base.identity import BaseIdentity
from imagebuild.common import Progress, cache_dir, quiet, write_atomic
from imagebuild.engine import Engine
from imagebuild.errors import FindingsFailed, RecipeError, ResolveFailed
from imagebuild.lock.lockfile import LockedWheel
from imagebuild.lock.remote_wheel import wheel_files
from imagebuild.lock.resolve import resolve_wheels
from imagebuild.recipe.model import image_ref_problem, load_recipe, parse_recipe

PYTORCH_INDEX = "https://download.pytorch.org/whl/{local}"  # where PyTorch publishes its +cuXYZ builds


@dataclass
class AdoptReport:
    recipe: str
    written: list[str]
    inventory: Inventory
    plan: Plan
    patches: list[PatchFile]
    unpatched: list[Unpatched]
    added_by_lock: list[str] = field(default_factory=list)  # NAME VERSION the resolve adds
    findings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        it, plan, environment = self.inventory.interpreter, self.plan, self.inventory
        return {
            "ok": True, "recipe": self.recipe, "written": self.written,
            "read": {"where": environment.where, "executable": it.executable, "real_executable": it.real_executable,
                     "prefix": it.prefix, "python": ".".join(map(str, it.version_info)), "in_venv": it.in_venv},
            "base": {"debian": plan.suite, "python": plan.python, "glibc": plan.glibc, "arch": plan.arch},
            "requirements": [p.requirement for p in plan.requirements],
            "constraints": [p.requirement for p in plan.constraints],
            "left_out": [e.to_dict() for e in plan.left_out],
            "cuda": plan.cuda.to_dict() if plan.cuda else None,
            "patches": [p.to_dict() for p in self.patches], "unpatched": [u.to_dict() for u in self.unpatched],
            "missing_files": missing_files(environment),
            "added_files": {"files": list(environment.added), "total": environment.added_total,
                            "fix": "a file no RECORD lists is not rebuilt: put it in a distribution of your own, "
                                   "or delete it if nothing needs it"},
            "added_links": {"links": [{"path": p, "target": t} for p, t in environment.links],
                            "fix": "imagebuild's build makes the CUDA toolchain's lib64 and libcudart.so links "
                                   "itself; make any other in a distribution of your own"},
            "added_by_lock": self.added_by_lock, "notes": list(plan.notes),
            "findings": [f.to_dict() for f in self.findings],
        }


def now_utc() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def adopt(output: str | Path, *, python: str | None = None, image: str | None = None, engine: Engine | None = None,
          options: AdoptOptions = AdoptOptions(), force: bool = False, now: str | None = None,
          progress: Progress = quiet) -> AdoptReport:
    output = Path(output).absolute()
    name = _check_output(output, force)
    if python is None and image is None:
        raise AdoptError("adopt reads one environment: give --python PATH, or --image IMAGE")
    if image and engine is None:
        raise AdoptError("--image needs the engine that holds the image")
    progress(f"reading the environment ({'image ' + image if image else python})")
    if image:
        environment = inv.take_inventory_in_image(image, engine, python=python)
    else:
        environment = inv.take_inventory(python)
    plan = plan_recipe(environment, options, now or now_utc())
    plan, wheels = _resolved(plan, output, name, progress)
    progress(f"diffing {sum(len(d.modified) for d in environment.distributions)} modified file(s) against the wheels")
    patches, unpatched = make_patches(environment, plan.pins, wheels, _read_member)
    entries = [PatchEntry(p.package, f"patches/{p.filename}", p.files) for p in patches]
    text = render(plan, name, entries)
    added = sorted(f"{w.name} {w.version}" for w in wheels.values() if w.name not in plan.pins)
    findings = _write(output, text, patches, force)
    written = [str(output)] + [str(output.parent / "patches" / p.filename) for p in patches]
    return AdoptReport(str(output), written, environment, plan, patches, unpatched, added, findings)


def _check_output(output: Path, force: bool) -> str:
    if output.suffix != ".toml":
        raise AdoptError(f"-o {output}: a recipe is a .toml file (recipes/NAME.toml; its lock is lockfiles/NAME.lock)")
    if output.is_dir():
        raise AdoptError(f"-o {output}: a folder; name the recipe file, recipes/NAME.toml")
    if output.exists() and not force:
        raise AdoptError(f"{output} exists: adopt never overwrites a recipe unasked; pass --force to replace it "
                         "(and its patches), or write another file with -o")
    problem = image_ref_problem(f"{output.stem}:latest")
    if problem:
        raise AdoptError(f"-o {output}: the file name becomes the image name {output.stem!r}: {problem}; "
                         "name the recipe in lower case, e.g. recipes/sglang-box.toml")
    return output.stem


def _base(plan: Plan) -> BaseIdentity:
    return BaseIdentity(kind="debian", python=plan.python, glibc=plan.glibc, arch=plan.arch, suite=plan.suite)


def _resolved(plan: Plan, output: Path, name: str, progress: Progress) -> tuple[Plan, dict[str, LockedWheel]]:
    """The pins resolved as `lock` will resolve them; a pin the index has no release or wheel of is
    left out (and said); anything else that stops the resolve is the error."""
    base = _base(plan)
    for _ in range(len(plan.pins) + 1):
        recipe = parse_recipe(render(plan, name), output)
        progress(f"resolving {len(plan.pins)} pins for Python {base.python} on {base.uv_platform}")
        try:
            wheels, _ = resolve_wheels(recipe, base)
        except ResolveFailed as err:
            missing = err.package
            if missing is None or missing not in plan.pins:
                raise ResolveFailed(f"the environment's pins do not resolve for Python {base.python} on "
                                    f"linux/{base.arch} ({base.uv_platform}), so no recipe was written:\n{err}\n"
                                    "  fix: the environment itself may be inconsistent (`pip check` there says); "
                                    "leave a distribution out with --exclude NAME, or name its index with "
                                    "--extra-index-url URL") from None
            plan = without(plan, missing, f"no release {plan.pins[missing]} of it, or no wheel of that release for "
                           f"Python {base.python} on linux/{base.arch}, on the index", _index_fix(missing, plan))
            continue
        return plan, {w.name: w for w in wheels}
    raise AssertionError("every pin was left out and the resolve still failed")


def _index_fix(name: str, plan: Plan) -> str:
    version = plan.pins.get(name, "")
    local = version.partition("+")[2]
    hint = f" (PyTorch's own index for +{local} builds is {PYTORCH_INDEX.format(local=local)})" \
        if local.startswith(("cu", "cpu", "rocm")) else ""
    return (f"adopt again with --extra-index-url URL of the index it came from{hint}, or --exclude {name} "
            "to leave it out on purpose")


def _read_member(wheel: LockedWheel, path: str) -> bytes | None:
    """A site-packages path's bytes in the wheel: the member itself, or under *.data/purelib|platlib."""
    names = wheel_files(wheel.url, wheel.sha256, cache=cache_dir() / "wheel-files").names
    member = path if path in names else next(
        (n for n in names if n.split("/", 2)[0].endswith(".data") and n.split("/", 2)[1:2] in (["purelib"], ["platlib"])
         and n.split("/", 2)[2:] == [path]), None)
    if member is None:
        return None
    return wheel_files(wheel.url, wheel.sha256, cache=cache_dir() / "wheel-files", members=(member,)).members[member]


def _write(output: Path, text: str, patches: list[PatchFile], force: bool) -> list:
    """Stage the recipe and its patches, prove them (recipe parser, knowledge rules), then move them in."""
    folder = output.parent
    final = {p.filename: folder / "patches" / p.filename for p in patches}
    clashes = [str(path) for p in patches if (path := final[p.filename]).exists() and path.read_bytes() != p.data]
    if clashes and not force:
        raise AdoptError(f"{', '.join(clashes)} exist(s) with other contents: adopt never overwrites a patch unasked; "
                         "pass --force to replace it, or write the recipe elsewhere with -o")
    made = [p for p in (folder, folder / "patches") if not p.exists()]  # removed again if nothing is written
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".adopt-", dir=folder))
    moved: list[Path] = []
    replaced: list[str] = []
    try:
        (staging / "patches").mkdir()
        for patch in patches:
            (staging / "patches" / patch.filename).write_bytes(patch.data)
        staged = staging / output.name
        staged.write_text(text, encoding="utf-8")
        try:
            recipe = load_recipe(staged)
        except RecipeError as err:  # a bug of ours: the plan wrote what the parser refuses
            raise AdoptError(f"the recipe adopt wrote does not parse, so nothing was written:\n{err}") from None
        findings = rules.check_recipe(recipe, debian_suite(recipe.base.suite).glibc)
        if has_errors(findings):
            raise FindingsFailed(findings)
        if patches:
            (folder / "patches").mkdir(exist_ok=True)
            (staging / "replaced").mkdir()
        for patch in patches:
            if final[patch.filename].exists():  # kept aside until the recipe is written (--force)
                os.replace(final[patch.filename], staging / "replaced" / patch.filename)
                replaced.append(patch.filename)
            os.replace(staging / "patches" / patch.filename, final[patch.filename])
            moved.append(final[patch.filename])
        write_atomic(output, text.encode("utf-8"))
        moved.clear()
        replaced.clear()
        made.clear()
        return findings
    finally:
        for path in moved:  # the recipe was not written: neither are its patches, and the old ones return
            path.unlink(missing_ok=True)
        for filename in replaced:
            os.replace(staging / "replaced" / filename, final[filename])
        shutil.rmtree(staging, ignore_errors=True)
        for path in reversed(made):
            with contextlib.suppress(OSError):
                path.rmdir()
