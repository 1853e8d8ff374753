"""Where each suite of a Debian base is served: the recipe's mirror, else the host's apt sources.

The address only says where to fetch; what is fetched is decided by the lock (every file is checked
against its sha256), so a lock rebuilds the same rootfs from any mirror that still has its files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import LockError
from imagebuild.recipe.model import DebianBase

HOST_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


@dataclass(frozen=True)
class AptSource:
    uri: str  # the archive root: holds dists/ and pool/
    suite: str
    components: tuple[str, ...]


def parse_one_line(text: str) -> list[AptSource]:
    """`deb [options] URI SUITE COMPONENT...` lines (sources.list)."""
    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        line = re.sub(r"\[[^\]]*\]", " ", line, count=1)  # [arch=… signed-by=…]
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "deb":
            found.append(AptSource(fields[1].rstrip("/"), fields[2], tuple(fields[3:])))
    return found


def parse_deb822(text: str) -> list[AptSource]:
    """`Types: deb` / `URIs:` / `Suites:` / `Components:` paragraphs (*.sources)."""
    found = []
    for paragraph in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        components = tuple(fields.get("components", "").split())
        found += [AptSource(uri.rstrip("/"), suite, components)
                  for uri in fields.get("uris", "").split() for suite in fields.get("suites", "").split()]
    return found


def host_sources(places: tuple[Path, ...] = HOST_SOURCES) -> list[AptSource]:
    """Every `deb` source the host's apt configuration names, in apt's reading order."""
    found = []
    for place in places:
        files = sorted(place.iterdir()) if place.is_dir() else [place]
        for path in files:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if path.suffix == ".sources":
                found += parse_deb822(text)
            elif path.suffix == ".list":
                found += parse_one_line(text)
    return found


def suite_uris(base: DebianBase, places: tuple[Path, ...] = HOST_SOURCES) -> dict[str, str]:
    """apt suite -> archive root for every suite of the base, or one LockError naming the first
    suite nobody serves and the two ways to say where it is."""
    uris = {}
    host = None
    for suite in base.apt_suites:
        explicit = base.security_mirror if suite.endswith("-security") else base.mirror
        if explicit:
            uris[suite] = explicit
            continue
        host = host_sources(places) if host is None else host
        serving = [s.uri for s in host if s.suite == suite and s.uri.startswith(("http://", "https://", "file:"))
                   and set(base.components) <= set(s.components)]
        if not serving:
            key = "security_mirror" if suite.endswith("-security") else "mirror"
            raise LockError(f"no mirror for Debian suite {suite!r}: the recipe sets no [base].{key} and the "
                            f"host's apt sources ({', '.join(map(str, places))}) name none with "
                            f"{'/'.join(base.components)}. Set [base].{key} = \"URL\" (the archive root, "
                            "holding dists/ and pool/), or list the suites to use with [base].suites")
        uris[suite] = serving[0]
    return uris
