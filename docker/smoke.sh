#!/usr/bin/env bash
# Smoke test of the `cpu` Docker image, end to end, with runs and reports in host folders:
#
#   docker/smoke.sh            (or: make docker-smoke)
#
# 1. builds `--target cpu` (unless SKIP_BUILD=1), 2. `--help`, 3. `validate` and `verify` on
# the benchmark data shipped in the image, 4. the quickstart with a small budget, 5. `report`
# on its output (runs mounted read-only), 6. a two-trial sweep, 7. `report` on a run made
# outside the container (when a host `mlmt-bench` is given: HOST_MLMT_BENCH, which also reports
# the quickstart's runs on the host and checks the two reports are equal), then checks that
# every file the containers wrote on the host belongs to the host user, and prints the wall
# time of each step and the image size. Containers run with --network none and the Hugging
# Face hub offline: nothing is downloaded at run time.
#
# Settings (environment variables):
#   IMAGE            image tag (default mlmt-bench:cpu)
#   BASE_IMAGE       build argument (default: mlmt-base:bookworm when that image exists, made
#                    by docker/make-base.sh, else python:3.11-slim-bookworm)
#   SKIP_BUILD=1     test an existing IMAGE
#   WORK             host folder for runs/, reports/ and cache/ (default: a new temporary one)
#   RUN_AS           uid:gid the containers run as (default: the caller's; a root caller gets
#                    4242:4242, since root in the container would prove nothing about ownership)
#   HOST_MLMT_BENCH  a command that runs mlmt-bench on the host (default: `mlmt-bench` if on PATH)
#   TORCH_WHEEL      a CPU torch wheel for the build (default: looked up in pip's find-links)
#   EXTRA_CA_CERTS   certificates pip trusts during the build (default /usr/local/share/ca-certificates/*.crt)
set -euo pipefail

# ---------------------------------------------------------------------------------------------
# The quickstart's small budget, as --set overrides: EVERY override of this script is here.
# The shared base's fields (base.*) follow the run spec's `base:` section: when it changes,
# change them here and nowhere else.
SMALL_BUDGET=(
    train.token_budget=1500
    benchmark.eval_limit=20
    eval.every=5
    base.steps=300
    base.check_problems=20
    base.allow_invalid=true    # a 300-step base fails METHOD v3's testbed checks; its report says so
)
# ---------------------------------------------------------------------------------------------

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-mlmt-bench:cpu}
if [ -z "${BASE_IMAGE:-}" ]; then
    if docker image inspect mlmt-base:bookworm >/dev/null 2>&1; then BASE_IMAGE=mlmt-base:bookworm
    else BASE_IMAGE=python:3.11-slim-bookworm; fi
fi
if [ -z "${RUN_AS:-}" ]; then
    RUN_AS="$(id -u):$(id -g)"
    [ "$(id -u)" = 0 ] && RUN_AS=4242:4242
fi
run_uid=${RUN_AS%%:*}
run_gid=${RUN_AS##*:}
if [ -z "${HOST_MLMT_BENCH:-}" ] && command -v mlmt-bench >/dev/null; then HOST_MLMT_BENCH=mlmt-bench; fi
host_cmd=()
[ -n "${HOST_MLMT_BENCH:-}" ] && read -r -a host_cmd <<< "$HOST_MLMT_BENCH"
own_work=0
if [ -z "${WORK:-}" ]; then WORK=$(mktemp -d "${TMPDIR:-/tmp}/mlmt-docker-smoke.XXXXXX"); own_work=1; fi
mkdir -p "$WORK/runs" "$WORK/reports" "$WORK/cache" "$WORK/in"
# A root caller hands the folders to RUN_AS, as a user's own folders would be.
[ "$(id -u)" = 0 ] && chown -R "$RUN_AS" "$WORK"

say() { printf '[smoke] %s\n' "$*"; }
fail() { printf '[smoke] FAIL: %s\n' "$*" >&2; exit 1; }
TIMES=()
timed() {  # timed NAME COMMAND...: run, print and record the wall time
    local name=$1 t0 t1 secs
    shift
    say "$name: $*"
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    TIMES+=("$(printf '%-28s %8s s' "$name" "$secs")")
    say "$name: done in $secs s"
}
in_container() {  # in_container [docker run options] -- ARGS...: mlmt-bench ARGS in the image
    local opts=()
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    docker run --rm --network none --user "$RUN_AS" -e HF_HUB_OFFLINE=1 -e HF_DATASETS_OFFLINE=1 \
        "${opts[@]}" "$IMAGE" "$@"
}
set_args() { local o; for o in "${SMALL_BUDGET[@]}"; do printf -- '--set\n%s\n' "$o"; done; }
mapfile -t SET_ARGS < <(set_args)

# ------------------------------------------------------------------ 1. build
prepare_local() {  # docker/local: adds a CPU torch wheel and extra CA certificates from this machine
    # What a user put in docker/local/ (their own wheels and certificates, as the docs say) is kept:
    # this only adds files that are not there yet, and never deletes one.
    local version wheel dir
    mkdir -p docker/local/wheels docker/local/certs
    version=$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml)
    wheel=${TORCH_WHEEL:-}
    if [ -z "$wheel" ]; then
        for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
            dir=${dir#file://}
            for w in "$dir"/torch-"$version"+cpu-cp311-*.whl; do [ -f "$w" ] && wheel=$w && break 2; done
        done
    fi
    if [ -n "$wheel" ]; then
        [ -e "docker/local/wheels/$(basename "$wheel")" ] \
            || ln -f "$wheel" docker/local/wheels/ 2>/dev/null || cp "$wheel" docker/local/wheels/
        BUILD_ARGS+=(--build-arg TORCH_INDEX_URL=)
        say "CPU torch wheel from this machine: $wheel"
    else
        say "no local CPU torch $version wheel: the build takes it from the Dockerfile's TORCH_INDEX_URL"
    fi
    for cert in ${EXTRA_CA_CERTS:-/usr/local/share/ca-certificates/*.crt}; do
        [ -f "$cert" ] || continue
        [ -e "docker/local/certs/$(basename "$cert")" ] || cp "$cert" docker/local/certs/
        say "pip trusts $cert during the build"
    done
    for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
        # file:// indexes of this machine are not inside the build
        if [ -n "${!var:-}" ] && [[ "${!var}" != file:* ]]; then BUILD_ARGS+=(--build-arg "$var=${!var}"); fi
    done
}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    prepare_local
    timed "build (--target cpu)" docker build --network host --target cpu "${BUILD_ARGS[@]}" -t "$IMAGE" .
fi
SIZE=$(docker image ls --format '{{.Size}}' "$IMAGE" | head -n 1)
[ -n "$SIZE" ] || fail "no image $IMAGE"
say "image $IMAGE: $SIZE"

# ------------------------------------------------------------------ 2-3. the CLI and the data
default_user=$(docker run --rm --entrypoint id "$IMAGE" -u)
[ "$default_user" != 0 ] || fail "the image runs as root by default"
say "default user of the image: uid $default_user"
cli_help() { in_container -- --help > "$WORK/help.txt"; }
timed "--help" cli_help
grep -q report "$WORK/help.txt" || fail "--help does not list the report command"
timed "validate quickstart" in_container -- validate registry/runs/quickstart.yaml "${SET_ARGS[@]}"
# gsm8k/0 is the first test problem (answer 18): its data must be inside the image.
printf '%s\n' '{"benchmark": "gsm8k", "id": "0", "response": "9 eggs at 2 dollars each: \\boxed{18}"}' > "$WORK/in/verify.jsonl"
[ "$(id -u)" = 0 ] && chown -R "$RUN_AS" "$WORK/in"
timed "verify (data in the image)" in_container -v "$WORK/in:/in" -- verify math /in/verify.jsonl --out /in/verified.jsonl
grep -q '"correct": true' "$WORK/in/verified.jsonl" || fail "verify did not score gsm8k/0 correct: $(cat "$WORK/in/verified.jsonl")"

# ------------------------------------------------------------------ 4-5. quickstart and report
timed "quickstart (small budget)" in_container -v "$WORK/runs:/runs" -v "$WORK/cache:/cache" -- \
    --quiet run registry/runs/quickstart.yaml "${SET_ARGS[@]}"
newest() {  # newest DIR PREFIX: name of the last DIR/PREFIX-* (run directories end in a UTC stamp)
    local all=("$1/$2"-*)
    [ -e "${all[-1]}" ] || fail "no $2-* directory in $1"
    basename "${all[-1]}"
}
exp_dir=$(newest "$WORK/runs" quickstart)
timed "report (quickstart)" in_container -v "$WORK/runs:/runs:ro" -v "$WORK/reports:/reports" -- \
    report "/runs/$exp_dir" --out /reports/quickstart
for f in comparison.md acc_vs_tokens.png; do
    [ -s "$WORK/reports/quickstart/$f" ] || fail "no $f in $WORK/reports/quickstart"
done
# The same runs reported on the host must read the same: reports name runs relative to
# themselves, so the container's /runs and the host's $WORK/runs give the same text.
if [ -n "${HOST_MLMT_BENCH:-}" ]; then
    timed "report (quickstart, host)" "${host_cmd[@]}" --quiet report "$WORK/runs/$exp_dir" --out "$WORK/reports/quickstart-host"
    cmp -s "$WORK/reports/quickstart/comparison.md" "$WORK/reports/quickstart-host/comparison.md" || {
        diff "$WORK/reports/quickstart/comparison.md" "$WORK/reports/quickstart-host/comparison.md" | head -n 20 >&2
        fail "the container's report of the quickstart differs from the host's report of the same runs"
    }
    say "the container's comparison.md equals the host's report of the same runs, byte for byte"
    [ "$(id -u)" = 0 ] && chown -R "$RUN_AS" "$WORK/reports/quickstart-host"
fi

# ------------------------------------------------------------------ 6. a sweep
timed "sweep (2 trials)" in_container -v "$WORK/runs:/runs" -v "$WORK/cache:/cache" -- \
    --quiet sweep sweeps/quickstart-mlmt.yaml -n 2 --seed 0 "${SET_ARGS[@]}"
ls "$WORK"/runs/quickstart-mlmt-sweep/*.db >/dev/null || fail "the sweep wrote no study in $WORK/runs"

# ------------------------------------------------------------------ 7. a run made on the host
if [ -n "${HOST_MLMT_BENCH:-}" ]; then
    mkdir -p "$WORK/host-runs"
    timed "host run (grpo)" env MLMT_BENCH_CACHE="$WORK/host-cache" "${host_cmd[@]}" --quiet run registry/runs/grpo.yaml \
        "${SET_ARGS[@]}" --set "output_dir=$WORK/host-runs"
    host_run=$(newest "$WORK/host-runs" grpo)
    [ "$(id -u)" = 0 ] && chown -R "$RUN_AS" "$WORK/host-runs"
    timed "report (host run)" in_container -v "$WORK/host-runs:/runs:ro" -v "$WORK/reports:/reports" -- \
        report "/runs/$host_run" --out /reports/host-run
    [ -s "$WORK/reports/host-run/comparison.md" ] || fail "no comparison.md for the host run"
else
    say "no HOST_MLMT_BENCH: skipped the report of a run made outside the container"
fi

# ------------------------------------------------------------------ ownership on the host
foreign=$(find "$WORK/runs" "$WORK/reports" "$WORK/cache" \( ! -uid "$run_uid" -o ! -gid "$run_gid" \) -print | head -n 5)
[ -z "$foreign" ] || fail "files not owned by $RUN_AS on the host: $foreign"
say "$(find "$WORK/runs" "$WORK/reports" "$WORK/cache" | wc -l) files and folders in $WORK, all owned by $RUN_AS"
say "report: $WORK/reports/quickstart/comparison.md"
sed -n '1,12p' "$WORK/reports/quickstart/comparison.md"

say "wall times:"
printf '  %s\n' "${TIMES[@]}"
say "image $IMAGE: $SIZE (base $BASE_IMAGE)"
if [ "$own_work" = 1 ] && [ "${KEEP:-0}" != 1 ]; then rm -rf "$WORK"; else say "kept $WORK"; fi
say "OK"
