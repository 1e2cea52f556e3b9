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
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["updated"] == ["solver"] for r in train)  # the parity reward gives a gradient
    assert all(r["replica_spread"] == 0.0 for r in train)  # both processes hold identical weights
    # rollouts were split: each process generated for 2 of the 4 problems, 4 samples each
    assert all(r["len/attempt"] is not None for r in train)


REPO = TESTS.parent
DDP = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
       "--dynamo_backend", "no"]
FSDP = ["--config_file", str(REPO / "registry" / "accelerate" / "fsdp.yaml"), "--num_processes", "2"]


def _launch(launcher, args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launcher, str(TESTS / "launch_cli.py"), "-q", *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]


def _fsdp_spec(tmp_path, ckpt, name):
    """π_ref (beta), π_old (2 epochs) and uneven micro-batches per process (64 tokens)."""
    d = yaml.safe_load(_spec(tmp_path, ckpt, name).read_text())
    d["output_dir"] = str(tmp_path / name)
    d["algorithm"]["params"].update(beta=0.05, epochs=2)
    # share_prompts off: a sharded model reads every row whole (update.LossConfig.logprobs), so DDP does too here
    d["train"].update(micro_batch_tokens=64, checkpoint_every=2, share_prompts=False)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _final(out, weights=lambda ckpt: _safetensors(ckpt / "solver" / "model.safetensors")):
    """(run dir, last checkpoint, ``weights(checkpoint)``, train records) of the one run under ``out``."""
    (run,) = out.iterdir()
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    return run, ckpt, weights(ckpt), train


def _safetensors(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _resume_before_last(run, last, into):
    """A copy of ``run`` under ``into`` without its ``last`` checkpoint, its status "running" (as
    if killed after the one before), resumed under FSDP."""
    import shutil

    into.mkdir()
    copy = into / run.name
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / last.name)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    _launch(FSDP, ["run", "--resume", str(copy)])


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_equals_ddp_and_resumes(tiny_ckpt, tmp_path):
    import torch

    _launch(DDP, ["run", str(_fsdp_spec(tmp_path, tiny_ckpt, "ddp"))])
    _launch(FSDP, ["run", str(_fsdp_spec(tmp_path, tiny_ckpt, "fsdp"))])
    _, ckpt_d, w_ddp, train_ddp = _final(tmp_path / "ddp")
    run, ckpt_f, w_fsdp, train_fsdp = _final(tmp_path / "fsdp")
    # the same rollouts (the gathered weights generate), the same losses, the same weights
    assert [r["reward_mean"] for r in train_fsdp] == [r["reward_mean"] for r in train_ddp]
    assert all(r["micro_batches/solver"] > 1 for r in train_fsdp)
    for a, b in zip(train_fsdp, train_ddp):
        for key in ("loss/solver", "kl/solver", "grad_norm/solver"):
            assert abs(a[key] - b[key]) < 1e-6, (key, a[key], b[key])
    assert w_fsdp.keys() == w_ddp.keys()  # the gathered checkpoint is an ordinary HF directory (tied head once)
    assert max(float((w_fsdp[k] - w_ddp[k]).abs().max()) for k in w_ddp) < 5e-5
    # the optimiser state was gathered into a plain optimizer.state_dict()
    from mlmt_bench.io.checkpoint_state import load_state

    opt_f = load_state(ckpt_f)["optimizers"]["solver"][0]
    opt_d = load_state(ckpt_d)["optimizers"]["solver"][0]
    assert opt_f["state"].keys() == opt_d["state"].keys() and opt_f["param_groups"] == opt_d["param_groups"]
    assert all(torch.allclose(opt_f["state"][i]["exp_avg_sq"], opt_d["state"][i]["exp_avg_sq"], rtol=1e-3, atol=1e-12)
               for i in opt_d["state"])

    # resume under FSDP from the step-2 checkpoint: the same final weights as the run that went through
    _resume_before_last(run, ckpt_f, tmp_path / "resumed")
    _, ckpt_r, w_res, train_res = _final(tmp_path / "resumed")
    assert ckpt_r.name == ckpt_f.name and [r["step"] for r in train_res] == [1, 2, 3]
    assert train_res[-1]["reward_mean"] == train_fsdp[-1]["reward_mean"]
    assert max(float((w_res[k] - w_fsdp[k]).abs().max()) for k in w_fsdp) < 1e-6


def _shared_base_spec(tmp_path, ckpt, name):
    """mlmt with solver and critic as two LoRA adapters on one tiny base (policies.share_base)."""
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    d = minimal_spec()
    d.update(name=name, output_dir=str(tmp_path / name), seed=3)
    d["policies"] = {"share_base": True,
                     "solver": {"model": "tiny", "path": str(ckpt), "lora": lora, "lr": 1e-2},
                     "critic": {"model": "tiny", "path": str(ckpt), "lora": lora, "lr": 5e-3}}
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 4, "verifier": "parity-test"}
    d["algorithm"] = {"name": "mlmt", "params": {"group_size": 2, "beta": 0.05, "epochs": 2}}
    d["backend"] = {"max_new_tokens": 8}
    d["train"] = {"steps": 3, "problems_per_step": 4, "threads": 1, "checkpoint_every": 2, "micro_batch_tokens": 64,
                  "share_prompts": False}  # as FSDP reads (update.LossConfig.logprobs): DDP compared like for like
    d["eval"] = {"every": 0}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _adapters(out):
    return _final(out, lambda ckpt: {r: _safetensors(ckpt / r / "adapter_model.safetensors")
                                     for r in ("solver", "critic")})


@pytest.mark.slow
def test_fsdp_shards_a_shared_base_once_equals_ddp_and_resumes(tiny_ckpt, tmp_path):
    """policies.share_base under FSDP: the one peft model (frozen base + both adapters) sharded
    once; both roles' updates, losses and adapter checkpoints equal the data-parallel run's."""
    _launch(DDP, ["run", str(_shared_base_spec(tmp_path, tiny_ckpt, "ddp"))])
    _launch(FSDP, ["run", str(_shared_base_spec(tmp_path, tiny_ckpt, "fsdp"))])
    _, _, w_ddp, train_ddp = _adapters(tmp_path / "ddp")
    run, ckpt_f, w_fsdp, train_fsdp = _adapters(tmp_path / "fsdp")
    assert [r["reward_mean"] for r in train_fsdp] == [r["reward_mean"] for r in train_ddp]
    assert any("critic" in r["updated"] for r in train_fsdp) and any("solver" in r["updated"] for r in train_fsdp)
    for a, b in zip(train_fsdp, train_ddp):
        for key in [k for k in b if k.startswith(("loss/", "grad_norm/"))]:
            assert abs(a[key] - b[key]) < 1e-6, (key, a[key], b[key])
    for role in ("solver", "critic"):  # each checkpoint is its adapter alone, in peft's saved names
        assert w_fsdp[role].keys() == w_ddp[role].keys()
        assert max(float((w_fsdp[role][k] - w_ddp[role][k]).abs().max()) for k in w_ddp[role]) < 5e-5, role
    _resume_before_last(run, ckpt_f, tmp_path / "resumed")
    _, ckpt_r, w_res, train_res = _adapters(tmp_path / "resumed")
    assert ckpt_r.name == ckpt_f.name and [r["step"] for r in train_res] == [1, 2, 3]
    for role in ("solver", "critic"):
        assert max(float((w_res[role][k] - w_fsdp[role][k]).abs().max()) for k in w_fsdp[role]) < 1e-6, role


def test_one_process_reduces_statistics_and_rows_to_themselves():
    """Dist.mean_each and Dist.cat_rows without processes to join (their two-process behaviour:
    the shared-base DDP/FSDP test, whose ranks report different statistics and refinements)."""
    import torch

    from mlmt_bench.machine.dist import Dist

    d = Dist(from_env=False)
    assert d.mean_each({"b": 2, "a": None, "c": 0.5}) == {"b": 2.0, "c": 0.5}
    assert list(d.mean_each({"b": 2, "c": 0.5})) == ["b", "c"]
    rows = torch.arange(6.0).reshape(3, 2)
    assert d.cat_rows(rows) is rows and d.cat_rows(None) is None


def test_importing_the_update_and_the_trainer_joins_no_processes():
    """No Dist is built at import time: under a launcher's WORLD_SIZE, without its rendezvous, the
    modules still import (a Dist built then would try to join the other processes)."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    env.pop("MASTER_ADDR", None)
    code = "import mlmt_bench.algorithms.update, mlmt_bench.trainer; print('imported')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr[-2000:]


def test_a_run_builds_one_dist_and_its_trainer_uses_it(tiny_ckpt, tmp_path, monkeypatch):
    from mlmt_bench import runner
    from mlmt_bench.machine import dist as dist_module
    from mlmt_bench.spec import validate_run

    built, trainers = [], []
    init = dist_module.Dist.__init__

    def counting_init(self, **kw):
        built.append(self)
        init(self, **kw)

    def spy(*args, **kwargs):
        trainers.append(make_trainer(*args, **kwargs))
        return trainers[-1]

    make_trainer = runner.make_trainer
    monkeypatch.setattr(dist_module.Dist, "__init__", counting_init)
    monkeypatch.setattr(runner, "make_trainer", spy)
    d = minimal_spec(output_dir=str(tmp_path / "runs"), policies={"solver": {"model": "tiny", "path": str(tiny_ckpt)}},
                     backend={"max_new_tokens": 2}, train={"steps": 0, "threads": 1},
                     eval={"limit": 1, "feedback_metrics": False, "samples": 0})
    runner.run(validate_run(d, "test"), progress=False)
    assert len(built) == 1 and len(trainers) == 1
    assert trainers[0].dist is built[0] and trainers[0].sharding.dist is built[0]
