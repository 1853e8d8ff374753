"""What imagebuild puts into images: the code that runs on the image's own Python.

    probe/          the smoke test and doctor's diagnosis, packed as one zipapp (probe.pyz)
    apply_patch.py  applies a recipe's [[patches]] exactly to installed files
    prune.py        applies a recipe's [[prune]] in the step that installs a distribution
    record_reads.py lists the files an import reads, for eStargz's prefetch (run on a built image, not built in)

Boundary: everything here imports only the standard library and itself (tests/test_architecture.py
walks the imports), runs under any Python >= 3.9, and is the same code `doctor` runs on a host. Host
code reads the files through the names below; `checksum()` is what the lock records as payload_sha256.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHER = HERE / "apply_patch.py"
PRUNER = HERE / "prune.py"
RECORDER = HERE / "record_reads.py"


def checksum() -> str:
    """sha256 over the probe zipapp, the patcher, the pruner and the C shims the [aot] step compiles: a
    change to any of them changes the image a lock builds."""
    from imagebuild.payload.probe import bundle
    digest = hashlib.sha256()
    shims = [(path.name, path.read_bytes()) for path in sorted(Path(bundle.SOURCE).rglob("*.c"))]  # [aot]'s step
    for name, data in [("probe.pyz", bundle.zipapp_bytes()),
                       ("apply_patch.py", PATCHER.read_bytes()),
                       ("prune.py", PRUNER.read_bytes())] + shims:
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()
