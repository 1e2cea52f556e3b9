"""The interface every benchmark implements."""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, PromptTemplates


class Benchmark:
    """A source of problems.

    Construct with the spec's ``benchmark`` options: ``Benchmark(path=None, seed=0, **options)``.
    ``load(split)`` returns the problems of a split in a deterministic order for the seed.
    """

    name: ClassVar[str] = ""
    default_verifier: ClassVar[str] = ""
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    templates: ClassVar[PromptTemplates] = PromptTemplates()

    def __init__(self, path: str | None = None, seed: int = 0, **options: Any) -> None:
        self.path = path
        self.seed = seed
        if options:
            raise UserError(f"benchmark {self.name}: unknown option(s) {', '.join(sorted(options))}")

    def load(self, split: str) -> list[Problem]:
        raise NotImplementedError

    def feedback_verdict(self, feedback: str) -> bool | None:
        """What a feedback says of the attempt it judges: True (right), False (wrong), or None
        (no verdict can be read). The critic diagnostics and ``critic_reward:
        helpfulness+verdict`` compare it with the verifier.

        This default reads free text: a wrong-word (wrong, incorrect, error, mistake, not
        correct) is a False verdict, else a right-word (correct, right) is True, else None.
        A benchmark with a structured feedback format overrides it (``synthetic-arith``).
        """
        text = feedback.lower()
        if _WRONG_WORDS.search(text):
            return False
        if _RIGHT_WORDS.search(text):
            return True
        return None

    def full_response(self, problem: Problem, attempt: str, refinement: str) -> str:
        """The refinement of ``attempt`` as a complete answer to ``problem`` alone: what
        ``critique_grpo`` and ``self_distill`` train as a response to x (``trained_turns``
        ``"as_attempt"`` / ``"auxiliary"``). Pure text in, text out.

        This default is the refinement itself, for benchmarks whose refinements are complete
        answers. A benchmark whose solver writes a *revision* (only the part that changes, which
        reads right only after the attempt and its feedback) overrides it to splice the revision
        into the attempt (``synthetic-arith``). The full response must keep the refinement's
        final answer, so that it shares the refinement's verdict; where it ends with the
        refinement's text, the text before is the attempt's kept part (``distill: kl`` reads it
        as context).
        """
        return refinement

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise UserError(f"benchmark {self.name}: unknown split {split!r} (known: {', '.join(self.splits)})")


class OracleBenchmark(Benchmark):
    """A benchmark with an oracle critic: it knows each problem's gold solution and can write the
    feedback a critic that sees it would (METHOD.md's oracle bound, ``variant: oracle_feedback``),
    plant errors in a solution and carry a feedback out. The shared base's curriculum needs all
    four. A benchmark declares that it has them by subclassing this class (``synthetic-arith``);
    nothing recognises them by name."""

    def solution(self, problem: Problem) -> str:
        """The gold written solution of ``problem``."""
        raise NotImplementedError

    def oracle_feedback(self, problem: Problem, attempt: str) -> str:
        """The feedback of a critic that sees the gold solution, on ``attempt``."""
        raise NotImplementedError

    def inject_errors(self, solution: str, rng: random.Random, second_error_rate: float = 0.15) -> str:
        """``solution`` with one error planted (a second one with ``second_error_rate``)."""
        raise NotImplementedError

    def apply_feedback(self, problem: Problem, attempt: str, feedback: str, *, revision: bool = False,
                       **options: Any) -> str:
        """The refinement that follows ``feedback`` on ``attempt`` exactly (the curriculum's target)."""
        raise NotImplementedError


_WRONG_WORDS = re.compile(r"\b(wrong|incorrect|error|errors|mistake|mistakes|not correct|not right)\b")
_RIGHT_WORDS = re.compile(r"\b(correct|right)\b")
