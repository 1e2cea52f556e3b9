"""Policy-loss variants are registered pure functions (mlmt_bench/algorithms/losses.py): a variant
registered here, outside the package, runs through grpo_loss, the params' validation and the
shared update with its own option, and nothing else changes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mlmt_bench.algorithms import losses
from mlmt_bench.algorithms.core import grpo_loss
from mlmt_bench.algorithms.params import GRPOParams
from mlmt_bench.algorithms.update import LossConfig, TrainItem, sequence_logprobs, update_policy

D = torch.float64


@pytest.fixture
def reinforce():
    """A toy variant, -scale * A * log pi_theta (REINFORCE, no ratio), registered for one test."""

    @losses.register_policy_loss("toy_reinforce")
    def toy(logp, ratio, advantages, mask, *, scale: float = 1.0):
        return -scale * advantages * logp, torch.zeros_like(mask)

    yield toy
    del losses.POLICY_LOSSES["toy_reinforce"]


def test_built_in_variants_are_registered():
    assert list(losses.POLICY_LOSSES) == ["clip", "cispo"] and list(losses.RATIOS) == ["token", "sequence"]
    assert losses.options_of("clip") == ("clip_low", "clip_high") and losses.options_of("cispo") == ("cispo_max",)


def test_a_variant_registered_in_a_test_runs_through_grpo_loss(reinforce):
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = grpo_loss(logp, logp.detach() - 0.3, None, torch.tensor([1.5], dtype=D), mask, loss="toy_reinforce",
                            loss_options={"scale": 2.0})
    # token_mean of -2 * 1.5 * log pi over the two masked tokens; gradient -2 * 1.5 / 2 on each
    assert loss.item() == pytest.approx(-3.0 * (math.log(0.5) + math.log(0.25)) / 2)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.5, -1.5, 0.0])
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(math.exp(0.3))
    with pytest.raises(TypeError, match="scal"):  # an option the variant does not take
        grpo_loss(logp, logp.detach(), None, torch.tensor([1.5], dtype=D), mask, loss="toy_reinforce",
                  loss_options={"scal": 2.0})


def test_params_validate_the_name_and_the_options_against_the_registry(reinforce):
    p = GRPOParams(loss="toy_reinforce", loss_options={"scale": 2.0})
    assert p.loss_terms().loss == "toy_reinforce" and p.loss_terms().loss_options == {"scale": 2.0}
    for bad, match in [({"loss": "cisp"}, "did you mean 'cispo'"), ({"ratio": "sequnce"}, "did you mean 'sequence'"),
                       ({"loss": "toy_reinforce", "loss_options": {"scal": 1.0}}, "did you mean 'scale'"),
                       ({"loss_options": {"scale": 1.0}}, "not an option of loss 'clip'"),
                       ({"loss": "cispo", "loss_options": {"cispo_max": 3.0}}, "a parameter of its own")]:
        with pytest.raises(ValueError, match=match):
            GRPOParams(**bad)


def test_registration_checks_the_signature_and_refuses_a_second_one_of_a_name():
    with pytest.raises(TypeError, match="option=default"):
        losses.register_policy_loss("bad")(lambda logp, ratio, advantages, mask, **kw: (logp, mask))
    with pytest.raises(TypeError, match="option=default"):
        losses.register_policy_loss("bad")(lambda logp, ratio, advantages, mask, *, scale: (logp, mask))
    with pytest.raises(ValueError, match="already registered"):
        losses.register_policy_loss("clip")(losses.clip_loss)
    assert "bad" not in losses.POLICY_LOSSES


def test_a_registered_variant_runs_through_the_shared_update(tiny_ckpt, reinforce):
    """From the params to update_policy as the trainer builds its LossConfig (trainer.py), untouched."""
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    items = [TrainItem([5, 6], [7, 8, 9], 1.0), TrainItem([5, 6, 7], [8], -0.5)]
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, items, tok.pad_token_id)[:2]
        adv = torch.tensor([1.0, -0.5]).unsqueeze(1)
        expected = float((-2.0 * adv * logp)[mask.bool()].sum() / mask.sum())
    terms = GRPOParams(loss="toy_reinforce", loss_options={"scale": 2.0}).loss_terms()
    cfg = LossConfig(**dataclasses.asdict(terms), grad_accum=1, grad_clip=1e9)
    policy = Policy("solver", model, tok, True, 1e-3, 1, init_path=str(tiny_ckpt))
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    stats = update_policy(policy, opt, None, items, cfg)
    assert stats["loss"] == pytest.approx(expected, rel=1e-5) and stats["grad_norm"] > 0
