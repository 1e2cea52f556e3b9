"""Frozen linear weights cast once to bfloat16 give the same outputs and gradients under CPU autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from mlmt_bench.models.frozen_cast import cast_frozen_linears
from mlmt_bench.models.tiny import build_tiny_model
from mlmt_bench.models.tokenizer import build_char_tokenizer


def _lora_model(tie: bool):
    from peft import LoraConfig, get_peft_model

    tok = build_char_tokenizer()
    model = build_tiny_model("tiny-0.5m", tok, seed=0)
    if tie:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.get_input_embeddings().weight
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
    for name, p in lora.named_parameters():  # LoRA B starts at 0: make the adapters matter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(1))
    return tok, lora


def _loss_and_grads(model, ids):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
    loss = logits.float().log_softmax(-1)[..., 3].mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return logits, grads


@pytest.mark.parametrize("tie", [False, True])
def test_a_lora_model_with_its_frozen_linears_in_bfloat16_is_bit_identical_under_autocast(tie):
    tok, model = _lora_model(tie)
    ids = torch.randint(5, len(tok), (3, 17), generator=torch.Generator().manual_seed(2))
    before = copy.deepcopy(model)
    logits0, grads0 = _loss_and_grads(before, ids)

    cast = cast_frozen_linears(model, torch.bfloat16)

    frozen = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in n
              and m.weight is not model.get_input_embeddings().weight]
    assert cast == sum(m.weight.numel() for m in frozen) > 0
    assert all(m.weight.dtype == torch.bfloat16 for m in frozen)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # adapters untouched
    assert model.get_input_embeddings().weight.dtype == torch.float32  # a tied lm_head is left as it is
    logits1, grads1 = _loss_and_grads(model, ids)
    assert logits1.dtype == logits0.dtype and torch.equal(logits1, logits0)
    assert grads1.keys() == grads0.keys() and all(torch.equal(grads1[k], grads0[k]) for k in grads0)
    assert cast_frozen_linears(model, torch.bfloat16) == 0  # nothing left to cast


def test_trainable_linears_are_never_cast():
    tok = build_char_tokenizer()
    model = build_tiny_model("tiny-0.5m", tok, seed=0)
    assert cast_frozen_linears(model, torch.bfloat16) == 0
    assert all(p.dtype == torch.float32 for p in model.parameters())

