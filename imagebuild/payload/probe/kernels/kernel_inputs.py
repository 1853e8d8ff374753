"""What a FlashInfer module's compile reads, and its kernel cache key: the bytes of every one of those files.

The key is needed before compiling (it decides hit or miss), so the compiler's own dependency output is not
there yet. Instead the files are found as the compiler would find them, without running a preprocessor:
from the module's sources (its build.ninja's compile inputs and the spec's sources), every `#include`,
`#include_next` and `__has_include` is followed through the include paths its build.ninja names (-I, -isystem,
-iquote, -idirafter, then the host compiler's own folders), plus what nvcc reads unasked (cuda_runtime.h) and
the libraries its link step names (-L, -l). Every branch of every `#if` is followed, so the set is a superset
of what the preprocessor reads: a header edit moves the modules that can reach it and no other. An include
name that resolves to no file is in the key too, so a file added where it would be found moves it.
A `#include MACRO` cannot be followed without a preprocessor: the include folder holding such a file is taken
whole (for FlashInfer's sampling, CCCL's thrust/, whose system headers are named by macros).

File digests and parsed includes are kept for the process, checked against each file's size, mtime and inode,
so the ~10 modules of a build read each shared header once. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import subprocess

try:
    from . import kernel_cache
except ImportError:  # run as a script from a folder holding kernel_cache.py too (the [aot] step)
    import kernel_cache

INCLUDE = re.compile(rb'^[ \t]*#[ \t]*(include_next|include|import)[ \t]*([<"])([^>"\r\n]+)[>"]', re.M)
HAS_INCLUDE = re.compile(rb'__has_include(_next)?[ \t]*\([ \t]*([<"])([^>"\r\n]+)[>"][ \t]*\)')
MACRO_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include(?:_next)?[ \t]+([A-Za-z_][A-Za-z0-9_]*)', re.M)
# nvcc includes this into every .cu file without a directive (the CUDA runtime API).
NVCC_IMPLICIT = ("cuda_runtime.h",)
SEARCH_FLAGS = {"-I": "angle", "-isystem": "angle", "-iquote": "quote", "-idirafter": "after",
                "--include-path": "angle", "--system-include": "angle"}
FORCED_FLAGS = ("-include", "--pre-include")
CFLAG_VARIABLES = ("common_cflags", "cflags", "post_cflags", "cuda_cflags", "cuda_post_cflags")
COMPILE_RULES = ("compile", "cuda_compile")

_files: dict = {}  # realpath -> (size, mtime_ns, inode, sha256, [(directive, quote, name)], macro include?)
_host_dirs: list = []


class SourceFile:
    """One file's digest and include directives, read once per process while it stays unchanged."""

    __slots__ = ("sha256", "includes", "macro")

    def __init__(self, sha256: str, includes: list, macro: bool):
        self.sha256, self.includes, self.macro = sha256, includes, macro


def read_file(path: str) -> SourceFile | None:
    """The file's digest and directives, or None when it cannot be read."""
    try:
        real = os.path.realpath(path)
        status = os.stat(real)
    except (OSError, ValueError):  # ValueError: a name with a NUL byte
        return None
    if not stat.S_ISREG(status.st_mode):  # a folder or a device is no source
        return None
    stamp = (status.st_size, status.st_mtime_ns, status.st_ino)
    known = _files.get(real)
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        with open(real, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    parsed = SourceFile(hashlib.sha256(data).hexdigest(), parse_includes(data), bool(MACRO_INCLUDE.search(data)))
    _files[real] = (stamp, parsed)
    return parsed


def parse_includes(data: bytes) -> list:
    """(directive, quote, name) of each #include / #include_next / #import and __has_include in a file's bytes;
    a name that is not text is skipped (no compiler reads it as a path either)."""
    found = []
    for match in INCLUDE.finditer(data):
        found.append((match.group(1), match.group(2), match.group(3)))
    for match in HAS_INCLUDE.finditer(data):
        found.append((b"include_next" if match.group(1) else b"include", match.group(2), match.group(3)))
    decoded = []
    for directive, quote, name in found:
        try:
            decoded.append((directive.decode(), quote.decode(), name.decode("utf-8").strip()))
        except UnicodeDecodeError:
            continue
    return decoded


# --- build.ninja -----------------------------------------------------------------------------------------

def ninja_variables(text: str) -> tuple:
    """(top-level variables, expanded; [(rule, outputs, inputs)] of each build line) of a build.ninja."""
    text = re.sub(r"\$\r?\n[ \t]*", "", text)  # `$` at a line's end continues it
    raw, builds = {}, []
    for line in text.splitlines():
        if line.startswith(("build ", "build\t")):
            outputs, _, rest = line[6:].partition(":")
            parts = rest.split()
            if parts:
                builds.append((parts[0], outputs.split(), [p for p in parts[1:] if p not in ("|", "||")]))
        elif line and not line[0].isspace() and "=" in line and not line.startswith(("rule ", "#", "pool ")):
            name, _, value = line.partition("=")
            raw[name.strip()] = value.strip()
    expanded: dict = {}
    for name in raw:
        expanded[name] = _expand(raw[name], raw, expanded, set())
    builds = [(rule, [_expand(o, raw, expanded, set()) for o in outs], [_expand(i, raw, expanded, set()) for i in ins])
              for rule, outs, ins in builds]
    return expanded, builds


def _expand(value: str, raw: dict, done: dict, seen: set) -> str:
    def one(match):
        token = match.group(0)
        if token == "$$":
            return "$"
        if token in ("$ ", "$:"):
            return token[1]
        name = match.group(1) or match.group(2)
        if name in done:
            return done[name]
        if name in seen or name not in raw:
            return ""
        return _expand(raw[name], raw, done, seen | {name})
    return re.sub(r"\$\$|\$ |\$:|\$\{([A-Za-z0-9_.-]+)\}|\$([A-Za-z0-9_-]+)", one, value)


def compile_flags(variables: dict) -> list:
    tokens = []
    for name in CFLAG_VARIABLES:
        value = variables.get(name, "")
        try:
            tokens += shlex.split(value)
        except ValueError:
            tokens += value.split()
    return tokens


def search_paths(tokens: list) -> tuple:
    """(quote-only folders, folders for both, after-system folders, forced includes) named by compile flags."""
    found = {"quote": [], "angle": [], "after": [], "forced": []}
    index = 0
    while index < len(tokens):
        token, value = tokens[index], None
        for flag, kind in list(SEARCH_FLAGS.items()) + [(f, "forced") for f in FORCED_FLAGS]:
            if token == flag and index + 1 < len(tokens):
                value, index = tokens[index + 1], index + 1
            elif token.startswith(flag + "=") and flag.startswith("--"):
                value = token[len(flag) + 1:]
            elif token.startswith(flag) and flag in ("-I", "-isystem", "-iquote", "-idirafter") and len(token) > len(flag):
                value = token[len(flag):]
            if value is not None:
                if value not in found[kind]:
                    found[kind].append(value)
                break
        index += 1
    return found["quote"], found["angle"], found["after"], found["forced"]


def link_inputs(variables: dict) -> list:
    """The libraries the link step names (-lNAME in the -L folders): (name, path or None)."""
    try:
        tokens = shlex.split(variables.get("ldflags", ""))
    except ValueError:
        tokens = variables.get("ldflags", "").split()
    folders = [t[2:] for t in tokens if t.startswith("-L") and len(t) > 2]
    found = []
    for name in (t[2:] for t in tokens if t.startswith("-l") and len(t) > 2):
        path = next((os.path.join(f, f"lib{name}.so") for f in folders
                     if os.path.isfile(os.path.join(f, f"lib{name}.so"))), None)
        found.append((name, path))
    return found


def host_include_dirs() -> list:
    """The host compiler's own include folders (`c++ -E -v`), asked once per process; [] without one."""
    if not _host_dirs:
        try:
            done = subprocess.run(["c++", "-x", "c++", "-E", "-v", os.devnull], capture_output=True, text=True,
                                  timeout=60)
            lines, inside = done.stderr.splitlines(), False
            for line in lines:
                if line.startswith("#include <...> search starts here"):
                    inside = True
                elif line.startswith("End of search list"):
                    break
                elif inside and line.startswith(" "):
                    _host_dirs.append(os.path.normpath(line.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
        _host_dirs.append("")  # asked: an empty answer is not asked again
    return [d for d in _host_dirs if d]


# --- the closure -----------------------------------------------------------------------------------------

class Search:
    """Where a compile looks for a name: GCC's order (the including file's folder for "", then -iquote, then -I
    and -isystem, then the host compiler's folders, then -idirafter)."""

    def __init__(self, quote: list, angle: list, after: list, system: list):
        self.quote = [os.path.normpath(d) for d in quote]
        self.angle = [os.path.normpath(d) for d in angle + system + after]
        self._found: dict = {}

    def find(self, directive: str, quote: str, name: str, folder: str) -> list:
        """The files the name can mean: the first found in order; for #include_next every one (a superset)."""
        if os.path.isabs(name):
            return [os.path.normpath(name)] if os.path.isfile(name) else []
        folders = ([folder] if quote == '"' else []) + (self.quote if quote == '"' else []) + self.angle
        every = directive == "include_next"
        found = []
        for base in folders:
            path = os.path.normpath(os.path.join(base, name))
            exists = self._found.get(path)
            if exists is None:
                exists = self._found[path] = os.path.isfile(path)
            if exists:
                found.append(path)
                if not every:
                    break
        return found


def closure(roots: list, search: Search) -> tuple:
    """Every file reachable from `roots` through their includes: ({path: sha256}, [unresolved names],
    [files with a macro include])."""
    files, missing, macro = {}, set(), []
    pending = [os.path.normpath(str(r)) for r in roots]
    while pending:
        path = pending.pop()
        if path in files:
            continue
        parsed = read_file(path)
        if parsed is None:
            missing.add(("", path))
            continue
        files[path] = parsed.sha256
        if parsed.macro:
            macro.append(path)
        folder = os.path.dirname(path)
        for directive, quote, name in parsed.includes:
            found = search.find(directive, quote, name, folder)
            if not found:
                missing.add((quote, name))
            pending.extend(p for p in found if p not in files)
    for path in sorted(macro):  # a computed include may name any file of the include folder it was found in
        top = max((d for d in search.quote + search.angle if path.startswith(d.rstrip(os.sep) + os.sep)),
                  key=len, default=os.path.dirname(path))
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(root, name)
                if full not in files:
                    parsed = read_file(full)
                    files[full] = parsed.sha256 if parsed else None
    return files, sorted(missing), sorted(macro)


def module_inputs(ninja_text: str, sources: list) -> dict:
    """Everything a module's compile and link read, as the key holds it."""
    variables, builds = ninja_variables(ninja_text)
    quote, angle, after, forced = search_paths(compile_flags(variables))
    search = Search(quote, angle, after, host_include_dirs())
    compiled = [i for rule, _, inputs in builds if rule in COMPILE_RULES for i in inputs]
    roots = list(dict.fromkeys([str(s) for s in sources] + compiled))
    implicit = []
    for name in NVCC_IMPLICIT + tuple(forced):
        implicit += search.find("include", "<", name, "") or ([name] if os.path.isfile(name) else [])
    files, missing, macro = closure(roots + implicit, search)
    libraries = [(name, path, kernel_cache.sha256_file(path) if path else None) for name, path in link_inputs(variables)]
    return {"files": sorted(files.items()), "unresolved": missing, "macro_includes": macro,
            "search": [search.quote, search.angle], "libraries": libraries}


def _folder_digests(folder: str) -> list:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            found.append((os.path.relpath(path, folder), kernel_cache.sha256_file(path)))
    return found


def flashinfer_key(spec, build_wide: dict, generated_root: str) -> str | None:
    """The module's key, or None when it cannot be keyed (a spec kind without a build.ninja)."""
    write_ninja = getattr(spec, "write_ninja", None)
    ninja_path = getattr(spec, "ninja_path", None)
    if write_ninja is None or ninja_path is None:
        return None
    write_ninja()
    with open(ninja_path, encoding="utf-8") as handle:
        ninja = handle.read()
    sources = [(str(path), kernel_cache.sha256_file(str(path))) for path in spec.sources]
    generated = os.path.realpath(generated_root) + os.sep
    folders = sorted({os.path.dirname(os.path.realpath(str(p))) for p in spec.sources
                      if os.path.realpath(str(p)).startswith(generated)})
    parts = {"name": spec.name, "kind": type(spec).__name__, "ninja": ninja, "sources": sources,
             "generated": [(folder, _folder_digests(folder)) for folder in folders], "build": build_wide,
             "inputs": module_inputs(ninja, list(spec.sources))}
    return kernel_cache.digest(parts)
