"""Experiments: every arm × seed of an :class:`ExperimentSpec`, then one comparison report.

Writes ``<output_dir>/<name>-<UTC stamp>/`` with ``experiment.json`` (rewritten atomically after
each run, so a crash keeps the list of finished runs), the runs themselves, ``comparison.md``
and ``acc_vs_tokens.png``.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.spec import ExperimentSpec, RunSpec
from mlmt_bench.tracking import atomic_write_text


def check_equal_budgets(exp: ExperimentSpec, arms: dict[str, RunSpec]) -> None:
    """Every arm must stop at the same budget of the kind ``exp.budget`` names (METHOD.md v2: equal
    generated tokens, or equal FLOPs), and at no budget of the other kind, which would stop it first."""
    if exp.budget == "none":
        return
    field, other = ("token_budget", "flop_budget") if exp.budget == "tokens" else ("flop_budget", "token_budget")
    budgets = {arm: getattr(s.train, field) for arm, s in arms.items()}
    if None in budgets.values() or len(set(budgets.values())) > 1:
        raise UserError(f"experiment {exp.name}: budget: {exp.budget} needs the same train.{field} in every arm, "
                        f"got {budgets}")
    extra = {arm: getattr(s.train, other) for arm, s in arms.items() if getattr(s.train, other) is not None}
    if extra:
        raise UserError(f"experiment {exp.name}: budget: {exp.budget}, but train.{other} is set in {extra}; "
                        f"set it to null")


def run_experiment(exp: ExperimentSpec, arms: dict[str, RunSpec], progress: bool = True) -> dict[str, Any]:
    from mlmt_bench import runner
    from mlmt_bench.report.compare import build_comparison

    check_equal_budgets(exp, arms)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    exp_dir = Path(exp.output_dir) / f"{exp.name}-{stamp}"
    exp_dir.mkdir(parents=True, exist_ok=False)
    record: dict[str, Any] = {"name": exp.name, "seeds": exp.seeds, "arms": {a: [] for a in arms},
                              "started": stamp, "wall_s": {}}
    atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
    t_start = time.perf_counter()
    n, total = 0, len(arms) * len(exp.seeds)
    for seed in exp.seeds:
        for arm, spec in arms.items():
            n += 1
            run_spec = spec.model_copy(update={"seed": seed, "output_dir": str(exp_dir),
                                               "name": f"{spec.name}-s{seed}"}, deep=True)
            if progress:
                sys.stderr.write(f"[{n}/{total}] {arm} seed {seed}\n")
            t0 = time.perf_counter()
            result = runner.run(run_spec, progress=progress,
                                extra_manifest={"arm": arm, "experiment": exp.name})
            record["arms"][arm].append(Path(result["run_dir"]).name)
            record["wall_s"][f"{arm}/s{seed}"] = round(time.perf_counter() - t0, 1)
            atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
    record["wall_s"]["total"] = round(time.perf_counter() - t_start, 1)
    baseline = "grpo" if "grpo" in arms else None
    summary = build_comparison({a: [exp_dir / d for d in dirs] for a, dirs in record["arms"].items()}, exp_dir,
                               baseline=baseline, title=exp.name)
    record["comparison"] = summary["files"]
    atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
    return {"run_dir": str(exp_dir), "experiment": record, "comparison": summary}
