#!/usr/bin/env bash
# The Docker image on every node of a Ray cluster (README, "Experiment trackers and Ray clusters"):
# a head with no CPUs (so every task runs on the worker) and one 1-CPU worker node, both containers
# of mlmt-bench:ray on this machine, the driver `docker exec`ed in the head's; then the same
# 2-arm x 2-seed experiment (tests/test_ray.py's) with --workers 2 on the host, and a comparison of
# what the two computed (metrics without timing, per-problem outcomes).
#
#   docker build --target cpu --build-arg CPU_EXTRAS=postgres,ray,trackers -t mlmt-bench:ray .
#   perf/ray_docker_check.sh TINY_CHECKPOINT_DIR [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:?usage: $0 TINY_CHECKPOINT_DIR [WORK_DIR]}
WORK=${2:-/tmp/raydock}
PORT=${PORT:-6391}
PY=${PY:-.venv/bin/python}
mkdir -p "$WORK"
rm -rf "$WORK/ckpt" "$WORK/host" "$WORK/docker"
cp -r "$CKPT" "$WORK/ckpt"
PYTHONPATH=tests "$PY" - "$WORK" <<'PYEOF'
import sys, yaml
from conftest import minimal_spec
work = sys.argv[1]
for out in ("host", "docker"):
    base = minimal_spec()
    base["policies"]["solver"]["path"] = f"{work}/ckpt"
    base["train"].update(steps=3, checkpoint_every=1, token_budget=None)
    base["eval"] = {"every": 2, "limit": 4}
    base["backend"] = {"max_new_tokens": 8}
    exp = {"name": "rx", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": f"{work}/{out}",
           "arms": {"a": {}, "b": {"policies": {"solver": {"lr": 3e-4}}}}}
    open(f"{work}/{out}.yaml", "w").write(yaml.safe_dump(exp))
PYEOF
common=(--network host --user 0:0 -v "$WORK:$WORK" -e RAY_USAGE_STATS_ENABLED=0)
trap 'docker rm -f rayhead raywk >/dev/null 2>&1 || true' EXIT
docker run -d --name rayhead "${common[@]}" --entrypoint ray mlmt-bench:ray start --head --port="$PORT" \
    --node-ip-address=127.0.0.1 --num-cpus=0 --include-dashboard=false --disable-usage-stats --block
sleep 15
docker run -d --name raywk "${common[@]}" --entrypoint ray mlmt-bench:ray start --address="127.0.0.1:$PORT" \
    --node-ip-address=127.0.0.1 --num-cpus=1 --block
sleep 20
docker exec rayhead python -c "import ray; ray.init(address='127.0.0.1:$PORT', logging_level='ERROR'); \
print('nodes (address, CPUs):', [(n['NodeManagerAddress'], n['Resources'].get('CPU')) for n in ray.nodes() if n['Alive']])"
/usr/bin/time -f "ray, every node in docker: wall %e s" docker exec rayhead mlmt-bench -q run "$WORK/docker.yaml" \
    --ray "127.0.0.1:$PORT"
/usr/bin/time -f "host, --workers 2: wall %e s" "$PY" -m mlmt_bench.cli -q run "$WORK/host.yaml" --workers 2
"$PY" - "$WORK" <<'PYEOF'
import glob, json, sys
from pathlib import Path
TIMING = ("wall_s", "gen_tok_per_s", "train_tok_per_s", "peak_mem_mb")
def runs(root):
    out = {}
    for m in sorted(glob.glob(f"{root}/rx-*/*/manifest.json")):
        man, d = json.load(open(m)), Path(m).parent
        metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING and not k.startswith("mem/")}
                   for line in (d / "metrics.jsonl").read_text().splitlines()]
        out[(man["arm"], man["seed"])] = (man["status"], metrics, (d / "eval_problems.jsonl").read_text())
    return out
host, docker = runs(f"{sys.argv[1]}/host"), runs(f"{sys.argv[1]}/docker")
same = sorted(host) == sorted(docker) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)] and all(
    docker[k][0] == "completed" and host[k][1:] == docker[k][1:] for k in host)
print("every run completed and equal to the host's:", same)
sys.exit(0 if same else 1)
PYEOF
