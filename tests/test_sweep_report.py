"""`mlmt-bench report --sweep STORAGE`: history, importances and best spec of a real Optuna study
(made by `run_sweep` with the fake runner of tests/support.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.spec import load_run_spec

pytestmark = pytest.mark.usefixtures("fast_sweeps")  # conftest.py, with the fixtures fake and make_sweep

LAM, PPS = "algorithm.params.lam", "train.problems_per_step"
SPACE = {LAM: {"type": "float", "low": 0.0, "high": 1.0}, PPS: {"type": "int", "low": 2, "high": 8, "step": 2}}


def report(*args: str):
    return CliRunner().invoke(app, ["report", *args])


def test_report_of_a_study(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    result = run_sweep(make_sweep(n_trials=8, space=SPACE, pruner="none"), seed=0, progress=False)
    db = tmp_path / "runs" / "sw" / "sw.db"
    out = tmp_path / "report"
    res = report("--sweep", str(db), "--out", str(out))
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("wrote ") and "sweep.md" in res.stdout

    md = (out / "sweep.md").read_text()
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith("| ") and "complete" in line]
    assert len(rows) == 8
    values = [r["value"] for r in result["trials"]]
    best_so_far = [max(values[:i + 1]) for i in range(8)]
    for i, row in enumerate(rows):  # trial, state, acc@t2, best so far, lam, problems_per_step
        assert row[0] == f"| {i}" and row[1] == "complete"
        assert float(row[2]) == pytest.approx(values[i], rel=1e-3)
        assert float(row[3]) == pytest.approx(best_so_far[i], rel=1e-3)
    assert "| trial | state | acc@t2 | best so far | lam | problems_per_step |" in md
    importances = dict(line.strip("| ").split(" | ") for line in md.split("## Parameter importances")[1].split("##")[0]
                       .splitlines() if line.startswith(f"| {LAM}") or line.startswith(f"| {PPS}"))
    assert set(importances) == {LAM, PPS} and sum(map(float, importances.values())) == pytest.approx(1.0, abs=2e-3)
    assert float(importances[LAM]) > float(importances[PPS])  # the fake's score depends on lam alone

    png = (out / "sweep_history.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    assert matplotlib.image.imread(out / "sweep_history.png").shape[:2] == (480, 840)  # 7 x 4 in at 120 dpi

    best = result["best"]
    spec = load_run_spec(out / "sweep_best.yaml")  # rebuilt from the sweep file the study recorded
    assert spec.name == "sw-best" and spec.algorithm.params["lam"] == best["params"][LAM]
    assert spec.train.problems_per_step == best["params"][PPS]
    assert (out / "sweep_best.yaml").read_text().startswith(f"# Best trial of study sw: trial {best['number']}")

    # --json, and a storage URL instead of a path
    res = CliRunner().invoke(app, ["--json", "report", "--sweep", f"sqlite:///{db}", "--out", str(tmp_path / "r2")])
    data = json.loads(res.stdout)
    assert data["counts"] == {"complete": 8} and data["best"]["number"] == best["number"]
    assert set(data["importances"]) == {LAM, PPS} and data["importances_note"] is None


def test_too_few_trials_and_no_complete_trial(tmp_path, monkeypatch, fake, make_sweep):
    from mlmt_bench import runner
    from mlmt_bench.sweep import run_sweep
    from support import FakeRun

    run_sweep(make_sweep(n_trials=2, space=SPACE), progress=False)
    out = tmp_path / "few"
    res = report("--sweep", str(tmp_path / "runs" / "sw" / "sw.db"), "--out", str(out))
    assert res.exit_code == 0, res.output
    md = (out / "sweep.md").read_text()
    assert "parameter importances need at least 4 complete trials; this study has 2." in md
    assert (out / "sweep_best.yaml").exists()

    monkeypatch.setattr(runner, "run", FakeRun(fail=lambda spec, n: RuntimeError("boom")))
    assert run_sweep(make_sweep("bad", n_trials=5), progress=False)["stopped"]
    out = tmp_path / "none"
    res = report("--sweep", str(tmp_path / "runs" / "bad" / "bad.db"), "--out", str(out))
    assert res.exit_code == 0, res.output
    md = (out / "sweep.md").read_text()
    assert "fail 3." not in md and "3 fail" in md and "No trial completed yet." in md
    assert "need at least 4 complete trials; this study has 0" in md
    assert (out / "sweep_history.png").exists() and not (out / "sweep_best.yaml").exists()


def test_best_spec_from_the_run_directory_when_the_sweep_file_is_gone(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    path = make_sweep(n_trials=3)
    best = run_sweep(path, seed=0, progress=False)["best"]
    path.write_text("name: sw\n")  # edited since: no longer a valid sweep
    res = report("--sweep", str(tmp_path / "runs" / "sw" / "sw.db"), "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "r" / "sweep_best.yaml").read_text()
    assert f"# the sweep file {path} no longer applies ({path}: " in text
    path.unlink()
    res = report("--sweep", str(tmp_path / "runs" / "sw" / "sw.db"), "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "r" / "sweep_best.yaml").read_text()
    assert f"# from the best trial's run directory {best['run_dir']}" in text and "no longer applies" not in text
    spec = load_run_spec(tmp_path / "r" / "sweep_best.yaml")
    assert spec.name == "sw-best" and spec.algorithm.params["lam"] == best["params"][LAM]


def test_several_studies_and_bad_storages(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    path = make_sweep(n_trials=1)
    run_sweep(path, storage=url, study_name="a", progress=False)
    run_sweep(path, storage=url, study_name="b", progress=False)
    res = report("--sweep", url, "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr == (f"error: --sweep {url}: the storage holds 2 studies; "
                                                 "name one with --study (a, b)\n")
    res = report("--sweep", url, "--study", "c", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr == f"error: --study c: no such study in {url} (it holds: a, b)\n"
    res = report("--sweep", url, "--study", "b", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0 and (tmp_path / "r" / "sweep.md").read_text().startswith("# Sweep b\n")

    res = report("--sweep", str(tmp_path / "nope.db"), "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr == f"error: --sweep {tmp_path / 'nope.db'}: no such study file\n"
    assert not (tmp_path / "nope.db").exists()
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    res = report("--sweep", str(other), "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "not an Optuna study file (no `studies` table)" in res.stderr
    assert other.read_bytes() == before  # reading never writes
    notdb = tmp_path / "notes.txt"
    notdb.write_text("hello " * 200)
    res = report("--sweep", str(notdb), "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr.startswith(f"error: --sweep {notdb}: not an Optuna study file")
    assert res.stderr.count("\n") == 1

    res = report(str(tmp_path), "--sweep", url, "--study", "a", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2
    assert "give no run directories, --arm, --at-flops, --raw or --baseline with it" in res.stderr
    res = report(str(tmp_path), "--study", "a", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr == "error: --study goes with --sweep STORAGE\n"
    res = report("--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.stderr == "error: give run directories (or --sweep STORAGE)\n"


def _study(values: list[float], pruned_at: float | None = None):
    """An in-memory study of x in [0, 1], one complete trial per value (x = the value), then a
    pruned one whose last report is ``pruned_at``."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    study = optuna.create_study(study_name="s", direction="maximize")
    for v in values:
        study.add_trial(create_trial(params={"x": v}, distributions={"x": FloatDistribution(0, 1)}, value=v))
    if pruned_at is not None:
        study.add_trial(create_trial(params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                                     state=TrialState.PRUNED, intermediate_values={2: pruned_at}))
    return study


def test_the_history_plot_is_optunas_with_whole_trial_ticks_and_the_pruned_trials():
    """Three trials and a pruned one: matplotlib's default locator would tick trial 0.5, 1.5; each
    tick is a trial number; Optuna's dots and best line, the pruned trial a cross at its last report."""
    import matplotlib
    import matplotlib.pyplot as plt

    from mlmt_bench.report.sweep_report import history, history_figure

    study = _study([0.1, 0.4, 0.3], pruned_at=0.2)
    with matplotlib.rc_context():
        fig = history_figure(study, history(study), metric="acc@t2", title="t")
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert {0, 1, 2, 3} <= set(ticks)
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["acc@t2", "Best Value", "pruned (1: last reported)"]  # Optuna's two, then ours
    dots, pruned = (c.get_offsets().tolist() for c in ax.collections if len(c.get_offsets()))
    assert dots == [[0, 0.1], [1, 0.4], [2, 0.3]] and pruned == [[3, 0.2]]
    assert ax.lines[0].get_xydata().tolist() == [[0, 0.1], [1, 0.4], [2, 0.4], [3, 0.4]]  # best so far
    assert ax.get_ylabel() == "acc@t2" and ax.get_title() == "t"
    plt.close(fig)


def test_the_sweep_figures_leave_the_style_alone_and_say_why_there_are_no_importances(tmp_path):
    """Optuna's plots switch the process to ggplot for good: drawn inside an rc_context, a figure drawn
    after them (a report's) is what it was; the same study gives the same bytes; the importances of two
    trials are a figure that says why there are none, of four Optuna's bar chart."""
    import matplotlib

    from mlmt_bench.report.sweep_report import history, importances, plot_history, plot_importances

    before = dict(matplotlib.rcParams)
    study = _study([0.1, 0.4])
    plot_history(study, history(study), tmp_path / "h.png", metric="acc@t2", title="t")
    plot_history(study, history(study), tmp_path / "h2.png", metric="acc@t2", title="t")
    found, why_not = importances(study)
    assert found == {} and why_not.startswith("parameter importances need at least 4 complete trials")
    plot_importances(study, tmp_path / "few.png", metric="acc@t2", why_not=why_not)
    study = _study([0.1, 0.4, 0.3, 0.9, 0.7, 0.2])
    found, why_not = importances(study)
    assert set(found) == {"x"} and why_not is None
    plot_importances(study, tmp_path / "i.png", metric="acc@t2", why_not=None)
    assert dict(matplotlib.rcParams) == before and matplotlib.rcParams["axes.facecolor"] == "white"
    assert (tmp_path / "h.png").read_bytes() == (tmp_path / "h2.png").read_bytes()
    for name in ("h.png", "few.png", "i.png"):
        assert matplotlib.image.imread(tmp_path / name).shape[:2] == (480, 840)
