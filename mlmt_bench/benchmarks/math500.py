"""MATH-500: 500 competition problems (the PRM800K test subset of Hendrycks' MATH).

Rows: ``problem, solution, answer, subject, level, unique_id`` (file ``math500_test.jsonl``
or hub ``HuggingFaceH4/MATH-500``, split ``test``). Problem ids are the ``unique_id``
(e.g. ``test/precalculus/807.json``); the gold answer is ``answer`` (LaTeX, no ``\\boxed``).
Splits: seeded, disjoint ``train`` / ``validation`` / ``test`` (see :class:`HeldOutSplitBenchmark`).
"""

from __future__ import annotations

from typing import Any

from mlmt_bench.benchmarks.data import DataSpec, HeldOutSplitBenchmark, HubSource
from mlmt_bench.benchmarks.perturbations import math_perturbations, numbers
from mlmt_bench.errors import UserError
from mlmt_bench.types import VERDICT_INSTRUCTION, Problem, PromptTemplates

#: Prompts for final-answer maths (MATH-500, GSM8K). Literal braces are doubled for str.format.
MATH_TEMPLATES = PromptTemplates(
    attempt="{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    feedback=(
        "Here is a math problem and an attempted solution.\n\nProblem:\n{problem}\n\n"
        "Attempted solution:\n{attempt}\n\n"
        "Check the attempt step by step. Point out the first error, if any, and explain how to "
        "fix it. Do not state the final answer. " + VERDICT_INSTRUCTION
    ),
    refine=(
        "Feedback on your solution:\n{feedback}\n\n"
        "Using this feedback, solve the problem again step by step, and put your final answer "
        "within \\boxed{{}}."
    ),
    null_feedback="Check your solution carefully for errors.",
)

MATH500_DATA = DataSpec(
    benchmark="math500",
    filenames=("math500_test.jsonl",),
    extra_names=("math500_test.jsonl.gz", "test.jsonl"),
    required=("problem", "answer", "unique_id"),
    hub=HubSource("HuggingFaceH4/MATH-500", None, ("test",)),
)


class Math500(HeldOutSplitBenchmark):
    """``Math500(path=None, seed=0, validation_fraction=0.1, test_fraction=0.5)``; splits train / validation / test."""

    name = "math500"
    default_verifier = "math"
    templates = MATH_TEMPLATES
    data_spec = MATH500_DATA
    split_salt = "math500"

    def make_problem(self, row: dict[str, Any], index: int, origin: str) -> Problem:
        answer = str(row["answer"]).strip()
        if not answer:
            raise UserError(f"{origin}: record {index + 1} has an empty answer")
        return Problem(
            id=str(row["unique_id"]),
            benchmark=self.name,
            prompt=str(row["problem"]).strip(),
            answer=answer,
            metadata={
                "subject": row.get("subject"),
                "level": row.get("level"),
                "solution": row.get("solution"),
            },
        )

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """Free-text maths edits (:func:`~mlmt_bench.benchmarks.perturbations.math_perturbations`)."""
        return math_perturbations(problem.prompt, attempt, feedback, problem.answer, answer)

    def stated_values(self, feedback: str) -> list[str] | None:
        """The numbers the feedback writes (:func:`~mlmt_bench.benchmarks.perturbations.numbers`)."""
        return numbers(feedback)
