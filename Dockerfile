# GPU image of mlmt-bench: CUDA runtime, Python 3.11, the project with its `gpu` (vLLM) and
# `eval` (lm-eval) extras, and the registry/, sweeps/ and reports/ folders.
#
#   docker build -t mlmt-bench:gpu .
#   docker run --gpus all --ipc=host -v "$PWD/runs:/app/runs" mlmt-bench:gpu run registry/runs/SPEC.yaml
#
# torch: the project pins torch==2.13.0 and every vLLM release pins one exact torch. VLLM_VERSION
# is a release whose pin is that same torch (vllm 0.32.0 -> torch==2.13.0), so one pip resolve
# installs both with no override. The torch wheel pip takes from PyPI on Linux x86_64 is a CUDA
# build that carries its own CUDA libraries; vllm 0.32.0's kernels depend on CUDA 13 packages
# (cu13), hence a CUDA 13 base image and a host NVIDIA driver that supports CUDA 13 (580 or later).
# Other vLLM releases: docs/gpu.md, "torch and vLLM versions".
#
# Never built on the project's own machines (they have no Docker engine): see docs/gpu.md.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu22.04
FROM ${CUDA_IMAGE}

ARG VLLM_VERSION=0.32.0

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/cache/huggingface \
    MLMT_BENCH_REGISTRY=/app/registry

# Python 3.11 from the deadsnakes PPA (Ubuntu 22.04 ships 3.10, and its python3.11 is a release
# candidate). A C compiler and the Python
# headers are runtime needs: Triton (used by vLLM) compiles a small launcher module on first use.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential git \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv \
 && python -m pip install --upgrade pip

WORKDIR /app

# Dependencies first (this layer is reused while only other files change).
COPY pyproject.toml README.md ./
COPY mlmt_bench ./mlmt_bench
RUN pip install "vllm==${VLLM_VERSION}" -e ".[gpu,eval]" \
 && python -c "import importlib.metadata as m; print('torch', m.version('torch'), 'vllm', m.version('vllm'), 'transformers', m.version('transformers'))"

# Everything else the CLI reads: registry/ (run, model, benchmark and accelerate specs),
# sweeps/, reports/, docs (filtered by .dockerignore).
COPY . .
RUN mlmt-bench --help > /dev/null

ENTRYPOINT ["mlmt-bench"]
CMD ["--help"]
