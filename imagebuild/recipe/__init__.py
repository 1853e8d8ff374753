"""Stage 1, recipe: the TOML a user writes, parsed and validated into plain typed values.

    model.py   Recipe and its tables (base, python, cuda, smoke, ...); load_recipe, parse_recipe
    reader.py  the TOML reader that keeps each key's line, and the key-path vocabulary of errors
    edits.py   the tables that change installed distributions: [[patches]], [[prune]]
    layers.py  which image layer a distribution goes in (framework, libraries, kernels, application)
    cuda.py    the CUDA vocabulary: CudaVersion, Arch (sm_120a), driver versions

Public surface: load_recipe, parse_recipe, Recipe, DebianBase, ImageBase, PythonSpec.
May import: errors, nothing else of ours: a leaf of plain types that knowledge/ judges (it imports this
package, never the other way). No engine, registry or CLI code.
"""

from imagebuild.recipe.model import DebianBase, ImageBase, PythonSpec, Recipe, load_recipe, parse_recipe

__all__ = ["DebianBase", "ImageBase", "PythonSpec", "Recipe", "load_recipe", "parse_recipe"]
