"""Update time of micro-batched vs one-shot policy updates on the same batch (``train.micro_batch_tokens``).

A benchmark, not a test. It builds a tiny Llama (``mlmt_bench.models.tiny``, no download) and a
GRPO-like batch: the ``synthetic-arith`` attempt prompts of ``--prompts`` problems (plus
``--context`` extra context tokens, to mimic refinement contexts), ``--group-size`` samples
each, ``--new-tokens`` trained tokens per sample (``--ragged``: uniform in 1..new-tokens),
advantages ~ N(0, 1). Then it times :func:`mlmt_bench.algorithms.update.update_policy` (forward,
backward, AdamW step) on that batch for each budget: ``none`` (the whole batch in one
forward/backward, as before micro-batching), ``default`` (the spec default) and the numbers given,
each on its own copy of the model, round-robin (budget 1, 2, ..., 1, 2, ...) so that load on the
machine hits all of them alike. It prints, per budget, the median and min seconds per update,
the ratio to one-shot (median), the number of micro-batches, and the RSS the update added over the
RSS before it (peak during the update − before; CPU, MiB).

Usage (from the repository root)::

    .venv/bin/python perf/micro_batch_update.py                          # tiny-2m, 8 × 8 × 32
    .venv/bin/python perf/micro_batch_update.py --context 200 --ragged    # mlmt-like refinement contexts
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def build_batch(tok: Any, args: argparse.Namespace) -> list[Any]:
    from mlmt_bench import registry
    from mlmt_bench.algorithms.update import TrainItem
    from mlmt_bench.rollout.episodes import attempt_prompt

    bench = registry.benchmarks.get("synthetic-arith")()
    rng = random.Random(args.seed)
    vocab = range(5, len(tok) - 1)
    items = []
    for problem in bench.load("train")[:args.prompts]:
        prompt = attempt_prompt(tok, bench.templates, problem) + [rng.choice(vocab) for _ in range(args.context)]
        for _ in range(args.group_size):
            n = rng.randint(1, args.new_tokens) if args.ragged else args.new_tokens
            items.append(TrainItem(prompt, [rng.choice(vocab) for _ in range(n)], rng.gauss(0.0, 1.0)))
    return items


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny-2m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=0, help="extra context tokens after each prompt")
    ap.add_argument("--ragged", action="store_true", help="completion lengths uniform in 1..new-tokens")
    ap.add_argument("--budgets", default="none,default,2048,1024,512",
                    help="comma-separated: none (one shot), default (the spec default) or a token count")
    ap.add_argument("--loss-agg", default="token_mean")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import psutil
    import torch

    from mlmt_bench.algorithms.update import LossConfig, update_policy
    from mlmt_bench.machine.memory import peak_rss_mb, reset_peak_rss
    from mlmt_bench.models.forward import micro_batches, seq_len
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.tiny import build_tiny_model
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.spec import TrainSpec

    torch.set_num_threads(args.threads)
    tok = build_char_tokenizer()
    model = build_tiny_model(args.preset, tok, seed=args.seed).train()
    items = build_batch(tok, args)
    lengths = [seq_len(it) for it in items]
    default = TrainSpec().micro_batch_tokens
    budgets: list[tuple[str, int | None]] = []
    for b in args.budgets.split(","):
        b = b.strip()
        budgets.append((b, None if b == "none" else default if b == "default" else int(b)))

    proc = psutil.Process()
    libc = ctypes.CDLL("libc.so.6")
    runs = []
    for name, budget in budgets:
        policy = Policy("solver", copy.deepcopy(model), tok, True, 1e-4, 0, init_path="")
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
        cfg = LossConfig(0.2, 0.2, args.loss_agg, 1, 1, 1.0, micro_batch_tokens=budget)
        mbs = micro_batches(lengths, budget)
        runs.append({"budget": name, "micro_batch_tokens": budget, "policy": policy, "opt": opt, "cfg": cfg,
                     "micro_batches": len(mbs),
                     "max_padded_tokens": max(len(mb) * max(lengths[i] for i in mb) for mb in mbs),
                     "seconds": [], "rss_added_mb": []})
    for r in range(args.warmup + args.repeats):
        for run in runs:
            libc.malloc_trim(0)  # hand freed heap back, so that RSS growth is this update's
            before = proc.memory_info().rss
            reset_peak_rss()
            t0 = time.perf_counter()
            update_policy(run["policy"], run["opt"], None, copy.deepcopy(items), run["cfg"])
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                run["seconds"].append(dt)
                run["rss_added_mb"].append(peak_rss_mb() - before / 2**20)

    base = statistics.median(runs[0]["seconds"])
    print(f"{args.preset}: {len(items)} sequences, {sum(lengths)} tokens ({sum(len(it.ids) for it in items)} trained), "
          f"one-shot padded {len(items) * max(lengths)}; {args.threads} thread(s), {args.repeats} timed updates "
          f"per budget after {args.warmup} warm-up, round-robin; ratio = median / median of '{runs[0]['budget']}'")
    print(f"{'budget':>10} {'tokens':>8} {'micro-batches':>13} {'max padded':>10} {'median s':>9} {'min s':>7} "
          f"{'ratio':>6} {'RSS added MiB':>13}")
    results = []
    for run in runs:
        med = statistics.median(run["seconds"])
        row = {k: run[k] for k in ("budget", "micro_batch_tokens", "micro_batches", "max_padded_tokens", "seconds",
                                   "rss_added_mb")}
        row.update(median_s=med, min_s=min(run["seconds"]), ratio=med / base,
                   rss_added_mb_median=statistics.median(run["rss_added_mb"]))
        results.append(row)
        print(f"{run['budget']:>10} {str(run['micro_batch_tokens']):>8} {run['micro_batches']:>13} "
              f"{run['max_padded_tokens']:>10} {med:>9.4f} {row['min_s']:>7.4f} {row['ratio']:>6.3f} "
              f"{row['rss_added_mb_median']:>13.1f}")
    out = {"args": vars(args), "torch": torch.__version__, "default_micro_batch_tokens": default,
           "load_average": list(__import__("os").getloadavg()), "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
