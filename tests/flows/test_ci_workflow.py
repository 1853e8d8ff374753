"""The CI workflow users copy (.github/workflows/build.yml): its step scripts are plain shell GitHub runs
as written. The workflow run for real is tests/slow/test_ci_workflow.py."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "build.yml"
STEPS = ("Registry, credentials and build cache", "Build by lock (smoke-tested before it is tagged or pushed)",
         "Smoke test the tagged image", "Published")
USERS = {"ci": "s3cret-pass"}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def workflow_steps() -> dict[str, dict]:
    workflow = YAML(typ="safe").load(WORKFLOW.read_text())
    return {step.get("name", step.get("uses")): step for step in workflow["jobs"]["image"]["steps"]}


def test_the_steps_run_here_are_plain_shell_with_no_github_expressions():
    """What the run test executes is exactly what GitHub executes: no ${{ }} inside the scripts."""
    steps = workflow_steps()
    for name in STEPS:
        assert "${{" not in steps[name]["run"], name
