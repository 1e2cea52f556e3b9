"""Warm start: config validation, training data, caching, determinism, evaluation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

import mlmt_bench.models.bootstrap as bootstrap
from mlmt_bench.models.bootstrap import (
    BootstrapConfig,
    Misconceptions,
    ensure_bootstrap,
    evaluate_bootstrap,
)

#: A few steps of everything, on a small benchmark: seconds, not minutes.
TINY = dict(
    benchmark_options={"n_train": 200, "n_validation": 20, "n_test": 20},
    solver_steps=6, solver_batch=4, critic_steps=3, critic_batch=4,
    onpolicy_start=0.5, pool_size=8, pool_every=2, threads=1,
)


def _weights(directory: Path) -> bytes:
    return (directory / "model.safetensors").read_bytes()


def test_config_validation():
    with pytest.raises(ValidationError, match="extra"):
        BootstrapConfig(solver_stepz=3)
    with pytest.raises(ValidationError, match="at most 1"):
        BootstrapConfig(refine_frac=0.8, solver_critique_frac=0.3)
    with pytest.raises(ValidationError, match="JSON"):
        BootstrapConfig(benchmark_options={"x": object()})
    cfg = BootstrapConfig()
    assert cfg.key() == BootstrapConfig.model_validate(json.loads(cfg.model_dump_json())).key()
    assert len(cfg.key()) == 16
    assert cfg.key() != BootstrapConfig(seed=1).key()
    assert cfg.key() == BootstrapConfig(threads=1).key()  # speed only


def test_misconceptions():
    truth = Misconceptions(0.0, 0, "+-", 9)
    assert truth.wrong == {} and truth.op(98, "+", 5, 100) == 3
    m = Misconceptions(0.3, 0, "+-", 9)
    assert len(m.wrong) == 5 and m.wrong == Misconceptions(0.3, 0, "+-", 9).wrong
    (op, b), _ = next(iter(m.wrong.items()))
    assert m.op(10, op, b, 100) == (10 + b + 1 if op == "+" else 10 - b + 1) % 100


def test_training_examples_train_exactly_the_assistant_turns():
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    cfg = BootstrapConfig(**{**TINY, "feedback_token_weight": 1.0, "critic_token_weight": 1.0})
    bench = bootstrap._benchmark(cfg)
    tok = build_char_tokenizer()
    data = bootstrap._Data(cfg, bench, tok)
    rng = random.Random(0)
    eos = tok.eos_token_id
    for make in (data.solver_turn1, data.solver_refine, data.critic):
        for _ in range(20):
            ids, spans = make(rng)
            for start, end, w in spans:
                assert w == 1.0 and ids[end - 1] == eos
                assert tok.convert_ids_to_tokens(ids[start - 1]) == "<|assistant|>"
            # The last assistant turn is always trained.
            assert spans[-1][1] == len(ids)
    # Up-weighted tokens: the corrected value the feedback dictates.
    cfg = BootstrapConfig(**{**TINY, "feedback_token_weight": 4.0, "refine_correct_frac": 0.0,
                             "null_feedback_frac": 0.0})
    data = bootstrap._Data(cfg, bench, tok)
    ids, spans = data.solver_refine(rng)
    start, end, w = spans[-1]
    assert w == 4.0 and 0 < end - start <= 2 and tok.decode(ids[start:end]).isdigit()
    # ... and the critic's decisions: each verdict's first character and the computed values.
    ids, spans = data.critic(rng)
    fb = tok.decode(ids[spans[0][0]:spans[0][1] - 1])
    weighted = [tok.decode(ids[a:b]) for a, b, w in spans[1:]]
    assert all(w == 3.0 for _, _, w in spans[1:]) and weighted == [fb[a:b] for a, b in bootstrap._decision_chars(fb)]
    assert not weighted or weighted[0] in ("o", "w", "a")


def test_bootstrap_is_cached_by_config(tmp_path, monkeypatch):
    cfg = BootstrapConfig(**TINY)
    first = ensure_bootstrap(cfg, cache_dir=tmp_path, progress=False)
    assert first.solver_dir.parent == tmp_path / cfg.key()
    assert first.report["key"] == cfg.key() and first.report["config"] == cfg.model_dump(mode="json")
    for d in (first.solver_dir, first.critic_dir, first.tokenizer_dir):
        assert d.is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]

    def no_training(*a, **k):
        raise AssertionError("the cached bootstrap was rebuilt")

    monkeypatch.setattr(bootstrap, "_build", no_training)
    again = ensure_bootstrap(BootstrapConfig(**TINY), cache_dir=tmp_path, progress=False)
    assert again.solver_dir == first.solver_dir and again.report == first.report
    # Another config is another directory (and would be trained).
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_bootstrap(BootstrapConfig(**{**TINY, "seed": 1}), cache_dir=tmp_path, progress=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # no half-written entry
    assert BootstrapConfig(**{**TINY, "seed": 1}).key() != cfg.key()


def test_bootstrap_is_deterministic_and_loadable(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = BootstrapConfig(**TINY)
    a = ensure_bootstrap(cfg, cache_dir=tmp_path / "a", progress=False)
    b = ensure_bootstrap(cfg, cache_dir=tmp_path / "b", progress=False)
    assert _weights(a.solver_dir) == _weights(b.solver_dir)
    assert _weights(a.critic_dir) == _weights(b.critic_dir)
    assert _weights(a.solver_dir) != _weights(a.critic_dir)  # the critic trained on from the solver
    AutoModelForCausalLM.from_pretrained(str(a.critic_dir))
    assert AutoTokenizer.from_pretrained(str(a.tokenizer_dir)).eos_token == "<|end|>"
    assert a.report["solver"]["steps"] == 6 and a.report["critic"]["init"] == "solver"

    ev = evaluate_bootstrap(a, n_eval=4)
    assert ev["n"] == 4
    for k in ("acc_t1", "acc_t2_oracle", "acc_t2_critic", "acc_t2_null", "critic_exact"):
        assert 0.0 <= ev[k] <= 1.0


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path))
    assert bootstrap.default_cache_dir() == tmp_path
    monkeypatch.delenv("MLMT_BENCH_CACHE")
    assert bootstrap.default_cache_dir() == Path.home() / ".cache" / "mlmt-bench" / "bootstrap"


def test_critic_init_solver_needs_the_same_preset(tmp_path):
    from mlmt_bench.errors import UserError

    with pytest.raises(UserError, match="critic_preset == solver_preset"):
        ensure_bootstrap(BootstrapConfig(**{**TINY, "critic_preset": "tiny-2m", "solver_steps": 1}),
                         cache_dir=tmp_path, progress=False)


def test_thread_count_changes_speed_only(tmp_path):
    """The cache key ignores `threads` because the weights do not depend on it: check that."""
    one = ensure_bootstrap(BootstrapConfig(**{**TINY, "threads": 1}), cache_dir=tmp_path / "one", progress=False)
    two = ensure_bootstrap(BootstrapConfig(**{**TINY, "threads": 2}), cache_dir=tmp_path / "two", progress=False)
    assert _weights(one.solver_dir) == _weights(two.solver_dir)
    assert _weights(one.critic_dir) == _weights(two.critic_dir)


def test_thread_tuner_probes_then_keeps_the_faster():
    tuner = bootstrap.ThreadTuner(None, every=10, probe=2)
    if tuner.choices == [1]:
        pytest.skip("one CPU")
    assert [tuner.threads_for(s) for s in range(4)] == [1, 1, 2, 2]
    for s, secs in zip(range(4), (1.0, 1.0, 3.0, 3.0)):  # one thread is faster here
        tuner.record(s, tuner.threads_for(s), secs, 10)
    assert tuner.best == 1 and tuner.threads_for(5) == 1
    assert bootstrap.ThreadTuner(3).threads_for(0) == 3


def _spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_warm_start_follows_the_runs_synthetic_benchmark(tmp_path: Path) -> None:
    from mlmt_bench.runner import warm_start_config
    from mlmt_bench.spec import load_run_spec

    base = ("name: t\nbenchmark: {name: synthetic-arith, options: {difficulty: 5}}\n"
            "policies: {solver: {model: tiny}}\nalgorithm: {name: grpo}\n")
    cfg = warm_start_config(load_run_spec(_spec(tmp_path, base + "bootstrap: {}\n")))
    assert (cfg.benchmark, cfg.benchmark_options) == ("synthetic-arith", {"difficulty": 5})
    # a bootstrap section that names its own benchmark keeps it, options included
    cfg = warm_start_config(load_run_spec(_spec(tmp_path, base + "bootstrap: {benchmark: synthetic-arith}\n")))
    assert cfg.benchmark_options == {}
    # the default run spec's warm start is the default one (same cache key)
    default = warm_start_config(load_run_spec(Path(__file__).resolve().parents[1] / "registry" / "runs" / "grpo.yaml"))
    assert default.key() == BootstrapConfig().key()


def test_warm_start_keeps_its_default_benchmark_for_a_benchmark_without_oracle(tmp_path: Path) -> None:
    from mlmt_bench.runner import warm_start_config
    from mlmt_bench.spec import load_run_spec

    spec = load_run_spec(_spec(tmp_path, "name: t\nbenchmark: {name: gsm8k}\npolicies: {solver: {model: tiny}}\n"
                                         "algorithm: {name: grpo}\nbootstrap: {}\n"))
    assert warm_start_config(spec).benchmark == "synthetic-arith"
