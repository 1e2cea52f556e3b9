"""GRPO-family loss variants of METHOD.md v2 (GSPO's sequence ratio, CISPO, policy shaping of
off-policy responses, a weighted log-likelihood term) against hand-computed numbers, and against
TRL's own loss code on the same tensors where TRL implements the same variant."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from mlmt_bench.algorithms.core import grpo_loss, policy_loss_terms

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def test_sequence_ratio_is_one_length_normalised_ratio_clipped_per_sequence():
    # row 0: log-ratios 0.1, 0.5 -> mean 0.3 -> rho = e^0.3 = 1.3499 > 1.2: clipped (A > 0) -> loss -1.2 * A
    # row 1: log-ratios -0.1 over one token -> rho = e^-0.1 = 0.9048, A < 0: unclipped -> -0.9048 * A
    logp = t([[0.1, 0.5], [-0.1, 0.0]])
    old = torch.zeros_like(logp)
    mask = t([[1, 1], [1, 0]])
    pt, clipped = policy_loss_terms(logp, old, t([1.0, -2.0]), mask, 0.2, 0.2, ratio="sequence")
    assert pt[0].tolist() == pytest.approx([-1.2, -1.2])
    assert pt[1, 0].item() == pytest.approx(2.0 * math.exp(-0.1)) and pt[1, 1].item() == 0.0
    assert clipped.tolist() == [[True, True], [False, False]]
    # token ratios would clip only the second token of row 0 (e^0.5 > 1.2 > e^0.1)
    pt_tok, clipped_tok = policy_loss_terms(logp, old, t([1.0, -2.0]), mask, 0.2, 0.2)
    assert pt_tok[0].tolist() == pytest.approx([-math.exp(0.1), -1.2]) and clipped_tok[0].tolist() == [False, True]


def test_cispo_weight_is_capped_and_stopped_so_every_token_keeps_a_gradient():
    logp = t([[math.log(0.5), math.log(0.25)]]).requires_grad_(True)
    old = t([[math.log(0.5), math.log(0.025)]])  # ratios 1 and 10
    pt, clipped = policy_loss_terms(logp, old, t([2.0]), t([[1, 1]]), 0.2, 0.2, loss="cispo", cispo_max=5.0)
    # loss per token = -min(rho, 5) * A * log pi: -1 * 2 * log .5 and -5 * 2 * log .25
    assert pt[0].tolist() == pytest.approx([-2 * math.log(0.5), -10 * math.log(0.25)])
    assert clipped.tolist() == [[False, True]]
    pt.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-2.0, -10.0])  # the capped token still moves


def test_shaped_and_sft_rows():
    # shaped: -A * pi / (pi + gamma), pi = e^logp = 0.3, gamma = 0.1 -> -A * 0.75;
    # gradient -A * gamma * pi / (pi+gamma)^2
    logp = t([[math.log(0.3)], [math.log(0.3)], [math.log(0.3)]]).requires_grad_(True)
    kinds = ["shaped", "sft", "policy"]
    pt, clipped = policy_loss_terms(logp, logp.detach() + 1.0, t([2.0, 0.5, -1.0]), t([[1], [1], [1]]), 0.2, 0.2,
                                    row_kinds=kinds, shaping_gamma=0.1)
    assert pt[0, 0].item() == pytest.approx(-2 * 0.75) and pt[1, 0].item() == pytest.approx(-0.5 * math.log(0.3))
    pt[:2].sum().backward()
    d_dlogp_shaped = -2 * 0.1 * 0.3 / 0.4 ** 2  # d/dlogp of pi/(pi+g) = g*pi/(pi+g)^2
    assert logp.grad[:2, 0].tolist() == pytest.approx([d_dlogp_shaped, -0.5])
    assert clipped.tolist() == [[False], [False], [True]]  # the "policy" row: ratio e^-1 < 0.8, A < 0: clipped
    with pytest.raises(ValueError, match="row_kinds"):  # a distill row is the auxiliary term's, not the policy loss's
        policy_loss_terms(logp, logp.detach(), t([1.0, 1.0, 1.0]), t([[1], [1], [1]]), 0.2, 0.2,
                          row_kinds=["policy", "distill", "policy"])


# ---------------------------------------------------------------------------------------------
# TRL's GRPOTrainer._compute_loss on the same tensors


def _trl_loss(logp, old, adv, mask, *, loss_type, level, eps_low, eps_high):
    from trl.trainer.grpo_trainer import GRPOTrainer  # in the dev extra: a missing TRL fails, never skips

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    acc = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x, gather_for_metrics=lambda x: x,
                          reduce=lambda x, reduction="sum": x)
    trainer.__dict__.update(
        top_entropy_quantile=1.0, _entropy_bonus_enabled=False, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=0.0, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        use_vllm=False, vllm_importance_sampling_correction=False, current_gradient_accumulation_steps=1,
        accelerator=acc, model=SimpleNamespace(training=True), _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1))
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    b, n = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, n, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    return GRPOTrainer._compute_loss(trainer, None, inputs)


CASES = [  # (TRL loss_type, TRL importance_sampling_level, our ratio, our loss, our aggregation)
    ("grpo", "sequence", "sequence", "clip", "seq_mean_token_mean"),  # GSPO as TRL documents it
    ("grpo", "token", "token", "clip", "seq_mean_token_mean"),
    ("dapo", "token", "token", "clip", "token_mean"),
    ("cispo", "token", "token", "cispo", "token_mean"),
]


@pytest.mark.parametrize("trl_loss,level,ratio,loss,agg", CASES)
def test_matches_trl_on_the_same_tensors(trl_loss, level, ratio, loss, agg):
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, generator=gen, dtype=torch.float32) - 1.5
    old = (base + 0.4 * torch.randn(4, 6, generator=gen)).detach()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]])
    adv = torch.tensor([1.3, -0.7, 0.2, -1.1])
    eps_low, eps_high = (0.2, 5.0) if loss == "cispo" else (0.2, 0.28)
    ours_logp = base.clone().requires_grad_(True)
    ours, _ = grpo_loss(ours_logp, old, None, adv, mask, clip_low=eps_low, clip_high=eps_high, agg=agg, ratio=ratio,
                        loss=loss, cispo_max=eps_high)
    ours.backward()
    trl_logp = base.clone().requires_grad_(True)
    ref = _trl_loss(trl_logp, old, adv, mask, loss_type=trl_loss, level=level, eps_low=eps_low, eps_high=eps_high)
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(ours_logp.grad, trl_logp.grad, rtol=1e-5, atol=1e-7)
    assert ours_logp.grad.abs().sum() > 0
