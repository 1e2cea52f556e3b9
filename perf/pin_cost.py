"""What each variable of the CPU pin (and its neighbours) costs a real model's generation, idle and under load.

A benchmark, not a test. The workload is plain transformers: ``model.generate`` of a 135M
``LlamaForCausalLM`` (SmolLM2-135M's shape: hidden 576, 30 layers, 9 heads, 3 kv heads,
intermediate 1536, vocab 49152), greedy, ``--batch`` prompts of ``--prompt`` tokens, exactly
``--new`` new tokens (EOS suppressed with ``min_new_tokens``), float32, after one untimed warm-up
generate. The weights are SmolLM2-135M-Instruct's when ``--model DIR`` is given, else random
from the config (the same shapes, so the same speed). Every measurement is a fresh process
(``--worker``) with the case's environment, because ``ATEN_CPU_CAPABILITY``, ``MKL_CBWR`` and
the OpenMP variables are read when the libraries load.

The cases (``CASES``) run interleaved, round-robin over ``--rounds`` rounds with the order
rotated each round, each once "idle" (no process of this script's beside it) and once "loaded", beside ``--busy``
processes that spin on a core each (a Python ``while True``; the "other jobs running" of issue
32). Reported per case and load: the median generated tokens/s, the median wall and
process-CPU seconds of the timed generate, their ratios to ``--baseline`` under the same load
(process-CPU seconds are the steadier measure on a shared machine), the dispatch level and MKL
branch the libraries report, and the load average around each measurement (other users of the
machine count: ``--note`` says what they were). A measurement that runs past ``--timeout`` is
listed under ``failed``.

Usage (from the repository root)::

    .venv/bin/python perf/pin_cost.py --model /path/to/smollm2 --out perf/results/pin_cost.json
"""

from __future__ import annotations

import argparse
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

#: name -> environment added to an environment where none of the variables below is set.
CASES: dict[str, dict[str, str]] = {
    "unpinned": {},
    "pin (avx2 + MKL COMPATIBLE)": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
    "unpinned + OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "pin + OMP_WAIT_POLICY=passive": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                                      "OMP_WAIT_POLICY": "PASSIVE"},
    "unpinned, 1 thread": {"OMP_NUM_THREADS": "1"},
    "pin, 1 thread": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"},
    "ATEN_CPU_CAPABILITY=avx2 only, 1 thread": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"},
    "MKL_CBWR=COMPATIBLE only, 1 thread": {"MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"},
}
#: Variables a case may set; all are removed from the parent's environment first.
CONTROLLED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MLMT_BENCH_CPU_PIN", "MKL_ENABLE_INSTRUCTIONS")
SMOLLM2_SHAPE = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                 "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
                 "tie_word_embeddings": True, "rope_theta": 100000.0}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One timed generate in this process (its environment is the case's)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from mlmt_bench.machine.reproducible import record

    torch.manual_seed(0)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE))
    model.eval()
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 100, (args.batch, args.prompt))
    gen = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
        w0, c0 = time.perf_counter(), time.process_time()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
        w1, c1 = time.perf_counter(), time.process_time()
    new = (out.shape[1] - args.prompt) * args.batch
    env = record()
    return {"wall_s": w1 - w0, "cpu_s": c1 - c0, "tokens": new, "tok_s": new / (w1 - w0),
            "threads": torch.get_num_threads(), "cpu_capability": env["cpu_capability"],
            "mkl_cbwr_branch": env.get("mkl_cbwr_branch")}


def _spinners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory of SmolLM2-135M (default: random weights)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per row")
    ap.add_argument("--new", type=int, default=16, help="generated tokens per row")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes in the loaded measurements")
    ap.add_argument("--only", nargs="*", default=None, help="case names to run (default: all)")
    ap.add_argument("--loads", nargs="*", default=["idle", "loaded"], choices=["idle", "loaded"])
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds per measurement before it is abandoned")
    ap.add_argument("--baseline", default="unpinned, 1 thread", help="the case the ratios are over")
    ap.add_argument("--note", default="", help="what else the machine was doing (kept in the JSON)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}

    import signal

    from mlmt_bench.machine.reproducible import cpu_model

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the spinners are stopped
    cases = [c for c in CASES if args.only is None or c in args.only]
    base_env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    forward = ["--batch", str(args.batch), "--prompt", str(args.prompt), "--new", str(args.new)]
    forward += ["--model", args.model] if args.model else []
    runs: list[dict[str, Any]] = []
    started = time.time()
    for rnd in range(args.rounds):
        order = cases[rnd % len(cases):] + cases[:rnd % len(cases)]
        for load in args.loads:
            for case in order:
                env = {**base_env, **CASES[case]}
                spin = _spinners(args.busy) if load == "loaded" else []
                before = os.getloadavg()
                try:
                    res = subprocess.run([sys.executable, __file__, "--worker", *forward], env=env,
                                         capture_output=True, text=True, timeout=args.timeout)
                    out = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {
                        "error": res.stderr.strip().splitlines()[-1:]}
                except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
                    out = {"error": f"timeout after {args.timeout} s" if isinstance(exc, subprocess.TimeoutExpired)
                           else f"no result: {exc}"}
                finally:
                    _stop(spin)
                run = {"case": case, "load": load, "round": rnd, **out,
                       "loadavg_before": before, "loadavg_after": os.getloadavg()}
                runs.append(run)
                print(f"[{rnd}] {load:6s} {case:36s} " + (f"{out['tok_s']:7.1f} tok/s  wall {out['wall_s']:6.2f} s  "
                      f"cpu {out['cpu_s']:6.2f} s  {out['cpu_capability']} {out['mkl_cbwr_branch']}"
                      if "tok_s" in out else str(out)) + f"  load {before[0]:.2f}", flush=True)
    summary: list[dict[str, Any]] = []
    for load in args.loads:
        ref = [r for r in runs if r["case"] == args.baseline and r["load"] == load and "wall_s" in r]
        ref_wall = statistics.median(r["wall_s"] for r in ref) if ref else None
        ref_cpu = statistics.median(r["cpu_s"] for r in ref) if ref else None
        for case in cases:
            mine = [r for r in runs if r["case"] == case and r["load"] == load and "wall_s" in r]
            if not mine:
                continue
            wall = statistics.median(r["wall_s"] for r in mine)
            cpu = statistics.median(r["cpu_s"] for r in mine)
            summary.append({"case": case, "load": load, "env": CASES[case],
                            "median_tok_s": round(statistics.median(r["tok_s"] for r in mine), 1),
                            "median_wall_s": round(wall, 3),
                            "median_cpu_s": round(cpu, 3), "n": len(mine),
                            "wall_ratio_to_baseline": round(wall / ref_wall, 2) if ref_wall else None,
                            "cpu_ratio_to_baseline": round(cpu / ref_cpu, 2) if ref_cpu else None,
                            "cpu_capability": mine[0]["cpu_capability"], "mkl_cbwr_branch": mine[0]["mkl_cbwr_branch"],
                            "threads": mine[0]["threads"]})
    print(f"\n{'load':6s} {'case':40s} {'tok/s':>7s} {'wall s':>7s} {'cpu s':>7s} {'wall x':>7s} {'cpu x':>6s}"
          f"  (x: over {args.baseline!r})")
    for s in summary:
        print(f"{s['load']:6s} {s['case']:40s} {s['median_tok_s']:7.1f} {s['median_wall_s']:7.2f} "
              f"{s['median_cpu_s']:7.2f} {s['wall_ratio_to_baseline']!s:>7s} {s['cpu_ratio_to_baseline']!s:>6s}")
    failed = [r for r in runs if "error" in r]
    result = {"args": {k: v for k, v in vars(args).items() if k != "worker"}, "cpu": cpu_model(),
              "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
              "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized)" if args.model else "random, SmolLM2's shape",
              "seconds": round(time.time() - started, 1), "baseline": args.baseline, "note": args.note,
              "failed": [{"case": r["case"], "load": r["load"], **{k: r[k] for k in ("error", "loadavg_before")}}
                         for r in failed],
              "summary": summary, "runs": runs}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
