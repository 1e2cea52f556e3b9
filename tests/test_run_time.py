"""A run's time as a report reads it from metrics.jsonl (mlmt_bench.report.run_time), against figures
computed by hand, and the report's table that shows it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.report.run_time import run_time
from support import make_run, table_column

#: step 0 evaluated (10 s), step 1 (15 s: 100 tokens at 10 tok/s, 50 trained at 25 tok/s), step 2 (20 s: 200
#: more tokens at 20 tok/s, nothing trained), step 2 evaluated (15 s)
RECORDS = [
    {"kind": "eval", "step": 0, "wall_s": 10.0, "gen_tokens": 0, "trained_tokens": 0},
    {"kind": "train", "step": 1, "wall_s": 25.0, "gen_tokens": 100, "trained_tokens": 50, "gen_tok_per_s": 10.0,
     "train_tok_per_s": 25.0},
    {"kind": "train", "step": 2, "wall_s": 45.0, "gen_tokens": 300, "trained_tokens": 50, "gen_tok_per_s": 20.0,
     "train_tok_per_s": 0.0},
    {"kind": "eval", "step": 2, "wall_s": 60.0, "gen_tokens": 300, "trained_tokens": 50},
    {"kind": "final", "step": 2, "wall_s": 60.0},
]


def test_run_time_by_hand():
    assert run_time(RECORDS) == pytest.approx({
        "eval_s": 10.0 + 15.0, "train_step_s": (15.0 + 20.0) / 2,
        "train_gen_tok_per_s": 300 / (10.0 + 10.0), "train_tok_per_s": 50 / 2.0})


def test_run_time_up_to_a_step_leaves_the_later_records_out():
    assert run_time(RECORDS, last_step=1) == pytest.approx({
        "eval_s": 10.0, "train_step_s": 15.0, "train_gen_tok_per_s": 10.0, "train_tok_per_s": 25.0})


def test_records_without_wall_time_give_no_times_and_a_step_back_is_skipped():
    no_wall = [{k: v for k, v in r.items() if k != "wall_s"} for r in RECORDS]
    assert set(run_time(no_wall)) == {"train_gen_tok_per_s", "train_tok_per_s"}  # rates need no wall time
    assert run_time([]) == {}
    stepped_back = [*RECORDS[:3], {**RECORDS[1], "wall_s": 40.0}]  # a log not cut back on resume
    assert run_time(stepped_back)["train_step_s"] == pytest.approx((15.0 + 20.0) / 2)


def test_the_report_shows_each_arms_run_time(tmp_path):
    """Two seeds of one arm, seed 1 twice as slow in everything: the comparison's cost table gives wall
    time, evaluation time, step time and tokens per second as mean ± std (ddof 1) over the seeds."""
    runs = tmp_path / "runs"
    dirs = []
    for seed, slow in ((0, 1.0), (1, 2.0)):
        run = make_run(runs, f"a-s{seed}", seed=seed, arm="a", curve=[(0, 0, 0.0, 0.25, 0.25), (2, 300, 1e9, 0.5, 0.5)],
                       t1=[1, 0, 1, 0], t2=[1, 0, 1, 0], feedback=False)
        acc = {0: 0.25, 2: 0.5}
        lines = []
        for rec in RECORDS:  # the hand-computed timeline, 36 × longer (seconds -> hundredths of hours)
            rec = {**rec, "wall_s": rec["wall_s"] * 36 * slow, "flops": 1e9 * rec["step"] / 2}
            for rate in ("gen_tok_per_s", "train_tok_per_s"):
                if rate in rec:
                    rec[rate] /= slow
            if rec["kind"] in ("eval", "final"):
                rec.update({"n": 4, "acc@t1": acc[rec["step"]], "acc@t2": acc[rec["step"]]})
            lines.append(rec)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        dirs.append(str(run))
    res = CliRunner().invoke(app, ["-q", "report", *dirs, "--out", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report" / "comparison.md").read_text()
    assert "### Training cost and run time" in md
    # wall 0.6 and 1.2 h; evaluations 0.25 and 0.5 h; steps 630 and 1260 s; 15 and 7.5 generated tok/s;
    # 25 and 12.5 trained tok/s
    assert table_column(md, "wall time (training and evaluations, as logged on the run's machine)") == [
        "0.90 h ± 0.42 h"]
    assert table_column(md, "of it in evaluations") == ["0.38 h ± 0.18 h"]
    assert table_column(md, "training step (mean)") == ["945.0 s ± 445.5 s"]
    assert table_column(md, "generated tok/s (training rollouts)") == ["11.2 ± 5.3"]
    assert table_column(md, "trained tok/s (updates)") == ["18.8 ± 8.8"]
