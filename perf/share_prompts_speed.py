"""A training step's rollout with the static decoder's shared prompts (``share_prompts``, the default) against every
row prefilled on its own (``share_prompts: false``), on a real spec.

A benchmark, not a test. A training rollout repeats each problem's prompt for its G samples (and, with several
feedbacks per attempt, each critic prompt), so the static decoder prefills each distinct prompt once and copies its
keys, values and first-token logits to the repeats. This builds the spec's trainer (``--set`` overrides as ``run``
takes them), then runs the rollout a training step runs (``algorithm.program(0)`` on ``train.problems_per_step``
training problems, the training temperatures and token limits) with each path, interleaved (shared, unshared,
shared, ...), every call from the same torch seed, after one warm-up call each. It prints wall and process CPU
seconds per path (median over ``--repeats``), the ratio, the prompt rows and tokens shared, and whether both paths
generated the same ids, and writes a JSON file.

Usage (from the repository root; ``make smollm2`` first)::

    .venv/bin/python perf/share_prompts_speed.py --spec registry/runs/smollm2-pilot-base.yaml --repeats 3
    .venv/bin/python perf/share_prompts_speed.py --set algorithm.name=mlmt --set algorithm.params.lam=0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PATHS = {"shared": True, "unshared": False}


def _trainer(spec_path: str, overrides: list[str], out: Path) -> Any:
    from mlmt_bench import runner
    from mlmt_bench.machine.dist import NullRunDir
    from mlmt_bench.spec import load_run_spec

    spec = load_run_spec(spec_path, [*overrides, "eval.memo=false", f"output_dir={out}"])
    if spec.backend.name != "hf" or spec.backend.options.get("decode") != "static":
        raise SystemExit(f"{spec_path}: this measures the hf backend's static decoder (backend.options.decode: static)")
    runner.configure_torch(spec)
    return runner.make_trainer(spec, runner.build(spec, progress=False, gate=False), NullRunDir(out))


def _rollout(trainer: Any, share: bool, problems: list[Any], seed: int) -> dict[str, Any]:
    """One training rollout with ``share_prompts`` set to ``share``: wall and CPU seconds, tokens, the ids."""
    import torch

    from mlmt_bench.rollout.episodes import rollout
    from mlmt_bench.rollout.hf_backend import HFBackend

    options = {**trainer.spec.backend.options, "share_prompts": share}
    backend = HFBackend(**options)
    actors = dataclasses.replace(trainer.actors, backend=backend)
    torch.manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    ro = rollout(trainer.algorithm.program(0), actors, problems, trainer.sampling)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = [d.stats for d in backend.decoders.values()]
    return {"wall_s": wall, "cpu_s": cpu, "gen_tokens": sum(len(t.ids) for t in ro.turns),
            "shared_rows": sum(s.shared_rows for s in stats), "shared_tokens": sum(s.shared_tokens for s in stats),
            "ids": [list(t.ids) for t in ro.turns]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(ROOT / "registry" / "runs" / "smollm2-pilot-base.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "perf" / "results" / "share_prompts_speed.json"))
    args = p.parse_args()
    from mlmt_bench.machine import cpus

    busy = cpus.passive_wait_when_busy()  # as the CLI does, before torch loads: spinning waits collapse under load
    if busy:
        print(f"OMP_WAIT_POLICY=PASSIVE ({busy})", flush=True)

    import torch

    from mlmt_bench.runner import cast_frozen_for_autocast, cpu_autocast

    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"share-prompts-speed-{os.getpid()}"
    trainer = _trainer(args.spec, args.overrides, scratch)
    problems = trainer.train_problems[:trainer.spec.train.problems_per_step]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in PATHS}
    ids: dict[str, list[list[list[int]]]] = {m: [] for m in PATHS}
    with cpu_autocast(trainer.spec), torch.no_grad():
        cast_frozen_for_autocast(trainer.spec, list(trainer.policies.values()))
        for share in PATHS.values():  # warm-up: first calls allocate
            _rollout(trainer, share, problems[:1], args.seed)
        for r in range(args.repeats):
            for m, share in PATHS.items():
                load = os.getloadavg()[0]
                res = _rollout(trainer, share, problems, args.seed + r)
                ids[m].append(res.pop("ids"))
                runs[m].append({**res, "load_before": load})
                print(f"repeat {r} {m:8s}: {res['wall_s']:6.1f} s wall, {res['cpu_s']:6.1f} s CPU, "
                      f"{res['gen_tokens']} tokens, {res['shared_rows']} rows ({res['shared_tokens']} prompt tokens) "
                      f"shared, load {load:.1f}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k in ("wall_s", "cpu_s", "gen_tokens")}
           for m in PATHS}
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "program": dataclasses.asdict(trainer.algorithm.program(0)), "problems": len(problems),
        "runs": runs, "median": med,
        "shared_over_unshared": {"wall": med["shared"]["wall_s"] / med["unshared"]["wall_s"],
                                 "cpu": med["shared"]["cpu_s"] / med["unshared"]["cpu_s"]},
        "same_ids": ids["shared"] == ids["unshared"],
    }
    print(json.dumps({k: result[k] for k in ("program", "median", "shared_over_unshared", "same_ids")}, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
