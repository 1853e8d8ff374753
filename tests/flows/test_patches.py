"""`imagebuild patches` over flows/patches.py: each recipe patch against the locked release (a real
requests wheel, downloaded, never installed), in text and JSON; a patch that no longer applies fails
(exit 1), and a --version that names no exact release is refused before anything is downloaded."""

from __future__ import annotations

import json

from imagebuild.cli.app import main as cli_main
from imagebuild.flows.patches import patches
from imagebuild.lock import read_lock
from tests.lock.test_patches import BAD_PATCH, locked  # noqa: F401 -- the fixture: a recipe locked with a patch


def test_the_locked_release_is_checked_in_text_and_json(locked, capsys):  # noqa: F811
    path, report = locked
    version = read_lock(report.lock_path).packages["requests"]
    assert cli_main(["patches", str(path), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["ok"] is True
    (one,) = said["patches"]
    assert (one["package"], one["patch"], one["applies"], one["problems"]) == ("requests", "requests.patch", True, [])
    assert one["checked"] == one["locked"] == version

    (path.parent / "requests.patch").write_text(BAD_PATCH)  # the negative control: a hunk that matches nothing
    assert cli_main(["patches", str(path)]) == 1
    text = capsys.readouterr().out
    assert f"requests.patch (requests {one['checked']}, locked {one['locked']}): does not apply" in text
    assert "hunk 1 of 1" in text
    flow = patches(path)
    assert not flow.ok and flow.to_dict()["ok"] is False and flow.results[0].problems


def test_a_version_that_names_no_exact_release_is_refused(tmp_path, capsys):
    code = cli_main(["patches", str(tmp_path / "none.toml"), "--version", "requests>=2", "--json"])
    said = json.loads(capsys.readouterr().out)
    assert code == 2 and said["ok"] is False
    assert said["message"] == "--version 'requests>=2': name one exact release, as PACKAGE==VERSION"
