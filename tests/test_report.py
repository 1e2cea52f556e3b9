"""mlmt_bench.report: comparison tables and figures from hand-written run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mlmt_bench.errors import UserError
from mlmt_bench.metrics.stats import bootstrap_ci, holm_adjust, sign_flip_test
from mlmt_bench.metrics.twoway import mde, twoway_bootstrap, twoway_paired
from mlmt_bench.report.compare import build_comparison, report_from_dirs
from mlmt_bench.report.runs import load_run
from support import make_run, table_column, table_row


@pytest.fixture()
def arms(tmp_path: Path) -> dict[str, list[Path]]:
    r = tmp_path / "runs"
    grpo = [
        make_run(r, "grpo-20250101T000000Z", seed=0, arm="grpo", feedback=False,
                 curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5), (20, 2000, 2e12, .75, .75)],
                 t1=[1, 1, 0, 1], t2=[1, 1, 0, 1]),
        make_run(r, "grpo-20250101T000001Z", seed=1, arm="grpo", feedback=False,
                 curve=[(0, 0, 0.0, .25, .25), (10, 1100, 1.1e12, .5, .5), (20, 2100, 2.1e12, .5, .5)],
                 t1=[1, 0, 0, 1], t2=[1, 0, 0, 1]),
    ]
    mlmt = [
        make_run(r, "mlmt-20250101T000000Z", seed=0, arm="mlmt",
                 curve=[(0, 0, 0.0, .25, .25), (10, 3000, 3e12, .5, .75), (20, 6000, 6e12, .5, 1.0)],
                 t1=[0, 1, 0, 1], t2=[1, 1, 1, 1]),
        make_run(r, "mlmt-20250101T000001Z", seed=1, arm="mlmt",
                 curve=[(0, 0, 0.0, .25, .5), (10, 2000, 2e12, .25, .625), (20, 4000, 4e12, .25, .75)],
                 t1=[1, 0, 0, 0], t2=[1, 1, 0, 1]),
    ]
    sc = [make_run(r, "sc-20250101T000000Z", seed=0, arm="self_correct",
                   curve=[(0, 0, 0.0, .25, .25), (20, 5000, 5e12, .5, .5)],
                   t1=[1, 1, 0, 0], t2=[0, 1, 0, 1])]
    return {"grpo": grpo, "mlmt": mlmt, "self_correct": sc}


def test_comparison_table_numbers(arms, tmp_path):
    out = tmp_path / "report"
    summary = build_comparison(arms, out, baseline="grpo", title="toy")
    md = (out / "comparison.md").read_text()
    std = np.std([0.75, 0.5], ddof=1)  # sample std over seeds = 0.1768 -> 17.7 points
    assert f"{100 * std:.1f}" == "17.7"
    # columns: grpo, mlmt, self_correct
    assert table_column(md, "acc@t2 (refine-all)") == ["62.5% ± 17.7", "87.5% ± 17.7", "50.0% (1 seed)"]
    assert table_column(md, "acc@t1") == ["62.5% ± 17.7", "37.5% ± 17.7", "50.0% (1 seed)"]
    assert table_column(md, "delta (t2 − t1)") == ["+0.0 pp ± 0.0", "+50.0 pp ± 0.0", "+0.0 pp (1 seed)"]
    # GRPO has no turn-2 / feedback metrics: dashes
    assert table_column(md, "i→c")[0] == "–"
    assert table_column(md, "feedback_effect (g vs g∅)") == ["–", "+12.5 pp ± 0.0", "+12.5 pp (1 seed)"]
    assert "correction_rate" not in md  # no arm recorded it: no row
    assert "oracle-gated (optimistic: consults the verifier at test time)" in md
    assert table_column(md, "generated tokens (training, at the end)")[1] == "5000 ± 1414"

    # the 95% CI is the two-way bootstrap of grpo's [seeds, problems] outcomes (seed 0 [1, 1, 0, 1],
    # seed 1 [1, 0, 0, 1]): 10000 resamples, seed 0
    m, lo, hi, se = twoway_bootstrap([[1, 1, 0, 1], [1, 0, 0, 1]], n_boot=10_000, seed=0)
    assert m == 0.625
    ci = summary["arms"]["grpo"]["ci"]["acc@t2"]
    assert (ci["mean"], ci["lo"], ci["hi"], ci["se"], ci["n_problems"], ci["n_seeds"]) == (m, lo, hi, se, 4, 2)
    assert ci["interval"] == "two-way" and ci["why"] is None
    assert (table_column(md, "acc@t2 (refine-all): 95% CI (seeds × problems)")[0]
            == f"62.5% [{100 * lo:.1f}, {100 * hi:.1f}]")
    # one seed (self_correct): the two-way bootstrap is the bootstrap over its problems, and says so
    sc = summary["arms"]["self_correct"]["ci"]["acc@t2"]
    assert (sc["mean"], sc["lo"], sc["hi"]) == bootstrap_ci([0, 1, 0, 1], n_boot=10_000, seed=0)
    assert sc["interval"] == "one seed"
    assert table_column(md, "acc@t2 (refine-all): 95% CI (seeds × problems)")[2].endswith("(1 seed: problems only)")
    assert "One seed (self_correct): the two-way bootstrap has no seed to resample" in md
    assert table_column(md, "seeds × problems in the CIs") == ["2 × 4", "2 × 4", "1 × 4"]
    assert summary["arms"]["mlmt"]["metrics"]["acc@t2"]["mean"] == 0.875
    assert math.isclose(summary["arms"]["mlmt"]["metrics"]["acc@t2"]["std"], std)

    # each arm's start (step 0: every problem wrong in these runs) and its gain over it, paired seed
    # by seed and problem by problem: mlmt [[1, 1, 1, 1], [1, 1, 0, 1]] - 0; the v2 sign flips of the
    # 4 positive seed-averaged differences [1, 1, .5, 1]: 2/16
    assert summary["arms"]["mlmt"]["start"]["acc@t2"] == 0.0
    g = summary["arms"]["mlmt"]["gain"]
    assert g["mean"] == pytest.approx(0.875) and g["per_seed"] == [1.0, 0.75]
    assert g["per_seed_diff"] == {0: 1.0, 1: 0.75}
    ref = twoway_paired([[1, 1, 1, 1], [1, 1, 0, 1]], [[0] * 4] * 2, n_boot=10_000, seed=0)
    assert (g["lo"], g["hi"], g["p_value"], g["mde"]) == (ref["lo"], ref["hi"], ref["p_value"], ref["mde"])
    assert g["mde"] == pytest.approx(2.8016 * g["se"], rel=1e-4) and g["sign_flip_p"] == pytest.approx(0.125)
    # no replicate is negative; one is 0 when it draws seed 1 twice and problem 2 four times
    # (probability 1/4 x 1/4^4 = 1/1024), which counts half: p ~ 2 (10000 / 1024 / 2 + 1) / 10001 = 0.0012
    assert 2 / 10_001 < g["p_value"] < 0.004
    gain_row = table_column(md, "gain in acc@t2 over its own step 0 (95% CI, p, MDE)")
    assert gain_row[1].startswith("+87.5 pp [") and f"MDE {100 * g['mde']:.1f} pp" in gain_row[1]

    # tokens (FLOPs) to reach grpo's mean final acc@t2 (62.5%), per seed, interpolated
    assert summary["target_acc@t2"] == 0.625
    r = summary["arms"]["mlmt"]["reach"]["gen_tokens"]
    # seed 0: .25 at 0 -> .75 at 3000: 0 + (.625-.25)/.5 * 3000 = 2250; seed 1: .625 at 2000 exactly
    assert r["per_seed"] == pytest.approx([2250, 2000]) and r["median"] == pytest.approx(2125)
    assert summary["arms"]["mlmt"]["reach"]["flops"]["per_seed"] == pytest.approx([2.25e12, 2e12])
    reach = table_column(md, "tokens to reach grpo's final acc@t2 (62.5%): median over seeds")
    assert reach[1] == "2125 (2/2 seeds)"
    assert summary["arms"]["grpo"]["reach"]["gen_tokens"]["per_seed"] == [pytest.approx(1500), None]
    assert reach[0] == "1500 (1/2 seeds)" and reach[2] == "not reached (0/1)"


def test_an_arm_already_at_the_target_at_step_0_is_said_so(tmp_path):
    r = tmp_path / "runs"
    base = [make_run(r, "grpo-20250101T000000Z", seed=0, arm="grpo", feedback=False,
                     curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])]
    fast = [make_run(r, "m-20250101T000000Z", seed=0, arm="m", curve=[(0, 0, 0.0, .25, .75), (10, 900, 1e12, .5, .5)],
                     t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])]
    s = build_comparison({"grpo": base, "m": fast}, tmp_path / "o")
    assert s["arms"]["m"]["reach"]["gen_tokens"]["at_start"] == 1
    assert "at step 0" in table_column((tmp_path / "o" / "comparison.md").read_text(),
                                    "tokens to reach grpo's final acc@t2 (50.0%): median over seeds")[1]


def test_paired_difference_two_way_holm_mde_and_mcnemar_per_seed(arms, tmp_path):
    summary = build_comparison(arms, tmp_path / "r", baseline="grpo")
    md = (tmp_path / "r" / "comparison.md").read_text()
    p = summary["paired"]["mlmt"]
    # seed by seed, problem by problem: mlmt [[1,1,1,1], [1,1,0,1]] - grpo [[1,1,0,1], [1,0,0,1]]
    mlmt, grpo = [[1, 1, 1, 1], [1, 1, 0, 1]], [[1, 1, 0, 1], [1, 0, 0, 1]]
    ref = twoway_paired(mlmt, grpo, n_boot=10_000, seed=0)
    assert p["n_problems"] == 4 and p["n_seeds"] == 2 and p["diff"] == pytest.approx(0.25)
    assert (p["lo"], p["hi"], p["se"], p["p_value"]) == (ref["lo"], ref["hi"], ref["se"], ref["p_value"])
    assert p["mde"] == mde(p["se"]) and p["interval"] == "two-way"
    assert p["per_seed_diff"] == {0: 0.25, 1: 0.25}
    # the v2 test, kept as the secondary: seed-averaged differences [0, .5, .5, 0], 4 sign patterns
    assert p["sign_flip_p"] == sign_flip_test([0, 0.5, 0.5, 0]) == 0.5
    # McNemar per seed: seed 0 [1,1,1,1] vs [1,1,0,1] -> b=1, c=0; seed 1 [1,1,0,1] vs [1,0,0,1] -> b=1
    assert {s: (m["b"], m["c"], m["p_value"]) for s, m in p["mcnemar"].items()} == {0: (1, 0, 1.0), 1: (1, 0, 1.0)}

    # self_correct has seed 0 only, grpo seeds 0 and 1: they cannot be crossed, so its difference
    # falls back to the v2 bootstrap over problems of seed means, [0,1,0,1] - [1,.5,0,1], and says why
    q = summary["paired"]["self_correct"]
    assert q["interval"] == "problems" and q["n_seeds"] is None and "different seeds" not in q["why"]
    assert "seeds 0" in q["why"] and "a paired comparison needs the same seeds" in q["why"]
    fb = twoway_paired([[-1, 0.5, 0, 0]], [[0] * 4], n_boot=10_000, seed=0)
    assert q["diff"] == pytest.approx(-0.125)
    assert (q["lo"], q["hi"], q["p_value"]) == (fb["lo"], fb["hi"], fb["p_value"])
    assert q["per_seed_diff"] == {0: -0.25} and list(q["mcnemar"]) == [0]  # s0: [0,1,0,1] - [1,1,0,1]
    assert "self_correct − grpo: not on the same seeds and problems" in md
    # Holm over the two arms compared with grpo
    assert summary["statistics"]["holm_family"] == ["mlmt", "self_correct"]
    assert [p["p_holm"], q["p_holm"]] == holm_adjust([p["p_value"], q["p_value"]])
    assert "grpo" not in summary["paired"]

    against = md.split("## Against grpo")[1]
    row = table_row(against, "mlmt")
    assert row[:2] == ["2 × 4", f"+25.0 pp [{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}]"]
    assert row[2:6] == [f"{p['p_value']:.3f}", f"{p['p_holm']:.3f}" + (" *" if p["p_holm"] < 0.05 else ""),
                        f"{100 * p['mde']:.1f} pp", "s0 +25.0, s1 +25.0"]
    assert row[6:] == ["0.500", "s0: 1/0, p = 1.000; s1: 1/0, p = 1.000"]
    sc_row = table_row(against, "self_correct")
    assert sc_row[0] == "4 problems (seed means)" and sc_row[1].startswith("-12.5 pp [")
    assert sc_row[1].endswith("(problems only: seed means)") and sc_row[5] == "s0 -25.0"
    assert "two-way bootstrap" in md and "Holm-adjusted over the 2 methods compared with grpo" in md
    assert "secondary: conditional on these seeds" in md and "METHOD.md v3" in md and "METHOD.md v2" not in md


def test_two_way_intervals_include_the_seed_spread(tmp_path):
    """Seeds that disagree widen the two-way interval beyond the bootstrap over problems of seed
    means (which v2 used), and the MDE with it; identical seeds leave only the problem spread."""
    r = tmp_path / "runs"
    n = 40
    rng = np.random.default_rng(3)
    base = (rng.random(n) < 0.5).astype(int)
    good, bad = base.copy(), base.copy()  # the arm is 25 points better on seed 0, 25 worse on seed 1
    good[base == 0] = (rng.random((base == 0).sum()) < 0.6)
    bad[base == 1] = (rng.random((base == 1).sum()) < 0.4)
    runs = {"grpo": [make_run(r, f"grpo-2025010{s}T000000Z", seed=s, arm="grpo", feedback=False,
                              curve=[(0, 0, 0.0, .5, .5)], t1=list(base), t2=list(base)) for s in (0, 1)],
            "m": [make_run(r, f"m-2025010{s}T000000Z", seed=s, arm="m", curve=[(0, 0, 0.0, .5, .5)],
                           t1=list(base), t2=list(t)) for s, t in ((0, good), (1, bad))]}
    s = build_comparison(runs, tmp_path / "o")
    p = s["paired"]["m"]
    d = np.array([good - base, bad - base], dtype=float)
    per_problem = bootstrap_ci(d.mean(axis=0), n_boot=10_000, seed=0)
    assert p["diff"] == pytest.approx(d.mean())
    assert p["hi"] - p["lo"] > 1.2 * (per_problem[2] - per_problem[1])
    assert p["per_seed_diff"][0] > 0.1 > -0.1 > p["per_seed_diff"][1]


def test_arms_on_different_problems_fall_back_to_the_problems_and_say_why(tmp_path):
    """An arm whose seeds were evaluated on different problems (one stopped early, say) cannot be
    crossed as seeds × problems: its intervals and its difference fall back to the bootstrap over
    problems of seed means, with a note that says why, and the others keep the two-way statistics."""
    r = tmp_path / "runs"
    curve = [(0, 0, 0.0, .5, .5)]
    grpo = [make_run(r, f"grpo-2025010{s}T000000Z", seed=s, arm="grpo", feedback=False, curve=curve,
                     t1=[1, 0, 1, 0, 1, 0], t2=[1, 0, 1, 0, 1, 0]) for s in (0, 1)]
    short = [make_run(r, "m-20250101T000000Z", seed=0, arm="m", curve=curve, t1=[1] * 6, t2=[1] * 6),
             make_run(r, "m-20250102T000000Z", seed=1, arm="m", curve=curve, t1=[1] * 4, t2=[1] * 4)]
    full = [make_run(r, f"n-2025010{s}T000000Z", seed=s, arm="n", curve=curve, t1=[1] * 6, t2=[0] * 6) for s in (0, 1)]
    s = build_comparison({"grpo": grpo, "m": short, "n": full}, tmp_path / "o")
    md = (tmp_path / "o" / "comparison.md").read_text()
    ci = s["arms"]["m"]["ci"]["acc@t2"]
    assert ci["interval"] == "problems" and "m seed 1 was evaluated on a different problem set" in ci["why"]
    assert "missing p4, p5" in ci["why"] and ci["n_problems"] == 6 and ci["n_seeds"] == 2
    p = s["paired"]["m"]
    assert p["interval"] == "problems" and p["n_problems"] == 6 and p["diff"] == pytest.approx(0.5)
    assert p["per_seed_diff"] == {0: 0.5, 1: pytest.approx(0.5)}  # seed 1 on its 4 problems: [1,1,1,1] - [1,0,1,0]
    assert "m, acc@t2: its runs cannot be crossed as seeds × problems" in md
    assert "m − grpo: not on the same seeds and problems" in md
    q = s["paired"]["n"]
    assert q["interval"] == "two-way" and q["diff"] == pytest.approx(-0.5) and q["per_seed_diff"] == {0: -0.5, 1: -0.5}
    assert s["statistics"]["holm_family"] == ["m", "n"]
    assert [p["p_holm"], q["p_holm"]] == holm_adjust([p["p_value"], q["p_value"]])


def test_runs_of_different_protocols_are_never_one_table(tmp_path):
    r = tmp_path / "runs"
    a = make_run(r, "grpo-20250101T000000Z", seed=0, arm="grpo", feedback=False, curve=[(0, 0, 0.0, .5, .5)],
                 t1=[1, 1, 0, 0], t2=[1, 1, 0, 0], spec="benchmark: {name: gsm8k, eval_split: test}\n")
    b = make_run(r, "m-20250101T000000Z", seed=0, arm="m", curve=[(0, 0, 0.0, .5, .5)],
                 t1=[1, 1, 0, 0], t2=[1, 1, 0, 0], spec="benchmark: {name: mbpp, eval_split: test}\n")
    with pytest.raises(UserError, match=r"differ in their protocol \(benchmark.name: \"gsm8k\" vs \"mbpp\"\)"):
        build_comparison({"grpo": [a], "m": [b]}, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_figure_and_atomic_outputs(arms, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "comparison.md").write_text("old")
    build_comparison(arms, out)
    png = (out / "acc_vs_tokens.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out / "comparison.md").read_text() != "old"
    # no temp files
    assert sorted(p.name for p in out.iterdir()) == ["acc_vs_tokens.png", "comparison.md", "index.html",
                                                    "problems.html"]


def test_no_baseline_and_interrupted_run(arms, tmp_path):
    r = tmp_path / "runs2"
    arms["mlmt"].append(make_run(r, "mlmt-20250102T000000Z", seed=2, arm="mlmt", final=False,
                                 curve=[(0, 0, 0.0, .25, .25), (10, 500, 5e11, .5, .5)],
                                 t1=[1, 1, 0, 0], t2=[1, 1, 0, 0]))
    del arms["grpo"]
    summary = build_comparison(arms, tmp_path / "o")  # baseline "grpo" is absent
    md = (tmp_path / "o" / "comparison.md").read_text()
    assert summary["baseline"] is None and summary["paired"] == {}
    assert "baseline 'grpo' is not among the arms" in md
    assert "has no final record (status: interrupted)" in md
    assert summary["arms"]["mlmt"]["metrics"]["acc@t2"]["per_seed"] == [1.0, 0.75, 0.5]  # last eval used
    assert "to reach" not in md


def test_report_from_dirs_groups_by_arm(arms, tmp_path):
    # manifests without `arm`: the directory name without its timestamp
    r = tmp_path / "plain"
    a = make_run(r, "grpo-20250101T000000Z", seed=0, arm=None, feedback=False,
                 curve=[(0, 0, 0.0, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 0, 0])
    b = make_run(r, "grpo-20250101T000000Z-1", seed=1, arm=None, feedback=False,
                 curve=[(0, 0, 0.0, .5, .5)], t1=[1, 0, 1, 0], t2=[1, 0, 1, 0])
    s = report_from_dirs([a, b], tmp_path / "o1", "grpo")
    assert list(s["arms"]) == ["grpo"] and len(s["arms"]["grpo"]["runs"]) == 2
    assert s["arms"]["grpo"]["runs"] == ["../plain/grpo-20250101T000000Z", "../plain/grpo-20250101T000000Z-1"]
    with pytest.raises(UserError, match="give --out DIR"):
        report_from_dirs([a, b], None)

    # an experiment directory; run paths relative to it
    exp = tmp_path / "runs"
    (exp / "experiment.json").write_text(json.dumps(
        {"name": "toy", "arms": {k: [str(p.relative_to(exp)) for p in v] for k, v in arms.items()}}))
    s = report_from_dirs([exp], tmp_path / "o2", "grpo")
    assert set(s["arms"]) == {"grpo", "mlmt", "self_correct"}
    assert s["paired"]["mlmt"]["n_problems"] == 4
    # run dirs grouped by their manifest's arm
    s = report_from_dirs(arms["mlmt"] + arms["grpo"], tmp_path / "o3", "grpo")
    assert list(s["arms"]) == ["grpo", "mlmt"] and sorted(s["paired"]["mlmt"]["mcnemar"]) == [0, 1]  # baseline first


def test_load_run(arms):
    run = load_run(arms["mlmt"][1])
    assert (run.arm, run.seed, run.final_step, run.has_final) == ("mlmt", 1, 20, True)
    assert {p: v["t2"] for p, v in run.problems.items()} == {"p0": True, "p1": True, "p2": False, "p3": True}
    assert [r["step"] for r in run.curve] == [0, 10, 20]
    assert run.outcomes("t2", at="first") == {"p0": 0.0, "p1": 0.0, "p2": 0.0, "p3": 0.0}  # step 0


def test_load_run_errors(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a run directory"):
        load_run(tmp_path / "empty")

    d = tmp_path / "noeval"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"name": "x", "seed": 0}))
    (d / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    with pytest.raises(UserError, match="no eval records"):
        load_run(d)

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"name": "x", "seed": 0}))
    (bad / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "acc@t1": 0.5}\n{"kind": "ev\n'
                                       '{"kind": "final", "step": 0}\n')
    with pytest.raises(UserError, match=r"metrics\.jsonl:2: invalid JSON") as exc:
        load_run(bad)
    assert "\n" not in str(exc.value)

    (bad / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n[1, 2]\n{"kind": "final"}\n')
    with pytest.raises(UserError, match=r"metrics\.jsonl:2: expected a JSON object"):
        load_run(bad)
    with pytest.raises(UserError, match="no run directories"):
        build_comparison({"a": []}, tmp_path / "o")


def test_curves_pool_each_runs_last_eval_into_one_final_point(tmp_path):
    from mlmt_bench.report.figures import aggregate_curves

    r = tmp_path / "runs"
    a = make_run(r, "m-20250101T000000Z", seed=0, arm="m", t1=[0] * 4, t2=[0] * 4,
                 curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5), (17, 1700, 1.7e12, .5, .5)])
    b = make_run(r, "m-20250101T000001Z", seed=1, arm="m", t1=[0] * 4, t2=[0] * 4,
                 curve=[(0, 0, 0.0, .25, .25), (10, 1100, 1.1e12, .5, .75), (18, 1900, 1.9e12, .5, 1.0)])
    c = aggregate_curves([load_run(a), load_run(b)], "gen_tokens")
    # steps 17 and 18 are both "the end": one point, mean of 0.5 and 1.0, x = mean(1700, 1900)
    assert c["step"].tolist() == [0, 10, 18]
    assert c["n"].tolist() == [2, 2, 2]
    assert c["x"].tolist() == pytest.approx([0, 1050, 1800])
    assert c["y"].tolist() == pytest.approx([.25, .625, .75])
    assert c["lo"].tolist() == pytest.approx([.25, .5, .5]) and c["hi"].tolist() == pytest.approx([.25, .75, 1.0])
    # the band drawn is ± the sample std over seeds at each point
    assert c["sd"].tolist() == pytest.approx([0.0, np.std([.5, .75], ddof=1), np.std([.5, 1.0], ddof=1)])
    c = aggregate_curves([load_run(a)], "gen_tokens")
    assert np.isnan(c["sd"]).all()  # one seed: no spread, no band


def test_a_curve_point_band_is_the_two_way_interval_of_that_evaluation(tmp_path):
    """The accuracy figure's band at a point is arm_interval of the runs' per-problem outcomes at
    their steps (one seed: over problems), not the spread of two seeds' means."""
    from mlmt_bench.report.analysis import arm_interval
    from mlmt_bench.report.figures import BAND_BOOT, aggregate_curves

    r = tmp_path / "runs"
    t2a, t2b = [1, 0, 1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1, 1, 1]
    a = load_run(make_run(r, "m-20250101T000000Z", seed=0, arm="m", t1=[0] * 8, t2=t2a,
                          curve=[(0, 0, 0.0, 0., 0.), (10, 1000, 1e12, 0., .5)]))
    b = load_run(make_run(r, "m-20250101T000001Z", seed=1, arm="m", t1=[0] * 8, t2=t2b,
                          curve=[(0, 0, 0.0, 0., 0.), (10, 1000, 1e12, 0., .75)]))
    c = aggregate_curves([a, b], "gen_tokens", intervals=True)
    want = arm_interval([(0, {f"p{i}": float(v) for i, v in enumerate(t2a)}),
                         (1, {f"p{i}": float(v) for i, v in enumerate(t2b)})], n_boot=BAND_BOOT)
    assert want is not None and want["lo"] < 0.625 < want["hi"]
    assert (c["ci_lo"][1], c["ci_hi"][1]) == (want["lo"], want["hi"])
    assert c["ci_lo"][0] == c["ci_hi"][0] == 0.0  # step 0: every problem wrong in both seeds
    assert "ci_lo" not in aggregate_curves([a, b], "gen_tokens")  # only when asked (it costs a bootstrap)


def test_the_accuracy_figure_legend_covers_no_plot_area(tmp_path):
    """Eight arms, one panel each with the baseline beside it, and every arm against FLOPs: one
    legend, outside every plot area (inside, it covered the top of the curves), every arm once."""
    from mlmt_bench.report.figures import acc_vs_cost_figure

    arms = [f"arm-with-a-long-name-{i}" for i in range(8)]
    runs = {a: [load_run(make_run(tmp_path, f"{a}-20250101T000000Z", seed=0, arm=a, t1=[0] * 4, t2=[0] * 4,
                                  curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .1 * i, .1 * i)]))]
            for i, a in enumerate(arms)}
    fig = acc_vs_cost_figure(runs, target=.5, baseline=arms[0], title="t")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), (box, ax.get_window_extent(renderer))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(labels) == sorted([*arms, f"{arms[0]} final acc@t2", f"{arms[0]} (baseline, grey in every panel)"])
    assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0  # inside the image
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in shown]
    assert titles == [f"{a} (1 seed)" for a in arms] + ["every arm against FLOPs (lines only)"]
    for ax in shown[1:-1]:  # the baseline's curve behind each other arm's
        assert [line.get_label() for line in ax.get_lines()][:2] == [f"{arms[0]} (baseline, grey in every panel)",
                                                                     arms[shown.index(ax)]]


def test_reading_runs_at_a_flops_budget(tmp_path):
    """--at-flops B: each run's evaluation nearest B within ±10% (else its last one below B, flagged)
    stands in for its final one (metrics, per-problem outcomes, curve), and the report says where
    each run was read."""
    curve = [(0, 0, 0.0, .1, .1), (5, 100, 1e9, .2, .25), (10, 200, 2e9, .5, .5)]
    a = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="grpo", curve=curve, t1=[1, 1, 0, 0], t2=[1, 1, 0, 0],
                 feedback=False)
    b = make_run(tmp_path, "b-20250101T000000Z", seed=0, arm="sc", curve=curve, t1=[1, 1, 1, 0], t2=[1, 1, 1, 1],
                 spec="name: sc\nalgorithm: {name: self_correct}\n")
    r = load_run(a, at_flops=1.05e9)
    assert r.read_at == {"flops_budget": 1.05e9, "step": 5, "flops": 1e9, "gen_tokens": 100, "reached": True,
                         "ratio": 1e9 / 1.05e9, "within": True}
    assert r.final["step"] == 5 and r.final["acc@t2"] == .25 and [c["step"] for c in r.curve] == [0, 5]
    assert r.outcomes("t2") == {f"p{i}": 0.0 for i in range(4)}  # step 5's rows (all wrong), not the final step's
    # 1.5e9: no evaluation within ±10% (1e9 is 0.67x): the last one below, flagged
    assert load_run(a, at_flops=1.5e9).read_at == {"flops_budget": 1.5e9, "step": 5, "flops": 1e9, "gen_tokens": 100,
                                                   "reached": True, "ratio": 1e9 / 1.5e9, "within": False}
    # 1.9e9: step 10's 2e9 is within ±10%, above the budget (as a run stopped by train.flop_budget ends)
    above = load_run(a, at_flops=1.9e9)
    assert above.read_at["step"] == 10 and above.read_at["within"] and above.final["step"] == 10
    assert load_run(a, at_flops=5e9).read_at["reached"] is False and load_run(a, at_flops=0.0).final["step"] == 0
    assert load_run(a).read_at is None and load_run(a).final["kind"] == "final"

    summary = build_comparison({"grpo": [a], "sc": [b]}, tmp_path / "out", at_flops=1.05e9)
    assert summary["at_flops"] == 1.05e9 and summary["arms"]["grpo"]["metrics"]["acc@t2"]["mean"] == .25
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "**Read at 1.05e+09 FLOPs**" in text and "grpo read at s0: step 5, 1e+09 FLOPs, 100 tokens" in text
    assert "NOT WITHIN" not in text
    assert "sc: self_correct changes what a step does with the share of its budget" in text
    assert "grpo: self_correct" not in text
    assert "has no final record" not in text
    with pytest.raises(UserError, match="no evaluation within"):
        load_run(a, at_flops=-1.0)


def test_a_run_untrained_within_the_flops_budget_is_flagged_in_the_table(tmp_path):
    """--at-flops B below an arm's first evaluation after step 0 reads it at step 0: its table
    column is its starting point, said in the table ("UNTRAINED"), the notes and on stderr."""
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    early = [(0, 0, 0.0, .1, .1), (5, 100, 1e9, .2, .25), (10, 200, 2e9, .5, .5)]
    late = [(0, 0, 0.0, .1, .1), (5, 100, 3e9, .5, .5)]  # its first training evaluation is past 1.5e9
    a = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="grpo", curve=early, t1=[1, 1, 0, 0], t2=[1, 1, 0, 0],
                 feedback=False)
    b = make_run(tmp_path, "b-20250101T000000Z", seed=0, arm="mlmt", curve=late, t1=[1, 1, 1, 0], t2=[1, 1, 1, 1])
    summary = build_comparison({"grpo": [a], "mlmt": [b]}, tmp_path / "out", at_flops=1.05e9)
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert table_column(text, "read at (evaluation nearest 1.05e+09 FLOPs within ±10%, else below it)") == [
        "s0: step 5, 1.00e+09 FLOPs", "s0: UNTRAINED (step 0) (0.00× the budget: NOT WITHIN 10%)"]
    assert summary["notes"][0].startswith("UNTRAINED within 1.05e+09 FLOPs: mlmt had no evaluation after step 0")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "s0: UNTRAINED (step 0)" in page and "s0: step 5, 1.00e+09 FLOPs" in page
    # the page's cell: how many runs were read within the tolerance, shaded when not all (or one is
    # untrained), each run's evaluation in a disclosure beneath
    assert ('<td class="num wrap" data-v="1.0"><details><summary>1/1 runs within ±10%</summary>'
            "<div>s0: step 5, 1.00e+09 FLOPs</div></details></td>") in page
    assert ('<td class="num wrap sig down" data-v="0.0"><details><summary>0/1 runs within ±10%, 1 UNTRAINED'
            "</summary><div>s0: UNTRAINED (step 0) (0.00× the budget: NOT WITHIN 10%)</div></details></td>") in page
    plain = build_comparison({"grpo": [a], "mlmt": [b]}, tmp_path / "out2", at_flops=3.1e9)
    assert "UNTRAINED" not in (tmp_path / "out2" / "comparison.md").read_text()
    assert not any(n.startswith("UNTRAINED") for n in plain["notes"])
    res = CliRunner().invoke(app, ["report", str(a), str(b), "--at-flops", "1.05e9", "-o", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.stderr
    assert "warning: mlmt: no evaluation after step 0 within 1.05e+09 FLOPs" in res.stderr


def test_an_arm_fed_by_the_oracle_is_noted_as_an_upper_bound(arms, tmp_path):
    """Every run of mlmt took its feedback from the rule-based oracle (manifest roles.feedback): the report
    says it is a bound, not a method; an arm fed by its critic is not called one."""
    for path in arms["mlmt"]:
        manifest = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps({**manifest, "roles": {"solver": "trained",
                                                                                "feedback": "oracle"}}))
    (path := arms["self_correct"][0] / "manifest.json").write_text(json.dumps(
        {**json.loads(path.read_text()), "roles": {"solver": "trained", "feedback": "critic"}}))
    summary = build_comparison(arms, tmp_path / "o", baseline="grpo")
    bound = [n for n in summary["notes"] if "rule-based oracle" in n]
    assert len(bound) == 1 and bound[0].startswith("mlmt (and the rows derived from its runs): ")
    assert "an upper bound on what feedback can do, not a method, so it is compared with the baseline but left " \
           "out of the Holm families" in bound[0]
    md = (tmp_path / "o" / "comparison.md").read_text()
    assert bound[0] in md
    # compared, with its own p, but no Holm p: the family is the one method left, whose Holm p is its p
    assert summary["statistics"]["holm_family"] == ["self_correct"]
    assert summary["paired"]["mlmt"]["p_holm"] is None and summary["paired"]["mlmt"]["p_value"] is not None
    sc = summary["paired"]["self_correct"]
    assert sc["p_holm"] == sc["p_value"]
    assert table_row(md.split("## Against grpo")[1], "mlmt")[3] == "–"


def test_runs_of_other_mlmt_bench_code_are_named(arms, tmp_path):
    """One note lists which runs ran which source (manifest code and resumed_code); runs that all ran one
    source, or recorded none, get none."""
    def set_code(path, **fields):
        (path / "manifest.json").write_text(json.dumps({**json.loads((path / "manifest.json").read_text()), **fields}))

    summary = build_comparison(arms, tmp_path / "none", baseline="grpo")
    assert not [n for n in summary["notes"] if "versions of mlmt-bench's source" in n]
    for paths in arms.values():
        for path in paths:
            set_code(path, code="a" * 64)
    summary = build_comparison(arms, tmp_path / "one", baseline="grpo")
    assert not [n for n in summary["notes"] if "versions of mlmt-bench's source" in n]
    set_code(arms["mlmt"][1], resumed_code=["b" * 64, "`not a sha`"])
    set_code(arms["mlmt"][0], resumed_code="c" * 64)  # not a list: not read
    summary = build_comparison(arms, tmp_path / "two", baseline="grpo")
    (note,) = [n for n in summary["notes"] if "versions of mlmt-bench's source" in n]
    assert note == ("The runs ran 2 versions of mlmt-bench's source (manifest: code, resumed_code): `aaaaaaaaaaaa` "
                    "(grpo s0, grpo s1, mlmt s0, mlmt s1, self_correct s0); `bbbbbbbbbbbb` (mlmt s1).")
