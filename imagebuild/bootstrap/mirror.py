"""Fetching from Debian archives, every file checked against the sha256 that vouches for it.

A suite's Release, read only from its signed InRelease as gpgv verified it, vouches for its Packages
indices; the indices (at lock time) and then the lock vouch for each .deb. A .deb is taken from imagebuild's cache, then the suite's mirror, then the
recipe's snapshot mirror at the locked Release date; different bytes from any source are refused,
naming the URL, and never fall through to the next.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from imagebuild.base.debian import PackageEntry, Release, parse_packages, parse_release, release_timestamp
from imagebuild.base.identity import LockedDeb, LockedSuite
from imagebuild.common import Progress, cache_dir, quiet
from imagebuild.errors import BaseFetchFailed, ToolMissing

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_DECOMPRESS = {".xz": lzma.decompress, ".gz": gzip.decompress, ".bz2": bz2.decompress, "": lambda data: data}
_TIMEOUT = (15, 120)


class Missing(Exception):
    """A source answered that it has no such file (404/410, or no file at a file:// path)."""


class Archives:
    """The suites of one base, each at its archive root, plus an optional snapshot service."""

    def __init__(self, uris: dict[str, str], snapshot: str | None = None, *,
                 keyring: Path = DEBIAN_KEYRING, cache: Path | None = None):
        self.uris = uris
        self.snapshot = snapshot
        self.keyring = Path(keyring)  # checked when a Release is read: building from a lock needs none
        self.cache = cache or cache_dir()
        self._session = requests.Session()

    # ------------------------------------------------------------ indices (lock time)

    def release(self, suite: str) -> Release:
        """The suite's Release, read only from its signed InRelease as gpgv verified it against the
        keyring: no unsigned Release is taken, and a missing gpgv or keyring stops here."""
        gpgv = self._gpgv()
        root = self.uris[suite]
        url = f"{root}/dists/{suite}/InRelease"
        try:
            data = self._get(url)
        except Missing:
            raise BaseFetchFailed(f"{url} is not served: imagebuild locks a base only from a suite's signed "
                                  f"InRelease (an unsigned Release is not taken); is {root} the archive root of "
                                  f"suite {suite!r}?") from None
        return parse_release(self._verified(gpgv, data, url), url)

    def packages(self, suite: str, release: Release, component: str, arch: str) -> tuple[str, list[PackageEntry]]:
        """The suite's Packages index for component/arch (its text and its entries), checked against
        the Release's sha256."""
        index = release.index(component, arch)
        if index is None:
            raise BaseFetchFailed(f"{self.uris[suite]}/dists/{suite}/Release lists no Packages index for "
                                  f"{component}/binary-{arch}")
        cached = self.cache / "debian-indices" / index.sha256
        if not cached.is_file():
            url = f"{self.uris[suite]}/dists/{suite}/{index.path}"
            self._download(url, cached, index.sha256, index.size, vouched=f"{suite}'s Release file")
        suffix = Path(index.path).suffix if Path(index.path).suffix in _DECOMPRESS else ""
        try:
            text = _DECOMPRESS[suffix](cached.read_bytes()).decode("utf-8", "replace")
        except (OSError, EOFError, lzma.LZMAError, ValueError) as err:
            raise BaseFetchFailed(f"{index.path} of {suite} does not decompress: {err}") from None
        return text, parse_packages(text, f"{self.uris[suite]}/dists/{suite}/{index.path}")

    def _gpgv(self) -> str:
        """gpgv and the keyring it checks with, or one error naming what to install."""
        gpgv = shutil.which("gpgv")
        if gpgv is None:
            raise ToolMissing("gpgv is not installed: a suite's InRelease signature is checked with it before "
                              "anything is locked (apt-get install -y gpgv)")
        if not self.keyring.is_file():
            install = ("apt-get install -y debian-archive-keyring" if self.keyring == DEBIAN_KEYRING
                       else "or point the recipe's [base] keyring at the archive's keyring file")
            raise ToolMissing(f"the keyring {self.keyring} is missing: a suite's InRelease signature is checked "
                              f"with it before anything is locked ({install})")
        return gpgv

    def _verified(self, gpgv: str, data: bytes, url: str) -> str:
        """The text the signature covers, as gpgv writes it out: bytes around the signed part are dropped."""
        with tempfile.TemporaryDirectory(prefix="imagebuild-inrelease-") as folder:
            signed = Path(folder) / "InRelease"
            signed.write_bytes(data)
            proc = subprocess.run([gpgv, "--keyring", str(self.keyring), "--output", "-", str(signed)],
                                  capture_output=True)
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        if proc.returncode != 0 or not proc.stdout:
            raise BaseFetchFailed(f"{url}: its signature does not verify against {self.keyring}; nothing is "
                                  f"locked from it:\n" + stderr[-1000:])
        return proc.stdout.decode("utf-8", "replace")

    # ------------------------------------------------------------ .debs (build time)

    def deb_path(self, deb: LockedDeb) -> Path:
        return self.cache / "debs" / f"{deb.sha256}.deb"

    def fetch_debs(self, debs: tuple[LockedDeb, ...], suites: tuple[LockedSuite, ...],
                   progress: Progress = quiet) -> dict[str, Path]:
        """name -> local file of every locked .deb, each checked against its sha256 and size."""
        missing = [deb for deb in debs if not self.deb_path(deb).is_file()]
        if missing:
            progress(f"fetching {len(missing)} of {len(debs)} locked .debs "
                     f"({sum(d.size for d in missing) / 1e6:.0f} MB)")
            dates = {suite.name: suite.date for suite in suites}
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda deb: self._fetch_deb(deb, dates.get(deb.suite)), missing))
        return {deb.name: self.deb_path(deb) for deb in debs}

    def deb_urls(self, deb: LockedDeb, date: str | None) -> list[str]:
        """Where a locked .deb may be: its suite's mirror, then the snapshot at the locked date."""
        urls = [f"{self.uris[deb.suite]}/{deb.filename}"] if deb.suite in self.uris else []
        if self.snapshot and date:
            archive = "debian-security" if deb.suite.endswith("-security") else "debian"
            urls.append(f"{self.snapshot}/{archive}/{release_timestamp(date)}/{deb.filename}")
        return urls

    def _fetch_deb(self, deb: LockedDeb, date: str | None) -> None:
        urls = self.deb_urls(deb, date)
        for url in urls:
            try:
                self._download(url, self.deb_path(deb), deb.sha256, deb.size)
                return
            except Missing:
                continue
            except BaseFetchFailed as err:
                raise BaseFetchFailed(f"the locked Debian package {deb.name} {deb.version} ({deb.arch}): {err}") from None
        tried = ", ".join(urls) or "no source (the lock's suite is not among the recipe's)"
        raise BaseFetchFailed(
            f"the locked Debian package {deb.name} {deb.version} ({deb.arch}) is on no source any more; "
            f"tried {tried}. Move the base on with `imagebuild lock RECIPE --upgrade-base` (then rebuild), "
            "or set [base].snapshot to a snapshot mirror that still has it", )

    # ------------------------------------------------------------ transport

    def _get(self, url: str) -> bytes:
        if url.startswith("file:"):
            path = Path(unquote(urlsplit(url).path))
            if not path.is_file():
                raise Missing(url)
            return path.read_bytes()
        try:
            reply = self._session.get(url, timeout=_TIMEOUT)
        except requests.RequestException as err:
            raise BaseFetchFailed(f"{url}: {err}") from None
        if reply.status_code in (404, 410):
            raise Missing(url)
        if reply.status_code != 200:
            raise BaseFetchFailed(f"{url}: HTTP {reply.status_code}")
        return reply.content

    def _download(self, url: str, target: Path, sha256: str, size: int, vouched: str = "the lock") -> None:
        """Stream url into target (temp file + rename) when its bytes have this sha256 and size."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
        digest, written = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out:
                for block in self._chunks(url):
                    digest.update(block)
                    written += len(block)
                    out.write(block)
            if digest.hexdigest() != sha256 or written != size:
                raise BaseFetchFailed(f"{url} served {written} bytes with sha256 {digest.hexdigest()}, "
                                      f"not the {size} bytes with sha256 {sha256} that {vouched} names: refused. "
                                      "The mirror or something between is not serving Debian's file")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _chunks(self, url: str):
        if url.startswith("file:"):
            yield self._get(url)
            return
        try:
            with self._session.get(url, timeout=_TIMEOUT, stream=True) as reply:
                if reply.status_code in (404, 410):
                    raise Missing(url)
                if reply.status_code != 200:
                    raise BaseFetchFailed(f"{url}: HTTP {reply.status_code}")
                yield from reply.iter_content(1 << 20)
        except requests.RequestException as err:
            raise BaseFetchFailed(f"{url}: {err}") from None
