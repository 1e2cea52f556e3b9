#!/bin/sh
# Makes /opt/venv for one target of the Dockerfile; runs inside `docker build`, as root.
#
#   build-venv.sh cpu|gpu PYPROJECT EXTRAS
#
# cpu: torch at the project's pin from TORCH_INDEX_URL (PyTorch's CPU index by default) or a
#      wheel in /tmp/local/wheels; the build fails if the torch it got is a CUDA build.
# gpu: torch at the project's pin from the package index, never docker/local/wheels (on Linux
#      x86_64 PyPI serves the CUDA build, which brings the NVIDIA libraries as wheels), then
#      vllm==$VLLM_VERSION.
# Then the project's dependencies and EXTRAS (comma-separated) read from PYPROJECT, setuptools
# and wheel (the final stage installs the project itself with --no-build-isolation, without an
# index). The project is not installed here, so this layer is reused while only its code changes.
#
# /tmp/local (docker/local in the build context) may hold wheels/*.whl, offered to pip as
# --find-links, and certs/*.crt, certificate authorities pip trusts during the build (a
# TLS-intercepting proxy's); neither reaches the final image. A package index mirror comes in
# through pip's own variables (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST), which the
# Dockerfile declares as build arguments of the build stages only.
set -eu

flavor=$1
pyproject=$2
extras=$3
local_dir=/tmp/local

case "$flavor" in cpu | gpu) ;; *) echo "error: flavor must be cpu or gpu, got '$flavor'" >&2; exit 2 ;; esac

if ls "$local_dir"/certs/*.crt >/dev/null 2>&1; then
    cat /etc/ssl/certs/ca-certificates.crt "$local_dir"/certs/*.crt > /tmp/ca-bundle.pem 2>/dev/null \
        || cat "$local_dir"/certs/*.crt > /tmp/ca-bundle.pem
    export PIP_CERT=/tmp/ca-bundle.pem
    set -- "$local_dir"/certs/*.crt
    echo "pip trusts, besides the system's, $# certificate(s) from docker/local/certs"
fi
if ls "$local_dir"/wheels/*.whl >/dev/null 2>&1; then
    export PIP_FIND_LINKS="${PIP_FIND_LINKS:+$PIP_FIND_LINKS }$local_dir/wheels"
    echo "pip also looks in docker/local/wheels:" "$local_dir"/wheels/*.whl
fi

# The requirement lines: the torch pin alone, and everything else (dependencies + extras).
python3 - "$pyproject" "$extras" > /tmp/requirements.txt <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"])
for extra in filter(None, (e.strip() for e in sys.argv[2].split(","))):
    if extra not in project["optional-dependencies"]:
        sys.exit(f"error: pyproject.toml has no extra {extra!r} (known: {', '.join(project['optional-dependencies'])})")
    reqs += project["optional-dependencies"][extra]
print("\n".join(reqs))
PY
torch_req=$(grep -E '^torch[ =<>!~]' /tmp/requirements.txt) || { echo "error: no torch pin in $pyproject" >&2; exit 2; }

python3 -m venv /opt/venv
pip="/opt/venv/bin/python -m pip"
$pip install --upgrade pip setuptools wheel

if [ "$flavor" = cpu ]; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:+$PIP_EXTRA_INDEX_URL }$TORCH_INDEX_URL" $pip install "$torch_req"
    else
        $pip install "$torch_req"
    fi
    /opt/venv/bin/python -c 'import sys, torch; sys.exit(f"error: got a CUDA build of torch ({torch.__version__}, CUDA {torch.version.cuda}) for the cpu target: give TORCH_INDEX_URL or a CPU wheel in docker/local/wheels") if torch.version.cuda else print("torch", torch.__version__, "(CPU)")'
    $pip install -r /tmp/requirements.txt
else
    # From the index alone: a local wheel of the same release (a +cpu one) would outrank it.
    # shellcheck disable=SC2086  # $pip is a command and its arguments
    env -u PIP_FIND_LINKS $pip install "$torch_req"
    /opt/venv/bin/python -c 'import sys, torch; sys.exit(f"error: torch {torch.__version__} is not a CUDA build") if not torch.version.cuda else print("torch", torch.__version__, "CUDA", torch.version.cuda)'
    $pip install -r /tmp/requirements.txt ${VLLM_VERSION:+"vllm==$VLLM_VERSION"}
fi
$pip check
/opt/venv/bin/python - <<'PY'
import importlib.metadata as m
for name in ("torch", "transformers", "optuna", "vllm", "lm-eval"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        pass
PY
