"""``mlmt-bench plan SPEC``: what a run will cost, before it starts.

Everything is read offline: the spec, each policy's architecture (:mod:`mlmt_bench.models.configs`:
a preset, a local config.json, or a ``registry/models`` file for a hub name), the algorithm's own
episode program (G attempts, K feedbacks, M refinements) and update schedule, the benchmark's
prompts when its data is on disk (else an estimate, labelled). Nothing is downloaded or loaded.

Reported, per GPU (a process under data parallelism gets ``problems_per_step / gpus`` problems):

- parameters per policy, and the trainable ones (LoRA adapters counted from the wrapped layers);
- per training step, as **upper bounds** (every turn runs to its ``max_new_tokens``): sequences,
  prefill / generated / trained / extra-forward tokens and FLOPs by METHOD.md v2
  (:mod:`mlmt_bench.metrics.cost`, as the trainer counts them: prompts as prefill, whole trained
  sequences every epoch, every extra forward pass once: reference log-probs when β > 0, old
  log-probs when epochs > 1, the learned value's features, self_distill's KL teacher);
- the same for the whole run (``train.steps``, or fewer if the token budget ends it first at these
  lengths) and its evaluations;
- estimated peak memory: weights (once for roles that share one base, ``policies.share_base``),
  LoRA adapters, gradients and AdamW states (in the parameters' dtype; LoRA adapters are float32,
  peft's default), the frozen reference copy (full fine-tuning
  with β > 0), the generation engine (vLLM: ``gpu_memory_utilization`` × device memory per model;
  hf static decode: its KV-cache budget; hf generate: the KV cache of the largest call), and the
  larger of the generation phase (prefill activations, KV of plain generate) and the training
  phase (activations of the largest micro-batch as ``train.micro_batch_tokens`` and
  ``grad_accum`` split the update, checkpointed with ``gradient_checkpointing``; with
  ``train.share_prompts`` those of the distinct prompts read once, the completions, and the prompts'
  keys and values gathered to every row; and the float32 log-softmax over the vocabulary of the
  trained positions) and the log-prob phase before it
  (π_ref / π_old logits), plus a fixed runtime overhead. Not included: allocator
  fragmentation, the learned value's feature pass, vLLM's own compile workspace, DAPO dynamic
  sampling's extra rounds, other processes. Treat it as ±30 %.
- estimated time from measured tokens/s (``mlmt_bench/data/throughput.yaml``, keyed by device and
  model; the nearest model size on the device is scaled by parameter count); the update is timed on
  the tokens it reads (with ``train.share_prompts`` a prompt once for the turns that share it: G
  attempts of a problem, K feedbacks of an attempt, the refinements of one feedback, or of one
  attempt where a rule writes its feedbacks; not on a model with gradient checkpointing, which reads
  every row whole), its FLOPs stay the nominal count of trained tokens.

An experiment's time is every arm's estimate once per seed, less the step-0 evaluations the eval
memo (:mod:`mlmt_bench.io.eval_memo`) reads rather than runs: an arm's seeds after the first, when its
step-0 evaluation is greedy and memoised and its policies start from weights no seed changes
(:func:`step0_memo_across_seeds`). Arms that share a step-0 evaluation with another arm are still
counted once each, so the total stays on the high side.

A spec whose estimated peak exceeds the device's memory is refused (one-line error, exit 2)
unless ``--force``.

Modules: :mod:`~mlmt_bench.plan.work` (turns and tokens of a step), :mod:`~mlmt_bench.plan.memory`
(the memory estimate), :mod:`~mlmt_bench.plan.throughput` (devices, the table, time) and
:mod:`~mlmt_bench.plan.text` (the printed plan); this one assembles them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmt_bench.errors import UserError
from mlmt_bench.plan.memory import estimate_memory
from mlmt_bench.plan.text import render
from mlmt_bench.plan.throughput import GB, Device, backend_key, load_table, resolve_device, time_estimate
from mlmt_bench.plan.work import (
    Work,
    base_critic_work,
    eval_work,
    evaluations,
    planned_policies,
    prompt_lengths,
    sharing_roles,
    step_turns,
    step_work,
    trained_sequences,
    unredacted_work,
)

__all__ = ["plan_run", "plan_spec", "refusal", "render", "load_table", "resolve_device", "Device"]

if TYPE_CHECKING:
    from mlmt_bench.spec import RunSpec


def plan_run(spec: RunSpec, device: Device, gpus: int = 1, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan of one validated :class:`~mlmt_bench.spec.RunSpec` (a JSON-able dict)."""
    from mlmt_bench import registry

    if gpus < 1:
        raise UserError(f"--gpus must be ≥ 1, got {gpus}")
    table = table if table is not None else load_table()
    algo_cls = registry.algorithms.get(spec.algorithm.name)
    params = spec.algorithm.validated_params()  # validated once, by the spec
    algorithm = algo_cls(params, spec.train.steps)
    policies = planned_policies(spec, algorithm)
    lengths = prompt_lengths(spec)
    b = spec.backend
    t_new, t_fb = b.max_new_tokens, b.feedback_max_new_tokens or b.max_new_tokens
    n = max(1, math.ceil(spec.train.problems_per_step / gpus))
    step_plan = algorithm.step_plan(0)
    program = step_plan.program()
    turns = step_turns(step_plan, n, lengths, t_new, t_fb)
    trained = trained_sequences(turns, policies, lengths, n)
    value_tokens = 0.0
    if algorithm.value_model is not None:  # features of each feedback's refinement context
        refine = next((t for t in turns if t.kind == "refine"), None)
        feedback = next((t for t in turns if t.kind == "feedback"), None)
        if refine is not None and feedback is not None:
            value_tokens = feedback.count * refine.prompt
    step = step_work(turns, trained, params, value_tokens, sharing_roles(spec, policies))
    model_params = {r: p.shape.params for r, p in policies.items()}

    gen_per_step = sum(step.generated.values()) * gpus
    steps = spec.train.steps
    budget_steps = None
    if spec.train.token_budget and gen_per_step:
        budget_steps = math.ceil(spec.train.token_budget / gen_per_step)
        steps = min(steps, budget_steps)
    if spec.train.flop_budget:
        flops_per_step = sum(step.flops(model_params).values()) * gpus
        flop_steps = math.ceil(spec.train.flop_budget / flops_per_step) if flops_per_step else steps
        budget_steps = flop_steps if budget_steps is None else min(budget_steps, flop_steps)
        steps = min(steps, flop_steps)
    n_eval_runs = evaluations(steps, spec.eval.every)
    e = lengths.eval_problems or 0
    eval_plan = algorithm.eval_plan()
    eval_turns = step_turns(eval_plan, e, lengths, t_new, t_fb)
    one_eval = eval_work(eval_plan, e, lengths, t_new, t_fb, spec.eval.feedback_metrics)
    eval_program = eval_plan.program()
    if spec.eval.base_critic and eval_program.feedback == "none":  # as runner.build gives the trainer one
        one_eval = one_eval.plus(base_critic_work(e, lengths, t_new, t_fb, spec.eval.feedback_metrics))
    final_extra = Work()  # what only the last evaluation adds
    if spec.feedback.eval_unredacted and spec.feedback.redact and eval_program.feedback in ("critic", "oracle"):
        final_extra = unredacted_work(eval_plan, e, lengths, t_new, t_fb, spec.eval.feedback_metrics)
    train_total = step.scaled(steps)
    eval_total = one_eval.scaled(n_eval_runs).plus(final_extra)

    memory = estimate_memory(spec, params, policies, turns, trained, eval_turns, device)
    from mlmt_bench.runner import cpu_dtype

    time_est = time_estimate(table, device, policies, step, one_eval, steps, n_eval_runs, backend_key(spec),
                             cpu_dtype(spec)["dtype"], final_extra)
    return {
        "spec": spec.name, "algorithm": spec.algorithm.name,
        "device": {"kind": device.kind, "memory_bytes": device.memory, "description": device.description},
        "gpus": gpus,
        "policies": [{"role": r, "model": p.spec.path or p.shape.name, "source": p.shape.source,
                      "params": p.shape.params, "trainable": p.trainable, "lora_params": p.lora_params,
                      "dtype": p.spec.dtype, "shared_with_solver": p.shared,
                      "fine_tuning": f"LoRA r {p.spec.lora.r:d}" if p.spec.lora else "full",
                      "updated": p.trains, **({"adapter_on_base_of": p.base_of} if p.base_of else {})}
                     for r, p in policies.items()],
        "program": {"problems_per_step": spec.train.problems_per_step, "problems_per_gpu": n,
                    "attempts": program.attempts, "feedback": program.feedback, "feedbacks": program.feedbacks,
                    "refinements": program.refinements, "max_new_tokens": t_new, "feedback_max_new_tokens": t_fb},
        "prompt_tokens": {"attempt": lengths.attempt, "feedback_extra": lengths.feedback_extra,
                          "refine_extra": lengths.refine_extra, "source": lengths.source},
        "per_step": {"sequences": {f"{t.kind} ({t.role})": t.count for t in turns},
                     "tokens": vars(step), "flops": step.flops(model_params)},
        "run": {"steps": steps, "steps_in_spec": spec.train.steps, "budget_steps": budget_steps,
                "evaluations": n_eval_runs, "eval_problems": e,
                "train_tokens": vars(train_total), "eval_tokens": vars(eval_total),
                "train_flops": train_total.flops(model_params), "eval_flops": eval_total.flops(model_params)},
        "memory": memory,
        "time": time_est,
        "step0_memo": step0_memo_across_seeds(spec, policies, gpus),
        "upper_bounds": "every turn runs to its max_new_tokens; every trained turn is trained "
                        "(zero-advantage groups are skipped in practice)",
    }


def step0_memo_across_seeds(spec: RunSpec, policies: dict[str, Any], gpus: int) -> str | None:
    """Why the seeds after an experiment's first read this run's step-0 evaluation from the eval memo
    instead of running it, or None where they may not. ``policies``: :func:`planned_policies`' result.

    They do when the evaluation is greedy with ``eval.memo`` on and the memo's directory on, in one
    process (FSDP's shards are not keyed), and every policy's starting weights are the same for every
    seed: loaded from a path or a warm start, or a shared base with its own ``base.seed`` (one without
    takes the run's). A LoRA adapter is no obstacle: it starts at zero (:func:`eval_memo.weights_identity`).
    """
    from mlmt_bench.io import eval_memo
    from mlmt_bench.models.factory import model_factory

    if spec.eval.temperature or not spec.eval.memo or eval_memo.default_dir() is None or gpus != 1:
        return None
    for p in policies.values():
        if p.shared or not model_factory(p.spec.model).starts_from_base(p.spec):
            continue
        if spec.base is None or spec.base.get("seed") is None:
            return None  # each seed builds its own base: the weights differ
    return "greedy, memoised, and every policy starts from weights no seed changes"


def plan_spec(path: Path, overrides: list[str], device: str = "auto", gpus: int = 1) -> dict[str, Any]:
    """Plan a run spec, or every arm of an experiment spec."""
    from mlmt_bench import spec as specs

    table = load_table()
    dev = resolve_device(device, table)
    loaded = specs.load_any(path, overrides)
    for arm, s in (loaded[1].items() if isinstance(loaded, tuple) else [(None, loaded)]):
        _check_device(s, dev, device, table, f"{path}: " + (f"arm {arm}: " if arm else ""))
    if isinstance(loaded, tuple):
        exp, arms = loaded
        plans = {arm: plan_run(s, dev, gpus, table) for arm, s in arms.items()}
        timed = all(p["time"]["available"] for p in plans.values())
        # one after another: every arm's estimate once per seed, less the step-0 evaluations that seeds after the
        # first read from the eval memo (None: an arm has no estimate)
        memo_s = sum(p["time"]["per_eval_s"] for p in plans.values() if p["step0_memo"]) * (len(exp.seeds) - 1)
        return {"kind": "experiment", "spec": str(path), "name": exp.name, "arms": plans, "seeds": list(exp.seeds),
                "runs": len(plans) * len(exp.seeds),
                "total_s": sum(p["time"]["total_s"] for p in plans.values()) * len(exp.seeds) - memo_s
                if timed else None,
                "memo_saved_s": memo_s if timed else None,
                "fits": all(p["memory"]["fits"] for p in plans.values())}
    result = plan_run(loaded, dev, gpus, table)
    return {"kind": "run", "spec": str(path), **result, "fits": result["memory"]["fits"]}


def _check_device(spec: RunSpec, device: Device, asked: str, table: dict[str, Any], where: str) -> None:
    """A backend that generates on GPUs only (its ``gpu_only`` trait: vLLM) is not planned for a
    CPU: its engine's memory and a time scaled from the tiny CPU rows would mean nothing."""
    from mlmt_bench.rollout.backend import backend_class

    if device.gpu or not backend_class(spec.backend.name).traits.gpu_only:
        return
    found = ("--device auto found no CUDA GPU on this machine" if asked == "auto"
             else f"--device {asked} plans for a CPU")
    gpus = ", ".join(k for k, d in table["devices"].items() if d.get("memory_gb"))
    raise UserError(f"{where}backend {spec.backend.name} generates on a CUDA GPU only and {found}; plan it for "
                    f"the GPU it will run on: --device {gpus.split(', ')[0]} (known GPUs: {gpus})")


def refusal(result: dict[str, Any]) -> str | None:
    """The one-line reason a planned spec does not fit, or None."""
    plans = result["arms"].items() if result["kind"] == "experiment" else [(None, result)]
    for arm, p in plans:
        m = p["memory"]
        if not m["fits"]:
            biggest = max(((k, v) for phase in m["items"].values() for k, v in phase.items()), key=lambda kv: kv[1])
            where = f"arm {arm}: " if arm else ""
            unit = "process" if p["device"]["kind"] == "cpu" else "GPU"
            return (f"{result['spec']}: {where}estimated peak memory {m['peak'] / GB:.1f} GB per {unit} exceeds the "
                    f"{m['device'] / GB:.0f} GB of {p['device']['kind']} (largest part: {biggest[0]} "
                    f"{biggest[1] / GB:.1f} GB); use --force to plan it anyway")
    return None
