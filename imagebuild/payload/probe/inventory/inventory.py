"""Inventory mode (`probe --inventory`): what an environment holds, for `imagebuild adopt`.

Read from files, never by importing anything of the environment's (torch's CUDA from torch/version.py,
as doctor reads it), under the interpreter in question:

    interpreter    sys.executable, its prefix, sys.version, the implementation, the machine
    markers        the PEP 508 marker environment, so the host evaluates Requires-Dist as this
                   interpreter would
    distributions  every one on sys.path (first wins, as imports do): name, version, INSTALLER,
                   direct_url.json, Requires-Dist and Provides-Extra, and its RECORD checked against
                   the disk: each file whose hash differs (with its bytes, up to a limit, for a
                   patch) and each file RECORD lists that is gone
    unowned        files in the site folders that no RECORD lists (added by hand); bytecode caches
                   and the venv tool's own files are counted apart, never listed as added
    torch, toolchain, driver, glibc   torch's version and CUDA, the CUDA wheels present, the GPUs
                   and driver where nvidia-smi answers

The host (imagebuild/adopt/) turns this into a recipe; nothing here judges.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import platform
import site
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from email.parser import HeaderParser

from ..doctor.findings_cuda import CUDA_VERSIONED
from ..gpus import DRIVER_VERSION_FILE, read_driver, torch_facts
from ..system import canonical_name, glibc_version, parallelism

INVENTORY_FORMAT = 1
MAX_CONTENT = 4 << 20  # a modified file's bytes travel in the report up to this size...
MAX_CONTENTS = 32 << 20  # ...and all of them together up to this
MAX_LISTED = 500  # unowned or missing paths listed; the total is counted
VENV_TOOL_FILES = ("_virtualenv.py", "_virtualenv.pth")  # what virtualenv and uv write into a venv they make
METADATA_DIRS = (".dist-info", ".egg-info")


def printable(path: str) -> str:
    """A file name as JSON can carry it: bytes that are not UTF-8 shown as \\x escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def marker_environment() -> dict:
    """PEP 508's marker variables for this interpreter (what packaging's default_environment gives)."""
    info = sys.implementation.version
    implementation_version = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        implementation_version += info.releaselevel[0] + str(info.serial)
    return {"implementation_name": sys.implementation.name, "implementation_version": implementation_version,
            "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


def interpreter_facts() -> dict:
    return {"executable": sys.executable, "real_executable": os.path.realpath(sys.executable),
            "prefix": sys.prefix, "base_prefix": getattr(sys, "base_prefix", sys.prefix),
            "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix), "version": sys.version,
            "version_info": list(sys.version_info[:3]), "implementation": sys.implementation.name,
            "machine": platform.machine(), "cwd": os.getcwd()}


def site_packages() -> list:
    """The interpreter's site-packages folders (its prefix's, and the user's when enabled): where
    files no RECORD lists are looked for. Other sys.path folders are a checkout's, or a shell's."""
    found = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    paths = sysconfig.get_paths()
    found += [user, paths.get("purelib"), paths.get("platlib")]
    return [p for p in dict.fromkeys(found) if p and os.path.isdir(p) and p in sys.path]


def site_dirs() -> list:
    """The folders on sys.path that may hold distributions: the standard library's own left out."""
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if paths.get(key)}
    found, seen = [], set()
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if not entry or not os.path.isdir(entry) or real in seen or real in stdlib \
                or os.path.basename(real) == "lib-dynload":
            continue
        seen.add(real)
        found.append(entry)
    return found


def _read(path: str, limit: int = 16 << 20):
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def _direct_url(info: str):
    """direct_url.json (PEP 610) as written, or {"unreadable": why}; None when there is none."""
    data = _read(os.path.join(info, "direct_url.json"))
    if data is None:
        return None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        return {"unreadable": f"{type(error).__name__}: {error}"}
    return parsed if isinstance(parsed, dict) else {"unreadable": "not a JSON object"}


def _record_rows(info: str):
    """(path, hash, size) rows of RECORD; None when the distribution has none."""
    data = _read(os.path.join(info, "RECORD"), 64 << 20)
    if data is None:
        return None
    rows = []
    try:
        for row in csv.reader(io.StringIO(data.decode("utf-8", "surrogateescape"))):
            if row and row[0]:
                rows.append((row[0], row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else ""))
    except csv.Error:  # a RECORD that is not CSV says nothing a check could trust
        return None
    return rows


def _installed_files(info: str):
    """An egg-info's installed-files.txt, as RECORD-like rows without hashes (relative to the egg-info)."""
    data = _read(os.path.join(info, "installed-files.txt"))
    if data is None:
        return None
    base = os.path.basename(info)
    return [(os.path.normpath(os.path.join(base, line)), "", "")
            for line in data.decode("utf-8", "surrogateescape").splitlines() if line.strip()]


def read_distribution(location: str, entry: str) -> dict | None:
    info = os.path.join(location, entry)
    text = _read(os.path.join(info, "METADATA" if entry.endswith(".dist-info") else "PKG-INFO"))
    if text is None:
        return None
    meta = HeaderParser().parsestr(text.decode("utf-8", "replace"))
    name, version = meta.get("Name"), meta.get("Version")
    if not name or not version:
        return None
    installer = _read(os.path.join(info, "INSTALLER"))
    rows = _record_rows(info) if entry.endswith(".dist-info") else _installed_files(info)
    return {"name": str(name).strip(), "canonical": canonical_name(str(name).strip()),
            "version": str(version).strip(), "location": location, "dist_info": entry,
            "installer": installer.decode("utf-8", "replace").strip() if installer is not None else None,
            "direct_url": _direct_url(info), "requires": [str(r) for r in meta.get_all("Requires-Dist") or []],
            "extras": [str(e).strip() for e in meta.get_all("Provides-Extra") or []],
            "record": rows is not None and entry.endswith(".dist-info"), "_rows": rows or []}


def read_distributions(dirs) -> list:
    """Every distribution in these folders; a later one of the same name is marked shadowed (imports
    never see it)."""
    found, names = [], set()
    for location in dirs:
        try:
            entries = sorted(os.listdir(location))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(METADATA_DIRS) or not os.path.isdir(os.path.join(location, entry)):
                continue
            dist = read_distribution(location, entry)
            if dist is None:
                continue
            dist["shadowed"] = dist["canonical"] in names
            names.add(dist["canonical"])
            found.append(dist)
    return found


def _is_bytecode(path: str) -> bool:
    return path.endswith((".pyc", ".pyo")) and os.path.basename(os.path.dirname(path)) == "__pycache__"


def _file_hash(path: str, algorithm: str):
    """`ALGO=urlsafe-base64` of the file as RECORD writes it; None when it cannot be read."""
    try:
        digest = hashlib.new(algorithm)
        with open(path, "rb") as handle:
            while True:
                block = handle.read(1 << 20)
                if not block:
                    break
                digest.update(block)
    except (OSError, ValueError):
        return None
    return f"{algorithm}=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def check_records(dists: list, jobs: int) -> None:
    """Each distribution's RECORD against the disk: `modified` (hash differs), `missing` (gone)."""
    work = []
    for dist in dists:
        dist.update(modified=[], missing=[], files=len(dist["_rows"]))
        if not dist["record"]:
            continue
        for path, expected, size in dist["_rows"]:
            algorithm, sep, _ = expected.partition("=")
            if not sep or _is_bytecode(path):
                continue  # RECORD itself; bytecode caches, rewritten whenever their source changes
            work.append((dist, path, expected, algorithm, size))

    def check(item):
        dist, path, expected, algorithm, size = item
        full = os.path.normpath(os.path.join(dist["location"], path))
        if not os.path.isfile(full):
            return item, full, "missing"
        actual = _file_hash(full, algorithm)
        return item, full, None if actual == expected else actual or "unreadable"

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(check, work))
    budget = MAX_CONTENTS
    for (dist, path, expected, _, _), full, outcome in results:
        if outcome is None:
            continue
        if outcome == "missing":
            dist["missing"].append(printable(path))
            continue
        inside = not os.path.relpath(full, dist["location"]).startswith(os.pardir)
        try:
            size = os.path.getsize(full)
        except OSError:
            size = -1
        entry = {"path": printable(path), "record": expected, "actual": None if outcome == "unreadable" else outcome,
                 "inside": inside, "size": size, "content": None}
        data = _read(full, MAX_CONTENT + 1) if 0 <= size <= min(MAX_CONTENT, budget) and inside else None
        if data is not None and len(data) <= MAX_CONTENT:
            entry["content"], budget = base64.b64encode(data).decode("ascii"), budget - len(data)
        else:
            entry["omitted"] = "outside the distribution's site folder" if not inside else \
                "unreadable" if size < 0 or outcome == "unreadable" else \
                f"{size} bytes, over the {MAX_CONTENT}-byte limit" if size > MAX_CONTENT else \
                f"the report already carries {MAX_CONTENTS} bytes of modified files"
        dist["modified"].append(entry)


def unowned_files(dirs, dists: list) -> dict:
    """Files in the site folders no distribution's RECORD lists: added by hand, or by a tool. Symbolic
    links are listed apart, with what they point to."""
    owned = {os.path.normpath(os.path.join(d["location"], row[0])) for d in dists for row in d["_rows"]}
    listed, links, total, bytecode, tools = [], [], 0, 0, []
    for location in dirs:
        for root, folders, files in os.walk(location):
            folders[:] = sorted(f for f in folders if not f.endswith(METADATA_DIRS))
            for name in sorted(files):
                full = os.path.normpath(os.path.join(root, name))
                if full in owned:
                    continue
                relative = os.path.relpath(full, location)
                if _is_bytecode(full):
                    bytecode += 1
                elif relative in VENV_TOOL_FILES:
                    tools.append(printable(relative))
                elif os.path.islink(full):
                    if len(links) < MAX_LISTED:
                        links.append({"location": location, "path": printable(relative),
                                      "target": printable(os.readlink(full))})
                else:
                    total += 1
                    if len(listed) < MAX_LISTED:
                        listed.append({"location": location, "path": printable(relative)})
    return {"files": listed, "total": total, "links": links, "bytecode": bytecode, "venv_tool": tools}


def toolchain_wheels(dists: list) -> list:
    """The CUDA toolchain distributions present, and whether each one's RECORD installs an nvcc."""
    return [{"name": d["canonical"], "version": d["version"],
             "nvcc": any(row[0].endswith("/bin/nvcc") for row in d["_rows"])}
            for d in dists if not d["shadowed"] and d["canonical"] in CUDA_VERSIONED]


def run_inventory(driver_file: str = DRIVER_VERSION_FILE, jobs: int | None = None) -> dict:
    started = time.monotonic()
    dirs = site_dirs()
    dists = read_distributions(dirs)
    check_records(dists, jobs or parallelism())
    unowned = unowned_files(site_packages(), dists)
    visible = {d["canonical"]: d["version"] for d in dists if not d["shadowed"]}
    torch = torch_facts({"dirs": dirs, "distributions": visible})
    toolchain = toolchain_wheels(dists)
    for dist in dists:
        del dist["_rows"]
    return {"mode": "inventory", "format": INVENTORY_FORMAT, "interpreter": interpreter_facts(),
            "markers": marker_environment(), "site_dirs": dirs, "distributions": dists, "unowned": unowned,
            "torch": torch, "toolchain": toolchain, "driver": read_driver(driver_file), "glibc": glibc_version(),
            "seconds": round(time.monotonic() - started, 2)}
