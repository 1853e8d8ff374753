"""LayerPlan: which image layer each locked wheel goes into.

Heavy, stable wheels first (torch, the nvidia-* CUDA libraries, triton), other libraries next, the kernels,
the application last: bumping the application's pin then rebuilds only the last layers. The kernels sit above
the libraries because they are what a gallery's variants differ by (the flagship prunes the Hopper-only
FlashAttention 3 and FlashMLA objects its Hopper sibling keeps): Docker's classic image store keys a pulled
layer by its chain ID (the layer and every layer below it), so a node that holds one variant fetches again
every layer above the first one that differs (docs/benchmarks.md, "A gallery's second image on a node").
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LAYER_ORDER = ("framework", "libraries", "kernels", "application")

# Name globs over canonical distribution names; a recipe's [python.layers] comes first.
DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "framework": ("torch", "torchvision", "torchaudio", "triton", "nvidia-*", "cuda-toolkit",
                  "cuda-bindings", "cuda-python", "cuda-pathfinder"),
    "kernels": ("flashinfer-*", "sgl-kernel", "sglang-kernel", "*deep-gemm*", "deep-ep", "flash-attn*",
                "xformers", "humming-kernels", "vllm-flash-attn", "flash-mla", "cutlass*",
                "quack-kernels"),
}


@dataclass(frozen=True)
class LayerPlan:
    """The rule set; `layer_of` is a pure function of a name."""

    overrides: dict[str, tuple[str, ...]]
    application: frozenset[str]  # canonical names the recipe asks for at top level

    @classmethod
    def for_recipe(cls, recipe) -> "LayerPlan":
        top = frozenset(canonicalize_name(Requirement(r).name) for r in recipe.python.requirements)
        return cls(overrides=dict(recipe.python.layers), application=top)

    def layer_of(self, name: str) -> str:
        name = canonicalize_name(name)
        for groups in (self.overrides, DEFAULT_GROUPS):
            for layer in LAYER_ORDER:
                if any(fnmatchcase(name, pattern) for pattern in groups.get(layer, ())):
                    return layer
        return "application" if name in self.application else "libraries"
