"""Which files importing some modules reads, on the image's own Python: `python3 record_reads.py MODULE...`.

Run inside an image by `--prefetch-import` (imagebuild/flows/prefetch.py), so eStargz layers put those files
first and a lazy consumer fetches them in one range when it mounts the layer. The files are those Python
opened (the `open` audit event, which every import of a .py or .pyc raises) and those the dynamic loader
mapped (/proc/self/maps: extension modules and the libraries they link), as real paths of regular files.

A mapped library is mostly not read: the loader touches its headers, symbols and relocations, not the
GPU code that makes most of a CUDA library's size. So the shared libraries under the interpreter's paths
are dropped from the page cache first (posix_fadvise DONTNEED), and after the import each mapped file's
resident pages (mincore) say which of its CHUNK-sized pieces the import touched.
Prints one JSON object on its last line: {"imported": [...], "failed": {module: error}, "files": [...],
"chunks": {path: [touched, total]}, "evicted": N}.
"""

import json
import os
import sys

try:  # an image's Python may lack ctypes (libffi): then no library is measured, each is prefetched whole
    import ctypes
    import mmap
except ImportError:
    ctypes = mmap = None

CHUNK = 4 << 20  # eStargz's chunk: the unit a lazy consumer fetches a file's data in
SKIP = ("/proc/", "/sys/", "/dev/")


def evict(roots):
    """Drop the page cache of every shared library under roots; how many files were told to."""
    told = 0
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                if ".so" not in name:
                    continue
                try:
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    told += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return told


def touched_chunks(path, mincore):
    """[chunks with a resident page, chunks] of a file, or None when mincore cannot say."""
    size = os.path.getsize(path)
    total = (size + CHUNK - 1) // CHUNK
    if not size:
        return [0, 0]
    try:
        with open(path, "rb") as handle:
            view = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)  # writable: ctypes takes its address
    except (OSError, ValueError):
        return None
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    if mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) != 0:
        return None
    resident = bytes(vector)
    per_chunk = CHUNK // mmap.PAGESIZE
    touched = sum(1 for start in range(0, pages, per_chunk) if resident[start:start + per_chunk].strip(b"\0"))
    return [touched, total]  # the mapping is left to the process's end: ctypes holds a pointer into it


def main(modules):
    opened = []

    def hook(event, args):
        if event == "open" and args:
            try:
                path = os.fsdecode(os.fspath(args[0]))
            except TypeError:  # a file descriptor
                return
            opened.append(os.path.abspath(path))

    roots = sorted({p for p in sys.path if os.path.isdir(p)} | {"/usr/lib", "/usr/local/lib", "/opt"})
    evicted = evict([r for r in roots if os.path.isdir(r)]) if ctypes is not None else 0
    sys.addaudithook(hook)
    imported, failed = [], {}
    for name in modules:
        try:
            __import__(name)
            imported.append(name)
        except BaseException as err:  # the host reports it; a prefetch list from a failed import means little
            failed[name] = "%s: %s" % (type(err).__name__, err)
    with open("/proc/self/maps") as maps:
        mapped = [line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6]
    files, chunks = set(), {}
    for path in opened + [p for p in mapped if p.startswith("/")]:
        real = os.path.realpath(path.replace(" (deleted)", ""))
        if os.path.isfile(real) and not real.startswith(SKIP):
            files.add(real)
    if ctypes is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        for path in {os.path.realpath(p.replace(" (deleted)", "")) for p in mapped if p.startswith("/")} & files:
            counted = touched_chunks(path, libc.mincore)
            if counted is not None:
                chunks[path] = counted
    print(json.dumps({"imported": imported, "failed": failed, "files": sorted(files), "chunks": chunks,
                      "evicted": evicted}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
