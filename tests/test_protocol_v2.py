"""METHOD.md v2 corrections, each against numbers computed by hand: π_ref is the initial policy
after a resume, constant_norm's constant, FLOPs that count prompts and extra passes, the FLOP
budget, the learned value model, and experiments at equal budgets."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import minimal_spec
from mlmt_bench import runner
from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
from mlmt_bench.algorithms.value import ValueModel, explained_variance
from mlmt_bench.errors import UserError
from mlmt_bench.metrics.cost import forward_flops, generation_flops, training_flops
from mlmt_bench.spec import validate_run
from mlmt_bench.tracking import RunDir
from support import ParityVerifier


def _spec(tmp_path, ckpt, algo="grpo", params=None, train=None):
    d = minimal_spec()
    d["output_dir"] = str(tmp_path / "runs")
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt), "lr": 1e-2},
                     "critic": {"model": "tiny", "path": str(ckpt), "lr": 1e-2}}
    d["algorithm"] = {"name": algo, "params": {"group_size": 4, **(params or {})}}
    d["backend"] = {"max_new_tokens": 10}
    d["train"] = {"steps": 2, "problems_per_step": 2, **(train or {})}
    d["eval"] = {"every": 0, "limit": 2, "feedback_metrics": False}
    return validate_run(d, "test")


def _trainer(spec):
    comp = runner.build(spec, progress=False)
    comp.verifier = ParityVerifier()
    return runner.make_trainer(spec, comp, RunDir.create(spec.output_dir, spec.name, "", spec.seed))


def test_reference_is_the_initial_policy_after_a_resume(tiny_ckpt, tmp_path):
    """v1 built π_ref lazily as a copy of the current model: after --resume, of the checkpoint."""
    from mlmt_bench.models.tiny import load_checkpoint

    spec = _spec(tmp_path, tiny_ckpt, params={"beta": 0.1}, train={"checkpoint_every": 2})
    first = _trainer(spec)
    first.train()
    ckpt = first.run_dir.latest_checkpoint()
    resumed = _trainer(spec)
    resumed.load_checkpoint(ckpt)
    policy = resumed.policies["solver"]
    policy.ensure_reference()
    initial = load_checkpoint(tiny_ckpt)[0].state_dict()
    ref, now = policy.ref_model.state_dict(), policy.model.state_dict()
    assert any(not torch.equal(now[k], initial[k]) for k in initial)  # training moved the policy
    assert all(torch.equal(ref[k], initial[k]) for k in initial)  # ... and π_ref is still the start


def test_constant_norm_divides_by_max_new_tokens_times_sequences_sampled(tiny_ckpt):
    """With one epoch the ratio is 1, so each token's loss is −A: the loss is −Σ A·n / norm,
    whatever the prompts' lengths (v1 divided by the batch's longest prompt + completion)."""
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    short = [TrainItem([5, 6], [7, 8, 9], 1.0), TrainItem([5, 6], [7], -0.5)]
    long = [TrainItem([5] * 40, [7, 8, 9], 1.0), TrainItem([5] * 40, [7], -0.5)]
    cfg = LossConfig(0.2, 0.2, "constant_norm", 1, 1, 1e9)
    losses = []
    for items in (short, long):
        policy = Policy("solver", copy.deepcopy(model), tok, True, 1e-3, 1, init_path=str(tiny_ckpt))
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
        # 8 sequences sampled (6 had zero advantage and were not trained), max_new_tokens 10 -> 80
        losses.append(update_policy(policy, opt, None, items, cfg, constant_norm=80.0)["loss"])
    expected = -(1.0 * 3 + (-0.5) * 1) / 80  # = -2.5 / 80
    assert losses[0] == pytest.approx(expected, abs=1e-7) and losses[1] == pytest.approx(expected, abs=1e-7)
    with pytest.raises(ValueError, match="constant"):
        update_policy(policy, opt, None, short, cfg)


def test_flops_count_prompts_trained_sequences_and_extra_passes():
    # 2·P·(prompt + generated) + 6·P·(prompt + completion) + 2·P·tokens, P = 1000
    assert generation_flops(1000, 50, 30) == 160_000
    assert training_flops(1000, 40) == 240_000
    assert forward_flops(1000, 40) == 80_000
    with pytest.raises(ValueError):
        generation_flops(1000, -1, 3)


def test_trainer_cost_accounting_by_hand(tiny_ckpt, tmp_path):
    from mlmt_bench.rollout.episodes import Rollout

    trainer = _trainer(_spec(tmp_path, tiny_ckpt, "mlmt", {"value": "none"}))
    p = trainer.policies["solver"].n_params
    ro = Rollout([], [], {"solver": 30, "critic": 12}, 0.0, {"solver": 100, "critic": 70})
    update = {"solver": {"sequence_tokens": 90, "forward_tokens": 20, "trained_tokens": 25},
              "critic": {"sequence_tokens": 40, "forward_tokens": 0, "trained_tokens": 10}}
    gen = trainer.count_cost(ro, update, value_tokens=15)
    assert gen == 42 and trainer.counters.gen_tokens == 42 and trainer.counters.trained_tokens == 35
    # solver and critic share the preset here: P each
    expected = 2 * p * (100 + 30) + 2 * p * (70 + 12) + 6 * p * (90 + 40) + 2 * p * 20 + 2 * p * 15
    assert trainer.counters.flops == expected


def test_rollout_counts_each_roles_prompt_tokens(tiny_ckpt, tmp_path):
    from mlmt_bench.rollout.episodes import rollout

    trainer = _trainer(_spec(tmp_path, tiny_ckpt, "mlmt", {"value": "none"}))
    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    solver_prompts = sum(len(t.prompt_ids) for t in ro.turns if t.kind in ("attempt", "refine"))
    critic_prompts = sum(len(t.prompt_ids) for t in ro.turns if t.kind == "feedback")
    assert ro.prompt_tokens == {"solver": solver_prompts, "critic": critic_prompts} and critic_prompts > 0


def test_flop_budget_stops_the_run(tiny_ckpt, tmp_path):
    spec = _spec(tmp_path, tiny_ckpt, train={"steps": 50, "flop_budget": 1.0})
    trainer = _trainer(spec)
    trainer.train()
    assert trainer.counters.step == 1 and trainer.counters.flops >= 1.0
    assert trainer.frac_done() == 1.0


def test_value_model_learns_and_scores_itself_before_fitting():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, generator=gen)

    def batch(n):
        x = torch.randn(n, 16, generator=gen)
        return x, (x @ w > 0).double()

    model = ValueModel(lr=3e-3, hidden=32, fit_steps=64, batch=64, buffer=512, seed=0)
    first_ev = None
    for _ in range(15):
        x, y = batch(64)
        stats = model.fit(x, y)
        first_ev = stats["value/explained_variance"] if first_ev is None else first_ev
    x, y = batch(256)
    ev = explained_variance(model.predict(x), y)
    assert first_ev < 0.05 < 0.4 < ev  # out-of-sample skill grows from none
    assert model.predict(x).min() >= 0 and model.predict(x).max() <= 1
    clone = ValueModel(lr=3e-3, hidden=32, fit_steps=64, batch=64, buffer=512, seed=0)
    clone.load_state_dict(copy.deepcopy(model.state_dict()))
    assert torch.equal(clone.predict(x), model.predict(x))  # restored before its width was known
    x2, y2 = batch(64)
    assert clone.fit(x2, y2) == model.fit(x2, y2)  # same buffer, optimiser and sampling state
    assert explained_variance(torch.zeros(4), torch.ones(4)) is None  # constant targets: undefined


def test_value_buffer_keeps_only_the_last_steps():
    # one fit per training step; each step's features are filled with its step number
    def fit(model, step, n):
        model.fit(torch.full((n, 3), float(step)), torch.full((n,), step % 2, dtype=torch.float64))

    model = ValueModel(lr=1e-3, hidden=4, fit_steps=1, batch=8, buffer=100, seed=0, buffer_steps=2)
    for step, n in ((1, 3), (2, 2), (3, 4)):
        fit(model, step, n)
    assert model.feats[:, 0].tolist() == [2, 2, 3, 3, 3, 3] and model.sizes == [2, 4]  # step 1 dropped
    assert model.targets.tolist() == [0, 0, 1, 1, 1, 1]
    # the row cap bounds it further: at most 5 rows, the newest
    capped = ValueModel(lr=1e-3, hidden=4, fit_steps=1, batch=8, buffer=5, seed=0, buffer_steps=2)
    for step, n in ((1, 3), (2, 2), (3, 4)):
        fit(capped, step, n)
    assert capped.feats[:, 0].tolist() == [2, 3, 3, 3, 3] and capped.sizes == [1, 4]
    fit(capped, 4, 1)
    assert capped.feats[:, 0].tolist() == [3, 3, 3, 3, 4] and capped.sizes == [4, 1]
    # a checkpoint round-trips the per-step bookkeeping: both drop step 2 at the next fit alike
    clone = ValueModel(lr=1e-3, hidden=4, fit_steps=1, batch=8, buffer=100, seed=0, buffer_steps=2)
    clone.load_state_dict(copy.deepcopy(model.state_dict()))
    x, y = torch.full((2, 3), 4.0), torch.zeros(2, dtype=torch.float64)
    assert clone.fit(x, y) == model.fit(x, y)
    assert clone.sizes == model.sizes == [4, 2] and torch.equal(clone.feats, model.feats)
    assert model.feats[:, 0].tolist() == [3, 3, 3, 3, 4, 4]
    # a checkpoint written before the per-step buffer: its rows count as one step, dropped in turn
    old = {k: v for k, v in copy.deepcopy(model.state_dict()).items() if k != "sizes"}
    legacy = ValueModel(lr=1e-3, hidden=4, fit_steps=1, batch=8, buffer=100, seed=0, buffer_steps=2)
    legacy.load_state_dict(old)
    fit(legacy, 5, 1)
    assert legacy.sizes == [6, 1]
    fit(legacy, 6, 1)
    assert legacy.feats[:, 0].tolist() == [5, 6]


def test_mlmt_logs_value_skill_and_verdict_match_every_step(tiny_ckpt, tmp_path):
    spec = _spec(tmp_path, tiny_ckpt, "mlmt", {"critic_reward": "helpfulness+verdict", "nu": 0.5},
                 train={"steps": 3})
    trainer = _trainer(spec)
    trainer.actors.verdict = lambda text: len(text) % 3 == 0  # any deterministic reader of a verdict
    trainer.train()
    rows = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # explained variance is undefined (absent) on a step whose r2 are all equal
        assert isinstance(r.get("value/explained_variance"), float) == (0.0 < r["r2"] < 1.0)
        assert 0.0 <= r["critic_verdict_match"] <= 1.0 and "value/mse_before" in r
        assert r["value/sigma"] >= 0.0  # METHOD v4: the unit of the value term, logged every step
    assert sum("value/explained_variance" in r for r in rows) >= 2
    # the buffer holds the last two steps' refinements only: 2 problems x 4 attempts x 1 x 1 per step
    model = trainer.algorithm.value_model
    assert model.sizes == [8, 8] and len(model.targets) == 16
    # value_features: feedback_pool (the default): the last token's state and the feedback's mean, [N, 2H]
    assert model.feats.shape[1] == 2 * trainer.policies["solver"].model.config.hidden_size
    # the checkpoint carries the buffer and its per-step bookkeeping (resume stays bit-identical)
    resumed = _trainer(spec)
    resumed.load_checkpoint(trainer.run_dir.latest_checkpoint())
    again = resumed.algorithm.value_model
    again.predict(model.feats[:1])  # builds the net, restoring the pending state
    assert again.sizes == model.sizes and torch.equal(again.feats, model.feats)
    assert torch.equal(again.targets, model.targets)
    assert torch.equal(again.predict(model.feats), model.predict(model.feats))


def test_experiments_check_equal_budgets(write_spec):
    from mlmt_bench.experiment import check_equal_budgets
    from mlmt_bench.spec import load_experiment

    base = minimal_spec()
    base["policies"] = {"solver": {"model": "tiny", "path": "x"}}
    base["train"] = {"steps": 2, "token_budget": 1000}
    arms = {"a": {}, "b": {"train": {"token_budget": 2000}}}
    exp, specs = load_experiment(write_spec({"name": "e", "base": base, "arms": arms}))
    with pytest.raises(UserError, match="same train.token_budget"):
        check_equal_budgets(exp, specs)
    exp, specs = load_experiment(write_spec({"name": "e", "base": base, "arms": {"a": {}, "b": {}}, "budget": "flops"}))
    with pytest.raises(UserError, match="same train.flop_budget"):
        check_equal_budgets(exp, specs)
    both = {**base, "train": {"steps": 2, "token_budget": 1000, "flop_budget": 1e9}}
    exp, specs = load_experiment(write_spec({"name": "e", "base": both, "arms": {"a": {}}, "budget": "flops"}))
    with pytest.raises(UserError, match="train.token_budget is set"):
        check_equal_budgets(exp, specs)
    exp, specs = load_experiment(write_spec({"name": "e", "base": base, "arms": {"a": {}, "b": {}}}))
    check_equal_budgets(exp, specs)
