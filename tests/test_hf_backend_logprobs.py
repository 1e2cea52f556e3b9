"""The HF backend's log-probs are those of the distribution each token was sampled from, read a
step at a time (``ChosenLogprobs``) instead of from ``generate``'s ``[B, V]`` scores of every step."""

from __future__ import annotations

import pytest
import torch

from mlmt_bench.models.tiny import load_checkpoint
from mlmt_bench.rollout.hf_backend import HFBackend


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (0.8, 1.0), (1.3, 0.7)])
def test_logprobs_equal_generates_own_scores(tiny_ckpt, one_torch_thread, temperature, top_p):
    model, tok = load_checkpoint(tiny_ckpt)
    prompts = [tok.encode("1+2=", add_special_tokens=False), tok.encode("9-3+4=", add_special_tokens=False)]
    torch.manual_seed(5)
    got = HFBackend().generate(model, tok, prompts, max_new_tokens=12, temperature=temperature, top_p=top_p)

    width = max(map(len, prompts))
    ids = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    sample = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    torch.manual_seed(5)
    model.eval()
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, return_dict_in_generate=True, output_scores=True, **sample)
    new = ref.sequences[:, width:]
    want = torch.stack([torch.log_softmax(s.float(), -1).gather(1, new[:, t:t + 1]).squeeze(1)
                        for t, s in enumerate(ref.scores)], dim=1)
    for row, g in enumerate(got):
        n = len(g.ids)
        assert g.ids == new[row, :n].tolist()
        assert g.logprobs == pytest.approx(want[row, :n].tolist(), abs=1e-6)
        assert all(lp <= 0 for lp in g.logprobs)
