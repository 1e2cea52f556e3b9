"""A plugin generation backend: one token at a time, a full forward per token (no cache), with
the training model itself. Option ``record``: a file that gets one JSON line per ``generate``
call (``{"prompts": N, "tokens": T}``), so a test can see that this backend generated."""

from __future__ import annotations

import json
from typing import Any

from mlmt_bench.rollout.backend import Backend, BackendTraits, Generation


class LoopBackend(Backend):
    name = "demo-loop"
    traits = BackendTraits(holds_weights=False, supports_fsdp=False)

    def __init__(self, record: str | None = None) -> None:
        self.record = record

    def generate(self, model: Any, tokenizer: Any, prompts: list[list[int]], *, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None) -> list[Generation]:
        """Greedy at temperature 0, else a sample of softmax(logits / temperature) from torch's
        global generator (top_p is not applied: the full distribution)."""
        import torch

        device = next(model.parameters()).device
        out = []
        for prompt in prompts:
            ids: list[int] = []
            logprobs: list[float] = []
            finish = "length"
            for _ in range(max_new_tokens):
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + ids], device=device)).logits[0, -1].float()
                logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1)) if temperature > 0 else int(logp.argmax())
                ids.append(token)
                logprobs.append(float(logp[token]))
                text = tokenizer.decode(ids, skip_special_tokens=True)
                if token == tokenizer.eos_token_id or any(s in text for s in stop or []):
                    finish = "stop"
                    break
            out.append(Generation(ids, logprobs, finish, tokenizer.decode(ids, skip_special_tokens=True)))
        if self.record:
            with open(self.record, "a") as f:
                f.write(json.dumps({"prompts": len(prompts), "tokens": sum(len(g.ids) for g in out)}) + "\n")
        return out

    def sync_weights(self, model: Any) -> None:
        pass  # generates with the training model object itself
