"""Real releases from PyPI for the tests that read a package's source: each file sha256-checked against the
index and kept in imagebuild's cache, so reruns read it offline."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from imagebuild.common import cache_dir


def published_file(project: str, version: str) -> Path:
    """`project` `version`'s wheel (else its sdist) from PyPI's simple index, sha256-checked, cached."""
    request = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        files = json.loads(urllib.request.urlopen(request, timeout=60).read())["files"]
    except OSError as error:
        pytest.fail(f"PyPI's simple index cannot be read: {error}")
    stem = re.sub(r"[-_.]+", "_", project)
    named = [f for f in files if f["filename"].startswith(f"{stem}-{version}-") and f["filename"].endswith(".whl")
             and ("-py3-none-any" in f["filename"] or "cp311-cp311-manylinux" in f["filename"] and "x86_64" in f["filename"])] \
        or [f for f in files if f["filename"] == f"{stem}-{version}.tar.gz"]
    assert named, f"PyPI lists no file of {project} {version}"
    chosen = named[0]
    target = cache_dir() / "test-releases" / chosen["filename"]
    if not target.exists() or hashlib.sha256(target.read_bytes()).hexdigest() != chosen["hashes"]["sha256"]:
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(chosen["url"], timeout=600) as answer, open(f"{target}.part", "wb") as out:
            shutil.copyfileobj(answer, out)
        Path(f"{target}.part").replace(target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == chosen["hashes"]["sha256"]
    return target


def unpack_python(archive: Path, folder: Path, package: str = "flashinfer") -> Path:
    """The archive's PACKAGE/**.py under folder; returns the package folder."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            for name in wheel.namelist():
                if name.startswith(f"{package}/") and name.endswith(".py"):
                    wheel.extract(name, folder)
        return folder / package
    with tarfile.open(archive) as sdist:
        members = [m for m in sdist.getmembers() if m.isfile() and m.name.endswith(".py")
                   and m.name.split("/")[1:2] == [package]]
        sdist.extractall(folder, members=members, filter="data")
    return folder / members[0].name.split("/")[0] / package
