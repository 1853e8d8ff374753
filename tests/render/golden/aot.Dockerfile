# Rendered by imagebuild 0.1.0 from recipe "cuda-toolchain" and its lock.
# Do not edit: change the recipe, then `imagebuild lock` and `imagebuild build`.
# Needs BuildKit (DOCKER_BUILDKIT=1) for the cache and secret mounts. Each RUN step opens with its marker
# (`: imagebuild-step=...`, a no-op): a failed step is explained from it.
FROM imagebuild/base:bookworm-amd64-eeeeeeeeeeeeeeee

ENV VIRTUAL_ENV="/opt/venv" \
    CUDA_HOME="/opt/venv/lib/python3.11/site-packages/nvidia/cu13" \
    PATH="/opt/venv/bin:/opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    LIBRARY_PATH="/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib" \
    LD_LIBRARY_PATH="/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib"

# The virtual environment holds every locked wheel; no pip inside, nothing resolved here.
RUN --mount=type=bind,source=tools/uv,target=/usr/local/bin/uv \
    : imagebuild-step=venv && uv venv --quiet --no-cache --python /usr/bin/python3 /opt/venv

# Layer 1/3: framework (6 wheels, 104 MB of wheels)
COPY requirements/1-framework.txt /opt/imagebuild/requirements/1-framework.txt
RUN --mount=type=bind,source=tools/uv,target=/usr/local/bin/uv \
    --mount=type=cache,id=imagebuild-uv,target=/root/.cache/uv,sharing=locked \
    --mount=type=secret,id=ca \
    : imagebuild-step=install layer=framework && set -eu; \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi; \
    UV_LINK_MODE=copy uv pip install --quiet --no-config --python /opt/venv/bin/python \
      --no-deps --require-hashes --no-build -r /opt/imagebuild/requirements/1-framework.txt
RUN : imagebuild-step=links layer=framework && ln -sfn lib /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib64 && ln -sfn libcudart.so.13 /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so && ln -sfn libnvvm.so.4 /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvvm.so

# Layer 2/3: kernels (1 wheels, 5 MB of wheels)
COPY requirements/2-kernels.txt /opt/imagebuild/requirements/2-kernels.txt
RUN --mount=type=bind,source=tools/uv,target=/usr/local/bin/uv \
    --mount=type=cache,id=imagebuild-uv,target=/root/.cache/uv,sharing=locked \
    --mount=type=secret,id=ca \
    : imagebuild-step=install layer=kernels && set -eu; \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi; \
    UV_LINK_MODE=copy uv pip install --quiet --no-config --python /opt/venv/bin/python \
      --no-deps --require-hashes --no-build -r /opt/imagebuild/requirements/2-kernels.txt

# Layer 3/3: application (3 wheels, 14 MB of wheels)
COPY requirements/3-application.txt /opt/imagebuild/requirements/3-application.txt
RUN --mount=type=bind,source=tools/uv,target=/usr/local/bin/uv \
    --mount=type=cache,id=imagebuild-uv,target=/root/.cache/uv,sharing=locked \
    --mount=type=secret,id=ca \
    : imagebuild-step=install layer=application && set -eu; \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi; \
    UV_LINK_MODE=copy uv pip install --quiet --no-config --python /opt/venv/bin/python \
      --no-deps --require-hashes --no-build -r /opt/imagebuild/requirements/3-application.txt

ENV DG_JIT_CACHE_DIR="/var/cache/deep_gemm" \
    SGLANG_JIT_CACHE_DIR="/var/cache/sglang/jit" \
    TRITON_CACHE_DIR="/var/cache/triton" \
    SGLANG_ENABLE_JIT_DEEPGEMM="0"

# Kernels prebuilt for the serving shapes llama3-8b-bf16, llama3-8b-fp8kv ([aot]) for 12.0f: the modules the
# installed FlashInfer and SGLang load for them, compiled here (no GPU needed) into FlashInfer's AOT folder
# and SGLang's JIT cache, and listed with their sha256 and SASS archs in /opt/imagebuild/aot-manifest.json.
# Compiled modules are kept in the kernel cache (a cache mount, never a layer) by what decides their bytes:
# when only layers below changed, this step compiles nothing.
RUN --mount=type=bind,source=aot,target=/run/imagebuild/aot \
    --mount=type=cache,id=imagebuild-kernels,target=/var/cache/imagebuild/kernels,sharing=locked \
    : imagebuild-step=aot && set -eu; \
    export FLASHINFER_WORKSPACE_BASE=/tmp/imagebuild-aot HOME=/tmp/imagebuild-aot/home PYTHONDONTWRITEBYTECODE=1 \
      FLASHINFER_CUDA_ARCH_LIST="12.0f" IMAGEBUILD_KERNEL_CACHE=/var/cache/imagebuild/kernels; \
    /opt/venv/bin/python -B /run/imagebuild/aot/kernels_aot.py build /run/imagebuild/aot/aot.json /opt/imagebuild/aot-manifest.json; \
    rm -rf /tmp/imagebuild-aot

# The smoke probe and what it checks against: the image carries its own lock.
COPY imagebuild/probe.pyz imagebuild/expect.json imagebuild/lock.json /opt/imagebuild/

LABEL "io.imagebuild.base"="imagebuild/base:bookworm-amd64-eeeeeeeeeeeeeeee" \
    "io.imagebuild.cuda"="13.0" \
    "io.imagebuild.cuda.archs"="sm_120a" \
    "io.imagebuild.lock.sha256"="aa9e212c596b9eb564de4f5f5f0fa147ebe9452afaad9956233bd8307384b1a0" \
    "io.imagebuild.recipe"="cuda-toolchain" \
    "io.imagebuild.recipe.sha256"="aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
    "io.imagebuild.template.sha256"="bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" \
    "io.imagebuild.version"="0.1.0" \
    "org.opencontainers.image.description"="say \"hi\" for \$5" \
    "org.opencontainers.image.title"="imagebuild/cuda-toolchain" \
    "org.opencontainers.image.version"="13.0"

CMD ["python"]
