"""The environment as the probe reads it: the payload's `--inventory` run under an interpreter or in
a container of an image, and its JSON read back into plain typed values.

    take_inventory(python)                 the probe under that interpreter
    take_inventory_in_image(image, engine) the same in a throwaway container of the image (network off)
    read_inventory(raw, where)             the report checked and typed; anything else is one AdoptError
                                           naming the key, never a crash or a guess
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from imagebuild.common import host_arch
from imagebuild.engine import Engine
from imagebuild.errors import ImagebuildError
from imagebuild.payload.probe import bundle

PROBE_TIMEOUT_S = 600  # hashing every installed file of a 10 GB stack takes a while
_IN_IMAGE = ('for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$@" '
             '--inventory; fi; done; echo "imagebuild adopt: no python3 or python on PATH in this image" >&2; '
             'exit 127')


class AdoptError(ImagebuildError):
    """An environment adopt cannot read or turn into a recipe as asked; the message says what to do."""


@dataclass(frozen=True)
class Interpreter:
    executable: str
    real_executable: str
    prefix: str
    version: str  # sys.version
    version_info: tuple[int, int, int]
    implementation: str
    machine: str
    in_venv: bool

    @property
    def python(self) -> str:
        return f"{self.version_info[0]}.{self.version_info[1]}"

    def describe(self) -> str:
        venv = "a venv" if self.in_venv else "not a venv"
        return f"{self.executable} (Python {'.'.join(map(str, self.version_info))}, prefix {self.prefix}, {venv})"


@dataclass(frozen=True)
class ModifiedFile:
    path: str  # relative to the distribution's site folder, as RECORD writes it
    record: str  # the hash RECORD holds: what was installed
    actual: str | None  # the hash on disk now
    size: int
    inside: bool  # in the site folder (a patch can reach it), not ../../bin
    content: bytes | None  # the file as it is now; None when the probe left it out
    omitted: str = ""  # why content is None


@dataclass(frozen=True)
class Origin:
    """Where a distribution came from, per its direct_url.json (PEP 610): an index when there is none."""

    kind: str  # index | editable | vcs | path | url | unrecorded | unknown
    url: str = ""
    detail: str = ""

    @property
    def reproducible(self) -> bool:
        return self.kind == "index"


@dataclass(frozen=True)
class Installed:
    name: str  # canonical
    version: str
    location: str
    dist_info: str
    installer: str | None
    origin: Origin
    requires: tuple[str, ...]
    extras: tuple[str, ...]
    modified: tuple[ModifiedFile, ...] = ()
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str | None


@dataclass(frozen=True)
class Inventory:
    where: str  # how it was taken: "--python PATH" or "image NAME"
    interpreter: Interpreter
    markers: dict[str, str]
    distributions: tuple[Installed, ...]  # those the interpreter imports (shadowed ones left out)
    added: tuple[str, ...]  # files no RECORD lists, as LOCATION/PATH
    added_total: int
    links: tuple[tuple[str, str], ...]  # symbolic links no RECORD lists: (LOCATION/PATH, target)
    venv_tool: tuple[str, ...]
    torch_version: str | None
    torch_cuda: str | None
    toolchain: tuple[tuple[str, str, bool], ...]  # (name, version, ships nvcc)
    gpus: tuple[Gpu, ...]
    driver: str | None
    driver_source: str | None
    shadowed: tuple[tuple[str, str, str], ...] = field(default=())  # (name, version, location)

    @property
    def by_name(self) -> dict[str, Installed]:
        return {d.name: d for d in self.distributions}


# ---- taking it -----------------------------------------------------------------------------------

def _payload() -> list:
    """The probe's zipapp as the arguments bundle.BOOTSTRAP unpacks."""
    try:
        return bundle.inline_args()
    except ValueError as err:
        raise AdoptError(str(err)) from None


def take_inventory(python: str, *, timeout: float = PROBE_TIMEOUT_S) -> Inventory:
    """Run the inventory probe under `python`; a path that is no Python interpreter is one AdoptError."""
    where = f"--python {python}"
    if not os.path.exists(python):
        raise AdoptError(f"--python {python}: no such file; give the interpreter of the environment to adopt "
                         "(a venv's is VENV/bin/python)")
    if os.path.isdir(python) or not os.access(python, os.X_OK):
        raise AdoptError(f"--python {python}: not an executable file, so not a Python interpreter; give the "
                         "environment's interpreter (a venv's is VENV/bin/python)")
    try:
        done = subprocess.run([python, "-c", bundle.BOOTSTRAP, *_payload(), "--inventory"], capture_output=True,
                              text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL, env=_environment())
    except OSError as err:
        raise AdoptError(f"--python {python}: cannot be run ({err.strerror or err}), so not a Python interpreter")
    except subprocess.TimeoutExpired:
        raise AdoptError(f"--python {python}: the inventory probe did not finish in {timeout:.0f} s") from None
    return read_inventory(_json(done.stdout, done.returncode, done.stderr, where), where)


def take_inventory_in_image(image: str, engine: Engine, *, python: str | None = None,
                            timeout: float = PROBE_TIMEOUT_S) -> Inventory:
    """The probe in a throwaway container of the image (network off; the host's GPUs where it has them
    and the image is of its platform, so nvidia-smi answers), under `python` or the image's python3."""
    where = f"image {image}" + (f" --python {python}" if python else "")
    engine.check()
    info = engine.require(image)
    native = (info.platform or "linux/amd64").split("/")[1:2] == [host_arch()]
    gpus = native and os.path.exists("/dev/nvidiactl")
    payload = _payload()
    command = [python, "-c", bundle.BOOTSTRAP, *payload, "--inventory"] if python else \
        ["sh", "-c", _IN_IMAGE, "sh", bundle.BOOTSTRAP, *payload]
    result = engine.run(image, command, network=False, gpus=gpus, timeout=timeout)
    if result.timed_out:
        raise AdoptError(f"{where}: the inventory probe did not finish in {timeout:.0f} s")
    return read_inventory(_json(result.stdout, result.exit_code, result.stderr, where), where)


def _environment() -> dict[str, str]:
    """This process's variables less PYTHONPATH: the environment is what the interpreter has installed,
    not the folders a shell adds to it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _json(stdout: str, status, stderr: str, where: str) -> dict:
    try:
        raw = json.loads(stdout)
    except (json.JSONDecodeError, TypeError):
        raw = None
    if not isinstance(raw, dict) or raw.get("mode") != "inventory":
        tail = (stderr or stdout or "").strip()[-1500:]
        old = "; the probe needs Python 3.9 or newer" if "SyntaxError" in tail else ""
        raise AdoptError(f"{where}: not a Python interpreter the inventory probe runs under (exit {status}, "
                         f"no report){old}: {tail or 'it printed nothing'}")
    return raw


# ---- reading it ----------------------------------------------------------------------------------

class _Read:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, problem: str) -> AdoptError:
        return AdoptError(f"{self.where}: the inventory probe's report cannot be read: [{key}] {problem}; "
                          "run the probe of this imagebuild (an older or altered one writes another format)")

    def get(self, table, key: str, kind, where: str, *, optional: bool = False):
        if not isinstance(table, dict):
            raise self.fail(where, f"expected an object, got {type(table).__name__}")
        value = table.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise self.fail(f"{where}.{key}" if where else key, f"expected {names}, got {type(value).__name__}")
        return value

    def strings(self, table, key: str, where: str) -> tuple[str, ...]:
        values = self.get(table, key, list, where)
        for index, value in enumerate(values):
            if not isinstance(value, str):
                raise self.fail(f"{where}.{key}[{index}]", f"expected str, got {type(value).__name__}")
        return tuple(values)


def origin_of(direct_url, has_record: bool) -> Origin:
    """PEP 610's direct_url.json (as the probe read it) -> where the distribution came from."""
    if direct_url is None:
        return Origin("index") if has_record else Origin("unrecorded", detail="no RECORD")
    if not isinstance(direct_url, dict) or "unreadable" in direct_url:
        why = direct_url.get("unreadable") if isinstance(direct_url, dict) else "not an object"
        return Origin("unknown", detail=f"direct_url.json unreadable: {why}")
    url = direct_url.get("url") if isinstance(direct_url.get("url"), str) else ""
    dir_info, vcs, archive = (direct_url.get(k) for k in ("dir_info", "vcs_info", "archive_info"))
    if isinstance(dir_info, dict) and dir_info.get("editable") is True:
        return Origin("editable", url)
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id") if isinstance(vcs.get("commit_id"), str) else ""
        return Origin("vcs", url, f"{vcs.get('vcs', 'vcs')} {commit}".strip())
    if isinstance(dir_info, dict) or url.startswith("file:"):
        return Origin("path", url)
    if isinstance(archive, dict):
        return Origin("url", url)
    return Origin("unknown", url, "direct_url.json names no dir_info, vcs_info or archive_info")


def _modified(read: _Read, entry, where: str) -> ModifiedFile:
    content = read.get(entry, "content", str, where, optional=True)
    data = None
    if content is not None:
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise read.fail(f"{where}.content", "not base64") from None
    return ModifiedFile(read.get(entry, "path", str, where), read.get(entry, "record", str, where),
                        read.get(entry, "actual", str, where, optional=True), read.get(entry, "size", int, where),
                        bool(read.get(entry, "inside", bool, where)), data,
                        read.get(entry, "omitted", str, where, optional=True) or "")


def _distribution(read: _Read, entry, where: str) -> Installed:
    record = read.get(entry, "record", bool, where)
    modified = read.get(entry, "modified", list, where, optional=True) or []
    return Installed(
        canonicalize_name(read.get(entry, "name", str, where)), read.get(entry, "version", str, where),
        read.get(entry, "location", str, where), read.get(entry, "dist_info", str, where),
        read.get(entry, "installer", str, where, optional=True), origin_of(entry.get("direct_url"), record),
        read.strings(entry, "requires", where), read.strings(entry, "extras", where),
        tuple(_modified(read, m, f"{where}.modified[{i}]") for i, m in enumerate(modified)),
        read.strings(entry, "missing", where) if entry.get("missing") is not None else ())


def read_inventory(raw, where: str) -> Inventory:
    read = _Read(where)
    if not isinstance(raw, dict) or raw.get("mode") != "inventory":
        raise read.fail("mode", "not an inventory report")
    if isinstance(raw.get("error"), str):
        raise AdoptError(f"{where}: the inventory probe stopped: {raw['error']}")
    if raw.get("format") != 1:
        raise read.fail("format", f"format {raw.get('format')!r}, this imagebuild reads format 1")
    it = read.get(raw, "interpreter", dict, "")
    info = read.get(it, "version_info", list, "interpreter")
    if len(info) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in info):
        raise read.fail("interpreter.version_info", "expected three integers")
    strings = [read.get(it, k, str, "interpreter") for k in ("executable", "real_executable", "prefix", "version")]
    interpreter = Interpreter(*strings, tuple(info), read.get(it, "implementation", str, "interpreter"),
                              read.get(it, "machine", str, "interpreter"), read.get(it, "in_venv", bool, "interpreter"))
    markers = read.get(raw, "markers", dict, "")
    for key, value in markers.items():
        if not isinstance(value, str):
            raise read.fail(f"markers.{key}", f"expected str, got {type(value).__name__}")
    dists, shadowed = [], []
    for index, entry in enumerate(read.get(raw, "distributions", list, "")):
        dist = _distribution(read, entry, f"distributions[{index}]")
        if read.get(entry, "shadowed", bool, f"distributions[{index}]"):
            shadowed.append((dist.name, dist.version, dist.location))
        else:
            dists.append(dist)
    unowned = read.get(raw, "unowned", dict, "")
    added = []
    for index, entry in enumerate(read.get(unowned, "files", list, "unowned")):
        added.append(os.path.join(read.get(entry, "location", str, f"unowned.files[{index}]"),
                                  read.get(entry, "path", str, f"unowned.files[{index}]")))
    links = []
    for index, entry in enumerate(read.get(unowned, "links", list, "unowned")):
        where_ = f"unowned.links[{index}]"
        links.append((os.path.join(read.get(entry, "location", str, where_), read.get(entry, "path", str, where_)),
                      read.get(entry, "target", str, where_)))
    torch = read.get(raw, "torch", dict, "")
    toolchain = tuple((read.get(t, "name", str, f"toolchain[{i}]"), read.get(t, "version", str, f"toolchain[{i}]"),
                       read.get(t, "nvcc", bool, f"toolchain[{i}]"))
                      for i, t in enumerate(read.get(raw, "toolchain", list, "")))
    driver = read.get(raw, "driver", dict, "")
    gpus = tuple(Gpu(read.get(g, "name", str, f"driver.gpus[{i}]"), read.get(g, "compute_cap", str, f"driver.gpus[{i}]",
                                                                             optional=True))
                 for i, g in enumerate(read.get(driver, "gpus", list, "driver")))
    return Inventory(where, interpreter, dict(markers), tuple(dists), tuple(added),
                     read.get(unowned, "total", int, "unowned"), tuple(links),
                     read.strings(unowned, "venv_tool", "unowned"),
                     read.get(torch, "version", str, "torch", optional=True) if torch.get("installed") else None,
                     read.get(torch, "cuda", str, "torch", optional=True) if torch.get("installed") else None,
                     toolchain, gpus, read.get(driver, "version", str, "driver", optional=True),
                     read.get(driver, "source", str, "driver", optional=True), tuple(shadowed))
