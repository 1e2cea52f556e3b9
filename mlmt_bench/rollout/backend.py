"""What every generation backend returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class Generation:
    """One sampled continuation.

    ids:           generated token ids, including the EOS token when the model stopped by itself.
    logprobs:      log-prob of each generated id under the sampling distribution (after temperature
                   and top-p), len == len(ids). Trainers recompute log-probs under the policy with a
                   forward pass, so these are diagnostics, not the importance-ratio denominator.
    finish_reason: "stop" (EOS or a stop string) or "length" (max_new_tokens reached).
    text:          ids decoded without special tokens.
    """

    ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    text: str
