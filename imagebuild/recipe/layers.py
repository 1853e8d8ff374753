"""LayerPlan: which image layer each locked wheel goes into.

Heavy, stable wheels first (torch, the nvidia-* CUDA libraries, triton), kernels next, other libraries,
the application last: bumping the application's pin then rebuilds only the last layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LAYER_ORDER = ("framework", "kernels", "libraries", "application")

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
