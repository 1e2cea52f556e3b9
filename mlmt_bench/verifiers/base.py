"""The interface every verifier implements. Verifiers never raise on bad model output."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from mlmt_bench.types import Problem, Verdict


class Verifier:
    name: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def score(self, problem: Problem, response: str) -> Verdict:
        raise NotImplementedError

    def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """Score many responses; verifiers with slow checks (code) override this with a pool."""
        return [self.score(p, r) for p, r in zip(problems, responses, strict=True)]
