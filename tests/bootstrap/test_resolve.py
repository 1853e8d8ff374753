"""Which .debs a base is: apt's own plan over the fetched indices, read from its output."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.base.debian import IndexFile, Release, parse_packages
from imagebuild.base.identity import LockedDeb
from imagebuild.bootstrap import resolved_debs
from imagebuild.bootstrap.resolve import (planned_installs, read_resolution, resolution_key, resolve_debs,
                                          write_resolution)
from imagebuild.errors import LockError
from imagebuild.recipe.model import DebianBase
from tests.bootstrap.test_mirror import STANZA

# apt-get -s install's plan as apt 2.6 prints it (bookworm), an upgrade line among them
PLAN = """NOTE: This is only a simulation!
Inst gcc-12-base (12.2.0-14+deb12u1 Debian:12.12/stable [amd64])
Inst libc6 (2.36-9+deb12u14 Debian:12.12/stable [amd64]) []
Inst zlib1g [1:1.2.13.dfsg-1] (1:1.2.13.dfsg-1+deb12u1 Debian-Security:12/stable-security [amd64])
Inst tzdata:all (2026f-0+deb12u1 localhost [all])
Conf libc6 (2.36-9+deb12u14 Debian:12.12/stable [amd64])
"""


def test_the_plan_names_each_install_once_with_version_and_architecture():
    assert planned_installs(PLAN) == [("gcc-12-base", "12.2.0-14+deb12u1", "amd64"),
                                      ("libc6", "2.36-9+deb12u14", "amd64"),
                                      ("zlib1g", "1:1.2.13.dfsg-1+deb12u1", "amd64"),
                                      ("tzdata", "2026f-0+deb12u1", "all")]


@given(st.text(max_size=300))
def test_any_output_reads_as_a_plan_or_nothing(text):
    for name, version, arch in planned_installs(text):
        assert name and version and arch


def test_apt_resolves_over_the_given_indices_only():
    """The real apt-get, in its private configuration, over an index of two packages: minbase (here apt,
    Priority: required) and what is asked, with apt's own dependency resolution, or it says why not."""
    apt = ("Package: apt\nVersion: 2.6.1\nArchitecture: amd64\nPriority: required\nDepends: zlib1g\n"
           "Filename: pool/main/a/apt/apt_2.6.1_amd64.deb\nSize: 3\nSHA256: " + "b" * 64 + "\n")
    text = STANZA.decode() + "Priority: optional\n\n" + apt
    entries = parse_packages(text, "test")
    debs = resolve_debs([("bookworm", text, entries)], ["zlib1g"], "amd64")
    assert [(d.name, d.version, d.suite) for d in debs] == [("apt", "2.6.1", "bookworm"),
                                                              ("zlib1g", "1:1.2.13.dfsg-1", "bookworm")]
    try:
        resolve_debs([("bookworm", text, entries)], ["python3"], "amd64")
    except Exception as err:  # the negative control: what the indices lack cannot be planned
        assert "python3" in str(err) and type(err).__name__ == "LockError"
    else:
        raise AssertionError("apt planned a package no index has")


# ---------------------------------------------------------------- apt's answer kept by what decides it

APT_STANZA = ("Package: apt\nVersion: 2.6.1\nArchitecture: amd64\nPriority: required\nDepends: zlib1g\n"
              "Filename: pool/main/a/apt/apt_2.6.1_amd64.deb\nSize: 3\nSHA256: " + "b" * 64 + "\n")


class TwoPackageArchive:
    """Archives' surface for resolved_debs over one suite whose index is `text`; it counts the index reads, and
    its Release vouches for the index by the text's own sha256, as a real Release does."""

    def __init__(self, cache: Path, text: str):
        self.cache, self.text, self.reads = cache, text, 0

    def release(self, suite: str) -> Release:
        sha = hashlib.sha256(self.text.encode()).hexdigest()
        return Release(suite, suite, "Sat, 05 Dec 2026 10:00:00 UTC", ("main",), ("amd64",),
                       {"main/binary-amd64/Packages": IndexFile("main/binary-amd64/Packages", sha, len(self.text))})

    def packages(self, suite: str, release: Release, component: str, arch: str):
        self.reads += 1
        return self.text, parse_packages(self.text, "test")


def test_a_second_resolve_of_the_same_indices_reads_apts_answer_and_a_moved_index_resolves_again(tmp_path):
    """The real apt-get over a two-package suite: the first resolve reads the index and runs apt; the second
    (another process would do the same: the answer is a file) reads neither and gives the same .debs. The
    negative control: the same suite with one version moved (a new index sha256, as its Release says) is
    resolved again, and apt's new answer is taken, not the kept one."""
    base = DebianBase(suite="bookworm", suites=("bookworm",), components=("main",))
    text = STANZA.decode() + "Priority: optional\n\n" + APT_STANZA
    archive = TwoPackageArchive(tmp_path, text)
    suites, first = resolved_debs(base, archive, ["zlib1g"])
    assert archive.reads == 1 and [(d.name, d.version) for d in first] == [("apt", "2.6.1"), ("zlib1g", "1:1.2.13.dfsg-1")]
    assert [s.name for s in suites] == ["bookworm"] and suites[0].date.startswith("Sat, 05 Dec 2026")
    assert len(list((tmp_path / "debian-resolved").glob("*.json"))) == 1
    again = TwoPackageArchive(tmp_path, text)
    assert resolved_debs(base, again, ["zlib1g"])[1] == first and again.reads == 0
    moved = TwoPackageArchive(tmp_path, text.replace("Version: 2.6.1", "Version: 2.6.2").replace("apt_2.6.1", "apt_2.6.2"))
    _, debs = resolved_debs(base, moved, ["zlib1g"])
    assert moved.reads == 1 and ("apt", "2.6.2") in [(d.name, d.version) for d in debs]
    asked_more = TwoPackageArchive(tmp_path, text)  # another package asked: another question for apt
    with pytest.raises(LockError, match="python3"):
        resolved_debs(base, asked_more, ["python3"])
    assert asked_more.reads == 1


def test_the_key_moves_with_each_thing_that_decides_apts_answer():
    inputs, indices, asked, apt = {"suite": "bookworm"}, [["bookworm", "main", "a" * 64]], ["g++"], "apt 2.6.1 (amd64)"
    key = resolution_key(inputs, indices, asked, apt)
    assert key == resolution_key(dict(inputs), [list(i) for i in indices], list(reversed(asked)), apt)
    others = [resolution_key({"suite": "trixie"}, indices, asked, apt),
              resolution_key(inputs, [["bookworm", "main", "b" * 64]], asked, apt),
              resolution_key(inputs, indices + [["bookworm-security", "main", "a" * 64]], asked, apt),
              resolution_key(inputs, indices, ["g++", "curl"], apt),
              resolution_key(inputs, indices, asked, "apt 3.0.0 (amd64)")]
    assert len({key, *others}) == 6


def test_a_kept_answer_reads_back_as_written(tmp_path):
    debs = (LockedDeb("zlib1g", "1:1.2.13.dfsg-1", "amd64", "pool/main/z/zlib/z.deb", "a" * 64, 3, "bookworm"),)
    write_resolution(tmp_path / "k.json", debs)
    assert read_resolution(tmp_path / "k.json") == debs
    assert read_resolution(tmp_path / "missing.json") is None


@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                              max_leaves=20).map(lambda value: json.dumps(value).encode()),
                 st.builds(lambda size, name: json.dumps({"format": 1, "debs": [
                     {"name": name, "version": "1", "arch": "amd64", "filename": "f", "sha256": "a" * 64,
                      "size": size, "suite": "s"}]}).encode(), st.one_of(st.integers(), st.booleans(), st.text(max_size=3)),
                           st.one_of(st.text(max_size=5), st.integers()))))
def test_any_kept_file_is_an_answer_or_a_miss_never_a_traceback(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "k.json"
        path.write_bytes(data)
        found = read_resolution(path)
    assert found is None or all(type(d.size) is int and type(d.name) is str for d in found)
