"""GSM8K: 1,319 grade-school maths word problems (the test split).

Rows: ``question, answer`` (file ``gsm8k_test.jsonl`` or hub ``openai/gsm8k``, config
``main``, split ``test``). The gold answer is the number after ``####`` in ``answer``, with
thousands separators removed; the worked solution goes to ``metadata["solution"]``. Problem
ids are ``gsm8k/<0-based line>``. Splits: seeded, disjoint ``train`` / ``validation`` / ``test``.
"""

from __future__ import annotations

import re
from typing import Any

from mlmt_bench.benchmarks.data import DataSpec, HeldOutSplitBenchmark, HubSource
from mlmt_bench.benchmarks.math500 import MATH_TEMPLATES
from mlmt_bench.benchmarks.perturbations import math_perturbations, numbers
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem

GSM8K_DATA = DataSpec(
    benchmark="gsm8k",
    filenames=("gsm8k_test.jsonl",),
    extra_names=("gsm8k_test.jsonl.gz",),
    required=("question", "answer"),
    hub=HubSource("openai/gsm8k", "main", ("test",)),
)

_GOLD_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gsm8k_gold(answer: str) -> str | None:
    """The number after ``####``, commas (and a stray ``$``) removed; None if absent."""
    m = _GOLD_RE.search(answer)
    if not m:
        return None
    gold = m.group(1).replace(",", "").replace("$", "").strip()
    return gold or None


class GSM8K(HeldOutSplitBenchmark):
    """``GSM8K(path=None, seed=0, validation_fraction=0.1, test_fraction=0.5)``; splits train / validation / test."""

    name = "gsm8k"
    default_verifier = "math"
    templates = MATH_TEMPLATES
    data_spec = GSM8K_DATA
    split_salt = "gsm8k"

    def make_problem(self, row: dict[str, Any], index: int, origin: str) -> Problem:
        gold = gsm8k_gold(str(row["answer"]))
        if gold is None:
            raise UserError(f"{origin}: record {index + 1} has no '#### <answer>' line")
        solution = str(row["answer"])
        solution = solution[: solution.rfind("####")].rstrip()
        return Problem(
            id=f"gsm8k/{index}",
            benchmark=self.name,
            prompt=str(row["question"]).strip(),
            answer=gold,
            metadata={"solution": solution},
        )

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """Free-text maths edits (:func:`~mlmt_bench.benchmarks.perturbations.math_perturbations`)."""
        return math_perturbations(problem.prompt, attempt, feedback, problem.answer, answer)

    def stated_values(self, feedback: str) -> list[str] | None:
        """The numbers the feedback writes (:func:`~mlmt_bench.benchmarks.perturbations.numbers`)."""
        return numbers(feedback)
