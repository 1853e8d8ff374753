"""A Lock (plus the recipe's env and labels) -> Dockerfile.j2 -> a build context on disk.

All decisions are made here as plain values (layers, links, env, labels, the in-image paths of paths.py
and each step's marker of markers.py); the template only lays them out. Nothing is resolved inside the
build: each layer installs hashed pins with --no-deps.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from imagebuild import __version__, payload
from imagebuild.errors import LockError, RecipeError
from imagebuild.lock import Lock
from imagebuild.payload.probe import bundle
from imagebuild.payload.probe.expect import validate_expect
from imagebuild.recipe.layers import LAYER_ORDER
from imagebuild.recipe.model import Recipe
import imagebuild.render.markers as markers  # not via the package's face, which imports this module
import imagebuild.render.paths as paths
from imagebuild.render.paths import (AOT_MANIFEST, KERNEL_CACHE_DIR, KERNEL_CACHE_ID, SGLANG_JIT_CACHE, TRITON_CACHE,
                                     VENV)
from imagebuild.render.templates import TEMPLATE

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PATCHER_SOURCE = payload.PATCHER
PRUNER_SOURCE = payload.PRUNER
AOT_SOURCES = tuple(Path(bundle.SOURCE) / name  # the build step's script and what it runs with, side by side in aot/
                    for name in ("kernels/kernels_aot.py", "kernels/kernels_moe.py", "kernels/kernel_cache.py",
                                 "kernels/kernel_inputs.py", "kernels/compile_resume.py", "kernels/kernels_triton.py",
                                 "waste.py", "kernels/deterministic_pid.c"))
LABEL_PREFIX = "io.imagebuild"


@dataclass(frozen=True)
class Link:
    path: str  # absolute path of the symlink
    target: str  # what it points to, relative to its folder

    @property
    def command(self) -> str:
        return f"ln -sfn {self.target} {self.path}"


@dataclass(frozen=True)
class LayerValues:
    name: str
    file: str
    count: int
    megabytes: int
    lines: tuple[str, ...]
    links: tuple[Link, ...]
    prune: tuple[dict, ...] = ()  # the recipe's [[prune]] entries for this layer's distributions

    @property
    def prune_file(self) -> str:
        return self.file.replace(".txt", ".json")

    @property
    def marker(self) -> str:
        """The install step's marker: the layer, and whether [[prune]] runs in that step too."""
        return markers.marker(markers.INSTALL, layer=self.name, **({"prune": "yes"} if self.prune else {}))

    @property
    def links_marker(self) -> str:
        return markers.marker(markers.LINKS, layer=self.name)


@dataclass(frozen=True)
class PatchValues:
    """One locked [[patches]] entry as its step applies it."""

    package: str
    file: str  # in the context's patches/ and in paths.PATCHES
    sha256: str
    strip: int

    @property
    def marker(self) -> str:
        return markers.marker(markers.PATCH, package=self.package, file=self.file)


@dataclass(frozen=True)
class RenderValues:
    """Everything Dockerfile.j2 receives."""

    tool_version: str
    recipe: str
    base_ref: str
    python_path: str
    venv: str
    site_packages: str
    env_base: dict[str, str]
    env_recipe: dict[str, str]
    layers: tuple[LayerValues, ...]
    patches: tuple[PatchValues, ...]
    labels: dict[str, str]
    expect: dict
    aot: dict | None = None  # the [aot] build step's values; None: no step
    venv_marker: str = markers.marker(markers.VENV)
    paths: dict[str, str] = field(default_factory=paths.template_values)  # the in-image paths, by name


def site_packages(lock: Lock) -> str:
    return f"{VENV}/lib/python{lock.base.python}/site-packages"


def cuda_home(lock: Lock) -> str | None:
    """The toolkit folder holding the bin/nvcc a locked wheel's RECORD names (the lock's cuda.nvcc):
    site-packages/nvidia/cu13 for CUDA 13's wheels. None when no locked wheel ships an nvcc binary
    (CUDA 12's nvcc wheels ship ptxas only)."""
    nvcc = (lock.cuda or {}).get("nvcc")
    if not nvcc:
        return None
    return f"{site_packages(lock)}/{nvcc.rsplit('/', 2)[0]}"


def toolchain_links(lock: Lock) -> tuple[Link, ...]:
    """nvcc links executables against lib64 and `-cudart shared` wants libcudart.so: the wheels have neither.
    Nor do they ship the plain names of the other CUDA libraries (lock.cuda's `unversioned`, read from their
    RECORDs), which `-lNAME` finds: FlashInfer's fused MoE links `-lnvrtc` when it compiles. All in the step
    after the runtime's layer; a library a later layer installs is linked before it lands, as ln allows."""
    home = cuda_home(lock)
    runtime = lock.packages.get("nvidia-cuda-runtime")
    if home is None or runtime is None:
        return ()
    links = {f"{home}/lib64": "lib", f"{home}/lib/libcudart.so": f"libcudart.so.{Version(runtime).major}"}
    for path, target in sorted((lock.cuda or {}).get("unversioned", {}).items()):
        links.setdefault(f"{site_packages(lock)}/{path}", target)
    return tuple(Link(path, target) for path, target in links.items())


def prune_specs(lock: Lock, recipe: Recipe) -> dict[str, tuple[dict, ...]]:
    """The recipe's [[prune]] entries by the layer that installs their distribution."""
    layer_of = {w.name: w.layer for w in lock.wheels}
    specs: dict[str, list[dict]] = {}
    for index, entry in enumerate(recipe.prune):
        if entry.package not in layer_of:
            raise RecipeError(recipe.path, f"prunes {entry.package}, which the lock does not install",
                              key=f"prune[{index}].package", hint="relock, or drop the entry")
        specs.setdefault(layer_of[entry.package], []).append(
            {"package": entry.package, "remove": list(entry.remove), "strip_debug": list(entry.strip_debug),
             "reason": entry.reason})
    return {layer: tuple(items) for layer, items in specs.items()}


def layer_values(lock: Lock, prune: dict[str, tuple[dict, ...]] | None = None) -> tuple[LayerValues, ...]:
    prune = prune or {}
    links = toolchain_links(lock)
    link_layer = next((w.layer for w in lock.wheels if w.name == "nvidia-cuda-runtime"), None)
    layers = []
    for name in LAYER_ORDER:
        wheels = lock.layer(name)
        if not wheels:
            continue
        layers.append(LayerValues(
            name=name, file=f"{len(layers) + 1}-{name}.txt", count=len(wheels),
            megabytes=round(sum(w.size for w in wheels) / 1e6),
            lines=tuple(w.requirement_line for w in wheels),
            links=links if name == link_layer else (), prune=prune.get(name, ())))
    return tuple(layers)


def base_env(lock: Lock) -> dict[str, str]:
    home = cuda_home(lock)
    env = {"VIRTUAL_ENV": VENV}
    if home:
        env |= {"CUDA_HOME": home, "PATH": f"{VENV}/bin:{home}/bin:{SYSTEM_PATH}",
                "LIBRARY_PATH": f"{home}/lib", "LD_LIBRARY_PATH": f"{home}/lib"}
    else:
        env["PATH"] = f"{VENV}/bin:{SYSTEM_PATH}"
    return env


def labels(lock: Lock, recipe: Recipe) -> dict[str, str]:
    ours = {
        "org.opencontainers.image.title": recipe.name,
        "org.opencontainers.image.version": recipe.tag,
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.recipe": lock.recipe,
        f"{LABEL_PREFIX}.recipe.sha256": lock.recipe_sha256,
        f"{LABEL_PREFIX}.lock.sha256": lock.sha256,
        f"{LABEL_PREFIX}.template.sha256": lock.template_sha256,
        **({f"{LABEL_PREFIX}.payload.sha256": lock.payload_sha256} if lock.payload_sha256 else {}),
        f"{LABEL_PREFIX}.base": lock.base.image_ref,
    }
    if lock.cuda:
        ours[f"{LABEL_PREFIX}.cuda"] = lock.cuda["toolkit"]
        ours[f"{LABEL_PREFIX}.cuda.archs"] = ",".join(lock.cuda["archs"])
    if recipe.prune:
        ours[f"{LABEL_PREFIX}.pruned"] = ",".join(sorted({entry.package for entry in recipe.prune}))
    if lock.patches:
        ours[f"{LABEL_PREFIX}.patches"] = ",".join(f"{p.package}:{p.sha256}" for p in lock.patches)
    clash = sorted(k for k in recipe.labels if k.startswith(LABEL_PREFIX + "."))
    if clash:
        raise RecipeError(recipe.path, f"label {clash[0]!r} is reserved for imagebuild's own labels",
                          key=f"labels.{clash[0]}", hint="use another label prefix")
    return dict(sorted((recipe.labels | ours).items()))


def aot_env(recipe: Recipe) -> dict[str, str]:
    """What [aot] adds to the image's environment: where SGLang's and Triton's seeded caches are, and deep_gemm's mode.
    A recipe [env] value may move the cache; one that contradicts deep_gemm's mode is an error."""
    aot = recipe.aot
    if aot is None:
        return {}
    env = {}
    if aot.sglang and "SGLANG_JIT_CACHE_DIR" not in recipe.env:
        env["SGLANG_JIT_CACHE_DIR"] = SGLANG_JIT_CACHE
    if aot.sglang and "TRITON_CACHE_DIR" not in recipe.env:  # the forward's Triton kernels, seeded there
        env["TRITON_CACHE_DIR"] = TRITON_CACHE
    if aot.deep_gemm == "disabled":
        given = recipe.env.get("SGLANG_ENABLE_JIT_DEEPGEMM")
        if given not in (None, "0", "false", "False"):
            raise RecipeError(recipe.path, f"[env] SGLANG_ENABLE_JIT_DEEPGEMM = {given!r} turns on what "
                              'aot.deep_gemm = "disabled" turns off', key="env.SGLANG_ENABLE_JIT_DEEPGEMM",
                              hint='remove the [env] entry, or set aot.deep_gemm = "jit"')
        env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    return env


def aot_values(lock: Lock, recipe: Recipe) -> dict | None:
    """The [aot] step: which FlashInfer and SGLang the lock installs must be there to ask."""
    aot = recipe.aot
    if aot is None:
        return None
    needed = ["flashinfer-python"] + (["sglang"] if aot.sglang else [])
    for name in needed:
        if name not in lock.packages:
            raise RecipeError(recipe.path, f"[aot] prebuilds kernels with {name}, which the lock does not install",
                              key="aot" if name == "flashinfer-python" else "aot.sglang",
                              hint=f"require {name} in [python] requirements" + (
                                  ", or set aot.sglang = false" if name == "sglang" else ""))
    if cuda_home(lock) is None:
        raise RecipeError(recipe.path, "[aot] compiles kernels, but the lock installs no nvcc (CUDA 13 pip wheels)",
                          key="aot", hint='add "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]" to [python] requirements')
    return {"arch_list": aot.arch_list, "manifest": AOT_MANIFEST, "spec": aot.to_json(),
            "marker": markers.marker(markers.AOT), "cache_id": KERNEL_CACHE_ID, "cache_dir": KERNEL_CACHE_DIR,
            "shapes": ", ".join(shape.name for shape in aot.shapes)}


def expectations(lock: Lock, imports: tuple[str, ...] = (), aot: dict | None = None) -> dict:
    """What the in-image probe checks the image against: expect.json, checked against the payload's own
    schema (imagebuild/payload/probe/expect.py SCHEMA) as written, every key and no other."""
    home = cuda_home(lock)
    summary = {key: value for key, value in (lock.cuda or {}).items() if key not in ("nvcc", "deep_gemm")}
    cuda = dict(summary, home=home) if summary and home else None
    if cuda and "toolchain" in cuda:  # the probe checks each one's version against the toolkit
        cuda["toolchain"] = [name for name in cuda["toolchain"] if name in lock.packages]
    deep_gemm = bool((lock.cuda or {}).get("deep_gemm"))  # a locked wheel installs a deep_gemm package
    has_torch = "torch" in lock.packages
    document = {"python": {"executable": f"{VENV}/bin/python", "version": lock.base.python},
                "packages": lock.packages, "cuda": cuda,
                "deep_gemm": {"compile": bool(cuda and deep_gemm)},
                "imports": list(imports),
                "torch_cuda": lock.cuda.get("toolkit") if has_torch and lock.cuda else None,
                "flashinfer_dynamo": has_torch and "flashinfer-python" in lock.packages,
                "patches": [{"package": p.package, "sha256": p.sha256} for p in lock.patches],
                "aot": dict(aot["spec"], manifest=aot["manifest"]) if aot else None}
    _, problems = validate_expect(document, strict=True)
    if problems:  # the lock holds what the probe cannot read: say so here, not in a built image's smoke test
        raise LockError(f"the lock of {lock.recipe} makes an expect.json the probe refuses: " + "; ".join(problems))
    return document


def render_values(lock: Lock, recipe: Recipe) -> RenderValues:
    for name, value in recipe.env.items():
        if "\n" in value or "\r" in value:
            raise RecipeError(recipe.path, "an env value cannot span lines in a Dockerfile",
                              key=f"env.{name}", hint="put it on one line")
    aot = aot_values(lock, recipe)
    return RenderValues(
        tool_version=__version__, recipe=lock.recipe, base_ref=lock.base.image_ref,
        python_path=lock.base.python_path, venv=VENV, site_packages=site_packages(lock),
        env_base=base_env(lock), env_recipe=dict(recipe.env) | aot_env(recipe),
        layers=layer_values(lock, prune_specs(lock, recipe)),
        patches=tuple(PatchValues(p.package, p.file, p.sha256, p.strip) for p in lock.patches),
        labels=labels(lock, recipe),
        expect=expectations(lock, recipe.smoke.imports, aot), aot=aot)


def docker_quote(value: str) -> str:
    """A double-quoted Dockerfile word: no variable expansion, no escapes left to interpret."""
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    escaped = escaped.replace("\n", " ").replace("\r", " ")
    return f'"{escaped}"'


def assignments(pairs: dict[str, str]) -> str:
    """`KEY="value"` pairs for ENV and LABEL, one per continued line."""
    keys_need_quotes = any(not key.replace("_", "").isalnum() for key in pairs)
    return " \\\n    ".join(
        f"{docker_quote(key) if keys_need_quotes else key}={docker_quote(value)}"
        for key, value in pairs.items())


def _environment():
    import jinja2  # only the commands that render pay for it
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             autoescape=False)
    env.filters["assignments"] = assignments
    return env


def render_dockerfile(values: RenderValues) -> str:
    template = _environment().get_template(TEMPLATE.name)
    return template.render(**vars(values))


def render_context(lock: Lock, recipe: Recipe, out_dir: Path, *, uv_path: str | None,
                   lock_text: str | None = None) -> Path:
    """Write the build context into out_dir (made fresh via a temp dir + rename); return it."""
    values = render_values(lock, recipe)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        (staging / "Dockerfile").write_text(render_dockerfile(values))
        (staging / "requirements").mkdir()
        for layer in values.layers:
            (staging / "requirements" / layer.file).write_text("\n".join(layer.lines) + "\n")
        meta = staging / "imagebuild"
        meta.mkdir()
        # Copied into paths.ROOT under the same names.
        bundle.write_zipapp(meta / Path(paths.PROBE).name)
        (meta / Path(paths.EXPECT).name).write_text(json.dumps(values.expect, indent=2, sort_keys=True) + "\n")
        (meta / Path(paths.LOCK).name).write_text(lock_text if lock_text is not None else lock.to_json())
        if any(layer.prune for layer in values.layers):
            # Bind-mounted into the install steps, never copied into a layer.
            (staging / "prune").mkdir()
            shutil.copyfile(PRUNER_SOURCE, staging / "prune" / "prune.py")
            shutil.copyfile(PATCHER_SOURCE, staging / "prune" / "apply_patch.py")
            for layer in values.layers:
                if layer.prune:
                    (staging / "prune" / layer.prune_file).write_text(
                        json.dumps(layer.prune, indent=2, sort_keys=True) + "\n")
        if lock.patches:
            shutil.copyfile(PATCHER_SOURCE, meta / "apply_patch.py")
            (staging / "patches").mkdir()
            # A fresh lock lists the recipe's patches in the recipe's order.
            for source, patch in zip(recipe.patches, lock.patches, strict=True):
                shutil.copyfile(source.path, staging / "patches" / patch.file)
        if values.aot:
            # Bind-mounted into the [aot] step, never copied into a layer.
            (staging / "aot").mkdir()
            (staging / "aot" / "aot.json").write_text(json.dumps(values.aot["spec"], indent=2, sort_keys=True) + "\n")
            for source in AOT_SOURCES:
                shutil.copyfile(source, staging / "aot" / source.name)
        if uv_path:
            (staging / "tools").mkdir()
            _link_or_copy(Path(uv_path), staging / "tools" / "uv")
        swap_in(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def swap_in(staging: Path, out_dir: Path) -> None:
    """out_dir replaced by staging: an older folder is renamed aside first and removed after, so out_dir is
    missing for the moment between two renames, not for the whole removal; when another render put a folder
    there in that moment, that one is put aside in its turn."""
    aside = None
    for _ in range(8):
        if out_dir.exists():
            aside = Path(tempfile.mkdtemp(prefix=out_dir.name + ".old.", dir=out_dir.parent))
            try:
                os.replace(out_dir, aside / "context")
            except FileNotFoundError:  # another render moved it first
                pass
        try:
            os.replace(staging, out_dir)
            break
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
                aside = None
    else:
        raise OSError(errno.EEXIST, f"{out_dir} was written again by another render each time it was replaced")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem: copy, keeping the executable bit
        shutil.copy2(source, target)
