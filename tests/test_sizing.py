"""Sizing a headline from a pilot (mlmt_bench/metrics/sizing.py, `mlmt-bench size`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.metrics import sizing
from mlmt_bench.metrics.twoway import mde, pigeonhole_variance
from support import make_run, table_row


def test_components_of_a_hand_computed_array():
    # [[1, 0], [0, 0]]: seed means (.5, 0), problem means (.5, 0), grand mean .25.
    # MS_seed = 2 * var_ddof1(.5, 0) = 2 * .125 = .25 = MS_problem; the doubly centred cells are
    # ±.25, so SS_e = 4 * .0625 = .25 over (2-1)(2-1) = 1 degree of freedom: MS_e = .25.
    # seed = (.25 - .25) / 2 = 0, problem = 0, residual = .25.
    comp = sizing.variance_components([[1, 0], [0, 0]])
    assert (comp["seed"], comp["problem"], comp["residual"]) == (0.0, 0.0, 0.25)
    assert comp["mean"] == 0.25 and (comp["n_seeds"], comp["n_problems"]) == (2, 2)
    # a pure seed effect: rows (2, 2, 2) and (0, 0, 0): MS_seed = 3 * 2 = 6, MS_e = 0: seed = 6 / 3 = 2
    comp = sizing.variance_components([[2, 2, 2], [0, 0, 0]])
    assert comp["seed"] == 2.0 and comp["problem"] == 0.0 and comp["residual"] == 0.0


def test_a_negative_estimate_is_reported_and_clipped():
    # a pure cell pattern (checkerboard): row and column means are equal, MS_seed = MS_problem = 0,
    # so the seed and problem estimates are -MS_e / N and -MS_e / S
    comp = sizing.variance_components([[1, 0], [0, 1]])
    assert comp["raw"]["seed"] < 0 and comp["raw"]["problem"] < 0
    assert comp["seed"] == 0.0 and comp["problem"] == 0.0 and comp["residual"] == 1.0


def test_the_expected_bootstrap_variance_of_a_hand_design():
    comp = {"seed": 4.0, "problem": 2.0, "residual": 10.0}
    # S = 2, N = 5: (1/4)(4 + 10/5) + (4/25)(2 + 10/2) + (1*4/100)*10 = 1.5 + 1.12 + 0.4 = 3.02
    assert sizing.expected_bootstrap_variance(comp, 2, 5) == pytest.approx(3.02)
    # the model's own: 4/2 + 2/5 + 10/10 = 3.4
    assert sizing.model_variance(comp, 2, 5) == pytest.approx(3.4)
    assert sizing.projected_mde(comp, 2, 5) == pytest.approx(mde(np.sqrt(3.02)))


def test_estimates_and_projection_agree_with_simulated_experiments():
    """Under the crossed model the estimates are unbiased, and the projected bootstrap variance is
    the mean of the pigeonhole variance of experiments of that design."""
    rng = np.random.default_rng(0)
    sa, sb, se = 1.5, 2.0, 3.0
    n_seeds, n_problems, reps = 4, 60, 3000
    est, boot = [], []
    for _ in range(reps):
        y = (rng.normal(0, sa, (n_seeds, 1)) + rng.normal(0, sb, (1, n_problems))
             + rng.normal(0, se, (n_seeds, n_problems)))
        c = sizing.variance_components(y)
        est.append([c["raw"]["seed"], c["raw"]["problem"], c["raw"]["residual"]])
        boot.append(pigeonhole_variance(y))
    mean = np.mean(est, axis=0)
    assert mean == pytest.approx([sa**2, sb**2, se**2], rel=0.08)
    truth = {"seed": sa**2, "problem": sb**2, "residual": se**2}
    assert np.mean(boot) == pytest.approx(sizing.expected_bootstrap_variance(truth, n_seeds, n_problems), rel=0.04)


def test_seeds_needed_is_the_fewest_reaching_the_target_or_none():
    comp = {"seed": 9.0, "problem": 0.0, "residual": 0.0}
    s = sizing.seeds_needed(comp, 100, 3.0)
    assert s is not None and sizing.projected_mde(comp, s, 100) <= 3.0 < sizing.projected_mde(comp, s - 1, 100)
    # a problem term whose MDE alone exceeds the target: no number of seeds reaches it
    assert sizing.seeds_needed({"seed": 0.0, "problem": 400.0, "residual": 0.0}, 10, 3.0) is None
    with pytest.raises(ValueError, match="at least 2 seeds"):
        sizing.variance_components([[1, 0, 1]])
    with pytest.raises(ValueError, match="target"):
        sizing.seeds_needed(comp, 10, 0)


def test_size_reads_a_pilot_and_writes_its_table(tmp_path: Path):
    rng = np.random.default_rng(1)
    n = 40
    arms: dict[str, list[str]] = {"grpo": [], "mlmt": []}
    for s in range(3):
        for arm, p in (("grpo", 0.3), ("mlmt", 0.4 + 0.05 * s)):
            t = [int(x) for x in rng.random(n) < p]
            d = make_run(tmp_path / "exp", f"pilot-{arm}-s{s}-2025010{s}T000000Z", seed=s, arm=arm,
                         curve=[(0, 0, 0.0, .1, .1), (5, 100, 1e9, .3, float(np.mean(t)))], t1=t, t2=t)
            arms[arm].append(d.name)
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"name": "pilot", "seeds": [0, 1, 2], "arms": arms}))
    out = tmp_path / "sizing"
    res = CliRunner().invoke(app, ["--json", "size", str(tmp_path / "exp"), "--arm", "mlmt", "--target", "3",
                                   "--problems", "40", "--problems", "500", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)
    assert rec["pilot"]["n_seeds"] == 3 and rec["pilot"]["n_problems"] == n
    assert set(rec["seeds_needed"]) == {"40", "500"}
    # more problems never need more seeds
    s40, s500 = rec["seeds_needed"]["40"], rec["seeds_needed"]["500"]
    assert s500 is not None and (s40 is None or s500 <= s40)
    # the projection at the pilot's own design is of the order of the pilot's measured MDE
    own = next(r for r in rec["projection"] if r["n_seeds"] == 3 and r["n_problems"] == n)
    assert 0.5 < own["mde"] / rec["pilot"]["mde"] < 2
    assert (out / "sizing.md").read_text().startswith("# Sizing: mlmt − grpo")
    assert json.loads((out / "sizing.json").read_text())["arm"] == "mlmt"
    bad = CliRunner().invoke(app, ["size", str(tmp_path / "exp"), "--arm", "nope"])
    assert bad.exit_code != 0 and "no row 'nope'" in bad.output


def test_design_seconds_by_hand():
    """A run: 60 s of steps, a 30 s final evaluation, a 10 s start (2 s when the memo holds it);
    at twice the problems the evaluations double; three seeds: one first run and two that read."""
    ph = {"train_s": 60.0, "final_eval_s": 30.0, "start_s": 10.0, "start_memo_s": 2.0}
    assert sizing.design_seconds(ph, 1, 1.0) == {"run_s": 92.0, "first_run_s": 100.0, "total_s": 100.0}
    assert sizing.design_seconds(ph, 3, 2.0) == {"run_s": 124.0, "first_run_s": 140.0, "total_s": 388.0}
    with pytest.raises(ValueError):
        sizing.design_seconds(ph, 0, 1.0)


def _log_steps(run: Path, steps: dict[int, tuple[float, int, int]]) -> None:
    """Add train records (step: wall_s, gen_tokens, trained_tokens) before a run's later records, in step order."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows += [{"kind": "train", "step": k, "wall_s": w, "gen_tokens": g, "trained_tokens": t}
             for k, (w, g, t) in steps.items()]
    order = {"eval": 0, "train": 1, "final": 2}
    rows.sort(key=lambda r: (r["kind"] == "final", r["step"], order[r["kind"]]))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_size_prices_designs_from_the_runs_phases(tmp_path: Path):
    """Each run logs its step-0 evaluation at 10 s (seed 0, computed) or 2 s (seeds 1, 2, read from
    the memo), its last step at +60 s and its final evaluation 30 s later: a 3-seed design at the
    pilot's 40 problems costs 100 + 2 × 92 s per arm, and --hours picks the design with the smallest
    MDE whose contrast fits, never one of fewer than 3 seeds."""
    rng = np.random.default_rng(2)
    n = 40
    arms: dict[str, list[str]] = {"grpo": [], "mlmt": []}
    for s in range(3):
        start = 10.0 if s == 0 else 2.0
        for arm, p in (("grpo", 0.3), ("mlmt", 0.45)):
            t = [int(x) for x in rng.random(n) < p]
            d = make_run(tmp_path / "exp", f"pilot-{arm}-s{s}-2025010{s}T000000Z", seed=s, arm=arm,
                         curve=[(0, 0, 0.0, .1, .1), (5, 100, 1e9, .3, float(np.mean(t)))], t1=t, t2=t,
                         eval_extra={0: {"wall_s": start}, 5: {"wall_s": start + 90}},
                         train_extra={5: {"wall_s": start + 60}})
            _log_steps(d, {2: (start + 20, 40, 20), 4: (start + 45, 80, 40)})
            arms[arm].append(d.name)
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"name": "pilot", "seeds": [0, 1, 2], "arms": arms}))
    from mlmt_bench.report.sizing import render_markdown, size_from_dirs

    rec = size_from_dirs([tmp_path / "exp"], "mlmt", "grpo", 3.0, [40, 80], hours=1.0)
    assert rec["wall"]["grpo"]["phases"] == {"train_s": 60.0, "final_eval_s": 30.0, "start_s": 10.0,
                                            "start_memo_s": 2.0}
    # training: 5 steps in 60 s, steps 2 and 4 logged at +20 and +45 s (median gap of 20, 25, 15 s), 100
    # generated and 50 trained tokens by step 5
    assert rec["wall"]["grpo"]["training"] == pytest.approx({"steps": 5.0, "step_s": 20.0, "gen_tok_s": 100 / 60,
                                                             "trained_tok_s": 50 / 60})
    assert rec["contrast_arms"] == ["grpo", "mlmt"]
    three = next(r for r in rec["projection"] if r["n_seeds"] == 3 and r["n_problems"] == 40)
    assert three["contrast_hours"] == pytest.approx(2 * 284 / 3600) == three["all_arms_hours"]
    assert rec["longest_run_hours"][80] == pytest.approx(140 / 3600)
    assert table_row(render_markdown(rec), "grpo")[-4:] == ["5.0", "20.0", "1.7", "0.8"]
    fits = [r for r in rec["projection"] if r["n_seeds"] >= 3 and r["contrast_hours"] <= 1.0]
    assert rec["affordable"] == min(fits, key=lambda r: r["mde"])
    with pytest.raises(UserError, match="--hours"):
        size_from_dirs([tmp_path / "exp"], "mlmt", "grpo", 3.0, hours=0)
    # part-way through a pilot, one arm has a seed more: the difference is sized on the seeds both have
    shutil.rmtree(tmp_path / "exp" / arms["mlmt"].pop())
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"name": "pilot", "seeds": [0, 1, 2], "arms": arms}))
    part = size_from_dirs([tmp_path / "exp"], "mlmt", "grpo", 3.0, hours=0.12)
    assert part["pilot"]["seeds"] == [0, 1] and part["wall"]["grpo"]["runs"] == 3
    # 0.12 h buys the pilot's own 2 seeds (2 × (100 + 92) s) but not 3 (2 × 284 s): none is chosen
    two = next(r for r in part["projection"] if r["n_seeds"] == 2 and r["n_problems"] == 40)
    assert two["contrast_hours"] == pytest.approx(2 * 192 / 3600) and part["affordable"] is None
