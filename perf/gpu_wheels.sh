#!/usr/bin/env bash
# Wheels that perf/gpu_step_time.py needs on the lent H200 machine beyond what its image has
# (/work/.library/device/KINDS.md: torch, transformers, peft, accelerate, typer, rich, pandas,
# pyarrow, psutil, pyyaml ... but not pydantic, datasets or trl). Python 3.12 there; versions as in
# this project's venv. About 4.5 MB, into .whl/ (git-ignored through .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
ls -la .whl
