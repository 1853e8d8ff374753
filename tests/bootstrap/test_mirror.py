"""Every file fetched from an archive is checked against what vouches for it: the Release's signature
(the real Debian keyring, on the real InRelease files of the host's mirror; an archive's own key through
[base] keyring), the Release's sha256 for an index, the lock's sha256 for a .deb; a server error names
the URL. Signatures are required: no InRelease, no gpgv or no keyring is one clear error, never an
unsigned Release."""

from __future__ import annotations

import http.server
import lzma
import threading

import pytest
import requests

from imagebuild.base.identity import LockedDeb
from imagebuild.bootstrap import mirror
from imagebuild.bootstrap.mirror import DEBIAN_KEYRING, Archives
from imagebuild.bootstrap.sources import suite_uris
from imagebuild.common import sha256_file
from imagebuild.errors import BaseFetchFailed, ToolMissing
from imagebuild.recipe.model import DebianBase
from tests.debian_archive import signing_key


def _file_archive(root, suite: str, packages: bytes, key=None) -> str:
    """An archive of one suite; signed with key (an InRelease beside the Release) when given."""
    dists = root / "dists" / suite
    index = dists / "main" / "binary-amd64" / "Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(lzma.compress(packages))
    (dists / "Release").write_text(f"Suite: {suite}\nDate: Sat, 11 Jul 2026 10:16:37 UTC\nSHA256:\n"
                                   f" {sha256_file(index)} {index.stat().st_size} main/binary-amd64/Packages.xz\n")
    if key is not None:
        key.clearsign(dists / "Release")
    return f"file://{root}"


@pytest.fixture
def key(tmp_path):
    made = signing_key(tmp_path / "key")
    yield made
    made.close()


STANZA = (b"Package: zlib1g\nVersion: 1:1.2.13.dfsg-1\nArchitecture: amd64\n"
          b"Filename: pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb\nSize: 3\nSHA256: " + b"a" * 64 + b"\n")


@pytest.mark.needs_tool(str(DEBIAN_KEYRING), "gpgv", package="debian-archive-keyring gpgv")
@pytest.mark.parametrize("suite", ["bookworm", "bookworm-updates", "bookworm-security"])
def test_the_real_inrelease_verifies_and_one_changed_byte_is_refused(tmp_path, suite):
    """Debian's own InRelease files (the security archive's signed by its own key), as the host's mirror
    serves them today; the same bytes with one byte changed are the negative control."""
    real = Archives(suite_uris(DebianBase(suite="bookworm")), cache=tmp_path / "cache")
    release = real.release(suite)
    assert release.codename == suite and release.date and release.index("main", "amd64") is not None
    signed = requests.get(f"{real.uris[suite]}/dists/{suite}/InRelease", timeout=60).content
    assert b"BEGIN PGP SIGNATURE" in signed
    forged = signed.replace(b"Date: ", b"Date:  ", 1)
    (tmp_path / "dists" / suite).mkdir(parents=True)
    (tmp_path / "dists" / suite / "InRelease").write_bytes(forged)
    with pytest.raises(BaseFetchFailed, match="signature does not verify"):
        Archives({suite: f"file://{tmp_path}"}, cache=tmp_path / "cache").release(suite)
    # Text outside the signed part is never read: only what gpgv says the signature covers.
    (tmp_path / "dists" / suite / "InRelease").write_bytes(b"Suite: forged\n\n" + signed + b"\nSuite: forged\n")
    outside = Archives({suite: f"file://{tmp_path}"}, cache=tmp_path / "cache")
    try:
        assert outside.release(suite) == release
    except BaseFetchFailed as refused:
        assert "signature does not verify" in str(refused)


def test_an_archive_serving_only_an_unsigned_release_is_refused(tmp_path, key):
    uri = _file_archive(tmp_path / "archive", "bookworm", STANZA)  # Release, no InRelease
    with pytest.raises(BaseFetchFailed, match=r"InRelease is not served: .*an unsigned Release is not taken"):
        Archives({"bookworm": uri}, keyring=key.keyring, cache=tmp_path / "cache").release("bookworm")


def test_without_gpgv_nothing_is_locked_and_the_error_names_the_package(tmp_path, key, monkeypatch):
    uri = _file_archive(tmp_path / "archive", "bookworm", STANZA, key)
    signed = Archives({"bookworm": uri}, keyring=key.keyring, cache=tmp_path / "cache")
    assert signed.release("bookworm").suite == "bookworm"  # the control: with gpgv it verifies
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ToolMissing, match=r"gpgv is not installed.*apt-get install -y gpgv"):
        signed.release("bookworm")


def test_without_the_keyring_nothing_is_locked_and_the_error_names_the_package(tmp_path, key, monkeypatch):
    uri = _file_archive(tmp_path / "archive", "bookworm", STANZA, key)
    gone = tmp_path / "no-such-keyring.gpg"
    monkeypatch.setattr(mirror, "DEBIAN_KEYRING", gone)  # as on a host without debian-archive-keyring
    with pytest.raises(ToolMissing, match=r"keyring .*no-such-keyring.gpg is missing.*apt-get install -y "
                                          r"debian-archive-keyring"):
        Archives({"bookworm": uri}, keyring=gone, cache=tmp_path / "cache").release("bookworm")
    with pytest.raises(ToolMissing, match=r"recipe's \[base\] keyring"):
        Archives({"bookworm": uri}, keyring=tmp_path / "ours.gpg", cache=tmp_path / "cache").release("bookworm")


def test_an_index_whose_bytes_differ_from_the_release_is_refused_naming_the_url(tmp_path, key):
    uri = _file_archive(tmp_path / "archive", "bookworm", STANZA, key)
    archives = Archives({"bookworm": uri}, keyring=key.keyring, cache=tmp_path / "cache")
    release = archives.release("bookworm")
    _, entries = archives.packages("bookworm", release, "main", "amd64")
    assert [(e.name, e.version) for e in entries] == [("zlib1g", "1:1.2.13.dfsg-1")]
    index = tmp_path / "archive/dists/bookworm/main/binary-amd64/Packages.xz"
    index.write_bytes(lzma.compress(STANZA.replace(b"1.2.13", b"1.2.14")))
    fresh = Archives({"bookworm": uri}, keyring=key.keyring, cache=tmp_path / "other-cache")
    with pytest.raises(BaseFetchFailed, match=r"Packages.xz served .* refused"):
        fresh.packages("bookworm", release, "main", "amd64")


class _Failing(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.needs_tool("gpgv", package="gpgv")
def test_a_server_error_names_the_url_and_the_status(tmp_path):
    keyring = tmp_path / "keyring.gpg"  # never read: the InRelease is not served
    keyring.write_bytes(b"")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/debian"
    try:
        with pytest.raises(BaseFetchFailed, match=rf"{url}/dists/bookworm/InRelease: HTTP 503"):
            Archives({"bookworm": url}, keyring=keyring, cache=tmp_path).release("bookworm")
        deb = LockedDeb("zlib1g", "1:1.2.13.dfsg-1", "amd64", "pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb",
                        "a" * 64, 3, "bookworm")
        with pytest.raises(BaseFetchFailed, match=rf"package zlib1g 1:1.2.13.dfsg-1 .*{url}/pool/.*HTTP 503"):
            Archives({"bookworm": url}, keyring=keyring, cache=tmp_path).fetch_debs((deb,), ())
    finally:
        server.shutdown()
        server.server_close()


def test_a_deb_is_looked_for_on_its_suites_mirror_then_the_snapshot_at_the_locked_date():
    deb = LockedDeb("zlib1g", "1:1.2.13.dfsg-1+deb12u1", "amd64",
                    "pool/updates/main/z/zlib/zlib1g_1.2.13.dfsg-1+deb12u1_amd64.deb", "a" * 64, 3,
                    "bookworm-security")
    archives = Archives({"bookworm-security": "http://m.invalid/debian-security"}, "http://snap.invalid/archive")
    assert archives.deb_urls(deb, "Mon, 30 Nov 2026 00:22:33 UTC") == [
        f"http://m.invalid/debian-security/{deb.filename}",
        f"http://snap.invalid/archive/debian-security/20261130T002233Z/{deb.filename}"]


def test_an_archive_signed_by_its_own_key_verifies_with_the_recipes_keyring_and_not_with_debians(tmp_path, key):
    """A mirror of one's own, signed with a key of its own (made here with gpg): [base].keyring trusts it;
    Debian's keyring does not, and the Release is refused."""
    root = tmp_path / "archive"
    _file_archive(root, "bookworm", STANZA, key)
    (root / "dists" / "bookworm" / "Release").unlink()  # only the signed file is served
    ours = Archives({"bookworm": f"file://{root}"}, keyring=key.keyring, cache=tmp_path / "cache")
    assert ours.release("bookworm").suite == "bookworm"
    if DEBIAN_KEYRING.is_file():
        debians = Archives({"bookworm": f"file://{root}"}, cache=tmp_path / "cache")
        with pytest.raises(BaseFetchFailed, match="signature does not verify"):
            debians.release("bookworm")
