"""mlmt_bench.sweep and `mlmt-bench sweep`: Optuna studies over run specs, with a fake runner.

The fake replaces ``mlmt_bench.runner.run``: it writes a real run directory (RunDir) and goes
through the runner's own ``_train`` (so the manifest status semantics are the real ones), but its
"trainer" only calls ``on_eval`` with values that are a deterministic function of the spec.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench import runner
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.spec import load_run_spec
from mlmt_bench.tracking import RunDir
from support import FakeRun

pytestmark = pytest.mark.usefixtures("fast_sweeps")  # conftest.py, with the fixtures fake and make_sweep

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "registry" / "runs" / "quickstart-mlmt.yaml"


def db_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("SELECT state, count(*) FROM trials GROUP BY state").fetchall())


def manifest(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text())


# ----------------------------------------------------------------------------------------------


def test_study_finds_optimum_writes_best_and_resumes(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    path = make_sweep(n_trials=12, sampler="tpe", pruner="none", space={
        "algorithm.params.lam": {"type": "float", "low": 0.0, "high": 1.0},
        "train.problems_per_step": {"type": "int", "low": 2, "high": 8, "step": 2},
        "algorithm.params.value": {"type": "categorical", "choices": ["none", "learned"]},
    })
    result = run_sweep(path, seed=0, progress=False)
    out = tmp_path / "runs" / "sw"
    db = out / "sw.db"
    assert db.exists() and result["storage"] == f"sqlite:///{db.resolve()}"
    assert db_counts(db) == {"COMPLETE": 12} and len(fake.calls) == 12
    assert result["counts"] == {"complete": 12}
    best = result["best"]
    assert abs(best["params"]["algorithm.params.lam"] - 0.3) < 0.1
    assert best["value"] == max(r["value"] for r in result["trials"])
    import optuna  # the dashboard names the objective by the sweep's metric, not "Objective 0"

    from mlmt_bench.sweep import load_sweep
    study = optuna.load_study(study_name=result["study"], storage=result["storage"])
    assert study.metric_names == [load_sweep(path, []).spec.metric]

    # each trial: sampled params applied, named <sweep>-t<N>, in <dir>/trials, manifest sweep/trial
    for spec, extra in fake.calls:
        n = extra["trial"]
        assert spec.name == f"sw-t{n}" and Path(spec.output_dir) == out / "trials"
        assert extra == {"sweep": "sw", "trial": n, "pid": os.getpid()}
        row = result["trials"][n]
        assert spec.algorithm.params["lam"] == row["params"]["algorithm.params.lam"]
        assert spec.train.problems_per_step == row["params"]["train.problems_per_step"]
        assert manifest(row["run_dir"])["status"] == "completed"
        assert Path(row["run_dir"]).parent == out / "trials"

    best_yaml = out / "sw-best.yaml"
    assert result["best_spec"] == str(best_yaml)
    spec = load_run_spec(best_yaml)
    assert spec.algorithm.params["lam"] == best["params"]["algorithm.params.lam"]
    assert spec.algorithm.params["value"] == best["params"]["algorithm.params.value"]
    assert spec.name == "sw-best" and spec.output_dir == str(tmp_path / "runs")

    # same command again: nothing to do; a larger n_trials runs only the missing ones
    again = run_sweep(path, seed=0, progress=False)
    assert db_counts(db) == {"COMPLETE": 12} and len(fake.calls) == 12
    assert again["best"] == best
    more = run_sweep(path, n_trials=14, seed=0, progress=False)
    assert db_counts(db) == {"COMPLETE": 14} and len(fake.calls) == 14
    assert sorted(r["number"] for r in more["trials"]) == list(range(14))
    # the resumed, re-seeded sampler drew new points
    lams = [r["params"]["algorithm.params.lam"] for r in more["trials"]]
    assert len(set(lams)) == 14


def test_cli_sweep_table_json_and_resume(tmp_path, fake, make_sweep):
    path = make_sweep(n_trials=3)
    cli = CliRunner()
    res = cli.invoke(app, ["sweep", str(path), "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert "sweep sw" in res.output and "best: trial" in res.output and "sw-best.yaml" in res.output
    for n in range(3):  # per-trial progress on stderr (plain lines: it is not a terminal)
        assert f"trial {n} started (worker 0): lam=" in res.stderr and f"trial {n} complete: acc@t2 " in res.stderr
    quiet = cli.invoke(app, ["--quiet", "sweep", str(path), "--n-trials", "4", "--seed", "1"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == ""
    res = cli.invoke(app, ["--json", "sweep", str(path), "--n-trials", "5", "--seed", "1"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["counts"] == {"complete": 5} and len(data["trials"]) == 5 and len(fake.calls) == 5
    assert set(data["trials"][0]) >= {"number", "params", "value", "state", "run_dir"}
    assert data["best"]["params"].keys() == {"algorithm.params.lam"}
    assert Path(data["best_spec"]).exists()


def test_storage_and_study_options(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    path = make_sweep(n_trials=2)
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'studies.db'}"
    a = run_sweep(path, storage=url, study_name="a", progress=False)
    b = run_sweep(path, storage=url, study_name="b", progress=False)
    assert a["study"] == "a" and b["study"] == "b" and len(fake.calls) == 4
    assert db_counts(tmp_path / "elsewhere" / "studies.db") == {"COMPLETE": 4}
    assert not (tmp_path / "runs" / "sw" / "sw.db").exists()
    assert {s.name for s, _ in fake.calls} == {"a-t0", "a-t1", "b-t0", "b-t1"}
    assert (tmp_path / "runs" / "sw" / "a-best.yaml").exists() and (tmp_path / "runs" / "sw" / "b-best.yaml").exists()


def test_pruning_with_median_pruner(tmp_path, monkeypatch, make_sweep):
    from mlmt_bench.sweep import run_sweep

    def curve(spec, step):  # trials 5, 7: bad from step 1 on; the rest improve with training
        n = int(spec.name.rsplit("-t", 1)[1])
        if n in (5, 7) and step >= 1:
            return 0.0
        return 0.5 + 0.1 * step + 0.01 * n

    fake = FakeRun(curve=curve)
    monkeypatch.setattr(runner, "run", fake)
    path = make_sweep(n_trials=8, pruner="median")
    result = run_sweep(path, seed=0, progress=False)
    states = {r["number"]: r["state"] for r in result["trials"]}
    assert states == {0: "complete", 1: "complete", 2: "complete", 3: "complete", 4: "complete",
                      5: "pruned", 6: "complete", 7: "pruned"}
    db = tmp_path / "runs" / "sw" / "sw.db"
    assert db_counts(db) == {"COMPLETE": 6, "PRUNED": 2}  # n_trials counts pruned ones too
    for r in result["trials"]:
        m = manifest(r["run_dir"])
        assert m["status"] == ("pruned" if r["state"] == "pruned" else "completed")
        assert m["trial"] == r["number"] and m["sweep"] == "sw"
    pruned = result["trials"][5]
    assert pruned["value"] == 0.0 and pruned["last_step"] == 1 and pruned["last_value"] == 0.0
    # the step-0 evaluation is never a reason to prune (warm-up)
    fake.curve = lambda spec, step: 0.0
    more = run_sweep(path, n_trials=9, progress=False)
    assert more["trials"][8]["state"] == "pruned" and more["trials"][8]["last_step"] == 1


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
def test_trial_of_a_crashed_process_is_failed_and_retried(tmp_path, fake, make_sweep):
    """A process killed mid-trial leaves its trial RUNNING (and its run directory `running`). A
    sweep on the same study counts it as taken: it runs the other trial, then waits; once the
    heartbeat is stale the trial is failed, its run directory too, and its parameters run again."""
    import optuna

    from mlmt_bench import sweep as sw

    path = make_sweep(n_trials=2)
    loaded = sw.load_sweep(path)
    study = optuna.create_study(storage=sw.open_storage(sw.default_storage(loaded), 1), study_name="sw",
                                direction="maximize")
    crashed = study.ask()
    crashed.suggest_float(LAM, 0.0, 1.0)
    study._storage.record_heartbeat(crashed._trial_id)  # then the process "dies" in the middle of its run:
    dead = RunDir.create(loaded.trials_dir, "sw-t0", "{}", 0)
    dead.update_manifest(sweep="sw", trial=0)
    res = CliRunner().invoke(app, ["sweep", str(path), "--heartbeat", "1"])
    assert res.exit_code == 0, res.output
    # (whether the worker had to wait for the heartbeat to go stale depends on how long trial 1 took)
    assert "trial 2 started (worker 0, retrying trial 0)" in res.stderr
    assert "trial 2 retries trial 0 (its process died)" in res.stdout
    result = sw.run_sweep(path, progress=False)  # nothing left to do: the summary
    assert [r["state"] for r in result["trials"]] == ["fail", "complete", "complete"]
    assert result["trials"][2]["params"] == result["trials"][0]["params"] and result["trials"][2]["retry_of"] == 0
    assert result["trials"][0]["run_dir"] == str(dead.path)
    assert manifest(str(dead.path))["status"] == "failed" and "heartbeats" in manifest(str(dead.path))["error"]
    assert [extra["trial"] for _, extra in fake.calls] == [1, 2]


def test_a_trial_started_past_the_target_is_surplus_and_never_runs(tmp_path, fake, make_sweep):
    """Two workers read the counts (one complete of two) and both start the last trial: the later
    trial number yields at once, before it samples or runs, and is left out of the summary."""
    import optuna

    from mlmt_bench import sweep as sw

    path = make_sweep(n_trials=2)
    loaded = sw.load_sweep(path)
    study = optuna.create_study(storage=sw.open_storage(sw.default_storage(loaded), 60), study_name="sw",
                                direction="maximize")
    study.tell(study.ask({LAM: optuna.distributions.FloatDistribution(0.0, 1.0)}), 0.5)
    read = study.get_trials
    others: list[optuna.Trial] = []

    def read_then_another_worker_starts(*args, **kwargs):
        trials = read(*args, **kwargs)
        if kwargs == {"deepcopy": False} and not others:  # the loop's read: "1 complete, none running";
            # then another worker starts trial 1
            others.append(study.ask())
        return trials

    study.get_trials = read_then_another_worker_starts  # type: ignore[method-assign]
    events: list[dict] = []
    looks = iter(range(3))
    assert sw.work(study, loaded, 2, events.append, seed=0, worker=0, heartbeat_s=1,
                   keep_going=lambda: next(looks, None) is not None) is None
    assert len(study.trials) == 3 and fake.calls == []  # trial 2 ran nothing; the worker then waited for trial 1
    assert [e["event"] for e in events] == ["wait"] and events[0]["trials"] == [1]
    trial2 = study.trials[2]
    assert trial2.state == optuna.trial.TrialState.FAIL and sw.is_surplus(trial2) and trial2.params == {}
    study.tell(others[0], 0.7)
    result = sw.summarize(study, loaded, "sw", sw.default_storage(loaded), 2)
    assert [r["number"] for r in result["trials"]] == [0, 1] and result["counts"] == {"complete": 2}


def test_failed_trial_is_recorded_and_the_study_goes_on(tmp_path, monkeypatch, make_sweep):
    from mlmt_bench.sweep import run_sweep

    fake = FakeRun(fail=lambda spec, n: RuntimeError("CUDA out of memory") if n == 1 else None)
    monkeypatch.setattr(runner, "run", fake)
    path = make_sweep(n_trials=3)
    result = run_sweep(path, progress=False)
    states = [r["state"] for r in result["trials"]]
    assert states == ["complete", "fail", "complete", "complete"] and result["stopped"] is None
    failed = result["trials"][1]
    assert failed["error"] == "RuntimeError: CUDA out of memory"
    assert manifest(failed["run_dir"])["status"] == "failed"


def test_repeated_failures_stop_the_sweep(tmp_path, monkeypatch, make_sweep):
    fake = FakeRun(fail=lambda spec, n: ValueError("nan loss"))
    monkeypatch.setattr(runner, "run", fake)
    path = make_sweep(n_trials=10)
    res = CliRunner().invoke(app, ["sweep", str(path)])
    assert res.exit_code == 1
    assert len(fake.calls) == 3
    assert "sweep stopped: 3 trials in a row failed (last: ValueError: nan loss)" in res.stderr


def test_user_error_in_a_trial_stops_the_sweep(tmp_path, monkeypatch, make_sweep):
    fake = FakeRun(fail=lambda spec, n: UserError("data/x.jsonl: line 3: not JSON"))
    monkeypatch.setattr(runner, "run", fake)
    res = CliRunner().invoke(app, ["sweep", str(make_sweep())])
    assert res.exit_code == 2 and len(fake.calls) == 1
    # after the progress lines, one line: no traceback of Optuna's
    assert res.stderr.splitlines()[-1] == "error: data/x.jsonl: line 3: not JSON" and "Traceback" not in res.stderr


def test_unknown_metric_stops_the_sweep(tmp_path, fake, make_sweep):
    res = CliRunner().invoke(app, ["sweep", str(make_sweep(metric="acc@t3"))])
    assert res.exit_code == 2 and len(fake.calls) == 1
    error = res.stderr.splitlines()[-1]
    assert error.startswith("error: ") and "Traceback" not in res.stderr
    assert "metric: 'acc@t3' is not a number in this run's evaluations" in error
    assert "acc@t2" in error


def test_grid_sampler_covers_the_grid_once(tmp_path, fake, make_sweep):
    from mlmt_bench.sweep import run_sweep

    path = make_sweep(n_trials=50, sampler="grid", pruner="none", space={
        "algorithm.params.lam": {"type": "float", "low": 0.1, "high": 0.5, "step": 0.2},
        "algorithm.params.value": {"type": "categorical", "choices": ["none", "learned"]}})
    result = run_sweep(path, progress=False)
    assert result["n_trials"] == 6 and len(fake.calls) == 6
    seen = {(r["params"]["algorithm.params.lam"], r["params"]["algorithm.params.value"]) for r in result["trials"]}
    assert seen == {(lam, v) for lam in (0.1, 0.3, 0.5) for v in ("none", "learned")}
    assert result["best"]["params"]["algorithm.params.lam"] == pytest.approx(0.3)


def test_resume_with_other_direction_or_metric_is_an_error(tmp_path, fake, make_sweep):
    make_sweep(n_trials=1)
    cli = CliRunner()
    assert cli.invoke(app, ["sweep", str(make_sweep(n_trials=1))]).exit_code == 0
    res = cli.invoke(app, ["sweep", str(make_sweep(n_trials=2, direction="minimize"))])
    assert res.exit_code == 2 and "was created to maximize (this sweep: minimize)" in res.stderr
    res = cli.invoke(app, ["sweep", str(make_sweep(n_trials=2, metric="acc@t1"))])
    assert res.exit_code == 2 and "optimises 'acc@t2' (this sweep: 'acc@t1')" in res.stderr
    assert len(fake.calls) == 1


# ----------------------------------------------------------------------------------------------
# Bad sweep specs: one line on stderr, exit code 2, before any trial


LAM = "algorithm.params.lam"


@pytest.mark.parametrize("fields, expected", [
    ({"space": {"algorithm.parms.lam": {"type": "float", "low": 0, "high": 1}}},
     "space.algorithm.parms.lam: algorithm has no field 'parms'; did you mean 'params'?"),
    ({"space": {"trian.steps": {"type": "int", "low": 1, "high": 3}}},
     "space.trian.steps: the spec has no field 'trian'; did you mean 'train'?"),
    ({"space": {"algorithm.params.lamb": {"type": "float", "low": 0, "high": 1}}},
     "space.algorithm.params.lamb=0.0 applied to"),
    ({"space": {LAM: {"type": "float", "low": 1.0, "high": 1.0}}},
     f"space.{LAM}: low must be < high, got low=1.0, high=1.0"),
    ({"space": {LAM: {"type": "float", "low": 0.5, "high": 0.1}}}, "low must be < high"),
    ({"space": {LAM: {"type": "uniform", "low": 0, "high": 1}}},
     f"space.{LAM}.type: must be one of 'float', 'int', 'categorical', got 'uniform'"),
    ({"space": {LAM: {"low": 0, "high": 1}}}, f"space.{LAM}: missing `type`"),
    ({"space": {LAM: {"type": "categorical", "choices": []}}}, f"space.{LAM}.choices:"),
    ({"space": {LAM: {"type": "float", "low": 0, "hi": 1}}}, f"space.{LAM}.high: required field is missing"),
    ({"space": {LAM: {"type": "float", "low": 0, "high": 1, "log": True}}}, "log: true needs low > 0"),
    ({"space": {LAM: {"type": "float", "low": -1.0, "high": 1}}},
     f"space.{LAM}=-1.0 applied to"),
    ({"space": {}}, "space: "),
    ({"space": {"train.problems_per_step": {"type": "int", "low": 2, "high": 4, "step": 5}}},  # every trial got 2
     "space.train.problems_per_step: step 5 is larger than high - low (2), so every trial would get low=2"),
    ({"space": {LAM: {"type": "float", "low": 0.0, "high": 0.25, "step": 0.5}}}, "step 0.5 is larger than high"),
    ({"run": "missing.yaml"}, "run: file not found:"),
    ({"sampler": "cmaes"}, "sampler: must be one of"),
    ({"sampler": "grid"}, f"space.{LAM}: the grid sampler needs a `step` for float parameters"),
    ({"name": "my sweep"}, "name: must match"),
    ({"n_trials": 0}, "n_trials: must be ≥ 1, got 0"),
])
def test_bad_sweep_specs(tmp_path, fake, make_sweep, fields, expected):
    path = make_sweep(**fields)
    res = CliRunner().invoke(app, ["sweep", str(path)])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {path}: ") and res.stderr.count("\n") == 1, res.stderr
    assert expected in res.stderr
    assert fake.calls == [] and not (tmp_path / "runs").exists()


def test_bad_run_spec_and_missing_sweep_file(tmp_path, fake, make_sweep):
    path = make_sweep()
    run = path.parent / "run.yaml"
    data = yaml.safe_load(run.read_text())
    data["train"]["steps"] = -1
    run.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["sweep", str(path)])
    assert res.exit_code == 2 and res.stderr == f"error: {run}: train.steps: must be ≥ 0, got -1\n"
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and res.stderr == f"error: {tmp_path / 'nope.yaml'}: file not found\n"
    res = CliRunner().invoke(app, ["sweep", str(make_sweep()), "--set", "train.stepz=2"])
    assert res.exit_code == 2 and "train has no field 'stepz'" in res.stderr
    assert fake.calls == []


def test_storage_errors_are_one_line(tmp_path, fake, make_sweep):
    path = make_sweep()
    res = CliRunner().invoke(app, ["sweep", str(path), "--storage", "notaurl"])
    assert res.exit_code == 2 and res.stderr.startswith("error: storage notaurl: cannot open:")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        res = CliRunner().invoke(app, ["sweep", str(path), "--storage", "postgresql+psycopg2://me:s3cret@db/optuna"])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1
        assert "install the `postgres` extra: pip install 'mlmt-bench[postgres]'" in res.stderr
        assert "s3cret" not in res.stderr and "me:***@db" in res.stderr
    assert fake.calls == []


def test_optuna_is_imported_lazily():
    code = ("import sys, mlmt_bench, mlmt_bench.cli, mlmt_bench.sweep\n"
            "from typer.testing import CliRunner\n"
            "assert CliRunner().invoke(mlmt_bench.cli.app, ['--help']).exit_code == 0\n"
            "res = CliRunner().invoke(mlmt_bench.cli.app, ['sweep', '--help'])\n"
            "assert res.exit_code == 0 and '--n-trials' in res.output, res.output\n"
            "assert 'optuna' not in sys.modules, 'optuna imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_example_sweeps_validate():
    from mlmt_bench.sweep import load_sweep

    paths = sorted((REPO / "sweeps").glob("*.yaml"))
    assert paths
    for p in paths:
        run = p.parent / yaml.safe_load(p.read_text())["run"]
        if not run.exists():
            pytest.skip(f"{run} not written yet")
        sweep = load_sweep(p)
        assert sweep.space


@pytest.mark.slow
@pytest.mark.skipif(not QUICKSTART.exists(), reason="registry/runs/quickstart-mlmt.yaml not written yet")
def test_two_real_tiny_trials(tmp_path):
    """End to end with the real runner: two tiny trials of the example sweep."""
    from mlmt_bench.sweep import run_sweep

    tiny = [f"output_dir={tmp_path}", "train.steps=2", "train.problems_per_step=2", "eval.limit=4", "eval.every=1",
            "eval.samples=0", "eval.feedback_metrics=false", "train.token_budget=null"]
    result = run_sweep(REPO / "sweeps" / "quickstart-mlmt.yaml", n_trials=2, seed=0, overrides=tiny,
                       progress=False)
    assert [r["state"] for r in result["trials"]] == ["complete", "complete"]
    for r in result["trials"]:
        m = manifest(r["run_dir"])
        assert m["status"] == "completed" and m["sweep"] == "quickstart-mlmt-sweep"
        assert isinstance(r["value"], float) and 0.0 <= r["value"] <= 1.0
        assert r["last_step"] == 2
    assert load_run_spec(result["best_spec"]).train.steps == 2


@pytest.mark.slow
def test_two_real_tiny_trials_own_spec(tmp_path, tiny_ckpt):
    """End to end with the real runner on an untrained tiny-0.5m checkpoint (no warm start)."""
    from mlmt_bench.sweep import run_sweep

    policy = {"model": "tiny", "path": str(tiny_ckpt)}
    spec = minimal_spec(output_dir=str(tmp_path / "runs"), policies={"solver": policy, "critic": policy},
                        algorithm={"name": "mlmt", "params": {"group_size": 2}},
                        train={"steps": 2, "problems_per_step": 2},
                        eval={"every": 1, "limit": 4, "samples": 0, "feedback_metrics": False},
                        backend={"max_new_tokens": 8})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "real", "run": "run.yaml", "n_trials": 2, "sampler": "random",
        "space": {"algorithm.params.lam": {"type": "float", "low": 0.0, "high": 1.0},
                  "policies.solver.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}}))
    result = run_sweep(tmp_path / "sweep.yaml", seed=0, progress=False)
    assert [r["state"] for r in result["trials"]] == ["complete", "complete"]
    for r in result["trials"]:
        m = manifest(r["run_dir"])
        assert m["status"] == "completed" and (m["sweep"], m["trial"]) == ("real", r["number"])
        assert r["last_step"] == 2 and 0.0 <= r["value"] <= 1.0
        run_spec = load_run_spec(Path(r["run_dir"]) / "spec.resolved.yaml")
        assert run_spec.algorithm.params["lam"] == r["params"]["algorithm.params.lam"]
        assert run_spec.policies.solver.lr == r["params"]["policies.solver.lr"]
    assert load_run_spec(result["best_spec"]).name == "real-best"


def test_overrides_every_trial_would_undo_are_errors(make_sweep):
    """--set name (trials are named <study>-t<N>) and --set on a searched parameter (each trial
    sets it) would be silently ignored: they are errors instead; other paths still apply."""
    from mlmt_bench.sweep import load_sweep

    p = make_sweep()
    for text, fragment in (("name=x", "use --study NAME"), ("algorithm.params.lam=0.5", "space.algorithm.params.lam "
                                                                                         "is searched")):
        with pytest.raises(UserError, match="^--set .*" + fragment.replace(".", r"\.")):
            load_sweep(p, [text])
    assert load_sweep(p, ["train.steps=3"]).run_raw["train"]["steps"] == 3
