"""A Debian archive of the test's own, served on loopback: the real .debs of a small bookworm base
(resolved from the host's mirror and fetched once into imagebuild's content-addressed cache), laid
out as Debian lays its archives (debian/ and debian-security/, dists/ and pool/), with Packages
indices written from the .debs themselves and each suite's InRelease signed with a key of the
archive's own (made here with gpg; a recipe trusts it through [base] keyring, the archive's `keyring`). A test publishes a newer version of a package
(the real .deb repacked with a higher version), removes or corrupts a pool file, and watches the
lock and the bootstrap react.
"""

from __future__ import annotations

import functools
import http.server
import lzma
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from pathlib import Path

from imagebuild.base.identity import LockedDeb
from imagebuild.bootstrap import REQUIRED_PACKAGES, suites_now
from imagebuild.bootstrap.mirror import Archives
from imagebuild.bootstrap.resolve import resolve_debs
from imagebuild.bootstrap.rootfs import control_fields
from imagebuild.bootstrap.sources import suite_uris
from imagebuild.common import sha256_file
from imagebuild.recipe.model import DebianBase

SUITES = ("bookworm", "bookworm-updates", "bookworm-security")


def archive_of(suite: str) -> str:
    return "debian-security" if suite.endswith("-security") else "debian"


def real_base_debs(packages: tuple[str, ...] = ()) -> tuple[dict[str, Path], tuple[LockedDeb, ...]]:
    """The .debs of a minbase bookworm with python3 and ca-certificates (and `packages`), as the host's
    mirror serves them today: (name -> local file, the entries)."""
    base = DebianBase(suite="bookworm", packages=packages)
    where = Archives(suite_uris(base))
    _, indices = suites_now(base, where)
    debs = resolve_debs(indices, sorted(set(REQUIRED_PACKAGES) | set(packages)), "amd64")
    files = where.fetch_debs(debs, ())
    return files, debs


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@dataclass(frozen=True)
class SigningKey:
    """An OpenPGP key of a test's own (gpg, ed25519) and its public keyring, as gpgv --keyring takes it."""
    home: Path
    keyring: Path

    def gpg(self) -> list[str]:
        return ["gpg", "--homedir", str(self.home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]

    def clearsign(self, release: Path) -> Path:
        """InRelease beside release: its text, clearsigned, as Debian's archives serve it."""
        signed = release.with_name("InRelease")
        signed.unlink(missing_ok=True)
        subprocess.run(self.gpg() + ["--clearsign", "--output", str(signed), str(release)], check=True,
                       capture_output=True)
        return signed

    def close(self) -> None:
        """Stop the gpg-agent gpg started for this home (it would outlive the test)."""
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "all"], check=False, capture_output=True)


def signing_key(folder: Path, name: str = "imagebuild-test-archive") -> SigningKey:
    from tests.conftest import missing_tool
    missing_tool("gpg", "gpgv", package="gpg gpgv")
    home = folder / "gnupg"
    home.mkdir(mode=0o700, parents=True)
    key = SigningKey(home, folder / "archive-keyring.gpg")
    subprocess.run(key.gpg() + ["--quick-gen-key", name, "ed25519", "sign", "never"], check=True, capture_output=True)
    key.keyring.write_bytes(subprocess.run(key.gpg() + ["--export", name], check=True, capture_output=True).stdout)
    return key


@dataclass
class LoopbackArchive:
    root: Path
    url: str = ""
    key: SigningKey | None = None  # made on the first publish
    listed: dict[str, dict[str, str]] = field(default_factory=dict)  # suite -> pool path -> Packages stanza
    dates: dict[str, datetime] = field(default_factory=dict)
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> "LoopbackArchive":
        handler = functools.partial(_Quiet, directory=str(self.root))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.key is not None:
            self.key.close()

    def mirror(self, suite: str = "bookworm") -> str:
        return f"{self.url}/{archive_of(suite)}"

    def add(self, suite: str, deb: Path, filename: str) -> None:
        """Put a .deb in the suite's pool at `filename` and list it in the suite's index."""
        target = self.root / archive_of(suite) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(deb, target)
        stanza = (f"{control_fields(target)}\nFilename: {filename}\nSize: {target.stat().st_size}\n"
                  f"SHA256: {sha256_file(target)}\n")
        self.listed.setdefault(suite, {})[filename] = stanza

    @property
    def keyring(self) -> Path:
        assert self.key is not None, "publish first"
        return self.key.keyring

    def publish(self, when: datetime | None = None) -> None:
        """Write every suite's Packages.xz, Release and signed InRelease (dated `when`, or a day after the last)."""
        if self.key is None:
            self.key = signing_key(self.root.parent / f"{self.root.name}-signing")  # not served
        for suite in SUITES:
            last = self.dates.get(suite)
            self.dates[suite] = when or (last + timedelta(days=1) if last else datetime(2026, 11, 1, tzinfo=timezone.utc))
            dists = self.root / archive_of(suite) / "dists" / suite
            index = dists / "main" / "binary-amd64" / "Packages.xz"
            index.parent.mkdir(parents=True, exist_ok=True)
            index.write_bytes(lzma.compress("\n".join(self.listed.get(suite, {}).values()).encode()))
            (dists / "Release").write_text(
                f"Origin: Debian\nSuite: {suite}\nCodename: {suite}\n"
                f"Date: {format_datetime(self.dates[suite], usegmt=True)}\nArchitectures: amd64\n"
                f"Components: main\nSHA256:\n {sha256_file(index)} {index.stat().st_size} "
                "main/binary-amd64/Packages.xz\n")
            self.key.clearsign(dists / "Release")

    def pool_file(self, suite: str, filename: str) -> Path:
        return self.root / archive_of(suite) / filename


def seeded(root: Path, files: dict[str, Path], debs: tuple[LockedDeb, ...]) -> LoopbackArchive:
    archive = LoopbackArchive(root)
    for deb in debs:
        archive.add(deb.suite, files[deb.name], deb.filename)
    archive.publish()
    return archive.start()


def repacked(deb: Path, version: str, out: Path) -> Path:
    """The real .deb with its control's Version raised: what a newer upload of the package looks like."""
    work = out.parent / f"{out.name}.d"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(work)], check=True)
    control = work / "DEBIAN" / "control"
    lines = [f"Version: {version}" if line.startswith("Version:") else line
             for line in control.read_text().splitlines()]
    control.write_text("\n".join(lines) + "\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-b", str(work), str(out)], check=True,
                   capture_output=True)
    shutil.rmtree(work)
    return out


def release_stamp(date: str) -> str:
    from imagebuild.base.debian import release_timestamp
    return release_timestamp(date)
