# mlmt-bench in Docker: two targets on one plain Python 3.11 / Debian base.
#
#   docker build --network host --target cpu -t mlmt-bench:cpu .   # CPU torch: run, report, validate, sweep
#   docker build --network host --target gpu -t mlmt-bench:gpu .   # CUDA torch + vLLM (the `gpu` extra)
#
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/runs:/runs" -v "$HOME/.cache/mlmt-bench:/cache" \
#       mlmt-bench:cpu run registry/runs/quickstart.yaml
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/runs:/runs:ro" -v "$PWD/reports:/reports" \
#       mlmt-bench:cpu report /runs/quickstart-<stamp> --out /reports/quickstart
#
# The image runs as the non-root user `mlmt` (uid and gid 1000); `--user` makes the files it writes in
# mounted folders the caller's. Volumes: /runs (./runs of /app is a link to it, so run specs'
# default output_dir lands there), /cache (warm-start checkpoints, Hugging Face and other
# caches), /reports. Details and the commands this file was tested with: docs/gpu.md, "Docker".
#
# Build arguments:
#   BASE_IMAGE       any Debian image with Python 3.11 and its venv module: python:3.11-slim-bookworm,
#                    or mlmt-base:bookworm made by docker/make-base.sh from a Debian mirror alone
#   TORCH_INDEX_URL  cpu target: where the CPU torch wheel comes from (empty: only the package
#                    index and docker/local/wheels)
#   VLLM_VERSION     gpu target: vLLM release; its torch pin must be the project's (docs/gpu.md)
#   CPU_EXTRAS, GPU_EXTRAS   the project's extras installed in each target
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST   a package index mirror, seen by the
#                    build stages only (pass no credentials this way: build arguments are kept
#                    in the build stages' history)
# docker/local/ (git-ignored) may hold wheels/*.whl and certs/*.crt for the build: see
# docker/build-venv.sh. Neither reaches the final images.
#
# Stage order matters to the classic builder, which builds every stage before the target:
# base, venv-cpu, source, cpu, then venv-gpu, gpu.

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- common to every stage
FROM ${BASE_IMAGE} AS base

ENV LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    MLMT_BENCH_REGISTRY=/app/registry \
    MLMT_BENCH_CACHE=/cache/bootstrap \
    HF_HOME=/cache/huggingface \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib \
    TRITON_CACHE_DIR=/cache/triton

# The volumes' mount points are writable by any uid (mode 1777, like /tmp), so that
# `--user "$(id -u):$(id -g)"` works with or without a volume mounted on them.
RUN groupadd --gid 1000 mlmt \
 && useradd --uid 1000 --gid mlmt --create-home --shell /bin/bash mlmt \
 && install -d -m 1777 -o mlmt -g mlmt /runs /cache /reports \
 && python3 -c "import sys; assert sys.version_info[:2] >= (3, 11), sys.version"

# The final images' settings, here once for both targets (the build stages ignore them); the
# final stages set only USER, after their last RUN.
WORKDIR /app
VOLUME ["/runs", "/cache"]
ENTRYPOINT ["mlmt-bench"]
CMD ["--help"]

# ---------------------------------------------------------------- cpu
FROM base AS venv-cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG CPU_EXTRAS=postgres
COPY docker/local/ /tmp/local/
COPY docker/build-venv.sh pyproject.toml /tmp/
RUN /tmp/build-venv.sh cpu /tmp/pyproject.toml "${CPU_EXTRAS}"

# The source tree as the final images hold it: the build context less docker/local.
FROM base AS source
COPY . /app
RUN rm -rf /app/docker/local

FROM base AS cpu
COPY --from=venv-cpu /opt/venv /opt/venv
COPY --from=source /app /app
RUN /app/docker/install-app.sh
USER 1000:1000

# ---------------------------------------------------------------- gpu
FROM base AS venv-gpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG VLLM_VERSION=0.32.0
ARG GPU_EXTRAS=gpu,eval,postgres
COPY docker/local/ /tmp/local/
COPY docker/build-venv.sh pyproject.toml /tmp/
RUN /tmp/build-venv.sh gpu /tmp/pyproject.toml "${GPU_EXTRAS}"

FROM base AS gpu
# Triton (under vLLM) compiles a small launcher module on first use: a C compiler and the
# Python headers are run-time needs (python:3.11-slim has the headers, Debian's python3 not).
# hadolint ignore=DL3008
RUN headers=$(python3 -c 'import os, sysconfig; print("" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "python3-dev")') \
 && apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev ${headers:+"$headers"} \
 && rm -rf /var/lib/apt/lists/*
COPY --from=venv-gpu /opt/venv /opt/venv
COPY --from=source /app /app
RUN /app/docker/install-app.sh
USER 1000:1000
