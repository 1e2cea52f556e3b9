"""Issue 14's GPU measurements in one run and one JSON: GRPO step time of mlmt-bench vs TRL's
``GRPOTrainer``, generation throughput, and the memory of the two-policy mlmt case.

A benchmark, not a test. It builds the 308M Llama from its preset (``registry/models/llama-308m.yaml``,
the project's character tokenizer, no download), saves it, and runs each part in its own
subprocess (fresh GPU memory statistics):

1. **GRPO step time** (``perf/grpo_step_time.py``'s two sides): 32 synthetic-arith problems ×
   G = 8 × 128 forced new tokens, bf16, with the task (verifier) reward and with the dense reward
   that makes both sides train on every token; mlmt-bench generates with the hf backend's
   ``decode: static`` path (CUDA graphs), TRL with ``generate``. Seconds per step, generated
   tokens/s, peak GPU memory, per side, and the ratio mlmt / TRL.
2. **Generation alone**: the same 256 prompts × 128 tokens through plain ``generate`` and through
   the static path (tokens/s, ratio), and a correctness check on the GPU: greedy static decoding
   (with graphs) against ``generate`` in float32, the share of identical rows and the largest
   log-prob difference.
3. **The mlmt memory case**: ``algorithm: mlmt`` with two 308M policies (the critic with LoRA r 16 on
   all linear layers), 16 problems × G 8 × K 2, 128 forced tokens per turn, dense reward: seconds
   per step, peak GPU memory overall and per phase (the trainer's ``mem/peak_mb/<phase>``), and
   ``mlmt-bench plan``'s estimate for the same spec beside it.
4. **The same case on one base** (part ``memory_share_base``): ``policies.share_base: true``, solver
   and critic two LoRA adapters (r 16, all linear layers) on one frozen 308M model, the same
   numbers beside the two-model case's (the solver there is fully fine-tuned, here an adapter).

``--smoke`` runs everything at toy size (tiny-0.5m, float32, 2 problems × G 2 × 8 tokens, one
warm-up and one measured step) so that a CPU machine can check the script end to end
(tests/test_gpu_benchmark.py). Needs TRL (the ``bench`` extra). See perf/README.md for
running it on a GPU machine.

Usage::

    python perf/gpu_step_time.py          # on a GPU: writes perf/results/gpu_step_time-<date>.json
    python perf/gpu_step_time.py --smoke --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "perf"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import grpo_step_time as gst  # noqa: E402  (perf/ is not a package)

# ----------------------------------------------------------------------------------------------
# children


def run_generation(args: argparse.Namespace) -> dict[str, Any]:
    """Throughput of generate vs the static path, and greedy agreement in float32."""
    import torch

    from mlmt_bench.models.tiny import build_tiny_model
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.rollout.hf_backend import HFBackend
    from static_decode_speed import attempt_prompts, measure

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    speed = measure(args.preset, argparse.Namespace(
        device=device, dtype=args.dtype, seed=args.seed, prompts=args.prompts * args.group_size,
        max_new_tokens=args.max_new_tokens, temperature=1.0, repeats=max(1, args.steps)))
    # correctness on this device: greedy, float32, graphs on when on CUDA
    tok = build_char_tokenizer()
    model = build_tiny_model(args.preset, tok, seed=args.seed).to(device)
    prompts = attempt_prompts(tok, min(64, args.prompts * args.group_size))
    new = min(32, args.max_new_tokens)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=new, temperature=0.0)
    static_backend = HFBackend(decode="static")
    static = static_backend.generate(model, tok, prompts, max_new_tokens=new, temperature=0.0)
    same = [a.ids == b.ids for a, b in zip(plain, static)]
    diffs = [abs(x - y) for a, b, ok in zip(plain, static, same) if ok for x, y in zip(a.logprobs, b.logprobs)]
    dec = static_backend.decoder(model)
    return {"speed": speed, "check": {
        "rows": len(prompts), "new_tokens": new, "dtype": "float32", "graphs": dec.graphs,
        "same_ids_fraction": sum(same) / len(same), "max_abs_logprob_diff_same_rows": max(diffs, default=0.0),
        "static_stats": vars(dec.stats)}}


def memory_spec(args: argparse.Namespace, work: Path) -> Any:
    from mlmt_bench.spec import validate_run

    total = args.warmup + args.steps
    policy: dict[str, Any] = {"model": "tiny", "path": args.model_dir, "lr": 1e-5, "dtype": args.dtype}
    lora = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
    if args.share_base:  # both roles adapters on one base
        policy["lora"] = lora
    data = {
        "name": "gpu-memory-case", "seed": args.seed, "output_dir": str(work / "runs"),
        "benchmark": {"name": "synthetic-arith", "train_limit": args.memory_problems, "eval_limit": 1},
        "policies": {"solver": policy, "critic": {**policy, "lora": lora}, **({"share_base": True}
                                                                               if args.share_base else {})},
        "backend": {"name": "hf", "temperature": 1.0, "max_new_tokens": args.max_new_tokens,
                    "options": {"decode": args.decode}},
        "algorithm": {"name": "mlmt", "params": {"group_size": args.group_size, "feedbacks": args.memory_feedbacks}},
        "train": {"steps": total, "problems_per_step": args.memory_problems, "checkpoint_every": 0,
                  "deterministic": False, "threads": args.threads},
        "eval": {"every": 0, "limit": 1, "feedback_metrics": False, "samples": 0, "protocols": ["refine_all"]},
    }
    return validate_run(data, "gpu-memory-case")


def run_memory(args: argparse.Namespace) -> dict[str, Any]:
    """The mlmt case: step time, peak GPU memory overall and per phase, and plan's estimate."""
    from mlmt_bench.plan import load_table, plan_run, resolve_device
    from mlmt_bench.runner import build, configure_torch, make_trainer
    from mlmt_bench.spec import dump_yaml
    from mlmt_bench.tracking import RunDir

    work = Path(tempfile.mkdtemp(prefix="gpu_memory_case_"))
    spec = memory_spec(args, work)
    table = load_table()
    planned = plan_run(spec, resolve_device("auto", table), 1, table)["memory"]
    configure_torch(spec)
    comp = build(spec, progress=False)
    comp.verifier = gst.DenseVerifier(comp.verifier)
    for role in ("solver", "critic"):
        comp.policies[role].model.generation_config.min_new_tokens = args.max_new_tokens
    run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
    trainer = make_trainer(spec, comp, run_dir)
    trainer.train(None)
    run_dir.finish("completed")
    recs = sorted((r for r in run_dir.metrics() if r["kind"] == "train"), key=lambda r: r["step"])
    total = args.warmup + args.steps
    step_s = [recs[i]["wall_s"] - recs[i - 1]["wall_s"] for i in range(args.warmup, total)]
    out = {
        "problems": args.memory_problems, "group_size": args.group_size, "feedbacks": args.memory_feedbacks,
        "max_new_tokens": args.max_new_tokens, "critic_lora": {"r": 16, "target_modules": "all-linear"},
        "share_base": args.share_base,
        "reward": "dense", "step_s": step_s, "gen_tokens_per_step": [recs[i]["gen_tokens"] - recs[i - 1]["gen_tokens"]
                                                                      for i in range(args.warmup, total)],
        "peak_gpu_mb": gst._peak_gpu_mb(), "peak_rss_mb": gst._peak_rss_mb(),
        # the trainer's own per-phase peaks (mlmt_bench/machine/memory.py: CUDA allocated, or CPU RSS), max over steps
        "memory_source": recs[-1].get("mem/source"),
        "phase_peak_mb": {k.rsplit("/", 1)[1]: max(r[k] for r in recs if k in r)
                          for k in sorted({k for r in recs for k in r if k.startswith("mem/peak_mb/")})},
        "plan_estimate_mb": {"peak": planned["peak"] / 2 ** 20, "always_held": planned["persistent"] / 2 ** 20,
                             "generation_phase": planned["generation_phase"] / 2 ** 20,
                             "logprobs_phase": planned["logprobs_phase"] / 2 ** 20,
                             "training_phase": planned["training_phase"] / 2 ** 20},
    }
    shutil.rmtree(work, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------
# parent


def _side_summary(runs: list[dict[str, Any]], side: str) -> dict[str, Any]:
    rs = [r for r in runs if r["side"] == side]
    steps = [s for r in rs for s in r["step_s"]]
    toks = [t for r in rs for t in r["tokens_per_step"]]
    rollout = statistics.fmean(r["phases_s"]["rollout+reward"]["mean"] for r in rs)
    return {"step_s": gst._stats(steps), "generated_tokens_per_step": statistics.fmean(toks),
            "trained_tokens_per_step": statistics.fmean(t for r in rs for t in r["trained_tokens_per_step"]),
            "generated_tokens_per_s_of_rollout": statistics.fmean(toks) / rollout if rollout else None,
            "rollout_s": rollout, "cpu_s": gst._stats([c for r in rs for c in r["cpu_s"]]),
            "peak_gpu_mb": max((r.get("peak_gpu_mb") or 0.0) for r in rs) or None,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs)}


def _versions() -> dict[str, Any]:
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "platform": platform.platform()}
    for name in ("trl", "peft", "accelerate"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def _device() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "memory_gb": props.total_memory / 1e9,
                "count": torch.cuda.device_count()}
    return {"kind": "cpu", "name": platform.processor() or "cpu", "cpus": os.cpu_count()}


def _own_child(args: argparse.Namespace, part: str, model_dir: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", part, "--model-dir", model_dir,
           "--child-out", str(out), *_passthrough(args)]
    return gst.run_child(cmd, out, threads=args.threads, verbose=args.verbose, what=f"{part} part")


def _passthrough(args: argparse.Namespace) -> list[str]:
    return [*(["--share-base"] if args.share_base else []),
            "--preset", args.preset, "--dtype", args.dtype, "--decode", args.decode, "--seed", str(args.seed),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--prompts", str(args.prompts),
            "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
            "--threads", str(args.threads), "--memory-problems", str(args.memory_problems),
            "--memory-feedbacks", str(args.memory_feedbacks)]


SMOKE = dict(preset="tiny-0.5m", dtype="float32", prompts=2, group_size=2, max_new_tokens=8, warmup=1, steps=1,
             memory_problems=2, memory_feedbacks=2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy sizes, for a CPU check of the whole script")
    p.add_argument("--preset", default="llama-308m")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--decode", default="static", choices=["generate", "static"])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--memory-problems", type=int, default=16)
    p.add_argument("--memory-feedbacks", type=int, default=2)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", default="grpo,generation,memory,memory_share_base",
                   help="comma-separated subset to run")
    p.add_argument("--no-share-prompts", dest="share_prompts", action="store_false",
                   help="grpo part, mlmt side: train.share_prompts false (every row reads its prompt in the update)")
    p.add_argument("--share-base", action="store_true", help=argparse.SUPPRESS)  # the memory child on one base
    p.add_argument("--out", default=None, help="default perf/results/gpu_step_time-<date>.json")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--only", choices=["generation", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)

    if args.only:  # child
        res = run_generation(args) if args.only == "generation" else run_memory(args)
        Path(args.child_out).write_text(json.dumps(res, default=str))
        return 0

    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit("TRL is not installed: pip install 'trl>=0.20' (the bench extra)") from None

    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    tmp = Path(tempfile.mkdtemp(prefix="gpu_step_time_"))
    model_dir = tmp / "model"
    n_params = gst.build_model(args.preset, args.seed, model_dir)
    device = _device()
    print(f"{args.preset}: {n_params:,} parameters, {args.dtype}, device {device}", flush=True)
    result: dict[str, Any] = {
        "benchmark": "gpu_step_time", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": args.smoke,
        "device": device, "versions": _versions(), "model": {"preset": args.preset, "params": n_params},
        "config": {k: v for k, v in vars(args).items() if k not in ("only", "model_dir", "child_out", "verbose")},
    }
    if "grpo" in parts:
        result["grpo"] = {}
        for reward in ("verifier", "dense"):
            runs = []
            for side in ("mlmt", "trl"):
                side_args = argparse.Namespace(
                    **{**vars(args), "reward": reward, "lr": 1e-4, "force_length": True, "profile_top": 30,
                       "keep_tmp": False, "deterministic": False, "order": "mlmt-first", "repeats": 1,
                       "model": None, "lora": 0, "cpu_dtype": "float32", "frozen_cast": True,
                       "benchmark": "synthetic-arith", "benchmark_options": "{}"})
                print(f"[grpo, {reward} reward] {side} ...", flush=True)
                res = gst._child(side_args, side, str(model_dir), tmp / f"{reward}-{side}.json")
                runs.append(res)
            summary = {side: _side_summary(runs, side) for side in ("mlmt", "trl")}
            summary["ratio_mlmt_over_trl"] = summary["mlmt"]["step_s"]["mean"] / summary["trl"]["step_s"]["mean"]
            summary["trl_prompts_match_mlmt"] = runs[1].get("prompts_match_mlmt")
            result["grpo"]["task" if reward == "verifier" else "dense"] = summary
            m, t = summary["mlmt"], summary["trl"]
            print(f"  mlmt {m['step_s']['mean']:.3f} s/step, TRL {t['step_s']['mean']:.3f} s/step "
                  f"(ratio {summary['ratio_mlmt_over_trl']:.2f}); generated tok/s during rollout: mlmt "
                  f"{m['generated_tokens_per_s_of_rollout']:,.0f}, TRL {t['generated_tokens_per_s_of_rollout']:,.0f}",
                  flush=True)
    if "generation" in parts:
        print("[generation] generate vs static ...", flush=True)
        result["generation"] = _own_child(args, "generation", str(model_dir), tmp / "generation.json")
        g = result["generation"]
        print(f"  generate {g['speed']['tokens_per_s']['generate']:,.0f} tok/s, static "
              f"{g['speed']['tokens_per_s']['static']:,.0f} tok/s; greedy rows identical "
              f"{g['check']['same_ids_fraction']:.0%} (graphs: {g['check']['graphs']})", flush=True)
    if "memory" in parts:
        print("[memory] mlmt, two policies ...", flush=True)
        result["memory_case"] = _own_child(args, "memory", str(model_dir), tmp / "memory.json")
        mc = result["memory_case"]
        print(f"  {statistics.fmean(mc['step_s']):.3f} s/step, peak GPU {mc['peak_gpu_mb']} MiB "
              f"(plan's estimate {mc['plan_estimate_mb']['peak']:.0f} MiB)", flush=True)
    if "memory_share_base" in parts:
        print("[memory] mlmt, two adapters on one base ...", flush=True)
        one = argparse.Namespace(**{**vars(args), "share_base": True})
        result["memory_case_share_base"] = _own_child(one, "memory", str(model_dir), tmp / "memory-one-base.json")
        mc = result["memory_case_share_base"]
        print(f"  {statistics.fmean(mc['step_s']):.3f} s/step, peak GPU {mc['peak_gpu_mb']} MiB "
              f"(plan's estimate {mc['plan_estimate_mb']['peak']:.0f} MiB)", flush=True)
    out = Path(args.out or ROOT / "perf" / "results" / f"gpu_step_time-{time.strftime('%Y-%m-%d')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
