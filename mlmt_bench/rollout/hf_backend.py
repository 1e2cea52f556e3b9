"""Generation with transformers ``generate``: batched, left padded, KV cache.

Meant for small models and CPUs; on GPUs use the ``vllm`` backend.
"""

from __future__ import annotations

from typing import Any

import torch

from mlmt_bench.rollout.backend import Generation


class HFBackend:
    """``generate(model, tokenizer, prompts, ...)`` for lists of already tokenised prompts.

    Prompts are token ids (token-in/token-out: nothing is re-tokenised here). They are left
    padded into one batch of at most ``batch_size`` rows per ``generate`` call.
    """

    name = "hf"

    def __init__(self, batch_size: int = 256, **_: Any) -> None:
        self.batch_size = batch_size

    def sync_weights(self, model: Any) -> None:
        """Nothing to do: generation uses the training model object itself."""

    def close(self) -> None:
        """Nothing to release: the backend holds no engine of its own."""

    @torch.no_grad()
    def generate(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> list[Generation]:
        if seed is not None:
            torch.manual_seed(seed)
        out: list[Generation] = []
        for start in range(0, len(prompts), self.batch_size):
            out.extend(self._generate_batch(model, tokenizer, prompts[start:start + self.batch_size],
                                            max_new_tokens, temperature, top_p, stop))
        return out

    def _generate_batch(self, model, tokenizer, prompts, max_new_tokens, temperature, top_p, stop):
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos_id = tokenizer.eos_token_id
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        sampling = temperature > 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            do_sample=sampling,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            return_dict_in_generate=True,
            synced_gpus=False,  # every process generates alone (FSDP: on weights gathered by mlmt_bench/fsdp.py)
            output_scores=True,
        )
        if sampling:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=stop, tokenizer=tokenizer)
        was_training = model.training
        model.eval()
        try:
            res = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        finally:
            model.train(was_training)
        new = res.sequences[:, width:].cpu()
        # scores: tuple over steps of [B, V] processed logits; log-prob of the chosen token per step.
        step_logprobs = torch.stack(
            [torch.log_softmax(s.float(), dim=-1).gather(1, new[:, t:t + 1].to(s.device)).squeeze(1).cpu()
             for t, s in enumerate(res.scores)], dim=1) if res.scores else torch.zeros((len(prompts), 0))
        gens = []
        for i in range(len(prompts)):
            row = new[i].tolist()
            n, reason = _cut(row, eos_id, pad_id, tokenizer, stop)
            ids = row[:n]
            gens.append(Generation(
                ids=ids,
                logprobs=step_logprobs[i, :n].tolist(),
                finish_reason=reason,
                text=tokenizer.decode(ids, skip_special_tokens=True),
            ))
        return gens


def _cut(row: list[int], eos_id: int | None, pad_id: int, tokenizer: Any, stop: list[str] | None) -> tuple[int, str]:
    """Length of the real continuation in a padded row, and why it ended."""
    if eos_id is not None and eos_id in row:
        return row.index(eos_id) + 1, "stop"
    if stop:
        # generate pads a row after a stop string; find the first prefix whose text ends with one.
        for n in range(1, len(row) + 1):
            text = tokenizer.decode(row[:n], skip_special_tokens=False)
            if any(text.endswith(s) for s in stop):
                return n, "stop"
    n = len(row)
    while n > 0 and row[n - 1] == pad_id and pad_id != eos_id:
        n -= 1
    return n, "length"
