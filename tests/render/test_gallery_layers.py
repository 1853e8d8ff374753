"""The gallery's variants share their bottom layers: rendered from the committed recipes and locks, the
flagship and each variant run the same build steps, on the same context bytes, up to where they differ.

Docker's classic image store keys a pulled layer by its chain ID (the layer and every layer below it), so
a node holding the flagship fetches again every layer above the first step that differs: that step has
to sit as high as the variant's difference allows. Measured on real pulls by bench/gallery.py
(docs/benchmarks.md, "A gallery's second image on a node"); here the order itself, without an engine.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from imagebuild.lock import read_lock
from imagebuild.recipe.model import load_recipe
from imagebuild.render import render_context
from imagebuild.render.markers import parse_marker

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = "sglang-blackwell"
SOURCES = re.compile(r"--mount=type=bind,source=([^,\s]+)")
MAKES_A_LAYER = ("RUN", "COPY", "ADD")


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments and blank lines left out."""
    found, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            found.append(current.strip())
            current = ""
    return found


def context_bytes(context: Path, source: str) -> bytes:
    """What a step reads of the context at `source`: a file's bytes, a folder's files by name, or a mark
    that it is not in the context (uv, bound from the host)."""
    path = context / source
    if path.is_dir():
        return b"".join(p.relative_to(path).as_posix().encode() + b"\0" + p.read_bytes()
                        for p in sorted(path.rglob("*")) if p.is_file())
    return path.read_bytes() if path.is_file() else b"<not in the context>"


def steps(context: Path) -> list[tuple[str, str]]:
    """Each instruction with the digest of everything a build has decided by the end of it: every
    instruction so far (ENV included) and the context bytes each COPY or bind mount read."""
    chain, found = hashlib.sha256(), []
    for instruction in instructions((context / "Dockerfile").read_text()):
        chain.update(instruction.encode() + b"\n")
        sources = SOURCES.findall(instruction)
        if instruction.startswith(("COPY ", "ADD ")):
            sources += [word for word in instruction.split()[1:-1] if not word.startswith("--")]
        for source in sources:
            chain.update(source.encode() + b"\0" + hashlib.sha256(context_bytes(context, source)).digest())
        found.append((instruction, chain.hexdigest()))
    return found


def rendered(name: str, out: Path) -> list[tuple[str, str]]:
    recipe, lock = load_recipe(REPO / "recipes" / f"{name}.toml"), read_lock(REPO / "lockfiles" / f"{name}.lock")
    return steps(render_context(lock, recipe, out / name, uv_path=None))


def first_difference(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x[1] != y[1])


def shared_layers(a: list[tuple[str, str]], upto: int) -> list[str]:
    return [instruction.split()[0] for instruction, _ in a[:upto] if instruction.startswith(MAKES_A_LAYER)]


def marker(instruction: str) -> str:
    """The step as its marker names it (render's own parse_marker): its kind, and its layer where it has
    one; an instruction without a marker (COPY, ENV) by its keyword."""
    found = parse_marker(instruction)
    if found is None:
        return instruction.split()[0]
    layer = found.fields.get("layer")
    return f"{found.kind} layer={layer}" if layer else found.kind


@pytest.mark.parametrize("variant, differs_at", [
    # Hopper keeps the FlashAttention 3 and FlashMLA objects the flagship prunes from sglang-kernel.
    ("sglang-hopper", "install layer=kernels"),
    # The NVFP4 variant declares other [aot] shapes: every layer below the kernel step is the flagship's.
    ("sglang-blackwell-nvfp4", "aot"),
])
def test_a_variant_runs_the_flagships_steps_below_where_it_differs(tmp_path, variant, differs_at):
    flagship, other = rendered(FLAGSHIP, tmp_path), rendered(variant, tmp_path)
    at = first_difference(flagship, other)
    assert marker(other[at][0]) == differs_at, other[at][0][:200]
    below = [marker(instruction) for instruction, _ in other[:at]]
    assert {"install layer=framework", "install layer=libraries"} <= set(below), below
    # What the node holding the flagship already has, by the chain: at least the venv, framework (with its
    # links) and libraries, each an install and its requirements file.
    assert len(shared_layers(other, at)) >= 6, shared_layers(other, at)


def test_with_the_kernels_below_the_libraries_hopper_would_differ_below_them(tmp_path, monkeypatch):
    """The negative control: the order before stop 51 (kernels, then libraries) puts the first difference
    below the libraries, so Docker fetched the libraries, application and patch layers again."""
    monkeypatch.setattr("imagebuild.render.context.LAYER_ORDER", ("framework", "kernels", "libraries", "application"))
    flagship, hopper = rendered(FLAGSHIP, tmp_path), rendered("sglang-hopper", tmp_path)
    at = first_difference(flagship, hopper)
    assert marker(hopper[at][0]) == "install layer=kernels"
    assert "install layer=libraries" in [marker(instruction) for instruction, _ in hopper[at:]]


def test_the_vllm_image_parts_at_its_framework_and_a_differing_bound_file_is_seen(tmp_path):
    """vLLM 0.33 pins torch 2.14.0 (the flagship 2.14.1): the chain parts at the framework's requirements,
    right above the venv. And the chain reads the bytes a step binds, not only its text: the same
    Dockerfile over another prune spec differs at the step that binds it."""
    flagship, vllm = rendered(FLAGSHIP, tmp_path), rendered("vllm-blackwell", tmp_path)
    at = first_difference(flagship, vllm)
    assert vllm[at][0].startswith("COPY requirements/1-framework.txt"), vllm[at][0]
    assert [marker(i) for i, _ in vllm[:at]][-1] == "venv"
    context = tmp_path / FLAGSHIP
    before = steps(context)
    spec = context / "prune" / "2-libraries.json"
    spec.write_text(spec.read_text().replace("build_backend.py", "build_backend.pyc"))
    after = steps(context)
    assert marker(after[first_difference(before, after)][0]) == "install layer=libraries"
