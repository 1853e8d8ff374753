"""imagebuild: reproducible container images for GPU machine learning.

The pipeline, one module a stage:
recipe -> knowledge (rules) -> lock -> render -> engine.build -> smoke.
"""

__version__ = "0.1.0"
