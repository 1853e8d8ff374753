"""What in a site-packages tree the stack cannot use on the target GPU: prune candidates.

Four kinds, each read from the files themselves (stdlib only, nothing imported or loaded):
- unloadable: a shared library that needs (DT_NEEDED) a library nothing in the image provides,
  e.g. a CUDA 12 build needing libcudart.so.12 in a CUDA 13 image; the host's driver libraries
  (libcuda.so.1, libnvidia-*) count as provided;
- no-code-for-target: a shared library that is mostly CUDA fat binary (FATBIN_SHARE) and holds no
  SASS the target can run (same major, minor at most the target's) and no PTX it could JIT, e.g.
  FlashAttention 3's sm_80/sm_86/sm_90a-only build on an SM120 GPU;
- static-archive: *.a files, which only a linker reads;
- debug-sections: .debug_* sections of ELF files, which only debuggers read.

    python probe.pyz --waste 120 [--site DIR]
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import asdict, dataclass

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, 2
MIN_REPORTED = 1 << 20  # candidates smaller than this are not worth a recipe line
# A library whose fat binary is a small part of it keeps its GPU code elsewhere (cuFFT loads its
# kernels from its own data at run time; its .nv_fatbin is 672 bytes of sm_75): no verdict on it.
FATBIN_SHARE = 0.5
DT_NEEDED = 1
SYSTEM_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/x86_64-linux-gnu",
                       "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                       "/usr/local/lib")
HOST_DRIVER_PREFIXES = ("libcuda.so", "libnvidia-", "libnvcuvid.so", "libnvoptix.so")


@dataclass
class Candidate:
    path: str  # relative to site-packages
    distribution: str
    kind: str  # unloadable, no-code-for-target, static-archive, debug-sections
    bytes: int  # what pruning it gives back
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


def elf_sections(path: str) -> dict[str, tuple[int, int]]:
    """Section name -> (file offset, size) for a 64-bit little-endian ELF file; {} for anything else."""
    try:
        with open(path, "rb") as file:
            head = file.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return {}
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            if shentsize != 64 or not 0 < shnum < 65280 or shstrndx >= shnum:
                return {}
            file.seek(shoff)
            table = file.read(shnum * 64)
            if len(table) < shnum * 64:
                return {}
            headers = [struct.unpack_from("<IIQQQQ", table, i * 64) for i in range(shnum)]
            names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
            file.seek(names_at)
            names = file.read(min(names_size, 1 << 20))
    except OSError:
        return {}
    sections = {}
    for name_offset, kind, _, _, offset, size in headers:
        end = names.find(b"\0", name_offset)
        if 0 <= name_offset < len(names) and end >= 0:
            sections[names[name_offset:end].decode("ascii", "replace")] = (offset, size if kind != 8 else 0)
    return sections


def needed_libraries(path: str, sections: dict[str, tuple[int, int]]) -> list[str]:
    """The DT_NEEDED names of an ELF file's dynamic section."""
    dynamic, strings = sections.get(".dynamic"), sections.get(".dynstr")
    if not dynamic or not strings:
        return []
    try:
        with open(path, "rb") as file:
            file.seek(dynamic[0])
            entries = file.read(min(dynamic[1], 1 << 20))
            file.seek(strings[0])
            names = file.read(min(strings[1], 16 << 20))
    except OSError:
        return []
    needed = []
    for position in range(0, len(entries) - 15, 16):
        tag, value = struct.unpack_from("<qQ", entries, position)
        if tag == 0:
            break
        end = names.find(b"\0", value) if tag == DT_NEEDED and value < len(names) else -1
        if end >= 0:
            needed.append(names[value:end].decode("utf-8", "replace"))
    return needed


def system_libraries(folders=SYSTEM_LIBRARY_DIRS) -> set[str]:
    """Library file names in the system's library folders (and LD_LIBRARY_PATH's)."""
    names = set()
    for folder in (*folders, *os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        try:
            entries = os.listdir(folder) if folder else []
        except OSError:
            continue
        names.update(entry for entry in entries if ".so" in entry)
    return names


def fatbin_code(path: str, offset: int, size: int) -> tuple[set[int], set[int]]:
    """(SASS archs, PTX archs) of the fat binaries in a .nv_fatbin section: 90 for sm_90/sm_90a."""
    sass, ptx = set(), set()
    try:
        with open(path, "rb") as file:
            position, end = offset, offset + size
            while position + 16 <= end:
                file.seek(position)
                magic, _, header_size, fat_size = struct.unpack("<IHHQ", file.read(16))
                if magic != FATBIN_MAGIC:
                    position += 8  # blobs sit on 8-byte boundaries, padding between them
                    continue
                entry, blob_end = position + header_size, min(position + header_size + fat_size, end)
                while entry + 32 <= blob_end:
                    file.seek(entry)
                    head = file.read(32)
                    kind, _, entry_header, payload = struct.unpack_from("<HHIQ", head, 0)
                    arch, = struct.unpack_from("<I", head, 28)
                    if entry_header < 32:
                        break
                    (ptx if kind == KIND_PTX else sass if kind == KIND_SASS else set()).add(arch)
                    entry += entry_header + payload
                position = max(blob_end, position + 16)
                position += -position % 8
    except (OSError, struct.error):
        pass
    return sass, ptx


def runs_on(sass: set[int], ptx: set[int], target: int) -> bool:
    """SASS runs on GPUs of its major with an equal or higher minor; PTX JIT-compiles forward."""
    return any(a // 10 == target // 10 and a <= target for a in sass) or any(a <= target for a in ptx)


def _owners(site: str) -> dict[str, str]:
    """Path relative to site -> distribution name, from every RECORD."""
    owners = {}
    for entry in os.listdir(site):
        if not entry.endswith(".dist-info"):
            continue
        name = entry[:-len(".dist-info")].rsplit("-", 1)[0]
        try:
            with open(os.path.join(site, entry, "RECORD"), encoding="utf-8", errors="replace") as file:
                for line in file:
                    owners[line.split(",", 1)[0]] = name
        except OSError:
            continue
    return owners


def _archs(archs: set[int]) -> str:
    return ", ".join(f"sm_{a}" for a in sorted(archs)) or "none"


def find_waste(site: str, target: int, folders=SYSTEM_LIBRARY_DIRS) -> list[Candidate]:
    owners = _owners(site)
    files = [os.path.join(folder, name) for folder, _, names in os.walk(site) for name in names]
    # What a library can be found by: anything under site-packages (rpaths point there), the system's.
    provided = {os.path.basename(path) for path in files if ".so" in os.path.basename(path)}
    provided |= system_libraries(folders)
    found = []
    for full in files:
        name = os.path.basename(full)
        relative = os.path.relpath(full, site).replace(os.sep, "/")
        try:
            info = os.lstat(full)
        except OSError:
            continue
        size = info.st_size
        if size < MIN_REPORTED or stat.S_ISLNK(info.st_mode):
            continue
        owner = owners.get(relative, "?")
        if name.endswith(".a"):
            found.append(Candidate(relative, owner, "static-archive", size, "read only by a linker"))
            continue
        sections = elf_sections(full)
        if not sections:
            continue
        missing = [lib for lib in needed_libraries(full, sections)
                   if lib not in provided and not lib.startswith(HOST_DRIVER_PREFIXES)]
        if missing:
            found.append(Candidate(relative, owner, "unloadable", size,
                                   f"needs {', '.join(missing)}, which nothing in the image provides"))
            continue
        fatbin = sections.get(".nv_fatbin")
        if fatbin and fatbin[1] >= FATBIN_SHARE * size:
            sass, ptx = fatbin_code(full, *fatbin)
            if (sass or ptx) and not runs_on(sass, ptx, target):
                found.append(Candidate(relative, owner, "no-code-for-target", size,
                                       f"SASS {_archs(sass)}; PTX {_archs(ptx)}: nothing sm_{target} runs"))
                continue
        debug = sum(size for section, (_, size) in sections.items() if section.startswith(".debug_"))
        if debug >= MIN_REPORTED:
            found.append(Candidate(relative, owner, "debug-sections", debug,
                                   f"{debug / 1e6:.0f} MB of .debug_* sections"))
    return sorted(found, key=lambda c: (-c.bytes, c.path))
