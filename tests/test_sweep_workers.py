"""`mlmt-bench sweep --workers N`: real worker processes, real tiny runs, real storages.

The PostgreSQL test starts a throw-away server (``initdb`` + ``postgres`` on a free loopback
port, in a temporary directory, as an unprivileged user when the tests run as root) and SIGKILLs
one worker in the middle of a trial.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import minimal_spec
from support import require

REPO = Path(__file__).resolve().parents[1]
LR = "policies.solver.lr"


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))  # Debian's package
    return str(versions[-1]) if versions else None


POSTGRES, INITDB = _pg_bin("postgres"), _pg_bin("initdb")


def real_sweep(tmp_path: Path, ckpt: Path, *, n_trials: int, steps: int, metric: str = "acc@t2") -> Path:
    """A sweep of tiny GRPO runs (one thread each) over the solver's learning rate."""
    spec = minimal_spec(output_dir=str(tmp_path / "runs"), policies={"solver": {"model": "tiny", "path": str(ckpt)}},
                        algorithm={"name": "grpo", "params": {"group_size": 2}},
                        train={"steps": steps, "problems_per_step": 1, "threads": 1},
                        eval={"every": steps // 2, "limit": 2, "samples": 0, "feedback_metrics": False},
                        backend={"max_new_tokens": 4})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "run": "run.yaml", "n_trials": n_trials, "sampler": "random",
                                    "metric": metric,
                                    "pruner": "none", "space": {LR: {"type": "float", "low": 1e-5, "high": 1e-3,
                                                                     "log": True}}}))
    return path


def sweep_cmd(path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "mlmt_bench.cli", "sweep", str(path), "--seed", "0", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def run_dirs(trials_dir: Path) -> dict[int, Path]:
    """trial number -> its run directory; a number claimed by two directories fails the test."""
    found: dict[int, Path] = {}
    for manifest in trials_dir.glob("*/manifest.json"):
        n = json.loads(manifest.read_text())["trial"]
        assert n not in found, f"trial {n} has two run directories: {found[n]}, {manifest.parent}"
        found[n] = manifest.parent
    return found


def assert_intact(run_dir: Path) -> None:
    """A finished trial's run directory: manifest completed, every metrics line JSON, a final record."""
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "final"
    assert (run_dir / "spec.resolved.yaml").is_file()


@pytest.mark.slow
def test_two_workers_share_a_sqlite_study(tmp_path, tiny_ckpt):
    path = real_sweep(tmp_path, tiny_ckpt, n_trials=4, steps=40)
    t0 = time.monotonic()
    res = subprocess.run(sweep_cmd(path, "--workers", "2"), capture_output=True, text=True, env=env(), cwd=tmp_path,
                         timeout=600)
    print(f"wall {time.monotonic() - t0:.1f} s\n{res.stderr}")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "runs" / "w"
    with sqlite3.connect(out / "w.db") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = con.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
        lrs = [v for (v,) in con.execute("SELECT param_value FROM trial_params")]
    assert rows == [(n, "COMPLETE") for n in range(4)]
    assert len(set(lrs)) == 4  # each worker samples with its own seed
    dirs = run_dirs(out / "trials")
    assert sorted(dirs) == [0, 1, 2, 3]
    for d in dirs.values():
        assert_intact(d)
    pids = {json.loads((d / "manifest.json").read_text())["pid"] for d in dirs.values()}
    assert len(pids) == 2  # two worker processes ran trials, neither is this command's process
    assert {p.name for p in (out / "logs").iterdir()} == {"w-w0.log", "w-w1.log"}
    # per-trial progress (stderr is not a terminal: plain lines)
    for n in range(4):
        assert f"trial {n} started (worker " in res.stderr and f"trial {n} complete: acc@t2 " in res.stderr
    assert "best: trial" in res.stdout and (out / "w-best.yaml").is_file()


@pytest.mark.slow
def test_bad_input_in_a_worker_stops_them_all(tmp_path, tiny_ckpt):
    """A metric the runs do not log: the first worker to evaluate reports it, the command ends
    with one error line and exit code 2, and no trial is left running."""
    path = real_sweep(tmp_path, tiny_ckpt, n_trials=4, steps=40, metric="acc@t9")
    res = subprocess.run(sweep_cmd(path, "--workers", "2"), capture_output=True, text=True, env=env(), cwd=tmp_path,
                         timeout=600)
    assert res.returncode == 2, res.stderr
    last = res.stderr.splitlines()[-1]
    assert last.startswith(f"error: {path}: metric: 'acc@t9' is not a number in this run's evaluations")
    assert "Traceback" not in res.stderr
    with sqlite3.connect(tmp_path / "runs" / "w" / "w.db") as con:
        states = dict(con.execute("SELECT state, count(*) FROM trials GROUP BY state").fetchall())
    assert states.get("FAIL", 0) >= 1 and set(states) == {"FAIL"}, states


# ----------------------------------------------------------------------------------------------
# PostgreSQL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    """A PostgreSQL server of its own: ``postgresql+psycopg2://optuna@127.0.0.1:PORT/postgres``."""
    require(POSTGRES is not None and INITDB is not None, "the PostgreSQL server (postgres, initdb)")
    import psycopg2  # the `postgres` extra; its absence is a failure, not a skip

    root = Path(tempfile.mkdtemp(prefix="mlmt-pg-"))
    as_user: dict = {}
    if os.geteuid() == 0:  # postgres refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            user = pwd.getpwnam("nobody")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    data, log = root / "data", root / "server.log"
    subprocess.run([INITDB, "-D", str(data), "-U", "optuna", "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True, cwd=root, **as_user)
    port = _free_port()
    with open(log, "wb") as f:
        server = subprocess.Popen([POSTGRES, "-D", str(data), "-p", str(port), "-k", str(root),
                                   "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                                  stdout=f, stderr=f, cwd=root, **as_user)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg2.connect(host="127.0.0.1", port=port, user="optuna", dbname="postgres").close()
                break
            except psycopg2.OperationalError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield f"postgresql+psycopg2://optuna@127.0.0.1:{port}/postgres"
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(root, ignore_errors=True)


def _trial_in_training(trials_dir: Path) -> dict | None:
    """The manifest of a running trial that has logged a training step (mid-trial), if any."""
    for manifest in trials_dir.glob("*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
            lines = (manifest.parent / "metrics.jsonl").read_text().splitlines()
        except (OSError, ValueError):
            continue
        if m.get("status") == "running" and any('"kind": "train"' in line for line in lines):
            return m
    return None


@pytest.mark.slow
def test_postgres_study_survives_a_killed_worker(tmp_path, tiny_ckpt, postgres_url):
    """Two workers on one PostgreSQL study; one is SIGKILLed mid-trial. The study still ends with
    its 3 trials; the killed trial is failed and retried once with its parameters; no trial
    number is used twice; every finished trial's run directory is intact."""
    import optuna

    path = real_sweep(tmp_path, tiny_ckpt, n_trials=3, steps=80)
    trials_dir = tmp_path / "runs" / "w" / "trials"
    t0 = time.monotonic()
    proc = subprocess.Popen(sweep_cmd(path, "--workers", "2", "--storage", postgres_url, "--heartbeat", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path)
    try:
        victim = None
        while victim is None:
            assert proc.poll() is None and time.monotonic() - t0 < 300, proc.communicate()
            victim = _trial_in_training(trials_dir)
            time.sleep(0.05)
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic() - t0
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    wall = time.monotonic() - t0
    print(f"killed worker pid {victim['pid']} in trial {victim['trial']} at {killed_at:.1f} s; "
          f"wall {wall:.1f} s\n{err}")
    assert proc.returncode == 0, err
    assert f"(pid {victim['pid']}) was killed by SIGKILL during trial {victim['trial']}" in err

    study = optuna.load_study(study_name="w", storage=postgres_url)
    trials = study.get_trials()
    states = Counter(t.state.name for t in trials)
    print("trials by state:", dict(states))
    assert states == {"COMPLETE": 3, "FAIL": 1}
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials)))  # each number once
    killed = trials[numbers.index(victim["trial"])]
    assert killed.state.name == "FAIL"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].params == killed.params

    dirs = run_dirs(trials_dir)
    assert sorted(dirs) == numbers  # one run directory per trial number
    for t in trials:
        if t.state.name == "COMPLETE":
            assert_intact(dirs[t.number])
    dead = json.loads((dirs[killed.number] / "manifest.json").read_text())
    assert dead["status"] == "failed" and "heartbeats" in dead["error"]
    assert f"trial {retries[0].number} retries trial {killed.number}" in out
