"""Debian's archive formats: Release/InRelease, Packages, dpkg's status and dpkg's version order.

The Release, InRelease, Packages and status texts are excerpts of real files (bookworm, its security
suite, a bookworm rootfs's dpkg database), trimmed to a few entries; the signature is the real one, so
it no longer verifies the excerpt, which nothing here checks. Where dpkg is installed, its own
`--compare-versions` is the oracle for the version order.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.base.debian import (IndexFile, PackageEntry, compare_versions, parse_dpkg_status, parse_packages,
                                    parse_release, parse_stanzas, release_timestamp, valid_version)
from imagebuild.errors import LockError

SECURITY_INRELEASE = """\
-----BEGIN PGP SIGNED MESSAGE-----
Hash: SHA256

Origin: Debian
Label: Debian-Security
Suite: oldstable-security
Version: 12
Codename: bookworm-security
Date: Mon, 30 Nov 2026 00:22:33 UTC
Valid-Until: Mon, 07 Dec 2026 00:22:33 UTC
Acquire-By-Hash: yes
Architectures: amd64 arm64 armhf i386 ppc64el
Components: updates/main updates/contrib updates/non-free-firmware updates/non-free
Description: Debian 12 - Security Updates
SHA256:
 b0cae6e368339ca27cd01c9f142a8d01cb8a4e1a99862e713d588bb46fc1f227   862851 main/binary-all/Packages
 14d5b13d7b377ae94c3b2ef8ab467225f165ba3a51664f1d9b68e61ccbe8853b   137900 main/binary-all/Packages.xz
 a3ecebb6d51c776059095634cce1eddafc990375c7e95a5b34f96a9c1eecda09      141 main/binary-all/Release
 f9bb50b06e18c3a5e7e3fdece5d6d351ff9a39acac205ebfa7948b56bc1e91a4  2563447 main/binary-amd64/Packages
 c49617c0b30619d7403f5e66de60aeeb47c6488262e4327418830d0d6e83500a   383968 main/binary-amd64/Packages.xz
 05516a7e2e1f29b8f1686eb1e82c1d1142d1ab21c3398de3d3b3da977fcf60e6      143 main/binary-amd64/Release
-----BEGIN PGP SIGNATURE-----

iQIzBAEBCAAdFiEE7VQTEqM/ESjxCxxsVEBHYru26FMFAmsMwcoACgkQVEBHYru2
6FODhhAAkrgwyH0yX4A46U6YaQ7xLYMS7l+A13KgNoAFhMOwYSqPemxtM9u9h3Ln
OoKqaaddkl8pxjn/BG6fkRZLj5QyDyvkFbxDdoJ6MGZ4y4fL8jKkjAsJntfWWD6R
qPJk56eivBDM0m3QuofxvAskbmnkVx8tduLIOCEv2uo3gfKqiXOLiyC/05BOo8Ba
Xaa1vWOsvBdqcKew1mKG7dpF6V+esWgmvYSU/BADapeRjWp0WymOt3Hhce08qqkf
G6D2hSGHzyZcUcqVSJMgVLmoVpa/5Rm6kirusTxuxnVJ6E1dNZKiaoQSEoGFB7Nl
ZwxB92FS9pka9AGt2QJJTyIwAGhtNzuXn183+S0HhaW+g4K0wlckWry1Y64+Acm1
AsYYsCSzLQ4Ga4mxvEoh3W3mFKtcvIPEsehPKHqJ5VvFdUH/cxyHDCvbGkyYta8S
eOjwhjYJjnqILcj5SuAfWvtaGPYkQ97e5Sv7ktU1AzYH6fJdnX5WOatjZqPxINLe
s7FrUaxP90ZLTbV35ZOmqzoZnbucPGlK61MGzkVlaaJ1CM/WfkvRXJSKJJgKiGi2
eNXXxf/J8wVZ6wFZY55bNtQ2uE8oP2pouD7J1g+1jmC3wjkKLcXQ5SGqG/5zHR2U
djhmhGOuI8bjrCwWjlrCkUGBXo+WDSDXGfL8BJSbzaNX2vA4zhqJAjMEAQEIAB0W
IQSwyrkmbow5KXmLPu695tK5IW7HqAUCawzBygAKCRC95tK5IW7HqCFQD/984Me2
ZB8deINdJUnc5pNemS6TfSENhsa/pXVWRCGT5776uO3SLyg0L8vlFzTI3P7yvV5C
sopw9ieLY9qVHu83+cBb6fQ6dPG7e5fs4hvVxgk/2D1Y3ktUk32Fhq7/Jph1X9JG
OhfFB6JXSsg5yLxzfrzh2Ua995iWa/sCSOzTqYNVmcU6OFzLUPw+R+CMz5k711xS
r/Sj/Dbbg4sUhdJSHLRx3xuWLHOixd7487JNF15taOE/dp4k5UqbV78UFrpB5KNQ
zERQumQ2FbJFdnkqUCJZE58XiFxdsb03IgqrppyDfppTfAtnXpJpxLcYrxOTOju0
pqmggWtWQt4Vc9V/zE0hd1kYbyUrnyucZwyoBG2AItTLdkqLbVjh9BjewHL5T445
POSecq5CNej0NWLytjj3KodFYpAUHi2tm2akxiEac4FGCKxOt2oWhFvJ/gtiU0vp
sPyjS67uScxjvyr9R6/OCAW/0i9UFMUIuRAqIg5U+yQjmvg5G36M+byCfAWhgn0N
3CO3GxkXVF4yJT/MD/AZUa+A1TZXipUIHCPaI2yp/d7EwSdiePSJUo0/Rt9kYRQl
44+4bB8PiJXIVNziirEL89Z+hAGPV4Nb222Tyx0w8kKv5EIGUcllBEql8U/gozmd
GGbLixe5pF9XZBq/fN7KwqIBqMgzYB8UOwF9Ig==
=L0uN
-----END PGP SIGNATURE-----
"""

BOOKWORM_RELEASE = """\
Origin: Debian
Label: Debian
Suite: oldstable
Version: 12.15
Codename: bookworm
Date: Sat, 11 Jul 2026 10:16:37 UTC
Acquire-By-Hash: yes
No-Support-for-Architecture-all: Packages
Architectures: all amd64 arm64 armel armhf i386 mips64el mipsel ppc64el s390x
Components: main contrib non-free-firmware non-free
Description: Debian 12.15 Released 11 July 2026
MD5Sum:
 a7cfec9615d1396d24446947705d4c49 22526615 main/binary-all/Packages
 018fb584395d79e3dd683e1d76d04aea  5699244 main/binary-all/Packages.gz
 0f420d159a5c49a2844b23557e6e5a47  4231936 main/binary-all/Packages.xz
 7557837d9188b60b5f44ad369cd0ef11      118 main/binary-all/Release
 f230d61720e789abf5df55d6026230c6 50060337 main/binary-amd64/Packages
 a8ed68071e02b40b231febcafb3f55aa 12084798 main/binary-amd64/Packages.gz
 b838d31986207780a596ce3e8010f90f  8790396 main/binary-amd64/Packages.xz
 4bd4ed1624c0ed9e84e8fcb5a1a3e522      120 main/binary-amd64/Release
SHA256:
 bc442eb8e8251796e139748da1872c050e2d1e93f55655100357f2e68364caf5 22526615 main/binary-all/Packages
 0da67deb70b1e1258897da92f4476b5bf278400fd078516402a2cf0d48027474  5699244 main/binary-all/Packages.gz
 743228b0bd99db92c91c5c133952cea0ff0c93a2b5b47a058973f3cab40d6481  4231936 main/binary-all/Packages.xz
 06896db16fea7254996488599dba0e2e7c5b4a294ef55343812be6278ef75201      118 main/binary-all/Release
 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages
 6777ea16514725f9427f48c240d92e0a6b8496138e37a1491d8597e66774e309 12084798 main/binary-amd64/Packages.gz
 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396 main/binary-amd64/Packages.xz
 041dbfb69308fe81f3a1d8c2dd2738e8bf0772332221a16c0627c3bbea788abd      120 main/binary-amd64/Release
"""

PACKAGES = """\
Package: base-files
Version: 12.4+deb12u15
Essential: yes
Installed-Size: 341
Architecture: amd64
Replaces: base, dpkg (<= 1.15.0), miscutils
Provides: base
Pre-Depends: awk
Breaks: debian-security-support (<< 2019.04.25), initscripts (<< 2.88dsf-13.3), sendfile (<< 2.1b.20080616-5.2~)
Description: Debian base system miscellaneous files
Multi-Arch: foreign
Description-md5: 6d16337f57b84c4747f56438355b2395
Tag: admin::configuring, admin::filesystem, admin::install, admin::login,
 role::app-data, suite::debian
Section: admin
Priority: required
Filename: pool/main/b/base-files/base-files_12.4+deb12u15_amd64.deb
Size: 70936
MD5sum: 0d863c1ee183c8e006bd085d63f4874f
SHA256: 3eb1ea6d85488f488cc2a163b98ad640ef88cee4c79287cf14e361aaf6206f47

Package: tzdata
Version: 2026b-0+deb12u1
Installed-Size: 2573
Architecture: all
Provides: tzdata-bookworm
Depends: debconf (>= 0.5) | debconf-2.0
Description: time zone and daylight-saving time data
Multi-Arch: foreign
Description-md5: a77a3cc9a67658dd7cfdc6547391b8f8
Tag: role::app-data, use::timekeeping
Section: localization
Priority: required
Filename: pool/main/t/tzdata/tzdata_2026b-0+deb12u1_all.deb
Size: 304148
MD5sum: 92902e55935bd95b6176c6e5029a461a
SHA256: 0edb49f4dffe0d5608069f7e4ba4d69544d3b9e86fc314dd8b75e9958d8e5e98

Package: zlib1g
Source: zlib
Version: 1:1.2.13.dfsg-1
Installed-Size: 168
Architecture: amd64
Provides: libz1
Depends: libc6 (>= 2.14)
Conflicts: zlib1 (<= 1:1.0.4-7)
Breaks: libxml2 (<< 2.7.6.dfsg-2), texlive-binaries (<< 2009-12)
Description: compression library - runtime
Multi-Arch: same
Description-md5: 567f396aeeb2b2b63295099aed237057
Tag: role::shared-lib
Section: libs
Priority: optional
Filename: pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb
Size: 86684
MD5sum: ec42cc09e926444a817ddd913057af67
SHA256: d7dd1d1411fedf27f5e27650a6eff20ef294077b568f4c8c5e51466dc7c08ce4
"""

ZLIB_SHA256 = "d7dd1d1411fedf27f5e27650a6eff20ef294077b568f4c8c5e51466dc7c08ce4"

DPKG_STATUS = """\
Package: zlib1g
Status: install ok installed
Priority: optional
Section: libs
Installed-Size: 168
Architecture: amd64
Multi-Arch: same
Source: zlib
Version: 1:1.2.13.dfsg-1
Provides: libz1
Depends: libc6 (>= 2.14)
Breaks: libxml2 (<< 2.7.6.dfsg-2), texlive-binaries (<< 2009-12)
Conflicts: zlib1 (<= 1:1.0.4-7)
Description: compression library - runtime
 zlib is a library implementing the deflate compression method found
 in gzip and PKZIP.  This package includes the shared library.

Package: ca-certificates
Status: install ok installed
Priority: standard
Section: misc
Installed-Size: 387
Architecture: all
Multi-Arch: foreign
Version: 20230311+deb12u1
Depends: openssl (>= 1.1.1), debconf (>= 0.5) | debconf-2.0
Breaks: ca-certificates-java (<< 20121112+nmu1)
Enhances: openssl
Description: Common CA certificates
 Contains the certificate authorities shipped with Mozilla's browser to allow
 SSL-based applications to check for the authenticity of SSL connections.
 .
 Please note that Debian can neither confirm nor deny whether the
 certificate authorities whose certificates are included in this package
 have in any way been audited for trustworthiness or RFC 3647 compliance.
 Full responsibility to assess them belongs to the local system
 administrator.

Package: libpam-tmpdir
Status: deinstall ok config-files
Priority: optional
Section: admin
Installed-Size: 37
Architecture: amd64
Version: 0.09+b2
Conffiles:
 /etc/security/tmpdir.conf 4f6bbee0a49b4ef03bf77a2d3d35ea46 obsolete

Package: tzdata
Status: hold ok installed
Priority: required
Section: localization
Installed-Size: 2565
Architecture: all
Multi-Arch: foreign
Version: 2025b-0+deb12u2
Provides: tzdata-bookworm
Depends: debconf (>= 0.5) | debconf-2.0
Description: time zone and daylight-saving time data
"""


def stanza(text: str, package: str) -> str:
    """The stanza of `package` in a Packages text."""
    return next(s for s in text.split("\n\n") if s.startswith(f"Package: {package}\n")).rstrip("\n") + "\n"


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.split("\n"), 1) if needle in line)


# --- Release and InRelease -----------------------------------------------------------------------------------

def test_inrelease_is_unwrapped_and_read():
    release = parse_release(SECURITY_INRELEASE, "security/InRelease")
    assert (release.suite, release.codename) == ("oldstable-security", "bookworm-security")
    assert release.date == "Mon, 30 Nov 2026 00:22:33 UTC"
    assert release.architectures == ("amd64", "arm64", "armhf", "i386", "ppc64el")
    assert release.components[0] == "updates/main"
    assert len(release.files) == 6
    assert release.files["main/binary-amd64/Release"] == IndexFile(
        "main/binary-amd64/Release", "05516a7e2e1f29b8f1686eb1e82c1d1142d1ab21c3398de3d3b3da977fcf60e6", 143)


def test_index_prefers_xz_and_takes_the_security_suites_component_either_way():
    release = parse_release(SECURITY_INRELEASE, "security/InRelease")
    xz = IndexFile("main/binary-amd64/Packages.xz",
                   "c49617c0b30619d7403f5e66de60aeeb47c6488262e4327418830d0d6e83500a", 383968)
    assert release.index("main", "amd64") == xz
    assert release.index("updates/main", "amd64") == xz
    assert release.index("main", "all").path == "main/binary-all/Packages.xz"
    assert release.index("main", "s390x") is None
    assert release.index("contrib", "amd64") is None


def test_plain_release_takes_sha256_and_never_md5():
    release = parse_release(BOOKWORM_RELEASE, "bookworm/Release")
    assert (release.suite, release.codename) == ("oldstable", "bookworm")
    assert release_timestamp(release.date) == "20260711T101637Z"
    assert release.components == ("main", "contrib", "non-free-firmware", "non-free")
    assert len(release.files) == 8
    assert all(len(f.sha256) == 64 for f in release.files.values())
    assert release.index("main", "amd64") == IndexFile(
        "main/binary-amd64/Packages.xz", "9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5", 8790396)


def test_index_falls_back_to_gz_then_uncompressed():
    without_xz = "\n".join(line for line in BOOKWORM_RELEASE.split("\n") if not line.endswith("Packages.xz"))
    assert parse_release(without_xz, "r").index("main", "amd64").path == "main/binary-amd64/Packages.gz"
    plain_only = "\n".join(line for line in without_xz.split("\n") if not line.endswith("Packages.gz"))
    assert parse_release(plain_only, "r").index("main", "amd64").size == 50060337


def test_dash_escaped_lines_are_unescaped():
    escaped = SECURITY_INRELEASE.replace("\nLabel: Debian-Security\n", "\n- Label: Debian-Security\n")
    assert escaped != SECURITY_INRELEASE
    assert parse_release(escaped, "r") == parse_release(SECURITY_INRELEASE, "r")


def test_release_with_only_a_codename():
    text = BOOKWORM_RELEASE.replace("Suite: oldstable\n", "")
    release = parse_release(text, "r")
    assert (release.suite, release.codename) == ("", "bookworm")


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: t.replace("Date: Sat, 11 Jul 2026 10:16:37 UTC\n", ""), "[Date] missing"),
    (lambda t: t.replace("Date: Sat, 11 Jul 2026", "Date: Sat, 11 Jly 2026"), "line 6: [Date]"),
    (lambda t: t.replace("Suite: oldstable\n", "").replace("Codename: bookworm\n", ""), "[Suite] nor [Codename]"),
    (lambda t: t.split("SHA256:")[0], "no [SHA256] section"),
    (lambda t: t.replace("Version: 12.15\n", "Version: 12.15\nsuite: stable\n"), "[suite] is given twice"),
    (lambda t: t + "\nOrigin: Someone else\n", "a second paragraph"),
    (lambda t: "", "no fields"),
])
def test_release_refusals_name_the_source_and_what_is_wrong(edit, expected):
    with pytest.raises(LockError, match=r"^bookworm/Release: ") as err:
        parse_release(edit(BOOKWORM_RELEASE), "bookworm/Release")
    assert expected in str(err.value)


@pytest.mark.parametrize("bad_row", [
    " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c  8790396 main/binary-amd64/Packages.xz",
    " 9E0B5AABB2465B3D2E7A7FE27F9913846277833F7A2826E7767ACCCFF5B588C5  8790396 main/binary-amd64/Packages.xz",
    " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  879O396 main/binary-amd64/Packages.xz",
    " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396",
    " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396 ../binary-amd64/Packages.xz",
    " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396 /etc/Packages.xz",
])
def test_a_malformed_sha256_row_is_refused_with_its_line(bad_row):
    good_row = " 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396 main/binary-amd64/Packages.xz"
    text = SECURITY_INRELEASE.replace(
        " c49617c0b30619d7403f5e66de60aeeb47c6488262e4327418830d0d6e83500a   383968 main/binary-amd64/Packages.xz",
        bad_row)
    assert text != SECURITY_INRELEASE and good_row not in text
    with pytest.raises(LockError) as err:
        parse_release(text, "security/InRelease")
    assert str(err.value).startswith(f"security/InRelease: line {line_of(text, bad_row)}: [SHA256] ")
    assert repr(bad_row.strip()) in str(err.value)


def test_a_path_listed_twice_is_refused():
    row = " 041dbfb69308fe81f3a1d8c2dd2738e8bf0772332221a16c0627c3bbea788abd      120 main/binary-amd64/Release"
    with pytest.raises(LockError, match="listed twice"):
        parse_release(BOOKWORM_RELEASE + row + "\n", "r")


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: "Origin: Debian\n\n" + t, "after unsigned text"),
    (lambda t: t + "Suite: stable\n", "text after the signature"),
    (lambda t: t.replace("-----BEGIN PGP SIGNATURE-----", "-----BEGIN PGP SIGNATURE----"), "neither dash-escaped"),
    (lambda t: t.split("-----BEGIN PGP SIGNATURE-----")[0], "no signature block"),
    (lambda t: t.replace("-----END PGP SIGNATURE-----", ""), "never ends"),
    (lambda t: t.replace("Hash: SHA256\n\n", "Hash: SHA256\n"), None),  # the header swallows the body
    (lambda t: t.replace("Description: Debian 12 - Security Updates\n",
                         "Description: Debian 12 - Security Updates\n-----BEGIN PGP SIGNED MESSAGE-----\n"),
     "neither dash-escaped"),
])
def test_text_outside_the_signed_part_is_refused(edit, expected):
    with pytest.raises(LockError, match=r"^security/InRelease: line \d+: ") as err:
        parse_release(edit(SECURITY_INRELEASE), "security/InRelease")
    assert expected is None or expected in str(err.value)


@pytest.mark.parametrize(("date", "timestamp"), [
    ("Sat, 08 Nov 2026 10:13:40 UTC", "20261108T101340Z"),
    ("Sat, 08 Nov 2026 10:13:40 +0000", "20261108T101340Z"),
    ("Sat, 08 Nov 2026 10:13:40 GMT", "20261108T101340Z"),
    ("Sat, 8 Nov 2026 10:13:40 UTC", "20261108T101340Z"),
    ("Sun, 01 Jan 2023 00:30:00 +0100", "20221231T233000Z"),
    ("Fri, 31 Dec 2021 23:00:00 -0130", "20220101T003000Z"),
    ("08 Nov 2026 10:13:40 UTC", "20261108T101340Z"),
])
def test_release_timestamp(date, timestamp):
    assert release_timestamp(date) == timestamp


@pytest.mark.parametrize("date", [
    "", "yesterday", "Sat, 08 Nov 2026 10:13 UTC", "Sat, 31 Feb 2026 10:13:40 UTC", "Sat, 08 Nov 2026 25:13:40 UTC",
    "Sat, 08 Nov 2026 10:13:40 CEST", "Sat, 08 Nov 2026 10:13:40 +2500", "Sat, 08 Nov 2026 10:13:40 +0060",
    "2026-11-08T10:13:40Z", "Sat, 08 Nov ٢٠٢٦ 10:13:40 UTC", "Fri, 31 Dec 9999 23:59:59 -0100",
])
def test_release_timestamp_refuses_an_unreadable_date(date):
    with pytest.raises(LockError, match="is not a Release date") as err:
        release_timestamp(date)
    assert repr(date) in str(err.value)


# --- deb822 paragraphs -----------------------------------------------------------------------------------------

def test_stanzas_join_continuations_and_keep_names_as_written():
    stanzas = parse_stanzas(DPKG_STATUS)
    assert [s["Package"] for s in stanzas] == ["zlib1g", "ca-certificates", "libpam-tmpdir", "tzdata"]
    description = stanzas[1]["Description"].split("\n")
    assert description[0] == "Common CA certificates"
    assert description[1].startswith("Contains the certificate authorities")
    assert description[3] == ""  # " ." is an empty line
    assert stanzas[2]["Conffiles"] == "\n/etc/security/tmpdir.conf 4f6bbee0a49b4ef03bf77a2d3d35ea46 obsolete"
    assert "Installed-Size" in stanzas[0] and "installed-size" not in stanzas[0]


def test_stanzas_skip_comments_stray_lines_and_split_on_whitespace_lines():
    text = "# a comment\nPackage: a\n#Version: 9\nno colon here\nVersion: 1\n \t\nPackage: b\nVersion: 2\r\n\n\n"
    assert parse_stanzas(text) == [{"Package": "a", "Version": "1"}, {"Package": "b", "Version": "2"}]
    assert parse_stanzas("") == [] and parse_stanzas("\n\n# only a comment\n") == []
    assert parse_stanzas(" continuation first\nA: 1\n") == [{"A": "1"}]


# --- Packages -----------------------------------------------------------------------------------------------

def test_packages_entries():
    entries = parse_packages(PACKAGES, "main/binary-amd64/Packages")
    assert [e.name for e in entries] == ["base-files", "tzdata", "zlib1g"]
    assert entries[0].essential and entries[0].priority == "required"
    assert entries[1].arch == "all" and not entries[1].essential
    assert entries[2] == PackageEntry(name="zlib1g", version="1:1.2.13.dfsg-1", arch="amd64",
                                      filename="pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb",
                                      sha256=ZLIB_SHA256, size=86684, essential=False, priority="optional")


def test_a_tampered_sha256_is_refused_naming_the_package_and_field():
    text = PACKAGES.replace(ZLIB_SHA256, ZLIB_SHA256[:-1])
    with pytest.raises(LockError) as err:
        parse_packages(text, "main/binary-amd64/Packages")
    message = str(err.value)
    assert message.startswith(f"main/binary-amd64/Packages: line {line_of(text, 'SHA256: d7dd')}: ")
    assert "'zlib1g'" in message and "[SHA256]" in message and repr(ZLIB_SHA256[:-1]) in message


@pytest.mark.parametrize("filename", ["../x.deb", "pool/main/../../../etc/x.deb", "/pool/main/z/zlib/x.deb",
                                      "pool/main/z/zlib/zlib 1g.deb"])
def test_a_filename_outside_the_pool_is_refused(filename):
    text = stanza(PACKAGES, "zlib1g").replace("pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb", filename)
    with pytest.raises(LockError, match=r"package 'zlib1g': \[Filename\]") as err:
        parse_packages(text, "Packages")
    assert repr(filename) in str(err.value)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda s: s.replace("Size: 86684\n", ""), "Size"),
    (lambda s: s.replace("Size: 86684", "Size: 86_684"), "Size"),
    (lambda s: s.replace("Size: 86684", "Size: -86684"), "Size"),
    (lambda s: s.replace("Size: 86684", "Size: ８６６８４"), "Size"),
    (lambda s: s.replace(f"SHA256: {ZLIB_SHA256}\n", ""), "SHA256"),
    (lambda s: s.replace(ZLIB_SHA256, ZLIB_SHA256.upper()), "SHA256"),
    (lambda s: s + f"SHA256: {'0' * 64}\n", "SHA256"),
    (lambda s: s.replace("Version: 1:1.2.13.dfsg-1", "Version: 1:1.2.13.dfsg-"), "Version"),
    (lambda s: s.replace("Version: 1:1.2.13.dfsg-1", "Version:"), "Version"),
    (lambda s: s.replace("Architecture: amd64", "Architecture: amd64;rm"), "Architecture"),
    (lambda s: s.replace("Filename: pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb\n", ""), "Filename"),
])
def test_a_damaged_stanza_is_refused_naming_the_package_and_field(edit, field):
    with pytest.raises(LockError, match=rf"^Packages: line \d+: package 'zlib1g': \[{field}\] "):
        parse_packages(edit(stanza(PACKAGES, "zlib1g")), "Packages")


def test_a_stanza_without_a_name_is_refused():
    with pytest.raises(LockError, match=r"^Packages: line 1: a stanza without a Package name: \[Package\] missing"):
        parse_packages(stanza(PACKAGES, "zlib1g").replace("Package: zlib1g\n", ""), "Packages")
    with pytest.raises(LockError, match=r"\[Package\] 'Zlib1g' is not a Debian package name"):
        parse_packages(stanza(PACKAGES, "zlib1g").replace("Package: zlib1g", "Package: Zlib1g"), "Packages")


# --- dpkg's status --------------------------------------------------------------------------------------------

def test_dpkg_status_lists_installed_packages_sorted():
    assert parse_dpkg_status(DPKG_STATUS) == {"ca-certificates": ("20230311+deb12u1", "all"),
                                              "tzdata": ("2025b-0+deb12u2", "all"),
                                              "zlib1g": ("1:1.2.13.dfsg-1", "amd64")}
    assert list(parse_dpkg_status(DPKG_STATUS)) == ["ca-certificates", "tzdata", "zlib1g"]


def test_dpkg_status_qualifies_a_package_installed_for_two_architectures():
    i386 = stanza(DPKG_STATUS, "zlib1g").replace("Architecture: amd64", "Architecture: i386")
    installed = parse_dpkg_status(DPKG_STATUS + "\n" + i386)
    assert installed["zlib1g:amd64"] == ("1:1.2.13.dfsg-1", "amd64")
    assert installed["zlib1g:i386"] == ("1:1.2.13.dfsg-1", "i386")
    assert "zlib1g" not in installed


def test_dpkg_status_refuses_an_installed_package_without_a_version():
    with pytest.raises(LockError, match=r"^rootfs/var/lib/dpkg/status: line 1: .*\[Version\]"):
        parse_dpkg_status(DPKG_STATUS.replace("Version: 1:1.2.13.dfsg-1\n", ""), "rootfs/var/lib/dpkg/status")


# --- versions -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("a", "b", "expected"), [
    ("1.0~rc1", "1.0", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0~", "1.0", -1),
    ("1.0", "1.0+b1", -1),
    ("1.0", "1.0a", -1),
    ("1.0a", "1.0+", -1),  # letters before non-letters
    ("a", "+", -1),
    ("1:1.2.13.dfsg-1", "1:1.2.13.dfsg-1+deb12u1", -1),
    ("2.36-9+deb12u14", "2.36-9+deb12u9", 1),
    ("2.36-9+deb12u9", "2.36-9+deb12u10", -1),
    ("1.0", "1.0-0", 0),  # no revision reads as "", which equals "0"
    ("1.0", "1.00", 0),
    ("1.01", "1.1", 0),
    ("0:1.0", "1.0", 0),
    ("1:0.1", "9.9", 1),  # the epoch dominates
    ("1:0.1", "2:0.0", -1),
    ("10", "9", 1),
    ("1.2.3", "1.2.3", 0),
    ("7.88.1-10+deb12u14", "7.88.1-10+deb12u5", 1),
    ("20230311+deb12u1", "20230311", 1),
    ("0~20171227-0.3+deb12u1", "0.0", -1),
    ("1.0-1", "1.0.1", -1),
    ("2:1.2.3-1", "1:9.9.9-9", 1),
    ("1.2-3-4", "1.2-3-3", 1),  # the revision is after the last hyphen
])
def test_compare_versions_known_cases(a, b, expected):
    assert compare_versions(a, b) == expected
    assert compare_versions(b, a) == -expected


@pytest.mark.parametrize("version", ["", "   ", "1:", ":1", "a:1", "-1:1", "1.0-", "1:-1", "1 0", "99999999999:1"])
def test_compare_versions_refuses_what_dpkg_refuses(version):
    with pytest.raises(LockError, match="cannot be compared") as err:
        compare_versions(version, "1.0")
    assert repr(version) in str(err.value)


@pytest.mark.parametrize(("version", "valid"), [
    ("1.0", True), ("1:1.2.13.dfsg-1", True), ("2.36-9+deb12u14", True), ("0~20171227-0.3+deb12u1", True),
    ("1.2-3-4", True), ("1:2:3", True), ("2147483647:1", True), ("1.0~rc1+b2", True), ("0", True),
    ("", False), ("a1.0", False), ("1.0_1", False), ("1.0-1:2", False), ("1.0-", False), ("1:", False),
    (":1", False), ("x:1", False), ("+1:0", False), ("2147483648:1", False), ("1.0 ", False), (" 1.0", False),
    ("1.0-1_2", False), ("1.0-1~a+b", True), ("1.é", False), ("１.0", False),
])
def test_valid_version(version, valid):
    assert valid_version(version) is valid


def versions(alphabet: str = "0129ab.+~") -> st.SearchStrategy[str]:
    """Valid dpkg versions from a small alphabet, so that equal and near-equal versions are common."""
    part = st.text(alphabet, max_size=5)
    epoch = st.sampled_from(["", "0:", "1:", "2:", "10:"])
    upstream = st.tuples(st.sampled_from("0129"), part, st.sampled_from(["", ":"]), part).map("".join)
    revision = st.sampled_from(["", "-"]).flatmap(lambda dash: st.just("") if not dash else
                                                  st.text(alphabet, min_size=1, max_size=5).map(lambda r: "-" + r))
    inner_hyphen = st.sampled_from(["", "-1"])

    def build(e, u, h, r):
        if not e:
            u = u.replace(":", "")
        return e + u + (h if r else "") + r
    return st.builds(build, epoch, upstream, inner_hyphen, revision)


@given(versions())
def test_generated_versions_are_valid(v):
    assert valid_version(v)


@given(versions(), versions())
def test_compare_is_antisymmetric(a, b):
    assert compare_versions(a, b) == -compare_versions(b, a)
    assert compare_versions(a, a) == 0


@given(versions(), versions(), versions())
def test_compare_is_transitive(a, b, c):
    for x, y, z in itertools.permutations((a, b, c)):
        if compare_versions(x, y) <= 0 and compare_versions(y, z) <= 0:
            assert compare_versions(x, z) <= 0


def dpkg_order(a: str, b: str) -> int | str:
    """dpkg's own verdict on a and b: -1, 0, 1, or "refused"."""
    for op, verdict in (("lt", -1), ("eq", 0)):
        done = subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True)
        if b"error" in done.stderr:
            return "refused"
        if done.returncode == 0:
            return verdict
    return 1


def our_order(a: str, b: str) -> int | str:
    try:
        return compare_versions(a, b)
    except LockError:
        return "refused"


@pytest.mark.needs_tool("dpkg", package="dpkg")
@settings(max_examples=60, deadline=None)
@given(st.one_of(versions(), st.text("0123ab~+.-:_", min_size=1, max_size=7)),
       st.one_of(versions(), st.text("0123ab~+.-:_", min_size=1, max_size=7)))
def test_compare_versions_agrees_with_dpkg(a, b):
    a, b = ("1" + v if v.startswith("-") else v for v in (a, b))  # dpkg would read a leading "-" as an option
    assert our_order(a, b) == dpkg_order(a, b)


# --- whatever the text, only LockError ----------------------------------------------------------------------

DEB822_LINES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", " .", "#", "Package: x", "SHA256:", "Date: Sat, 08 Nov 2026 10:13:40 UTC",
                     "Suite: stable", "Status: install ok installed", "Version: 1.0", "Architecture: all",
                     "Filename: pool/x.deb", "Size: 1", f"SHA256: {'a' * 64}", f" {'a' * 64} 1 main/x",
                     "-----BEGIN PGP SIGNED MESSAGE-----", "Hash: SHA256", "-----BEGIN PGP SIGNATURE-----",
                     "-----END PGP SIGNATURE-----", "- Codename: x", "-"]),
)
ARCHIVE_TEXTS = st.one_of(st.text(), st.lists(DEB822_LINES, max_size=25).map("\n".join))


@settings(max_examples=300)
@given(ARCHIVE_TEXTS)
def test_parsers_raise_only_lock_error(text):
    assert all(isinstance(s, dict) for s in parse_stanzas(text))
    for parse in (lambda t: parse_release(t, "fuzz"), lambda t: parse_packages(t, "fuzz"), parse_dpkg_status,
                  release_timestamp):
        try:
            parse(text)
        except LockError:
            pass


@given(st.text(), st.text())
def test_versions_raise_only_lock_error(a, b):
    assert isinstance(valid_version(a), bool)
    try:
        assert compare_versions(a, b) in (-1, 0, 1)
    except LockError:
        pass
