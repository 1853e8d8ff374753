"""Where each suite is served: the recipe's mirror first, else the host's apt sources (one-line and
deb822 files), else one error naming the suite and the key to set. No host name of a real mirror is
written here: the examples use a made-up one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from imagebuild.bootstrap.sources import AptSource, host_sources, parse_deb822, parse_one_line, suite_uris
from imagebuild.errors import LockError
from imagebuild.recipe.model import DebianBase

MIRROR = "http://mirror.invalid/debian"
SECURITY = "http://mirror.invalid/debian-security"

DEB822 = f"""\
Types: deb
# a comment
URIs: {MIRROR}/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: {SECURITY}
Suites: bookworm-security
Components: main contrib

Types: deb
URIs: http://other.invalid/apt
Suites: nodistro
Components: main
Enabled: no
"""


def test_deb822_paragraphs_give_one_source_per_uri_and_suite():
    assert parse_deb822(DEB822) == [AptSource(MIRROR, "bookworm", ("main",)),
                                    AptSource(MIRROR, "bookworm-updates", ("main",)),
                                    AptSource(SECURITY, "bookworm-security", ("main", "contrib"))]


def test_one_line_sources_with_options_and_comments():
    text = f"# deb {MIRROR} sid main\ndeb [arch=amd64 signed-by=/k.gpg] {MIRROR} bookworm main non-free\n" \
           f"deb-src {MIRROR} bookworm main\ndeb {SECURITY} bookworm-security main # security\n"
    assert parse_one_line(text) == [AptSource(MIRROR, "bookworm", ("main", "non-free")),
                                    AptSource(SECURITY, "bookworm-security", ("main",))]


def test_the_host_configuration_is_read_in_apts_order(tmp_path):
    (tmp_path / "sources.list").write_text(f"deb {MIRROR}-first bookworm main\n")
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(DEB822)
    (parts / "ignored.txt").write_text(f"deb {MIRROR}-ignored bookworm main\n")
    found = host_sources((tmp_path / "sources.list", parts))
    assert [s.uri for s in found if s.suite == "bookworm"] == [f"{MIRROR}-first", MIRROR]
    base = DebianBase(suite="bookworm")
    assert suite_uris(base, (tmp_path / "sources.list", parts)) == {
        "bookworm": f"{MIRROR}-first", "bookworm-updates": MIRROR, "bookworm-security": SECURITY}


def test_the_recipes_mirrors_win_over_the_host(tmp_path):
    (tmp_path / "a.sources").write_text(DEB822)
    base = DebianBase(suite="bookworm", mirror="http://recipe.invalid/debian",
                      security_mirror="http://recipe.invalid/security")
    assert suite_uris(base, (tmp_path / "a.sources",)) == {
        "bookworm": "http://recipe.invalid/debian", "bookworm-updates": "http://recipe.invalid/debian",
        "bookworm-security": "http://recipe.invalid/security"}


def test_a_suite_nobody_serves_is_one_error_naming_it_and_the_key(tmp_path):
    (tmp_path / "a.sources").write_text(DEB822.replace("bookworm-security", "trixie-security"))
    with pytest.raises(LockError) as failed:
        suite_uris(DebianBase(suite="bookworm"), (tmp_path / "a.sources",))
    assert "'bookworm-security'" in str(failed.value) and "[base].security_mirror" in str(failed.value)
    # a component the host's source lacks is not served either
    (tmp_path / "a.sources").write_text(DEB822)
    with pytest.raises(LockError, match=r"no mirror for Debian suite 'bookworm'.*\[base\].mirror"):
        suite_uris(DebianBase(suite="bookworm", components=("main", "non-free-firmware")), (tmp_path / "a.sources",))


def test_no_host_configuration_at_all_asks_for_a_mirror(tmp_path):
    with pytest.raises(LockError, match=r"\[base\].mirror"):
        suite_uris(DebianBase(suite="bookworm"), (tmp_path / "absent.list", tmp_path / "absent.d"))


@given(st.text(max_size=400))
def test_any_text_parses_to_sources_or_nothing(text):
    for source in parse_one_line(text) + parse_deb822(text):
        assert isinstance(source, AptSource) and source.uri and source.suite
