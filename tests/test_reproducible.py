"""The CPU pin (mlmt_bench.machine.reproducible): the same base weights whatever CPU capability the
environment claims, weight hashes in a canonical order, and experiments that refuse a run whose
base weights differ from the experiment's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlmt_bench.errors import UserError
from mlmt_bench.machine import reproducible
from support import TINY

REPO = Path(__file__).resolve().parents[1]
#: Two machines as the environment describes them: this one as it is, and one that offers torch
#: no vector kernels and asks MKL for its AVX2 branch.
NATIVE: dict[str, str] = {}
OTHER = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2"}


def _env(claims: dict[str, str], pin: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {**reproducible.PIN, reproducible.SWITCH: ""}}
    return {**env, **claims, **({} if pin else {reproducible.SWITCH: "0"}), **extra}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)


def test_the_cli_builds_the_same_base_whatever_capability_the_machine_claims_unless_unpinned(tmp_path):
    """`mlmt-bench base` (the console entry point: the pin is applied before torch loads) under
    two capability settings: one sha256 with the pin, two without it (so the test can fail)."""
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "benchmark": {"name": "synthetic-arith"},
                                    "policies": {"solver": {"model": "tiny"}}, "algorithm": {"name": "grpo"},
                                    "base": TINY}))
    cases = {(pin, name): claims for pin in (True, False) for name, claims in (("native", NATIVE), ("other", OTHER))}
    procs = {}
    for i, ((pin, name), claims) in enumerate(cases.items()):
        env = _env(claims, pin, MLMT_BENCH_CACHE=str(tmp_path / f"cache{i}"))
        procs[pin, name] = subprocess.Popen([sys.executable, "-m", "mlmt_bench.cli", "--json", "base", str(spec)],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                            cwd=REPO)
    bases = {}
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        (bases[case],) = json.loads(out)
    pinned = [bases[True, n] for n in ("native", "other")]
    unpinned = [bases[False, n] for n in ("native", "other")]
    for b in pinned:
        env = b["environment"]
        assert env["pinned"] and env["unpinned_because"] is None, env
        assert env["pin"] == reproducible.PIN and env["cpu_capability"] == "AVX2"
        assert env["mkl_cbwr_branch"] == "COMPATIBLE" and env["cpu"] and env["versions"]["torch"]
    assert pinned[0]["sha256"] == pinned[1]["sha256"] and len(pinned[0]["sha256"]) == 64
    assert pinned[0]["key"] == pinned[1]["key"]  # the claimed capability is not in the key, the pin is:
    # an unpinned build never passes for a pinned one
    assert unpinned[0]["key"] == unpinned[1]["key"] != pinned[0]["key"]
    assert [b["environment"]["pinned"] for b in unpinned] == [False, False]
    assert "MLMT_BENCH_CPU_PIN=0" in unpinned[0]["environment"]["unpinned_because"]
    assert unpinned[1]["environment"]["cpu_capability"] == "DEFAULT"
    assert unpinned[0]["sha256"] != unpinned[1]["sha256"]  # what the pin is for
    # the recorded hash is the hash of the saved tensors
    assert reproducible.weights_sha256(Path(pinned[0]["path"]) / "model") == pinned[0]["sha256"]


def test_a_process_that_loaded_torch_first_re_executes_itself_once_pinned():
    code = ("import os, sys, torch\n"
            "from mlmt_bench.machine import reproducible\n"
            "sys.stdout.write('start\\n')\n"
            "reproducible.apply()\n"
            "import multiprocessing as mp\n"
            "child = mp.get_context('spawn').Pool(1).apply(os.getenv, ('MKL_CBWR',))\n"
            "r = reproducible.record()\n"
            "print(os.environ['ATEN_CPU_CAPABILITY'], os.environ['MKL_CBWR'], r['pinned'], r['mkl_cbwr_branch'],"
            " r['cpu_capability'], child, 'MLMT_BENCH_CPU_PIN_REEXEC' in os.environ)\n")
    proc = _python(code, _env(OTHER, pin=True))
    assert proc.returncode == 0, proc.stderr
    # printed "start" twice: before the re-exec and in the re-executed process; a spawned child inherits the pin
    assert proc.stdout.split("\n") == ["start", "start", "avx2 COMPATIBLE True COMPATIBLE AVX2 COMPATIBLE False", ""]


def test_no_second_re_exec_and_the_switch_is_recorded():
    code = ("import torch\n"
            "from mlmt_bench.machine import reproducible\n"
            "reproducible.apply()\n"
            "r = reproducible.record()\n"
            "print(r['pinned'], '|', r['unpinned_because'], '|', r['cpu_capability'])\n")
    # as if a re-executed process still found torch loaded before the pin: it goes on, says so, unpinned
    proc = _python(code, _env(OTHER, pin=True, MLMT_BENCH_CPU_PIN_REEXEC="1"))
    assert proc.returncode == 0 and "could not be applied" in proc.stderr
    assert proc.stdout == ("False | not set before torch loaded: ATEN_CPU_CAPABILITY=default, MKL_CBWR=AVX2 | "
                           "DEFAULT\n")
    proc = _python(code, _env(OTHER, pin=False))
    assert proc.stdout == "False | MLMT_BENCH_CPU_PIN=0 | DEFAULT\n" and not proc.stderr
    assert reproducible.enabled({}) and not reproducible.enabled({"MLMT_BENCH_CPU_PIN": "off"})
    assert reproducible.pinned_env({"MLMT_BENCH_CPU_PIN": "0", "MKL_CBWR": "AVX2"})["MKL_CBWR"] == "AVX2"
    assert reproducible.pinned_env({"MKL_CBWR": "AVX2"})["MKL_CBWR"] == "COMPATIBLE"


def test_weight_hash_is_of_the_tensors_not_the_file(tmp_path):
    import hashlib

    import torch
    from safetensors.torch import save_file

    a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor(1.5)
    save_file({"a": a, "b": b}, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    other = tmp_path / "other"
    other.mkdir()
    save_file({"b": b, "a": a}, str(other / "model.safetensors"), metadata={"note": "another header"})
    assert (tmp_path / "x.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    # by hand: name, dtype, shape, then the little-endian float32 bytes, in sorted name order
    h = hashlib.sha256()
    h.update(b"a\0float32\0(2, 3)\0" + a.numpy().tobytes())
    h.update(b"b\0float32\0()\0" + b.numpy().tobytes())
    assert reproducible.weights_sha256(tmp_path) == reproducible.weights_sha256(other) == h.hexdigest()
    flipped = a.clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # one bit of one weight
    assert reproducible.tensors_sha256({"a": flipped, "b": b}) != h.hexdigest()
    assert reproducible.tensors_sha256({"c": a, "b": b}) != h.hexdigest()  # names count
    with pytest.raises(FileNotFoundError):
        reproducible.weights_sha256(tmp_path / "nothing")


# --------------------------------------------------------------------------- experiments


def _experiment(tmp_path, write_spec):
    from mlmt_bench.spec import load_experiment

    base = {"name": "b", "benchmark": {"name": "synthetic-arith", "eval_limit": 4},
            "policies": {"solver": {"model": "tiny"}}, "algorithm": {"name": "grpo", "params": {"group_size": 2}},
            "train": {"steps": 1, "problems_per_step": 2}, "base": {**TINY, "seed": None}}
    exp = {"name": "exp", "base": base, "seeds": [0, 1], "budget": "none", "output_dir": str(tmp_path / "runs"),
           "arms": {"a": {}}}
    return load_experiment(write_spec(exp, "exp.yaml"))


def _fake_runs(monkeypatch, sha_of_seed):
    """Runs that only write their spec and a manifest naming their base (key from the spec,
    sha256 by seed)."""
    import mlmt_bench.experiment as experiment
    from mlmt_bench import runner
    from mlmt_bench.spec import RunSpec, dump_yaml

    def run_job(job, exp_name, progress):
        spec = RunSpec.model_validate_json(job.spec_json)
        run_dir = Path(spec.output_dir) / f"{spec.name}-run"
        run_dir.mkdir(parents=True)
        (run_dir / "spec.resolved.yaml").write_text(dump_yaml(spec))
        cfg = runner.base_config(spec)
        base = {"key": cfg.key(), "sha256": sha_of_seed[job.seed], "seed": cfg.seed,
                "preset": "tiny-0.5m", "environment": {"cpu": f"cpu{job.seed}", "pinned": True}}
        (run_dir / "manifest.json").write_text(json.dumps({"experiment": exp_name, "arm": job.arm, "seed": job.seed,
                                                           "status": "completed", "base": base}))
        return run_dir.name, 0.0

    monkeypatch.setattr(experiment, "_run_job", run_job)


def test_a_run_whose_base_weights_differ_does_not_join_the_experiment(tmp_path, write_spec, monkeypatch):
    """Seeds 0 and 1 of one base config (seed pinned in base:, so one key): the second run's
    base has other weights (as if built on another machine) and is refused; the experiment
    keeps the first run and the hash it recorded."""
    from mlmt_bench.experiment import run_experiment

    exp, arms = _experiment(tmp_path, write_spec)
    arms = {a: s.model_copy(update={"base": {**s.base, "seed": 0}}) for a, s in arms.items()}
    _fake_runs(monkeypatch, {0: "a" * 64, 1: "b" * 64})
    with pytest.raises(UserError, match=r"run exp-a-s1-run \(a, seed 1\) started from base .* sha256 bbbbbbbbbbbbbbbb "
                                        r".*cpu1.* the experiment's runs of that base have aaaaaaaaaaaaaaaa") as err:
        run_experiment(exp, arms, progress=False)
    assert "\n" not in str(err.value)
    (exp_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((exp_dir / "experiment.json").read_text())
    assert record["arms"]["a"] == ["exp-a-s0-run"]
    assert list(record["bases"].values()) == [{"sha256": "a" * 64, "seed": 0, "preset": "tiny-0.5m", "cpu": "cpu0",
                                                "pinned": True}]

    # resuming: the refused run's directory is a finished run of the experiment with other weights
    with pytest.raises(UserError, match=r"--resume .*: run exp-a-s1-run .* does not join the experiment"):
        run_experiment(exp, arms, progress=False, resume=exp_dir)


def test_resume_refuses_a_cached_base_with_other_weights_before_any_run(tmp_path, write_spec, monkeypatch):
    """Resuming on a machine whose cache holds the experiment's base with other weights: refused
    before any run starts."""
    from mlmt_bench import runner
    from mlmt_bench.experiment import run_experiment
    from mlmt_bench.warmstart.shared_base import ensure_base

    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    exp, arms = _experiment(tmp_path, write_spec)
    exp.seeds = [1]
    cfg = runner.base_config(arms["a"].model_copy(update={"seed": 1}))
    exp_dir = tmp_path / "runs" / "exp-1"
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(json.dumps({  # the first machine's base of seed 1 had other weights
        "name": "exp", "seeds": [1], "arms": {"a": []}, "wall_s": {}, "bases": {cfg.key(): {"sha256": "c" * 64}}}))
    built = ensure_base(cfg, progress=False, require_valid=False)  # this machine's
    assert built.summary()["sha256"] not in ("c" * 64, None)

    def no_run(*a, **k):
        raise AssertionError("a run started")

    monkeypatch.setattr("mlmt_bench.experiment._run_job", no_run)
    with pytest.raises(UserError, match=rf"run \(not started\) exp-a-s1 \(a, seed 1\) started from base {cfg.key()} .*"
                                        r"have cccccccccccccccc"):
        run_experiment(exp, arms, progress=False, resume=exp_dir)
