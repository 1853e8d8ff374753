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

# Layer 3/3: application (1 wheels, 0 MB of wheels)
COPY requirements/3-application.txt /opt/imagebuild/requirements/3-application.txt
RUN --mount=type=bind,source=tools/uv,target=/usr/local/bin/uv \
    --mount=type=cache,id=imagebuild-uv,target=/root/.cache/uv,sharing=locked \
    --mount=type=secret,id=ca \
    : imagebuild-step=install layer=application && set -eu; \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi; \
    UV_LINK_MODE=copy uv pip install --quiet --no-config --python /opt/venv/bin/python \
      --no-deps --require-hashes --no-build -r /opt/imagebuild/requirements/3-application.txt

# Patches, each applied exactly (no fuzz) to the installed files; a hunk that does not apply fails the build.
COPY imagebuild/apply_patch.py /opt/imagebuild/apply_patch.py
COPY patches/01-fix.patch /opt/imagebuild/patches/01-fix.patch
RUN : imagebuild-step=patch package=sgl-deep-gemm file=01-fix.patch && /opt/venv/bin/python -B /opt/imagebuild/apply_patch.py --strip 1 \
      --package sgl-deep-gemm --sha256 ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff /opt/venv/lib/python3.11/site-packages /opt/imagebuild/patches/01-fix.patch

ENV DG_JIT_CACHE_DIR="/var/cache/deep_gemm"

# The smoke probe and what it checks against: the image carries its own lock.
COPY imagebuild/probe.pyz imagebuild/expect.json imagebuild/lock.json /opt/imagebuild/

LABEL "io.imagebuild.base"="imagebuild/base:bookworm-amd64-eeeeeeeeeeeeeeee" \
    "io.imagebuild.cuda"="13.0" \
    "io.imagebuild.cuda.archs"="sm_120a" \
    "io.imagebuild.lock.sha256"="b2604653c8a03b04388c7cb637050a55a361d75559661bfdeefb81920f755e7a" \
    "io.imagebuild.patches"="sgl-deep-gemm:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff" \
    "io.imagebuild.recipe"="cuda-toolchain" \
    "io.imagebuild.recipe.sha256"="aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
    "io.imagebuild.template.sha256"="bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" \
    "io.imagebuild.version"="0.1.0" \
    "org.opencontainers.image.description"="say \"hi\" for \$5" \
    "org.opencontainers.image.title"="imagebuild/cuda-toolchain" \
    "org.opencontainers.image.version"="13.0"

CMD ["python"]
