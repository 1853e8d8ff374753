"""The probe as one zipapp: packed for images, and shipped as arguments to any other interpreter.

Its modules import each other only relatively, so inside the zip the package is the top-level
`imagebuild_probe` and the zip's __main__.py runs its CLI: `python probe.pyz --expect ...` under any
Python >= 3.9, with nothing else installed. The bytes depend on the package's source alone: entries
in sorted order, one fixed timestamp and mode, stored uncompressed (zlib versions deflate differently),
so two renders of one checkout give the same file and the image stays reproducible. The zip is written
here rather than by zipapp.create_archive, which takes each entry's time and mode from the disk.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import zipfile
import zlib

PACKAGE = "imagebuild_probe"  # the package's name inside the zip
ZIP_MAIN = f"import sys\n\nfrom {PACKAGE}.cli import main\n\nsys.exit(main())\n"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold
ZIP_MODE = (stat.S_IFREG | 0o644) << 16
SOURCE = os.path.dirname(os.path.abspath(__file__))

# How doctor runs the zipapp under another interpreter or in a container, where no file of ours
# exists: `python -c BOOTSTRAP COUNT CHUNK... ARGS...`, COUNT CHUNK... being inline_args(): the zipapp,
# compressed and base64, cut into COUNT arguments, since Linux takes one argument of at most 128 KiB
# (MAX_ARG_STRLEN) but some 2 MiB of them in all (ARG_MAX, with the environment). The working folder
# leaves sys.path first (its modules must not shadow the stdlib), and the zip goes to a temporary
# file for zipimport. Kept free of Python 3 syntax: an old interpreter fails on the package's own
# code, with a SyntaxError that doctor recognises.
BOOTSTRAP = f"""\
import sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import base64, os, tempfile, zlib
count = int(sys.argv[1])
handle, path = tempfile.mkstemp(prefix="imagebuild-probe-", suffix=".pyz")
try:
    with os.fdopen(handle, "wb") as out:
        out.write(zlib.decompress(base64.b64decode("".join(sys.argv[2:2 + count]))))
    sys.argv[:2 + count] = [path]
    sys.path.insert(0, path)
    from {PACKAGE}.cli import main
    status = main()
finally:
    os.unlink(path)
sys.exit(status)
"""


def sources(folder: str = SOURCE) -> list:
    """(name in the zip, bytes) of every module in the package folder and its subpackages, in sorted order."""
    names = sorted(os.path.relpath(os.path.join(here, name), folder).replace(os.sep, "/")
                   for here, subfolders, found in os.walk(folder) if "__pycache__" not in here.split(os.sep)
                   for name in found if name.endswith(".py"))
    files = [("__main__.py", ZIP_MAIN.encode())]
    for name in names:
        with open(os.path.join(folder, *name.split("/")), "rb") as handle:
            files.append((f"{PACKAGE}/{name}", handle.read()))
    return files


def zipapp_bytes(folder: str = SOURCE) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in sources(folder):
            entry = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            entry.external_attr, entry.create_system = ZIP_MODE, 3  # 3: Unix, wherever it is built
            archive.writestr(entry, data)
    return buffer.getvalue()


def write_zipapp(path, folder: str = SOURCE):
    """Write the zipapp to path (a build context's imagebuild/probe.pyz); return path."""
    with open(path, "wb") as out:
        out.write(zipapp_bytes(folder))
    return path


ARG_CHUNK = 100_000  # characters per argument, under MAX_ARG_STRLEN (131072 bytes with its NUL)
MAX_INLINE = 1_000_000  # characters in all: half of ARG_MAX's usual 2 MiB, the rest for the environment


def inline_payload(folder: str = SOURCE) -> str:
    """The zipapp as ASCII: zlib-compressed, then base64."""
    return base64.b64encode(zlib.compress(zipapp_bytes(folder), 9)).decode("ascii")


def inline_args(folder: str = SOURCE) -> list:
    """The arguments BOOTSTRAP takes before the probe's own: how many chunks, then the chunks of
    inline_payload(), each at most ARG_CHUNK characters. ValueError past MAX_INLINE characters in all."""
    payload = inline_payload(folder)
    if len(payload) > MAX_INLINE:
        raise ValueError(f"the probe's zipapp has grown to {len(payload)} characters (compressed, base64), past "
                         f"the {MAX_INLINE} a command line can carry beside its environment")
    chunks = [payload[start:start + ARG_CHUNK] for start in range(0, len(payload), ARG_CHUNK)]
    return [str(len(chunks)), *chunks]
