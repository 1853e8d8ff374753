"""The kernel cache: [aot]'s compiled kernels kept across builds, keyed by every byte that decides them.

FlashInfer keys its JIT folder by module name and leaves freshness to ninja's timestamps, which know
nothing of nvcc, the host compiler or the headers; here each FlashInfer module is keyed by the sha256 of
every file its compile and link read (kernel_inputs.py: its sources, generated folders, build.ninja, and each
header reachable through the include paths its build.ninja names, so a recipe patch to a header moves the
modules that include it and no other), and by the build-wide half: nvcc's and the host compiler's
`--version`, the Debian toolchain packages, and the releases of every distribution whose headers it
compiles against. A hit is checked against the sha256 its entry.json records; a mismatch is a miss, listed
in the step's stats. SGLang's JIT cache is content-addressed by what its compiler's dependency output lists
(sglang/kernels/jit/utils/compile/cache.py: a leaf is used only when its sources and headers hash to its
name) and is shared as it is, under sglang/<build-wide namespace>; it does not check the module's own
bytes, so each leaf gets a record of its module's sha256 (SGLANG_RECORD, copied into the image with the leaf),
checked before SGLang runs and when a leaf is seeded.

    ROOT/flashinfer/<key>/<module>.so     one module; entry.json says what it was built from
    ROOT/sglang/                          SGLang's own cache root (SGLANG_JIT_CACHE_DIR)
    ROOT/partial/<keys>/                  a compile under way: a copy of FlashInfer's workspace (generated
                                          sources, finished objects, ninja's log and deps)

ROOT is the [aot] step's BuildKit cache mount (MOUNT_ID at MOUNT_DIR): it outlives the layers, so a build whose kernel inputs
did not change compiles nothing even when a layer below rebuilt. Entries are written to a temporary
folder and renamed; a hit refreshes its mtime, and `trim` drops the least recently used entries past
the bound (IMAGEBUILD_KERNEL_CACHE_BYTES, 8 GiB by default). A compile writes its objects into the
cache as it goes (compile_resume.py), so a step interrupted after hours (a CI job's time limit, an OOM, Ctrl-C)
starts again from the objects it finished; a clean end removes them. A fresh runner's engine has an empty mount:
`python kernel_cache.py seed FOLDER ROOT` adds the entries of a folder in the same layout (the kernel layer of
a registry build cache, imagebuild/flows/kernels/layer.py) that ROOT lacks. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

KEY_VERSION = 2  # 2: a module's key holds every file its compile reads (kernel_inputs.py)
MOUNT_ID = "imagebuild-kernels"  # the BuildKit cache mount the [aot] step keeps compiled kernels in
MOUNT_DIR = "/var/cache/imagebuild/kernels"
DEFAULT_BOUND = 8 << 30
# Distributions whose files a FlashInfer module compiles against, by name prefix.
HEADER_DISTRIBUTIONS = ("flashinfer", "nvidia-", "apache-tvm-ffi", "torch")
# Debian packages of the host toolchain: system headers and the compiler nvcc hands host code to.
TOOLCHAIN_DEBS = ("gcc", "g++", "cpp", "libstdc++", "libgcc", "libc6-dev", "linux-libc-dev", "binutils")
PARTIAL = "partial"  # ROOT/partial: compiles under way, resumed by a build of the same keys
SGLANG_RECORD = "imagebuild-module.json"  # beside an SGLang leaf's module: its name and sha256 (record_sglang)
SEED_MARK = "imagebuild-kernel-seed: "  # the seed build's output line: what it added
PID_SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deterministic_pid.c")


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tool_output(command: list) -> str:
    """What a tool prints (its `--version`), or "" when it cannot run."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _distributions() -> list:
    from importlib import metadata
    found = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(HEADER_DISTRIBUTIONS):
            found.add((name, dist.version))
    return sorted(found)


def _toolchain_debs(status: str = "/var/lib/dpkg/status") -> list:
    found, package = [], None
    try:
        with open(status, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Package: "):
                    package = line.split(":", 1)[1].strip()
                elif line.startswith("Version: ") and package and package.startswith(TOOLCHAIN_DEBS):
                    found.append((package, line.split(":", 1)[1].strip()))
    except OSError:
        pass
    return sorted(found)


def fingerprint(cuda_home: str) -> dict:
    """The build-wide half of every key: compilers, toolchain packages, header distributions, target archs."""
    return {"key_version": KEY_VERSION, "machine": platform.machine(),
            "nvcc": tool_output([os.path.join(cuda_home, "bin", "nvcc"), "--version"]),
            "cxx": tool_output(["c++", "--version"]), "debs": _toolchain_debs(), "distributions": _distributions(),
            "arch_list": os.environ.get("FLASHINFER_CUDA_ARCH_LIST", ""),
            "pid_shim": sha256_file(PID_SHIM_SOURCE) if os.path.exists(PID_SHIM_SOURCE) else None}


def digest(parts) -> str:
    """sha256 of a JSON value: a key from its parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def sglang_namespace(build_wide: dict) -> str:
    """The folder SGLang's cache sits in, named by the build-wide key. SGLang keys each module by its own
    inputs (sources, flags, nvcc's and its packages' versions), not by what else decides the bytes here (the
    pid shim, the host compiler, the toolchain's Debian packages): a change there must miss, as it does for
    FlashInfer's modules, whose keys hold the same build-wide half."""
    return digest(build_wide)[:16]


class KernelCache:
    """A folder of kernels by key; `root` None is a cache that holds nothing and keeps nothing."""

    def __init__(self, root: str | None):
        self.root = root
        self.used: set = set()  # entry folders this build read or wrote: never trimmed by it
        self.rejected: list = []  # entries found but not the bytes they record: each a miss

    def _entry(self, key: str) -> str:
        return os.path.join(self.root, "flashinfer", key)

    def find(self, key: str | None, name: str) -> str | None:
        """The module's path when the cache holds it as its entry.json states (name and sha256); an entry that
        does not is a miss, listed in `rejected` and removed, so the compile that follows can store its own."""
        if not self.root or not key:
            return None
        entry = self._entry(key)
        if not os.path.isdir(entry):
            return None
        problem = entry_problem(entry, name)
        if problem:
            self.rejected.append({"kind": "flashinfer", "name": name, "key": key, "problem": problem})
            _discard(entry)
            return None
        os.utime(entry, None)
        self.used.add(entry)
        return os.path.join(entry, f"{name}.so")

    def check_sglang(self, namespace: str) -> list:
        """Every SGLang leaf in the namespace checked against the record imagebuild wrote beside its module
        (record_sglang); a leaf that is not its recorded bytes is removed before SGLang can load it (SGLang
        checks what the module was built from, not the module). Returns what was rejected, also in `rejected`."""
        rejected = []
        root = self.sglang_root(namespace)
        for leaf in sorted(_sglang_leaves(root)) if root else []:
            problem = sglang_leaf_problem(leaf)
            if problem:
                rejected.append({"kind": "sglang", "name": os.path.relpath(leaf, root), "problem": problem})
                _discard(leaf)
        self.rejected += rejected
        return rejected

    def store(self, key: str | None, name: str, built: str) -> str | None:
        """Keep a freshly built module; returns its path in the cache (None: not kept)."""
        if not self.root or not key:
            return None
        entry = self._entry(key)
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(entry))
        shutil.copyfile(built, os.path.join(staging, f"{name}.so"))
        with open(os.path.join(staging, "entry.json"), "w", encoding="utf-8") as out:
            json.dump({"name": name, "sha256": sha256_file(built), "bytes": os.path.getsize(built)}, out)
        try:
            os.rename(staging, entry)
        except OSError:  # another build stored the same key meanwhile: same inputs, same bytes
            shutil.rmtree(staging, ignore_errors=True)
        self.used.add(entry)
        return os.path.join(entry, f"{name}.so")

    def sglang_root(self, namespace: str | None = None) -> str | None:
        """Where SGLang's cache lives in this one: under `namespace` (sglang_namespace) for a build."""
        if not self.root:
            return None
        return os.path.join(self.root, "sglang", namespace) if namespace else os.path.join(self.root, "sglang")

    def partial(self, keys: list) -> str | None:
        """Where a compile of the modules keyed `keys` keeps what it finished (compile_resume.py), or None."""
        if not self.root or not keys or not all(keys):
            return None
        folder = os.path.join(self.root, PARTIAL, digest(sorted(keys)))
        self.used.add(folder)
        return folder

    def trim(self, bound: int) -> dict:
        """Drop least recently used entries (FlashInfer modules, SGLang modules) until the cache fits."""
        if not self.root or not os.path.isdir(self.root):
            return {"bytes": 0, "removed": 0, "bound": bound}
        entries = []
        for folder, depth in ((os.path.join(self.root, "flashinfer"), 1), (self.sglang_root(), 3),
                              (os.path.join(self.root, PARTIAL), 1)):
            for path in _entries(folder, depth):
                entries.append((os.path.getmtime(path), _size(path), path))
        total, removed = sum(size for _, size, _ in entries), 0
        for _, size, path in sorted(entries):
            if total <= bound:
                break
            if path in self.used or any(used.startswith(path + os.sep) for used in self.used):
                continue
            shutil.rmtree(path, ignore_errors=True)
            total, removed = total - size, removed + 1
        return {"bytes": total, "removed": removed, "bound": bound}


    def seed(self, source: str) -> dict:
        """Add the entries of `source` (this cache's layout) that the cache lacks, each by a rename: a FlashInfer
        entry whose module matches its entry.json's sha256, and an SGLang leaf whose module matches its record.
        Nothing present is overwritten. Returns how many were added, already here, and refused."""
        counts = {"flashinfer": 0, "sglang": 0, "present": 0, "refused": 0}
        if not self.root:
            return counts
        for entry in _entries(os.path.join(source, "flashinfer"), 1):
            key = os.path.basename(entry)
            if not _is_key(key) or entry_problem(entry):
                counts["refused"] += 1
            elif os.path.isdir(self._entry(key)):
                counts["present"] += 1
            else:
                counts["flashinfer"] += _copy_in(entry, self._entry(key))
        shared = os.path.join(source, "sglang")
        for leaf in sorted(_sglang_leaves(shared)):
            target = os.path.join(self.sglang_root(), os.path.relpath(leaf, shared))
            if sglang_leaf_problem(leaf):
                counts["refused"] += 1
            elif os.path.isdir(target):
                counts["present"] += 1
            else:
                counts["sglang"] += _copy_in(leaf, target)
        return counts


def _is_key(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def entry_problem(entry: str, name: str | None = None) -> str | None:
    """Why a FlashInfer entry is not what its entry.json states (one module, by name and sha256); None when it is."""
    try:
        with open(os.path.join(entry, "entry.json"), encoding="utf-8") as handle:
            record = json.load(handle)
        stated = record["name"]
        if not isinstance(stated, str) or os.path.basename(stated) != stated or (name is not None and stated != name):
            return f"entry.json names {stated!r}, not {name!r}"
        found = sha256_file(os.path.join(entry, f"{stated}.so"))
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"unreadable: {type(error).__name__}: {error}"
    return None if found == record["sha256"] else f"sha256 {found}, entry.json states {record['sha256']}"


def record_sglang(leaf: str) -> bool:
    """Write the record of an SGLang leaf's module (SGLANG_RECORD: its name and sha256), once, through a temporary
    name; True when written."""
    if os.path.exists(os.path.join(leaf, SGLANG_RECORD)):
        return False
    modules = sorted(name for name in os.listdir(leaf) if name.endswith(".so"))
    if len(modules) != 1:
        return False
    record = {"name": modules[0], "sha256": sha256_file(os.path.join(leaf, modules[0]))}
    temporary = os.path.join(leaf, f".{SGLANG_RECORD}.tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(record, out, sort_keys=True)
    os.replace(temporary, os.path.join(leaf, SGLANG_RECORD))
    return True


def sglang_leaf_problem(leaf: str) -> str | None:
    """Why an SGLang leaf is not the module its record states; None when it is."""
    try:
        with open(os.path.join(leaf, SGLANG_RECORD), encoding="utf-8") as handle:
            record = json.load(handle)
        modules = sorted(name for name in os.listdir(leaf) if name.endswith(".so"))
        if modules != [record["name"]]:
            return f"the leaf holds {modules}, its record names {record['name']!r}"
        found = sha256_file(os.path.join(leaf, record["name"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"no readable record: {type(error).__name__}: {error}"
    return None if found == record["sha256"] else f"sha256 {found}, the record states {record['sha256']}"


def _discard(folder: str) -> None:
    """Remove a rejected entry: renamed aside first, so no reader sees it half removed."""
    aside = os.path.join(os.path.dirname(folder), f".rejected-{os.path.basename(folder)}-{os.getpid()}")
    try:
        os.rename(folder, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _sglang_leaves(folder: str) -> set:
    """SGLang's published cache leaves under folder: `deps-*` folders holding a built module."""
    found = set()
    for root, _, files in os.walk(folder):
        if os.path.basename(root).startswith("deps-") and any(name.endswith(".so") for name in files):
            found.add(root)
    return found


def _copy_in(source: str, target: str) -> int:
    """Copy a folder to target through a staging folder beside it and a rename; 1 when it was added."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(target))
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        os.rename(staging, target)
        return 1
    except OSError:  # another build added it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
        return 0


def _entries(folder: str, depth: int) -> list:
    """Folders `depth` levels below folder (SGLang's: <namespace>/<target>/<module>)."""
    level = [folder]
    for _ in range(depth):
        level = [os.path.join(parent, name) for parent in level if os.path.isdir(parent)
                 for name in sorted(os.listdir(parent)) if not name.startswith(".")]
    return [path for path in level if os.path.isdir(path)]


def _size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def bound() -> int:
    value = os.environ.get("IMAGEBUILD_KERNEL_CACHE_BYTES", "")
    return int(value) if value.isdigit() else DEFAULT_BOUND


def build_pid_shim(folder: str) -> str:
    """Compile deterministic_pid.c into folder; returns the library to put in LD_PRELOAD."""
    target = os.path.join(folder, "deterministic_pid.so")
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["c++", "-x", "c", "-shared", "-fPIC", "-O2", PID_SHIM_SOURCE, "-o", target], check=True)
    return target


def jobs(cpus: int | None = None, available: int | None = None, per_job: int = 2 << 30) -> int:
    """Compiles run at once: one per core the step may use, and no more than 2 GiB of available memory each
    (nvcc's peak on FlashInfer's attention units is reported in the manifest). IMAGEBUILD_AOT_JOBS overrides."""
    value = os.environ.get("IMAGEBUILD_AOT_JOBS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if available is None:
        available = _mem_available()
    by_memory = available // per_job if available else cpus
    return max(1, min(cpus, by_memory))


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def main(argv: list) -> int:
    if len(argv) == 3 and argv[0] == "seed":
        print(SEED_MARK + json.dumps(KernelCache(argv[2]).seed(argv[1]), sort_keys=True))
        return 0
    print("usage: kernel_cache.py seed FOLDER ROOT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
