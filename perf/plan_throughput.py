"""Generation and training throughput per model size on this machine: the rows of the table that
``mlmt-bench plan`` turns into time estimates (``mlmt_bench/data/throughput.yaml``).

A benchmark, not a test. For each preset it measures, on ``--device``:

- generated tokens/s of the hf backend's plain ``generate`` and of its ``decode: static`` path
  (``perf/static_decode_speed.py``'s measurement: ``--prompts`` synthetic-arith prompts ×
  ``--max-new-tokens`` forced new tokens, median of ``--repeats`` calls after a warm-up);
- trained sequence tokens/s (prompt + completion, forward + backward + AdamW step) of
  :func:`mlmt_bench.algorithms.update.update_policy`, the trainer's own update, on the same
  number of sequences with non-zero advantages;

and prints the rows as YAML to paste into the table, with the command and date as their source.
On a CPU the rates are per second of *process CPU time* with one thread: what an idle machine does
in wall time, and much less disturbed by other jobs on a shared one than wall time (which the
GPU rows use).

Usage (from the repository root)::

    .venv/bin/python perf/plan_throughput.py --presets tiny-2m,tiny-8m,tiny-20m
    .venv/bin/python perf/plan_throughput.py --presets llama-308m --device cuda --dtype bfloat16 \\
        --prompts 256 --max-new-tokens 128 --device-kind h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "perf"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def train_tokens_per_s(preset: str, args: argparse.Namespace) -> float:
    """Sequence tokens per second through the trainer's update (one optimiser step per call)."""
    import torch

    from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.tiny import build_tiny_model, num_parameters
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from static_decode_speed import attempt_prompts

    tok = build_char_tokenizer()
    model = build_tiny_model(preset, tok, seed=args.seed).to(args.device)
    if args.dtype != "float32":
        model = model.to(getattr(torch, args.dtype))
    policy = Policy("solver", model, tok, trainable=True, lr=1e-4, n_params=num_parameters(model), init_path="")
    gen = torch.Generator().manual_seed(args.seed)
    items = [TrainItem(p, torch.randint(5, len(tok), (args.max_new_tokens,), generator=gen).tolist(),
                       1.0 if i % 2 else -1.0) for i, p in enumerate(attempt_prompts(tok, args.prompts))]
    tokens = sum(len(it.prompt_ids) + len(it.ids) for it in items)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    cfg = LossConfig(clip_low=0.2, clip_high=0.2, loss_agg="token_mean", epochs=1, grad_accum=args.grad_accum,
                     grad_clip=1.0, micro_batch_tokens=args.micro_batch_tokens)
    cuda = args.device.startswith("cuda")
    clock = time.perf_counter if cuda else time.process_time  # see the module docstring
    times = []
    for r in range(args.repeats + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        update_policy(policy, opt, None, items, cfg)
        if cuda:
            torch.cuda.synchronize()
        if r > 0:
            times.append(clock() - t0)
    return tokens / statistics.median(times)


def pretrained_rates(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Generated (by the hf backend's ``generate`` and ``static`` paths) and trained tokens per second
    (process CPU time on a CPU) of a pretrained model loaded the way a run loads it (``model: hf``;
    ``--lora R``: an all-linear adapter, the base frozen), under the run's CPU matmul dtype
    (``--cpu-dtype bfloat16``: bfloat16 autocast with the frozen weights cast once, as
    ``runner._train`` does); ``params`` is the model's parameter count."""
    import contextlib

    import torch

    from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
    from mlmt_bench.models.frozen_cast import cast_frozen_linears
    from mlmt_bench.models.policy import load_hf_policy
    from mlmt_bench.models.policy_spec import PolicySpec
    from mlmt_bench.models.pretrained import resolve
    from mlmt_bench.rollout.hf_backend import HFBackend
    from static_decode_speed import attempt_prompts

    lora = {"lora": {"r": args.lora, "alpha": 2 * args.lora, "target_modules": "all-linear"}} if args.lora else {}
    policy = load_hf_policy("solver", PolicySpec(model="hf", path=resolve(path), dtype=args.dtype, **lora),
                            device=args.device if args.device != "cpu" else None)
    model, tok = policy.model, policy.tokenizer
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.cpu_dtype == "bfloat16"
                else contextlib.nullcontext())
    if args.cpu_dtype == "bfloat16":
        cast_frozen_linears(model, torch.bfloat16)
    prompts = attempt_prompts(tok, args.prompts)
    model.generation_config.min_new_tokens = args.max_new_tokens
    gen_rates: dict[str, float] = {}
    with autocast:
        for key, decode in (("hf-generate", "generate"), ("hf-static", "static")):
            backend = HFBackend(batch_size=args.prompts, decode=decode)
            gen_cpu: list[float] = []
            for r in range(args.repeats + 1):  # the first call warms up
                c0 = time.process_time()
                gens = backend.generate(model, tok, prompts, seed=args.seed + r, max_new_tokens=args.max_new_tokens,
                                        temperature=args.temperature, top_p=1.0)
                if r > 0:
                    gen_cpu.append(time.process_time() - c0)
            gen_rates[key] = sum(len(g.ids) for g in gens) / statistics.median(gen_cpu)
        items = [TrainItem(p, g.ids, 1.0 if i % 2 else -1.0) for i, (p, g) in enumerate(zip(prompts, gens))]
        trained = sum(len(it.prompt_ids) + len(it.ids) for it in items)
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
        cfg = LossConfig(clip_low=0.2, clip_high=0.2, loss_agg="token_mean", epochs=1, grad_accum=args.grad_accum,
                         grad_clip=1.0, micro_batch_tokens=args.micro_batch_tokens)
        train_cpu: list[float] = []
        for r in range(args.repeats + 1):
            c0 = time.process_time()
            update_policy(policy, opt, None, items, cfg)
            if r > 0:
                train_cpu.append(time.process_time() - c0)
    return {"params": policy.n_params, "gen": gen_rates, "train": trained / statistics.median(train_cpu)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="tiny-2m,tiny-8m,tiny-20m")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--micro-batch-tokens", type=int, default=32768, help="train.micro_batch_tokens (the default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--device-kind", default="cpu", help="the table's device key (cpu, h200, h100-80gb, ...)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="a pretrained checkpoint (directory or registered alias, e.g. "
                                   "smollm2-135m-instruct) instead of --presets; CPU only")
    p.add_argument("--lora", type=int, default=0, help="--model: LoRA rank (alpha 2r, all-linear); 0: full")
    p.add_argument("--cpu-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="--model: what CPU matmuls run in (the table row's cpu_dtype)")
    args = p.parse_args(argv)

    import os

    import torch

    from static_decode_speed import measure

    torch.set_num_threads(args.threads)
    cmd = "python perf/plan_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stamp = time.strftime("%Y-%m-%d")
    print(f"# {cmd}\n# torch {torch.__version__}, {os.cpu_count()} cpus, threads {args.threads}, "
          f"load average {os.getloadavg()}")
    if args.model:
        r = pretrained_rates(args.model, args)
        print(f"  - device: {args.device_kind}\n    model: {args.model}\n    params: {r['params']}\n"
              f"    dtype: {args.dtype}\n    cpu_dtype: {args.cpu_dtype}\n    lora: {bool(args.lora)}\n"
              f"    gen: {{hf-generate: {r['gen']['hf-generate']:.0f}, hf-static: {r['gen']['hf-static']:.0f}}}\n"
              f"    train: {r['train']:.0f}\n"
              f"    source: \"{cmd} ({stamp}; {args.prompts} sequences x {args.max_new_tokens} new tokens, "
              f"{args.threads} thread(s), process CPU time, load average {os.getloadavg()[0]:.1f})\"", flush=True)
        return 0
    for preset in [s.strip() for s in args.presets.split(",") if s.strip()]:
        g = measure(preset, argparse.Namespace(**{**vars(args), "out": None}))
        gen = g["tokens_per_s"] if args.device.startswith("cuda") else g["tokens_per_cpu_s"]
        t = train_tokens_per_s(preset, args)
        print(f"  - device: {args.device_kind}\n    model: {preset}\n    params: {g['params']}\n"
              f"    dtype: {args.dtype}\n"
              f"    gen: {{hf-generate: {gen['generate']:.0f}, hf-static: {gen['static']:.0f}}}\n"
              f"    train: {t:.0f}\n"
              f"    source: \"{cmd} ({stamp}; {args.prompts} sequences x {args.max_new_tokens} new tokens, "
              f"{args.threads} thread(s), {'wall' if args.device.startswith('cuda') else 'process CPU'} time, "
              f"load average {os.getloadavg()[0]:.1f})\"", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
