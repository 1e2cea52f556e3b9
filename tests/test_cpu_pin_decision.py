"""Where the CPU pin applies (issue 32): tiny models need it, pretrained models do not; OpenMP's
spinning wait is off on a busy machine; the CPU matmul dtype (``train.cpu_dtype``) and its detection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlmt_bench import runner
from mlmt_bench.errors import UserError
from mlmt_bench.machine import cpus, reproducible
from mlmt_bench.spec import RunSpec, dump_yaml, load_any

REPO = Path(__file__).resolve().parents[1]
HF = {"model": "hf", "path": "smollm2-135m-instruct", "lora": {"r": 4}}


def _spec(solver: dict, critic: dict | None = None, algorithm: str = "grpo", **train) -> RunSpec:
    return RunSpec.model_validate({"name": "t", "benchmark": {"name": "gsm8k"},
                                   "policies": {"solver": solver, **({"critic": critic} if critic else {})},
                                   "algorithm": {"name": algorithm}, "train": train})


def _clean_env(**extra: str) -> dict[str, str]:
    drop = {*reproducible.PIN, reproducible.SWITCH, reproducible.NOT_NEEDED, "OMP_WAIT_POLICY"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)


def test_a_run_needs_the_pin_when_some_model_is_made_from_a_seed():
    assert runner.needs_cpu_pin(_spec({"model": "tiny"}))
    assert runner.needs_cpu_pin(_spec({"model": "tiny", "path": "/some/tiny/checkpoint"}))
    assert not runner.needs_cpu_pin(_spec(HF))
    assert not runner.needs_cpu_pin(_spec({"model": "hf", "path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    assert runner.needs_cpu_pin(_spec(HF, {"model": "tiny"}, algorithm="mlmt"))  # a tiny critic: pinned


# what the child prints: the pin variables, the reason variable, and what record() says
_SHOW = ("import os, json\n"
         "from mlmt_bench.machine import reproducible\n"
         "r = reproducible.record()\n"
         "print(json.dumps([os.environ.get('ATEN_CPU_CAPABILITY'), os.environ.get('MKL_CBWR'), "
         "r['pinned'], r['unpinned_because'], r['cpu_capability']]))\n")


def test_a_process_that_needs_no_pin_stays_unpinned_and_records_why():
    code = ("import sys\nfrom mlmt_bench.machine import reproducible\n"
            "reproducible.apply(needed=False, why_not='every model loads from a checkpoint')\n"
            "assert 'torch' not in sys.modules\n" + _SHOW)
    proc = _python(code, _clean_env())
    assert proc.returncode == 0, proc.stderr
    aten, mkl, pinned, why, _ = json.loads(proc.stdout)
    assert (aten, mkl, pinned) == (None, None, False) and not proc.stderr
    assert why == "not needed: every model loads from a checkpoint"
    # forced: pinned anyway, and one line says so
    proc = _python(code, _clean_env(MLMT_BENCH_CPU_PIN="1"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[:4] == ["avx2", "COMPATIBLE", True, None]
    assert len(proc.stderr.splitlines()) == 1 and "the CPU pin is on (MLMT_BENCH_CPU_PIN=1)" in proc.stderr
    # the default (needed) still pins, as before
    proc = _python("from mlmt_bench.machine import reproducible\nreproducible.apply()\n" + _SHOW, _clean_env())
    assert json.loads(proc.stdout)[:4] == ["avx2", "COMPATIBLE", True, None] and not proc.stderr


def test_a_needed_pin_clears_an_inherited_reason_and_children_get_what_the_parent_has(monkeypatch):
    monkeypatch.delenv(reproducible.SWITCH, raising=False)
    for k in reproducible.PIN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(reproducible.NOT_NEEDED, "pretrained")
    assert reproducible.child_env() == {reproducible.NOT_NEEDED: "pretrained"}
    monkeypatch.setenv(reproducible.SWITCH, "0")
    assert reproducible.child_env() == {reproducible.SWITCH: "0"}
    monkeypatch.delenv(reproducible.NOT_NEEDED)
    monkeypatch.delenv(reproducible.SWITCH)
    assert reproducible.child_env() == reproducible.PIN
    assert reproducible.forced({"MLMT_BENCH_CPU_PIN": "on"}) and not reproducible.forced({})
    assert not reproducible.forced({"MLMT_BENCH_CPU_PIN": "0"})


def _decide(args: str, env: dict[str, str]) -> list:
    """The CLI's decision for ``run`` (``cli._apply_cpu_pin``) in a fresh process, before torch loads."""
    code = ("import sys\nfrom pathlib import Path\nfrom mlmt_bench import cli, spec\n" + args +
            "assert 'torch' not in sys.modules\n" + _SHOW)
    proc = _python(code, env)
    assert proc.returncode == 0, proc.stderr
    return [*json.loads(proc.stdout)[:4], proc.stderr]


def test_the_cli_pins_a_tiny_run_and_not_a_pretrained_one(tmp_path):
    for name, policies in (("tiny", {"solver": {"model": "tiny"}}), ("hf", {"solver": HF}),
                           ("mixed", {"solver": HF, "critic": {"model": "tiny"}})):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "benchmark": {"name": "gsm8k"}, "policies": policies,
            "algorithm": {"name": "mlmt" if name == "mixed" else "grpo"}}))
    load = "cli._apply_cpu_pin(spec.load_any(Path({!r}), []), None)\n"
    assert _decide(load.format(str(tmp_path / "tiny.yaml")), _clean_env()) == ["avx2", "COMPATIBLE", True, None, ""]
    aten, mkl, pinned, why, err = _decide(load.format(str(tmp_path / "hf.yaml")), _clean_env())
    assert (aten, mkl, pinned, err) == (None, None, False, "")
    assert why == "not needed: every model of this run loads pretrained weights from a checkpoint"
    *state, err = _decide(load.format(str(tmp_path / "mixed.yaml")), _clean_env())
    assert state == ["avx2", "COMPATIBLE", True, None] and "pretrained models included" in err
    # a resumed run keeps what its manifest recorded; an unreadable one is pinned
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"environment": {"unpinned_because": "not needed: pretrained"}}))
    resume = "cli._apply_cpu_pin(None, Path({!r}))\n"
    assert _decide(resume.format(str(run)), _clean_env())[:4] == [None, None, False, "not needed: pretrained"]
    (run / "manifest.json").write_text(json.dumps({"environment": {"pinned": True, "unpinned_because": None}}))
    assert _decide(resume.format(str(run)), _clean_env())[:4] == ["avx2", "COMPATIBLE", True, None]
    assert _decide(resume.format(str(tmp_path / "absent")), _clean_env())[:4] == ["avx2", "COMPATIBLE", True, None]


def test_openmp_waits_passively_only_on_a_busy_machine():
    # 2 CPUs, 2 threads: idle background load (0.3) is not busy; another job running (1.0) is
    assert not cpus.oversubscribed(0.3, 2, 2) and cpus.oversubscribed(1.0, 2, 2)
    assert not cpus.oversubscribed(40.0, 8, 64) and cpus.oversubscribed(57.0, 8, 64)
    env: dict[str, str] = {}
    assert cpus.passive_wait_when_busy(env, load=0.2, cpus=2) is None and env == {}
    assert cpus.passive_wait_when_busy(env, load=3.0, cpus=2) == "load average 3.00 on 2 CPUs"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for var in cpus.WAIT_VARIABLES:  # the user's own setting is left alone
        mine = {var: "ACTIVE" if var == "OMP_WAIT_POLICY" else "1000"}
        assert cpus.passive_wait_when_busy(mine, load=3.0, cpus=2) is None and len(mine) == 1


CPUINFO = """processor\t: 0
model name\t: {model}
flags\t\t: fpu sse2 avx2 {extra}
processor\t: 1
flags\t\t: fpu sse2 avx2 {extra}
"""


def test_bf16_instructions_are_read_from_the_cpu_flags():
    assert cpus.bf16_instructions(CPUINFO.format(model="Xeon", extra="avx512f avx512_bf16 amx_tile amx_bf16")) == [
        "amx_bf16", "avx512_bf16"]
    assert cpus.bf16_instructions(CPUINFO.format(model="EPYC", extra="avx512f avx512_bf16")) == ["avx512_bf16"]
    assert cpus.bf16_instructions(CPUINFO.format(model="old", extra="avx512f avx512_vnni")) == []
    assert cpus.bf16_instructions("") == []


@pytest.mark.parametrize(("setting", "bf16", "pinned_run", "dtype"), [
    ("auto", ["avx512_bf16"], False, "bfloat16"),  # a pretrained model on a CPU with bf16 instructions
    ("auto", ["avx512_bf16"], True, "float32"),    # tiny models stay bit-identical
    ("auto", [], False, "float32"),                # bf16 emulated: no gain
    ("float32", ["amx_bf16"], False, "float32"),
    ("bfloat16", [], True, "bfloat16"),
])
def test_the_cpu_dtype_resolves_from_the_setting_the_cpu_and_the_pin(setting, bf16, pinned_run, dtype):
    assert cpus.resolve_cpu_dtype(setting, bf16, pinned_run) == dtype


def test_cpu_dtype_is_a_spec_field_left_out_of_dumps_at_its_default(tmp_path):
    assert "cpu_dtype" not in dump_yaml(_spec(HF))
    dumped = yaml.safe_load(dump_yaml(_spec(HF, cpu_dtype="bfloat16")))
    assert dumped["train"]["cpu_dtype"] == "bfloat16"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "benchmark": {"name": "gsm8k"}, "policies": {"solver": HF},
                                    "algorithm": {"name": "grpo"}, "train": {"cpu_dtype": "float16"}}))
    with pytest.raises(UserError, match="cpu_dtype"):
        load_any(path, [])


def test_cpu_autocast_runs_cpu_matmuls_in_bfloat16_only_where_resolved(monkeypatch):
    import torch

    monkeypatch.setattr(cpus, "bf16_instructions", lambda cpuinfo=None: ["avx512_bf16"])
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with runner.cpu_autocast(_spec(HF)):
        assert (a @ b).dtype == torch.bfloat16
    with runner.cpu_autocast(_spec({"model": "tiny"})):
        assert (a @ b).dtype == torch.float32
    with runner.cpu_autocast(_spec(HF, cpu_dtype="float32")):
        assert (a @ b).dtype == torch.float32
    assert runner.cpu_dtype(_spec(HF)) == {"setting": "auto", "dtype": "bfloat16", "bf16_instructions": ["avx512_bf16"]}
    monkeypatch.setattr(cpus, "bf16_instructions", lambda cpuinfo=None: [])
    assert runner.cpu_dtype(_spec(HF))["dtype"] == "float32"
