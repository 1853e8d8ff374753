"""What imagebuild knows about CUDA, drivers, GPUs, torch, Debian and glibc, with sources.

    cuda.py       the vocabulary: CudaVersion, Arch (sm_120a), driver versions
    facts.py      compat.toml loaded and validated once (every entry names its source and date)
    compat.toml   the data table: only what no artifact states (driver <-> CUDA, arch <-> CUDA, ...)

The rules that apply these facts to a recipe are imagebuild/compat.py; doctor asks the same facts
about a live host. May import: errors. No engine, registry, recipe or CLI code. A new fact goes into
compat.toml with its source; a new lookup into facts.py.
"""
