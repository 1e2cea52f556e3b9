"""The shared base: config and cache key, the four-skill curriculum, caching, bit-identical
rebuilds whatever the load, the check through evaluate(), and how runs find their base."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import mlmt_bench.warmstart.shared_base as shared_base
from mlmt_bench.benchmarks.synthetic_curriculum import KINDS, Curriculum, Misconceptions, decision_chars
from mlmt_bench.warmstart.shared_base import BaseConfig, ensure_base
from support import TINY  # a few steps of everything, on a small benchmark: seconds, not minutes

REPO = Path(__file__).resolve().parents[1]


def _weights(base) -> bytes:
    return (base.model_dir / "model.safetensors").read_bytes()


def test_config_validation_and_key():
    with pytest.raises(ValidationError, match="extra"):
        BaseConfig(stepz=3)
    with pytest.raises(ValidationError, match="at least one"):
        BaseConfig(mix={"solve": 0, "refine": 0, "resolve": 0, "critique": 0})
    with pytest.raises(ValidationError, match="JSON"):
        BaseConfig(benchmark_options={"x": object()})
    with pytest.raises(ValueError, match="seed"):
        BaseConfig().key()
    cfg = BaseConfig().with_seed(0)
    assert cfg.seed == 0 and BaseConfig(seed=3).with_seed(0).seed == 3  # a seed of its own wins
    assert cfg.key() == BaseConfig.model_validate(json.loads(cfg.model_dump_json())).key() and len(cfg.key()) == 16
    # everything that changes the weights is in the key: seed, preset, data, and the thread count
    for change in ({"seed": 1}, {"preset": "tiny-1m"}, {"misconceptions": 0.2}, {"threads": 2},
                   {"mix": {"resolve": 0.2}}):
        assert BaseConfig(**{**cfg.model_dump(), **change}).key() != cfg.key(), change


def test_misconceptions():
    truth = Misconceptions(0.0, 0, "+-", 9)
    assert truth.wrong == {} and truth.op(98, "+", 5, 100) == 3
    m = Misconceptions(0.3, 0, "+-", 9)
    assert len(m.wrong) == 5 and m.wrong == Misconceptions(0.3, 0, "+-", 9).wrong
    (op, b), _ = next(iter(m.wrong.items()))
    assert m.op(10, op, b, 100) == (10 + b + 1 if op == "+" else 10 - b + 1) % 100


def test_the_operations_of_an_oracle_benchmark_are_declared_with_one_default():
    """Misconceptions are drawn from the benchmark's declared ``ops``/``max_operand``; one that
    declares none gets synthetic-arith's defaults ("+-", 9) in the curriculum and the base check
    alike (both once fell back to "+-*", which synthetic-arith's default never draws)."""
    from mlmt_bench.benchmarks.base import DEFAULT_MAX_OPERAND, DEFAULT_OPS, OracleBenchmark
    from mlmt_bench.benchmarks.synthetic import SyntheticArith
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    class DeclaresNone(OracleBenchmark):  # a plugin's oracle benchmark with synthetic-arith's problems
        name = "plugin-oracle"
        templates = SyntheticArith.templates

        def load(self, split):
            return SyntheticArith(n_train=50, n_validation=5, n_test=5).load(split)

    assert (DEFAULT_OPS, DEFAULT_MAX_OPERAND) == ("+-", 9)
    assert (SyntheticArith().ops, SyntheticArith().max_operand) == (DEFAULT_OPS, DEFAULT_MAX_OPERAND)
    every = {(op, b) for op in "+-" for b in range(1, 10)}
    assert set(shared_base._beliefs({"misconceptions": 1.0, "seed": 0}, DeclaresNone()).wrong) == every
    data = Curriculum(BaseConfig(**{**TINY, "misconceptions": 1.0}), DeclaresNone(), build_char_tokenizer(), 0)
    assert (data.ops, data.max_operand) == ("+-", 9) and set(data.beliefs.wrong) == every
    products = SyntheticArith(ops="*", max_operand=3, n_train=10, n_validation=5, n_test=5)
    beliefs = shared_base._beliefs({"misconceptions": 1.0, "seed": 0}, products)
    assert set(beliefs.wrong) == {("*", 1), ("*", 2), ("*", 3)}


def _curriculum(**over):
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    cfg = BaseConfig(**{**TINY, **over})
    bench = shared_base.synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)
    tok = build_char_tokenizer()
    return Curriculum(cfg, bench, tok, 0), tok


def test_every_kind_trains_exactly_the_assistant_turns():
    data, tok = _curriculum(feedback_token_weight=1.0, critic_token_weight=1.0)
    rng = random.Random(0)
    eos = tok.eos_token_id
    for kind in KINDS:
        for _ in range(20):
            ids, spans = data.example(kind, rng)
            for start, end, w in spans:
                assert w == 1.0 and ids[end - 1] == eos
                assert tok.convert_ids_to_tokens(ids[start - 1]) == "<|assistant|>"
            assert spans[-1][1] == len(ids)  # the last assistant turn is always trained


def test_resolve_after_null_feedback_is_a_new_attempt_not_a_copy():
    data, tok = _curriculum()
    rng = random.Random(1)
    null = data.templates.render_refine(data.templates.null_feedback)
    copies = fixes = 0
    for _ in range(200):
        ids, spans = data.example("resolve", rng)
        text = tok.decode(ids, skip_special_tokens=False)
        assert null in text
        attempt = tok.decode(ids[spans[0][0]:spans[0][1] - 1]) if len(spans) == 2 else None
        target = tok.decode(ids[spans[-1][0]:spans[-1][1] - 1])
        body = text.split(null)[0]
        copies += attempt == target
        fixes += target.split("#")[-1] not in body.split("#")[-1]  # a different final answer than the attempt's
    assert fixes > 50  # the target often disagrees with the (wrong) attempt: it is a fresh solution
    assert copies < 200


def test_weighted_tokens_are_the_dictated_value_and_the_critics_decisions():
    data, tok = _curriculum(feedback_token_weight=4.0, refine_correct_frac=0.0, counterfactual_frac=0.0)
    rng = random.Random(0)
    ids, spans = data.example("refine", rng)
    start, end, w = spans[-1]
    assert w == 4.0 and 0 < end - start <= 2 and tok.decode(ids[start:end]).isdigit()
    ids, spans = data.example("critique", rng)
    fb = tok.decode(ids[spans[0][0]:spans[0][1] - 1])
    weighted = [tok.decode(ids[a:b]) for a, b, w in spans[1:]]
    assert all(w == 3.0 for _, _, w in spans[1:]) and weighted == [fb[a:b] for a, b in decision_chars(fb)]


def test_base_is_cached_by_config_and_a_killed_build_leaves_nothing(tmp_path, monkeypatch):
    cfg = BaseConfig(**TINY)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".tmp-{cfg.key()}-{dead.pid}-abc"  # what a SIGKILLed build leaves
    stale.mkdir(parents=True)
    live = tmp_path / f".tmp-0123456789abcdef-{os.getpid()}-xyz"  # another build, still running
    live.mkdir()
    first = ensure_base(cfg, cache_dir=tmp_path, progress=False)
    assert live.is_dir()  # a running build's folder is never touched
    live.rmdir()
    assert first.directory == tmp_path / cfg.key() and first.report["key"] == cfg.key()
    assert first.report["config"] == cfg.model_dump(mode="json") and first.model_dir.is_dir()
    assert not stale.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert sum(first.report["steps_by_kind"].values()) == 8
    assert first.report["sft"]["tokens"] > first.report["sft"]["trained_tokens"] > 0

    def no_training(*a, **k):
        raise AssertionError("the cached base was rebuilt")

    monkeypatch.setattr(shared_base, "_build", no_training)
    again = ensure_base(BaseConfig(**TINY), cache_dir=tmp_path, progress=False)
    assert again.directory == first.directory and again.report == first.report
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_base(BaseConfig(**{**TINY, "seed": 1}), cache_dir=tmp_path, progress=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # no half-written entry


def test_base_is_bit_identical_under_load_and_the_thread_count_is_in_the_key(tmp_path):
    """The same config gives the same bytes, also while other processes keep every core busy; a
    different thread count (which changes float summation order) is a different key."""
    from transformers import AutoModelForCausalLM

    cfg = BaseConfig(**TINY)
    a = ensure_base(cfg, cache_dir=tmp_path / "a", progress=False)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        b = ensure_base(cfg, cache_dir=tmp_path / "b", progress=False)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert _weights(a) == _weights(b)
    assert a.report["check"] == {**b.report["check"], "seconds": a.report["check"]["seconds"]}
    two = BaseConfig(**{**TINY, "threads": 2})
    assert two.key() != cfg.key()
    c = ensure_base(two, cache_dir=tmp_path / "c", progress=False)
    assert c.directory.name == two.key()
    AutoModelForCausalLM.from_pretrained(str(a.model_dir))


def test_two_sizes_see_the_same_data(tmp_path):
    small = ensure_base(BaseConfig(**TINY), cache_dir=tmp_path, progress=False)
    large = ensure_base(BaseConfig(**{**TINY, "preset": "tiny-1m"}), cache_dir=tmp_path, progress=False)
    assert small.report["steps_by_kind"] == large.report["steps_by_kind"]
    assert small.report["sft"]["tokens"] == large.report["sft"]["tokens"]
    assert small.report["sft"]["trained_tokens"] == large.report["sft"]["trained_tokens"]
    assert large.report["params"] > 1.9 * small.report["params"]
    assert large.report["flops"] == pytest.approx(6 * large.report["params"] * large.report["sft"]["tokens"])


def test_check_goes_through_evaluate_on_validation(tmp_path):
    base = ensure_base(BaseConfig(**TINY), cache_dir=tmp_path, progress=False)
    check = base.report["check"]
    assert check["split"] == "validation" and check["n"] == 4
    for k in ("acc@t1", "acc@t2_critic", "acc@t2_null", "acc@t2_oracle"):
        assert 0.0 <= check[k] <= 1.0, k


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path))
    assert shared_base.default_cache_dir() == tmp_path
    monkeypatch.delenv("MLMT_BENCH_CACHE")
    assert shared_base.default_cache_dir() == Path.home() / ".cache" / "mlmt-bench" / "bootstrap"


def _spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_base_follows_the_runs_seed_and_synthetic_benchmark(tmp_path: Path) -> None:
    from mlmt_bench.runner import base_config
    from mlmt_bench.spec import load_run_spec

    head = ("name: t\nseed: 4\nbenchmark: {name: synthetic-arith, options: {difficulty: 5}}\n"
            "policies: {solver: {model: tiny}}\nalgorithm: {name: grpo}\n")
    cfg = base_config(load_run_spec(_spec(tmp_path, head + "base: {}\n")))
    assert (cfg.benchmark, cfg.benchmark_options, cfg.seed) == ("synthetic-arith", {"difficulty": 5}, 4)
    cfg = base_config(load_run_spec(_spec(tmp_path, head + "base: {benchmark: synthetic-arith, seed: 0}\n")))
    assert cfg.benchmark_options == {} and cfg.seed == 0
    default = base_config(load_run_spec(REPO / "registry" / "runs" / "grpo.yaml"))
    assert default.key() == BaseConfig(seed=10).key()  # the example runs' seed: its base ships with the package
    spec = load_run_spec(_spec(tmp_path, "name: t\nbenchmark: {name: gsm8k}\npolicies: {solver: {model: tiny}}\n"
                                         "algorithm: {name: grpo}\nbase: {}\n"))
    assert base_config(spec).benchmark == "synthetic-arith"  # gsm8k has no oracle critic


def test_a_concurrent_build_of_the_same_base_waits_and_reuses_the_first(tmp_path):
    """issue 34 (minor): three `base` builds of one key started together each did the whole build.
    A build now holds <cache>/.lock-<key>: here the test holds it, a second process (whose _build
    fails if called) waits, and once the entry is in place it reuses it instead of building."""
    import fcntl
    import shutil

    cfg = BaseConfig(**TINY)
    built = ensure_base(cfg, cache_dir=tmp_path / "built", progress=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    fd = os.open(cache / f".lock-{cfg.key()}", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    script = ("import sys; sys.path.insert(0, 'tests'); import mlmt_bench.warmstart.shared_base as sb; "
              "from support import TINY\n"
              "def boom(*a, **k): raise SystemExit('built again')\n"
              f"sb._build = boom; b = sb.ensure_base(sb.BaseConfig(**TINY), cache_dir={str(cache)!r}, "
              "require_valid=False); print('reused', b.directory)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        said = ""
        for line in proc.stderr:  # it says so once it is blocked on the lock (or ends, without the lock)
            said += line
            if "waiting" in line:
                break
        assert f"process {os.getpid()} is building it; waiting" in said, said[-2000:]
        assert proc.poll() is None
        shutil.copytree(built.directory, cache / cfg.key())  # the first build's entry lands
    finally:
        os.close(fd)  # the lock is released
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == f"reused {cache / cfg.key()}"
    assert "built by another process meanwhile" in err
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
