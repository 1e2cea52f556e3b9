"""The contract every generation backend meets, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable


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


@runtime_checkable
class Backend(Protocol):
    """A generation engine (``hf``, ``vllm``, a plugin's), built from the spec's ``backend.options``.

    Construction rejects an unknown option with a one-line ``UserError`` naming the known ones.
    ``generate`` samples a continuation of each tokenised prompt (token-in/token-out: prompts are
    ids, nothing is re-tokenised) with the model's current weights; ``sync_weights`` is called
    after every optimiser step of ``model`` (an engine holding its own copy reloads it);
    ``close`` releases engines and files at the end of a run (the runner always calls it).
    """

    name: str

    def generate(self, model: Any, tokenizer: Any, prompts: list[list[int]], *, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None) -> list[Generation]: ...

    def sync_weights(self, model: Any) -> None: ...

    def close(self) -> None: ...


def known_options(backend_cls: type) -> list[str]:
    """The ``backend.options`` a backend class takes: its constructor's named parameters."""
    import inspect

    params = inspect.signature(backend_cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def reject_unknown_options(backend_cls: type, name: str, options: dict[str, Any]) -> None:
    """A one-line error naming ``options`` the backend does not take (a typo is never ignored)."""
    from mlmt_bench.errors import UserError

    known = known_options(backend_cls)
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise UserError(f"backend.options: unknown option(s) for {name}: {', '.join(unknown)} "
                        f"(known: {', '.join(known)})")
