"""The real nvcc of the pip CUDA toolchain the images use (cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]
13.0.3.0 from PyPI, in a venv of the session's own, uv's cache making it seconds after the first time):
the cubins and fat binaries the readers are tested on come from it, not from an encoder of the
test's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TOOLCHAIN = "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0"
KERNEL = 'extern "C" __global__ void imagebuild_kernel(float* x) { x[threadIdx.x] += 1.0f; }\n'
# Unrolled enough that the fat binary is most of its library, as in a real kernel library.
OPS = """template <int N> __global__ void imagebuild_ops(float* x) {
  float a = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < N; ++i) a = a * 1.0001f + x[(threadIdx.x + i) & 255];
  x[threadIdx.x] = a;
}
template __global__ void imagebuild_ops<512>(float*);
template __global__ void imagebuild_ops<1024>(float*);
"""


class RealNvcc:
    def __init__(self, root: Path):
        self.root = root
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
        if uv is None:
            raise RuntimeError("uv is not installed (it is a dependency of imagebuild: pip install -e .)")
        venv = root / "venv"
        for args in (["venv", "-q", "--python", sys.executable, str(venv)],
                     ["pip", "install", "-q", "--python", str(venv / "bin" / "python"), TOOLCHAIN]):
            done = subprocess.run([uv, *args], capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"uv {' '.join(args[:2])}: {done.stderr[-1500:]}")
        self.nvcc = next(venv.glob("lib/python*/site-packages/nvidia/cu13/bin/nvcc"))
        (root / "kernel.cu").write_text(KERNEL)
        (root / "ops.cu").write_text(OPS)

    def _run(self, *args: str) -> None:
        done = subprocess.run([str(self.nvcc), *args], capture_output=True, text=True, cwd=self.root, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc {' '.join(args)}: {done.stderr[-1500:]}")

    def cubin(self, arch: str) -> Path:
        """`nvcc -cubin -arch=sm_120a`: what deep_gemm's JIT writes to its cache."""
        out = self.root / f"{arch}.cubin"
        if not out.exists():
            self._run("-cubin", f"-arch={arch}", "kernel.cu", "-o", str(out))
        return out

    def library(self, name: str, sass: tuple[int, ...], ptx: tuple[int, ...] = ()) -> Path:
        """A shared library whose .nv_fatbin nvcc wrote: SASS for each SM in `sass`, PTX for `ptx`."""
        out = self.root / f"lib{name}.so"
        if not out.exists():
            gencode = [f"-gencode=arch=compute_{sm},code=sm_{sm}" for sm in sass if sm not in ptx]
            gencode += [f"-gencode=arch=compute_{sm},code=[sm_{sm},compute_{sm}]" if sm in sass else
                        f"-gencode=arch=compute_{sm},code=compute_{sm}" for sm in ptx]
            obj = self.root / f"{name}.o"
            self._run("-c", "-Xcompiler", "-fPIC", *gencode, "ops.cu", "-o", str(obj))
            done = subprocess.run(["g++", "-shared", str(obj), "-o", str(out)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"g++ -shared: {done.stderr[-1500:]}")
        return out
