"""Budgets that are budgets (METHOD v4): a run stops and evaluates at the step that crosses its
FLOPs (or token) budget, every evaluation logs its test-time FLOPs and reports show them per
problem beside the training FLOPs, and ``report --at-flops`` reads each run within 10% of the
budget or flags it (refusing a budget that no run is near)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from mlmt_bench.errors import UserError
from mlmt_bench.metrics.cost import generation_flops, rollout_flops
from mlmt_bench.report.compare import build_comparison
from mlmt_bench.report.runs import load_run
from support import build_trainer, make_run, make_spec, one_line_error, table_column

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _records(trainer, kind):
    return [r for r in trainer.run_dir.metrics() if r["kind"] == kind]


def _spec(tmp_path, ckpt, *, every=0, algo="grpo", params=None, **train):
    spec = make_spec(tmp_path, ckpt, algo, params, train={"steps": 3, "problems_per_step": 2, **train})
    return spec.model_copy(update={"eval": spec.eval.model_copy(update={"every": every, "feedback_metrics": False,
                                                                        "limit": 4})})


# --------------------------------------------------------------------------- the stop rule


@pytest.mark.parametrize("budget", ["flop_budget", "token_budget"])
def test_a_run_stops_and_evaluates_at_the_step_that_crosses_its_budget(tiny_ckpt, tmp_path, budget):
    """The cumulative cost of a reference run's steps, then the same run with a budget between its
    first and second steps' totals and evaluations every 5 steps: it stops after step 2, the first
    step at or past the budget, and evaluates there (not at the next multiple of 5)."""
    ref = build_trainer(_spec(tmp_path / "ref", tiny_ckpt), tmp_path / "ref")
    ref.train()
    key = "flops" if budget == "flop_budget" else "gen_tokens"
    spent = [r[key] for r in _records(ref, "train")]
    assert len(spent) == 3 and spent[0] < spent[1]
    cap = (spent[0] + spent[1]) / 2 if budget == "flop_budget" else spent[0] + 1
    spec = _spec(tmp_path / "cut", tiny_ckpt, every=5, steps=50, **{budget: cap})
    cut = build_trainer(spec, tmp_path / "cut")
    cut.train()
    assert [r[key] for r in _records(cut, "train")] == spent[:2]  # the same steps, stopped after the crossing
    evals = _records(cut, "eval")
    assert [r["step"] for r in evals] == [0, 2] and evals[-1][key] == spent[1] >= cap > spent[0]
    assert _records(cut, "final")[0]["step"] == 2


# --------------------------------------------------------------------------- test-time FLOPs


def test_rollout_flops_by_hand():
    # solver P = 1000: 2·1000·(50 + 30); critic P = 400: 2·400·(20 + 10); rule-written feedback: nothing
    assert rollout_flops({"solver": 1000, "critic": 400}, {"solver": 50, "critic": 20},
                         {"solver": 30, "critic": 10}) == 160_000 + 24_000
    assert rollout_flops({"solver": 1000}, {"solver": 50, "critic": 70}, {"solver": 30, "critic": 0}) == 160_000
    assert rollout_flops({"solver": 1000}, {"solver": 50}, {"solver": 30}) == generation_flops(1000, 50, 30)
    with pytest.raises(ValueError, match="no parameter count for role 'critic'"):
        rollout_flops({"solver": 1000}, {"critic": 5}, {"critic": 3})


def _by_hand(ro, params):
    """2·P·(prompt + generated) over every generated turn of a rollout, P of the role that generated it."""
    return sum(2.0 * params[t.policy] * (len(t.prompt_ids) + len(t.ids)) for t in ro.turns if t.ids)


def test_an_evaluation_logs_its_test_time_flops(tiny_ckpt, tmp_path):
    """mlmt: the attempt, the critic's feedback and the refinement of every problem, each at its
    model's parameter count (the evaluation is greedy: the same turns when rolled out again)."""
    from mlmt_bench.rollout.episodes import rollout

    trainer = build_trainer(_spec(tmp_path, tiny_ckpt, algo="mlmt", params={"value": "none"}), tmp_path)
    rec = trainer.evaluate(time.perf_counter())
    ro = rollout(trainer.algorithm.eval_program(), trainer.actors, trainer.eval_problems, trainer.eval_sampling)
    params = {role: trainer.policies[role].n_params for role in ("solver", "critic")}
    assert {t.kind for t in ro.turns if t.ids} == {"attempt", "feedback", "refine"}
    assert rec["test_flops_eval"] == _by_hand(ro, params) > 0


def test_a_base_critic_evaluation_logs_its_own_test_time_flops(tiny_ckpt, tmp_path):
    """grpo with eval.base_critic: its own row costs the attempts only; its `+ base critic` row
    also the frozen critic's feedback and the refinements."""
    from mlmt_bench.rollout.episodes import Program, rollout

    spec = _spec(tmp_path, tiny_ckpt)
    spec = spec.model_copy(update={"eval": spec.eval.model_copy(update={"base_critic": True})})
    trainer = build_trainer(spec, tmp_path)
    rec = trainer.evaluate(time.perf_counter())
    p = trainer.policies["solver"].n_params
    alone = rollout(trainer.algorithm.eval_program(), trainer.actors, trainer.eval_problems, trainer.eval_sampling)
    assert rec["test_flops_eval"] == _by_hand(alone, {"solver": p})
    actors = dataclasses.replace(trainer.actors, critic=trainer.base_critic)
    helped = rollout(Program(attempts=1, feedback="critic"), actors, trainer.eval_problems, trainer.eval_sampling)
    expected = _by_hand(helped, {"solver": p, "critic": trainer.base_critic.n_params})
    assert rec["base_critic/test_flops_eval"] == expected > rec["test_flops_eval"]


def test_reports_show_test_time_flops_per_problem_beside_training_flops(tmp_path):
    """test_flops_eval / n (4 problems) per run, mean ± std over seeds; the `+ base critic` row its own."""
    runs = []
    for seed, (own, helped) in enumerate(((4e6, 1.2e7), (8e6, 2.0e7))):
        runs.append(make_run(tmp_path, f"g{seed}-20250101T000000Z", seed=seed, arm="grpo", feedback=False,
                             curve=[(0, 0, 0.0, .25, .25), (5, 100, 1e9, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 0, 0],
                             extra={"test_flops_eval": own, "base_critic/test_flops_eval": helped,
                                    "base_critic/acc@t2": .75, "base_critic/acc@t1": .5}))
    build_comparison({"grpo": runs}, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    label = "test-time FLOPs per problem (2·P·(prompt + generated), every turn)"
    assert table_column(md, label) == ["1.50e+06 ± 7.07e+05", "4.00e+06 ± 1.41e+06"]  # (1e6, 2e6); (3e6, 5e6)
    assert table_column(md, "FLOPs (training, at the end)") == ["1.00e+09 ± 0.00e+00"] * 2
    # the page's column header: the name, its parenthetical on a second line
    assert "test-time FLOPs per problem<div class=sub>(2·P·(prompt + generated), every turn)</div>" in (
        tmp_path / "out" / "index.html").read_text()


def test_runs_without_test_time_flops_show_no_row(tmp_path):
    """Runs logged before test-time FLOPs (every committed report's) render as they did: no row."""
    a = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="grpo", feedback=False,
                 curve=[(0, 0, 0.0, .25, .25), (5, 100, 1e9, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])
    build_comparison({"grpo": [a]}, tmp_path / "out")
    assert "test-time FLOPs" not in (tmp_path / "out" / "comparison.md").read_text()


# --------------------------------------------------------------------------- --at-flops within 10%


def _flops_runs(tmp_path):
    """grpo evaluated at 1e9 and 2e9 FLOPs, mlmt (2 seeds) at 1.3e9 / 2.6e9 and 0.95e9 / 1.9e9."""
    runs = {"grpo": [make_run(tmp_path, "g-20250101T000000Z", seed=0, arm="grpo", feedback=False,
                              curve=[(0, 0, 0.0, .1, .1), (5, 100, 1e9, .2, .2), (10, 200, 2e9, .5, .5)],
                              t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])],
            "mlmt": [make_run(tmp_path, f"m{s}-20250101T000000Z", seed=s, arm="mlmt",
                              curve=[(0, 0, 0.0, .1, .1), (5, 100, f, .3, .4), (10, 200, 2 * f, .5, .6)],
                              t1=[1, 1, 0, 0], t2=[1, 1, 1, 0]) for s, f in ((0, 1.3e9), (1, 0.95e9))]}
    return runs


def test_a_reading_off_the_budget_is_flagged_in_its_cell(tmp_path):
    """At 1e9: grpo at 1e9 and mlmt s1 at 0.95e9 are within 10%; mlmt s0's evaluations are 0 and
    1.3e9, so it is read at step 0 (below the budget) and flagged in its cell, the notes and the page."""
    runs = _flops_runs(tmp_path)
    summary = build_comparison(runs, tmp_path / "out", at_flops=1e9)
    md = (tmp_path / "out" / "comparison.md").read_text()
    cells = table_column(md, "read at (evaluation nearest 1e+09 FLOPs within ±10%, else below it)")
    assert cells == ["s0: step 5, 1.00e+09 FLOPs",
                     "s0: UNTRAINED (step 0) (0.00× the budget: NOT WITHIN 10%); s1: step 5, 9.50e+08 FLOPs"]
    assert any(n.startswith("NOT AT EQUAL FLOPs: 1 of 3 runs have no evaluation within 10% of 1e+09 FLOPs")
               and n.endswith(": mlmt 1/2 (0.00×).") for n in summary["notes"])
    assert "NOT WITHIN 10%" in (tmp_path / "out" / "index.html").read_text()
    # at 2.05e9: grpo's 2e9 and mlmt s1's 1.9e9 are within 10%; mlmt s0's 2.6e9 is not, its 1.3e9 is 0.63×
    build_comparison(runs, tmp_path / "out2", at_flops=2.05e9)
    md = (tmp_path / "out2" / "comparison.md").read_text()
    assert table_column(md, "read at (evaluation nearest 2.05e+09 FLOPs within ±10%, else below it)") == [
        "s0: step 10, 2.00e+09 FLOPs", "s0: step 5, 1.30e+09 FLOPs (0.63× the budget: NOT WITHIN 10%); "
                                       "s1: step 10, 1.90e+09 FLOPs"]


def test_a_budget_no_run_is_near_is_refused_in_one_line(tmp_path):
    runs = _flops_runs(tmp_path)
    with pytest.raises(UserError, match=r"--at-flops 1.6e\+09: no run has an evaluation within 10% of that budget "
                                        r"\(their evaluations nearest it are at 0.59×–0.81× of it\)"):
        build_comparison(runs, tmp_path / "out", at_flops=1.6e9)
    assert not (tmp_path / "out").exists()
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.json").write_text(json.dumps({"name": "e", "arms": {a: [str(p) for p in d]
                                                                          for a, d in runs.items()}}))
    one_line_error(["report", str(exp), "--out", str(tmp_path / "pub"), "--raw", "--at-flops", "1.6e9"],
                   "no run has an evaluation within 10%")
    assert not (tmp_path / "pub").exists()  # refused before anything was published


def test_a_run_stopped_by_its_flop_budget_is_read_at_its_end(tmp_path):
    """A run that crossed train.flop_budget = 1e9 by 4% evaluates there (its last evaluation,
    1.04e9): read at that budget it is within 10%, not at its previous evaluation."""
    a = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="grpo", feedback=False,
                 curve=[(0, 0, 0.0, .1, .1), (5, 100, 6e8, .2, .2), (8, 160, 1.04e9, .5, .5)],
                 t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])
    r = load_run(a, at_flops=1e9)
    assert r.read_at["step"] == 8 and r.read_at["within"] and r.final["acc@t2"] == .5
