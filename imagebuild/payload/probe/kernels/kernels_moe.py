"""Which FlashInfer modules a quantized MoE shape makes SGLang load on an SM12x GPU, read from the
installed FlashInfer's own source, never imported (a build machine has no GPU, and the tests read
releases they never install).

SGLang 0.5.23's NVFP4 path (--quantization modelopt_fp4) on SM110/SM120 runs its MoE layers on FlashInfer's
CUTLASS backend (sglang/srt/arg_groups/overrides.py, _moe_runner_backend_quant_constraints: "trtllm-gen MoE
kernels are SM100-only"), quantizes activations with FlashInfer's fp4_quantize and runs its FP4 linear
layers through mm_fp4's cutlass backend (layers/quantization/modelopt_quant.py). Each reaches one
FlashInfer loader (LOADERS). Which generator a loader calls for the target is read from the loader's own
body: the gen_* functions it names whose name carries the GPU's sm number, the family ("f") variant first
when there is one, as FlashInfer's own dispatcher chooses at run time with torch's CUDA >= 12.9 (every CUDA
13 torch; get_fp4_quantization_module in 0.7.x), whatever the arch list. The generator's parameters are
read from its def: FlashInfer's SM12x MoE and FP4 generators take no shape (at most use_fast_build, with a
default) and set their own arch flags, so one module of each serves every shape and every target of that sm.

    python kernels_moe.py AOT_JSON [FLASHINFER_DIR]   the plan as JSON (FLASHINFER_DIR: the package folder)

Standard library only.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re
import sys

# (role, the loader FlashInfer's API calls, the SGLang call that reaches it); {sm}: the target's number
LOADERS = (
    ("fused-moe", "get_cutlass_fused_moe_module", "flashinfer.fused_moe.cutlass_fused_moe "
                                                  "(sglang moe_runner/flashinfer_cutlass.py)"),
    ("fp4-quantize", "get_fp4_quantization_module", "flashinfer.fp4_quantize (sglang modelopt_quant.py)"),
    ("fp4-gemm", "get_gemm_sm{sm}_module_cutlass_fp4", "flashinfer.mm_fp4, backend cutlass (sglang modelopt_quant.py)"),
)
READ = ("nvfp4",)  # the quantizations whose SGLang path this reader follows
# SGLang's --fp4-gemm-backend values whose FP4 linear layers load a FlashInfer module (auto on SM12x is
# flashinfer_cutlass: fp4_utils.initialize_fp4_gemm_config); flashinfer_cudnn runs cuDNN's graphs instead.
FP4_GEMM_MODULE = {"flashinfer_cutlass": True, "flashinfer_cudnn": False}


def roles_of(shape: dict) -> tuple:
    """The LOADERS roles a shape of a READ quantization reaches: FP4 quantization always, the FP4 GEMM with
    a CUTLASS FP4 GEMM backend, the fused MoE with experts."""
    wanted = {"fp4-quantize"}
    if FP4_GEMM_MODULE[shape.get("fp4_gemm_backend", "flashinfer_cutlass")]:
        wanted.add("fp4-gemm")
    if shape.get("experts") is not None:
        wanted.add("fused-moe")
    return tuple(role for role, _, _ in LOADERS if role in wanted)
_SM = re.compile(r"_sm(\d+)(f?)(?=_|$)")


def flashinfer_dir() -> str | None:
    """The installed flashinfer package's folder, found without importing it."""
    spec = importlib.util.find_spec("flashinfer")
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


_DEF = re.compile(rb"^(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(", re.MULTILINE)


class SourceIndex:
    """The module-level functions defined under a package folder, found by a scan of each file's lines and
    read (ast) only when asked for: name -> [definition], each with its file (relative to the package's
    parent), line, parameters and the gen_* names its body uses."""

    def __init__(self, package: str):
        self.parent = os.path.dirname(os.path.abspath(package))
        self.files: dict = {}  # function name -> files defining it at column 0
        self.parsed: dict = {}
        for root, folders, files in os.walk(package):
            folders[:] = sorted(f for f in folders if f != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    try:
                        with open(path, "rb") as handle:
                            text = handle.read()
                    except OSError:
                        continue
                    for found in _DEF.finditer(text):
                        self.files.setdefault(found.group(1).decode(), []).append(path)

    def get(self, name: str) -> list:
        definitions = []
        for path in self.files.get(name, ()):
            definitions += [one for one in self._read(path) if one["name"] == name]
        return definitions

    def _read(self, path: str) -> list:
        if path not in self.parsed:
            try:
                with open(path, "rb") as handle:
                    tree = ast.parse(handle.read(), filename=path)
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                tree = ast.Module(body=[], type_ignores=[])
            self.parsed[path] = [dict(_definition(node, os.path.relpath(path, self.parent)), node=node)
                                 for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return self.parsed[path]

    def node(self, name: str):
        """The function's definition (the one under jit/ first, as generator_for reads it), or None."""
        found = sorted(self.get(name), key=lambda one: "/jit/" not in one["file"])
        return found[0]["node"] if found else None


@functools.lru_cache(maxsize=4)
def index_functions(package: str) -> SourceIndex:
    """One index per package folder: the build and the proof ask for each shape, and a scan reads every file."""
    return SourceIndex(package)


def _definition(node, file: str) -> dict:
    arguments = node.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    parameters = [{"name": a.arg, "default": None if d is None else ast.unparse(d)} for a, d in zip(positional, defaults)]
    parameters += [{"name": a.arg, "default": None if d is None else ast.unparse(d)}
                   for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    uses = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id.startswith("gen_")})
    return {"name": node.name, "file": file, "line": node.lineno, "parameters": parameters, "uses": uses}


def module_name(functions: SourceIndex, generator: str, values: dict | None = None, depth: int = 0) -> str | None:
    """The module name the generator gives its JitSpec, read from the source: the first argument of the
    gen_jit_spec call it returns, through at most three gen_* calls that pass literal values down (the SM12x
    FP4 generators pass their arch as text: gen_fp4_quantization_module(flags, "120f")). None when the name is
    not written from literals."""
    node = functions.node(generator)
    if node is None or depth > 3:
        return None
    scope = _defaults(node)
    scope.update(values or {})
    for returned in [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)]:
        callee = returned.func.id if isinstance(returned.func, ast.Name) else getattr(returned.func, "attr", "")
        if callee == "gen_jit_spec" and returned.args:
            name = _text(returned.args[0], scope)
            return name if isinstance(name, str) else None
        inner = functions.node(callee) if callee.startswith("gen_") else None
        if inner is not None:
            names = [a.arg for a in inner.args.posonlyargs + inner.args.args]
            passed = {name: _text(arg, scope) for name, arg in zip(names, returned.args)}
            passed.update({k.arg: _text(k.value, scope) for k in returned.keywords if k.arg})
            found = module_name(functions, callee, {k: v for k, v in passed.items() if v is not _UNKNOWN}, depth + 1)
            if found:
                return found
    return None


_UNKNOWN = object()


def _defaults(node) -> dict:
    positional = node.args.posonlyargs + node.args.args
    pairs = list(zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults))
    pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
    scope = {}
    for argument, default in pairs:
        if isinstance(default, ast.Constant):
            scope[argument.arg] = default.value
    return scope


def _text(expr, scope: dict):
    """A literal string (or None) the expression evaluates to with `scope`'s names; _UNKNOWN otherwise."""
    if isinstance(expr, ast.Constant) and (expr.value is None or isinstance(expr.value, (str, int))):
        return expr.value if not isinstance(expr.value, int) or isinstance(expr.value, bool) else str(expr.value)
    if isinstance(expr, ast.Name):
        value = scope.get(expr.id, _UNKNOWN)
        return value if value is None or isinstance(value, str) else _UNKNOWN
    if isinstance(expr, ast.JoinedStr):
        parts = [_text(v.value if isinstance(v, ast.FormattedValue) else v, scope) for v in expr.values]
        return "".join(parts) if all(isinstance(part, str) for part in parts) else _UNKNOWN
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        for value in expr.values:
            found = _text(value, scope)
            if found is _UNKNOWN:
                return _UNKNOWN
            if found:
                return found
        return None
    return _UNKNOWN


def arch_target(arch: str) -> tuple[int, bool]:
    """`12.0f` -> (120, True): the sm number and whether it is a family target."""
    major, _, rest = arch.partition(".")
    minor = "".join(c for c in rest if c.isdigit())
    return int(major) * 10 + int(minor or 0), rest.endswith("f")


def generator_for(functions: SourceIndex, loader: str, sm: int, family: bool) -> dict:
    """The generator `loader` calls for a GPU of this sm, read from the loader's body (`family`: the family
    variant first, when the loader names one); {"missing": reason} when the release has no such loader or no
    generator for this sm."""
    definitions = functions.get(loader)
    if not definitions:
        return {"missing": f"this FlashInfer has no {loader}"}
    named = sorted({name for one in definitions for name in one["uses"]})
    fitting = [(name, match.group(2) == "f") for name in named
               for match in [_SM.search(name)] if match and int(match.group(1)) == sm]
    exact = [name for name, is_family in fitting if not is_family]
    chosen = ([name for name, is_family in fitting if is_family] or exact) if family else exact
    if not chosen:
        return {"missing": f"{loader} names no generator for sm_{sm}" +
                           (f" (it names {', '.join(named)})" if named else "")}
    generator = chosen[0]
    defined = functions.get(generator)
    if not defined:
        return {"missing": f"{loader} names {generator}, which this FlashInfer does not define"}
    definition = sorted(defined, key=lambda one: "/jit/" not in one["file"])[0]
    required = [p["name"] for p in definition["parameters"] if p["default"] is None]
    if required:
        return {"missing": f"{generator} takes {', '.join(required)}, which no [aot] shape field gives: "
                           "this FlashInfer release is not supported yet"}
    name = module_name(functions, generator)
    return {"generator": generator, "file": definition["file"], "line": definition["line"],
            "parameters": definition["parameters"], "module": name,
            "loader": {"name": loader, "file": definitions[0]["file"], "line": definitions[0]["line"]}}


def moe_plan(spec: dict, package: str, family_variants: bool = True) -> dict:
    """For each quantized shape and target: the FlashInfer modules its SGLang path loads ("modules"), and
    what this FlashInfer lacks ("missing"), each naming role, target and shape. A shape of a quantization
    this reader does not follow yet is listed under "not_read" with why: never an empty pass.
    `family_variants`: torch's CUDA is 12.9 or newer, so FlashInfer's dispatcher loads a family variant."""
    functions = index_functions(package)
    plan: dict = {"flashinfer": package, "modules": [], "missing": [], "not_read": []}
    seen: dict = {}
    for shape in spec["shapes"]:
        quantization = shape.get("quantization", "none")
        if quantization == "none":
            continue
        if quantization not in READ:
            plan["not_read"].append({"shape": shape["name"], "quantization": quantization,
                                     "why": "its SGLang path's kernels are not read by this probe yet"})
            continue
        roles = roles_of(shape)
        for arch in spec["archs"]:
            sm, _ = arch_target(arch)
            for role, loader, reached_by in LOADERS:
                if role not in roles:
                    continue
                found = generator_for(functions, loader.format(sm=sm), sm, family_variants)
                if "missing" in found:
                    plan["missing"].append({"shape": shape["name"], "role": role, "arch": arch,
                                            "reached_by": reached_by, "reason": found["missing"]})
                    continue
                key = found["generator"]
                if key not in seen:  # no shape parameter, its own arch flags: one module serves them all
                    seen[key] = dict(found, role=role, archs=[], reached_by=reached_by, shapes=[])
                    plan["modules"].append(seen[key])
                for name, value in (("archs", arch), ("shapes", shape["name"])):
                    if value not in seen[key][name]:
                        seen[key][name].append(value)
    return plan


# --- on the image's own interpreter: the loaders themselves ------------------------------------------

def family_for(torch_cuda: str | None) -> bool:
    """Whether FlashInfer's SM12x dispatchers take the family variant with a torch built for this CUDA: 12.9 or
    newer (get_fp4_quantization_module in 0.7.x)."""
    numbers = [int(part) for part in str(torch_cuda or "0").split(".")[:2] if part.isdigit()]
    return tuple(numbers) >= (12, 9)


def family_variants() -> bool:
    """family_for the installed torch's CUDA."""
    import torch
    return family_for(torch.version.cuda)


def _module_name(file: str) -> str:
    parts = file[:-3].split("/") if file.endswith(".py") else file.split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def quantized_loads(shape: dict, archs: list, package: str | None = None, family: bool | None = None) -> tuple:
    """([(what, loader, values)], problems): each FlashInfer loader this quantized shape's SGLang path calls on
    each target, imported from the file the source reading found it in, with the values FlashInfer's own API
    passes it (backend: the GPU's sm number as text, as cutlass_fused_moe and fp4_quantize pass it). A shape
    the reading cannot follow is a problem, never an empty list. package and family: as moe_plan takes them
    (default: the installed FlashInfer, and torch's CUDA)."""
    if shape.get("quantization", "none") == "none":
        return [], []
    package = package or flashinfer_dir()
    if package is None:
        return [], [f"{shape['name']}: flashinfer is not installed for this interpreter"]
    if family is None:
        family = shape["quantization"] in READ and family_variants()
    plan = moe_plan({"archs": archs, "shapes": [shape]}, package, family)
    problems = [f"{one['shape']} {one['role']} for {one['arch']}: {one['reason']}" for one in plan["missing"]]
    problems += [f"{one['shape']}: {one['quantization']}: {one['why']}" for one in plan["not_read"]]
    loads = []
    for module in plan["modules"]:
        loader = getattr(importlib.import_module(_module_name(module["loader"]["file"])), module["loader"]["name"])
        for sm in sorted({arch_target(arch)[0] for arch in module["archs"]}):  # 12.0a and 12.0f: one sm, one load
            loads.append((f"{module['role']} sm_{sm}", loader, {"backend": str(sm), "use_fast_build": False}))
    return loads, problems


def undeclared_target(shapes: list, archs: list) -> tuple | None:
    """The quantized negative control, (what, loader, values): FlashInfer's FP4 quantization loader for a GPU no
    arch declares (its modules take no shape, so another shape would hit); None without a quantized shape."""
    quantized = [shape for shape in shapes if shape.get("quantization", "none") in READ]
    if not quantized:
        return None
    taken = {arch_target(arch)[0] for arch in archs}
    sm = next((number for number in (100, 90, 103, 110, 89) if number not in taken), None)
    if sm is None:
        return None
    loads, _ = quantized_loads(quantized[0], archs[:1])
    fp4 = [loader for what, loader, _ in loads if what.startswith("fp4-quantize")]
    return (f"fp4-quantize sm_{sm} (undeclared)", fp4[0], {"backend": str(sm)}) if fp4 else None


def main(argv: list) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)
    package = argv[1] if len(argv) == 2 else flashinfer_dir()
    if package is None:
        print("flashinfer is not installed for this interpreter", file=sys.stderr)
        return 1
    plan = moe_plan(spec, package)
    print(json.dumps(plan, indent=2, sort_keys=True))
    return 1 if plan["missing"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
