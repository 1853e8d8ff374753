"""A relock keeps the old lock's versions wherever the recipe still allows them (as uv and pip-compile
keep an output file's pins), `--upgrade` resolves afresh, and `--upgrade-package NAME` moves that one
package only. Real resolves: uv against the real index, with small packages and a fixed exclude_newer."""

from __future__ import annotations

import tomllib
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from imagebuild import flows
from imagebuild.bootstrap import inputs_sha256
from imagebuild.flows.lock import version_moves
from imagebuild.lock import default_lock_path, read_lock, resolve_lock, write_lock
from imagebuild.lock.resolve import preferences_pylock
from imagebuild.recipe.model import load_recipe
from imagebuild.render import template_sha256
from tests.fake_base import debian_identity

RECIPE = """\
[image]
name = "imagebuild-test/relock"

[base]
debian = "bookworm"

[python]
requirements = [{requirements}]
exclude_newer = "2025-06-01"
"""
# Released well before exclude_newer, with newer releases before it too (idna 3.7-3.10, certifi 2024-2025).
OLD = {"idna": "3.6", "certifi": "2023.11.17"}


def locked_old(write_recipe, requirements: str):
    """The recipe written with OLD's pins and locked (its base taken as locked for what it asks, so only
    the Python side resolves), then rewritten with `requirements`. Returns the recipe's path."""
    pinned = ", ".join(f'"{name}=={version}"' for name, version in OLD.items())
    path = write_recipe(RECIPE.format(requirements=pinned), name="relock")
    recipe = load_recipe(path)
    base = replace(debian_identity({"libc6": "2.36-9+deb12u14", "python3": "3.11.2-1+b1"}),
                   inputs_sha256=inputs_sha256(recipe.base))
    write_lock(resolve_lock(recipe, base, template_sha256=template_sha256()), default_lock_path(recipe))
    path.write_text(RECIPE.format(requirements=requirements))
    return path


def test_a_relock_keeps_the_locked_versions_and_upgrade_moves_them_to_a_fresh_resolves(write_recipe, tmp_path):
    path = locked_old(write_recipe, '"idna", "certifi"')
    lock_path = default_lock_path(load_recipe(path))

    kept = flows.lock(path)
    assert kept.changed  # the recipe's checksum moved
    assert {name: read_lock(lock_path).packages[name] for name in OLD} == OLD
    assert kept.package_moves == []

    # The control: the same recipe with no lock to keep resolves to newer releases, so keeping was a choice.
    fresh = tmp_path / "fresh.lock"
    flows.lock(path, lock_path=fresh)
    newest = {name: read_lock(fresh).packages[name] for name in OLD}
    assert all(newest[name] != OLD[name] for name in OLD), newest

    upgraded = flows.lock(path, upgrade=True)
    assert {name: read_lock(lock_path).packages[name] for name in OLD} == newest
    assert upgraded.package_moves == [{"name": name, "old": OLD[name], "new": newest[name]} for name in sorted(OLD)]
    assert upgraded.to_dict()["package_moves"] == upgraded.package_moves


def test_upgrade_package_without_a_version_moves_that_package_and_keeps_the_rest(write_recipe):
    path = locked_old(write_recipe, '"idna", "certifi"')
    report, diff, moved = flows.upgrade_packages(path, [("idna", None)])
    packages = read_lock(default_lock_path(load_recipe(path))).packages
    assert packages["certifi"] == OLD["certifi"]  # kept, though newer ones resolve
    assert packages["idna"] != OLD["idna"]
    assert moved == [{"name": "idna", "old": OLD["idna"], "new": packages["idna"]}]
    assert f'"idna=={packages["idna"]}"' in path.read_text()
    assert report.package_moves == [{"name": "idna", "old": OLD["idna"], "new": packages["idna"]}]


def test_version_moves_lists_each_package_that_moved_came_or_went():
    assert version_moves({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "1"}) == [
        {"name": "b", "old": "2", "new": "3"}, {"name": "c", "old": None, "new": "1"}]
    assert version_moves({"a": "1"}, {}) == [{"name": "a", "old": "1", "new": None}]
    assert version_moves({"a": "1"}, {"a": "1"}) == []


def test_a_relock_keeps_a_version_the_recipe_now_pins_otherwise_moving_only_that_pin(write_recipe):
    path = locked_old(write_recipe, '"idna==3.7", "certifi"')
    report = flows.lock(path)
    packages = read_lock(default_lock_path(load_recipe(path))).packages
    assert packages["idna"] == "3.7" and packages["certifi"] == OLD["certifi"]
    assert report.package_moves == [{"name": "idna", "old": "3.6", "new": "3.7"}]


names = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?", fullmatch=True)
versions = st.text(min_size=1, max_size=30)


@given(st.dictionaries(names, versions, max_size=8))
def test_the_preferences_file_reads_back_as_the_same_pins(prefer):
    data = tomllib.loads(preferences_pylock(prefer))
    assert {entry["name"]: entry["version"] for entry in data.get("packages", [])} == prefer
