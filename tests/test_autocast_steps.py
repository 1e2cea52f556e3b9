"""Weights trained inside one ``torch.autocast`` region are seen by the next forward.

The trainer runs a whole run in one CPU bfloat16 autocast region (``runner.cpu_autocast``); autocast
caches its cast of a leaf weight that requires grad for the whole region, so until
``drop_cached_casts`` followed every optimiser step, each forward after the first step computed
with the first step's weights (SmolLM2's policies never moved in their own rollouts; the warm
start's loss stayed flat). Each test fails without it.
"""

from __future__ import annotations

import random

import pytest
import torch

from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
from mlmt_bench.models.forward import sequence_logprobs
from mlmt_bench.models.policy import Policy
from mlmt_bench.models.tiny import load_checkpoint
from mlmt_bench.warmstart.sft import sft

AUTOCAST = dict(device_type="cpu", dtype=torch.bfloat16)


def test_sft_loss_falls_inside_one_autocast_region(tiny_ckpt, one_torch_thread):
    model, tok = load_checkpoint(tiny_ckpt)
    ids = tok.encode("7+5=12;12*3=36", add_special_tokens=False)
    example = (ids, [(4, len(ids), 1.0)])
    losses: list[float] = []
    with torch.autocast(**AUTOCAST):
        sft(model, lambda rng, step: example, steps=6, batch=2, lr=1e-2, warmup_frac=0.0, rng=random.Random(0),
            pad_id=tok.pad_token_id, on_step=lambda step, loss: losses.append(loss))
    assert losses[-1] < 0.8 * losses[0], losses


def test_policy_update_is_seen_by_the_next_forward_in_the_same_region(tiny_ckpt, one_torch_thread):
    model, tok = load_checkpoint(tiny_ckpt)
    policy = Policy("solver", model, tok, True, 1e-2, 1, init_path=str(tiny_ckpt))
    items = [TrainItem([5, 6], [7, 8, 9], 1.0)]
    cfg = LossConfig(0.2, 0.2, "token_mean", 1, 1, 1e9)
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    with torch.autocast(**AUTOCAST):
        before = sequence_logprobs(model, items, tok.pad_token_id)[0].sum().item()
        update_policy(policy, opt, None, items, cfg)
        inside = sequence_logprobs(model, items, tok.pad_token_id)[0].sum().item()
    with torch.autocast(**AUTOCAST):  # a fresh region casts the current weights
        fresh = sequence_logprobs(model, items, tok.pad_token_id)[0].sum().item()
    assert inside != before
    assert inside == pytest.approx(fresh, abs=1e-6)


def test_value_head_fit_is_seen_by_its_next_prediction_in_the_same_region():
    from mlmt_bench.algorithms.value import ValueModel

    gen = torch.Generator().manual_seed(0)
    feats, targets = torch.randn(64, 8, generator=gen), torch.rand(64, generator=gen)
    value = ValueModel(lr=1e-2, hidden=16, fit_steps=20)
    with torch.autocast(**AUTOCAST):
        before = value.predict(feats)
        value.fit(feats, targets)
        inside = value.predict(feats)
    with torch.autocast(**AUTOCAST):
        fresh = value.predict(feats)
    assert not torch.equal(inside, before)
    assert torch.allclose(inside, fresh, atol=1e-6)
