"""An evaluation's wall time: the hf backend's plain ``generate`` vs its ``decode: static`` path (and that path
with ``compact: true``), on a real spec.

A benchmark, not a test. Evaluation dominates a run of the SmolLM2 testbed (the pilot's grpo seed 0 spent
3,628 of its 4,449 s evaluating), so this measures the evaluation a run does, not a synthetic decode: the spec's
solver answers its evaluation problems greedily, then, for ``grpo + base critic``, the frozen starting point
writes feedback and the solver refines (``Program(attempts=1, feedback="critic")`` with ``eval.base_critic``'s
critic), as :meth:`mlmt_bench.trainer.Trainer._evaluate_with_base_critic` does, except that a run refines its
evaluation's own attempts where this generates them in the same program (once either way), the memo off. The decode
paths (``--paths``: ``generate``, ``static``, ``static+compact``, ``static+merge``: ``merge_lora``,
``static+one-prefill``: the static path's prefill as one left-padded forward over all rows, as before it ran
in groups of similar length, ``static+kept``: ``prefix_cache_mb: 4096``, refinements copying the attempts' keys
and values, ``static+merge+kept``: both) run
interleaved (generate, static, generate, ...) on the same trainer, after one warm-up call each on a few problems.
It prints wall and process CPU seconds per path (median over ``--repeats``), each path's ratio to the first,
whether every problem's outcomes (t1, t2, t2_null) are the first path's, the rows the static decode steps ran on
(``row_steps``), and writes a JSON file.

Usage (from the repository root; ``make smollm2`` first)::

    .venv/bin/python perf/eval_decode_speed.py --spec registry/runs/smollm2-pilot-base.yaml --problems 32
    .venv/bin/python perf/eval_decode_speed.py --paths static,static+compact --out perf/results/eval_compact.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _trainer(spec_path: str, problems: int, out: Path) -> Any:
    from mlmt_bench import runner
    from mlmt_bench.machine.dist import NullRunDir
    from mlmt_bench.spec import load_run_spec

    spec = load_run_spec(spec_path, [f"eval.limit={problems}", "eval.base_critic=true", "eval.memo=false",
                                     "eval.samples=0", f"output_dir={out}"])
    runner.configure_torch(spec)
    comp = runner.build(spec, progress=False, gate=False)
    if comp.base_critic is None:
        raise SystemExit(f"{spec_path}: its algorithm has a critic of its own; this measures grpo + base critic")
    return runner.make_trainer(spec, comp, NullRunDir(out))


PATHS = {"generate": {"decode": "generate"}, "static": {"decode": "static"},
         "static+compact": {"decode": "static", "compact": True},
         "static+merge": {"decode": "static", "merge_lora": True},
         "static+one-prefill": {"decode": "static"},
         "static+kept": {"decode": "static", "prefix_cache_mb": 4096},
         "static+merge+kept": {"decode": "static", "merge_lora": True, "prefix_cache_mb": 4096}}

#: paths that run the static decoder's prefill as before grouping (one left-padded forward over every row of a
#: call): a token budget no call reaches
PREFILL_TOKENS = {"static+one-prefill": 2 ** 62}


def _backend(path: str) -> Any:
    from mlmt_bench.rollout.hf_backend import HFBackend

    return HFBackend(**PATHS[path])


def _evaluate(trainer: Any, path: str, problems: Any) -> tuple[float, float, list[tuple[Any, ...]], int, int, int]:
    """(wall s, CPU s, [(t1, t2, t2_null)] per problem, generated tokens, row steps, prompt tokens copied from kept
    prefixes) of one grpo + base critic evaluation."""
    from mlmt_bench.evaluate import evaluate
    from mlmt_bench.rollout import static_decode
    from mlmt_bench.rollout.episodes import Program

    backend = _backend(path)
    actors = dataclasses.replace(trainer.actors, critic=trainer.base_critic, backend=backend)
    e = trainer.spec.eval
    prefill = (mock.patch.object(static_decode, "PREFILL_TOKENS", PREFILL_TOKENS[path]) if path in PREFILL_TOKENS
               else contextlib.nullcontext())
    wall, cpu = time.perf_counter(), time.process_time()
    with prefill:
        res = evaluate(Program(attempts=1, feedback="critic"), actors, problems, trainer.eval_sampling,
                       feedback_metrics=e.feedback_metrics, n_samples=0, protocols=e.protocols,
                       micro_batch_tokens=trainer.spec.train.micro_batch_tokens)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row_steps = sum(d.stats.row_steps for d in backend.decoders.values())
    copied = sum(d.stats.prefix_tokens for d in backend.decoders.values())
    return (wall, cpu, [(r["t1"], r["t2"], r["t2_null"]) for r in res.per_problem], int(sum(res.gen_tokens.values())),
            row_steps, copied)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default=str(ROOT / "registry" / "runs" / "smollm2-pilot-base.yaml"))
    p.add_argument("--problems", type=int, default=32, help="evaluation problems (the spec's first ones)")
    p.add_argument("--repeats", type=int, default=2, help="measured calls per path (after one warm-up call each)")
    p.add_argument("--paths", default="generate,static", help=f"comma-separated, of {', '.join(PATHS)}")
    p.add_argument("--out", default=str(ROOT / "perf" / "results" / "eval_decode_speed.json"))
    args = p.parse_args()
    modes = tuple(args.paths.split(","))
    if len(modes) < 2 or any(m not in PATHS for m in modes):
        raise SystemExit(f"--paths: two or more of {', '.join(PATHS)}, got {args.paths!r}")
    from mlmt_bench.machine import cpus

    busy = cpus.passive_wait_when_busy()  # as the CLI does, before torch loads: spinning waits collapse under load
    if busy:
        print(f"OMP_WAIT_POLICY=PASSIVE ({busy})", flush=True)

    import torch

    from mlmt_bench.runner import cast_frozen_for_autocast, cpu_autocast

    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"eval-decode-speed-{os.getpid()}"
    trainer = _trainer(args.spec, args.problems, scratch)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    outcomes: dict[str, list[tuple[Any, ...]]] = {}
    with cpu_autocast(trainer.spec), torch.no_grad():
        cast_frozen_for_autocast(trainer.spec, [*trainer.policies.values(), trainer.base_critic])
        for m in modes:  # warm-up: first calls allocate and, on the static path, size the cache
            _evaluate(trainer, m, trainer.eval_problems[:4])
        for r in range(args.repeats):
            for m in modes:
                load = os.getloadavg()[0]
                wall, cpu, rows, tokens, row_steps, copied = _evaluate(trainer, m, trainer.eval_problems)
                outcomes.setdefault(m, rows)
                runs[m].append({"wall_s": wall, "cpu_s": cpu, "gen_tokens": tokens, "row_steps": row_steps,
                                "prefix_tokens_copied": copied, "load_before": load})
                print(f"repeat {r} {m:14s}: {wall:7.1f} s wall, {cpu:7.1f} s CPU, {tokens} tokens "
                      f"({tokens / wall:.1f} tok/s), {row_steps} row steps, {copied} prompt tokens copied, "
                      f"load {load:.1f}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k in ("wall_s", "cpu_s", "gen_tokens", "row_steps")}
           for m in modes}
    first = modes[0]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "problems": len(trainer.eval_problems), "paths": list(modes), "runs": runs, "median": med,
        f"over_{first}": {m: {"wall": med[m]["wall_s"] / med[first]["wall_s"],
                              "cpu": med[m]["cpu_s"] / med[first]["cpu_s"]} for m in modes[1:]},
        f"same_outcomes_as_{first}": {m: outcomes[m] == outcomes[first] for m in modes[1:]},
        "outcomes_differ_on": {m: sum(a != b for a, b in zip(outcomes[m], outcomes[first])) for m in modes[1:]},
    }
    print(json.dumps({k: result[k] for k in ("median", f"over_{first}", f"same_outcomes_as_{first}",
                                             "outcomes_differ_on")}, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
