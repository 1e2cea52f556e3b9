"""Records shared by benchmarks, verifiers, rollouts and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

VerdictKind = Literal["ok", "wrong", "no_answer", "timeout", "crash", "sandbox_violation"]
VERDICT_KINDS: tuple[str, ...] = ("ok", "wrong", "no_answer", "timeout", "crash", "sandbox_violation")


@dataclass(frozen=True)
class Problem:
    """One benchmark item.

    id:        stable identifier, unique within its benchmark (e.g. "test/algebra/1.json", "mbpp/11").
    benchmark: registry name of the benchmark that produced it.
    prompt:    the problem statement shown to the model (plain text, no chat formatting).
    answer:    gold final answer as text (math, choice letter, synthetic); None for code.
    tests:     code benchmarks: assert statements run against the candidate program.
    setup:     code benchmarks: code run before the tests (MBPP `test_setup_code` / imports).
    metadata:  anything else (subject, level, shuffled options, entry point ...); JSON-serialisable.
    """

    id: str
    benchmark: str
    prompt: str
    answer: str | None = None
    tests: tuple[str, ...] = ()
    setup: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "benchmark": self.benchmark,
            "prompt": self.prompt,
            "answer": self.answer,
            "tests": list(self.tests),
            "setup": self.setup,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Problem:
        return cls(
            id=str(d["id"]),
            benchmark=str(d.get("benchmark", "")),
            prompt=str(d.get("prompt", "")),
            answer=None if d.get("answer") is None else str(d["answer"]),
            tests=tuple(d.get("tests") or ()),
            setup=str(d.get("setup") or ""),
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement of one response.

    reward:    in [0, 1]; code: fraction of tests passed; otherwise 0 or 1.
    correct:   reward == 1 (all tests pass / equivalent answer / right letter).
    extracted: the answer the verifier read from the response (None if none found).
    kind:      ok | wrong | no_answer | timeout | crash | sandbox_violation.
    detail:    short human-readable explanation (first error line, etc.).
    """

    reward: float
    correct: bool
    extracted: str | None
    kind: VerdictKind
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "correct": self.correct,
            "extracted": self.extracted,
            "kind": self.kind,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Redaction:
    """What the refiner is shown of one feedback under a benchmark's redaction rule (METHOD v4,
    ``feedback.redact``; :meth:`Benchmark.redact_feedback`).

    text:    the feedback after the rule, each removed span replaced by a placeholder ("?" for a
             number, "[…]" for a code block, inline code, an option letter or an option text).
    removed: number of spans removed (numbers, code blocks, option letters / texts).
    share:   redacted share of the feedback's characters, in [0, 1]: characters of the removed
             spans / characters of the feedback (0.0 for an empty feedback).
    """

    text: str
    removed: int
    share: float


#: What every feedback template asks the critic to end with: a verdict line that
#: :func:`mlmt_bench.benchmarks.base.verdict_line` reads strictly.
VERDICT_INSTRUCTION = 'End your feedback with a last line of the form "Verdict: correct" or "Verdict: incorrect".'


@dataclass(frozen=True)
class PromptTemplates:
    """Text of the user messages of the three turns of METHOD.md, as str.format templates.

    attempt:       turn 1, solver sees it:        placeholders {problem}
    feedback:      turn 2, critic sees it:        placeholders {problem}, {attempt}
    refine:        turn 3, solver sees it after its own attempt (conversation continues):
                   placeholders {feedback}
    null_feedback: g∅, the generic feedback used by `self_correct`, `null_feedback` and as the
                   paired baseline of the `feedback_effect` metric.
    Chat formatting (roles, special tokens) is added by the tokenizer's chat template, never here.
    """

    attempt: str = "{problem}"
    feedback: str = ("Problem:\n{problem}\n\nAttempt:\n{attempt}\n\nPoint out the first error in the attempt, if any. "
                     + VERDICT_INSTRUCTION)
    refine: str = "Feedback: {feedback}\nGive a corrected solution."
    null_feedback: str = "Check your answer."

    def render_attempt(self, problem: Problem) -> str:
        return self.attempt.format(problem=problem.prompt)

    def render_feedback(self, problem: Problem, attempt: str) -> str:
        return self.feedback.format(problem=problem.prompt, attempt=attempt)

    def render_refine(self, feedback: str) -> str:
        return self.refine.format(feedback=feedback)
