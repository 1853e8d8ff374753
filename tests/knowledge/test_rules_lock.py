"""The lock rules (knowledge/rules/lock.py) over facts a flow gathered: a lock fresh or stale, patches that do
not apply, the base's updates waiting, wheels whose file list was not read. Pure: no lock, mirror or index."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from imagebuild.knowledge.rules import (base_updates_unknown, check_base_updates, check_freshness, check_patches,
                                        check_unread)
from imagebuild.recipe.edits import Patch
from imagebuild.recipe.model import DebianBase, PythonSpec, Recipe

RECIPE = Recipe(path=Path("/recipes/small.toml"), name="small", tag="test", base=DebianBase("bookworm"),
                python=PythonSpec(("six",), ()), cuda=None)


def test_a_stale_lock_is_a_warning_naming_why_and_a_fresh_one_a_note():
    (stale,) = check_freshness(RECIPE, Path("lockfiles/small.lock"), ["the recipe changed", "x"], "ab12", "arm64: ")
    assert (stale.status, stale.rule) == ("warning", "lock-stale")
    assert stale.message == "arm64: lockfiles/small.lock is stale"
    assert stale.evidence == "the recipe changed; x" and "imagebuild lock /recipes/small.toml" in stale.fix
    (fresh,) = check_freshness(RECIPE, Path("lockfiles/small.lock"), [], "ab12")
    assert (fresh.status, fresh.rule, fresh.evidence) == ("note", "lock-fresh", "lock sha256 ab12")
    assert fresh.message == "lockfiles/small.lock is fresh for small.toml"


def test_base_updates_are_one_warning_per_suite_security_named():
    waiting = [{"suite": "bookworm-security", "package": "libc6", "locked": "1", "newest": "2"},
               {"suite": "bookworm", "package": "tzdata", "locked": "a", "newest": "b"},
               {"suite": "bookworm-security", "package": "openssl", "locked": "3", "newest": "4"}]
    found = check_base_updates(RECIPE, waiting)
    assert [(f.rule, f.key) for f in found] == [("base-updates", "base")] * 2
    assert "1 locked base package(s) (updates waiting): tzdata" in found[0].message
    assert "2 locked base package(s) (security fixes waiting): libc6, openssl" in found[1].message
    assert found[1].evidence == "libc6 1 -> 2; openssl 3 -> 4"
    assert check_base_updates(RECIPE, []) == []
    (unknown,) = base_updates_unknown("mirror down", "amd64: ")
    assert (unknown.status, unknown.rule, unknown.evidence) == ("warning", "base-updates-unknown", "mirror down")


def test_only_a_patch_that_does_not_apply_is_an_error_at_its_key():
    recipe = Recipe(path=RECIPE.path, name="small", tag="test", base=RECIPE.base, python=RECIPE.python, cuda=None,
                    patches=(Patch("six", Path("/recipes/patches/a.patch")),
                             Patch("six", Path("/recipes/patches/b.patch"))))
    results = [SimpleNamespace(applies=True, patch="/recipes/patches/a.patch", package="six", checked="1.17.0",
                               problems=[]),
               SimpleNamespace(applies=False, patch="/recipes/patches/b.patch", package="six", checked="1.17.0",
                               problems=["hunk 1 of six.py does not match"])]
    (error,) = check_patches(recipe, results)
    assert (error.status, error.rule, error.key) == ("error", "patch-does-not-apply", "patches[1].file")
    assert error.message.endswith("does not apply to six 1.17.0: hunk 1 of six.py does not match")


def test_each_unread_wheel_is_a_warning():
    found = check_unread({"torch": "timed out", "six": "404"})
    assert [(f.rule, f.evidence) for f in found] == [("wheel-unread", "404"), ("wheel-unread", "timed out")]
