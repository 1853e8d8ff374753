"""The CI workflow users copy (.github/workflows/build.yml): its step scripts are plain shell GitHub runs
as written. The workflow run for real is tests/slow/test_ci_workflow.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "build.yml"
STEPS = ("Registry, credentials and build cache", "Build by lock (smoke-tested before it is tagged or pushed)",
         "Smoke test the tagged image", "Published")
USERS = {"ci": "s3cret-pass"}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def workflow_steps(job: str = "image") -> dict[str, dict]:
    workflow = YAML(typ="safe").load(WORKFLOW.read_text())
    return {step.get("name", step.get("uses")): step for step in workflow["jobs"][job]["steps"]}


def run_step(script: str, env: dict, workdir: Path) -> subprocess.CompletedProcess:
    """One step's script as GitHub runs it: `bash -e`, in the checkout."""
    (workdir / "step.sh").write_text(script)
    return subprocess.run(["bash", "-e", str(workdir / "step.sh")], cwd=workdir, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **env})


def test_the_steps_run_here_are_plain_shell_with_no_github_expressions():
    """What the run test executes is exactly what GitHub executes: no ${{ }} inside the scripts."""
    steps = workflow_steps()
    for name in STEPS:
        assert "${{" not in steps[name]["run"], name


def test_the_gallery_is_one_job_per_recipe_and_each_reads_every_recipes_main_cache(tmp_path):
    """The gallery job turns RECIPES into the image job's matrix; each recipe's job publishes under a tag of
    its own recipe, writes its own cache and reads its own and every other recipe's cache of main."""
    if shutil.which("jq") is None:
        pytest.fail("jq is needed (apt-get install -y jq): the workflow's gallery step runs it")
    workflow = YAML(typ="safe").load(WORKFLOW.read_text())
    image = workflow["jobs"]["image"]
    assert image["needs"] == "gallery" and image["env"]["RECIPE"] == "${{ matrix.recipe }}"
    assert image["strategy"]["matrix"]["recipe"] == "${{ fromJSON(needs.gallery.outputs.recipes) }}"
    assert workflow["jobs"]["gallery"]["outputs"]["recipes"] == "${{ steps.list.outputs.recipes }}"

    recipes = "recipes/cuda-toolchain.toml recipes/sglang-blackwell.toml  recipes/sglang-hopper.toml"
    (tmp_path / "output").touch()
    listed = run_step(workflow_steps("gallery")["The gallery as a matrix"]["run"],
                      {"RECIPES": recipes, "GITHUB_OUTPUT": str(tmp_path / "output")}, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert (tmp_path / "output").read_text() == ('recipes=["recipes/cuda-toolchain.toml",'
                                                 '"recipes/sglang-blackwell.toml","recipes/sglang-hopper.toml"]\n')

    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    flags = {}
    for recipe in recipes.split():
        temp = tmp_path / "runner-temp" / Path(recipe).stem
        temp.mkdir(parents=True)
        done = run_step(workflow_steps()["Registry, credentials and build cache"]["run"],
                        {"RECIPES": recipes, "RECIPE": recipe, "IMAGE_REPOSITORY": "registry.test/team/gallery",
                         "RUNNER_TEMP": str(temp), "GITHUB_REF": "refs/heads/main", "GITHUB_REF_NAME": "main",
                         "FORK": "false", **({"COMPRESSION": "zstd"} if "hopper" in recipe else {})}, tmp_path)
        assert done.returncode == 0, done.stderr
        flags[Path(recipe).stem] = (temp / "build-flags").read_text().splitlines()
    cache = "registry.test/team/gallery:buildcache"
    assert flags["sglang-hopper"] == [
        "--cache-from", f"{cache}-sglang-hopper-branch-main", "--cache-from", f"{cache}-sglang-hopper-branch-main",
        "--cache-from", f"{cache}-cuda-toolchain-branch-main", "--cache-from", f"{cache}-sglang-blackwell-branch-main",
        "--registry", "registry.test/team/gallery", "--tag", "imagebuild/sglang-hopper:sglang-hopper-branch-main",
        "--compression", "zstd", "--cache-to", f"{cache}-sglang-hopper-branch-main"]
    assert flags["cuda-toolchain"][flags["cuda-toolchain"].index("--compression") + 1] == "gzip"  # the default
    tags = {stem: said[said.index("--tag") + 1].split(":")[1] for stem, said in flags.items()}
    assert len(set(tags.values())) == 3 and all(tag.startswith(stem) for stem, tag in tags.items())
