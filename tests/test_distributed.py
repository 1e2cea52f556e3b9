"""The GRPO trainer under `accelerate launch --cpu --num_processes 2` (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import minimal_spec

TESTS = Path(__file__).resolve().parent


def _spec(tmp_path, ckpt, name):
    d = minimal_spec()
    d.update(name=name, output_dir=str(tmp_path / "runs"), seed=3)
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt), "lr": 3e-3}}
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 4, "verifier": "parity-test"}
    d["algorithm"] = {"name": "grpo", "params": {"group_size": 4}}
    d["backend"] = {"max_new_tokens": 10}
    d["train"] = {"steps": 3, "problems_per_step": 4, "threads": 1}
    d["eval"] = {"every": 0}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.slow
def test_two_cpu_processes_keep_identical_weights(tiny_ckpt, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    # accelerate's `--cpu` launcher needs MPI for more than one process; its torchrun launcher
    # (`--multi_gpu`) starts the two processes, and with no GPU present they join over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(TESTS / "launch_cli.py"), "-q", "run", str(_spec(tmp_path, tiny_ckpt, "ddp"))]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()  # one process wrote one run directory
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["status"] == "completed"
    train = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in l]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["updated"] == ["solver"] for r in train)  # the parity reward gives a gradient
    assert all(r["replica_spread"] == 0.0 for r in train)  # both processes hold identical weights
    # rollouts were split: each process generated for 2 of the 4 problems, 4 samples each
    assert all(r["len/attempt"] is not None for r in train)
