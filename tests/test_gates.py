"""METHOD v4's gates: the critic gate (detection J on the base solver's own attempts, greedy and at
the critic's training temperature, with approve-all and flag-all critics as negative controls) and
the value gate (features that see the feedback, λ in units of the standardised advantage, the
value probe)."""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest

import mlmt_bench.warmstart.shared_base as sb
from mlmt_bench.errors import UserError
from mlmt_bench.metrics.critic import detection
from mlmt_bench.warmstart.shared_base import Base, BaseConfig, critic_gate
from support import TINY, ScriptedBackend, one_line_error

# --------------------------------------------------------------------------- detection


def test_detection_by_hand_an_unreadable_verdict_is_not_a_flag():
    # attempts: right, right, right, wrong, wrong, wrong, wrong
    # verdicts: ok,   wrong, None,  wrong, wrong, ok,    None
    says = [True, False, None, False, False, True, None]
    correct = [True, True, True, False, False, False, False]
    d = detection(says, correct)
    assert d["recall"] == pytest.approx(2 / 4)  # the unreadable verdict on a wrong attempt detects nothing
    assert d["false_alarm_rate"] == pytest.approx(1 / 3)  # nor is it a false alarm on a right one
    assert d["J"] == pytest.approx(2 / 4 - 1 / 3)
    assert d["unreadable"] == pytest.approx(2 / 7) and (d["n_right"], d["n_wrong"]) == (3, 4)
    assert detection([True], [True])["J"] is None  # no wrong attempt: recall and J cannot be measured
    with pytest.raises(ValueError):
        detection([True], [True, False])


# --------------------------------------------------------------------------- the gate, pure


def _pass(recall, fa, *, t=None, n_wrong=100, n_right=100):
    j = None if recall is None or fa is None else recall - fa
    return {"recall": recall, "false_alarm_rate": fa, "J": j, "n_wrong": n_wrong, "n_right": n_right,
            "solver_temperature": 0.0 if t is None else 1.0, "critic_temperature": 0.0 if t is None else t}


def _gate(greedy, sampled):
    return {"greedy": greedy, "sampled": sampled}


def test_critic_gate_negative_controls_fail_and_a_good_critic_passes():
    good = _pass(0.8, 0.05)
    assert critic_gate(_gate(good, {**_pass(0.6, 0.08, t=0.5)})) == []
    # approve-all: flags nothing, J = 0
    approve = critic_gate(_gate(_pass(0.0, 0.0), _pass(0.0, 0.0, t=0.5)))
    assert approve == ["critic detection J +0.000 < 0.20 on its solver's own attempts (greedy: recall 0.0% of 100 "
                       "wrong, false alarms 0.0% of 100 right)",
                       "critic detection J +0.000 < 0.20 on its solver's own attempts (critic at T=0.5: recall 0.0% "
                       "of 100 wrong, false alarms 0.0% of 100 right)"]
    # flag-all: recall 100% and false alarms 100%, J = 0: fails on both counts, at either temperature
    flag = critic_gate(_gate(good, _pass(1.0, 1.0, t=0.5)))
    assert flag == ["critic detection J +0.000 < 0.20 on its solver's own attempts (critic at T=0.5: recall 100.0% "
                    "of 100 wrong, false alarms 100.0% of 100 right)",
                    "critic false alarms on its solver's right attempts 100.0% > 10% (critic at T=0.5)"]


def test_critic_gate_thresholds_and_what_cannot_be_measured():
    at = {"recall": 0.3, "false_alarm_rate": 0.10, "J": 0.20, "n_wrong": 10, "n_right": 10}
    assert critic_gate(_gate(at, {**at, "critic_temperature": 0.5})) == []  # J 0.20 and 10% pass
    high_j_many_alarms = _pass(0.9, 0.15)  # J 0.75 but too many false alarms: still fails
    assert critic_gate(_gate(high_j_many_alarms, _pass(0.8, 0.05, t=1))) == [
        "critic false alarms on its solver's right attempts 15.0% > 10% (greedy)"]
    low = critic_gate(_gate(_pass(0.25, 0.1), _pass(0.8, 0.05, t=1)))  # J 0.15
    assert len(low) == 1 and low[0].startswith("critic detection J +0.150 < 0.20")
    unmeasured = critic_gate(_gate(_pass(None, 0.0, n_wrong=0), _pass(0.8, 0.05, t=1)))
    assert unmeasured == ["critic detection on its solver's own attempts (greedy) cannot be measured (0 wrong, "
                          "100 right)"]
    assert critic_gate(None) == critic_gate({}) == [
        "its check has no critic-gate detection on its solver's own attempts (METHOD v4)"]


def test_a_base_that_fails_the_gate_is_refused_in_one_line_unless_allowed():
    check = {"critic": {"gold": {"false_alarm_rate": 0.01, "shortcut_gap": 0.0}}}  # v3's thresholds: passed
    base = Base(sb.Path("/nowhere"), {"key": "k", "config": {"preset": "tiny-0.5m", "seed": 10}, "check": check,
                                      "gate": _gate(_pass(0.046, 0.01), _pass(0.2, 0.174, t=0.5))})
    assert sb.validity_failures(check) == []  # v3 would let this critic through
    with pytest.raises(UserError) as err:
        base.require_valid(False)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("base k (tiny-0.5m, seed 10) is not a valid testbed (METHOD v4): ")
    assert "J +0.036 < 0.20" in msg and "recall 4.6%" in msg and "17.4% > 10% (critic at T=0.5)" in msg
    assert "allow_invalid" in msg
    base.require_valid(True)  # allowed: no error
    passing = _gate(_pass(0.8, 0.0), _pass(0.7, 0.05, t=0.5))
    assert Base(base.directory, {**base.report, "gate": passing}).invalid_because() == []


# --------------------------------------------------------------------------- the gate, measured


@pytest.fixture()
def scripted_base(tiny_ckpt, tmp_path):
    """A Base whose model is the untrained tiny checkpoint: its texts come from a ScriptedBackend."""
    shutil.copytree(tiny_ckpt, tmp_path / "model")
    return Base(tmp_path, {"key": "k", "config": {"seed": 0, "benchmark": "synthetic-arith"}})


def _bench():
    return sb.synthetic_benchmark("synthetic-arith", {"n_train": 20, "n_validation": 8, "n_test": 4})


def _scripted(bench, critic):
    """Attempts (alternately gold and with one slip) and the feedback ``critic(problem, attempt)``
    on each, for the gate's two passes (greedy, then sampled): the order gate_check generates in."""
    problems = bench.load("validation")[:8]
    rng = random.Random(0)
    attempts = [bench.solution(p) if i % 2 == 0 else bench.inject_errors(bench.solution(p), rng, 0.0)
                for i, p in enumerate(problems)]
    one_pass = attempts + [critic(bench, p, a) for p, a in zip(problems, attempts)]
    return one_pass + one_pass


def _approve_all(bench, p, a):
    return bench.oracle_feedback(p, bench.solution(p))  # every step "ok", "answer ok"


def _flag_all(bench, p, a):
    return bench.oracle_feedback(p, bench.inject_errors(bench.solution(p), random.Random(p.id), 0.0))


def _oracle(bench, p, a):
    return bench.oracle_feedback(p, a)


@pytest.mark.parametrize("critic,passes", [(_approve_all, False), (_flag_all, False), (_oracle, True)])
def test_the_measured_gate_fails_approve_all_and_flag_all_critics(scripted_base, one_torch_thread, critic, passes):
    bench = _bench()
    gate = sb.gate_check(scripted_base, bench, 8, solver_temperature=1.0, critic_temperature=0.5,
                         backend=ScriptedBackend(_scripted(bench, critic)))
    assert gate["greedy"]["n_wrong"] == gate["greedy"]["n_right"] == 4
    assert gate["sampled"]["critic_temperature"] == 0.5 and gate["sampled"]["solver_temperature"] == 1.0
    expected = {_approve_all: (0.0, 0.0), _flag_all: (1.0, 1.0), _oracle: (1.0, 0.0)}[critic]
    for label in ("greedy", "sampled"):
        assert (gate[label]["recall"], gate[label]["false_alarm_rate"]) == expected
    assert (critic_gate(gate) == []) is passes


def test_the_gate_runs_at_the_specs_critic_temperature_and_is_cached_beside_the_entry(tmp_path, monkeypatch,
                                                                                        one_torch_thread, write_spec):
    from typer.testing import CliRunner

    from conftest import minimal_spec
    from mlmt_bench import runner
    from mlmt_bench.cli import app
    from mlmt_bench.spec import RunSpec

    raw = minimal_spec(policies={"solver": {"model": "tiny"}, "critic": {"model": "tiny", "temperature": 0.5}},
                       backend={"name": "hf", "temperature": 1.0}, base=dict(TINY))
    spec = RunSpec.model_validate(raw)
    cfg = runner.base_config(spec)
    assert cfg.critic_temperature == 0.5
    assert cfg.key() == BaseConfig(**TINY).key()  # the critic's temperature is not part of the key
    base = sb.ensure_base(cfg, cache_dir=tmp_path, progress=False)  # TINY allows an invalid base
    gate = base.report["gate"]
    assert (gate["sampled"]["solver_temperature"], gate["sampled"]["critic_temperature"]) == (1.0, 0.5)
    assert gate["greedy"]["critic_temperature"] == 0.0 and gate["n"] == 4
    assert base.summary()["gate"] == gate and any("critic" in w for w in base.invalid_because())
    assert json.loads((base.directory / sb.GATE_FILE).read_text()) == {"n=4,solver_T=1,critic_T=0.5": gate}
    assert "gate" not in json.loads((base.directory / "base.json").read_text())  # the entry's files as built

    # `mlmt-bench base` prints the gate, greedy and sampled, and refuses the base in one line unless allowed
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path))
    path = write_spec(raw, "spec.yaml")
    res = CliRunner().invoke(app, ["base", str(path)])
    assert res.exit_code == 0, res.stderr[-800:]
    assert re.search(r"^  critic gate, greedy: J [-+–0-9.]+ \(needs >= 0\.20\), recall .* false alarms .*$",
                     res.stdout, re.M), res.stdout
    assert "  critic gate, solver T=1, critic T=0.5: J " in res.stdout
    one_line_error(["--quiet", "base", str(path), "--set", "base.allow_invalid=false"],
                   "is not a valid testbed (METHOD v4): ", "critic detection", "allow_invalid")

    calls = []

    def fake(base, bench, n, *, solver_temperature, critic_temperature, backend=None):
        calls.append(critic_temperature)
        return {"greedy": {}, "sampled": {"critic_temperature": critic_temperature}}

    monkeypatch.setattr(sb, "gate_check", fake)
    again = sb.ensure_base(cfg, cache_dir=tmp_path, progress=False)
    assert calls == [] and again.report["gate"] == gate  # read from gate.json, not measured again
    other = sb.ensure_base(cfg.model_copy(update={"critic_temperature": 0.7}), cache_dir=tmp_path, progress=False)
    assert calls == [0.7] and other.report["gate"]["sampled"]["critic_temperature"] == 0.7
    assert set(json.loads((base.directory / sb.GATE_FILE).read_text())) == {"n=4,solver_T=1,critic_T=0.5",
                                                                            "n=4,solver_T=1,critic_T=0.7"}


# --------------------------------------------------------------------------- value features and probe


def _scripted_rollout(tiny_ckpt, texts, problems, program):
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.episodes import Actors, Sampling, rollout

    bench = _bench()
    model, tok = load_checkpoint(tiny_ckpt)
    actor = sb._Actor(model, tok)
    actors = Actors(actor, actor, ScriptedBackend(texts), bench.templates, bench_verifier(), bench.oracle_feedback,
                    bench.feedback_verdict)
    return rollout(program, actors, problems, Sampling(0.0, 1.0, 40, 80)), actors


def bench_verifier():
    from mlmt_bench import registry

    return registry.verifiers.get(_bench().default_verifier)()


def test_the_feedback_span_is_the_feedback_message_found_from_lengths(tiny_ckpt, one_torch_thread):
    from mlmt_bench.algorithms.value import refinement_contexts
    from mlmt_bench.rollout.episodes import Program

    bench = _bench()
    problems = bench.load("validation")[:2]
    feedback = ["1+1>2 1+1=2 ok;answer ok", "first step wrong: 7"]
    texts = ["12", "34"] + feedback + ["5", "6"]  # attempts, feedbacks, refinements
    ro, actors = _scripted_rollout(tiny_ckpt, texts, problems, Program(attempts=1, feedback="critic"))
    contexts, spans = refinement_contexts(ro, "feedback_pool")
    tok = actors.solver.tokenizer
    for ctx, (start, end), f, g in zip(contexts, spans, ro.of_kind("feedback"), feedback):
        a = ro.parent_of(f)
        assert ctx[:start] == a.prompt_ids + a.ids  # the span starts right after z as generated
        assert end == len(ctx) and g in tok.decode(ctx[start:end])  # ... and holds the feedback message
        assert a.text not in tok.decode(ctx[start:end])
    assert refinement_contexts(ro, "last") == (contexts, None)
    with pytest.raises(ValueError, match="value_features"):
        refinement_contexts(ro, "mean")


def test_feedback_pool_features_are_the_last_state_and_the_mean_over_the_span(tiny_ckpt, one_torch_thread):
    import torch

    from mlmt_bench.models.forward import last_hidden_states
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    contexts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [4, 4, 5, 6, 7, 8, 9, 20, 21]]
    spans = [(2, 5), (0, 3), (7, 9)]
    last = last_hidden_states(model, tok.pad_token_id, contexts)
    both = last_hidden_states(model, tok.pad_token_id, contexts, spans=spans)
    h = last.shape[1]
    assert both.shape == (3, 2 * h) and torch.allclose(both[:, :h], last, atol=1e-6)
    for i, (ctx, (lo, hi)) in enumerate(zip(contexts, spans)):  # by hand: one context at a time, no padding
        with torch.no_grad():
            states = model(input_ids=torch.tensor([ctx]), output_hidden_states=True).hidden_states[-1][0]
        assert torch.allclose(both[i, h:], states[lo:hi].mean(0), atol=1e-5)
    parts = last_hidden_states(model, tok.pad_token_id, contexts, max_tokens=10, spans=spans)  # micro-batched
    assert torch.allclose(parts, both, atol=1e-5)
    with pytest.raises(ValueError, match="outside"):
        last_hidden_states(model, tok.pad_token_id, contexts, spans=[(2, 5), (0, 4), (7, 9)])


def test_holdout_explained_variance_holds_out_whole_problems():
    import torch

    from mlmt_bench.algorithms.value import holdout_explained_variance

    gen = torch.Generator().manual_seed(0)
    groups = [i // 8 for i in range(800)]  # 100 problems x 8 rows
    signal = torch.randn(800, 1, generator=gen)
    noise = torch.randn(800, 4, generator=gen)
    y = (signal[:, 0] > 0).double()
    seen = holdout_explained_variance(torch.cat([signal, noise], 1), y, groups, steps=400)
    blind = holdout_explained_variance(noise, y, groups, steps=400)
    assert (seen["n_train"], seen["n_test"]) == (640, 160) and seen["width"] == 5
    assert seen["explained_variance"] > 0.4 and blind["explained_variance"] < 0.1  # 20 whole problems held out
    with pytest.raises(ValueError, match="two groups"):
        holdout_explained_variance(noise[:8], y[:8], [0] * 8)


def test_the_value_probe_fits_both_feature_sets_on_rollouts(tiny_ckpt, one_torch_thread):
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.episodes import Actors, Sampling
    from mlmt_bench.warmstart.value_probe import value_probe

    bench = _bench()
    problems = bench.load("train")[:4]
    # 4 problems x 2 attempts: attempts, then feedbacks, then refinements (right after "answer ok")
    feedbacks = ["answer ok", "wrong"] * 4
    refines = [bench.solution(problems[i // 2]) if f == "answer ok" else "0"
               for i, f in enumerate(feedbacks)]
    model, tok = load_checkpoint(tiny_ckpt)
    actor = sb._Actor(model, tok)
    actors = Actors(actor, actor, ScriptedBackend(["1"] * 8 + feedbacks + refines), bench.templates,
                    bench_verifier())
    out = value_probe(actors, problems, Sampling(1.0, 1.0, 40, 80), rows=8, group_size=2, steps=20)
    assert (out["rows"], out["problems"], out["r2_mean"]) == (8, 4, 0.5)
    h = out["features"]["last"]["width"]
    assert out["features"]["feedback_pool"]["width"] == 2 * h
    assert all(r["n_train"] + r["n_test"] == 8 for r in out["features"].values())
    with pytest.raises(UserError, match="need 5 training problems"):
        value_probe(actors, problems, Sampling(1.0, 1.0, 40, 80), rows=10, group_size=2)


def test_a_value_checkpoint_of_other_features_is_one_line_on_resume():
    import torch

    from mlmt_bench.algorithms.value import ValueModel

    old = ValueModel(lr=1e-3, hidden=4, seed=0)
    old.fit(torch.zeros(4, 3), torch.tensor([0.0, 1.0, 0.0, 1.0]))  # v3: H = 3 features
    new = ValueModel(lr=1e-3, hidden=4, seed=0)
    new.load_state_dict(old.state_dict())
    with pytest.raises(UserError, match="checkpoint reads 3 features, this run computes 6.*value_features: last"):
        new.predict(torch.zeros(2, 6))  # feedback_pool: 2H


def test_probe_critic_runs_the_gate_on_a_specs_own_solver_and_critic(tmp_path, monkeypatch, one_torch_thread):
    """`mlmt-bench probe critic SPEC`: the gate on what a spec starts from (here the shipped seed-10
    base, whose critic barely checks), both passes on the same problems, exit 0 with the failures."""
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["--json", "probe", "critic", "registry/runs/synthetic-base.yaml", "--limit", "24",
                                   "--out", str(tmp_path / "gate")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert json.loads((tmp_path / "gate" / "gate.json").read_text()) == out  # the record, as printed
    assert out["command"] == "mlmt-bench probe critic registry/runs/synthetic-base.yaml --split validation --limit 24"
    assert out["split"] == "validation" and out["n"] == 24 and out["critic"] == "base"
    for label in ("greedy", "sampled"):
        d = out[label]
        assert d["n_right"] + d["n_wrong"] == 24
        assert d["J"] == pytest.approx(d["recall"] - d["false_alarm_rate"])
    assert out["sampled"]["critic_temperature"] == 0.5 and out["greedy"]["critic_temperature"] == 0.0
    assert out["failures"] == critic_gate(out) and out["failures"]  # this base fails the gate
    one_line_error(["probe", "critic", "registry/runs/synthetic-base.yaml", "--split", "nope"], "nope")
    (tmp_path / "a-file").write_text("x")
    one_line_error(["probe", "critic", "registry/runs/synthetic-base.yaml", "--out", str(tmp_path / "a-file")],
                   "not a directory")
