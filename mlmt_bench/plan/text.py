"""The plan as text (``mlmt-bench plan`` without ``--json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlmt_bench.plan.throughput import GB


def _n(x: float) -> str:
    for unit, k in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= k:
            return f"{x / k:.3g}{unit}"
    return f"{x:.3g}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.1f} MB"


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def render(result: dict[str, Any]) -> str:
    if result["kind"] == "experiment":
        arms = "\n\n".join(f"== arm {arm}\n" + _render_run(p, result["spec"]) for arm, p in result["arms"].items())
        n_arms, n_seeds = len(result["arms"]), len(result["seeds"])
        memo = (f", less {_dur(result['memo_saved_s'])} of step-0 evaluations that seeds after the first read from "
                "the eval memo" if result["total_s"] is not None and result["memo_saved_s"] else "")
        total = (f"time (estimate) {_dur(result['total_s'])} one after another (each arm's estimate x {n_seeds} "
                 f"seeds{memo}; estimates from measured throughput, not bounds)" if result["total_s"] is not None
                 else "no time estimate: an arm has none (above)")
        return (f"{arms}\n\n== experiment {result['name']}: {n_arms} arms x {n_seeds} seeds = {result['runs']} runs; "
                f"{total}")
    return _render_run(result, result["spec"])


def _tokens_line(t: dict[str, dict[str, float]]) -> str:
    shown = {k: v for k, v in t.items() if v and not (k == "read" and v == t.get("trained"))}
    return ", ".join(f"{_LABELS.get(k, k)} {_n(sum(v.values()))}"
                     + (f" ({', '.join(f'{r} {_n(x)}' for r, x in v.items())})" if len(v) > 1 else "")
                     for k, v in shown.items())


#: how a token count of plan.work.Work is named in the printed plan (the rest by their own names)
_LABELS = {"read": "read by the update (train.share_prompts)"}


def _render_run(p: dict[str, Any], spec_path: str) -> str:
    d = p["device"]
    mem = p["memory"]
    unit = "GPU" if d["kind"] != "cpu" else "process"
    lines = [f"plan: {spec_path} (run {p['spec']}, {p['algorithm']}) on {d['kind']} "
             f"({_gb(d['memory_bytes']) if d['memory_bytes'] else 'memory unknown'}; {d['description']})"
             f" x {p['gpus']} {unit}{'es' if unit == 'process' and p['gpus'] > 1 else 's' if p['gpus'] > 1 else ''}",
             "policies:"]
    for q in p["policies"]:
        shared = ", the solver's model" if q["shared_with_solver"] else ""
        lines.append(f"  {q['role']:6} {q['model']}: {_n(q['params']).replace('G', 'B')} parameters, {q['fine_tuning']}"
                     f"{' (adapter ' + _n(q['lora_params']) + ')' if q['lora_params'] else ''}, {q['dtype']}, "
                     f"{'trained' if q['updated'] else 'frozen'}{shared}  [{_relative(q['source'])}]")
    pr = p["program"]
    lines.append(f"per step and {unit} ({pr['problems_per_gpu']} of {pr['problems_per_step']} problems; upper bounds: "
                 f"every turn runs to max_new_tokens {pr['max_new_tokens']}"
                 f"{'/' + str(pr['feedback_max_new_tokens']) if pr['feedback'] == 'critic' else ''}):")
    lines.append("  sequences: " + ", ".join(f"{v} {k}" for k, v in p["per_step"]["sequences"].items()))
    lines.append("  tokens: " + _tokens_line(p["per_step"]["tokens"]))
    f = p["per_step"]["flops"]
    lines.append(f"  FLOPs: {sum(f.values()):.3g} (generation {f['generation']:.3g}, training {f['training']:.3g}, "
                 f"extra forwards {f['forward']:.3g})")
    lines.append(f"  prompt tokens: {p['prompt_tokens']['source']}")
    r = p["run"]
    budget = (f"; the token budget ends the run after {r['budget_steps']} steps at these lengths"
              if r["budget_steps"] is not None and r["budget_steps"] < r["steps_in_spec"] else "")
    lines.append(f"run: {r['steps']} steps (train.steps {r['steps_in_spec']}{budget}), {r['evaluations']} evaluations "
                 f"of {r['eval_problems']} problems")
    lines.append("  training tokens: " + _tokens_line(r["train_tokens"]))
    lines.append("  evaluation tokens: " + _tokens_line(r["eval_tokens"]))
    tf, ef = sum(r["train_flops"].values()), sum(r["eval_flops"].values())
    lines.append(f"  FLOPs: {tf + ef:.3g} (training steps {tf:.3g}, evaluations {ef:.3g})")
    dev = f" of {_gb(mem['device'])}" if mem["device"] else ""
    lines.append(f"memory per {unit} (estimate, ±30 %): peak {_gb(mem['peak'])}{dev} "
                 f"({'fits' if mem['fits'] else 'DOES NOT FIT'}) = always held {_gb(mem['persistent'])} "
                 f"+ max(generation {_gb(mem['generation_phase'])}, log-probs {_gb(mem['logprobs_phase'])}, "
                 f"update {_gb(mem['training_phase'])})")
    for phase, title in (("persistent", "held"), ("generation", "generation"), ("logprobs", "log-probs"),
                         ("training", "update")):
        if mem["items"][phase]:
            lines.append(f"  {title}: " + ", ".join(f"{k} {_gb(v)}" for k, v in mem["items"][phase].items()))
    t = p["time"]
    if t["available"]:
        lines.append(f"time (estimate): {t['per_step_s']:.2f} s/step, {_dur(t['train_s'])} training + "
                     f"{_dur(t['eval_s'])} evaluation = {_dur(t['total_s'])}")
        for role, bsis in t["basis"].items():
            lines.append(f"  {role}: from {bsis['row']} ({_n(bsis['row_params'])} params) on {d['kind']}, "
                         f"{bsis['backend']}: {_n(bsis['gen'])} generated tok/s, {_n(bsis['train'])} trained tok/s "
                         f"after scaling by parameters (x{bsis['scale']:.3g}); source: {bsis['source']}")
    else:
        lines.append(f"time: {t['why']}")
    return "\n".join(lines)
