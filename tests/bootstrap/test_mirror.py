"""Every file fetched from an archive is checked against what vouches for it: the Release's signature
(the real Debian keyring, on the real InRelease of the host's mirror), the Release's sha256 for an
index, the lock's sha256 for a .deb; a server error names the URL."""

from __future__ import annotations

import http.server
import lzma
import threading

import pytest
import requests

from imagebuild.base.identity import LockedDeb
from imagebuild.bootstrap.mirror import DEBIAN_KEYRING, Archives
from imagebuild.bootstrap.sources import suite_uris
from imagebuild.common import sha256_file
from imagebuild.errors import BaseFetchFailed
from imagebuild.recipe.model import DebianBase


def _file_archive(root, suite: str, packages: bytes) -> str:
    dists = root / "dists" / suite
    index = dists / "main" / "binary-amd64" / "Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(lzma.compress(packages))
    (dists / "Release").write_text(f"Suite: {suite}\nDate: Sat, 11 Jul 2026 10:16:37 UTC\nSHA256:\n"
                                   f" {sha256_file(index)} {index.stat().st_size} main/binary-amd64/Packages.xz\n")
    return f"file://{root}"


STANZA = (b"Package: zlib1g\nVersion: 1:1.2.13.dfsg-1\nArchitecture: amd64\n"
          b"Filename: pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb\nSize: 3\nSHA256: " + b"a" * 64 + b"\n")


@pytest.mark.needs_tool(str(DEBIAN_KEYRING), "gpgv", package="debian-archive-keyring gpgv")
def test_the_real_inrelease_verifies_and_one_changed_byte_is_refused(tmp_path):
    real = Archives(suite_uris(DebianBase(suite="bookworm")), cache=tmp_path / "cache")
    release = real.release("bookworm")
    assert release.date and release.index("main", "amd64") is not None
    signed = requests.get(f"{real.uris['bookworm']}/dists/bookworm/InRelease", timeout=60).content
    assert b"BEGIN PGP SIGNATURE" in signed
    forged = signed.replace(b"Date: ", b"Date:  ", 1)
    (tmp_path / "dists" / "bookworm").mkdir(parents=True)
    (tmp_path / "dists" / "bookworm" / "InRelease").write_bytes(forged)
    with pytest.raises(BaseFetchFailed, match="signature does not verify"):
        Archives({"bookworm": f"file://{tmp_path}"}, cache=tmp_path / "cache").release("bookworm")


def test_an_index_whose_bytes_differ_from_the_release_is_refused_naming_the_url(tmp_path):
    uri = _file_archive(tmp_path / "archive", "bookworm", STANZA)
    archives = Archives({"bookworm": uri}, keyring=None, cache=tmp_path / "cache")
    release = archives.release("bookworm")
    _, entries = archives.packages("bookworm", release, "main", "amd64")
    assert [(e.name, e.version) for e in entries] == [("zlib1g", "1:1.2.13.dfsg-1")]
    index = tmp_path / "archive/dists/bookworm/main/binary-amd64/Packages.xz"
    index.write_bytes(lzma.compress(STANZA.replace(b"1.2.13", b"1.2.14")))
    fresh = Archives({"bookworm": uri}, keyring=None, cache=tmp_path / "other-cache")
    with pytest.raises(BaseFetchFailed, match=r"Packages.xz served .* refused"):
        fresh.packages("bookworm", release, "main", "amd64")


class _Failing(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_server_error_names_the_url_and_the_status(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/debian"
    try:
        with pytest.raises(BaseFetchFailed, match=rf"{url}/dists/bookworm/InRelease: HTTP 503"):
            Archives({"bookworm": url}, keyring=None, cache=tmp_path).release("bookworm")
        deb = LockedDeb("zlib1g", "1:1.2.13.dfsg-1", "amd64", "pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb",
                        "a" * 64, 3, "bookworm")
        with pytest.raises(BaseFetchFailed, match=rf"package zlib1g 1:1.2.13.dfsg-1 .*{url}/pool/.*HTTP 503"):
            Archives({"bookworm": url}, keyring=None, cache=tmp_path).fetch_debs((deb,), ())
    finally:
        server.shutdown()
        server.server_close()


def test_a_deb_is_looked_for_on_its_suites_mirror_then_the_snapshot_at_the_locked_date():
    deb = LockedDeb("zlib1g", "1:1.2.13.dfsg-1+deb12u1", "amd64",
                    "pool/updates/main/z/zlib/zlib1g_1.2.13.dfsg-1+deb12u1_amd64.deb", "a" * 64, 3,
                    "bookworm-security")
    archives = Archives({"bookworm-security": "http://m.invalid/debian-security"}, "http://snap.invalid/archive",
                        keyring=None)
    assert archives.deb_urls(deb, "Mon, 30 Nov 2026 00:22:33 UTC") == [
        f"http://m.invalid/debian-security/{deb.filename}",
        f"http://snap.invalid/archive/debian-security/20261130T002233Z/{deb.filename}"]


@pytest.mark.needs_tool("gpg", "gpgv", package="gnupg gpgv")
def test_an_archive_signed_by_its_own_key_verifies_with_the_recipes_keyring_and_not_with_debians(tmp_path):
    """A mirror of one's own, signed with a key of its own (made here with gpg): [base].keyring trusts it;
    Debian's keyring does not, and the Release is refused."""
    import subprocess
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run(gpg + ["--quick-gen-key", "imagebuild-test-archive", "ed25519", "sign", "never"],
                   check=True, capture_output=True)
    keyring = tmp_path / "archive.gpg"
    keyring.write_bytes(subprocess.run(gpg + ["--export", "imagebuild-test-archive"], check=True,
                                       capture_output=True).stdout)
    root = tmp_path / "archive"
    _file_archive(root, "bookworm", STANZA)
    release = root / "dists" / "bookworm" / "Release"
    subprocess.run(gpg + ["--clearsign", "--output", str(release.with_name("InRelease")), str(release)],
                   check=True, capture_output=True)
    release.unlink()  # only the signed file is served
    ours = Archives({"bookworm": f"file://{root}"}, keyring=keyring, cache=tmp_path / "cache")
    assert ours.release("bookworm").suite == "bookworm"
    if DEBIAN_KEYRING.is_file():
        debians = Archives({"bookworm": f"file://{root}"}, cache=tmp_path / "cache")
        with pytest.raises(BaseFetchFailed, match="signature does not verify"):
            debians.release("bookworm")
