"""Update time with and without ``train.share_prompts`` on the same batch, side by side.

A benchmark, not a test. It builds a GRPO batch: the attempt prompts of ``--prompts`` problems of
``--benchmark`` (rendered by the policy's own tokenizer and chat template, as a run renders them;
``--context`` extra tokens after each prompt mimic a refinement or feedback turn's longer context),
``--group-size`` completions each of uniform 1..``--new-tokens`` random tokens (``--fixed``: all
``--new-tokens``), advantages ~ N(0, 1). It then times
:func:`mlmt_bench.algorithms.update.update_policy` (forward, backward, AdamW step; one epoch, no
reference) with ``share_prompts`` off and on, each on its own copy of the policy, alternating
(off, on, off, on, ...) so that load on the machine hits both alike. It prints the median and min
seconds per update, the ratio shared / plain (medians), the tokens each forward reads (plain: rows ×
(prompt + completion); shared: distinct prompts × prompt + rows × completion, both padded) and the
peak RSS the update added (MiB).

Usage (from the repository root)::

    .venv/bin/python perf/share_prompts_train.py                                   # tiny-2m, synthetic-arith
    .venv/bin/python perf/share_prompts_train.py --model smollm2-135m-instruct --lora 16 --benchmark nl-arith \\
        --options '{"ops": "*", "digits": 1, "steps": 3, "style": "mixed"}' --prompts 4 --group-size 4 \\
        --new-tokens 96 --repeats 3                                                # the SmolLM2 testbed's level
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def build_policy(args: argparse.Namespace) -> Any:
    """A tiny preset (built here, no download) or a pretrained alias / directory, with ``--lora``."""
    import torch

    from mlmt_bench.models.policy import build_policy as build
    from mlmt_bench.models.policy_spec import PolicySpec

    lora = ({"r": args.lora, "alpha": 2 * args.lora, "dropout": 0.0, "target_modules": "all-linear"}
            if args.lora else None)
    if args.model.startswith("tiny-"):
        from mlmt_bench.models.tiny import build_tiny_model, save_checkpoint
        from mlmt_bench.models.tokenizer import build_char_tokenizer

        path = Path(args.work) / args.model
        if not path.exists():
            tok = build_char_tokenizer()
            save_checkpoint(build_tiny_model(args.model, tok, seed=args.seed), tok, path)
        spec = PolicySpec(model="tiny", path=str(path), lora=lora, dtype="float32")
    else:
        from mlmt_bench.models.pretrained import resolve

        path = Path(resolve(args.model))
        spec = PolicySpec(model="hf", path=str(path), lora=lora, dtype="float32")
    torch.manual_seed(args.seed)
    policy = build("solver", spec, str(path))
    policy.model.train()
    return policy


def build_batch(tokenizer: Any, args: argparse.Namespace) -> list[Any]:
    from mlmt_bench import registry
    from mlmt_bench.algorithms.update import TrainItem
    from mlmt_bench.rollout.episodes import attempt_prompt

    bench = registry.benchmarks.get(args.benchmark)(**json.loads(args.options))
    rng = random.Random(args.seed)
    vocab = range(5, min(len(tokenizer), 30000))
    items = []
    for problem in bench.load("train")[:args.prompts]:
        prompt = attempt_prompt(tokenizer, bench.templates, problem) + [rng.choice(vocab) for _ in range(args.context)]
        for _ in range(args.group_size):
            n = args.new_tokens if args.fixed else rng.randint(1, args.new_tokens)
            items.append(TrainItem(prompt, [rng.choice(vocab) for _ in range(n)], rng.gauss(0.0, 1.0)))
    return items


def read_tokens(items: list[Any], shared: bool) -> int:
    """Padded tokens the update's forwards read (one micro-batch)."""
    completion = max(len(it.ids) for it in items)
    if not shared:
        return len(items) * max(len(it.prompt_ids) + len(it.ids) for it in items)
    prompts = {tuple(it.prompt_ids) for it in items}
    return len(prompts) * max(map(len, prompts)) + len(items) * max(0, completion - 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-2m", help="a tiny preset (tiny-2m, ...) or a pretrained alias / directory")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (alpha 2r, all-linear); 0: full fine-tuning")
    ap.add_argument("--benchmark", default="synthetic-arith")
    ap.add_argument("--options", default="{}", help="the benchmark's options, as JSON (a spec's benchmark.options)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--fixed", action="store_true", help="every completion --new-tokens long")
    ap.add_argument("--context", type=int, default=0, help="extra context tokens after each prompt")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/mlmt-share-prompts-perf", help="where a tiny preset is built")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import torch

    from mlmt_bench.algorithms.update import LossConfig, update_policy
    from mlmt_bench.machine import memory

    torch.set_num_threads(args.threads)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    base = build_policy(args)
    items = build_batch(base.tokenizer, args)
    libc = ctypes.CDLL("libc.so.6")
    runs = []
    for shared in (False, True):
        policy = copy.deepcopy(base)
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
        cfg = LossConfig(0.2, 0.2, "token_mean", 1, 1, 1.0, micro_batch_tokens=None, share_prompts=shared)
        runs.append({"share_prompts": shared, "policy": policy, "opt": opt, "cfg": cfg,
                     "read_tokens": read_tokens(items, shared), "seconds": [], "peak_rss_mb": []})
    loads = [os.getloadavg()[0]]
    for r in range(args.warmup + args.repeats):
        for run in runs:
            libc.malloc_trim(0)
            memory.TRACKER.take()
            t0 = time.perf_counter()
            update_policy(run["policy"], run["opt"], None, copy.deepcopy(items), run["cfg"])  # phase "update"
            dt = time.perf_counter() - t0
            peak = memory.TRACKER.take(("update",)).get("mem/peak_mb/update", float("nan"))
            if r >= args.warmup:
                run["seconds"].append(dt)
                run["peak_rss_mb"].append(peak)
        loads.append(os.getloadavg()[0])

    plain = statistics.median(runs[0]["seconds"])
    prompt_lens = sorted({len(it.prompt_ids) for it in items})
    print(f"{args.model}{f' + LoRA r{args.lora}' if args.lora else ''}, {args.benchmark}: {args.prompts} prompts "
          f"({prompt_lens[0]}-{prompt_lens[-1]} tokens) × {args.group_size} completions "
          f"({sum(len(it.ids) for it in items)} trained tokens); {args.threads} thread(s), {args.repeats} timed "
          f"updates per side after {args.warmup} warm-up, alternating; load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'share_prompts':>13} {'read tokens':>11} {'median s':>9} {'min s':>8} {'ratio':>6} {'peak RSS MiB':>12}")
    results = []
    for run in runs:
        med = statistics.median(run["seconds"])
        row = {k: run[k] for k in ("share_prompts", "read_tokens", "seconds", "peak_rss_mb")}
        row.update(median_s=med, min_s=min(run["seconds"]), ratio=med / plain,
                   peak_rss_mb_median=statistics.median(run["peak_rss_mb"]))
        results.append(row)
        print(f"{str(run['share_prompts']):>13} {run['read_tokens']:>11} {med:>9.3f} {row['min_s']:>8.3f} "
              f"{row['ratio']:>6.3f} {row['peak_rss_mb_median']:>12.0f}")
    out = {"args": vars(args), "torch": torch.__version__, "load_average": loads,
           "prompt_tokens": prompt_lens, "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
