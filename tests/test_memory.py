"""Bounded memory: micro-batched passes equal the one-shot ones, gradient checkpointing, peak memory per phase."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from mlmt_bench.algorithms.core import AGG_MODES
from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
from mlmt_bench.machine import memory
from mlmt_bench.models.forward import last_hidden_states, micro_batches, sequence_logprob_sums
from mlmt_bench.models.policy import Policy, build_policy
from mlmt_bench.models.policy_spec import PolicySpec


def _items(n: int = 11, seed: int = 0) -> list[TrainItem]:
    """Turns of mixed prompt (3..14) and completion (1..9) lengths; half of them with a KL term."""
    rng = random.Random(seed)
    return [TrainItem([rng.randrange(5, 90) for _ in range(rng.randint(3, 14))],
                      [rng.randrange(5, 90) for _ in range(rng.randint(1, 9))],
                      advantage=rng.gauss(0.0, 1.0), beta=0.1 * (i % 2)) for i in range(n)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def tiny64(tiny_ckpt):
    """The tiny model in float64 (so that a different summation order stays far below 1e-6)."""
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    model.init_path = str(tiny_ckpt)  # where π_ref is loaded from
    return model.double().train(), tok


def _policy(model, tok) -> Policy:
    return Policy("solver", copy.deepcopy(model), tok, True, 1e-2, sum(p.numel() for p in model.parameters()),
                  init_path=model.init_path)


def test_micro_batches_keep_every_row_once_within_the_budget():
    rng = random.Random(1)
    lengths = [rng.randint(1, 60) for _ in range(200)]
    for budget, rows in [(64, None), (200, None), (1000, 7), (59, None)]:
        mbs = micro_batches(lengths, budget, rows)
        assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
        for mb in mbs:
            padded = len(mb) * max(lengths[i] for i in mb)
            assert padded <= budget or len(mb) == 1  # a row longer than the budget goes alone
            assert rows is None or len(mb) <= rows
        # longest first: padding only within rows of similar length
        assert sum(len(mb) * max(lengths[i] for i in mb) for mb in mbs) < 1.1 * sum(lengths) + 60 * len(mbs)
    assert micro_batches(lengths, None) == [list(range(200))]  # everything fits: today's batch, in order
    assert micro_batches(lengths, 200 * 60) == [list(range(200))]
    assert micro_batches([], 10) == []


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("epochs", [1, 2])
def test_micro_batched_update_equals_the_one_shot_update(tiny64, agg, epochs):
    """π_old (epochs 2), π_ref (beta on half the items) and the loss of every aggregation mode."""
    model, tok = tiny64
    items = _items()
    results = []
    for budget, accum in [(None, 1), (40, 1), (None, 4)]:  # one shot; ≤ 40 padded tokens; 4 chunks by count
        policy = _policy(model, tok)
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
        cfg = LossConfig(0.2, 0.28, agg, epochs, accum, 1.0, micro_batch_tokens=budget)
        stats = update_policy(policy, opt, None, copy.deepcopy(items), cfg, constant_norm=9.0 * len(items))
        results.append((stats, {k: v.detach().clone() for k, v in policy.model.named_parameters()}))
    (one, p_one), *splits = results
    assert one["micro_batches"] == 1
    moved = max(float((p_one[k] - v.detach()).abs().max()) for k, v in model.named_parameters())
    assert moved > 1e-3  # the step did something to compare
    for stats, params in splits:
        assert stats["micro_batches"] >= 4
        diff = max(float((params[k] - p_one[k]).abs().max()) for k in p_one)
        assert diff < 1e-6, diff
        for key in ("loss", "kl", "entropy", "clip_frac", "grad_norm"):
            assert abs(stats[key] - one[key]) < 1e-6, (key, stats[key], one[key])
        assert stats["trained_tokens"] == one["trained_tokens"]


def test_feature_and_logprob_passes_do_not_depend_on_the_split(tiny64):
    model, tok = tiny64
    items = _items(15, seed=2)
    contexts = [it.prompt_ids + it.ids for it in items]
    with torch.no_grad():
        whole = last_hidden_states(model, tok.pad_token_id, contexts)
        parts = last_hidden_states(model, tok.pad_token_id, contexts, max_tokens=30)
        sums = sequence_logprob_sums(model, items, tok.pad_token_id, None)
        sums_parts = sequence_logprob_sums(model, items, tok.pad_token_id, 30)
    assert whole.shape == (15, model.config.hidden_size)
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)
    assert max(abs(a - b) for a, b in zip(sums, sums_parts)) < 1e-9
    for it, s in zip(items[:3], sums):  # and each row against its own unpadded forward pass
        ids = torch.tensor([it.prompt_ids + it.ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1], -1)
        expected = logp[len(it.prompt_ids) - 1:].gather(1, torch.tensor(it.ids)[:, None]).sum()
        assert abs(float(expected) - s) < 1e-9
        with torch.no_grad():
            h = model(ids, output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(whole[items.index(it)], h.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_ckpt, lora):
    items = [TrainItem(it.prompt_ids, it.ids, it.advantage) for it in _items(6, seed=3)]  # no π_ref copy
    lora_spec = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]} if lora else None
    grads, recomputed = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # same LoRA init
        spec = PolicySpec(model="tiny", path=str(tiny_ckpt), gradient_checkpointing=checkpointing, lora=lora_spec)
        policy = build_policy("solver", spec, str(tiny_ckpt))
        base = policy.model.get_base_model() if lora else policy.model
        calls = []
        hook = base.model.layers[0].mlp.register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)  # keep the weights: compare gradients
        update_policy(policy, opt, None, copy.deepcopy(items), LossConfig(0.2, 0.2, "token_mean", 1, 1, 1e9))
        hook.remove()
        recomputed.append(len(calls))
        grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad})
    # with checkpointing the layer runs again in the backward pass (a pre-hook: torch stops the
    # recomputation, with an exception caught inside, once the last saved tensor is rebuilt)
    assert recomputed == [1, 2]
    assert grads[0].keys() == grads[1].keys() and all("lora_" in k for k in grads[0]) == lora
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], atol=1e-7, rtol=1e-6)


def test_phase_peaks_nest_and_reset():
    tracker = memory.PhasePeaks()
    assert tracker.source in ("cuda_allocated", "cpu_rss")  # cpu_rss: this kernel lets a process reset its peak
    mb = 2**20
    with tracker.phase("update"):
        with tracker.phase("logprobs"):
            big = torch.ones(300 * mb // 4)  # 300 MiB, touched
            del big
    with tracker.phase("rollout"):
        small = torch.ones(mb // 4)
        del small
    peaks = tracker.take(("rollout", "logprobs", "update", "value"))
    assert set(peaks) == {"mem/peak_mb/rollout", "mem/peak_mb/logprobs", "mem/peak_mb/update"}
    assert peaks["mem/peak_mb/update"] >= peaks["mem/peak_mb/logprobs"]  # the outer phase includes the inner
    assert peaks["mem/peak_mb/logprobs"] - peaks["mem/peak_mb/rollout"] > 250  # reset between phases
    assert tracker.take() == {}  # taken once
    # the lifetime peak survives the resets (0.1: rounding)
    assert tracker.peak_mb() >= peaks["mem/peak_mb/logprobs"] - 0.1


def test_the_end_of_a_cpu_phase_gives_freed_heap_back():
    """Blocks under glibc's mmap threshold stay in the process when freed (a live block above
    them keeps the heap from shrinking); the end of an outermost phase returns their pages."""
    tracker = memory.PhasePeaks()
    if tracker.cuda or not memory.release_freed_heap():
        pytest.skip("CPU with glibc only")  # the release is a no-op elsewhere, by design
    with tracker.phase("update"):
        blocks = [bytearray(100_000) for _ in range(3000)]  # ~286 MiB in 100 kB blocks
        pinned = bytearray(100_000)  # allocated last: above the freed blocks
        del blocks
        with tracker.phase("logprobs"):
            pass
        held = memory.rss_mb()  # an inner phase's end releases nothing: memory may still be in use
    released = memory.rss_mb()
    assert held - released > 200, (held, released)
    assert len(pinned) == 100_000


def test_kl_is_logged_only_where_a_reference_is_computed(tiny64):
    """beta = 0 everywhere: no π_ref, so no "kl" (a logged 0 reads as a policy that has not moved);
    beta > 0 on some item: its KL to π_ref, which is positive once the policy has stepped away."""
    model, tok = tiny64
    cfg = LossConfig(0.2, 0.2, "token_mean", 1, 1, 1.0)
    no_ref = [TrainItem(it.prompt_ids, it.ids, it.advantage, beta=0.0) for it in _items()]
    policy = _policy(model, tok)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    assert "kl" not in update_policy(policy, opt, None, no_ref, cfg)
    with_ref = update_policy(policy, opt, None, _items(), cfg)  # the policy has moved one step from π_ref
    assert with_ref["kl"] > 0.0
