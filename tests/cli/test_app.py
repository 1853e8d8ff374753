"""The CLI: exit codes a CI can branch on, --json on stdout, one clear message for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
[image]
name = "imagebuild-test/cli"

[base]
debian = "bookworm"

[python]
requirements = ["cuda-toolkit[nvcc,cudart]==13.0.3.0"]

[cuda]
toolkit = "13.0"
archs = ["sm_120a"]
min_driver = "{driver}"
"""


def imagebuild(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imagebuild", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)


def test_check_ok_is_exit_0_with_json(write_recipe):
    result = imagebuild("check", str(write_recipe(GOOD.format(driver="595.71.05"))), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["ok"], [(f["severity"], f["rule"]) for f in report["findings"]]) == (True, [("note", "lock-missing")])


def test_check_with_a_driver_too_old_is_exit_1_and_names_the_fix(write_recipe):
    result = imagebuild("check", str(write_recipe(GOOD.format(driver="570.124.06"))), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert finding["rule"] == "driver-too-old" and "570.124.06" in finding["evidence"]
    assert finding["fix"] and finding["source"]


def test_bad_recipe_is_exit_2_with_file_line_and_key(write_recipe):
    path = write_recipe(GOOD.format(driver="595.71.05").replace("requirements", "requirments"))
    result = imagebuild("check", str(path))
    assert result.returncode == 2
    assert f"{path}:" in result.stderr and "requirments" in result.stderr and "requirements" in result.stderr
    assert "Traceback" not in result.stderr
    as_json = json.loads(imagebuild("check", str(path), "--json").stdout)
    assert as_json["ok"] is False and as_json["error"] == "RecipeError"


def test_toml_syntax_error_names_line_and_column(write_recipe):
    path = write_recipe('[image]\nname = "x\n')
    result = imagebuild("check", str(path))
    assert result.returncode == 2 and f"{path}:2" in result.stderr


def test_lock_json_reports_the_lock_and_is_idempotent(write_recipe):
    path = write_recipe(GOOD.format(driver="595.71.05"), "cli")
    first = json.loads(imagebuild("lock", str(path), "--json").stdout)
    assert first["changed"] is True and first["packages"] >= 3
    lock_file = Path(first["lock"])
    assert lock_file == path.parent.parent / "lockfiles" / "cli.lock"
    second = json.loads(imagebuild("lock", str(path), "--json").stdout)
    assert second["changed"] is False and second["lock_sha256"] == first["lock_sha256"]


def test_stale_lock_refuses_to_render_until_relocked(write_recipe, tmp_path):
    path = write_recipe(GOOD.format(driver="595.71.05"))
    assert imagebuild("lock", str(path)).returncode == 0
    path.write_text(path.read_text().replace('"sm_120a"', '"sm_120a", "12.0f"'))
    stale = imagebuild("render", str(path), "-o", str(tmp_path / "ctx"))
    assert stale.returncode == 2 and "stale" in stale.stderr and "--relock" in stale.stderr
    assert not (tmp_path / "ctx").exists()
    fresh = imagebuild("render", str(path), "-o", str(tmp_path / "ctx"), "--relock", "--json")
    assert fresh.returncode == 0, fresh.stderr
    assert (Path(json.loads(fresh.stdout)["dockerfile"])).read_text().startswith("# Rendered by imagebuild")


@pytest.mark.engine
def test_no_engine_is_exit_3_with_how_to_start_one(write_recipe):
    import os
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = imagebuild("smoke", "imagebuild/none:1", env=env)
    assert result.returncode == 3 and "dockerd" in result.stderr


def test_repository_locks_are_fresh():
    """What CI users do: a committed lock that no longer matches its recipe fails here first."""
    from imagebuild.lock import ensure_fresh, read_lock
    from imagebuild.recipe.model import load_recipe
    from imagebuild.render import template_sha256
    for recipe_path in sorted((REPO / "recipes").glob("*.toml")):
        recipe = load_recipe(recipe_path)
        lock_path = REPO / "lockfiles" / f"{recipe.stem}.lock"
        if recipe.platforms:  # one lock per platform in the file
            for spec in recipe.platforms:
                ensure_fresh(read_lock(lock_path, spec.arch), recipe.for_platform(spec.arch), lock_path,
                             template_sha256=template_sha256())
        else:
            ensure_fresh(read_lock(lock_path), recipe, lock_path, template_sha256=template_sha256())
