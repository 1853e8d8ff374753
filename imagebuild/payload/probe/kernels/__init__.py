"""The kernel builders the [aot] build step runs (copied beside kernels_aot.py, run as scripts), and their cache."""
