"""One or two real examples for every command, printed at the end of its --help (as uv and skopeo do).

Each is a command line this repository's own recipes and images answer to; tests/cli/test_examples.py
parses every one with the real parser and checks that the recipes and locks it names exist.
"""

from __future__ import annotations

import argparse

FLAGSHIP = "recipes/sglang-blackwell.toml"
FLAGSHIP_IMAGE = "imagebuild/sglang-blackwell:0.5.23-cu130"
SMALL = "recipes/cuda-toolchain.toml"
SMALL_IMAGE = "imagebuild/cuda-toolchain:13.0"

# command -> ((command line, what it does), ...)
EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "check": ((f"imagebuild check {FLAGSHIP}", "findings, and whether the committed lock is fresh"),
              (f"imagebuild check {SMALL} --json", "the same as JSON, for CI")),
    "lock": ((f"imagebuild lock {FLAGSHIP}", "resolve and hash every wheel into lockfiles/sglang-blackwell.lock"),
             (f"imagebuild lock {FLAGSHIP} --upgrade-package sglang==0.5.22",
              "move one pin in the recipe, relock, and print what moved")),
    "diff-lock": (("imagebuild diff-lock HEAD~1:lockfiles/sglang-blackwell.lock lockfiles/sglang-blackwell.lock",
                   "what the last commit moved, which steps a build redoes, which kernels compile again"),
                  ("imagebuild diff-lock main:lockfiles/cuda-toolchain.lock lockfiles/cuda-toolchain.lock --json",
                   "against main, as JSON for a pull request's comment")),
    "render": ((f"imagebuild render {SMALL} -o /tmp/cuda-toolchain-context", "the Dockerfile and context, to read"),),
    "build": ((f"imagebuild build {FLAGSHIP}", "the flagship, smoke-tested, then tagged"),
              (f"imagebuild build {SMALL} --registry localhost:5000/ml/cuda-toolchain",
               "build by lock: reuse the image pushed for this lock, else build and push it")),
    "smoke": ((f"imagebuild smoke {FLAGSHIP_IMAGE}", "the in-image probe again, on the GPUs where visible"),
              (f"imagebuild smoke {SMALL_IMAGE} --no-gpus --json", "without GPUs, as JSON")),
    "patches": ((f"imagebuild patches {FLAGSHIP}", "do the recipe's patches apply to the locked releases?"),
                (f"imagebuild patches {FLAGSHIP} --version flashinfer-python==0.7.4",
                 "and to another release, before moving the pin")),
    "push": ((f"imagebuild push {SMALL_IMAGE} localhost:5000/ml/cuda-toolchain:13.0", "an engine image"),
             ("imagebuild push /tmp/cuda-toolchain.oci localhost:5000/ml/cuda-toolchain:13.0 "
              "--digest-file digest.txt", "an OCI layout, its digest written down")),
    "export-oci": ((f"imagebuild export-oci {SMALL_IMAGE} -o /tmp/cuda-toolchain.oci",
                    "a deterministic OCI layout with its SBOM"),
                   ("imagebuild export-oci imagebuild/cuda-toolchain:13.0-amd64 imagebuild/cuda-toolchain:13.0-arm64 "
                    "-o /tmp/cuda-toolchain.oci", "two platforms' images as one index")),
    "verify": ((f"imagebuild verify {SMALL_IMAGE} --lock lockfiles/cuda-toolchain.lock",
                "versions, RECORD hashes and patches against the lock"),),
    "diff": ((f"imagebuild diff {SMALL_IMAGE} oci:/tmp/cuda-toolchain.oci", "the first files that differ"),),
    "sbom": ((f"imagebuild sbom {FLAGSHIP_IMAGE} -o /tmp/sglang-blackwell.cdx.json", "a CycloneDX SBOM"),),
    "doctor": (("imagebuild doctor --python /opt/venv/bin/python", "a live venv: driver, toolkits, caches"),
               (f"imagebuild doctor --image {FLAGSHIP_IMAGE} --env CUDA_HOME=/usr/local/cuda",
                "an image, trying a fix before making it")),
    "adopt": (("imagebuild adopt --python /opt/venv/bin/python -o recipes/sglang-box.toml",
               "the venv that works as a recipe: pins, [cuda], patches for its hand edits"),
              (f"imagebuild adopt --image {FLAGSHIP_IMAGE} --arch sm_120a -o recipes/sglang-again.toml --json",
               "an image in the engine, for a GPU this host does not have, as JSON")),
    "export-lxc": ((f"imagebuild export-lxc {FLAGSHIP_IMAGE}", "a Proxmox LXC template (tar.zst)"),
                   (f"imagebuild export-lxc {FLAGSHIP_IMAGE} --oci", "an OCI archive for Proxmox 9.1+")),
    "lxc-config": (("imagebuild lxc-config --gpus 0,1", "the passthrough lines for two GPUs of this host"),),
    "cache": (("imagebuild cache", "what imagebuild keeps, and where"),
              ("imagebuild cache --trim 20G", "trim it to 20 GB, oldest first")),
}


EPILOG_HEAD = "examples:"


def epilog(command: str) -> str | None:
    """The examples block of a command's --help: each command line, and under it what it does."""
    examples = EXAMPLES.get(command)
    if not examples:
        return None
    return "\n".join([EPILOG_HEAD, *(f"  {line}\n      {what}" for line, what in examples)])


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, but the examples block keeps its lines (a command line is never re-wrapped)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EPILOG_HEAD + "\n"):
            return text
        return super()._fill_text(text, width, indent)
