"""A Debian mirror that moves, for real: an archive of the test's own on loopback, holding the real
.debs of a small bookworm base. Publishing a newer version of a package leaves the lock's rootfs bit
for bit the same (the lock names its .debs); `lock --upgrade-base` moves to it and names it; `check`
warns that the suite has it; a .deb no source has any more, or served with other bytes, stops the
build before anything is tagged, naming the package or the URL. No host apt sources are read (the
recipe names the mirror, and one bootstrap runs with APT_CONFIG pointing at an empty sources list).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from imagebuild import flows
from imagebuild.bootstrap import locked_rootfs
from imagebuild.common import sha256_file
from imagebuild.errors import BaseFetchFailed
from imagebuild.lock import read_lock
from imagebuild.recipe import load_recipe
from tests import debian_archive

pytestmark = pytest.mark.engine

BUMPED = "zlib1g"  # the package that moved on 2026-12-01 (../shared/FACTS.md)

RECIPE = """\
[image]
name = "imagebuild-test/mirror-moves"
tag = "1"

[base]
debian = "bookworm"
mirror = "{url}/debian"
security_mirror = "{url}/debian-security"
keyring = "{keyring}"
{extra}
[python]
requirements = ["six==1.16.0"]
exclude_newer = "2026-11-20T00:00:00Z"
"""


@pytest.fixture(scope="module")
def real_debs():
    return debian_archive.real_base_debs()


@pytest.fixture(scope="module")
def archive(real_debs, tmp_path_factory):
    files, debs = real_debs
    served = debian_archive.seeded(tmp_path_factory.mktemp("archive"), files, debs)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def locked(archive, tmp_path_factory):
    """The recipe locked against the archive as first published, with an imagebuild cache of its own."""
    root = tmp_path_factory.mktemp("project")
    (root / "recipes").mkdir()
    recipe = root / "recipes" / "moves.toml"
    recipe.write_text(RECIPE.format(url=archive.url, keyring=archive.keyring, extra=""))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMAGEBUILD_CACHE", str(tmp_path_factory.mktemp("cache")))
        report = flows.lock(recipe)
    lock_text = Path(report.lock_path).read_text()
    return recipe, Path(report.lock_path), lock_text


def _fresh_cache(monkeypatch, tmp_path) -> Path:
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(cache))
    return cache


def _publish_newer(archive, real_debs, tmp_path) -> str:
    files, debs = real_debs
    deb = next(d for d in debs if d.name == BUMPED)
    newer = f"{deb.version}+imagebuild1"
    out = debian_archive.repacked(files[BUMPED], newer, tmp_path / f"{BUMPED}-newer.deb")
    archive.add("bookworm-security", out, f"pool/updates/main/z/zlib/{BUMPED}_{newer.split(':')[-1]}_amd64.deb")
    archive.publish()
    return newer


def test_the_lock_pins_every_deb_of_the_base_with_its_sources(locked, real_debs):
    _, lock_path, _ = locked
    base = read_lock(lock_path).base
    _, debs = real_debs
    assert {(d.name, d.version, d.sha256) for d in base.debs} == {(d.name, d.version, d.sha256) for d in debs}
    assert len(base.debs) > 50 and {"libc6", "python3", "ca-certificates", BUMPED} <= set(base.packages)
    assert [s.name for s in base.suites] == list(debian_archive.SUITES)
    assert all(s.date.endswith("GMT") for s in base.suites)
    assert base.rootfs_sha256 and base.inputs_sha256


def test_a_mirror_that_moved_on_rebuilds_the_locked_rootfs_bit_for_bit(locked, archive, real_debs, tmp_path,
                                                                       monkeypatch):
    recipe, lock_path, lock_text = locked
    newer = _publish_newer(archive, real_debs, tmp_path)
    _fresh_cache(monkeypatch, tmp_path)
    empty_sources = tmp_path / "apt.conf"
    empty_sources.write_text(f'Dir::Etc::SourceList "{tmp_path / "none.list"}";\n'
                             f'Dir::Etc::SourceParts "{tmp_path / "none.d"}";\n')
    monkeypatch.setenv("APT_CONFIG", str(empty_sources))  # another host's apt configuration
    base = read_lock(lock_path).base
    tar = locked_rootfs(base, load_recipe(recipe).base)
    assert sha256_file(tar) == base.rootfs_sha256
    assert lock_path.read_text() == lock_text

    # a plain relock keeps the locked base as it is, as uv keeps pins
    report = flows.lock(recipe)
    assert not report.changed and report.base_moves == []

    # check sees the security fix waiting, naming the package and its suite
    waiting = [f for f in flows.check(recipe).findings if f.rule == "base-updates"]
    assert len(waiting) == 1 and "bookworm-security" in waiting[0].message
    assert BUMPED in waiting[0].message and newer in waiting[0].evidence
    assert [f.rule for f in flows.check(recipe).findings if f.rule.startswith("lock-")] == ["lock-fresh"]


def test_upgrade_base_moves_to_the_new_version_and_names_it(locked, archive, real_debs, tmp_path, monkeypatch):
    recipe, lock_path, lock_text = locked
    newer = debian_archive_newer(archive)
    _fresh_cache(monkeypatch, tmp_path)
    before = read_lock(lock_path)
    try:
        report = flows.lock(recipe, upgrade_base=True)
        after = read_lock(lock_path)
        assert report.changed
        assert report.base_moves == [{"package": BUMPED, "old": before.base.packages[BUMPED], "new": newer,
                                      "suite": "bookworm-security"}]
        assert after.wheels == before.wheels  # every Python pin kept
        assert after.base.rootfs_sha256 != before.base.rootfs_sha256
        assert sha256_file(locked_rootfs(after.base, load_recipe(recipe).base)) == after.base.rootfs_sha256
        assert not [f for f in flows.check(recipe).findings if f.rule == "base-updates"]
    finally:
        lock_path.write_text(lock_text)


def debian_archive_newer(archive) -> str:
    """The version _publish_newer put in the security suite (the tests above run first)."""
    names = [path for path in archive.listed.get("bookworm-security", {}) if "+imagebuild1" in path]
    if not names:
        pytest.fail("the newer version was not published: run the module as a whole")
    stanza = archive.listed["bookworm-security"][names[0]]
    return next(line.split(": ", 1)[1] for line in stanza.splitlines() if line.startswith("Version: "))


def test_a_deb_no_source_has_stops_the_build_naming_it_and_tags_nothing(locked, archive, engine, tmp_path,
                                                                      monkeypatch):
    recipe, lock_path, _ = locked
    base = read_lock(lock_path).base
    gone = next(d for d in base.debs if d.name == BUMPED)
    pool = archive.pool_file(gone.suite, gone.filename)
    kept = pool.read_bytes()
    pool.unlink()
    _fresh_cache(monkeypatch, tmp_path)
    tag = f"imagebuild-test/mirror-moves:gone-{os.getpid()}"
    try:
        with pytest.raises(BaseFetchFailed) as failed:
            flows.build(recipe, engine, flows.BuildOptions(tag=tag, rebuild=True))
        message = str(failed.value)
        assert f"{BUMPED} {gone.version}" in message and "--upgrade-base" in message and "snapshot" in message
        assert engine.inspect(tag) is None

        # a snapshot mirror that still has it, at the locked Release date, lets the same lock rebuild
        date = next(s.date for s in base.suites if s.name == gone.suite)
        snapshot = archive.root / "snapshot"
        stamp = debian_archive.release_stamp(date)
        (snapshot / "debian-security" / stamp / gone.filename).parent.mkdir(parents=True)
        (snapshot / "debian-security" / stamp / gone.filename).write_bytes(kept)
        text = recipe.read_text()
        recipe.write_text(text.replace("[python]", f'snapshot = "{archive.url}/snapshot"\n\n[python]'))
        assert "lock-fresh" in [f.rule for f in flows.check(recipe).findings]  # where to fetch is not what
        assert sha256_file(locked_rootfs(base, load_recipe(recipe).base)) == base.rootfs_sha256
        recipe.write_text(text)
    finally:
        pool.write_bytes(kept)


def test_a_mirror_serving_other_bytes_is_refused_naming_the_url(locked, archive, tmp_path, monkeypatch):
    recipe, lock_path, _ = locked
    base = read_lock(lock_path).base
    victim = next(d for d in base.debs if d.name == "libbz2-1.0")
    pool = archive.pool_file(victim.suite, victim.filename)
    kept = pool.read_bytes()
    pool.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    _fresh_cache(monkeypatch, tmp_path)
    try:
        with pytest.raises(BaseFetchFailed) as failed:
            locked_rootfs(base, load_recipe(recipe).base)
        assert f"{archive.url}/{debian_archive.archive_of(victim.suite)}/{victim.filename}" in str(failed.value)
        assert victim.sha256 in str(failed.value) and "refused" in str(failed.value)
        assert f"package {victim.name} {victim.version}" in str(failed.value)
    finally:
        pool.write_bytes(kept)


def test_an_edited_hash_is_refused_before_any_build_naming_the_package(locked, tmp_path, monkeypatch):
    recipe, lock_path, _ = locked
    base = read_lock(lock_path).base
    edited = replace(base, debs=tuple(replace(d, sha256="0" * 64) if d.name == BUMPED else d for d in base.debs))
    _fresh_cache(monkeypatch, tmp_path)
    with pytest.raises(BaseFetchFailed, match=rf"package {BUMPED} .* not the \d+ bytes with sha256 0{{64}}"):
        locked_rootfs(edited, load_recipe(recipe).base)


def test_an_edited_version_is_refused_naming_the_package(locked):
    import json

    from imagebuild.errors import LockError
    from imagebuild.lock import parse_lock
    _, lock_path, lock_text = locked
    data = json.loads(lock_text)
    entry = next(d for d in data["base"]["debs"] if d["name"] == BUMPED)
    entry["version"] = entry["version"] + "+evil1"
    with pytest.raises(LockError, match=rf"package {BUMPED} .*pool file"):
        parse_lock(json.dumps(data), "edited.lock")
