"""Experiment trackers (mlmt_bench/trackers): what TensorBoard, MLflow and W&B stored, read back
through their own readers, equals metrics.jsonl, every metric at every step; a tracker that
cannot work is one line at validation; one that fails mid-run loses nothing of the run."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path

import pytest

from conftest import minimal_spec
from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.trackers import Tracker
from support import one_line_error, require

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRACKERS = ("tensorboard", "mlflow", "wandb")

if "parity-test" not in registry.verifiers:  # rewards that vary, so that the policy is updated (kl, entropy)
    registry.verifiers.register("parity-test", "support:ParityVerifier", "parity of the response length (tests)",
                                overwrite=True)


def _have(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _spec(ckpt: Path, out: Path, report_to, options=None, **over) -> dict:
    d = minimal_spec(output_dir=str(out), **over)
    d["policies"]["solver"]["path"] = str(ckpt)
    d["benchmark"]["verifier"] = "parity-test"
    d["algorithm"]["params"]["beta"] = 0.04  # a KL to π_ref, so that TRL's train/kl is logged (as TRL: only when β > 0)
    d["train"].update(steps=3, checkpoint_every=1)
    d["eval"] = {"every": 2, "limit": 4}
    d["backend"] = {"max_new_tokens": 8}
    d["tracking"] = {"report_to": list(report_to), **({"options": options} if options else {})}
    return d


def _expected(run_dir: Path) -> list[dict]:
    """metrics.jsonl as the trackers must have it: name → value (the names every tracker logs), with
    the counters."""
    from mlmt_bench.trackers.names import logged
    from mlmt_bench.tracking import read_jsonl

    return [{"step": r["step"], "gen_tokens": r["gen_tokens"], "flops": r["flops"], "metrics": logged(r)}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def _series(expected: list[dict], axis: str = "step") -> dict[str, list[tuple[int, float]]]:
    """key → [(step on ``axis``, value)] in the order metrics.jsonl has them."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in expected:
        at = int(r[axis])
        for k, v in r["metrics"].items():
            out.setdefault(k, []).append((at, v))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _same32(a: float, b: float) -> bool:
    """Equal as TensorBoard stores a scalar (float32)."""
    return (math.isnan(a) and math.isnan(b)) or struct.pack("f", a) == struct.pack("f", b)


@pytest.fixture(scope="module")
def tracked_run(tiny_ckpt, tmp_path_factory):
    """One tiny GRPO run reporting to every installed tracker, and its run directory."""
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    have = [t for t in TRACKERS if _have(t)]
    if not have:
        return None, []
    out = tmp_path_factory.mktemp("tracked")
    spec = validate_run(_spec(tiny_ckpt, out / "runs", have), "test")
    result = runner.run(spec, progress=False)
    return Path(result["run_dir"]), have


def _run_of(tracked_run, tracker: str) -> Path:
    run_dir, have = tracked_run
    require(tracker in have, f"the {tracker} package (pip install 'mlmt-bench[trackers]')")
    return run_dir


def test_every_tracker_follows_the_whole_run(tracked_run):
    run_dir, have = tracked_run
    require(len(have) == len(TRACKERS), "the trackers extra (pip install 'mlmt-bench[trackers]')")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and set(manifest["trackers"]) == set(TRACKERS)
    assert not any("error" in s for s in manifest["trackers"].values()), manifest["trackers"]
    kinds = [r["metrics"] for r in _expected(run_dir)]
    assert {k.split("/")[0] for m in kinds for k in m} == {"train", "eval", "final"}


def _tensorboard_names(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard" / "step"), size_guidance={SCALARS: 0})
    acc.Reload()
    return set(acc.Tags()["scalars"])


def _mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    state = json.loads((run_dir / "manifest.json").read_text())["trackers"]["mlflow"]
    return MlflowClient(state["tracking_uri"]), state


def _wandb_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """The W&B offline run's history: step → {name: value} (W&B's own ``_step`` ... left out)."""
    state = json.loads((run_dir / "manifest.json").read_text())["trackers"]["wandb"]
    files = list((run_dir / "wandb").glob(f"offline-run-*-{state['id']}/run-{state['id']}.wandb"))
    assert len(files) == 1, list((run_dir / "wandb").rglob("*"))
    rows: dict[int, dict[str, float]] = {}
    for rec in _wandb_records(files[0]):
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            rows.setdefault(int(row["_step"]), {}).update({k: v for k, v in row.items() if k != "_step"})
    return {step: {k: v for k, v in row.items() if not k.startswith("_")} for step, row in rows.items()}


TRL_NAMES = ("train/reward", "train/reward_std", "train/frac_reward_zero_std", "train/kl", "train/entropy",
             "train/clip_ratio/region_mean", "train/completions/mean_length", "train/completions/clipped_ratio")


def test_one_metric_has_one_name_in_every_tracker_and_trl_names_are_there(tracked_run):
    """MLflow, TensorBoard and W&B hold the same names (MLflow's spelling: no ``@``, no ``->``),
    TRL's names beside ours with the values metrics.jsonl has under our keys, and the step-0
    evaluation carries ``train/gen_tokens`` (0) for charts against it."""
    from mlmt_bench.tracking import read_jsonl

    run_dir, have = tracked_run
    require(len(have) == len(TRACKERS), "the trackers extra (pip install 'mlmt-bench[trackers]')")
    client, state = _mlflow_client(run_dir)
    in_mlflow = set(client.get_run(state["run_id"]).data.metrics)
    rows = _wandb_rows(run_dir)
    in_wandb = {k for row in rows.values() for k in row}
    in_tensorboard = _tensorboard_names(run_dir)
    assert in_mlflow == in_tensorboard == in_wandb, (sorted(in_mlflow ^ in_tensorboard), sorted(in_mlflow ^ in_wandb))
    assert {"eval/acc_at_t2", "eval/acc_at_t1", "final/acc_at_t2", *TRL_NAMES} <= in_mlflow
    assert not any("@" in k or ">" in k for k in in_mlflow)
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = {r["step"]: r for r in records if r["kind"] == "train"}
    history = {k: {m.step: m.value for m in client.get_metric_history(state["run_id"], k)}
               for k in ("train/reward", "train/frac_reward_zero_std", "train/kl", "train/entropy",
                         "train/clip_ratio/region_mean", "train/completions/mean_length", "train/gen_tokens")}
    for step, r in train.items():
        ours = {"train/reward": r["reward_mean"], "train/frac_reward_zero_std": r["frac_zero_std"],
                "train/kl": r["kl/solver"], "train/entropy": r["entropy/solver"],
                "train/clip_ratio/region_mean": r["clip_frac/solver"],
                "train/completions/mean_length": r["len/attempt"]}  # GRPO generates attempts only
        for name, value in ours.items():
            assert history[name][step] == value and rows[step][name] == value, (step, name)
    assert history["train/gen_tokens"][0] == 0.0 and rows[0]["train/gen_tokens"] == 0
    assert min(train) == 1  # no train record at step 0: the evaluation row carried it


def test_tensorboard_event_files_hold_every_metric_on_every_axis(tracked_run):
    """Read with TensorBoard's own reader (the one ``tensorboard --inspect`` uses): every metric is
    a scalar, on every axis, with the value metrics.jsonl has (as float32)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator

    run_dir = _run_of(tracked_run, "tensorboard")
    expected = _expected(run_dir)
    for axis, unit in (("step", "step"), ("tokens", "gen_tokens"), ("flops", "flops")):
        acc = EventAccumulator(str(run_dir / "tensorboard" / axis), size_guidance={SCALARS: 0})
        acc.Reload()
        want = _series(expected, unit)
        tags = set(acc.Tags()["scalars"])
        assert tags == set(want), (axis, sorted(tags ^ set(want)))
        for key, points in want.items():
            got = [(e.step, e.value) for e in acc.Scalars(key)]
            assert len(got) == len(points) and all(g[0] == p[0] and _same32(g[1], p[1]) for g, p in zip(got, points)), \
                (axis, key, got, points)
    spec_text = EventAccumulator(str(run_dir / "tensorboard" / "step"), size_guidance={TENSORS: 0})
    spec_text.Reload()
    assert "spec/text_summary" in spec_text.Tags()["tensors"]


def test_mlflow_store_holds_every_metric_at_every_step_and_the_spec_as_params(tracked_run):
    from mlmt_bench.trackers import flat_params

    run_dir = _run_of(tracked_run, "mlflow")
    client, state = _mlflow_client(run_dir)
    assert state["tracking_uri"] == f"sqlite:///{(run_dir.parent / 'mlflow.db').resolve()}"
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.tags["seed"] == "0" and run.data.tags["mlmt_bench.run_dir"] == str(run_dir.resolve())
    import yaml

    config = yaml.safe_load((run_dir / "spec.resolved.yaml").read_text())
    assert run.data.params == {k: v[:6000] for k, v in flat_params(config).items()}
    want = _series(_expected(run_dir))
    assert set(run.data.metrics) == set(want)
    for key, points in want.items():
        history = client.get_metric_history(state["run_id"], key)
        got = sorted(((m.step, m.value) for m in history), key=lambda p: p[0])  # stable: one value per step
        assert len(got) == len(points) and all(g[0] == p[0] and _same(g[1], p[1]) for g, p in zip(got, points)), \
            (key, got, points)


def _wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (``run-<id>.wandb``): its 7-byte header, then
    LevelDB-log framing (32 KiB blocks; chunks of checksum, length, type), parsed with W&B's own
    ``Record`` message."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # padding to the end of a block
            pos += left - 7
            continue
        buf += data[pos:pos + n]
        pos += n
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


def test_wandb_offline_run_holds_every_metric_at_every_step_and_the_spec_as_config(tracked_run):
    run_dir = _run_of(tracked_run, "wandb")
    state = json.loads((run_dir / "manifest.json").read_text())["trackers"]["wandb"]
    file = next((run_dir / "wandb").glob(f"offline-run-*-{state['id']}/run-{state['id']}.wandb"))
    rows = _wandb_rows(run_dir)
    config = None
    for rec in _wandb_records(file):
        if rec.WhichOneof("record_type") == "run":
            config = {u.key: json.loads(u.value_json) for u in rec.run.config.update}
            assert rec.run.display_name == run_dir.name and rec.run.project == "mlmt-bench"
    import yaml

    assert config is not None and config["algorithm"] == yaml.safe_load(
        (run_dir / "spec.resolved.yaml").read_text())["algorithm"]
    want: dict[int, dict[str, float]] = {}
    for r in _expected(run_dir):
        want.setdefault(r["step"], {}).update(r["metrics"])
    assert sorted(rows) == sorted(want)
    for step, metrics in want.items():
        got = rows[step]
        assert set(got) == set(metrics), (step, set(got) ^ set(metrics))
        assert all(_same(float(got[k]), v) for k, v in metrics.items()), step


@pytest.mark.slow  # 4 runs with three trackers each: 177 s at a load average of 7
def test_an_experiment_groups_its_runs_with_arm_and_seed_as_tags(tiny_ckpt, tmp_path):
    require(all(_have(t) for t in TRACKERS), "the trackers extra (pip install 'mlmt-bench[trackers]')")
    from mlflow.tracking import MlflowClient

    from mlmt_bench.experiment import run_experiment
    from mlmt_bench.spec import load_experiment

    base = _spec(tiny_ckpt, tmp_path / "unused", TRACKERS)
    base["train"].update(steps=1, checkpoint_every=0)
    exp = {"name": "exp", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": str(tmp_path / "runs"),
           "arms": {"a": {}, "b": {"policies": {"solver": {"lr": 2e-4}}}}}
    import yaml

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    out = run_experiment(*load_experiment(tmp_path / "exp.yaml"), progress=False)
    exp_dir = Path(out["run_dir"])
    group = json.loads((exp_dir / "experiment.json").read_text())["tracking_group"]
    assert group["name"] == exp_dir.name and group["kind"] == "experiment"
    mlflow_state = group["state"]["mlflow"]
    assert mlflow_state["tracking_uri"] == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    client = MlflowClient(mlflow_state["tracking_uri"])
    parent = client.get_run(mlflow_state["parent_run_id"])
    assert parent.info.run_name == exp_dir.name and parent.info.status == "FINISHED"
    children = client.search_runs([mlflow_state["experiment_id"]],
                                  f"tags.mlflow.parentRunId = '{mlflow_state['parent_run_id']}'")
    assert sorted((r.data.tags["arm"], r.data.tags["seed"], r.data.tags["experiment"]) for r in children) == [
        ("a", "0", "exp"), ("a", "1", "exp"), ("b", "0", "exp"), ("b", "1", "exp")]
    for arm, runs in out["experiment"]["arms"].items():
        for name in runs:
            manifest = json.loads((exp_dir / name / "manifest.json").read_text())
            run_id = manifest["trackers"]["wandb"]["id"]
            wandb_file = next((exp_dir / name / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
            header = next(r.run for r in _wandb_records(wandb_file) if r.WhichOneof("record_type") == "run")
            assert header.run_group == exp_dir.name and header.job_type == arm
            assert f"arm={arm}" in header.tags and f"seed={manifest['seed']}" in header.tags
            assert (exp_dir / name / "tensorboard" / "step").is_dir()


@pytest.mark.slow  # two real trials
def test_a_sweep_logs_each_trial_under_one_parent(tiny_ckpt, tmp_path):
    require(_have("mlflow"), "the mlflow package (pip install 'mlmt-bench[trackers]')")
    import yaml
    from mlflow.tracking import MlflowClient

    from mlmt_bench.sweep import run_sweep

    spec = _spec(tiny_ckpt, tmp_path / "runs", ["mlflow"])
    spec["train"].update(steps=1, checkpoint_every=0)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "sw", "run": "run.yaml", "n_trials": 2, "sampler": "random", "pruner": "none", "eval_split": "test",
        "space": {"policies.solver.lr": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True}}}))
    result = run_sweep(tmp_path / "sweep.yaml", seed=0, progress=False)
    assert [t["state"] for t in result["trials"]] == ["complete", "complete"]
    import optuna

    study = optuna.load_study(study_name="sw", storage=f"sqlite:///{tmp_path / 'runs' / 'sw' / 'sw.db'}")
    group = study.user_attrs["tracking_group"]
    assert group["kind"] == "sweep" and group["name"] == "sw"
    state = group["state"]["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{(tmp_path / 'runs' / 'sw' / 'mlflow.db').resolve()}"
    client = MlflowClient(state["tracking_uri"])
    children = client.search_runs([state["experiment_id"]], f"tags.mlflow.parentRunId = '{state['parent_run_id']}'")
    by_trial = {r.data.tags["trial"]: r for r in children}
    assert sorted(by_trial) == ["0", "1"]
    for t in result["trials"]:
        run = by_trial[str(t["number"])]
        assert float(run.data.params["policies.solver.lr"]) == t["params"]["policies.solver.lr"]
        assert run.data.metrics["final/acc_at_t2"] == t["value"]


def test_a_resumed_run_continues_its_tracker_runs_and_tensorboard_draws_no_step_twice(tiny_ckpt, tmp_path):
    require(all(_have(t) for t in TRACKERS), "the trackers extra (pip install 'mlmt-bench[trackers]')")
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    spec = validate_run(_spec(tiny_ckpt, tmp_path / "runs", TRACKERS), "test")
    run_dir = Path(runner.run(spec, progress=False)["run_dir"])
    before = json.loads((run_dir / "manifest.json").read_text())
    for step in (2, 3):  # as if it had been killed after the checkpoint of step 1
        shutil.rmtree(run_dir / "checkpoints" / f"step-{step:06d}")
    (run_dir / "manifest.json").write_text(json.dumps({**before, "status": "failed"}))
    runner.resume_run(run_dir, progress=False)
    after = json.loads((run_dir / "manifest.json").read_text())
    assert after["status"] == "completed" and after["resumed_from"] == ["step-000001"]
    assert after["trackers"]["mlflow"]["run_id"] == before["trackers"]["mlflow"]["run_id"]
    assert after["trackers"]["wandb"]["id"] == before["trackers"]["wandb"]["id"]
    expected = _expected(run_dir)  # steps 2 and 3 redone, once each in metrics.jsonl
    for axis, unit in (("step", "step"), ("tokens", "gen_tokens")):
        acc = EventAccumulator(str(run_dir / "tensorboard" / axis), size_guidance={SCALARS: 0})
        acc.Reload()
        for key, points in _series(expected, unit).items():
            got = [(e.step, e.value) for e in acc.Scalars(key)]
            assert [g[0] for g in got] == [p[0] for p in points], (axis, key)  # the purged events are gone
            assert all(_same32(g[1], p[1]) for g, p in zip(got, points)), (axis, key)


# ----------------------------------------------------------------------------------------------
# refusals: one line at validation


def test_an_unknown_tracker_or_stray_options_are_one_line(tiny_ckpt, tmp_path, write_spec):
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["tensorbord"]))
    one_line_error(["validate", str(path)], "tracking.report_to.0", "unknown tracker", "did you mean 'tensorboard'")
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["tensorboard"], {"mlflow": {}}))
    one_line_error(["validate", str(path)], "tracking.options.mlflow", "not in tracking.report_to")
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["tensorboard"], {"tensorboard": {"flush": 3}}))
    one_line_error(["validate", str(path)], "tracking.options.tensorboard.flush")
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["tensorboard", "tensorboard"]))
    one_line_error(["validate", str(path)], "listed twice")


def test_a_malformed_mlflow_uri_is_one_line_at_validation(tiny_ckpt, tmp_path, write_spec):
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["mlflow"], {"mlflow": {"tracking_uri": "bogus://x"}}))
    one_line_error(["validate", str(path)], "tracking.options.mlflow", "unknown scheme 'bogus'")
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["mlflow"], {"mlflow": {"tracking_uri": "sqlite://"}}))
    one_line_error(["validate", str(path)], "names no database file")


def test_a_missing_package_is_one_line_at_validation(tiny_ckpt, tmp_path, write_spec, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["wandb"]))
    one_line_error(["validate", str(path)], "wandb needs the wandb package", "mlmt-bench[trackers]")


def test_an_unreachable_mlflow_server_is_one_line_before_anything_runs(tiny_ckpt, tmp_path, write_spec):
    require(_have("mlflow"), "the mlflow package (pip install 'mlmt-bench[trackers]')")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    options = {"mlflow": {"tracking_uri": uri, "timeout_s": 2}}
    path = write_spec(_spec(tiny_ckpt, tmp_path / "runs", ["mlflow"], options))
    one_line_error(["run", str(path)], f"tracking_uri {uri}", "does not answer")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory


# ----------------------------------------------------------------------------------------------
# a tracker failing mid-run


class _Exploding(Tracker):
    """A tracker that fails at its second record."""

    seen: list[dict] = []

    def __init__(self, options, run):
        self.n = 0

    def state(self):
        return {"n": self.n}

    def log(self, metrics, axes):
        self.n += 1
        if self.n == 2:
            raise ConnectionError("the tracking server went away")
        _Exploding.seen.append(metrics)

    def close(self, status):
        pass


def test_a_tracker_failing_mid_run_is_a_warning_and_the_run_keeps_every_record(tiny_ckpt, tmp_path, capsys,
                                                                              monkeypatch):
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run
    _Exploding.seen = []
    monkeypatch.setitem(registry.trackers._entries, "exploding",
                        registry.Entry("exploding", _Exploding, "test tracker", "test"))
    spec = validate_run(_spec(tiny_ckpt, tmp_path / "runs", ["exploding"]), "test")
    result = runner.run(spec, progress=False)
    run_dir = Path(result["run_dir"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 3 + 3 + 1  # 3 train steps, evaluations at 0, 2, 3, the final record
    assert len(_Exploding.seen) == 1  # the first record, then it was dropped
    err = capsys.readouterr().err
    assert err.count("warning: tracker exploding failed (step 1: ConnectionError: the tracking server went away)") == 1
    assert "metrics.jsonl has them all" in err


def test_scalars_keep_numbers_and_leave_the_rest():
    from mlmt_bench.trackers import axes_of
    from mlmt_bench.trackers.names import scalars

    record = {"kind": "train", "step": 3, "gen_tokens": 40, "flops": 1.5e9, "updated": ["solver"], "x": None,
              "mem/source": "cpu_rss", "ok": True, "acc@t2": float("nan")}
    got = scalars(record)
    assert set(got) == {"train/step", "train/gen_tokens", "train/flops", "train/acc@t2"}
    assert got["train/flops"] == 1.5e9 and math.isnan(got["train/acc@t2"])
    assert axes_of(record).gen_tokens == 40 and axes_of(record).flops == 1.5e9


def test_tracker_name_spells_out_what_mlflow_refuses():
    from mlmt_bench.trackers.names import tracker_name

    assert tracker_name("eval/acc@t2") == "eval/acc_at_t2"
    assert tracker_name("eval/base_critic/i->c") == "eval/base_critic/i_to_c"
    assert tracker_name("train/len/attempt") == "train/len/attempt"
    assert tracker_name("eval/a+b (x)") == "eval/a_b _x_"


def test_logged_adds_trl_names_and_the_step_0_axes_by_hand():
    from mlmt_bench.trackers.names import logged

    train = {"kind": "train", "step": 3, "gen_tokens": 40, "flops": 2.0, "reward_mean": 0.25, "reward_std": 0.5,
             "frac_zero_std": 0.125, "kl/solver": 0.01, "kl/critic": 0.02, "entropy/solver": 1.5,
             "clip_frac/solver": 0.0625, "len/attempt": 12.0, "completions/clipped_ratio": 0.75,
             "completions/clipped_ratio/attempt": 0.75, "updated": ["solver"]}
    assert logged(train) == {
        "train/step": 3.0, "train/gen_tokens": 40.0, "train/flops": 2.0, "train/reward_mean": 0.25,
        "train/reward_std": 0.5, "train/frac_zero_std": 0.125, "train/kl/solver": 0.01, "train/kl/critic": 0.02,
        "train/entropy/solver": 1.5, "train/clip_frac/solver": 0.0625, "train/len/attempt": 12.0,
        "train/completions/clipped_ratio": 0.75, "train/completions/clipped_ratio/attempt": 0.75,
        # TRL's names, the solver's values
        "train/reward": 0.25, "train/frac_reward_zero_std": 0.125, "train/kl": 0.01, "train/entropy": 1.5,
        "train/clip_ratio/region_mean": 0.0625, "train/completions/mean_length": 12.0,
        "train/completions/mean_length/attempt": 12.0}
    two_kinds = logged({"kind": "train", "step": 1, "len/attempt": 10.0, "len/refine": 4.0})
    assert two_kinds["train/completions/mean_length/refine"] == 4.0
    assert "train/completions/mean_length" not in two_kinds  # TRL's mean over all completions is not known
    start = logged({"kind": "eval", "step": 0, "gen_tokens": 0, "flops": 0.0, "acc@t2": 0.5, "i->c": 0.1})
    assert start == {"eval/step": 0.0, "eval/gen_tokens": 0.0, "eval/flops": 0.0, "eval/acc_at_t2": 0.5,
                     "eval/i_to_c": 0.1, "train/gen_tokens": 0.0, "train/flops": 0.0}
    later = logged({"kind": "eval", "step": 2, "gen_tokens": 9, "flops": 1.0, "acc@t2": 0.5})
    assert "train/gen_tokens" not in later and "eval/acc_at_t2" in later  # step 2's train record has it


def test_check_tracking_refuses_before_a_package_is_imported():
    from mlmt_bench.trackers import check_tracking

    with pytest.raises(UserError, match="tracking.report_to.1: unknown tracker 'neptune'"):
        check_tracking(["tensorboard", "neptune"], {}, Path("runs"))
