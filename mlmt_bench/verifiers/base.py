"""The interface every verifier implements. Verifiers never raise on bad model output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.leaks import LeakKind, is_leak


class Verifier:
    """Scores responses, and says when a feedback gives the answer away.

    Its declared contract: ``score`` (and ``score_batch``), and ``leaks``, which
    ``leakage_rate`` (METHOD.md) uses on every feedback. ``leaks`` applies the rule named by
    ``leak_kind`` (:func:`mlmt_bench.verifiers.leaks.is_leak`: ``math``, ``code``, ``choice``
    or ``exact``); a verifier whose answers none of them fits overrides ``leaks`` itself.
    """

    name: ClassVar[str] = ""
    leak_kind: ClassVar[LeakKind] = "exact"
    #: the sandbox mechanisms switched off (``verifier_options.sandbox_disable``) of a verifier that
    #: runs untrusted code in a sandbox (``code``: a tuple, empty when none is); None (this default):
    #: it has no sandbox. The run's manifest records it and a weakened sandbox is warned about.
    sandbox_disabled: tuple[str, ...] | None = None

    def __init__(self, **options: Any) -> None:
        self.options = options

    def score(self, problem: Problem, response: str) -> Verdict:
        raise NotImplementedError

    def leaks(self, feedback: str, gold: str | None) -> bool | None:
        """Whether ``feedback`` states ``gold``, the answer of the problem it judges; None when
        it cannot be judged (no gold)."""
        return is_leak(feedback, gold, self.leak_kind)

    def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """Score many responses; verifiers with slow checks (code) override this with a pool."""
        return [self.score(p, r) for p, r in zip(problems, responses, strict=True)]
