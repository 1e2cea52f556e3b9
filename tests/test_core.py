"""Tests for mlmt_bench.algorithms.core against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mlmt_bench.algorithms.advantages import SCALE_ESTIMATORS
from mlmt_bench.algorithms.core import (
    aggregate,
    critic_advantages,
    entropy_from_logits,
    frac_zero_std,
    group_advantages,
    group_max,
    group_mean,
    grpo_loss,
    higher_level_reward,
    kl_k3,
    mean_by_parent,
    mlmt_turn1_reward,
    policy_loss_terms,
    progress_bonus_reward,
    token_logprobs,
    value_penalty_reward,
    value_sigma,
    verdict_reward,
    zero_std_mask,
)

D = torch.float64


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def ids(x):
    return torch.tensor(x, dtype=torch.long)


# --------------------------------------------------------------------------- advantages


def test_group_advantages_one_group_sample_std():
    # r = [1,0,0,1]: mean 0.5, deviations ±0.5, sum sq = 4*0.25 = 1,
    # sample var = 1/(4-1) = 1/3, std = 0.57735; A = ±0.5/0.57735 = ±0.866025
    adv = group_advantages(t([1, 0, 0, 1]), ids([0, 0, 0, 0]), eps=0.0)
    s = math.sqrt(1 / 3)
    assert torch.allclose(adv, t([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]))
    assert abs(adv[0].item() - 0.8660254) < 1e-6
    # with the default eps=1e-6 the value moves by ~1.5e-6 only
    adv_eps = group_advantages(t([1, 0, 0, 1]), ids([0, 0, 0, 0]))
    assert abs(adv_eps[0].item() - 0.5 / (s + 1e-6)) < 1e-12


def test_group_advantages_several_groups_noncontiguous_ids():
    # group 7: [1, 0, 0] mean 1/3; deviations 2/3, -1/3, -1/3;
    #   sum sq = 4/9 + 1/9 + 1/9 = 6/9, sample var = (6/9)/2 = 1/3, std = 0.57735
    #   A = 0.6667/0.57735 = 1.154701, -0.3333/0.57735 = -0.577350
    # group 3: [0.5, 0.5] zero variance -> 0, 0
    # group 11: [0.2] singleton -> 0
    r = t([1, 0.5, 0, 0.2, 0.5, 0])
    g = ids([7, 3, 7, 11, 3, 7])
    adv = group_advantages(r, g, eps=0.0)
    s = math.sqrt(1 / 3)
    expected = t([(2 / 3) / s, 0, (-1 / 3) / s, 0, 0, (-1 / 3) / s])
    assert torch.allclose(adv, expected)
    assert abs(adv[0].item() - 1.1547005) < 1e-6


def test_group_advantages_scale_none_is_centring_only():
    # Dr.GRPO: group 0 [1,0,0] -> mean 1/3 -> [2/3, -1/3, -1/3]; group 1 [0.25, 0.75] -> [-.25, .25]
    adv = group_advantages(t([1, 0, 0, 0.25, 0.75]), ids([0, 0, 0, 1, 1]), scale="none")
    assert torch.allclose(adv, t([2 / 3, -1 / 3, -1 / 3, -0.25, 0.25]))


def test_group_advantages_equal_rewards_exactly_zero():
    # 0.1*3/3 is not exactly 0.1 in floating point; the zero-variance group must still give 0
    adv = group_advantages(t([0.1, 0.1, 0.1]), ids([0, 0, 0]), eps=0.0)
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_group_advantages_singleton_and_bad_scale():
    assert group_advantages(t([0.9]), ids([0])).tolist() == [0.0]
    assert group_advantages(t([0.9]), ids([0]), scale="none").tolist() == [0.0]
    with pytest.raises(ValueError):
        group_advantages(t([1.0, 0.0]), ids([0, 0]), scale="mad")
    with pytest.raises(ValueError):
        group_advantages(t([1.0, 0.0]), ids([0]))


def test_zero_std_mask_and_frac():
    # groups: 0 -> [1,1] zero var; 1 -> [0,1] varied; 2 -> [0.3] singleton (zero var)
    r = t([1, 1, 0, 1, 0.3])
    g = ids([0, 0, 1, 1, 2])
    assert zero_std_mask(r, g).tolist() == [True, True, False, False, True]
    # 2 of 3 groups have zero variance
    assert frac_zero_std(r, g) == pytest.approx(2 / 3)
    assert frac_zero_std(t([]), ids([])) == 0.0


def test_group_mean_max_and_mean_by_parent():
    r = t([1, 0, 0.5, 0.25])
    g = ids([5, 5, 2, 2])
    # group 5: mean .5, max 1; group 2: mean .375, max .5
    assert torch.allclose(group_mean(r, g), t([0.5, 0.5, 0.375, 0.375]))
    assert torch.allclose(group_max(r, g), t([1, 1, 0.5, 0.5]))
    # r2 of 4 refinements; parents [0,0,1,1] -> [(1+0)/2, (1+1)/2]; parent 2 childless -> NaN
    m = mean_by_parent(t([1, 0, 1, 1]), ids([0, 0, 1, 1]), 3)
    assert m[:2].tolist() == [0.5, 1.0]
    assert math.isnan(m[2].item())


# --------------------------------------------------------------------------- losses


def test_policy_loss_terms_by_hand():
    # eps_low = 0.2, eps_high = 0.2 -> clip range [0.8, 1.2]
    # token0: rho 1.5, A=+1: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped
    # token1: rho 0.5, A=+1: min(0.5, 0.8) = 0.5 -> loss -0.5, not clipped
    # token2 (seq 1, A=-1): rho 0.5: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped
    # token3 (seq 1, A=-1): rho 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped
    # token4: padding (mask 0) -> loss 0, not clipped, even with a huge log-ratio
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    logp = t([[math.log(1.5), math.log(0.5), 0.0], [math.log(0.5), math.log(1.5), 1000.0]])
    logp.requires_grad_(True)
    mask = t([[1, 1, 0], [1, 1, 0]])
    loss, clipped = policy_loss_terms(logp, old, t([1.0, -1.0]), mask, 0.2, 0.2)
    assert torch.allclose(loss.detach(), t([[-1.2, -0.5, 0.0], [0.8, 1.5, 0.0]]))
    assert clipped.tolist() == [[True, False, False], [True, False, False]]
    # gradient: d(-rho*A)/dlogp = -rho*A where unclipped, 0 where clipped or masked
    loss.sum().backward()
    assert torch.allclose(logp.grad, t([[0.0, -0.5, 0.0], [0.0, 1.5, 0.0]]))
    assert torch.isfinite(logp.grad).all()


def test_policy_loss_terms_asymmetric_clip():
    # clip_low 0.1, clip_high 0.3 -> range [0.9, 1.3]
    # rho 1.25, A=+2: inside (1.25 < 1.3) -> loss -2.5, not clipped
    # rho 0.85, A=-1: 0.85 < 0.9 -> min(-0.85, -0.9) = -0.9 -> loss 0.9, clipped
    logp = t([[math.log(1.25)], [math.log(0.85)]])
    loss, clipped = policy_loss_terms(logp, t([[0.0], [0.0]]), t([2.0, -1.0]), t([[1], [1]]), 0.1, 0.3)
    assert torch.allclose(loss, t([[-2.5], [0.9]]))
    assert clipped.tolist() == [[False], [True]]


def test_kl_k3_by_hand():
    # d = ref - logp: log 2 -> 2 - 0.693147 - 1 = 0.306853; 0 -> 0; -log 2 -> 0.5 + 0.693147 - 1 = 0.193147
    logp = t([[0.0, -1.0, math.log(2)]])
    ref = t([[math.log(2), -1.0, 0.0]])
    kl = kl_k3(logp, ref)
    assert torch.allclose(kl, t([[2 - math.log(2) - 1, 0.0, 0.5 + math.log(2) - 1]]))
    assert abs(kl[0, 0].item() - 0.306853) < 1e-6


def test_aggregate_modes_by_hand():
    x = t([[1, 2, 3], [4, 99, float("nan")]])  # masked-out entries must not matter, even NaN
    mask = t([[1, 1, 1], [1, 0, 0]])
    # token_mean: (1+2+3+4)/4 = 2.5
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(2.5)
    # seq_mean_token_mean: mean((1+2+3)/3, 4/1) = mean(2, 4) = 3
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx(3.0)
    # constant_norm: 10 / (B*T) = 10/6; with the constant norm = 40 (e.g. max_new_tokens 5 x 8 sampled
    # sequences, six of them with no tokens here): 10/40
    assert aggregate(x, mask, "constant_norm").item() == pytest.approx(10 / 6)
    assert aggregate(x, mask, "constant_norm", norm=40).item() == pytest.approx(0.25)
    with pytest.raises(ValueError):
        aggregate(x, mask, "sum")


def test_aggregate_empty_sequence_counts_in_seq_mean():
    # seq 0 has no tokens: contributes 0, still counts -> (0 + 2)/2 = 1
    x = t([[5.0, 5.0], [2.0, 2.0]])
    mask = t([[0, 0], [1, 1]])
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx(1.0)
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(2.0)


def test_grpo_loss_small_by_hand():
    # one sequence, two tokens, A = 1, rho = [1.5, 1.0], clip 0.2, beta 0.5,
    # ref - logp = [0, log 2] -> kl = [0, 0.306853]
    # pg = [-1.2 (clipped), -1.0]; per token = [-1.2, -1.0 + 0.5*0.306853 = -0.846574]
    # token_mean = (-1.2 - 0.846574)/2 = -1.023287
    logp = t([[math.log(1.5), 0.0]])
    old = t([[0.0, 0.0]])
    ref = t([[math.log(1.5), math.log(2)]])
    loss, stats = grpo_loss(logp, old, ref, t([1.0]), t([[1, 1]]), beta=0.5)
    kl2 = 2 - math.log(2) - 1
    assert loss.item() == pytest.approx((-1.2 + (-1.0 + 0.5 * kl2)) / 2)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["kl"] == pytest.approx(kl2 / 2)
    assert stats["ratio_mean"] == pytest.approx(1.25)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, None, t([1.0]), t([[1, 1]]), beta=0.1)
    _, stats0 = grpo_loss(logp, old, None, t([1.0]), t([[1, 1]]))
    assert stats0["kl"] == 0.0


# ---------------------------------------------------------------- float64 parity test


def _reference_loss(logits, ids_, old_logp, ref_logp, adv, mask, clip_low, clip_high, beta, agg):
    """Straightforward loop implementation, sharing no code with core.py."""
    B, T, V = logits.shape
    seq_sums, seq_counts = [], []
    total = logits.new_zeros(())
    n_tok = 0
    n_clipped = 0
    for b in range(B):
        s = logits.new_zeros(())
        c = 0
        for k in range(T):
            if mask[b][k] == 0:
                continue
            row = logits[b, k]
            m = max(row[v].item() for v in range(V))
            z = sum(torch.exp(row[v] - m) for v in range(V))
            lp = row[int(ids_[b][k])] - m - torch.log(z)
            ratio = torch.exp(lp - float(old_logp[b][k]))
            a = float(adv[b])
            lo, hi = 1 - clip_low, 1 + clip_high
            r_clip = lo if ratio.item() < lo else (hi if ratio.item() > hi else ratio)
            unclipped = ratio * a
            clipped = r_clip * a
            clipped_val = clipped if isinstance(clipped, torch.Tensor) else torch.tensor(clipped, dtype=D)
            if clipped_val.item() < unclipped.item():
                pg = -clipped_val
                n_clipped += 1
            else:
                pg = -unclipped
            d = float(ref_logp[b][k]) - lp
            kl = torch.exp(d) - d - 1
            val = pg + beta * kl
            s = s + val
            c += 1
        seq_sums.append(s)
        seq_counts.append(c)
        total = total + s
        n_tok += c
    if agg == "token_mean":
        loss = total / n_tok
    elif agg == "seq_mean_token_mean":
        loss = sum(s / max(c, 1) for s, c in zip(seq_sums, seq_counts)) / B
    else:
        loss = total / (B * T)
    return loss, n_clipped / n_tok


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant_norm"])
def test_grpo_loss_float64_parity_with_loop_reference(agg):
    B, T, V = 3, 4, 5
    gen = torch.Generator().manual_seed(1234)
    base = torch.randn(B, T, V, generator=gen, dtype=D)
    tok = torch.randint(0, V, (B, T), generator=gen)
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    adv = t([1.0, -0.7, 0.4])
    clip_low, clip_high, beta = 0.1, 0.25, 0.05
    with torch.no_grad():
        lp0 = torch.log_softmax(base, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    # log-ratio offsets chosen so that some ratios leave the clip range [0.9, 1.25] on both sides
    offsets = t([[0.5, -0.3, 0.05, 0.0], [-0.4, 0.35, 0.0, 0.0], [0.1, -0.05, 0.3, 0.0]])
    old_logp = lp0 - offsets
    ref_logp = lp0 + 0.2 * torch.randn(B, T, generator=gen, dtype=D)
    assert (offsets.exp() > 1 + clip_high).any() and (offsets.exp() < 1 - clip_low).any()

    logits_a = base.clone().requires_grad_(True)
    logp = token_logprobs(logits_a, tok)
    loss, stats = grpo_loss(
        logp, old_logp, ref_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, beta=beta, agg=agg
    )
    loss.backward()

    logits_b = base.clone().requires_grad_(True)
    ref_loss, ref_clip_frac = _reference_loss(
        logits_b, tok, old_logp, ref_logp, adv, mask, clip_low, clip_high, beta, agg
    )
    ref_loss.backward()

    assert abs(loss.item() - ref_loss.item()) < 1e-6
    assert torch.allclose(logits_a.grad, logits_b.grad, atol=1e-6, rtol=0)
    assert stats["clip_frac"] == pytest.approx(ref_clip_frac)
    assert 0 < stats["clip_frac"] < 1  # some but not all tokens are clipped
    assert logits_a.grad.abs().sum() > 0


# --------------------------------------------------------------------------- logits


def test_token_logprobs_and_entropy_by_hand():
    # position 0: logits [0, ln 3] -> p = [1/4, 3/4]
    #   logp(id 1) = ln .75 = -0.287682; H = -(.25 ln .25 + .75 ln .75) = 0.562335
    # position 1: uniform over 2 -> logp(id 0) = ln .5; H = ln 2 = 0.693147
    logits = t([[[0.0, math.log(3)], [7.0, 7.0]]])
    lp = token_logprobs(logits, ids([[1, 0]]))
    assert torch.allclose(lp, t([[math.log(0.75), math.log(0.5)]]))
    h = entropy_from_logits(logits)
    assert torch.allclose(h, t([[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)]]))
    assert abs(h[0, 0].item() - 0.562335) < 1e-6


def test_token_logprobs_half_precision_upcasts():
    logits = torch.zeros(1, 1, 4, dtype=torch.bfloat16)
    lp = token_logprobs(logits, ids([[2]]))
    assert lp.dtype == torch.float32
    assert lp.item() == pytest.approx(-math.log(4), abs=1e-6)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4), abs=1e-6)


# --------------------------------------------------------------------------- MLMT rewards


def test_higher_level_reward_and_penalty_by_hand():
    # u = [1, 0], V = [0.8, 0.2], lam 0.5, one group
    # R_H = u + lam V = [1.4, 0.1]
    # V* = 0.8; penalty form = u - lam (V* - V) = [1 - 0, 0 - 0.5*0.6] = [1.0, -0.3]
    # the two differ by lam * V* = 0.4 in every entry
    u, v, g = t([1.0, 0.0]), t([0.8, 0.2]), ids([0, 0])
    rh = higher_level_reward(u, v, 0.5)
    rp = value_penalty_reward(u, v, 0.5, g)
    assert torch.allclose(rh, t([1.4, 0.1]))
    assert torch.allclose(rp, t([1.0, -0.3]))
    # scale none: both centre to [0.65, -0.65]
    assert torch.allclose(group_advantages(rh, g, scale="none"), t([0.65, -0.65]))
    assert torch.allclose(group_advantages(rp, g, scale="none"), t([0.65, -0.65]))


@pytest.mark.parametrize("scale", ["std", "none"])
def test_value_penalty_gives_same_advantages(scale):
    # METHOD.md: u + lam*V and u - lam*(V* - V) differ by lam*V*_g, constant within a group,
    # so the group-relative advantages coincide.
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(9, generator=gen, dtype=D)
    v = torch.rand(9, generator=gen, dtype=D)
    g = ids([4, 4, 4, 9, 9, 1, 1, 1, 1])
    for lam in (0.0, 0.3, 2.0):
        a_h = group_advantages(higher_level_reward(u, v, lam), g, scale=scale)
        a_p = group_advantages(value_penalty_reward(u, v, lam, g), g, scale=scale)
        assert torch.allclose(a_h, a_p, atol=1e-12, rtol=0)
        # v3/v4, the value after standardisation: centring the penalty's value part -lam (V* - V)
        # gives lam (V - mean V), the value term of critic_advantages before its division by sigma_V
        penalty_part = value_penalty_reward(u, v, lam, g) - u
        a_v4 = group_advantages(u, g, scale=scale) + group_advantages(penalty_part, g, scale="none") / v.std()
        assert torch.allclose(critic_advantages(u, v, lam, g, SCALE_ESTIMATORS[scale]), a_v4, atol=1e-12, rtol=0)


def test_critic_advantages_flat_u_bar_trains_nothing_without_value_signal():
    # METHOD.md v3: A_H = std_group(ū) + λ (V − mean_group V). ū flat ([1, 1, 1]) -> first term 0;
    # V constant (0.1 three times: its float mean is 0.1 + 1.4e-17) -> second term exactly 0
    for scale in ("std", "none"):
        a = critic_advantages(t([1.0, 1.0, 1.0]), t([0.1, 0.1, 0.1]), 0.5, ids([0, 0, 0]), SCALE_ESTIMATORS[scale])
        assert torch.equal(a, torch.zeros(3, dtype=D))


def test_critic_advantages_flat_u_bar_gets_exactly_the_centred_value_over_sigma_v():
    # ū = [1, 1] flat; V = [0.2, 0.6], mean 0.4, batch sample std sqrt(0.08) = 0.282843 (v4: the
    # value term in units of the standardised advantage); λ = 0.5 -> 0.5 * [-0.2, 0.2] / 0.282843
    # = [-0.353553, 0.353553]: never divided by the rewards' std
    a = critic_advantages(t([1.0, 1.0]), t([0.2, 0.6]), 0.5, ids([0, 0]))
    assert torch.allclose(a, t([-0.353553, 0.353553]), atol=1e-6, rtol=0)
    # the unit is the batch's sigma_V, not the group's: a second group with V spread 10x wider
    # ([0.0, 0.8] around 0.4) makes sigma_V = std([0.2, 0.6, 0.0, 0.8]) = sqrt(0.4 / 3) = 0.365148,
    # so the first group's term is 0.5 * 0.2 / 0.365148 = 0.273861
    a = critic_advantages(t([1.0, 1.0, 1.0, 1.0]), t([0.2, 0.6, 0.0, 0.8]), 0.5, ids([0, 0, 1, 1]))
    assert torch.allclose(a[:2], t([-0.273861, 0.273861]), atol=1e-6, rtol=0)


def test_critic_advantages_by_hand():
    # sigma_V: V = [0.2, 0.5, 0.8, 0.9, 0.1], mean 0.5, squared deviations .09 0 .09 .16 .16 sum 0.5,
    #   sample var 0.5 / 4 = 0.125, sigma_V = 0.353553; λ / sigma_V = 1.414214
    # group 7: ū = [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3], sum sq 2/3, sample var 1/3,
    #   std 0.577350; std part = [1.154700, -0.577350, -0.577350]
    #   V = [0.2, 0.5, 0.8], mean 0.5 -> [-0.3, 0, 0.3] * 1.414214 = [-0.424264, 0, 0.424264]
    #   A = [0.730436, -0.577350, -0.153086]
    # group 3: ū = [0, 1]: ∓0.707107; V = [0.9, 0.1], mean 0.5 -> [0.4, -0.4] * 1.414214 = ±0.565685
    #   A = [-0.141422, 0.141422]
    u, v, g = t([1.0, 0.0, 0.0, 0.0, 1.0]), t([0.2, 0.5, 0.8, 0.9, 0.1]), ids([7, 7, 7, 3, 3])
    assert value_sigma(v) == pytest.approx(0.353553, abs=1e-6)
    a = critic_advantages(u, v, 0.5, g)
    assert torch.allclose(a, t([0.730436, -0.577350, -0.153086, -0.141422, 0.141422]), atol=2e-6, rtol=0)
    # scale none (Dr.GRPO): ū only centred: [2/3, -1/3, -1/3] + [-0.424264, 0, 0.424264];
    # [-0.5, 0.5] + [0.565685, -0.565685]
    a = critic_advantages(u, v, 0.5, g, "dr_grpo")
    assert torch.allclose(a, t([2 / 3 - 0.424264, -1 / 3, -1 / 3 + 0.424264, 0.065685, -0.065685]), atol=2e-6,
                          rtol=0)
    # λ = 0 is group_advantages of ū; a singleton group gets 0 from both terms
    assert torch.equal(critic_advantages(u, v, 0.0, g), group_advantages(u, g))
    assert critic_advantages(t([1.0]), t([0.7]), 0.5, ids([0])).item() == 0.0
    assert value_sigma(t([0.7])) == 0.0 and value_sigma(t([0.3, 0.3])) == 0.0  # no spread: no value term


def test_verdict_reward_by_hand():
    # ū = [1, 0, 0.5], match = [0, 1, 1], ν = 0.5 -> [1, 0.5, 1.0]
    assert torch.allclose(verdict_reward(t([1.0, 0.0, 0.5]), t([0.0, 1.0, 1.0]), 0.5), t([1.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        verdict_reward(t([1.0]), t([0.0, 1.0]), 0.5)


def test_value_is_stop_gradient():
    u = t([1.0, 0.0])
    v = t([0.8, 0.2]).requires_grad_(True)
    assert not higher_level_reward(u, v, 0.5).requires_grad
    assert not value_penalty_reward(u, v, 0.5, ids([0, 0])).requires_grad
    assert not critic_advantages(u, v, 0.5, ids([0, 0])).requires_grad


def test_lower_level_rewards_by_hand():
    # r2 of refinements [1,0 | 1,1] averaged per attempt -> [0.5, 1.0]
    # turn-1 reward r1 + eta r2: r1 = [1, 0], eta 1 -> [1.5, 1.0]; eta 0.5 -> [1.25, 0.5]
    r2_mean = mean_by_parent(t([1, 0, 1, 1]), ids([0, 0, 1, 1]), 2)
    assert torch.allclose(mlmt_turn1_reward(t([1, 0]), r2_mean), t([1.5, 1.0]))
    assert torch.allclose(mlmt_turn1_reward(t([1, 0]), r2_mean, eta=0.5), t([1.25, 0.5]))
    # progress bonus r2 + 10 (r2 - r1): (1,1) -> 1; (0,1) -> 11; (0,0) -> 0; (1,0) -> -10
    out = progress_bonus_reward(t([1, 0, 0, 1]), t([1, 1, 0, 0]), alpha=10.0)
    assert out.tolist() == [1.0, 11.0, 0.0, -10.0]


def test_grpo_loss_per_sequence_beta_matches_scalar_beta_rowwise():
    # a [B, 1] beta equals computing each row with its own scalar beta (seq_mean_token_mean
    # averages rows, so the batch loss is the mean of the per-row losses)
    torch.manual_seed(0)
    logp = torch.randn(2, 3, dtype=torch.float64)
    old = logp + 0.1
    ref = logp - 0.2
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.ones(2, 3)
    betas = torch.tensor([[0.0], [0.3]], dtype=torch.float64)
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=betas, agg="seq_mean_token_mean")
    rows = [grpo_loss(logp[i:i + 1], old[i:i + 1], ref[i:i + 1], adv[i:i + 1], mask[i:i + 1],
                      beta=float(betas[i]), agg="seq_mean_token_mean")[0] for i in range(2)]
    assert torch.allclose(loss, (rows[0] + rows[1]) / 2)
