"""Experiments and sweeps on Ray (``--ray ADDRESS``, mlmt_bench/machine/cluster.py): a local cluster on
127.0.0.1 (a head and one worker node, started and stopped here), one Ray worker killed mid-run,
and every run finished once, equal to the ``--workers 2`` path's bit for bit."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import minimal_spec
from support import require

# what depends on the clock or the machine's load, never on the run's seed
TIMING = ("wall_s", "gen_tok_per_s", "train_tok_per_s", "peak_mem_mb")
# each run's steps: enough that one is still running with a checkpoint when the test looks
STEPS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_cluster():
    """``host:port`` of a Ray cluster of two nodes on 127.0.0.1 with one CPU each: a head and a
    worker, each ``ray start --block`` in a session of its own, killed with it at the end (only
    the processes started here)."""
    require(importlib.util.find_spec("ray") is not None, "the ray package (pip install 'mlmt-bench[ray]')")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="/tmp/ray-t")  # Ray's socket paths must stay short
    common = ["--num-cpus=1", "--disable-usage-stats", "--block"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    procs = [subprocess.Popen([ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                               "--include-dashboard=false", f"--temp-dir={temp}", *common],
                              start_new_session=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    address = f"127.0.0.1:{port}"
    try:
        _wait_for_nodes(address, 1)
        procs.append(subprocess.Popen([ray_bin, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
                                       *common], start_new_session=True, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_nodes(address, 2)
        yield address
    finally:
        for p in reversed(procs):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=20)
                    break
                except subprocess.TimeoutExpired:
                    continue


def _wait_for_nodes(address: str, n: int, timeout_s: float = 180) -> None:
    code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(sum(1 for x in ray.nodes() if x['Alive']))")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= n:
            return
        time.sleep(2)
    raise AssertionError(f"the Ray cluster at {address} did not reach {n} nodes: {out.stderr[-500:]}")


def _cli(*args: str, **kw):
    """``mlmt-bench -q ARGS`` in a child process (its main applies the CPU pin, as Ray's tasks get it)."""
    return subprocess.Popen([sys.executable, "-m", "mlmt_bench.cli", "-q", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _experiment(tmp_path: Path, ckpt: Path, out: str) -> Path:
    base = minimal_spec()
    base["policies"]["solver"]["path"] = str(ckpt)
    base["train"].update(steps=STEPS, checkpoint_every=1, token_budget=None)
    base["eval"] = {"every": 2, "limit": 4}
    base["backend"] = {"max_new_tokens": 8}
    exp = {"name": "rx", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": str(tmp_path / out),
           "arms": {"a": {}, "b": {"policies": {"solver": {"lr": 3e-4}}}}}
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def _runs(exp_dir: Path) -> dict[tuple[str, int], dict]:
    """(arm, seed) → what the run computed: its metrics without timing, samples and per-problem
    results, and its final weights' bytes; every run directory of the experiment, once."""
    out = {}
    for manifest_path in sorted(exp_dir.glob("*/manifest.json")):
        m = json.loads(manifest_path.read_text())
        key = (m["arm"], m["seed"])
        assert key not in out, f"{key} has two run directories"
        assert m["status"] == "completed", (key, m["status"])
        d = manifest_path.parent
        metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING and not k.startswith("mem/")}
                   for line in (d / "metrics.jsonl").read_text().splitlines()]
        last = sorted(d.glob("checkpoints/step-*"))[-1]
        # the policies' weights (trainer_state also holds the wall time)
        weights = {p.relative_to(last).as_posix(): p.read_bytes() for p in sorted(last.glob("*/*.safetensors"))}
        assert weights, list(last.rglob("*"))
        out[key] = {"metrics": metrics, "samples": (d / "samples.jsonl").read_text(),
                    "eval_problems": (d / "eval_problems.jsonl").read_text(), "weights": weights,
                    "resumed_from": m.get("resumed_from")}
    return out


def _pid_of_a_run_mid_way(runs: Path, steps: int) -> int | None:
    """The pid in ``.lock`` of a run directory matching ``runs`` (a glob) that its manifest says is
    running, with a checkpoint and at least 3 of its ``steps`` still to go (None: none yet).
    ``.lock`` stays after a run ends and a Ray worker goes on to other runs, so a checkpoint
    alone does not say its pid is mid-run; 3 steps left keep the run going while it is killed."""
    for run in sorted(Path(runs.anchor).glob(str(runs.relative_to(runs.anchor)))):
        try:
            manifest = json.loads((run / "manifest.json").read_text())
            pid = (run / ".lock").read_text().strip()
        except (OSError, ValueError):
            continue
        done = [int(c.name[5:]) for c in run.glob("checkpoints/step-*") if re.fullmatch(r"step-\d{6}", c.name)]
        if manifest.get("status") == "running" and pid.isdigit() and done and max(done) <= steps - 3:
            return int(pid)
    return None


def _kill_a_run_mid_way(runs: Path, steps: int, proc: subprocess.Popen, timeout_s: float = 600) -> int:
    """SIGKILL the process running a run of ``runs`` (a glob) mid-way (:func:`_pid_of_a_run_mid_way`)
    while ``proc`` (the CLI that started it) runs; returns that pid."""
    deadline = time.monotonic() + timeout_s
    while (pid := _pid_of_a_run_mid_way(runs, steps)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no run mid-way to kill (cli: {proc.poll()}, {proc.stderr.read()[-800:]})")
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
def test_an_experiment_on_ray_survives_a_killed_worker_and_equals_the_workers_path(ray_cluster, tiny_ckpt, tmp_path):
    local = _cli("run", str(_experiment(tmp_path, tiny_ckpt, "local")), "--workers", "2")
    _, err = local.communicate(timeout=1800)
    assert local.returncode == 0, err[-2000:]
    on_ray = _cli("run", str(_experiment(tmp_path, tiny_ckpt, "ray")), "--ray", ray_cluster)
    killed = _kill_a_run_mid_way(tmp_path / "ray" / "rx-*" / "*", STEPS, on_ray)
    _, err = on_ray.communicate(timeout=1800)
    assert on_ray.returncode == 0, err[-2000:]
    (local_dir,), (ray_dir,) = (list((tmp_path / d).glob("rx-*")) for d in ("local", "ray"))
    a, b = _runs(local_dir), _runs(ray_dir)
    assert sorted(a) == sorted(b) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    resumed = [k for k, r in b.items() if r["resumed_from"]]
    assert len(resumed) == 1, (killed, {k: r["resumed_from"] for k, r in b.items()})  # the killed one, once
    for key in a:
        for part in ("metrics", "samples", "eval_problems", "weights"):
            assert a[key][part] == b[key][part], (key, part)
    record = json.loads((ray_dir / "experiment.json").read_text())
    assert {arm: len(runs) for arm, runs in record["arms"].items()} == {"a": 2, "b": 2}
    # --resume on Ray keeps the finished runs and runs only the lost one, to the same result
    lost = next(n for n in record["arms"]["b"] if json.loads((ray_dir / n / "manifest.json").read_text())["seed"] == 1)
    kept = {n: (ray_dir / n / "metrics.jsonl").read_bytes() for runs in record["arms"].values() for n in runs
            if n != lost}
    shutil.rmtree(ray_dir / lost)
    resumed_run = _cli("run", str(tmp_path / "ray.yaml"), "--ray", ray_cluster, "--resume", str(ray_dir))
    _, err = resumed_run.communicate(timeout=1800)
    assert resumed_run.returncode == 0, err[-2000:]
    c = _runs(ray_dir)
    assert sorted(c) == sorted(a) and all((ray_dir / n / "metrics.jsonl").read_bytes() == m for n, m in kept.items())
    for part in ("metrics", "samples", "eval_problems", "weights"):
        assert c[("b", 1)][part] == a[("b", 1)][part], part


def _sweep(tmp_path: Path, ckpt: Path, out: str) -> Path:
    spec = minimal_spec(output_dir=str(tmp_path / out))
    spec["policies"]["solver"]["path"] = str(ckpt)
    spec["train"].update(steps=STEPS, checkpoint_every=1)
    spec["eval"] = {"every": 1, "limit": 4, "samples": 0}
    spec["backend"] = {"max_new_tokens": 8}
    (tmp_path / f"{out}-run.yaml").write_text(yaml.safe_dump(spec))
    path = tmp_path / f"{out}-sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "sw", "run": f"{out}-run.yaml", "n_trials": 4, "sampler": "grid", "pruner": "none",
        "eval_split": "test", "space": {"policies.solver.lr": {"type": "categorical",
                                                                "choices": [1e-4, 2e-4, 4e-4, 8e-4]}}}))
    return path


def _trials(result: dict) -> dict[float, list]:
    """lr → what each complete trial of that grid point computed (its metrics.jsonl without timing;
    the untrained tiny model's accuracy is 0 everywhere, its losses and rewards are not)."""
    out: dict[float, list] = {}
    for t in result["trials"]:
        if t["state"] == "complete":
            lines = (Path(t["run_dir"]) / "metrics.jsonl").read_text().splitlines()
            out.setdefault(t["params"]["policies.solver.lr"], []).append(
                [{k: v for k, v in json.loads(line).items() if k not in TIMING and not k.startswith("mem/")}
                 for line in lines])
    return out


@pytest.mark.slow
def test_a_sweep_on_ray_survives_a_killed_worker_and_equals_the_workers_path(ray_cluster, tiny_ckpt, tmp_path):
    local = _cli("--json", "sweep", str(_sweep(tmp_path, tiny_ckpt, "local")), "--workers", "2", "--seed", "0")
    out, err = local.communicate(timeout=1800)
    assert local.returncode == 0, err[-2000:]
    on_ray = _cli("--json", "sweep", str(_sweep(tmp_path, tiny_ckpt, "ray")), "--ray", ray_cluster, "--seed", "0",
                  "--heartbeat", "2")
    _kill_a_run_mid_way(tmp_path / "ray" / "sw" / "trials" / "*", STEPS, on_ray)
    ray_out, err = on_ray.communicate(timeout=1800)
    assert on_ray.returncode == 0, err[-2000:]
    ray_result = json.loads(ray_out)
    a, b = _trials(json.loads(out)), _trials(ray_result)
    assert sum(map(len, b.values())) == 4  # complete trials, the killed one's retry among them
    # Optuna's grid sampler can give two concurrent workers the same point (on either path): every
    # point both paths ran computed the same, bit for bit, however often and wherever it ran
    common = set(a) & set(b)
    assert common, (sorted(a), sorted(b))
    for lr in common:
        assert all(run == a[lr][0] for run in a[lr] + b[lr]), lr
    failed = [t for t in ray_result["trials"] if t["state"] == "fail"]
    assert len(failed) <= 1 and all(t["run_dir"] for t in failed)  # the killed trial, its run directory kept
