"""train.share_prompts: each distinct prompt read once, the completions after its KV cache; the same
log-probs, gradients and updates as the plain forward.

The tiny model runs in float64, but transformers' RMSNorm computes in float32: the forward values are
bit-identical (the same rows meet the same float32 roundings), while the gradients of a prompt read
once are its rows' gradients summed before that float32 norm's backward instead of after it, which
leaves float32-sized differences (~1e-7 relative); hence a tensor's gradient is compared within 1e-5 of its norm."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from mlmt_bench.algorithms.core import AGG_MODES
from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
from mlmt_bench.models.forward import sequence_logprobs
from mlmt_bench.models.policy import Policy, build_policy
from mlmt_bench.models.policy_spec import PolicySpec
from mlmt_bench.models.shared_prompts import (
    completion_layout,
    completion_mask,
    prompt_group_batches,
    shared_prompt_logprobs,
)
from mlmt_bench.spec import TrainSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _groups(prompts: int = 4, group: int = 3, seed: int = 0, beta: float = 0.0) -> list[TrainItem]:
    """``prompts`` prompts of 3..14 tokens, each with ``group`` completions of 1..9 tokens, shuffled
    (rows of one prompt need not be adjacent)."""
    rng = random.Random(seed)
    items = []
    for _ in range(prompts):
        prompt = [rng.randrange(5, 90) for _ in range(rng.randint(3, 14))]
        items += [TrainItem(prompt, [rng.randrange(5, 90) for _ in range(rng.randint(1, 9))],
                            advantage=rng.gauss(0.0, 1.0), beta=beta * (k % 2)) for k in range(group)]
    rng.shuffle(items)
    return items


@pytest.fixture(scope="module")
def tiny64(tiny_ckpt):
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    model.init_path = str(tiny_ckpt)  # where π_ref is loaded from
    return model.double().train(), tok


def _plain(model, items, pad_id):
    logp, _, entropy = sequence_logprobs(model, items, pad_id, with_entropy=True)
    return completion_layout(logp, items), completion_layout(entropy, items)


def test_completion_layout_puts_each_rows_tokens_first():
    items = [TrainItem([1, 2, 3], [7, 8], 0.0), TrainItem([1], [9, 9, 9], 0.0), TrainItem([4, 4], [], 0.0)]
    # plain layout: the shortest prompt is 1 token (s = 0), L = 5 → 4 columns predicting input tokens 1..4;
    # row 0's completion is input tokens 3, 4 (columns 2, 3), row 1's input tokens 1..3 (columns 0..2)
    values = torch.tensor([[-1.0, -1.0, 5.0, 6.0], [2.0, 3.0, 4.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    assert completion_layout(values, items).tolist() == [[5.0, 6.0, 0.0], [2.0, 3.0, 4.0], [0.0, 0.0, 0.0]]
    assert completion_mask(items).tolist() == [[True, True, False], [True, True, True], [False, False, False]]


def test_shared_prompts_give_the_plain_log_probs_and_gradients(tiny64):
    model, tok = tiny64
    items = _groups()
    grads = []
    outs = []
    for forward in ("plain", "shared"):
        model.zero_grad(set_to_none=True)
        if forward == "plain":
            logp, entropy = _plain(model, items, tok.pad_token_id)
        else:
            logp, mask, entropy = shared_prompt_logprobs(model, items, tok.pad_token_id, with_entropy=True)
            assert mask.tolist() == completion_mask(items).tolist()
        (logp * torch.linspace(-1, 1, logp.numel(), dtype=logp.dtype).view_as(logp)).sum().backward()
        outs.append((logp.detach(), entropy))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    mask = completion_mask(items)
    torch.testing.assert_close(outs[1][0][mask], outs[0][0][mask], atol=1e-10, rtol=0)
    torch.testing.assert_close(outs[1][1][mask], outs[0][1][mask], atol=1e-10, rtol=0)
    assert float(outs[0][0][mask].abs().min()) > 0  # real log-probs, not an empty comparison
    for name, g in grads[0].items():
        assert float((grads[1][name] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-12, name
    assert max(float(g.abs().max()) for g in grads[0].values()) > 1e-4


def test_one_token_completions_and_distinct_prompts(tiny64):
    """Wc = 1 needs no second forward; no repeated prompt is the plain case, two forwards."""
    model, tok = tiny64
    for items in ([TrainItem([5, 6, 7], [8], 1.0), TrainItem([5, 6, 7], [9], 1.0), TrainItem([3], [4], 1.0)],
                  _groups(prompts=5, group=1, seed=4)):
        with torch.no_grad():
            logp, mask, _ = shared_prompt_logprobs(model, items, tok.pad_token_id)
            plain, _ = _plain(model, items, tok.pad_token_id)
        torch.testing.assert_close(logp[mask], plain[mask], atol=1e-10, rtol=0)


def test_a_reference_and_a_checkpointed_model_read_the_plain_way(tiny_ckpt, tiny64):
    model, tok = tiny64
    items = _groups(seed=5)
    calls = []

    def reference(**inputs):
        calls.append(inputs["input_ids"].shape)
        return model(**inputs).logits

    with torch.no_grad():
        logp, _, _ = shared_prompt_logprobs(model, items, tok.pad_token_id, reference=reference)
        plain, _ = _plain(model, items, tok.pad_token_id)
    assert len(calls) == 1 and calls[0][0] == len(items)  # one plain forward of every row
    torch.testing.assert_close(logp, plain * completion_mask(items), atol=1e-10, rtol=0)
    spec = PolicySpec(model="tiny", path=str(tiny_ckpt), gradient_checkpointing=True)
    checkpointed = build_policy("solver", spec, str(tiny_ckpt)).model.train()
    logp, mask, _ = shared_prompt_logprobs(checkpointed, items, tok.pad_token_id)  # transformers drops the cache
    plain = completion_layout(sequence_logprobs(checkpointed, items, tok.pad_token_id)[0], items)
    torch.testing.assert_close(logp[mask], plain[mask], atol=1e-6, rtol=0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_micro_batch_holds_the_budget_of_the_tokens_its_forward_reads(tiny_ckpt, monkeypatch, checkpointing):
    """Counted as the forward reads them: with prompts read once, distinct prompts × longest prompt +
    rows × longest completion; under gradient checkpointing (which reads every row whole) rows ×
    longest row, so that a micro-batch never holds more than ``micro_batch_tokens`` of what it reads."""
    from mlmt_bench.algorithms import update

    spec = PolicySpec(model="tiny", path=str(tiny_ckpt), gradient_checkpointing=checkpointing)
    policy = build_policy("solver", spec, str(tiny_ckpt))
    policy.model.train()
    items = _groups(prompts=4, group=6, seed=3)
    budget = 90
    seen = []
    real = update.LossConfig.logprobs

    def logprobs(self, model, mb, pad_id, **kw):
        seen.append([len(it.prompt_ids) + len(it.ids) for it in mb])
        return real(self, model, mb, pad_id, **kw)

    monkeypatch.setattr(update.LossConfig, "logprobs", logprobs)
    cfg = LossConfig(0.2, 0.2, "token_mean", 1, 1, 1.0, micro_batch_tokens=budget, share_prompts=True)
    assert cfg.shares(policy.model) is not checkpointing
    update_policy(policy, torch.optim.SGD(policy.trainable_parameters(), lr=0.0), None, items, cfg)
    plain = [len(mb) * max(mb) for mb in seen]
    if checkpointing:
        assert all(t <= budget or len(mb) == 1 for t, mb in zip(plain, seen)), seen
    else:  # rows sharing a prompt: more of them in a micro-batch than the plain count would allow
        assert max(plain) > budget, seen


def test_prompt_group_batches_keep_groups_together_within_the_budget():
    items = _groups(prompts=6, group=4, seed=1)
    assert prompt_group_batches(items, None) == [list(range(24))]  # everything fits: in order
    assert prompt_group_batches([], 10) == []
    for budget, rows in [(60, None), (120, None), (400, 5), (10, None)]:
        mbs = prompt_group_batches(items, budget, rows)
        assert sorted(i for mb in mbs for i in mb) == list(range(24))
        for mb in mbs:
            prompts = {tuple(items[i].prompt_ids) for i in mb}
            padded = len(prompts) * max(map(len, prompts)) + len(mb) * max(len(items[i].ids) for i in mb)
            assert padded <= budget or len(mb) == 1
            assert rows is None or len(mb) <= rows
        for p in {tuple(it.prompt_ids) for it in items}:  # a group that fits a micro-batch alone is not split
            group = [i for i, it in enumerate(items) if tuple(it.prompt_ids) == p]
            alone = len(p) + len(group) * max(len(items[i].ids) for i in group)
            if alone <= budget and (rows is None or len(group) <= rows):
                assert sum(any(i in mb for i in group) for mb in mbs) == 1, (budget, rows, group, mbs)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_the_update_with_shared_prompts_equals_the_plain_update(tiny64, agg):
    """Two epochs (π_old), π_ref on half the items, a one-shot and a micro-batched split."""
    model, tok = tiny64
    items = _groups(beta=0.1)
    results = []
    for share, budget in [(False, None), (True, None), (True, 50)]:
        policy = Policy("solver", copy.deepcopy(model), tok, True, 1e-2, 0, init_path=model.init_path)
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)  # linear in the gradient: Adam would magnify
        cfg = LossConfig(0.2, 0.28, agg, 2, 1, 1.0, micro_batch_tokens=budget, share_prompts=share)  # rounding
        stats = update_policy(policy, opt, None, copy.deepcopy(items), cfg, constant_norm=9.0 * len(items))
        results.append((stats, {k: (v - model.state_dict()[k]).detach() for k, v in policy.model.named_parameters()}))
    (plain, step_plain), *shared = results
    assert max(float(v.abs().max()) for v in step_plain.values()) > 1e-3  # the steps did something to compare
    assert shared[1][0]["micro_batches"] >= 3
    for stats, step in shared:
        for k in step_plain:
            assert float((step[k] - step_plain[k]).norm()) <= 1e-5 * float(step_plain[k].norm()) + 1e-12, k
        for key in ("loss", "kl", "entropy", "clip_frac", "grad_norm", "trained_tokens"):
            assert abs(stats[key] - plain[key]) <= 1e-6 * max(1.0, abs(plain[key])), (key, stats[key], plain[key])


def test_lora_update_with_shared_prompts_equals_the_plain_update(tiny_ckpt):
    items = [TrainItem(it.prompt_ids, it.ids, it.advantage) for it in _groups(seed=7)]
    grads = []
    for share in (False, True):
        torch.manual_seed(0)  # same LoRA init
        spec = PolicySpec(model="tiny", path=str(tiny_ckpt), lora={"r": 4, "alpha": 8, "target_modules": "all-linear"})
        policy = build_policy("solver", spec, str(tiny_ckpt))
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # B = 0 would make the prompt's LoRA gradient trivially equal
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
        update_policy(policy, opt, None, copy.deepcopy(items),
                      LossConfig(0.2, 0.2, "token_mean", 1, 1, 1e9, share_prompts=share))
        grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and all("lora_" in k for k in grads[0])
    for k in grads[0]:
        assert float((grads[1][k] - grads[0][k]).norm()) <= 1e-5 * float(grads[0][k].norm()) + 1e-12, k


def test_the_spec_turns_it_on_by_default():
    assert TrainSpec().share_prompts is True
    assert TrainSpec(share_prompts=False).share_prompts is False
