"""GPQA: graduate-level science multiple choice (diamond 198, main 448, extended 546).

Data: the official password-protected ``gpqa_dataset.zip`` (shipped in ``data/``; the member
``dataset/gpqa_<set>.csv`` is read in memory, never unpacked to disk: GPQA's authors ask that
the questions not be posted in plain text), or a ``gpqa_<set>.csv(.gz)`` file, or the hub
dataset ``Idavidrein/gpqa`` (gated; config ``gpqa_<set>``, split ``train``). Columns used:
``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Record ID``, ``Subdomain``,
``High-level domain``. Fields are stripped of surrounding whitespace.

The file has no A-D labels, so the four options are shuffled per question with
``random.Random(stable_hash("gpqa-options", seed, record_id))``: deterministic for a seed,
different across seeds, and the same for a question in all three sets (diamond is a subset
of main, main of extended). ``Problem.answer`` is the gold letter; ``metadata["options"]``
holds the options in displayed order and ``metadata["order"]`` their source (0 = correct
answer, 1-3 = incorrect answer 1-3). ``metadata["duplicate_options"]`` marks the few rows
where two options are equal after stripping.

Problem ids are the ``Record ID``. Splits: seeded, disjoint ``train`` / ``validation`` /
``test`` with the salt "gpqa" (:class:`HeldOutSplitBenchmark`), so a question lies in the same
split in every set.

Never log question text: nothing here puts a question or option into a message.
"""

from __future__ import annotations

import random
from typing import Any

from mlmt_bench.benchmarks.data import DataSpec, HeldOutSplitBenchmark, HubSource, ZipMember, stable_hash
from mlmt_bench.benchmarks.perturbations import choice_perturbations, option_letters
from mlmt_bench.benchmarks.redaction import last_option_letter, redact_choice
from mlmt_bench.errors import UserError
from mlmt_bench.types import VERDICT_INSTRUCTION, Problem, PromptTemplates, Redaction

LETTERS = "ABCD"
#: Published in the idavidrein/gpqa README so that programs can read the archive.
GPQA_ZIP_PASSWORD = b"deserted-untie-orchid"

CHOICE_TEMPLATES = PromptTemplates(
    attempt=(
        "{problem}\n\nThink step by step, then end with a line of the form \"Answer: X\", "
        "where X is the letter (A, B, C or D) of the correct option."
    ),
    feedback=(
        "Here is a multiple-choice question and an attempted answer.\n\nQuestion:\n{problem}\n\n"
        "Attempted answer:\n{attempt}\n\n"
        "Check the reasoning. Point out the first mistake, if any, and explain it. "
        "Do not say which option is correct. " + VERDICT_INSTRUCTION
    ),
    refine=(
        "Feedback on your answer:\n{feedback}\n\n"
        "Using this feedback, reconsider the question step by step, then end with a line of the "
        "form \"Answer: X\", where X is the letter of the correct option."
    ),
    null_feedback="Check your reasoning carefully for mistakes.",
)

_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
            "Incorrect Answer 3", "Record ID")


def _hub_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: "" if v is None else str(v) for k, v in row.items()}


def _spec(which: str) -> DataSpec:
    return DataSpec(
        benchmark=f"gpqa-{which}",
        filenames=(f"gpqa_{which}.csv.gz",),
        extra_names=(f"gpqa_{which}.csv",),
        zip_member=ZipMember("gpqa_dataset.zip", f"dataset/gpqa_{which}.csv", GPQA_ZIP_PASSWORD),
        required=_COLUMNS,
        hub=HubSource("Idavidrein/gpqa", f"gpqa_{which}", ("train",), convert=_hub_row),
    )


def shuffle_options(record_id: str, seed: int, correct: str, incorrect: list[str]) -> tuple[list[str], list[int], str]:
    """(options in displayed order, their source indices, gold letter) for one question."""
    order = [0, 1, 2, 3]
    random.Random(stable_hash("gpqa-options", seed, record_id)).shuffle(order)
    source = [correct, *incorrect]
    options = [source[i] for i in order]
    return options, order, LETTERS[order.index(0)]


def format_question(question: str, options: list[str]) -> str:
    return question + "\n\n" + "\n".join(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options))


class _GPQA(HeldOutSplitBenchmark):
    default_verifier = "choice"
    templates = CHOICE_TEMPLATES
    split_salt = "gpqa"

    def make_problem(self, row: dict[str, Any], index: int, origin: str) -> Problem:
        fields = {k: str(row.get(k) or "").strip() for k in _COLUMNS}
        rid = fields["Record ID"]
        if not rid:
            raise UserError(f"{origin}: record {index + 1} has an empty Record ID")
        empty = [k for k in _COLUMNS[:5] if not fields[k]]
        if empty:
            raise UserError(f"{origin}: record {index + 1} ({rid}) has empty field(s) {', '.join(empty)}")
        incorrect = [fields[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        options, order, gold = shuffle_options(rid, self.seed, fields["Correct Answer"], incorrect)
        return Problem(
            id=rid,
            benchmark=self.name,
            prompt=format_question(fields["Question"], options),
            answer=gold,
            metadata={
                "record_id": rid,
                "options": options,
                "order": order,
                "domain": str(row.get("High-level domain") or "").strip(),
                "subdomain": str(row.get("Subdomain") or "").strip(),
                "duplicate_options": len(set(options)) < len(options),
            },
        )

    def redact_feedback(self, problem: Problem, attempt: str, feedback: str) -> Redaction:
        """Multiple choice (METHOD v4): the option texts of ``problem`` and the option letters
        used as answers become ``[…]`` (:func:`~mlmt_bench.benchmarks.redaction.redact_choice`)."""
        options = problem.metadata.get("options") if isinstance(problem.metadata, dict) else None
        return redact_choice(feedback, [str(o) for o in options] if isinstance(options, list) else [])

    def stated_answer(self, feedback: str) -> str | None:
        """The last option letter the feedback states as an answer, as ``Answer: X``; None if none."""
        letter = last_option_letter(feedback, len(LETTERS))
        return None if letter is None else f"Answer: {letter}"

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """Multiple-choice edits, option letters as the values
        (:func:`~mlmt_bench.benchmarks.perturbations.choice_perturbations`)."""
        letters = LETTERS[: len(problem.metadata.get("options") or LETTERS)]
        return choice_perturbations(feedback, problem.answer, answer, letters)

    def stated_values(self, feedback: str) -> list[str] | None:
        """The option letters the feedback names (:func:`~mlmt_bench.benchmarks.perturbations.option_letters`)."""
        return option_letters(feedback, LETTERS)


class GPQADiamond(_GPQA):
    """``GPQADiamond(path=None, seed=0, validation_fraction=0.1, test_fraction=0.5)``: 198 questions."""

    name = "gpqa-diamond"
    data_spec = _spec("diamond")


class GPQAMain(_GPQA):
    """``GPQAMain(path=None, seed=0, validation_fraction=0.1, test_fraction=0.5)``: 448 questions."""

    name = "gpqa-main"
    data_spec = _spec("main")


class GPQAExtended(_GPQA):
    """``GPQAExtended(path=None, seed=0, validation_fraction=0.1, test_fraction=0.5)``: 546 questions."""

    name = "gpqa-extended"
    data_spec = _spec("extended")
