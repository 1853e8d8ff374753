"""An inventory report -> the recipe's values and text: top-level pins, constraints, [cuda], the base, and
what is left out. Unit tests on reports in the probe's format, and properties over random environments:
the requirements (with their extras) install every adopted distribution and nothing else, each pin is
the installed version, and the text parses with the recipe's own parser to the same values."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement

from imagebuild.knowledge import has_errors, rules
from imagebuild.adopt.inventory import AdoptError, read_inventory
from imagebuild.adopt.plan import SEED_TOOLS, AdoptOptions, plan_recipe
from imagebuild.adopt.text import PatchEntry, render
from imagebuild.recipe.model import parse_recipe
from tests.adopt.inventories import MARKERS, dist, report

NOW = "2026-12-01T00:00:00Z"
GPU = AdoptOptions(archs=("sm_120a",))
RECIPE = Path("/src/recipes/box.toml")


def plan_of(raw: dict, options: AdoptOptions = GPU):
    return plan_recipe(read_inventory(raw, "--python /env/bin/python"), options, NOW)


def parsed(plan, patches=()):
    return parse_recipe(render(plan, "box", patches), RECIPE)


TORCH = ("2.14.1", "13.0")
CUDA_TOOLKIT = dist("cuda-toolkit", "13.0.3.0", extras=["all", "cccl", "nvcc"], requires=[
    "nvidia-cuda-nvcc==13.0.88.*; sys_platform == 'linux' and extra == 'all'",
    "nvidia-cublas==13.1.1.3.*; sys_platform == 'linux' and extra == 'all'",
    "nvidia-cuda-cccl==13.0.85.*; sys_platform == 'linux' and extra == 'cccl'",
    "nvidia-cuda-nvcc==13.0.88.*; sys_platform == 'linux' and extra == 'nvcc'",
    "nvidia-cuda-runtime==13.0.96.*; sys_platform == 'linux' and extra == 'nvcc'"])
TOOLCHAIN = [CUDA_TOOLKIT, dist("nvidia-cuda-nvcc", "13.0.88", ["nvidia-cuda-runtime"]),
             dist("nvidia-cuda-cccl", "13.0.85"), dist("nvidia-cuda-runtime", "13.0.96")]


def test_the_requirements_are_what_nothing_requires_with_the_extras_installed():
    plan = plan_of(report(TOOLCHAIN + [dist("python-dateutil", "2.9.0.post0", ["six >=1.5"]), dist("six", "1.17.0")],
                          torch=TORCH))
    # [all] also needs nvidia-cublas, which is not installed: cuda-toolkit was not installed with it
    assert [p.requirement for p in plan.requirements] == [
        "cuda-toolkit[cccl,nvcc]==13.0.3.0", "python-dateutil==2.9.0.post0", "torch==2.14.1"]
    assert [p.requirement for p in plan.constraints] == [
        "nvidia-cuda-cccl==13.0.85", "nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-runtime==13.0.96", "six==1.17.0"]
    assert {p.name: p.why for p in plan.constraints}["nvidia-cuda-runtime"] == "required by cuda-toolkit, nvidia-cuda-nvcc"
    assert plan.packages == (("g++", "nvcc's host compiler: nvidia-cuda-nvcc 13.0.88 is in the environment"),)
    recipe = parsed(plan)
    assert recipe.python.requirements == tuple(p.requirement for p in plan.requirements)
    assert recipe.python.constraints == tuple(p.requirement for p in plan.constraints)
    assert (recipe.base.suite, recipe.base.arch, recipe.base.packages) == ("bookworm", "amd64", ("g++",))
    assert not has_errors(rules.check_recipe(recipe, "2.36"))


def test_a_requirement_whose_marker_is_false_here_is_no_edge():
    plan = plan_of(report([dist("app", requires=["winlib; sys_platform == 'win32'", "lib"]), dist("lib"),
                           dist("winlib")], torch=TORCH))
    assert [p.name for p in plan.requirements] == ["app", "torch", "winlib"]


def test_a_cycle_nothing_else_requires_keeps_one_member_and_an_extra_asked_is_followed():
    plan = plan_of(report([dist("a", requires=["b"]), dist("b", requires=["a", "c[fast]"]),
                           dist("c", extras=["fast"], requires=["d; extra == 'fast'"]), dist("d")], torch=TORCH))
    assert [p.name for p in plan.requirements] == ["a", "torch"]
    assert [p.name for p in plan.constraints] == ["b", "c", "d"]


def test_an_editable_install_is_left_out_and_what_it_required_is_required_directly():
    editable = {"url": "file:///home/me/proj", "dir_info": {"editable": True}}
    plan = plan_of(report([dist("proj", "0.1", ["six", "attrs"], direct_url=editable), dist("six"), dist("attrs"),
                           dist("app", requires=["six"])], torch=TORCH))
    assert [p.name for p in plan.requirements] == ["app", "attrs", "torch"]
    assert {p.name: p.why for p in plan.requirements}["attrs"] == "required by proj, which is left out"
    (left,) = plan.left_out
    assert (left.name, left.excluded) == ("proj", True) and "editable from file:///home/me/proj" in left.why
    assert "publish it to an index" in left.fix
    assert parsed(plan).python.exclude == ("proj",)


@pytest.mark.parametrize("direct_url, kind", [
    ({"url": "git+https://example.org/x.git", "vcs_info": {"vcs": "git", "commit_id": "abc"}}, "git+https://example.org/x.git (git abc)"),
    ({"url": "file:///tmp/x-1.0-py3-none-any.whl", "archive_info": {}}, "a local path, file:///tmp/x-1.0-py3-none-any.whl"),
    ({"url": "https://example.org/x-1.0.tar.gz", "archive_info": {}}, "from https://example.org/x-1.0.tar.gz"),
    ({"unreadable": "ValueError: bad"}, "direct_url.json unreadable"),
])
def test_every_install_no_index_gives_again_is_left_out_with_why(direct_url, kind):
    plan = plan_of(report([dist("x", direct_url=direct_url)], torch=TORCH))
    assert [e.name for e in plan.left_out] == ["x"] and kind in plan.left_out[0].why


def test_a_distribution_without_a_record_is_left_out():
    plan = plan_of(report([dist("aptpkg", record=False)], torch=TORCH))
    assert "without a RECORD" in plan.left_out[0].why


def test_the_venvs_own_installer_is_left_out_unless_something_requires_it():
    plan = plan_of(report([dist("pip", "23.0.1"), dist("setuptools", "66.1.1"), dist("app", requires=["setuptools"])],
                          torch=TORCH))
    assert [p.name for p in plan.constraints] == ["setuptools"]
    (pip,) = plan.left_out
    assert (pip.name, pip.excluded) == ("pip", False) and "python -m venv" in pip.why
    assert "pip" not in parsed(plan).python.exclude


def test_an_installer_that_only_an_asked_extra_requires_stays_pinned():
    """app[fast] is a root (its extra's requirement is installed); its extra asks lib[fast], whose extra
    requires pip: installing the roots installs pip, so pip is pinned, not left out. Hypothesis found it."""
    plan = plan_of(report([dist("pip", "23.0.1"), dist("lib", requires=["pip; extra == 'fast'"], extras=["fast"]),
                           dist("app", requires=["lib[fast]; extra == 'fast'"], extras=["fast"])], torch=TORCH))
    assert "pip" in plan.pins and "pip" not in {e.name for e in plan.left_out}
    assert [(p.name, p.extras) for p in plan.requirements if p.name == "app"] == [("app", ("fast",))]
    # The control: without the extra asking for it, pip is the venv's and left out.
    plan = plan_of(report([dist("pip", "23.0.1"), dist("lib", requires=["pip; extra == 'fast'"], extras=["fast"]),
                           dist("app", requires=["lib"])], torch=TORCH))
    assert "pip" not in plan.pins and [e.name for e in plan.left_out] == ["pip"]


def test_cuda_comes_from_torch_the_gpus_and_the_driver():
    plan = plan_of(report(TOOLCHAIN, torch=TORCH, gpus=[("NVIDIA RTX PRO 6000", "12.0"), ("NVIDIA A10", "8.6")],
                          driver="595.71.05"), AdoptOptions())
    cuda = plan.cuda
    assert (cuda.toolkit, cuda.archs, cuda.min_driver) == ("13.0", ("sm_120a", "sm_86"), "595.71.05")
    assert "torch 2.14.1" in cuda.toolkit_from and "GPU 0 NVIDIA RTX PRO 6000 (compute capability 12.0" in cuda.archs_from
    assert cuda.min_driver_from == "the driver here (nvidia-smi)"
    text = render(plan, "box")
    assert 'archs = ["sm_120a", "sm_86"]' in text and "# torch 2.14.1: torch/version.py cuda = '13.0'" in text


def test_without_a_driver_min_driver_is_the_toolkits_own_minimum():
    plan = plan_of(report(TOOLCHAIN, torch=TORCH))
    assert plan.cuda.min_driver == "580.65.06" and "CUDA 13.0's minimum" in plan.cuda.min_driver_from


def test_options_override_gpus_and_driver():
    plan = plan_of(report(TOOLCHAIN, torch=TORCH, gpus=[("H200", "9.0")], driver="570.86.15"),
                   AdoptOptions(archs=("12.0f", "sm_120f"), min_driver="595.71.05"))
    assert (plan.cuda.archs, plan.cuda.archs_from, plan.cuda.min_driver) == (("sm_120f",), "--arch", "595.71.05")


def test_torch_without_cuda_and_no_toolchain_writes_no_cuda_table():
    plan = plan_of(report([dist("numpy")], torch=("2.13.0+cpu", None)), AdoptOptions())
    assert plan.cuda is None and parsed(plan).cuda is None
    assert any("no [cuda] table" in note for note in plan.notes)


def test_without_torch_the_toolkit_comes_from_the_nvcc_wheel():
    plan = plan_of(report(TOOLCHAIN), AdoptOptions(archs=("sm_120a",), without_torch=True))
    assert (plan.cuda.toolkit, plan.cuda.toolkit_from) == ("13.0", "the CUDA toolchain wheels: nvidia-cuda-nvcc 13.0.88")


def test_a_torch_toolchain_skew_is_noted():
    plan = plan_of(report(TOOLCHAIN, torch=("2.9.1", "12.8")))
    assert plan.cuda.toolkit == "12.8" and any("CUDA 13.0" in n and "follows torch" in n for n in plan.notes)


@pytest.mark.parametrize("raw, options, said", [
    (report([dist("six")]), GPU, "no torch in the environment of /env/bin/python (Python 3.11.2, prefix /env, a venv)"),
    (report([dist("six")], executable="/usr/bin/python3", in_venv=False), GPU,
     "no torch in the environment of /usr/bin/python3 (Python 3.11.2, prefix /usr, not a venv)"),
    (report(TOOLCHAIN, torch=TORCH), AdoptOptions(), "no GPU answered nvidia-smi, and no --arch was given"),
    (report(TOOLCHAIN, torch=TORCH, gpus=[("Old", None)]), AdoptOptions(), "gave no compute capability"),
    (report(TOOLCHAIN, torch=TORCH), AdoptOptions(archs=("blackwell",)), "--arch: 'blackwell' is not a GPU target"),
    (report(TOOLCHAIN, torch=TORCH), AdoptOptions(archs=("sm_120a",), min_driver="595"), "--min-driver:"),
    (report([], torch=TORCH), AdoptOptions(exclude=("flash-attn",)), "--exclude flash-attn: not installed"),
    (report([], torch=TORCH, version=(3, 12, 3)), GPU, "Python 3.12: no Debian suite imagebuild knows has it"),
    (report([], torch=TORCH, implementation="pypy"), GPU, "pypy is not CPython"),
    (report([], torch=TORCH, machine="riscv64"), GPU, "imagebuild builds linux/amd64 and linux/arm64 only"),
])
def test_each_bad_environment_is_one_clear_error(raw, options, said):
    with pytest.raises(AdoptError) as caught:
        plan_of(raw, options)
    assert said in str(caught.value)


def test_an_exclude_and_an_arm64_interpreter():
    plan = plan_of(report([dist("six"), dist("app", requires=["six"])], torch=TORCH, machine="aarch64"),
                   AdoptOptions(archs=("sm_121a",), exclude=("App",)))
    assert (plan.arch, [e.name for e in plan.left_out], [p.name for p in plan.requirements]) == (
        "arm64", ["app"], ["six", "torch"])
    assert parsed(plan).base.arch == "arm64"


def test_a_broken_metadata_is_left_out_never_written():
    plan = plan_of(report([dist("odd", version="not a version")], torch=TORCH))
    assert plan.left_out[0].name == "odd" and not plan.left_out[0].excluded
    assert "odd" not in render(plan, "box")


def test_outside_text_stays_in_its_comment():
    raw = report(TOOLCHAIN, torch=TORCH, gpus=[('Evil\n[image]\nname = "x" "', "12.0")], driver="595.71.05",
                 executable='/home/"me"\n[base]/bin/python')
    plan = plan_of(raw, AdoptOptions())
    recipe = parsed(plan)
    assert recipe.name == "box" and recipe.cuda.archs[0].sm == "sm_120a"
    text = render(plan, "box", [PatchEntry("six", "patches/six-1.0.patch", ("six.py\n[x]",))])
    assert "# the edits: six.py [x]" in text


# ---- properties over random environments --------------------------------------------------------

NAMES = [f"p{i}" for i in range(7)] + ["pip", "setuptools"]
ORIGINS = [None] * 6 + [{"url": "file:///src", "dir_info": {"editable": True}}, {"url": "file:///w.whl", "archive_info": {}}]


@st.composite
def environments(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True))
    dists = []
    for name in names:
        extras = draw(st.lists(st.sampled_from(["fast", "gpu"]), unique=True, max_size=2))
        requires = []
        for other in draw(st.lists(st.sampled_from(names + ["absent"]), max_size=4, unique=True)):
            asked = draw(st.sampled_from(["", "[fast]", "[gpu,fast]"]))
            marker = draw(st.sampled_from(["", "; sys_platform == 'linux'", "; sys_platform == 'win32'",
                                           *[f"; extra == '{e}'" for e in extras]]))
            requires.append(f"{other}{asked}>=0{marker}")
        dists.append(dist(name, draw(st.sampled_from(["1.0", "2.0.post1", "0.9+local"])), requires, extras,
                          direct_url=draw(st.sampled_from(ORIGINS))))
    return report(dists, torch=TORCH)


def installs(requirements, raw) -> set[str]:
    """What installing these requirements installs, by the environment's Requires-Dist alone: an
    independent reading with packaging's markers, no code of adopt's."""
    by_name = {d["name"]: d for d in raw["distributions"]}
    queue, extras_of = [Requirement(r) for r in requirements], {}
    while queue:
        req = queue.pop()
        asked = set(req.extras)
        if req.name not in by_name or (req.name in extras_of and asked <= extras_of[req.name]):
            continue
        extras_of[req.name] = extras_of.get(req.name, set()) | asked
        environments = [{**MARKERS, "extra": extra} for extra in ["", *sorted(extras_of[req.name])]]
        for line in by_name[req.name]["requires"]:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate(env) for env in environments):
                queue.append(dep)
    return set(extras_of)


@settings(max_examples=150)
@given(environments())
def test_the_pins_install_exactly_what_was_adopted(raw):
    plan = plan_of(raw)
    installed = {d["name"]: d["version"] for d in raw["distributions"]}
    left = {e.name for e in plan.left_out}
    pinned = plan.pins
    assert set(pinned) | left == set(installed) and not set(pinned) & left
    assert all(pinned[name] == installed[name] for name in pinned)
    assert not {p.name for p in plan.requirements} & {p.name for p in plan.constraints}
    excluded = set(plan.exclude)
    reached = installs([p.requirement for p in plan.requirements],
                       dict(raw, distributions=[d for d in raw["distributions"] if d["name"] not in excluded]))
    assert reached - excluded == set(pinned)
    assert all(name in SEED_TOOLS or name in excluded for name in left)
    recipe = parsed(plan)
    assert recipe.python.requirements == tuple(p.requirement for p in plan.requirements)
    assert recipe.python.constraints == tuple(p.requirement for p in plan.constraints)
    assert recipe.python.exclude == tuple(sorted(excluded))
    assert not has_errors(rules.check_recipe(recipe, "2.36"))


@settings(max_examples=100)
@given(st.text(max_size=40), st.text(max_size=40))
def test_any_gpu_name_or_interpreter_path_stays_a_comment(gpu, path):
    plan = plan_of(report(TOOLCHAIN, torch=TORCH, gpus=[(gpu, "12.0")], driver="595.71.05",
                          executable=f"/x{path}/bin/python"), AdoptOptions())
    recipe = parsed(plan)
    assert (recipe.name, recipe.cuda.min_driver) == ("box", "595.71.05")
    assert recipe.python.requirements == tuple(p.requirement for p in plan.requirements)
