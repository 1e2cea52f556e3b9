"""Generation and training throughput of a 135M model on a CPU: float32, bfloat16 autocast, bfloat16 weights.

A benchmark, not a test (``train.cpu_dtype``, :func:`mlmt_bench.runner.cpu_autocast`). Each case
is a fresh process (``--worker``) that loads the model (``--model DIR``: SmolLM2-135M-Instruct
converted to an HF directory; random weights of its shape without it), then times a greedy
``generate`` of ``--batch`` prompts of ``--prompt`` tokens and exactly ``--new`` new tokens, and
one forward + backward of the whole model (all parameters trainable) over the generated ids, as
the update of an RL step does. Cases:

- ``float32``: float32 weights, no autocast (the default before ``train.cpu_dtype``);
- ``autocast``: float32 weights under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (what
  ``cpu_dtype: bfloat16`` does);
- ``autocast, frozen``: as ``autocast``, the weights frozen (``requires_grad=False``, as a LoRA
  policy's base): autocast caches its bfloat16 copy of a weight only for weights that require
  grad, so a frozen weight is cast again in every forward (generation only: nothing to train);
- ``bf16 weights``: the model loaded in bfloat16 (``policies.<role>.dtype: bfloat16``).

Reported: tokens/s per wall second and per process-CPU second (the steadier measure on a shared
machine), rounds interleaved, with the load average. ``OMP_NUM_THREADS`` is the caller's.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python perf/cpu_dtype_speed.py --model DIR --out perf/results/cpu_dtype_speed.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CASES = ("float32", "autocast", "autocast, frozen", "bf16 weights")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.case == "bf16 weights" else torch.float32
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    else:
        from perf.pin_cost import SMOLLM2_SHAPE

        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).to(dtype)
    model.eval()
    ids = torch.randint(100, model.config.vocab_size - 100, (args.batch, args.prompt))

    def autocast() -> contextlib.AbstractContextManager[Any]:
        on = args.case.startswith("autocast")
        return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()

    frozen = args.case == "autocast, frozen"
    for p in model.parameters():
        p.requires_grad_(not frozen)

    gen = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
    with torch.no_grad(), autocast():
        model.generate(ids[:, :4], attention_mask=torch.ones_like(ids[:, :4]), max_new_tokens=2, min_new_tokens=2,
                       do_sample=False, pad_token_id=0)
        w0, c0 = time.perf_counter(), time.process_time()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
        gw, gc = time.perf_counter() - w0, time.process_time() - c0
    new = args.batch * args.new
    result = {"gen_tok_s": new / gw, "gen_tok_per_cpu_s": new / gc, "train_tok_s": None, "train_tok_per_cpu_s": None,
              "threads": torch.get_num_threads()}
    if not frozen:
        model.train()
        with autocast():
            w0, c0 = time.perf_counter(), time.process_time()
            model(input_ids=out, labels=out).loss.backward()
            tw, tc = time.perf_counter() - w0, time.process_time() - c0
        result.update(train_tok_s=out.numel() / tw, train_tok_per_cpu_s=out.numel() / tc)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory of SmolLM2-135M (default: random weights)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}
    from mlmt_bench.machine.cpus import bf16_instructions
    from mlmt_bench.machine.reproducible import cpu_model

    forward = ["--batch", str(args.batch), "--prompt", str(args.prompt), "--new", str(args.new)]
    forward += ["--model", args.model] if args.model else []
    runs = []
    for rnd in range(args.rounds):
        for case in CASES[rnd % len(CASES):] + CASES[:rnd % len(CASES)]:
            load = os.getloadavg()[0]
            res = subprocess.run([sys.executable, __file__, "--worker", "--case", case, *forward],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            run = {"case": case, "round": rnd, "loadavg": load, **json.loads(res.stdout.strip().splitlines()[-1])}
            runs.append(run)
            train = (f"train {run['train_tok_s']:6.1f} tok/s ({run['train_tok_per_cpu_s']:6.1f} per CPU s)"
                     if run["train_tok_s"] else "")
            print(f"[{rnd}] {case:16s} generate {run['gen_tok_s']:6.1f} tok/s ({run['gen_tok_per_cpu_s']:6.1f} per "
                  f"CPU s)  {train}  load {load:.1f}", flush=True)
    keys = ("gen_tok_s", "gen_tok_per_cpu_s", "train_tok_s", "train_tok_per_cpu_s")
    summary: dict[str, dict[str, Any]] = {}
    for c in CASES:
        mine = [r for r in runs if r["case"] == c]
        summary[c] = {k: round(statistics.median(r[k] for r in mine), 1) if mine[0][k] is not None else None
                      for k in keys}
        for k in ("gen_tok_per_cpu_s", "train_tok_per_cpu_s"):
            base = summary["float32"][k]
            summary[c][k + "_ratio"] = round(summary[c][k] / base, 2) if summary[c][k] is not None else None
    result = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "case")}, "cpu": cpu_model(),
              "bf16_instructions": bf16_instructions(), "date": time.strftime("%Y-%m-%d"),
              "threads": runs[0]["threads"], "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
