"""Experiments: arms × seeds in parallel processes, and resuming a killed experiment."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import minimal_spec
from mlmt_bench.errors import UserError
from mlmt_bench.experiment import join_base, run_experiment, time_to_go
from mlmt_bench.machine.cpus import cpu_budget
from mlmt_bench.spec import load_experiment


@pytest.fixture
def exp_spec(tiny_ckpt, tmp_path, write_spec):
    base = minimal_spec()
    base["policies"]["solver"]["path"] = str(tiny_ckpt)
    base["train"].update(token_budget=None, steps=2)
    base["eval"] = {"every": 2}

    def make(**arms_lr):
        exp = {"name": "exp", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": str(tmp_path / "runs"),
               "arms": {arm: {"policies": {"solver": {"lr": lr}}} for arm, lr in arms_lr.items()}}
        return write_spec(exp, "exp.yaml")

    return make


def _files(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_workers_run_every_arm_and_seed_in_processes(exp_spec, tmp_path):
    exp, arms = load_experiment(exp_spec(a=1e-4, b=2e-4))
    out = run_experiment(exp, arms, progress=False, workers=2)
    record = out["experiment"]
    exp_dir = out["run_dir"]
    assert set(record["arms"]) == {"a", "b"} and set(record["wall_s"]) >= {"a/s0", "a/s1", "b/s0", "b/s1"}
    for names in record["arms"].values():
        seeds = [json.loads(open(f"{exp_dir}/{n}/manifest.json").read())["seed"] for n in names]
        assert seeds == [0, 1]  # listed in seed order whatever order the processes finished in
        for n in names:
            resolved = open(f"{exp_dir}/{n}/spec.resolved.yaml").read()
            assert f"threads: {max(1, cpu_budget() // 2)}" in resolved
    assert exp_dir.startswith(str(tmp_path)) and record["comparison"]


def test_a_cgroup_quota_caps_the_threads_each_worker_gets(exp_spec, monkeypatch):
    """``docker run --cpus=1`` on a machine of N cores: one thread per run, not N / workers."""
    from mlmt_bench.experiment import _with_threads
    from mlmt_bench.machine import cpus

    _, arms = load_experiment(exp_spec(a=1e-4))
    spec = arms["a"]
    monkeypatch.setattr(cpus, "usable_cpus", lambda: list(range(8)))
    monkeypatch.setattr(cpus.CpuGroup, "find", classmethod(lambda cls, proc=None: cls(None)))
    assert _with_threads(spec, 2).train.threads == 4
    monkeypatch.setattr(cpus.CpuGroup, "find", classmethod(lambda cls, proc=None: cls(1.0)))
    assert _with_threads(spec, 1).train.threads == 1
    assert _with_threads(spec.model_copy(update={"train": spec.train.model_copy(update={"threads": 3})}),
                         1).train.threads == 3  # the spec's own count stands


def test_two_experiments_started_in_the_same_second_get_distinct_directories(exp_spec, monkeypatch):
    """The directory is named by the second it started in (CI once started two in one second and
    the second crashed with FileExistsError); the later one gets ``-1``, the earlier one's record
    is untouched."""
    import datetime as dt

    from mlmt_bench import experiment, tracking

    frozen = dt.datetime(2026, 12, 2, 21, 11, 27, tzinfo=dt.UTC)
    frozen_clock = type("Frozen", (dt.datetime,), {"now": staticmethod(lambda tz=None: frozen)})
    monkeypatch.setattr(tracking._dt, "datetime", frozen_clock)
    exp, arms = load_experiment(exp_spec(a=1e-4))
    first, record = experiment._open_experiment(exp, arms, None)
    first_json = (first / "experiment.json").read_bytes()
    second, _ = experiment._open_experiment(exp, arms, None)
    assert first.name == f"{exp.name}-20261202T211127Z" and second.name == f"{first.name}-1"
    assert (first / "experiment.json").read_bytes() == first_json
    assert json.loads((second / "experiment.json").read_text())["arms"] == record["arms"]


def test_resume_keeps_finished_runs_and_does_only_the_missing_ones(exp_spec, tmp_path):
    path = exp_spec(a=1e-4)
    exp, arms = load_experiment(path)
    out = run_experiment(exp, arms, progress=False)
    exp_dir = tmp_path / "runs" / os.path.basename(out["run_dir"])
    kept, lost = (exp_dir / n for n in out["experiment"]["arms"]["a"])
    before = _files(kept)
    shutil.rmtree(lost)  # as if the process had been killed before the second run began
    record = json.loads((exp_dir / "experiment.json").read_text())
    record["arms"]["a"] = record["arms"]["a"][:1]
    (exp_dir / "experiment.json").write_text(json.dumps(record))

    again = run_experiment(*load_experiment(path), progress=False, resume=exp_dir)
    names = again["experiment"]["arms"]["a"]
    # the lost run is redone (in the same second its directory may get the lost one's name again)
    assert names[0] == kept.name and len(names) == 2
    assert _files(kept) == before  # the finished run is not touched
    redone = json.loads((exp_dir / names[1] / "manifest.json").read_text())
    assert redone["seed"] == 1 and redone["status"] == "completed"


def test_time_to_go_is_each_pending_run_at_its_arms_mean_pace():
    wall = {"grpo/s0": 3600.0, "grpo/s1": 5400.0, "mlmt/s0": 7200.0, "total": 99999.0, "mlmt/sx": 1.0}
    # grpo at (3600 + 5400) / 2 = 4500 s; mlmt 7200 s; an arm with no finished run at the mean of all three, 5400 s
    assert time_to_go(wall, ["grpo", "mlmt", "oracle"]) == (4500 + 7200 + 5400, 3)
    assert time_to_go({"total": 10.0}, ["grpo"]) is None
    assert time_to_go(wall, []) == (0, 3)


def test_a_sequential_experiment_says_how_long_its_remaining_runs_take_at_the_pace_so_far(exp_spec, tmp_path, capsys):
    path = exp_spec(a=1e-4)
    out = run_experiment(*load_experiment(path), progress=False)
    exp_dir = tmp_path / "runs" / os.path.basename(out["run_dir"])
    record = json.loads((exp_dir / "experiment.json").read_text())
    shutil.rmtree(exp_dir / record["arms"]["a"][1])  # as if killed during the second run: it logged no wall time
    record["arms"]["a"] = record["arms"]["a"][:1]
    record["wall_s"] = {"a/s0": 7380.0}
    (exp_dir / "experiment.json").write_text(json.dumps(record))
    capsys.readouterr()
    run_experiment(*load_experiment(path), progress=True, resume=exp_dir)
    err = capsys.readouterr().err
    assert "[2/2] a seed 1 (1 run to go: about 2 h 03 min at the pace of the 1 finished, one after another)" in err


def test_resume_marks_a_run_that_died_before_its_first_checkpoint_abandoned_and_redoes_it(exp_spec, tmp_path):
    from mlmt_bench.tracking import RunDir

    path = exp_spec(a=1e-4)
    out = run_experiment(*load_experiment(path), progress=False)
    exp_dir = Path(out["run_dir"])
    dead = exp_dir / out["experiment"]["arms"]["a"][0]  # seed 0: read before the finished seed 1
    # as the process left it when killed before its first checkpoint: still "running"
    manifest = json.loads((dead / "manifest.json").read_text())
    (dead / "manifest.json").write_text(json.dumps({**manifest, "status": "running", "end_time": None}))
    shutil.rmtree(dead / "checkpoints")
    (dead / "checkpoints").mkdir()

    with pytest.raises(UserError, match="different spec"):  # a refused resume marks nothing
        run_experiment(*load_experiment(exp_spec(a=2e-4)), progress=False, resume=exp_dir)
    assert json.loads((dead / "manifest.json").read_text())["status"] == "running"
    path = exp_spec(a=1e-4)

    holder = RunDir.open(dead)
    holder.lock()  # a live process holds it: refused, and nothing is marked
    with pytest.raises(UserError, match="in use by process"):
        run_experiment(*load_experiment(path), progress=False, resume=exp_dir)
    holder.unlock()
    assert json.loads((dead / "manifest.json").read_text())["status"] == "running"

    again = run_experiment(*load_experiment(path), progress=False, resume=exp_dir)
    names = again["experiment"]["arms"]["a"]
    assert len(names) == 2 and names[0] != dead.name
    marked = json.loads((dead / "manifest.json").read_text())
    assert marked["status"] == "abandoned" and marked["end_time"] and "redid it" in marked["abandoned"]
    assert json.loads((exp_dir / names[0] / "manifest.json").read_text())["status"] == "completed"


def test_restore_from_a_published_report_runs_only_what_it_lacks(exp_spec, tmp_path, monkeypatch):
    """A report published with --raw holds seed 0 of an experiment (another machine's session);
    `run EXP --restore REPORT` copies that run in, runs seed 1 alone, and the restored run's
    logs are the bytes the original wrote."""
    from mlmt_bench import experiment
    from mlmt_bench.report.compare import report_from_dirs

    exp, arms = load_experiment(exp_spec(a=1e-4))
    first = run_experiment(exp, arms, progress=False)
    seed0 = Path(first["run_dir"]) / first["experiment"]["arms"]["a"][0]
    report_from_dirs([seed0], tmp_path / "published", raw=True)
    (tmp_path / "published" / "runs" / "elsewhere").mkdir()  # not a run: ignored

    ran = []
    real = experiment._run_job
    monkeypatch.setattr(experiment, "_run_job", lambda job, *a, **k: (ran.append(job.seed), real(job, *a, **k))[1])
    out = run_experiment(exp, arms, progress=False, restore=[tmp_path / "published"])
    assert ran == [1]
    names = out["experiment"]["arms"]["a"]
    assert names[0] == seed0.name and len(names) == 2
    restored = Path(out["run_dir"]) / seed0.name
    for name in ("manifest.json", "spec.resolved.yaml", "metrics.jsonl", "eval_problems.jsonl"):
        assert (restored / name).read_bytes() == (seed0 / name).read_bytes(), name
    assert not list(Path(out["run_dir"]).glob(".restoring-*"))
    before = sorted(Path(exp.output_dir).iterdir())
    with pytest.raises(UserError, match="not a report published with --raw"):
        run_experiment(exp, arms, progress=False, restore=[tmp_path])
    assert sorted(Path(exp.output_dir).iterdir()) == before  # refused before it created anything


def test_publish_writes_every_finished_run_into_a_report_that_re_renders_byte_for_byte(exp_spec, tmp_path,
                                                                                       monkeypatch, capsys):
    """`run EXP --publish REPORT` publishes after each finished run (here 2), so the report holds
    what finished when a session ends; the last publish holds every run, re-renders byte for byte,
    and restores into a new session. A failed publish is said and the experiment goes on."""
    from mlmt_bench import experiment
    from mlmt_bench.report.compare import report_from_dirs

    exp, arms = load_experiment(exp_spec(a=1e-4))
    seen: list[int] = []
    real = experiment._publish

    def spy(exp_dir, out, progress, n_runs):
        real(exp_dir, out, progress, n_runs)
        seen.append(len(json.loads((out / "experiment.json").read_text())["arms"]["a"]))

    monkeypatch.setattr(experiment, "_publish", spy)
    out = run_experiment(exp, arms, progress=False, publish=tmp_path / "pub")
    assert seen == [1, 2]
    published = tmp_path / "pub"
    assert [Path(p).name for p in json.loads((published / "experiment.json").read_text())["arms"]["a"]] == \
        out["experiment"]["arms"]["a"]
    copy = tmp_path / "copy"
    shutil.copytree(published, copy)
    for f in [*copy.glob("*.md"), *copy.glob("*.html"), *copy.glob("*.png")]:
        f.unlink()
    report_from_dirs([copy], None)
    assert _files(copy) == _files(published)

    monkeypatch.setattr(experiment, "_publish", real)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "runs").mkdir()
    (tmp_path / "broken" / "runs" / "someone-elses-run").mkdir()  # report --raw refuses stale runs
    capsys.readouterr()
    again = run_experiment(exp, arms, progress=False, publish=tmp_path / "broken")
    assert len(again["experiment"]["arms"]["a"]) == 2  # the experiment finished all the same
    said = capsys.readouterr().err
    assert said.count("publishing") == 2 and "someone-elses-run" in said
    assert not (tmp_path / "broken" / "experiment.json").exists()


@pytest.mark.parametrize("target, why", [("file", "not a directory"), ("exp", "experiment's own experiment.json")])
def test_publish_refuses_a_target_it_could_never_publish_into_before_anything_runs(exp_spec, tmp_path, target, why):
    exp, arms = load_experiment(exp_spec(a=1e-4))
    if target == "file":
        (tmp_path / "file").write_text("x")
    else:
        (tmp_path / "exp").mkdir()
        (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"name": "exp", "arms": {}}))
    with pytest.raises(UserError, match=why):
        run_experiment(exp, arms, progress=False, publish=tmp_path / target)
    assert not Path(exp.output_dir).exists()


def test_publish_of_a_single_run_is_a_one_line_error(tiny_ckpt, tmp_path, write_spec):
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    spec = minimal_spec()
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    res = CliRunner().invoke(app, ["run", str(write_spec(spec, "one.yaml")), "--publish", str(tmp_path / "pub")])
    assert res.exit_code != 0 and "--publish applies to experiment specs" in res.output
    assert not (tmp_path / "pub").exists()


def test_restore_puts_the_published_starting_evaluations_back_in_the_memo(exp_spec, tmp_path):
    """Seed 0 stores its step-0 evaluation in the memo and seed 1 reads it; `report --raw` of seed 0
    publishes that entry (eval-memo/<key>.json.gz), and on a fresh machine (the memo wiped)
    `--restore` puts it back, so seed 1 reads it again instead of evaluating."""
    import gzip

    from mlmt_bench.report.compare import report_from_dirs

    exp, arms = load_experiment(exp_spec(a=1e-4))
    first = run_experiment(exp, arms, progress=False)
    seed0, seed1 = (Path(first["run_dir"]) / n for n in first["experiment"]["arms"]["a"])
    stored = json.loads((seed0 / "manifest.json").read_text())["eval_memo_stored"]
    assert list(stored) == ["eval"] and json.loads((seed1 / "manifest.json").read_text())["eval_memo"] == stored
    memo = tmp_path / "eval-memo"  # conftest's MLMT_BENCH_EVAL_MEMO
    entry = (memo / f"{stored['eval']}.json").read_bytes()
    report_from_dirs([seed0], tmp_path / "published", raw=True)
    published = tmp_path / "published" / "eval-memo" / f"{stored['eval']}.json.gz"
    assert gzip.decompress(published.read_bytes()) == entry

    shutil.rmtree(memo)
    out = run_experiment(exp, arms, progress=False, restore=[tmp_path / "published"])
    again = Path(out["run_dir"]) / out["experiment"]["arms"]["a"][1]
    assert json.loads((again / "manifest.json").read_text()).get("eval_memo") == stored  # read, not evaluated
    assert (memo / f"{stored['eval']}.json").read_bytes() == entry


@pytest.mark.parametrize("name, data, why", [
    ("a" * 64 + ".json.gz", b"\x1f\x8b not gzip", "cannot read as gzip"),
    ("a" * 64 + ".json.gz", b"not JSON", "not a stored evaluation"),
    ("a" * 64 + ".json.gz", None, "not a stored evaluation"),
    ("notes.txt", b"", "is not named"),
])
def test_restore_refuses_a_published_memo_entry_that_is_not_one(tmp_path, name, data, why):
    """A published report is data from elsewhere: an entry that is not gzip of an evaluation, or a
    file in eval-memo/ not named by a key, is a one-line error and nothing enters the memo."""
    import gzip

    from mlmt_bench.report.publish import restore_memo

    (tmp_path / "r" / "eval-memo").mkdir(parents=True)
    (tmp_path / "r" / "eval-memo" / ("b" * 64 + ".json.gz")).write_bytes(gzip.compress(b'{"samples": []}'))
    (tmp_path / "r" / "eval-memo" / name).write_bytes(gzip.compress(b'[1, 2]') if data is None else data)
    with pytest.raises(UserError, match=why):
        restore_memo(tmp_path / "r")
    assert not (tmp_path / "eval-memo").exists()


def test_restore_memo_bounds_what_it_writes_in_all(tmp_path, monkeypatch):
    """Entries each within the memo's bound can still add up: past MAX_RESTORE_BYTES in all the
    restore is a one-line error and writes none; an eval-memo that is a file is one too."""
    import gzip

    from mlmt_bench.report import publish

    memo = tmp_path / "r" / "eval-memo"
    memo.mkdir(parents=True)
    for c in "abc":
        (memo / (c * 64 + ".json.gz")).write_bytes(gzip.compress(b'{"samples": [], "pad": "' + b"x" * 40 + b'"}'))
    monkeypatch.setattr(publish, "MAX_RESTORE_BYTES", 100)
    with pytest.raises(UserError, match="more than the limit"):
        publish.restore_memo(tmp_path / "r")
    assert not (tmp_path / "eval-memo").exists()
    monkeypatch.setattr(publish, "MAX_RESTORE_BYTES", 1000)
    assert publish.restore_memo(tmp_path / "r") == 3 and len(list((tmp_path / "eval-memo").iterdir())) == 3
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "eval-memo").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        publish.restore_memo(tmp_path / "s")


def test_resume_refuses_a_changed_spec_or_another_experiment(exp_spec, tmp_path):
    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0]
    exp_dir = run_experiment(exp, arms, progress=False)["run_dir"]
    with pytest.raises(UserError, match="different spec"):
        run_experiment(*load_experiment(exp_spec(a=3e-4)), progress=False, resume=exp_dir)
    with pytest.raises(UserError, match="arms"):
        run_experiment(*load_experiment(exp_spec(z=1e-4)), progress=False, resume=exp_dir)
    with pytest.raises(UserError, match="not an experiment directory"):
        run_experiment(*load_experiment(exp_spec(a=1e-4)), progress=False, resume=tmp_path)


def test_memory_knobs_keep_a_finished_run_comparable(exp_spec):
    """micro_batch_tokens and gradient_checkpointing change how much memory a run needs, not what it
    computes: a run finished with other values is kept; a changed learning rate is not."""
    from mlmt_bench.experiment import _comparable

    spec = load_experiment(exp_spec(a=1e-4))[1]["a"]
    lean = spec.model_copy(deep=True)
    lean.train.micro_batch_tokens = 512
    lean.train.threads = 1
    lean.policies.solver.gradient_checkpointing = True
    assert _comparable(lean) == _comparable(spec)
    lean.policies.solver.lr = 3e-4
    assert _comparable(lean) != _comparable(spec)


def test_workers_build_each_shared_base_once_before_the_runs_that_need_it(tmp_path, write_spec, monkeypatch,
                                                                             capfd):
    """Two seeds, two arms sharing each seed's base: two bases, each built by one process (the
    cache holds exactly those two), and every run records the base of its seed."""
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    base = {"name": "b", "benchmark": {"name": "synthetic-arith", "eval_limit": 4},
            "policies": {"solver": {"model": "tiny"}}, "algorithm": {"name": "grpo", "params": {"group_size": 2}},
            "train": {"steps": 1, "problems_per_step": 2}, "base": {"steps": 4, "batch": 2, "check_problems": 2,
                                                                             "allow_invalid": True}}
    exp = {"name": "exp", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": str(tmp_path / "runs"),
           "arms": {"a": {}, "b": {"policies": {"solver": {"lr": 3.0e-4}}}}}
    exp_spec, arms = load_experiment(write_spec(exp, "exp.yaml"))
    out = run_experiment(exp_spec, arms, progress=True, workers=2)
    # the cache holds the two entries (and, hidden, each key's build lock: .lock-<key>)
    built = sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith("."))
    assert len(built) == 2 and not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]
    err = capfd.readouterr().err  # each build's worker says so once, with its check, in plain lines
    done = sorted(line.split()[2] for line in err.splitlines() if line.startswith("shared base "))
    assert done == built and all(f"shared base {key} built in " in err for key in built), err
    assert err.count("(first run only: cached for every later run)") >= 2 and "\x1b[" not in err
    for names in out["experiment"]["arms"].values():
        for seed, name in zip((0, 1), names):
            manifest = json.loads(open(f"{out['run_dir']}/{name}/manifest.json").read())
            assert manifest["seed"] == seed and manifest["base"]["key"] in built, (manifest["base"], built)
    # a base per seed: recorded so, and the comparison names no checkpoint shared by every seed
    assert out["experiment"]["base_per_seed"] is True and out["experiment"]["base_seed"] is None
    md = open(f"{out['run_dir']}/comparison.md").read()
    assert "One checkpoint for every seed" not in md and "each seed has its own base, so it includes" in md


def test_resuming_a_finished_experiment_is_refused_and_rewrites_nothing(exp_spec, tmp_path):
    path = exp_spec(a=1e-4)
    exp, arms = load_experiment(path)
    exp.seeds = [0]
    exp_dir = tmp_path / "runs" / os.path.basename(run_experiment(exp, arms, progress=False)["run_dir"])
    before = {p: p.read_bytes() for p in exp_dir.iterdir() if p.is_file()}
    exp, arms = load_experiment(path)
    exp.seeds = [0]
    with pytest.raises(UserError, match="has finished; nothing to resume .*mlmt-bench report"):
        run_experiment(exp, arms, progress=False, resume=exp_dir)
    assert {p: p.read_bytes() for p in exp_dir.iterdir() if p.is_file()} == before


def test_resume_of_an_experiment_directory_as_a_run_says_how_to_resume_it(exp_spec, tmp_path):
    from mlmt_bench.runner import resume_run

    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0]
    exp_dir = run_experiment(exp, arms, progress=False)["run_dir"]
    with pytest.raises(UserError, match=r"an experiment directory, not a run: continue it with `mlmt-bench run "
                                         r"EXPERIMENT_SPEC --resume"):
        resume_run(exp_dir)


# --------------------------------------------------------------------------- one checkpoint for every seed


def _base_exp(tmp_path, base_section, arms=None, seeds=(0, 1)):
    return {"name": "exp", "seeds": list(seeds), "budget": "none", "output_dir": str(tmp_path / "runs"),
            "base": {"name": "b", "benchmark": {"name": "synthetic-arith", "eval_limit": 4},
                     "policies": {"solver": {"model": "tiny"}},
                     "algorithm": {"name": "grpo", "params": {"group_size": 2}},
                     "train": {"steps": 2, "problems_per_step": 2}, "eval": {"every": 0}, "base": base_section},
            "arms": arms or {"a": {}}}


def test_experiment_json_records_whether_every_seed_shares_one_base(tmp_path, write_spec):
    from mlmt_bench.experiment import base_seeds

    def seeds_of(base_section, arms=None):
        return base_seeds(load_experiment(write_spec(_base_exp(tmp_path, base_section, arms), "e.yaml"))[1])

    assert seeds_of({"seed": 10}) == {"base_per_seed": False, "base_seed": 10}
    assert seeds_of({}) == {"base_per_seed": True, "base_seed": None}
    assert seeds_of({"seed": 10}, {"a": {}, "b": {"base": {"seed": None}}}) == {
        "base_per_seed": True, "base_seed": None, "base_seeds": {"a": 10, "b": None}}
    assert seeds_of({"seed": 10}, {"a": {}, "b": {"base": {"seed": 3}}}) == {
        "base_per_seed": False, "base_seed": None, "base_seeds": {"a": 10, "b": 3}}


def test_a_fixed_base_seed_gives_every_seed_the_same_base_and_its_own_training(tmp_path, write_spec, monkeypatch):
    """base.seed: 7 with seeds 0 and 1: one base is built, both runs' manifests name the same weights
    (sha256), experiment.json says so, and the runs' seeds still make their training samples differ;
    the comparison says its claim is conditional on that checkpoint."""
    from support import TINY

    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    exp, arms = load_experiment(write_spec(_base_exp(tmp_path, {**TINY, "seed": 7}), "exp.yaml"))
    out = run_experiment(exp, arms, progress=False)
    record = json.loads((Path(out["run_dir"]) / "experiment.json").read_text())
    assert record["base_per_seed"] is False and record["base_seed"] == 7
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".lock-")]) == 1
    runs = [Path(out["run_dir"]) / name for name in record["arms"]["a"]]
    manifests = [json.loads((r / "manifest.json").read_text()) for r in runs]
    assert [m["seed"] for m in manifests] == [0, 1]
    assert manifests[0]["base"]["seed"] == manifests[1]["base"]["seed"] == 7
    assert manifests[0]["base"]["sha256"] == manifests[1]["base"]["sha256"] is not None
    # the sampled attempts differ (their mean length per step; an 8-step base rarely earns a reward,
    # so the weights may not move: the samples are what the seed must change)
    trains = [[r["len/attempt"] for r in map(json.loads, (d / "metrics.jsonl").open()) if r["kind"] == "train"]
              for d in runs]
    assert len(trains[0]) == 2 and trains[0] != trains[1]
    md = (Path(out["run_dir"]) / "comparison.md").read_text()
    assert "**One checkpoint for every seed (METHOD v4)**" in md
    # the statistics say what the spread over seeds is made of: not the base's initialisation
    assert "each seed has its own base" not in md and "share one base, so there it is RL sampling" in md
    key = manifests[0]["base"]["key"]
    assert f"- base `{key}` (tiny-0.5m, seed 7): the start of every seed's runs of a (2 seeds)" in md


def test_the_run_seed_still_initialises_the_value_model(tiny_ckpt, tmp_path):
    """With one base for every seed, the value model's initialisation must come from the run's seed
    (it was seed 0 for every run): two seeds predict differently on the same features, one seed
    the same twice."""
    import torch

    from support import build_trainer, make_spec

    feats = torch.linspace(-1, 1, 3 * 16).reshape(3, 16)
    preds = {}
    for seed, name in ((1, "a"), (2, "b"), (1, "c")):
        spec = make_spec(tmp_path / name, tiny_ckpt, "mlmt", {"value": "learned"}).model_copy(update={"seed": seed})
        value = build_trainer(spec, tmp_path / name).algorithm.value_model
        assert value is not None and value.seed == seed
        preds[name] = value.predict(feats)
    assert not torch.equal(preds["a"], preds["b"]) and torch.equal(preds["a"], preds["c"])


def test_a_report_names_the_checkpoint_every_seed_shared(tmp_path):
    """Hand-made runs: two seeds of grpo (with its `+ base critic` row) and of mlmt from one base
    key: one line naming it and the two arms (not the derived row); with a base per seed, none."""
    from mlmt_bench.report.compare import build_comparison
    from support import make_run

    def runs(keys):
        out = {}
        for arm in ("grpo", "mlmt"):
            out[arm] = []
            for seed, key in enumerate(keys):
                d = make_run(tmp_path / str(keys), f"{arm}{seed}-20250101T000000Z", seed=seed, arm=arm,
                             curve=[(0, 0, 0.0, .25, .25), (5, 100, 1e9, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 0, 0],
                             extra={"base_critic/acc@t2": .75} if arm == "grpo" else None)
                manifest = json.loads((d / "manifest.json").read_text())
                manifest["base"] = {"key": key, "seed": 10 if len(set(keys)) == 1 else seed, "preset": "tiny-0.5m"}
                (d / "manifest.json").write_text(json.dumps(manifest))
                out[arm].append(d)
        return out

    summary = build_comparison(runs(("k10", "k10")), tmp_path / "one")
    assert summary["shared_bases"] == ["base `k10` (tiny-0.5m, seed 10): the start of every seed's runs of grpo, mlmt "
                                       "(2 seeds)"]
    md = (tmp_path / "one" / "comparison.md").read_text()
    assert md.index("**One checkpoint for every seed (METHOD v4)**: every seed of these arms starts from") < md.index(
        "## Final metrics") and "conditional on that checkpoint" in md
    assert "One checkpoint for every seed" in (tmp_path / "one" / "index.html").read_text()
    assert build_comparison(runs(("k0", "k1")), tmp_path / "per-seed")["shared_bases"] == []
    assert "One checkpoint" not in (tmp_path / "per-seed" / "comparison.md").read_text()
    # a pretrained model's warm start shared by every seed is one checkpoint too (the SmolLM2 testbed)
    warm = runs(("w", "w"))
    for d in warm["grpo"] + warm["mlmt"]:
        manifest = json.loads((d / "manifest.json").read_text())
        del manifest["base"]
        manifest["warm_start"] = {"key": "3c10", "from": {"alias": "smollm2-135m-instruct"}}
        (d / "manifest.json").write_text(json.dumps(manifest))
    assert build_comparison(warm, tmp_path / "warm")["shared_bases"] == [
        "warm start `3c10` (of smollm2-135m-instruct): the start of every seed's runs of grpo, mlmt (2 seeds)"]


def test_every_run_of_an_experiment_must_load_one_warm_start_checkpoint():
    """METHOD v4: one checkpoint for every seed. A run whose warm start (same key) has other
    weights, e.g. rebuilt on another CPU, is refused in one line naming both hashes and the run
    that set them; a run without a warm start, or of another key, joins."""

    record: dict = {}
    first = {"arm": "grpo", "seed": 0, "warm_start": {"key": "k" * 16, "sha256": "a" * 64}}
    join_base(record, first, "grpo-s0", "experiment E")
    join_base(record, {**first, "seed": 1}, "grpo-s1", "experiment E")
    join_base(record, {"arm": "x", "seed": 0, "warm_start": {"key": "j" * 16, "sha256": "b" * 64}}, "x-s0", "E")
    join_base(record, {"arm": "tiny", "seed": 0}, "tiny-s0", "E")
    assert record["warm_starts"] == {"k" * 16: {"sha256": "a" * 64, "first": "grpo-s0"},
                                     "j" * 16: {"sha256": "b" * 64, "first": "x-s0"}}
    other = {"arm": "mlmt", "seed": 2, "warm_start": {"key": "k" * 16, "sha256": "c" * 64}}
    with pytest.raises(UserError, match=r"^--resume D: run mlmt-s2 \(mlmt, seed 2\) loaded warm start k{16} with "
                                        r"weights sha256 c{16}, but run grpo-s0 of the experiment loaded a{16} "
                                        r"\(a warm start built on another machine\)"):
        join_base(record, other, "mlmt-s2", "--resume D")


def test_a_run_finished_in_another_cpu_dtype_does_not_join_the_rest(exp_spec, tmp_path, monkeypatch):
    """``train.cpu_dtype: auto`` is bfloat16 on a CPU with bfloat16 instructions and float32 on
    another: a run restored from such a machine is refused here in one line naming both dtypes,
    and the spec pinned to the dtype it ran in accepts it (a finished run is not redone)."""
    import yaml

    from mlmt_bench import runner

    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0]
    exp_dir = Path(run_experiment(exp, arms, progress=False)["run_dir"])
    (run,) = [p.parent for p in exp_dir.glob("*/manifest.json")]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["cpu_dtype"]["dtype"] = "bfloat16"  # as if made on a CPU with AMX
    (run / "manifest.json").write_text(json.dumps(manifest))
    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0, 1]
    with pytest.raises(UserError, match=r"ran its CPU matmuls in bfloat16, this machine would run the rest in "
                                        r"float32; set train.cpu_dtype: bfloat16 in the spec"):
        run_experiment(exp, arms, progress=False, resume=exp_dir)
    monkeypatch.setattr(runner, "cpu_dtype", lambda spec: {"dtype": "bfloat16"})  # this machine now as that one
    spec_file = exp_spec(a=1e-4)
    data = yaml.safe_load(spec_file.read_text())
    data["base"]["train"]["cpu_dtype"] = "bfloat16"
    spec_file.write_text(yaml.safe_dump(data))
    exp, arms = load_experiment(spec_file)
    exp.seeds = [0]
    with pytest.raises(UserError, match="nothing to resume"):  # the finished run is kept: the dtypes agree
        run_experiment(exp, arms, progress=False, resume=exp_dir)


def test_every_run_of_an_experiment_computes_with_one_set_of_package_versions():
    """A peft release changed what a shared-base run does between two sessions of one experiment:
    the first run's versions (computing packages only) are the experiment's; a run or an
    environment with another version of one of them is refused in one line naming each difference
    and the pip install that restores the experiment's; packages one side lacks, packages that
    compute nothing (optuna) and a run without versions join; an environment is checked, never
    recorded."""
    from mlmt_bench.experiment import join_versions

    record: dict = {}
    ran = {"python": "3.11.7", "torch": "2.13.0+cpu", "peft": "0.21.2", "transformers": "5.25.0", "optuna": "5.1.0"}
    join_base(record, {"arm": "grpo", "seed": 0, "versions": ran}, "grpo-s0", "E")
    assert record["versions"] == {"packages": {"torch": "2.13.0+cpu", "transformers": "5.25.0", "peft": "0.21.2"},
                                  "from": "run grpo-s0 (grpo, seed 0)"}
    join_base(record, {"arm": "mlmt", "seed": 0, "versions": {**ran, "optuna": "6.0", "python": "3.11.9"}}, "m", "E")
    join_versions(record, {"torch": "2.13.0+cpu", "vllm": "0.32.0"}, "this environment", "E", sets=False)
    empty: dict = {}
    join_versions(empty, ran, "this environment", "E", sets=False)  # checked against nothing: not recorded
    assert empty == {}
    join_base(record, {"arm": "old", "seed": 0}, "old-s0", "E")
    assert record["versions"]["packages"] == {"torch": "2.13.0+cpu", "transformers": "5.25.0", "peft": "0.21.2"}
    later = {**ran, "peft": "0.22.0", "transformers": "5.26.0"}
    with pytest.raises(UserError, match=r"^experiment D: this environment has peft 0\.22\.0 where the experiment has "
                                        r"0\.21\.2, transformers 5\.26\.0 where the experiment has 5\.25\.0 \(from "
                                        r"run grpo-s0 \(grpo, seed 0\)\); one experiment computes with one set of "
                                        r"versions: pip install peft==0\.21\.2 transformers==5\.25\.0, or start a new "
                                        r"experiment$"):
        join_versions(record, later, "this environment", "experiment D")
    with pytest.raises(UserError, match=r"^--resume D: run x-s1 \(x, seed 1\) has peft 0\.22\.0 where"):
        join_base(record, {"arm": "x", "seed": 1, "versions": later}, "x-s1", "--resume D")


def test_a_resume_in_an_environment_with_other_versions_is_refused_before_any_run(exp_spec, tmp_path,
                                                                                  monkeypatch):
    """The experiment's finished run ran with another peft than this environment has: the resume
    is refused before its missing run starts, and nothing in the experiment changes."""
    from mlmt_bench import tracking

    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0]
    exp_dir = Path(run_experiment(exp, arms, progress=False)["run_dir"])
    (run,) = [p.parent for p in exp_dir.glob("*/manifest.json")]
    assert json.loads((exp_dir / "experiment.json").read_text())["versions"]["packages"]["torch"]
    installed = tracking.package_versions()
    monkeypatch.setattr(tracking, "package_versions", lambda: {**installed, "peft": "99.0"})
    before = {p: p.read_bytes() for p in exp_dir.rglob("*") if p.is_file()}
    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0, 1]
    with pytest.raises(UserError, match=rf"this environment has peft 99\.0 where the experiment has "
                                        rf"{installed['peft']} \(from run {run.name} \(a, seed 0\)\)"):
        run_experiment(exp, arms, progress=False, resume=exp_dir)
    assert {p: p.read_bytes() for p in exp_dir.rglob("*") if p.is_file()} == before


def test_a_restored_experiment_keeps_the_wall_time_of_each_published_run(exp_spec, tmp_path):
    """The published record's `wall_s` of each run comes back with `--restore` (the runs' pace on
    a fresh machine: the start line's time to go, and the record published again); entries of
    other arms, "total" and values that are no wall time are left out."""
    from mlmt_bench.report.publish import restore_wall_s

    exp, arms = load_experiment(exp_spec(a=1e-4))
    exp.seeds = [0]
    run_experiment(exp, arms, progress=False, publish=tmp_path / "published")
    published = json.loads((tmp_path / "published" / "experiment.json").read_text())["wall_s"]
    assert set(published) == {"a/s0"}
    exp.seeds = [0, 1]
    out = run_experiment(exp, arms, progress=False, restore=[tmp_path / "published"])
    walls = json.loads((Path(out["run_dir"]) / "experiment.json").read_text())["wall_s"]
    assert walls["a/s0"] == published["a/s0"] and walls["a/s1"] > 0

    odd = tmp_path / "odd"
    (odd / "runs").mkdir(parents=True)
    (odd / "experiment.json").write_text(json.dumps({"wall_s": {  # seeds this experiment does not run
        "a/s7": 12.5, "a/s8": 7, "b/s7": 3.0, "total": 99.0, "a/sx": 1.0, "a/s2": -1.0, "a/s3": True, "a/s4": "9",
        "a/s5": float("nan"), "a/s\u00b2": 1.0}}))
    exp.seeds = [0]
    out = run_experiment(exp, arms, progress=False, restore=[odd])
    walls = json.loads((Path(out["run_dir"]) / "experiment.json").read_text())["wall_s"]
    assert walls["a/s7"] == 12.5 and walls["a/s8"] == 7.0 and walls["a/s0"] > 0
    assert set(walls) == {"a/s7", "a/s8", "a/s0", "total"}  # "total": this experiment's own
    (odd / "experiment.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="experiment.json is not a JSON object"):
        restore_wall_s(odd)
    broken = tmp_path / "broken"  # the published report with its record replaced: its run is not copied in
    shutil.copytree(tmp_path / "published", broken)
    (broken / "experiment.json").write_text("[1, 2]")
    before = set(Path(exp.output_dir).iterdir())
    with pytest.raises(UserError, match="experiment.json is not a JSON object; nothing restored"):
        run_experiment(exp, arms, progress=False, restore=[broken])
    (new,) = set(Path(exp.output_dir).iterdir()) - before
    assert not list(new.glob("*/manifest.json"))
