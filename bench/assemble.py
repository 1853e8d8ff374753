#!/usr/bin/env python3
"""Wheel layers assembled as tars straight from the locked wheels, against the engine doing the same work.

Today each wheel layer is `RUN uv pip install --no-deps --require-hashes -r requirements/NN-LAYER.txt`
(plus the recipe's [[prune]]), and Docker 20.10's BuildKit then exports every layer: it tars the
snapshot's diff and checksums it. This prototype writes, for each layer of the lock's layer plan, the
tar that step leaves in /opt/venv without running it, as apko and ko build their layers: the files
stream from the wheel zips into one deterministic uncompressed tar (sorted entries, uid/gid 0, mtimes
at the epoch, no PAX times), with the diff_id computed while it is written. What uv writes besides
the wheel's own files is written the way uv 0.13 writes it: `*.data/scripts` into bin with the
`#!python` shebang rewritten, console and GUI entry points as bin scripts, INSTALLER, REQUESTED and a
sorted RECORD; then [[prune]] is applied with the pruner's own rules (remove, strip --strip-debug,
tombstone modules, IMAGEBUILD_PRUNED, RECORD rewritten by the patcher's code), and the CUDA toolchain
links are added to the layer that installs the runtime.

Phases, each timed:
    urls       where the wheels are (the lock keeps none): the lock's own `uv pip compile`, by sha256
    download   the locked wheels into --cache, sha256 checked; files already there are checked and reused
    assemble   per layer: wheels -> tar, diff_id while writing (strip_debug included, shown apart)
    gzip       the tar compressed with pigz -1 (what a registry push needs; an engine load does not)
    import     `docker import` of the tar: the engine's own untar + checksum (layer store Register);
               the diff_id the engine computes is printed against ours
    load       `docker load` of a one-layer image made of the tar (20.10 first untars the whole archive
               into a temp folder, then registers the layer as import does); skipped when the disk is short
    reference  the image built from this lock, read through `docker save`: every assembled entry is
               compared with its install step's layer (path, type, mode, size, link target, crc32 of the
               contents). No such image: this run builds one (--no-smoke, under imagebuild-bench/assemble)
               and removes it; BuildKit's own step times are then read from its plain log.

Usage: .venv/bin/python bench/assemble.py [--lock lockfiles/sglang-blackwell.lock] [--json OUT]
           [--cache DIR] [--no-reference] [--no-engine]
Disk: the wheels (--cache), one layer tar at a time beside it in a temp folder, and what the engine
writes for one layer (twice that for load). The flagship: ~4.2 GB of wheels, a 6 GB framework layer.
"""

from __future__ import annotations

import argparse
import configparser
import csv
import hashlib
import io
import json
import os
import posixpath
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import zipfile
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from imagebuild import flows  # noqa: E402
from imagebuild.common import REPRO_EPOCH, cache_dir  # noqa: E402
from imagebuild.engine.docker import DockerEngine  # noqa: E402
from imagebuild.errors import ImagebuildError  # noqa: E402
from imagebuild.image.export import read_saved, saved_image  # noqa: E402
from imagebuild.image.tarstream import (DIRECTORY, HARDLINK, REGULAR, SYMLINK, Member, Reader,  # noqa: E402
                                        TarStreamError, Writer)
from imagebuild.lock import LockedWheel, compile_command, read_lock, uv_binary  # noqa: E402
from imagebuild.payload.apply_patch import _rewrite_record, record_hash  # noqa: E402
from imagebuild.payload.prune import PRUNED_FILE, TOMBSTONE, extension_module, matches  # noqa: E402
from imagebuild.recipe.model import load_recipe  # noqa: E402
from imagebuild.render import VENV, LayerValues, layer_values, prune_specs, site_packages  # noqa: E402

DOCKER = "/usr/bin/docker"
BENCH_TAG = "imagebuild-bench/assemble"
CHUNK = 1 << 20
DOWNLOADERS = 8
MB = 1e6
INSTALLER = b"uv"  # what uv writes into <dist-info>/INSTALLER (no newline)
# uv's console-script launcher (uv-install-wheel), checked byte for byte against a uv 0.13.9 install.
LAUNCHER = '''#!{python}
# -*- coding: utf-8 -*-
import sys
from {module} import {import_name}
if __name__ == "__main__":
    if sys.argv[0].endswith("-script.pyw"):
        sys.argv[0] = sys.argv[0][:-11]
    elif sys.argv[0].endswith(".exe"):
        sys.argv[0] = sys.argv[0][:-4]
    sys.exit({function}())
'''
_ENTRY_POINT = re.compile(r"^\s*([\w.]+)\s*:\s*([\w.]+)\s*(\[.*\])?\s*$")


def clock() -> float:
    return time.monotonic()


# ---------------------------------------------------------------- what a layer holds

@dataclass(frozen=True)
class Entry:
    """One path of a layer, as the comparison sees it (mtimes are not compared)."""

    kind: str  # file, dir, symlink, hardlink, whiteout
    mode: int
    size: int = 0
    crc: int = 0  # crc32 of the contents (files)
    link: str = ""  # symlink or hard link target


@dataclass
class Planned:
    """A file of the assembled layer and where its bytes come from: a zip member, bytes, or a file."""

    entry: Entry
    member: tuple[zipfile.ZipFile, zipfile.ZipInfo] | None = None
    data: bytes | None = None
    path: Path | None = None


@dataclass
class Installed:
    """What `uv pip install --no-deps` writes for one wheel."""

    wheel: LockedWheel
    dist_info: str  # folder name inside site-packages
    files: dict[str, Planned]  # layer path (no leading /) -> file
    record: str  # RECORD as uv writes it
    record_mode: int  # uv rewrites the unpacked RECORD in place: it keeps the wheel's mode for it


class WheelProblem(Exception):
    """A wheel this prototype cannot install as uv would; it is reported and left out of the layer."""


def _file_mode(info: zipfile.ZipInfo) -> int:
    """uv unpacks with the umask's 0644 and adds every x bit when the zip gives the file any."""
    return 0o755 if (info.external_attr >> 16) & 0o111 else 0o644


def _record_row(path: str, data: bytes) -> list[str]:
    return [path, record_hash(data), str(len(data))]


def install_wheel(archive: zipfile.ZipFile, wheel: LockedWheel, venv: str, site: str,
                  python_version: str) -> Installed:
    """The files uv writes for this wheel into the venv (paths relative to /), and its RECORD."""
    root, site_rel = venv.strip("/"), site.strip("/")
    python = f"{venv}/bin/python"
    infos = [info for info in archive.infolist() if not info.is_dir()]
    names = {info.filename.split("/", 1)[0] for info in infos}
    dist_infos = sorted(n for n in names if n.endswith(".dist-info"))
    if len(dist_infos) != 1:
        raise WheelProblem(f"{len(dist_infos)} .dist-info folders at the top of the wheel")
    dist_info = dist_infos[0]
    data_dir = dist_info[:-len(".dist-info")] + ".data"
    project = dist_info.rsplit("-", 1)[0]
    targets = {"purelib": site_rel, "platlib": site_rel, "scripts": f"{root}/bin", "data": root,
               "headers": f"{root}/include/site/python{python_version}/{project}"}

    files: dict[str, Planned] = {}
    moved: dict[str, str] = {}  # wheel path -> site-relative path, for RECORD
    rewritten: dict[str, bytes] = {}  # site-relative path -> new bytes (scripts with a new shebang)
    for info in infos:
        name = info.filename
        if name.startswith("/") or ".." in name.split("/") or "\\" in name:
            raise WheelProblem(f"{name!r}: a path outside the install folders")
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise WheelProblem(f"{name!r}: a symlink inside the wheel")
        if name == f"{dist_info}/RECORD":
            continue  # written anew below
        if name.startswith(data_dir + "/"):
            scheme, _, rest = name[len(data_dir) + 1:].partition("/")
            if scheme not in targets or not rest:
                raise WheelProblem(f"{name!r}: unknown data scheme {scheme!r}")
            target = f"{targets[scheme]}/{rest}"
        else:
            target = f"{site_rel}/{name}"
        relative = posixpath.relpath("/" + target, "/" + site_rel)
        moved[name] = relative
        if name.startswith(f"{data_dir}/scripts/"):
            data = archive.read(info)
            if data.startswith(b"#!python"):
                data = f"#!{python}".encode() + data[len(b"#!python"):]
                rewritten[relative] = data
            files[target] = Planned(Entry("file", 0o755, len(data), zlib.crc32(data)), data=data)
        else:
            files[target] = Planned(Entry("file", _file_mode(info), info.file_size, info.CRC),
                                    member=(archive, info))

    # RECORD: the wheel's rows at their installed paths, rewritten scripts re-hashed, then what uv adds.
    rows: dict[str, list[str]] = {}
    try:
        record_info = archive.getinfo(f"{dist_info}/RECORD")
    except KeyError:
        raise WheelProblem("the wheel has no RECORD") from None
    wheel_record = archive.read(record_info).decode("utf-8")
    for row in csv.reader(wheel_record.splitlines()):
        if not row or not row[0] or row[0] == f"{dist_info}/RECORD":
            continue
        path = moved.get(row[0], row[0])
        rows[path] = _record_row(path, rewritten[path]) if path in rewritten else [path] + row[1:]
    for section in entry_points(archive, dist_info):
        for script, (module, function) in section.items():
            data = LAUNCHER.format(python=python, module=module, import_name=function.split(".")[0],
                                   function=function).encode()
            target = f"{root}/bin/{script}"
            files[target] = Planned(Entry("file", 0o755, len(data), zlib.crc32(data)), data=data)
            relative = posixpath.relpath("/" + target, "/" + site_rel)
            rows[relative] = _record_row(relative, data)
    for name, data in (("INSTALLER", INSTALLER), ("REQUESTED", b"")):
        files[f"{site_rel}/{dist_info}/{name}"] = Planned(Entry("file", 0o644, len(data), zlib.crc32(data)),
                                                          data=data)
        rows[f"{dist_info}/{name}"] = _record_row(f"{dist_info}/{name}", data)
    rows[f"{dist_info}/RECORD"] = [f"{dist_info}/RECORD", "", ""]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows[path] for path in sorted(rows))
    return Installed(wheel, dist_info, files, buffer.getvalue(), _file_mode(record_info))


def entry_points(archive: zipfile.ZipFile, dist_info: str) -> list[dict[str, tuple[str, str]]]:
    """console_scripts and gui_scripts: script name -> (module, attribute path)."""
    try:
        text = archive.read(f"{dist_info}/entry_points.txt").decode("utf-8")
    except KeyError:
        return []
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # script names keep their case
    try:
        parser.read_string(text)
    except configparser.Error as err:
        raise WheelProblem(f"entry_points.txt: {err}") from None
    sections = []
    for section in ("console_scripts", "gui_scripts"):
        if not parser.has_section(section):
            continue
        scripts = {}
        for script, value in parser.items(section):
            match = _ENTRY_POINT.match(value)
            if not match:
                raise WheelProblem(f"entry_points.txt: {script} = {value!r} is not module:attribute")
            scripts[script] = (match.group(1), match.group(2))
        sections.append(scripts)
    return sections


# ---------------------------------------------------------------- [[prune]], as prune.py does it in the image

def apply_prune(layer_files: dict[str, Planned], installed: dict[str, Installed], specs: Iterable[dict],
                site: str, scratch: Path) -> list[str]:
    """Each [[prune]] entry on the planned layer: removed files go, stripped ones are replaced by
    `strip --strip-debug` output, tombstones and IMAGEBUILD_PRUNED are added, RECORD is rewritten."""
    site_rel = site.strip("/")
    lines = []
    for spec in specs:
        dist = installed.get(spec["package"])
        if dist is None:
            raise WheelProblem(f"[[prune]] names {spec['package']}, which this layer did not install")
        recorded = {posixpath.normpath(row[0]) for row in csv.reader(dist.record.splitlines()) if row}
        listed = sorted(p for p in recorded if not p.startswith((dist.dist_info + "/", "../", "/")))
        outputs: dict[str, bytes | None] = {}
        log = []
        for kind in ("remove", "strip_debug"):
            for pattern in spec.get(kind, []):
                hits = [path for path in listed if matches(pattern, path)]
                if not hits:
                    raise WheelProblem(f"[[prune]] {kind} {pattern!r} matches no file of {dist.wheel.name}")
                for path in hits:
                    planned = layer_files.get(f"{site_rel}/{path}")
                    if planned is None or planned.member is None:
                        raise WheelProblem(f"[[prune]] {kind} {path}: not a file of this layer's wheels (an "
                                           "earlier layer's needs a whiteout or a copy, not written here)")
                    size = planned.entry.size
                    if kind == "remove":
                        outputs[path] = None
                        log.append(f"removed {path} {size}")
                        del layer_files[f"{site_rel}/{path}"]
                    else:
                        stripped = strip_debug(planned, scratch)
                        layer_files[f"{site_rel}/{path}"] = stripped
                        outputs[path] = stripped.path.read_bytes()  # for RECORD's hash and size
                        log.append(f"stripped {path} {size} {stripped.entry.size}")
                    lines.append(log[-1])
        for path in [p for p, data in outputs.items() if data is None]:
            module = extension_module(path)
            if module and module not in listed and module not in outputs:
                message = f"{path} was removed from this image by imagebuild: {spec['reason']}"
                data = TOMBSTONE.format(reason=spec["reason"].replace('"""', "'''"), message=message).encode()
                outputs[module] = data
                layer_files[f"{site_rel}/{module}"] = Planned(Entry("file", 0o644, len(data), zlib.crc32(data)),
                                                              data=data)
        pruned_path = f"{site_rel}/{dist.dist_info}/{PRUNED_FILE}"
        previous = layer_files[pruned_path].data if pruned_path in layer_files else b""
        data = previous + f"# {spec['reason']}\n".encode() + "".join(line + "\n" for line in log).encode()
        layer_files[pruned_path] = Planned(Entry("file", 0o644, len(data), zlib.crc32(data)), data=data)
        outputs[f"{dist.dist_info}/{PRUNED_FILE}"] = data
        dist.record = _rewrite_record(dist.record, outputs, [])
    return lines


def strip_debug(planned: Planned, scratch: Path) -> Planned:
    """The member through `strip --strip-debug` (the one step that needs the file on disk)."""
    archive, info = planned.member
    handle, name = tempfile.mkstemp(prefix="strip-", dir=scratch)
    raw, stripped = Path(name), Path(name + ".stripped")
    with archive.open(info) as source, os.fdopen(handle, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK)
    done = subprocess.run(["strip", "--strip-debug", "-o", str(stripped), str(raw)], capture_output=True,
                          text=True)
    raw.unlink()
    if done.returncode != 0:
        raise WheelProblem(f"strip --strip-debug {info.filename}: {done.stderr.strip()}")
    crc = 0
    with open(stripped, "rb") as handle:
        while block := handle.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return Planned(Entry("file", planned.entry.mode, stripped.stat().st_size, crc), path=stripped)


# ---------------------------------------------------------------- a layer, planned and written

@dataclass
class LayerPlan:
    values: LayerValues
    wheels: tuple[LockedWheel, ...]
    files: dict[str, Planned] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # wheel filename -> why it was left out
    overlaps: list[str] = field(default_factory=list)  # paths two wheels of the layer write
    pruned: list[str] = field(default_factory=list)
    prune_seconds: float = 0.0

    def entries(self) -> dict[str, Entry]:
        return {path: planned.entry for path, planned in self.files.items()}


def plan_layer(values: LayerValues, wheels: tuple[LockedWheel, ...], paths: dict[str, Path], venv: str,
               site: str, python_version: str, scratch: Path) -> LayerPlan:
    plan = LayerPlan(values, wheels)
    installed: dict[str, Installed] = {}
    # Lock order; a path two wheels write keeps the later one's (uv installs in parallel, so its order
    # is not defined: the lock's file-overlap check is what keeps such paths out of a recipe).
    for wheel in wheels:
        if wheel.sha256 not in paths:
            plan.problems[wheel.filename] = "not downloaded"
            continue
        try:
            archive = zipfile.ZipFile(paths[wheel.sha256])
            dist = install_wheel(archive, wheel, venv, site, python_version)
        except (WheelProblem, zipfile.BadZipFile, UnicodeDecodeError, OSError) as err:
            plan.problems[wheel.filename] = f"{type(err).__name__}: {err}"
            continue
        plan.overlaps += sorted(set(dist.files) & set(plan.files))
        plan.files.update(dist.files)
        installed[wheel.name] = dist
    start = clock()
    try:
        plan.pruned = apply_prune(plan.files, installed, values.prune, site, scratch)
    except WheelProblem as err:
        plan.problems["[[prune]]"] = str(err)
    plan.prune_seconds = clock() - start
    site_rel = site.strip("/")
    for dist in installed.values():
        data = dist.record.encode("utf-8")
        plan.files[f"{site_rel}/{dist.dist_info}/RECORD"] = Planned(
            Entry("file", dist.record_mode, len(data), zlib.crc32(data)), data=data)
    for link in values.links:
        plan.files[link.path.strip("/")] = Planned(Entry("symlink", 0o777, link=link.target))
    for path in list(plan.files):
        folder = posixpath.dirname(path)
        while folder and folder not in plan.files:
            plan.files[folder] = Planned(Entry("dir", 0o755))
            folder = posixpath.dirname(folder)
    return plan


class HashingFile:
    """The tar's destination: sha256 and the file, on a thread of their own (hashlib and file writes
    release the GIL), fed in blocks of about 1 MiB so that the tar writer does not wait on them."""

    def __init__(self, path: Path):
        self.file = open(path, "wb")
        self.digest = hashlib.sha256()
        self.size = 0
        self._buffer = bytearray()
        self._queue: queue.Queue = queue.Queue(maxsize=16)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (block := self._queue.get()) is not None:
            try:
                self.digest.update(block)
                self.file.write(block)
            except BaseException as err:  # re-raised on the writer's side
                self._error = err

    def write(self, data) -> None:
        self.size += len(data)
        if len(data) >= CHUNK // 4:
            self._flush()
            self._queue.put(bytes(data))
        else:
            self._buffer += data
            if len(self._buffer) >= CHUNK:
                self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._queue.put(bytes(self._buffer))
            self._buffer.clear()

    def close(self) -> str:
        self._flush()
        self._queue.put(None)
        self._thread.join()
        self.file.close()
        if self._error:
            raise self._error
        return "sha256:" + self.digest.hexdigest()


class Inflater:
    """Zip members decompressed ahead of the tar writer on one thread per core (zlib releases the
    GIL), handed out in the writer's order. At most `budget` bytes wait in memory, or one member
    larger than that."""

    def __init__(self, members: list[tuple[zipfile.ZipFile, zipfile.ZipInfo]], budget: int = 1 << 30):
        self._pool = ThreadPoolExecutor(os.cpu_count() or 2)
        self._ready: queue.Queue = queue.Queue()
        self._budget, self._waiting, self._closed = budget, 0, False
        self._room = threading.Condition()
        threading.Thread(target=self._feed, args=(members,), daemon=True).start()

    def _feed(self, members) -> None:
        for archive, info in members:
            with self._room:
                while self._waiting and self._waiting + info.file_size > self._budget and not self._closed:
                    self._room.wait()
                if self._closed:
                    return
                self._waiting += info.file_size
                self._ready.put((info.file_size, self._pool.submit(_inflate, archive, info)))

    def next(self) -> list[bytes]:
        """The next member's contents, in chunks; they leave the budget as they are handed out."""
        size, future = self._ready.get()
        chunks = future.result()
        with self._room:
            self._waiting -= size
            self._room.notify()
        return chunks

    def close(self) -> None:
        with self._room:
            self._closed = True
            self._room.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _inflate(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> list[bytes]:
    with archive.open(info) as source:  # checks the member's CRC at its end
        return list(iter(lambda: source.read(CHUNK), b""))


def write_layer(plan: LayerPlan, out: Path, epoch: int) -> str:
    """The layer as an uncompressed tar in byte-wise path order (a folder before its contents), owned by
    0:0, every mtime the epoch; returns its diff_id."""
    order = sorted(plan.files, key=lambda p: p.encode("utf-8", "surrogateescape"))
    inflater = Inflater([plan.files[p].member for p in order if plan.files[p].member is not None])
    sink = HashingFile(out)
    tar = Writer(sink)
    try:
        for path in order:
            planned = plan.files[path]
            entry = planned.entry
            if entry.kind == "dir":
                tar.add(Member(path + "/", DIRECTORY, mode=entry.mode, mtime=epoch))
            elif entry.kind == "symlink":
                tar.add(Member(path, SYMLINK, mode=entry.mode, mtime=epoch, linkname=entry.link))
            elif planned.data is not None:
                tar.add(Member(path, REGULAR, mode=entry.mode, size=entry.size, mtime=epoch), planned.data)
            elif planned.path is not None:  # a stripped library
                tar.add(Member(path, REGULAR, mode=entry.mode, size=entry.size, mtime=epoch))
                with open(planned.path, "rb") as source:
                    _copy(source.read, tar.data, entry.size)
            else:
                tar.add(Member(path, REGULAR, mode=entry.mode, size=entry.size, mtime=epoch))
                for chunk in inflater.next():
                    tar.data(chunk)
        tar.close()
    finally:
        inflater.close()
        diff_id = sink.close()
    return diff_id


def _copy(read: Callable[[int], bytes], write: Callable[[bytes], None], size: int) -> None:
    left = size
    while left:
        block = read(min(CHUNK, left))
        if not block:
            raise WheelProblem(f"the source ended {left} bytes early")
        write(block)
        left -= len(block)


def gzip_size(path: Path) -> tuple[int, str]:
    """Bytes of the tar compressed at level 1 (pigz on every core, else zlib), the output discarded."""
    pigz = shutil.which("pigz")
    if pigz:
        proc = subprocess.Popen([pigz, "-1", "-n", "-c", str(path)], stdout=subprocess.PIPE)
        size = 0
        while block := proc.stdout.read(CHUNK):
            size += len(block)
        if proc.wait() != 0:
            raise RuntimeError(f"pigz failed on {path}")
        return size, f"pigz -1 ({os.cpu_count()} threads)"
    compressor, size = zlib.compressobj(1, zlib.DEFLATED, 31), 0
    with open(path, "rb") as source:
        while block := source.read(CHUNK):
            size += len(compressor.compress(block))
    return size + len(compressor.flush()), "zlib level 1"


# ---------------------------------------------------------------- wheels: where, and downloaded

def wheel_urls(lock, lock_path: Path) -> dict[str, str]:
    """sha256 -> URL, from the same `uv pip compile` the lock was made with (the lock records no URLs)."""
    recipe = load_recipe(lock_path.resolve().parent.parent / "recipes" / f"{lock.recipe}.toml")
    with tempfile.TemporaryDirectory(prefix="bench-assemble-urls-") as tmp:
        command = compile_command(recipe, lock.base, Path(tmp), uv_binary())
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True,
                              env={**os.environ, "UV_NO_PROGRESS": "1"})
        if done.returncode != 0:
            raise SystemExit(f"uv pip compile failed:\n{done.stderr[-2000:]}")
        pylock = tomllib.loads((Path(tmp) / "pylock.toml").read_text())
    return {wheel["hashes"]["sha256"]: wheel["url"] for package in pylock.get("packages", [])
            for wheel in package.get("wheels") or [] if wheel.get("url") and wheel.get("hashes", {}).get("sha256")}


@dataclass
class Downloads:
    paths: dict[str, Path] = field(default_factory=dict)  # sha256 -> wheel file
    fetched_bytes: int = 0
    reused: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # filename -> why


def download(wheels: Iterable[LockedWheel], urls: dict[str, str], cache: Path) -> Downloads:
    """Each wheel once into cache/<sha256>/<filename> (the layout imagebuild's wheel cache uses),
    over one pooled session; a file already there is hashed and reused."""
    session = requests.Session()
    session.mount("https://", HTTPAdapter(pool_connections=DOWNLOADERS, pool_maxsize=DOWNLOADERS))
    found = Downloads()

    def fetch(wheel: LockedWheel) -> tuple[LockedWheel, Path | None, int, str]:
        target = cache / wheel.sha256 / wheel.filename
        if target.is_file() and _sha256(target) == wheel.sha256:
            return wheel, target, 0, ""
        url = urls.get(wheel.sha256)
        if not url:
            return wheel, None, 0, "the index lists no file with the locked sha256"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        digest, size = hashlib.sha256(), 0
        try:
            with session.get(url, stream=True, timeout=(15, 120)) as response, open(partial, "wb") as out:
                response.raise_for_status()
                for block in response.iter_content(CHUNK):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
        except (requests.RequestException, OSError) as err:
            partial.unlink(missing_ok=True)
            return wheel, None, 0, f"{type(err).__name__}: {err}"
        if digest.hexdigest() != wheel.sha256:
            partial.unlink(missing_ok=True)
            return wheel, None, 0, f"sha256 {digest.hexdigest()} is not the locked {wheel.sha256}"
        os.replace(partial, target)
        return wheel, target, size, ""

    largest_first = sorted(wheels, key=lambda w: -w.size)
    with session, ThreadPoolExecutor(DOWNLOADERS) as pool:
        for wheel, path, size, why in pool.map(fetch, largest_first):
            if path is None:
                found.failed[wheel.filename] = why
                continue
            found.paths[wheel.sha256] = path
            found.fetched_bytes += size
            found.reused += size == 0
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- the engine

def free_bytes() -> int:
    return shutil.disk_usage("/var/lib/docker" if os.path.isdir("/var/lib/docker") else "/").free


def engine_import(tar: Path, tag: str) -> tuple[float, str]:
    """`docker import` of the layer tar: seconds, and the diff_id the engine computed for it."""
    start = clock()
    done = subprocess.run([DOCKER, "import", str(tar), tag], capture_output=True, text=True)
    seconds = clock() - start
    if done.returncode != 0:
        raise RuntimeError(f"docker import failed: {done.stderr.strip()}")
    layers = subprocess.run([DOCKER, "image", "inspect", "--format", "{{json .RootFS.Layers}}", tag],
                            capture_output=True, text=True, check=True).stdout
    return seconds, (json.loads(layers) or [""])[0]


def engine_load(tar: Path, diff_id: str, tag: str) -> float:
    """`docker load` of a one-layer image whose only layer is the tar, streamed into the engine."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "history": [{"created_by": "bench/assemble.py"}]}, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]).encode()
    start = clock()
    proc = subprocess.Popen([DOCKER, "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    archive = Writer(proc.stdin)
    archive.add(Member("manifest.json", REGULAR, size=len(manifest)), manifest)
    archive.add(Member(config_name, REGULAR, size=len(config)), config)
    archive.add(Member("layer/", DIRECTORY, mode=0o755))
    size = tar.stat().st_size
    archive.add(Member("layer/layer.tar", REGULAR, size=size))
    with open(tar, "rb") as source:
        _copy(source.read, archive.data, size)
    archive.close()
    proc.stdin.close()
    output = proc.stdout.read().decode("utf-8", "replace")
    if proc.wait() != 0:
        raise RuntimeError(f"docker load failed: {output.strip()}")
    return clock() - start


def remove_image(tag: str) -> None:
    subprocess.run([DOCKER, "rmi", tag], capture_output=True, text=True)


# ---------------------------------------------------------------- the reference: the image the Dockerfile builds

_VERTEX = re.compile(r"^#(\d+) \[(?:[^\]\s]+ )?\s*(\d+)/(\d+)\] (.*)$")
_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s$")
_CACHED = re.compile(r"^#(\d+) CACHED$")
_EXPORT = re.compile(r"^#\d+ exporting layers (\d+(?:\.\d+)?)s done$")


@dataclass
class BuildKitSteps:
    """Per-step seconds from a `docker build --progress=plain` log."""

    steps: dict[str, dict] = field(default_factory=dict)  # vertex -> {instruction, seconds, cached}
    export_seconds: float | None = None

    @classmethod
    def parse(cls, lines: Iterable[str]) -> "BuildKitSteps":
        found = cls()
        for line in lines:
            if match := _VERTEX.match(line):
                found.steps.setdefault(match.group(1), {"instruction": match.group(4), "seconds": None,
                                                        "cached": False})
            elif (match := _DONE.match(line)) and match.group(1) in found.steps:
                found.steps[match.group(1)]["seconds"] = float(match.group(2))
            elif (match := _CACHED.match(line)) and match.group(1) in found.steps:
                found.steps[match.group(1)]["cached"] = True
            elif match := _EXPORT.match(line):
                found.export_seconds = float(match.group(1))
        return found

    def find(self, *needles: str) -> dict | None:
        return next((s for s in self.steps.values() if all(n in s["instruction"] for n in needles)), None)


@dataclass
class Reference:
    image: str
    built_here: bool
    build_seconds: float | None
    buildkit: BuildKitSteps | None
    layers: dict[str, dict[str, Entry]]  # lock layer name -> entries of its install (and links) layers
    read_seconds: float


def reference_image(lock, lock_path: Path,
                    engine: DockerEngine) -> tuple[str, bool, float | None, BuildKitSteps | None]:
    """The engine's image built from this lock, else one built now (no smoke test) under BENCH_TAG."""
    found = engine.find_labelled("io.imagebuild.lock.sha256", lock.sha256)
    if found:
        tags = engine.inspect(found).tags
        return (tags[0] if tags else found), False, None, None
    recipe = lock_path.resolve().parent.parent / "recipes" / f"{lock.recipe}.toml"
    tag = f"{BENCH_TAG}:{lock.recipe}"
    log: list[str] = []
    print(f"  building {recipe.name} as {tag} (no image of this lock in the engine)", flush=True)
    start = clock()
    flows.build(recipe, engine, flows.BuildOptions(lock_path=lock_path, run_smoke=False, tag=tag, progress=log.append))
    return tag, True, clock() - start, BuildKitSteps.parse(log)


def read_reference(engine: DockerEngine, image: str, layers: Iterable[LayerValues]) -> dict[str, dict[str, Entry]]:
    """Each lock layer's entries in the image: its install step's layer, merged with its links step's."""

    def listing(name: str, stream) -> dict[str, Entry]:
        return list_layer(_Readable(stream))

    with saved_image(engine, image) as stream:
        saved = read_saved(stream, listing)
    steps = [h.get("created_by", "") for h in saved.config.get("history", []) if not h.get("empty_layer")]
    if len(steps) != len(saved.layers):
        raise ImagebuildError(f"{image}: {len(steps)} history steps for {len(saved.layers)} layers")
    found = {}
    for values in layers:
        install = next((i for i, step in enumerate(steps)
                        if f"requirements/{values.file}" in step and "pip install" in step), None)
        if install is None:
            continue
        merged = dict(saved.layers[install])
        if values.links and install + 1 < len(steps) and "ln -sfn" in steps[install + 1]:
            merged.update(saved.layers[install + 1])
        found[values.name] = merged
    return found


class _Readable:
    """readinto over a read-only stream (tarstream.Reader copies through readinto)."""

    def __init__(self, stream):
        self.read = stream.read

    def readinto(self, view) -> int:
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)


def list_layer(stream) -> dict[str, Entry]:
    entries = {}
    reader = Reader(stream)
    for member in reader:
        path = member.name[2:] if member.name.startswith("./") else member.name
        path = path.strip("/")
        if not path:
            continue
        base = posixpath.basename(path)
        if base.startswith(".wh."):
            entries[path] = Entry("whiteout", member.mode & 0o7777)
        elif member.isdir():
            entries[path] = Entry("dir", member.mode & 0o7777)
        elif member.issym():
            entries[path] = Entry("symlink", member.mode & 0o7777, link=member.linkname)
        elif member.type == HARDLINK:
            entries[path] = Entry("hardlink", member.mode & 0o7777, link=member.linkname)
        elif member.isreg():
            crc = [0]
            reader.copy_data(lambda block: crc.__setitem__(0, zlib.crc32(block, crc[0])))
            entries[path] = Entry("file", member.mode & 0o7777, member.size, crc[0])
        else:
            entries[path] = Entry(f"type {member.type!r}", member.mode & 0o7777)
    return entries


def classify(path: str) -> str:
    base = posixpath.basename(path)
    if "__pycache__" in path or base.endswith(".pyc"):
        return "bytecode"
    if not path.startswith(VENV.strip("/") + "/"):
        return "outside the venv: what the RUN step's mounts leave"
    if path == VENV.strip("/") + "/.lock":
        return "uv's lock file of the venv"
    if base == "RECORD" and path.endswith(".dist-info/RECORD"):
        return "RECORD"
    if base == PRUNED_FILE:
        return PRUNED_FILE
    if "/bin/" in path:
        return "bin script"
    return "other"


def compare(ours: dict[str, Entry], theirs: dict[str, Entry]) -> dict[str, list[str]]:
    """Differences by category: 'only in the image: <kind> (<class>)', 'only assembled: ...',
    '<field> differs (<class>)'; each lists every path."""
    found: dict[str, list[str]] = {}
    for path in sorted(set(ours) | set(theirs)):
        mine, image = ours.get(path), theirs.get(path)
        if mine is None:
            found.setdefault(f"only in the image: {image.kind} ({classify(path)})", []).append(path)
        elif image is None:
            found.setdefault(f"only assembled: {mine.kind} ({classify(path)})", []).append(path)
        else:
            for name in ("kind", "mode", "size", "crc", "link"):
                if getattr(mine, name) != getattr(image, name):
                    label = "contents" if name == "crc" else name
                    found.setdefault(f"{label} differs ({classify(path)})", []).append(path)
                    if name in ("kind", "size"):
                        break  # a different type or size is a different content too: say it once
    return found


# ---------------------------------------------------------------- the run

@dataclass
class LayerResult:
    name: str
    wheels: int
    wheel_bytes: int
    entries: int
    tar_bytes: int = 0
    diff_id: str = ""
    assemble_seconds: float = 0.0
    prune_seconds: float = 0.0
    gzip_bytes: int = 0
    gzip_seconds: float = 0.0
    gzip_tool: str = ""
    import_seconds: float | None = None
    import_diff_id: str = ""
    load_seconds: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    buildkit_install: float | None = None
    buildkit_links: float | None = None
    differences: dict[str, list[str]] = field(default_factory=dict)
    compared: bool = False

    def add_buildkit(self, buildkit: BuildKitSteps, values: LayerValues) -> None:
        """This layer's install step (and links step) as BuildKit timed them, when they ran."""
        install = buildkit.find(f"requirements/{values.file}", "pip install")
        if install and not install["cached"]:
            self.buildkit_install = install["seconds"]
        links = buildkit.find("ln -sfn") if values.links else None
        if links and not links["cached"]:
            self.buildkit_links = links["seconds"]


def measure_layer(values: LayerValues, lock, paths: dict[str, Path], work: Path, epoch: int,
                  use_engine: bool) -> tuple[LayerResult, LayerPlan]:
    """Assemble one layer (timed from the first zip opened to the diff_id), then gzip, import and load
    the same tar; the tar and any stripped library are deleted before the next layer."""
    wheels = lock.layer(values.name)
    start = clock()
    plan = plan_layer(values, wheels, paths, VENV, site_packages(lock), lock.base.python, work)
    tar = work / f"{values.name}.tar"
    diff_id = write_layer(plan, tar, epoch)
    result = LayerResult(values.name, len(wheels), sum(w.size for w in wheels), len(plan.files),
                         tar_bytes=tar.stat().st_size, diff_id=diff_id, assemble_seconds=clock() - start,
                         prune_seconds=plan.prune_seconds, problems=plan.problems, overlaps=plan.overlaps,
                         pruned=plan.pruned)
    start = clock()
    result.gzip_bytes, result.gzip_tool = gzip_size(tar)
    result.gzip_seconds = clock() - start
    if use_engine:
        tag = f"{BENCH_TAG}-layer:{lock.recipe}-{values.name}"
        if free_bytes() < 1.3 * result.tar_bytes + 2e9:
            result.skipped["import"] = f"{free_bytes() / 1e9:.1f} GB free"
        else:
            try:
                result.import_seconds, result.import_diff_id = engine_import(tar, tag)
            except (RuntimeError, subprocess.SubprocessError) as err:
                result.skipped["import"] = str(err)
            finally:
                remove_image(tag)
        if free_bytes() < 2.3 * result.tar_bytes + 2e9:
            result.skipped["load"] = f"{free_bytes() / 1e9:.1f} GB free; load needs twice the tar"
        else:
            try:
                result.load_seconds = engine_load(tar, diff_id, tag)
            except (RuntimeError, OSError) as err:
                result.skipped["load"] = str(err)
            finally:
                remove_image(tag)
    tar.unlink()
    for planned in plan.files.values():
        if planned.path is not None:
            planned.path.unlink(missing_ok=True)
    print(f"  {values.name}: {result.tar_bytes / MB:,.0f} MB tar in {result.assemble_seconds:.1f} s, "
          f"gzip {result.gzip_seconds:.1f} s"
          + (f", import {result.import_seconds:.1f} s" if result.import_seconds is not None else "")
          + (f", load {result.load_seconds:.1f} s" if result.load_seconds is not None else ""), flush=True)
    return result, plan


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def print_report(results: list[LayerResult], phases: dict[str, float], downloads: Downloads,
                 reference: Reference | None, lock_path: Path) -> None:
    print(f"\n== {lock_path}: {sum(r.wheels for r in results)} wheels in {len(results)} layers "
          f"(load average {phases['load_before']:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"{os.cpu_count()} cores)")
    print(f"urls {phases['urls']:.1f} s (uv pip compile) | download {phases['download']:.1f} s: "
          f"{downloads.fetched_bytes / MB:,.0f} MB fetched, {downloads.reused} wheels reused from the cache"
          + (f", failed: {downloads.failed}" if downloads.failed else ""))
    print_table(results)
    print_engine(results, reference)
    if reference:
        print_differences(results, reference)


def _total(results: list[LayerResult], attr: str) -> float | None:
    values = [getattr(r, attr) for r in results]
    return None if not values or any(v is None for v in values) else sum(values)


def print_table(results: list[LayerResult]) -> None:
    columns = (("layer", 12, "name", "s"), ("wheels", 7, "wheels", "d"), ("MB whl", 8, "wheel_bytes", "mb"),
               ("MB tar", 8, "tar_bytes", "mb"), ("assemble", 9, "assemble_seconds", "s1"),
               ("(prune)", 8, "prune_seconds", "s1"), ("gzip", 6, "gzip_seconds", "s1"),
               ("MB gz", 7, "gzip_bytes", "mb"), ("import", 7, "import_seconds", "s1"),
               ("load", 6, "load_seconds", "s1"), ("BK inst", 8, "buildkit_install", "s1"),
               ("BK ln", 6, "buildkit_links", "s1"))

    def cell(value, width: int, kind: str) -> str:
        if kind == "s":
            return f"{value:<{width}}"
        if value is None:
            return f"{'-':>{width}}"
        text = {"d": f"{value}", "mb": f"{value / MB:,.0f}", "s1": f"{value:.1f}"}[kind]
        return f"{text:>{width}}"

    head = "".join(f"{title:<{width}}" if kind == "s" else f"{title:>{width}}" for title, width, _, kind in columns)
    print(head + "\n" + "-" * len(head))
    for r in results:
        print("".join(cell(getattr(r, attr), width, kind) for _, width, attr, kind in columns))
    print("-" * len(head))
    print("".join(cell("total", width, kind) if attr == "name" else cell(_total(results, attr), width, kind)
                  for _, width, attr, kind in columns))
    print(f"gzip: {results[0].gzip_tool if results else '-'}; import/load: the engine untarring and "
          "checksumming the same tar; BK: BuildKit's own step times, when this run's build ran them")


def print_engine(results: list[LayerResult], reference: Reference | None) -> None:
    assemble, imported = _total(results, "assemble_seconds"), _total(results, "import_seconds")
    gzipped = _total(results, "gzip_seconds")
    print("\nagainst the engine, same run:")
    print(f"  assemble / docker import of the same tars          {ratio(assemble, imported)}")
    print(f"  assemble / docker load of the same tars            {ratio(assemble, _total(results, 'load_seconds'))}")
    for r in results:
        if r.import_diff_id:
            agree = "equal" if r.import_diff_id == r.diff_id else f"DIFFERENT: {r.import_diff_id}"
            print(f"  {r.name}: diff_id {r.diff_id[:19]}…, the engine's own after import: {agree}")
    buildkit = reference.buildkit if reference else None
    install = _total(results, "buildkit_install")
    if reference and buildkit is None:
        print(f"  BuildKit: no step times ({reference.image} was in the engine already; nothing was built)")
    elif buildkit and install is None:
        print(f"  BuildKit: this run's build ({reference.build_seconds:.1f} s) took the install steps from its "
              "cache: no step times")
    elif buildkit:
        links = sum(r.buildkit_links or 0 for r in results)
        print(f"  BuildKit: install steps {install:.1f} s (+ links {links:.1f} s), exporting layers "
              f"{seconds(buildkit.export_seconds)} s (every layer of the image), whole build "
              f"{reference.build_seconds:.1f} s")
        if buildkit.export_seconds is not None:
            engine = install + links + buildkit.export_seconds
            print(f"  assemble / (install + links + export)              {ratio(assemble, engine)}")
            if imported is not None:
                print(f"  (assemble + import) / (install + links + export)   {ratio(assemble + imported, engine)}")
            print(f"  (assemble + gzip) / (install + links + export)     {ratio(assemble + gzipped, engine)}")
    for r in results:
        notes = []
        if r.problems:
            notes.append(f"left out: {r.problems}")
        if r.overlaps:
            notes.append(f"{len(r.overlaps)} paths written by two wheels (the later kept): {r.overlaps[:5]}")
        if r.skipped:
            notes.append(f"skipped: {r.skipped}")
        if notes:
            print(f"  {r.name}: " + "; ".join(notes))


def print_differences(results: list[LayerResult], reference: Reference) -> None:
    print(f"\nfile lists against {reference.image} (docker save read in {reference.read_seconds:.1f} s); "
          "compared: path, type, mode, size, link target, crc32 of the contents (not mtimes)")
    for r in results:
        if not r.compared:
            print(f"  {r.name}: no install step of this layer in the image's history")
            continue
        differing = {path for category, paths in r.differences.items() if not category.startswith("only in")
                     for path in paths}
        only_ours = sum(len(paths) for category, paths in r.differences.items()
                        if category.startswith("only assembled"))
        same = r.entries - len(differing) - only_ours
        print(f"  {r.name}: {r.entries} entries assembled, {same} identical in the image"
              + ("; differences:" if r.differences else ""))
        for category, paths in sorted(r.differences.items()):
            shown = ", ".join(paths[:4]) + (" …" if len(paths) > 4 else "")
            print(f"    {len(paths):>6}  {category}: {shown}")


def take_reference(lock, lock_path: Path, layers: tuple[LayerValues, ...]) -> Reference | None:
    """Built (when missing) and read before anything else; an image built here is removed right after,
    so the engine's disk is free again for the import and load of the assembled layers. A reference
    that cannot be had is reported, and the assembly is measured without it."""
    engine = DockerEngine()
    print("reference image", flush=True)
    built = False
    try:
        image, built, build_seconds, buildkit = reference_image(lock, lock_path, engine)
        start = clock()
        entries = read_reference(engine, image, layers)
        return Reference(image, built, build_seconds, buildkit, entries, clock() - start)
    except (ImagebuildError, TarStreamError) as err:
        print(f"  no reference: {type(err).__name__}: {err}", flush=True)
        return None
    finally:
        if built:
            engine.remove(image)
            print(f"  removed {image}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lock", type=Path, default=REPO / "lockfiles" / "sglang-blackwell.lock")
    parser.add_argument("--json", type=Path, help="write every figure and difference here")
    parser.add_argument("--cache", type=Path, default=cache_dir() / "wheels",
                        help="where the wheels are kept (default: imagebuild's wheel cache)")
    parser.add_argument("--no-reference", action="store_true", help="no image comparison, no build")
    parser.add_argument("--no-engine", action="store_true", help="no docker import/load timings")
    args = parser.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", REPRO_EPOCH))
    lock_path = args.lock.resolve()
    lock = read_lock(lock_path)
    recipe = load_recipe(lock_path.parent.parent / "recipes" / f"{lock.recipe}.toml")
    layers = layer_values(lock, prune_specs(lock, recipe))
    phases: dict[str, float] = {"load_before": os.getloadavg()[0]}

    reference = None if args.no_reference else take_reference(lock, lock_path, layers)

    print("wheel urls (uv pip compile)", flush=True)
    start = clock()
    urls = wheel_urls(lock, lock_path)
    phases["urls"] = clock() - start
    print(f"download into {args.cache}", flush=True)
    start = clock()
    downloads = download(lock.wheels, urls, args.cache)
    phases["download"] = clock() - start

    results: list[LayerResult] = []
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-assemble-", dir=args.cache.parent) as tmp:
        for values in layers:
            print(f"layer {values.name}", flush=True)
            try:
                result, plan = measure_layer(values, lock, downloads.paths, Path(tmp), epoch, not args.no_engine)
            except (WheelProblem, zipfile.BadZipFile, OSError, RuntimeError) as err:
                failed[values.name] = f"{type(err).__name__}: {err}"
                print(f"  {values.name}: not written: {failed[values.name]}", flush=True)
                continue
            if reference and values.name in reference.layers:
                result.differences = compare(plan.entries(), reference.layers[values.name])
                result.compared = True
            if reference and reference.buildkit:
                result.add_buildkit(reference.buildkit, values)
            results.append(result)

    print_report(results, phases, downloads, reference, args.lock)
    for name, why in failed.items():
        print(f"  layer {name} was not written: {why}")
    if args.json:
        report = {"lock": str(args.lock), "epoch": epoch, "phases": phases, "failed_layers": failed,
                  "download": {"fetched_bytes": downloads.fetched_bytes, "reused": downloads.reused,
                               "failed": downloads.failed},
                  "layers": [vars(r) for r in results],
                  "reference": None if reference is None else {
                      "image": reference.image, "built_here": reference.built_here,
                      "build_seconds": reference.build_seconds, "read_seconds": reference.read_seconds,
                      "buildkit": None if reference.buildkit is None else {
                          "export_seconds": reference.buildkit.export_seconds,
                          "steps": list(reference.buildkit.steps.values())}}}
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
