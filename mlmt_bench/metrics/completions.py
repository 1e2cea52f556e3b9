"""Truncated completions (TRL's ``completions/clipped_ratio``): a turn that hit
``max_new_tokens`` (``finish_reason == "length"``) was cut before its answer, and its reward says
nothing about the policy's answer. Pure functions over (turn kind, finish reason) pairs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CLIPPED = "completions/clipped_ratio"


def clipped_ratios(turns: Iterable[tuple[str, str]]) -> dict[str, float]:
    """The share of generated turns that hit the length limit, over all of them (``CLIPPED``) and
    per turn kind (``CLIPPED/<kind>``: attempt, feedback, refine). ``turns``: (kind,
    finish_reason) of every turn a model generated (rule-written feedback is no completion).
    {} for no turns; a kind is present only when it has turns."""
    by_kind: dict[str, list[bool]] = {}
    for kind, reason in turns:
        by_kind.setdefault(kind, []).append(reason == "length")
    every = [c for flags in by_kind.values() for c in flags]
    if not every:
        return {}
    out = {CLIPPED: sum(every) / len(every)}
    out.update({f"{CLIPPED}/{kind}": sum(flags) / len(flags) for kind, flags in sorted(by_kind.items())})
    return out


def truncation_warnings(step: int, trained_tokens: float, ratios: dict[str, Any]) -> dict[str, str]:
    """The warnings a training step deserves, keyed by what they are about (a run says each once):
    ``"untrained"`` when the step trained no token, else ``"clipped"`` when more than half of its
    completions hit the length limit. One line each; ``ratios``: a mapping that holds
    :func:`clipped_ratios`' keys (a step's metrics; other keys are ignored)."""
    clipped = ratios.get(CLIPPED, 0.0)
    kinds = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.0%}" for k, v in ratios.items() if k.startswith(CLIPPED + "/"))
    share = f"{clipped:.0%} of its completions hit the length limit" + (f" ({kinds})" if kinds else "")
    hint = ("; raise backend.max_new_tokens (the critic's: backend.feedback_max_new_tokens)"
            if clipped > 0.5 else "")
    if trained_tokens == 0:
        return {"untrained": f"step {step} trained no token (every advantage was zero or masked); {share}{hint}"}
    if clipped > 0.5:
        return {"clipped": f"step {step}: {share}{hint}"}
    return {}
