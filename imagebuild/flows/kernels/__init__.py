"""The [aot] kernel step seen from the build flow, and a fresh runner's kernel cache seeded from a registry:

    step.py   what the step did, read from the build's output (compiled, reused, seconds, each module's
              progress), and its one-line summary; the seed build's counts
    layer.py  the [aot] layer of a registry build cache (--cache-from), read through registry/ and laid out
              as kernel cache entries; several layers' entries as one union
    seed.py   those entries put into the engine's kernel cache mount by a small build of its own
"""

from imagebuild.flows.kernels.layer import (KernelLayer, entry_names, find_kernel_layer, lay_out, merge_entries,
                                            read_kernel_layer)
from imagebuild.flows.kernels.seed import seed_engine
from imagebuild.flows.kernels.step import (KernelStepWatch, parse_progress, parse_seeded, parse_stats, progress_text,
                                           summary)

__all__ = ["KernelLayer", "KernelStepWatch", "entry_names", "find_kernel_layer", "lay_out", "merge_entries",
           "parse_progress", "parse_seeded", "parse_stats", "progress_text", "read_kernel_layer", "seed_engine",
           "summary"]
