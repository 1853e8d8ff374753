"""What the installed deep_gemm release would compile for an SM12x GPU, read from the release itself.

- The kernel: the header its JIT includes (the generator template in _C.so names it) and the kernel's
  template parameters by name from that header. The values are chosen by name (SM120_KERNELS); every
  parameter not named there keeps the header's own default.
- The nvcc command line: DeepJIT's CompilerOptions (deep_jit/backend/cuda/options.hpp, which the wheel
  ships) evaluated for the target arch and this environment, the arch spelled by its Device::get_arch
  (device.hpp), the output and include options from its CUDA backend (backend.hpp), plus deep_gemm's own
  additions, compiled into _C.so only: its warning suppressions, read from _C.so's literals.
Each part says where it came from; whatever cannot be read is returned as a reason, never guessed.
"""

from __future__ import annotations

import os
import re

from .cxx_source import function_body, matching, split_top_level, strip_comments, template_parameters

# What sgl-project/DeepGEMM's SM120 heuristics (csrc/jit_kernels/heuristics/sm120.hpp) pick for an
# M = N = K = 4096 GEMM with BF16 output on 188 SMs (RTX PRO 6000 Blackwell), by template parameter name;
# shapes are 0 (known at run time: the Python API's compiled_dims defaults to ''). Read 2026-11-29.
_COMMON_VALUES = {
    "SHAPE_M": "0", "SHAPE_N": "0", "SHAPE_K": "0", "kNumGroups": "1", "BLOCK_M": "128", "BLOCK_N": "128",
    "kSwizzleAMode": "64", "kSwizzleBMode": "64", "kSwizzleCDMode": "128", "kNumStages": "4",
    "kNumTMAThreads": "128", "kNumMathThreads": "256", "kNumSMs": "188",
    "kGemmType": "GemmType::Normal", "kWithAccumulation": "false", "cd_dtype_t": "cutlass::bfloat16_t",
}
SM120_KERNELS = (
    {"kernel": "sm120_bf16_gemm_impl", "values": dict(_COMMON_VALUES, BLOCK_K="32")},
    {"kernel": "sm120_fp8_fp4_gemm_1d1d_impl",
     "values": dict(_COMMON_VALUES, BLOCK_K="64", kGranKA="128", kGranKB="128", kEpiSubM="64")},
)
SM120 = 120
ENV_PREFIXES = ("DG", "DJ")  # deep_gemm's DeepJIT Config prefix, then DeepJIT's global one (utils/env.hpp)

_INTEGER_KINDS = re.compile(r"(const\s+)?(u?int(8|16|32|64)_t|int|unsigned|unsigned int|long|size_t)")
_CLANG_ARCH = re.compile(r"(?:sm_|compute_)?(\d+)\.?(\d)?[af]?")
_GENERATOR = re.compile(rb"#include <([\w./-]+)>\n[\x20-\x7e\n]*?&(\w+)<([\x20-\x7e\n]*?)\x00")
_DEEP_GEMM_ADDITION = re.compile(r"--diag-suppress=[0-9,]+|--compiler-options=-Wno-[\w,=-]+", re.ASCII)
_DEEPJIT = "deep_jit/backend/cuda/"
_PRINTABLE_RUN = re.compile(rb"[\x20-\x7e]{3,}(?=\x00)")


class Unreadable(Exception):
    """Something in the release that this reader does not understand: the reason, for the report."""


class NoKernel(Exception):
    """The release's JIT has source templates, but none for this kernel: it cannot compile it at all."""


# ---- the kernel ----

def jit_generators(library: bytes) -> dict:
    """{kernel: {"header": ..., "arguments": N}} from the source templates deep_gemm's JIT fills in."""
    found = {}
    for match in _GENERATOR.finditer(library if isinstance(library, (bytes, bytearray)) else b""):
        arguments = match[3].decode("ascii").replace("{{", "").replace("}}", "").count("{}")
        found.setdefault(match[2].decode("ascii"), {"header": match[1].decode("ascii"), "arguments": arguments})
    return found


def kernel_arguments(parameters, values: dict) -> list:
    """The template argument list for parameters: values by name, the header's defaults in between,
    trailing defaults left out. Raises Unreadable naming a parameter it has no value for."""
    if not parameters:
        raise Unreadable("the header declares no template parameters for it")
    last = max((i for i, p in enumerate(parameters) if p["name"] in values), default=-1)
    arguments, known = [], {}
    for parameter in parameters[:last + 1]:
        name, kind = parameter["name"], parameter["kind"]
        if name is None:
            raise Unreadable(f"cannot read its template parameter `{parameter['text']}`")
        if name in values:
            value, origin = values[name], "chosen"
        elif parameter["default"] is not None:
            value = re.sub(r"\b\w+\b", lambda word: known.get(word[0], word[0]), parameter["default"])
            origin = "default"
        else:
            raise Unreadable(f"template parameter `{kind} {name}` is new to this probe: no value for it")
        if origin == "chosen" and not _fits(kind, value):
            raise Unreadable(f"template parameter `{kind} {name}` does not take {value} (its kind changed)")
        known[name] = value
        arguments.append({"name": name, "kind": kind, "value": value, "from": origin})
    missing = [p["name"] for p in parameters[last + 1:] if p["default"] is None]
    if missing:
        raise Unreadable(f"template parameter `{missing[0]}` is new to this probe: no value for it")
    return arguments


def _fits(kind: str, value: str) -> bool:
    """Whether a chosen value suits the parameter's declared kind."""
    if kind in ("typename", "class"):
        return bool(value)
    if kind in ("bool", "const bool"):
        return value in ("true", "false")
    if _INTEGER_KINDS.fullmatch(kind):
        return re.fullmatch(r"-?[0-9]+", value) is not None
    return value.startswith(kind.split()[-1] + "::")  # an enumerator of that enum type


def kernel_plan(spec: dict, include: str, generators: dict) -> dict:
    """Header, instantiation and where each came from for one kernel; raises Unreadable."""
    kernel = spec["kernel"]
    generator = generators.get(kernel)
    if not generators:
        raise Unreadable("no JIT source templates found in deep_gemm's _C.so (their layout is new to this probe)")
    if generator is None:
        raise NoKernel(f"its JIT has no source template for {kernel}: this deep_gemm does not compile SM120 "
                       "kernels")
    header = os.path.join(include, generator["header"])
    try:
        with open(header, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError as error:
        raise Unreadable(f"its JIT includes {generator['header']}, which is not installed: {error}") from None
    parameters = template_parameters(text, kernel)
    if parameters is None:
        raise Unreadable(f"{header} declares no template {kernel}")
    arguments = kernel_arguments(parameters, spec["values"])
    return {"kernel": kernel, "header": generator["header"], "header_path": header,
            "template_args": [argument["value"] for argument in arguments], "arguments": arguments,
            "header_parameters": len(parameters), "jit_passes": generator["arguments"],
            "args_source": f"parameter names and defaults from {generator['header']}; the header named by "
                           "the JIT source template in _C.so"}


# ---- the nvcc command line ----

def read_env(name: str, kind: str, default, environ):
    """DeepJIT's Env::get: <prefix>_<name>, first prefix set wins; bools take true/yes/false/no/integers."""
    for prefix in ENV_PREFIXES:
        raw = environ.get(f"{prefix}_{name}")
        if raw is None:
            continue
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("true", "yes", "false", "no"):
                return lowered in ("true", "yes")
        if re.fullmatch(r"[+-]?[0-9]+", raw.strip()):
            return int(raw) != 0 if kind == "bool" else int(raw)
        raise Unreadable(f"{prefix}_{name}={raw!r} is not a valid {kind} (deep_gemm would refuse it too)")
    return default


class _Evaluator:
    """Evaluates the expressions DeepJIT's option code is written in: literals, env.get<T>(...), locals,
    `or`, std::format("...{}", x), brace lists, and device.get_arch()."""

    def __init__(self, environ, arch, names=None):
        self.environ, self.arch, self.names = environ, arch, dict(names or {})

    def __call__(self, expression: str):
        text = " ".join(expression.split())
        for word in (" or ", " || "):
            if word in text and not text.startswith(("{", "std::vector")):
                parts = split_top_level(text.replace(word, "\x00"), "\x00")
                return any(self(part) for part in parts)
        if re.fullmatch(r'"([^"\\]*)"', text):
            return text[1:-1]
        if re.fullmatch(r"-?[0-9]+", text):
            return int(text)
        if text in ("true", "false"):
            return text == "true"
        if text == "std::nullopt":
            return None
        if text.startswith("*") and text[1:] in self.names:
            return self.names[text[1:]]
        if text in self.names:
            return self.names[text]
        env = re.fullmatch(r'env\.get<(\w+)>\("(\w+)",\s*(.+)\)', text)
        if env:
            return read_env(env[2], env[1], self(env[3]), self.environ)
        formatted = re.fullmatch(r'std::format\("([^"\\]*)",\s*(.+)\)', text)
        if formatted:
            values = [self(part) for part in split_top_level(formatted[2])]
            pieces = formatted[1].split("{}")
            if len(pieces) != len(values) + 1:
                raise Unreadable(f"cannot evaluate `{text}`")
            return "".join(piece + (str(v) if i < len(values) else "") for i, (piece, v) in
                           enumerate(zip(pieces, values + [""])))
        concatenated = split_top_level(text.replace(" + ", "\x00"), "\x00")
        if len(concatenated) > 1:
            return "".join(str(self(part)) for part in concatenated)
        braces = re.fullmatch(r"(?:std::vector(?:<[\w:]+>)?\s*)?\{(.*)\}", text)
        if braces:
            return [self(part) for part in split_top_level(braces[1])]
        if text == "device.get_arch()":
            return self.arch
        raise Unreadable(f"cannot evaluate `{text}`")


def default_options(options_text: str, environ, arch: str) -> dict:
    """CompilerOptions::default_options evaluated: {field: value}."""
    text = strip_comments(options_text)
    body = function_body(text, re.compile(r"CompilerOptions\s+default_options\s*\("))
    if body is None:
        raise Unreadable("no CompilerOptions::default_options in DeepJIT's options.hpp")
    evaluate = _Evaluator(environ, arch)
    returned = re.search(r"\breturn\s*\{", body)
    if returned is None:
        raise Unreadable("CompilerOptions::default_options returns no brace list")
    for local in re.finditer(r"const\s+(?:bool|int|auto)\s+(\w+)\s*=\s*([^;]+);", body[:returned.start()]):
        evaluate.names[local[1]] = evaluate(local[2])
    fields = {}
    closing = body.rfind("}")
    for part in split_top_level(body[returned.end():closing]):
        field = re.fullmatch(r"\.(\w+)\s*=\s*(.+)", part, re.S)
        if field is None:
            raise Unreadable(f"cannot read `{part}` in CompilerOptions::default_options")
        fields[field[1]] = evaluate(field[2])
    return fields


def option_flags(options_text: str, fields: dict) -> list:
    """CompilerOptions::get_flags run over fields: the flags in its order."""
    text = strip_comments(options_text)
    body = function_body(text, re.compile(r"std::vector<std::string>\s+get_flags\s*\(\s*\)"))
    if body is None:
        raise Unreadable("no CompilerOptions::get_flags in DeepJIT's options.hpp")
    evaluate = _Evaluator({}, None, fields)
    flags = None
    for statement in split_top_level(body, ";"):
        test, statement = split_if(statement)
        if test is not None:
            value = re.fullmatch(r"(\w+)\.value_or\((true|false)\)", test)
            if value:
                active = fields.get(value[1]) if fields.get(value[1]) is not None else value[2] == "true"
            elif test in fields:
                active = fields[test] is not None
            else:
                raise Unreadable(f"cannot evaluate the condition `{test}` in CompilerOptions::get_flags")
            if not active:
                continue
        start = re.fullmatch(r"std::vector(?:<std::string>)?\s+flags\s*=\s*(\{.*\})", statement)
        add = re.fullmatch(r"flags\.(?:emplace_back|push_back)\((.+)\)", statement)
        insert = re.fullmatch(r"flags\.insert\(flags\.end\(\),\s*(\w+)(?:->|\.)begin\(\),\s*\w+(?:->|\.)end\(\)\)",
                              statement)
        if start:
            flags = list(evaluate(start[1]))
        elif add and flags is not None:
            flags.append(str(evaluate(add[1])))
        elif insert and flags is not None:
            flags += [str(flag) for flag in fields.get(insert[1]) or []]
        elif statement.startswith(("DJ_HOST_ASSERT", "DJ_ASSERT")):
            continue
        elif statement == "return flags" and flags is not None:
            return flags
        else:
            raise Unreadable(f"cannot follow `{statement}` in CompilerOptions::get_flags")
    raise Unreadable("CompilerOptions::get_flags returns no flags")


def device_arch(device_text: str, sm: int) -> str:
    """Device::get_arch() for compute capability sm (e.g. 120) with its default arguments."""
    text = strip_comments(device_text)
    match = re.search(r"std::string\s+get_arch\s*\(([^)]*)\)", text)
    body = function_body(text, re.compile(r"std::string\s+get_arch\s*\(")) if match else None
    if body is None:
        raise Unreadable("no Device::get_arch in DeepJIT's device.hpp")
    names = {"major": sm // 10, "minor": sm % 10, "arch": str(sm)}
    for parameter in split_top_level(match[1]):
        default = re.fullmatch(r"(?:const\s+)?bool\s+(\w+)\s*=\s*(true|false)", parameter)
        if default is None:
            raise Unreadable(f"cannot read the get_arch parameter `{parameter}`")
        names[default[1]] = default[2] == "true"
    for statement in split_top_level(body, ";"):
        if re.fullmatch(r"const auto \[major, minor\] = get_arch_pair\(\)|"
                        r"const auto arch = std::to_string\(major \* 10 \+ minor\)", statement):
            continue
        test, statement = split_if(statement)
        rule = re.fullmatch(r"return\s+(.+)", statement)
        if rule is None:
            raise Unreadable(f"cannot follow `{statement}` in Device::get_arch")
        if test is None or _condition(test, names):
            return _arch_value(rule[1], names)
    raise Unreadable("Device::get_arch returns nothing for this arch")


def split_if(statement: str) -> tuple:
    """(condition, statement) of `if (condition) statement`; (None, statement) for any other statement."""
    if not re.match(r"if\s*\(", statement):
        return None, statement
    opening = statement.index("(")
    end = matching(statement, opening)
    if end < 0:
        raise Unreadable(f"cannot read `{statement}`")
    return statement[opening + 1:end - 1].strip(), statement[end:].strip()


def _condition(text: str, names: dict) -> bool:
    terms = [term.strip() for term in re.split(r"\bor\b|\|\|", text)]
    result = False
    for term in terms:
        compare = re.fullmatch(r"(major|minor)\s*(<|>|<=|>=|==)\s*([0-9]+)", term)
        if compare:
            left, right = names[compare[1]], int(compare[3])
            result |= {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right,
                       "==": left == right}[compare[2]]
        elif re.fullmatch(r"(not\s+|!)?(\w+)", term) and isinstance(names.get(term.split()[-1].lstrip("!")), bool):
            value = names[term.split()[-1].lstrip("!")]
            result |= value if term == term.split()[-1] else not value
        else:
            raise Unreadable(f"cannot evaluate `{term}` in Device::get_arch")
    return result


def _arch_value(text: str, names: dict) -> str:
    ternary = re.fullmatch(r'arch \+ \((\w+) \? "(\w*)" : "(\w*)"\)', text)
    suffix = re.fullmatch(r'arch(?: \+ "(\w*)")?', text)
    if ternary and isinstance(names.get(ternary[1]), bool):
        return names["arch"] + (ternary[2] if names[ternary[1]] else ternary[3])
    if suffix:
        return names["arch"] + (suffix[1] or "")
    raise Unreadable(f"cannot evaluate `return {text}` in Device::get_arch")


def backend_command(backend_text: str) -> dict:
    """The fixed parts of the nvcc command that DeepJIT's CUDA backend (backend.hpp) writes."""
    text = strip_comments(backend_text)
    needed = {"output": ('"--cubin"', '"--output-file"'), "include": ('"--include-path"',)}
    missing = [literal for literals in needed.values() for literal in literals if literal not in text]
    if missing:
        raise Unreadable(f"DeepJIT's backend.hpp no longer passes {', '.join(missing)} to nvcc")
    return {"output": ["--cubin", "--output-file"], "include": "--include-path"}


def sm_targets(archs) -> list:
    """The SM12x compute capabilities (120, 121, ...) among a recipe's arch spellings."""
    found = []
    for arch in archs if isinstance(archs, (list, tuple)) else []:
        match = _CLANG_ARCH.fullmatch(arch.strip()) if isinstance(arch, str) else None
        if not match:
            continue
        number = int(match[1] + (match[2] or "")) if match[2] is not None else int(match[1])
        if 120 <= number < 130 and number not in found:
            found.append(number)
    return found


def jit_command(package: str, sm: int, environ=None) -> dict:
    """The nvcc flags deep_gemm's JIT uses for sm, each with its source; raises Unreadable."""
    environ = os.environ if environ is None else environ
    include = os.path.join(package, "include")
    sources = {name: os.path.join(include, _DEEPJIT + name) for name in ("options.hpp", "device.hpp", "backend.hpp")}
    texts = {}
    for name, path in sources.items():
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts[name] = handle.read()
        except OSError:
            raise Unreadable(f"this deep_gemm ships no DeepJIT {_DEEPJIT}{name}: its nvcc flags cannot be "
                             "read from the release") from None
    arch = device_arch(texts["device.hpp"], sm)
    fields = default_options(texts["options.hpp"], environ, arch)
    flags = [{"flag": flag, "from": _DEEPJIT + "options.hpp (CompilerOptions defaults, get_flags)"}
             for flag in option_flags(texts["options.hpp"], fields)]
    command = backend_command(texts["backend.hpp"])
    try:
        with open(os.path.join(package, "_C.so"), "rb") as handle:
            library = handle.read()
    except OSError as error:
        raise Unreadable(f"cannot read deep_gemm's _C.so: {error}") from None
    for literal in dict.fromkeys(scan_strings(library)):
        if _DEEP_GEMM_ADDITION.fullmatch(literal) and literal not in [f["flag"] for f in flags]:
            flags.append({"flag": literal, "from": "_C.so literal (deep_gemm's own additions to DeepJIT's flags)"})
    return {"arch": arch, "arch_from": _DEEPJIT + f"device.hpp Device::get_arch() for sm_{sm}",
            "flags": flags, "output": command["output"], "include_option": command["include"],
            "include": include, "library": library}


def scan_strings(data) -> list:
    """NUL-terminated printable ASCII runs of three or more characters, as `strings` finds them."""
    if not isinstance(data, (bytes, bytearray)):
        return []
    return [match.group().decode("ascii") for match in _PRINTABLE_RUN.finditer(data)]
