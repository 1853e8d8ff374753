"""Drop what the image's stack cannot use from an installed distribution, and keep its RECORD true.

Run inside the image in the same step that installs the distribution, so the bytes never reach a
layer (stdlib only, Python >= 3.9; apply_patch.py sits beside it for RECORD handling):

    python prune.py SITE_PACKAGES SPEC.json

SPEC.json is a list of {"package", "remove": [glob], "strip_debug": [glob], "reason"} from the
recipe's [[prune]] tables. A glob is matched against the paths in the distribution's RECORD (`*`
within one path segment, `**` across any number) and must match at least one file: when a release
moves its files, the build stops instead of silently keeping them. A removed extension module
leaves a small module of the same name that raises ImportError with the reason, and
<dist-info>/IMAGEBUILD_PRUNED lists what went and why.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import apply_patch  # noqa: E402  (beside this file in the build context)

PRUNED_FILE = "IMAGEBUILD_PRUNED"
ELF_MAGIC = b"\x7fELF"
TOMBSTONE = '''"""Removed from this image by imagebuild: {reason}"""
raise ImportError({message!r})
'''


class PruneError(Exception):
    pass


def matches(pattern: str, path: str) -> bool:
    """`*`, `?`, `[..]` within one segment; a `**` segment spans any number of them."""
    return _match(pattern.split("/"), path.split("/"))


def _match(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(pattern[1:], parts[1:])


def extension_module(path: str) -> str | None:
    """sgl_kernel/flash_ops.abi3.so -> sgl_kernel/flash_ops.py (the module a removal leaves)."""
    folder, name = posixpath.split(path)
    if not name.endswith(".so"):
        return None
    stem = name.split(".", 1)[0]
    return posixpath.join(folder, stem + ".py") if stem.isidentifier() else None


def prune_package(site: str, package: str, remove: list[str], strip_debug: list[str],
                  reason: str) -> list[str]:
    """Apply one spec entry; return a line per file removed, stripped or left as a tombstone."""
    site = os.path.realpath(site)
    try:
        dist = apply_patch.find_distribution(site, package)
    except apply_patch.PatchError as err:
        raise PruneError(str(err).replace("the patch's", "the [[prune]] entry's")) from None
    about = f"{dist.name} {dist.version}"
    info = os.path.join(site, dist.dist_info)
    record_text = apply_patch._read_text(os.path.join(info, "RECORD"))
    if record_text is None:
        raise PruneError(f"{info}: has no RECORD, so what it installed cannot be pruned or re-hashed")
    # Paths in site-packages only: RECORD also lists scripts installed to ../../bin.
    recorded = {posixpath.normpath(row[0]) for _, row in apply_patch._record_rows(record_text) if row}
    listed = sorted(path for path in recorded if not path.startswith((dist.dist_info + "/", "../", "/")))
    outputs: dict[str, bytes | None] = {}
    lines, log = [], []
    for kind, patterns in (("remove", remove), ("strip_debug", strip_debug)):
        for pattern in patterns:
            hits = [path for path in listed if matches(pattern, path)]
            if not hits:
                raise PruneError(f"[[prune]] {kind} {pattern!r} matches no file of {about}: the release "
                                 "moved or dropped it; update the recipe's glob (or drop it)")
            for path in hits:
                apply_patch._inside(site, path)
                full = os.path.join(site, path)
                size = os.path.getsize(full) if os.path.isfile(full) else 0
                if kind == "remove":
                    outputs[path] = None
                    lines.append(f"removed {path} ({size / 1e6:.1f} MB, {about})")
                    log.append(f"removed {path} {size}")
                else:
                    data = _stripped(full, path)
                    outputs[path] = data
                    lines.append(f"stripped {path} ({size / 1e6:.1f} -> {len(data) / 1e6:.1f} MB, {about})")
                    log.append(f"stripped {path} {size} {len(data)}")
    created = {}
    for path in [p for p, data in outputs.items() if data is None]:
        module = extension_module(path)
        if module and module not in listed and module not in outputs:
            message = f"{path} was removed from this image by imagebuild: {reason}"
            outputs[module] = TOMBSTONE.format(reason=reason.replace('"""', "'''"),
                                               message=message).encode("utf-8")
            created[module] = 0o644
            lines.append(f"left {module}: importing it raises ImportError with the reason")
    previous = apply_patch._read_text(os.path.join(info, PRUNED_FILE)) or ""
    outputs[f"{dist.dist_info}/{PRUNED_FILE}"] = (
        previous + f"# {reason}\n" + "".join(line + "\n" for line in log)).encode("utf-8")
    record = apply_patch._rewrite_record(record_text, outputs, [])
    apply_patch._write_all(site, {**outputs, f"{dist.dist_info}/RECORD": record.encode("utf-8")},
                           created, [])
    _remove_empty_folders(site, [p for p, data in outputs.items() if data is None])
    return lines


def _stripped(full: str, path: str) -> bytes:
    with open(full, "rb") as file:
        if file.read(4) != ELF_MAGIC:
            raise PruneError(f"{path}: strip_debug names a file that is not an ELF binary")
    tool = shutil.which("strip")
    if tool is None:
        raise PruneError("strip_debug needs binutils' strip in the image: add binutils (or g++) "
                         "to [base].packages")
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "stripped")
        done = subprocess.run([tool, "--strip-debug", "-o", out, full], capture_output=True, text=True)
        if done.returncode != 0:
            raise PruneError(f"strip --strip-debug {path} failed: {done.stderr.strip()}")
        with open(out, "rb") as file:
            return file.read()


def _remove_empty_folders(site: str, removed: list[str]) -> None:
    for folder in sorted({posixpath.dirname(p) for p in removed}, key=len, reverse=True):
        while folder:
            full = os.path.join(site, folder)
            if not os.path.isdir(full) or os.listdir(full):
                break
            os.rmdir(full)
            folder = posixpath.dirname(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site_packages")
    parser.add_argument("spec", help="JSON list of {package, remove, strip_debug, reason}")
    args = parser.parse_args(argv)
    try:
        with open(args.spec, encoding="utf-8") as file:
            spec = json.load(file)
        for entry in spec:
            for line in prune_package(args.site_packages, entry["package"], entry.get("remove", []),
                                      entry.get("strip_debug", []), entry["reason"]):
                print(f"prune: {line}")
    except (PruneError, apply_patch.PatchError, OSError, ValueError, KeyError) as err:
        print(f"prune: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
