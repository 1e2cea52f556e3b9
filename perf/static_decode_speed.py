"""Generated tokens per second: the hf backend's plain ``generate`` vs its ``decode: static`` path.

A benchmark, not a test. For each tiny preset it builds the model (``mlmt_bench.models.tiny``, no
download), takes ``--prompts`` synthetic-arith attempt prompts (the rollout's own prompt ids),
and generates ``--max-new-tokens`` tokens per prompt with both paths of
:class:`mlmt_bench.rollout.hf_backend.HFBackend`, interleaved (generate, static, generate, ...),
after one warm-up call each. Every row is forced to the full length (``min_new_tokens`` =
``max_new_tokens`` in the model's generation config, which both paths honour), so both generate
the same number of tokens. It prints tokens/s per path (median over ``--repeats``) and the ratio
static / generate (of wall time, and of process CPU time, which other jobs on a shared machine
disturb less), checks that the two paths returned the same ids (seeded multinomial draws on
the CPU), and writes a JSON file.

Usage (from the repository root)::

    .venv/bin/python perf/static_decode_speed.py                       # tiny-2m and tiny-8m, 64 x 40
    .venv/bin/python perf/static_decode_speed.py --presets tiny-8m --prompts 256 --device cuda
"""

from __future__ import annotations

import argparse
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


def attempt_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """The first ``n`` synthetic-arith train problems as the rollout's attempt prompt ids."""
    from mlmt_bench import registry
    from mlmt_bench.rollout.episodes import attempt_prompt

    bench = registry.benchmarks.get("synthetic-arith")()
    problems = bench.load("train")
    return [attempt_prompt(tokenizer, bench.templates, problems[i % len(problems)]) for i in range(n)]


def measure(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from mlmt_bench.models.tiny import build_tiny_model, num_parameters
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.rollout.hf_backend import HFBackend

    tok = build_char_tokenizer()
    model = build_tiny_model(preset, tok, seed=args.seed).to(args.device)
    if args.dtype != "float32":
        model = model.to(getattr(torch, args.dtype))
    model.generation_config.min_new_tokens = args.max_new_tokens
    prompts = attempt_prompts(tok, args.prompts)
    backends = {"generate": HFBackend(batch_size=args.prompts),
                "static": HFBackend(batch_size=args.prompts, decode="static")}
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=1.0)
    seconds: dict[str, list[float]] = {k: [] for k in backends}
    cpu_seconds: dict[str, list[float]] = {k: [] for k in backends}
    ids: dict[str, list[list[int]]] = {}
    tokens = 0
    for r in range(args.repeats + 1):  # the first round warms up (and captures graphs on a GPU)
        for name, backend in backends.items():
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            gens = backend.generate(model, tok, prompts, seed=args.seed + r, **kw)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            tokens = sum(len(g.ids) for g in gens)
            if r > 0:
                seconds[name].append(dt)
                cpu_seconds[name].append(dc)
            else:
                ids[name] = [g.ids for g in gens]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_seconds.items()}
    out = {
        "preset": preset,
        "params": num_parameters(model),
        "tokens_per_call": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "tokens_per_cpu_s": {k: tokens / v for k, v in cpu.items()},
        "ratio_static_over_generate": (tokens / med["static"]) / (tokens / med["generate"]),
        # process CPU time: less sensitive than wall time to other jobs on a shared machine
        "cpu_ratio_static_over_generate": cpu["generate"] / cpu["static"],
        "same_ids": ids["generate"] == ids["static"],
        "static_stats": vars(backends["static"].decoder(model).stats),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="tiny-2m,tiny-8m", help="comma-separated tiny model presets")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5, help="measured calls per path (after one warm-up call)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "perf" / "results" / "static_decode_speed.json"))
    args = p.parse_args(argv)

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
          f"threads {args.threads}, load average {os.getloadavg()}", flush=True)
    results = []
    for preset in [s.strip() for s in args.presets.split(",") if s.strip()]:
        res = measure(preset, args)
        results.append(res)
        tps = res["tokens_per_s"]
        print(f"{preset} ({res['params']:,} params), {args.prompts} prompts x {args.max_new_tokens} tokens: "
              f"generate {tps['generate']:,.0f} tok/s, static {tps['static']:,.0f} tok/s, "
              f"ratio {res['ratio_static_over_generate']:.2f}x "
              f"(CPU time: {res['cpu_ratio_static_over_generate']:.2f}x), "
              f"same ids: {res['same_ids']}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "static_decode_speed",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": vars(args),
        "env": {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "cpus": os.cpu_count(), "platform": platform.platform(),
                "loadavg_after": list(os.getloadavg())},
        "results": results,
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
