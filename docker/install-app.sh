#!/bin/sh
# Installs the source tree in /app into /opt/venv (editable: the data/, registry/ and sweeps/
# folders beside the package are where the code looks for them) and checks the CLI starts.
# Runs inside `docker build`, as root, in each final target; needs no package index.
set -eu
/opt/venv/bin/python -m pip install --no-deps --no-build-isolation --no-index -e /app
/opt/venv/bin/python -m compileall -q /app/mlmt_bench
# Runs go to ./runs by default (run specs' output_dir, sweeps): from /app that is the /runs volume.
ln -s /runs /app/runs
/opt/venv/bin/mlmt-bench --help > /dev/null
