"""Which .debs a base is: apt's own plan over the fetched indices, read from its output."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from imagebuild.base.debian import parse_packages
from imagebuild.bootstrap.resolve import planned_installs, resolve_debs
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
