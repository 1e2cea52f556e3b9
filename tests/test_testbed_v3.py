"""Testbed v3 (METHOD.md v3): a curriculum whose critique attempts carry no shortcut, the critic
diagnostics (hand-computed), the base's validity thresholds, and the `+ base critic` evaluation
of a single-turn arm."""

from __future__ import annotations

import json
import random

import pytest

import mlmt_bench.warmstart.shared_base as shared_base
from mlmt_bench.benchmarks.synthetic import parse_attempt, parse_problem, solve
from mlmt_bench.benchmarks.synthetic_curriculum import Curriculum, Misconceptions
from mlmt_bench.errors import UserError
from mlmt_bench.metrics.critic import critic_diagnostics, shortcut_gap
from mlmt_bench.warmstart.shared_base import Base, BaseConfig, validity_failures


def _curriculum(**over):
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    cfg = BaseConfig(seed=0, benchmark_options={"n_train": 2000, "n_validation": 20, "n_test": 20}, **over)
    bench = shared_base.synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)
    return Curriculum(cfg, bench, build_char_tokenizer(), 0)


def _wrong_step_rates(data: Curriculum, attempts: list[tuple[object, str]]) -> tuple[float, float]:
    """Share of written steps whose result is wrong, on the seed's misconception operations and on the others."""
    wrong = {True: 0, False: 0}
    total = {True: 0, False: 0}
    for p, attempt in attempts:
        first, ops = parse_problem(p.prompt)
        steps, _ = parse_attempt(attempt)
        for s in steps:
            if s is None:
                continue
            a, op, b, r = s
            hit = (op, b) in data.beliefs.wrong
            total[hit] += 1
            wrong[hit] += r != solve(a, [(op, b)], 100)[0][3]
    return wrong[True] / total[True], wrong[False] / total[False]


def test_critique_attempts_make_the_operation_uninformative():
    """v2 built every critique attempt from the seed's own misconceived solver: its wrong steps sat on
    the misconception operations. v3's mixture spreads errors evenly over the operations."""
    data = _curriculum()
    rng = random.Random(0)
    problems = [rng.choice(data.problems) for _ in range(3000)]
    v3 = [(p, data.critique_attempt(p, rng)) for p in problems]
    rate_in, rate_out = _wrong_step_rates(data, v3)
    assert abs(rate_in - rate_out) < 0.03, (rate_in, rate_out)
    assert 0.05 < rate_out < 0.3  # the critic still sees plenty of errors to find
    # the v2 construction (the taught solution, with random slips) fails the same test: that is the shortcut
    v2 = [(p, data.own_solution(p, rng)) for p in problems]
    v2_in, v2_out = _wrong_step_rates(data, v2)
    assert v2_in - v2_out > 0.5, (v2_in, v2_out)


def test_critique_mix_sources():
    gold_only = _curriculum(critique_mix={"gold": 1, "slip": 0, "other": 0})
    slip_only = _curriculum(critique_mix={"gold": 0, "slip": 1, "other": 0})
    rng = random.Random(1)
    for p in gold_only.problems[:50]:
        assert gold_only.critique_attempt(p, rng) == gold_only.bench.solution(p)
        slipped = slip_only.critique_attempt(p, rng)
        assert parse_attempt(slipped)[1] != int(p.answer)  # one slip always changes the answer
    with pytest.raises(ValueError, match="positive"):
        BaseConfig(critique_mix={"gold": 0, "slip": 0, "other": 0})
    assert BaseConfig(seed=0).key() != BaseConfig(seed=0, critique_mix={"gold": 0.5}).key()
    assert BaseConfig(seed=0).key() == BaseConfig(seed=0, allow_invalid=True).key()  # no effect on the weights


def test_misconceptions_hits():
    m = Misconceptions(0.3, 0, "+-", 9)
    (op, b) = next(iter(m.wrong))
    other = next((o, x) for o in "+-" for x in range(1, 10) if (o, x) not in m.wrong)

    class P:
        prompt = f"5{op}{b}{other[0]}{other[1]}"

    class Q:
        prompt = f"5{other[0]}{other[1]}"

    assert m.hits(P()) and not m.hits(Q())


def test_critic_diagnostics_by_hand():
    # attempts: right, right, wrong, wrong, wrong; verdicts: ok, wrong, ok, wrong, unreadable
    says = [True, False, True, False, None]
    correct = [True, True, False, False, False]
    exact = [False, False, False, True, False]
    d = critic_diagnostics(says, correct, exact)
    assert d["false_alarm_rate"] == pytest.approx(1 / 2)
    assert d["miss_rate"] == pytest.approx(1 / 3)
    assert d["exact_correction_rate"] == pytest.approx(1 / 3)
    assert d["verdict_accuracy"] == pytest.approx(2 / 5)  # right/ok and wrong/wrong; unreadable is a mismatch
    assert d["verdict_unparsed"] == pytest.approx(1 / 5)
    none = critic_diagnostics([True], [True])
    assert none["miss_rate"] is None and none["exact_correction_rate"] is None and none["false_alarm_rate"] == 0
    with pytest.raises(ValueError):
        critic_diagnostics([True], [True, False])


def test_shortcut_gap_by_hand():
    # gold attempts (all right): 4 problems in the group (2 flagged), 4 outside (1 flagged)
    says = [False, False, True, True, False, True, True, True]
    group = [True] * 4 + [False] * 4
    g = shortcut_gap(says, group)
    assert g["false_alarm_rate"] == pytest.approx(3 / 8)
    assert (g["false_alarm_rate_in"], g["false_alarm_rate_out"]) == (pytest.approx(0.5), pytest.approx(0.25))
    assert g["shortcut_gap"] == pytest.approx(0.25)


def _check(fa: float, gap: float) -> dict:
    return {"critic": {"gold": {"false_alarm_rate": fa, "shortcut_gap": gap}}}


def test_validity_thresholds():
    assert validity_failures(_check(0.10, 0.05)) == []  # at the thresholds: valid
    assert validity_failures(_check(0.101, 0.0)) == ["false-alarm rate on gold solutions 10.1% > 10%"]
    assert validity_failures(_check(0.02, 0.06)) == ["shortcut gap +6.0 points > 5"]
    assert validity_failures({}) == ["its check has no critic probes (built before METHOD v3)"]
    base = Base(shared_base.Path("/nowhere"), {"key": "k", "config": {"preset": "tiny-0.5m", "seed": 3},
                                               "check": _check(0.3, 0.2)})
    with pytest.raises(UserError, match=r"base k \(tiny-0.5m, seed 3\) is not a valid testbed.*30.0% > 10%.*"
                                        r"\+20.0 points > 5.*allow_invalid"):
        base.require_valid(False)
    base.require_valid(True)  # allowed: no error


def test_feedback_verdicts():
    from mlmt_bench.benchmarks.base import Benchmark
    from mlmt_bench.benchmarks.synthetic import SyntheticArith

    s = SyntheticArith()
    assert s.feedback_verdict("9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok") is True
    assert s.feedback_verdict("9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong") is False and s.feedback_verdict("zz") is False
    b = Benchmark(verdict_fallback="keywords")  # free text read by keywords: the labelled fallback
    assert b.feedback_verdict("The answer is correct.") is True
    assert b.feedback_verdict("This is not correct: step 2 has an error") is False
    assert b.feedback_verdict("Let me look at it.") is None


# --------------------------------------------------------------------------- runs


def _trainer(tiny_ckpt, tmp_path, algo, params=None, **over):
    from support import build_trainer, make_spec

    return build_trainer(make_spec(tmp_path, tiny_ckpt, algo, params, **over), tmp_path)


def _evals(trainer) -> list[dict]:
    return [r for r in trainer.run_dir.metrics() if r["kind"] == "eval"]


def test_mlmt_evaluations_log_the_critic_diagnostics(tiny_ckpt, tmp_path, one_torch_thread):
    trainer = _trainer(tiny_ckpt, tmp_path, "mlmt", train={"steps": 1, "problems_per_step": 2})
    trainer.train()
    for rec in _evals(trainer):
        # ParityVerifier judges the attempts; a rate is logged when its attempts exist (right ones:
        # false alarms; wrong ones: misses and exact corrections)
        assert "verdict_accuracy" in rec and ("false_alarm_rate" in rec or "miss_rate" in rec)
        assert ("miss_rate" in rec) == ("exact_correction_rate" in rec)
        assert 0 <= rec["verdict_accuracy"] <= 1
        assert 0 <= rec["critic/verdict_unparsed"] <= 1 and "critic/verdict_keywords" not in rec  # no fallback


def test_grpo_with_the_base_critic_gets_a_refine_evaluation_and_a_report_row(tiny_ckpt, tmp_path, one_torch_thread):
    from mlmt_bench.report.compare import build_comparison
    from support import build_trainer, make_spec

    spec = make_spec(tmp_path, tiny_ckpt, "grpo", train={"steps": 1, "problems_per_step": 2})
    assert build_trainer(spec, tmp_path).base_critic is None  # only when eval.base_critic asks for it
    spec.eval.base_critic = True
    trainer = build_trainer(spec, tmp_path)
    assert trainer.base_critic is not None and not trainer.base_critic.trainable
    final = trainer.train()
    assert final["acc@t2"] == final["acc@t1"]  # the arm itself still answers in one turn
    assert {"base_critic/acc@t1", "base_critic/acc@t2", "base_critic/verdict_accuracy",
            "base_critic/gen_tokens_eval"} <= set(final)
    assert final["base_critic/acc@t1"] == final["acc@t1"]  # the same greedy attempts
    assert final["base_critic/gen_tokens_eval"] > final["gen_tokens_eval"]  # feedback and refinement cost tokens
    rows = [json.loads(line) for line in (trainer.run_dir.path / "eval_problems.jsonl").read_text().splitlines()]
    assert all(isinstance(r["t2_base_critic"], bool) for r in rows)
    trainer.run_dir.finish("completed")
    summary = build_comparison({"grpo": [trainer.run_dir.path]}, tmp_path / "report")
    # the base critic's feedback is also scored as a second solver's answer (METHOD v4's copy-channel control)
    assert sorted(summary["arms"]) == ["grpo", "grpo + base critic", "grpo + base critic as second solver"]
    bc = summary["arms"]["grpo + base critic"]
    per_problem = [r["t2_base_critic"] for r in rows if r["step"] == final["step"]]
    assert bc["ci"]["acc@t2"]["mean"] == pytest.approx(sum(per_problem) / len(per_problem))
    tokens = summary["arms"]["grpo"]["metrics"]["test_tokens_per_problem"]["mean"]
    assert tokens == pytest.approx(final["gen_tokens_eval"] / final["n"])
    assert bc["metrics"]["test_tokens_per_problem"]["mean"] > tokens
    md = (tmp_path / "report" / "comparison.md").read_text()
    assert "grpo + base critic" in md and "test-time generated tokens per problem" in md


class RecordingBackend:
    """The hf backend, recording the temperature of every generate call."""

    def __init__(self):
        from mlmt_bench.rollout.hf_backend import HFBackend

        self.inner = HFBackend()
        self.temps: list[float] = []

    def generate(self, model, tokenizer, prompts, **kw):
        self.temps.append(kw["temperature"])
        return self.inner.generate(model, tokenizer, prompts, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_each_role_samples_at_its_own_temperature(tiny_ckpt, tmp_path, one_torch_thread):
    from mlmt_bench.rollout.episodes import rollout
    from support import make_spec

    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", train={"steps": 1, "problems_per_step": 2})
    spec.policies.critic.temperature = 0.3
    spec.policies.solver.temperature = 0.9
    from support import build_trainer

    trainer = build_trainer(spec, tmp_path)
    backend = RecordingBackend()
    trainer.actors.backend = backend
    rollout(trainer.algorithm.program(0), trainer.actors, trainer.train_problems[:2], trainer.sampling)
    assert backend.temps == [0.9, 0.3, 0.9]  # attempts, feedbacks, refinements
    from mlmt_bench.trainer import training_temperatures

    assert training_temperatures(spec) == {"solver": 0.9, "critic": 0.3}
    spec.policies.critic.temperature = None
    assert training_temperatures(spec) == {"solver": 0.9, "critic": spec.backend.temperature}


def test_bases_table(tmp_path):
    from mlmt_bench.report.bases import write_bases

    check = {"acc@t1": 0.4, "acc@t2_critic": 0.5, "acc@t2_null": 0.35, "acc@t2_oracle": 0.8,
             "critic": {"gold": {"false_alarm_rate": 0.05, "false_alarm_rate_in": 0.06, "false_alarm_rate_out": 0.04,
                                 "shortcut_gap": 0.02}, "slip": {"miss_rate": 0.3, "exact_correction_rate": 0.6},
                        "own": {"false_alarm_rate": 0.02, "miss_rate": 0.25, "exact_correction_rate": 0.7}}}
    bases = [{"seed": 0, "preset": "tiny-0.5m", "key": "abc", "invalid_because": [],
              "check": {**check, "sampled": {**check, "temperature": 1.0}}},
             {"seed": 1, "preset": "tiny-0.5m", "key": "def", "invalid_because": ["shortcut gap +9.0 points > 5"],
              "check": check}]
    paths = write_bases(bases, tmp_path, "mlmt-bench base x.yaml --out d")
    md = (tmp_path / "bases.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 0") or line.startswith("| 1")]
    assert len(rows) == 3  # seed 0 greedy and at T=1, seed 1 greedy only
    assert "| 5.0% | 6.0% / 4.0% (+2.0) | 30.0% / 60.0% | 2.0% / 25.0% / 70.0% | yes |" in rows[0]
    assert "| 1.0 |" in rows[1] and rows[2].endswith("| no: shortcut gap +9.0 points > 5 |")
    assert json.loads((tmp_path / "bases.json").read_text()) == bases and set(paths) == {"bases.json", "bases.md"}


def test_an_unpinned_base_has_its_own_key(monkeypatch):
    from mlmt_bench.machine import reproducible

    cfg = BaseConfig(seed=0)
    for k, v in reproducible.PIN.items():
        monkeypatch.setenv(k, v)
    pinned = cfg.key()
    monkeypatch.delenv("MKL_CBWR")
    assert cfg.key() != pinned  # the pin is not (all) in effect: another entry
