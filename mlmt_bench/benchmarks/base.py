"""The interface every benchmark implements."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, ClassVar

from mlmt_bench.benchmarks.perturbations import none_apply
from mlmt_bench.benchmarks.redaction import redact_numbers, stated_math_answer
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, PromptTemplates, Redaction

#: an :class:`OracleBenchmark`'s operators (``ops``) and operand bound (``max_operand``) unless it
#: declares its own (``synthetic-arith``'s option defaults)
DEFAULT_OPS = "+-"
DEFAULT_MAX_OPERAND = 9


class Benchmark:
    """A source of problems.

    Construct with the spec's ``benchmark`` options: ``Benchmark(path=None, seed=0, **options)``.
    ``load(split)`` returns the problems of a split in a deterministic order for the seed.
    """

    name: ClassVar[str] = ""
    default_verifier: ClassVar[str] = ""
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    templates: ClassVar[PromptTemplates] = PromptTemplates()
    #: its problems are generated from its options alone, offline and in milliseconds, so a report
    #: may rebuild a run's problem statements and gold answers (runs from before samples.jsonl held them)
    generated: ClassVar[bool] = False

    def __init__(self, path: str | None = None, seed: int = 0, verdict_fallback: str | None = None,
                 **options: Any) -> None:
        self.path = path
        self.seed = seed
        if options:
            raise UserError(f"benchmark {self.name}: unknown option(s) {', '.join(sorted(options))}")
        if verdict_fallback not in VERDICT_FALLBACKS:
            raise UserError(f"benchmark {self.name}: verdict_fallback must be one of "
                            f"{', '.join(map(str, VERDICT_FALLBACKS))}, got {verdict_fallback!r}")
        #: how :meth:`feedback_verdict` reads a feedback without a verdict line: None (it has no
        #: verdict, the default) or "keywords" (free text, a labelled fallback)
        self.verdict_fallback = verdict_fallback

    def load(self, split: str) -> list[Problem]:
        raise NotImplementedError

    def feedback_verdict(self, feedback: str) -> bool | None:
        """What a feedback says of the attempt it judges: True (right), False (wrong), or None
        (no verdict can be read). The critic diagnostics and ``critic_reward:
        helpfulness+verdict`` compare it with the verifier.

        This default reads the verdict line the feedback templates ask for, strictly
        (:func:`verdict_line`: the last line ``Verdict: correct`` or ``Verdict: incorrect``).
        A feedback without one has no verdict, unless the benchmark option ``verdict_fallback:
        keywords`` reads its free text instead (:func:`keyword_verdict`; evaluation then reports
        the share read so, ``critic/verdict_keywords``). A benchmark with a structured feedback
        format overrides it (``synthetic-arith``).
        """
        verdict = verdict_line(feedback)
        if verdict is None and self.verdict_fallback == "keywords":
            return keyword_verdict(feedback)
        return verdict

    def verdict_by_keywords(self, feedback: str) -> bool:
        """Whether :meth:`feedback_verdict` read ``feedback``'s verdict by the keyword fallback
        (on, no verdict line, and a keyword found)."""
        return (self.verdict_fallback == "keywords" and verdict_line(feedback) is None
                and keyword_verdict(feedback) is not None)

    def redact_feedback(self, problem: Problem, attempt: str, feedback: str) -> Redaction:
        """What the refiner is shown of ``feedback`` on ``attempt`` under ``feedback.redact``
        (METHOD v4, "Feedback, not answers"): the benchmark's declared redaction rule. Pure.

        This default is the rule for arithmetic and free-text maths: every number that occurs in
        neither the problem nor the attempt becomes ``?`` (the critic may locate and quote a step,
        not supply a value; :func:`mlmt_bench.benchmarks.redaction.redact_numbers` says how numbers
        are read: whole tokens, signs, decimals, fractions). A benchmark whose answers are not
        numbers overrides it (code: ``mbpp``; multiple choice: ``gpqa-*``), and so does one whose
        feedback has a fixed format that allows a stricter rule (``synthetic-arith``: a check shows
        only the attempt's own numbers).
        """
        return redact_numbers(feedback, (problem.prompt, attempt))

    def stated_answer(self, feedback: str) -> str | None:
        """The final answer ``feedback`` states (what a refiner that copies it would write), as a
        response this benchmark's verifier scores (the "critic as second solver" row); None when
        it states none. Pure.

        This default reads free-text maths: the last ``\\boxed{...}`` of the feedback, else its
        last number, returned boxed. Benchmarks with other answers override it.
        """
        return stated_math_answer(feedback)

    def full_response(self, problem: Problem, attempt: str, refinement: str) -> str:
        """The refinement of ``attempt`` as a complete answer to ``problem`` alone: what
        ``critique_grpo`` and ``self_distill`` train as a response to x (a step plan's
        ``Training(context="x")``, ``algorithms/step_plan.py``). Pure text in, text out.

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

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """The feedback perturbation probe's edits of ``feedback`` (the critic's own, on
        ``attempt``; METHOD v4): ``{row: text}`` for the rows of
        :data:`mlmt_bench.benchmarks.perturbations.PERTURBATIONS` (``values_removed``,
        ``last_shifted``, ``approve_gold``, ``approve_own``, ``oracle``), None for a row that
        does not apply. ``answer``: the attempt's final answer as the benchmark's verifier read
        it (None: none). Pure.

        This default declares none (every row None); benchmarks override it with their rule
        (:mod:`mlmt_bench.benchmarks.perturbations` has the free-text ones).
        """
        return none_apply()

    def stated_values(self, feedback: str) -> list[str] | None:
        """The values ``feedback`` states, in order, as the verifier's extracted answers are
        written (the probe's ``copy_rate``: a refinement whose final answer is one of them);
        None where a benchmark's answers are not values it can read (this default)."""
        return None


class OracleBenchmark(Benchmark):
    """A benchmark with an oracle critic: it knows each problem's gold solution and can write the
    feedback a critic that sees it would (METHOD.md's oracle bound, ``variant: oracle_feedback``),
    plant errors in a solution and carry a feedback out. The shared base's curriculum needs all
    four. A benchmark declares that it has them by subclassing this class (``synthetic-arith``);
    nothing recognises them by name."""

    #: the operators its problems' operations are drawn from, and their operands' bound
    #: (1..max_operand): the shared base's misconceptions are drawn from these operations
    #: (:class:`mlmt_bench.benchmarks.synthetic_curriculum.Misconceptions`). Defaults: synthetic-arith's.
    ops: str = DEFAULT_OPS
    max_operand: int = DEFAULT_MAX_OPERAND

    def identity(self, problem: Problem) -> str:
        """What makes two problems one for the splits' disjointness: a warm start's curriculum
        (:mod:`mlmt_bench.warmstart.pretrained_base`) leaves out every problem whose identity is in
        a held-out split, whatever its wording. Default: the statement."""
        return problem.prompt

    def solution(self, problem: Problem) -> str:
        """The gold written solution of ``problem``."""
        raise NotImplementedError

    def oracle_feedback(self, problem: Problem, attempt: str) -> str:
        """The feedback of a critic that sees the gold solution, on ``attempt``."""
        raise NotImplementedError

    def worked_feedback(self, problem: Problem, attempt: str) -> str:
        """The oracle's feedback with its working shown: what a critic that recomputes each step
        writes (a warm start's critique target, ``warm_start.critique: worked``). It may state
        values the attempt lacks, so the refiner reads it redacted (:meth:`redact_feedback`).
        Default: :meth:`oracle_feedback` (no working to show)."""
        return self.oracle_feedback(problem, attempt)

    def worked_refinement(self, problem: Problem, attempt: str) -> str:
        """The gold solution as a refiner that recomputes the step a worked critique flags on
        ``attempt`` writes it, its working shown (a warm start's refine target, ``warm_start.refine:
        worked``). Default: :meth:`solution` (no working to show)."""
        return self.solution(problem)

    def inject_errors(self, solution: str, rng: random.Random, second_error_rate: float = 0.15) -> str:
        """``solution`` with one error planted (a second one with ``second_error_rate``)."""
        raise NotImplementedError

    def apply_feedback(self, problem: Problem, attempt: str, feedback: str, *, revision: bool = False,
                       **options: Any) -> str:
        """The refinement that follows ``feedback`` on ``attempt`` exactly (the curriculum's target)."""
        raise NotImplementedError

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """The base's rows (:meth:`Benchmark.feedback_perturbations`) and ``oracle``: the oracle's
        feedback on ``attempt``."""
        return {**super().feedback_perturbations(problem, attempt, feedback, answer=answer),
                "oracle": self.oracle_feedback(problem, attempt)}


#: the values of the benchmark option ``verdict_fallback``
VERDICT_FALLBACKS: tuple[str | None, ...] = (None, "keywords")
_VERDICT_LINE = re.compile(r"\s*verdict\s*:\s*(correct|incorrect)\s*", re.IGNORECASE)
_WRONG_WORDS = re.compile(r"\b(wrong|incorrect|error|errors|mistake|mistakes|not correct|not right)\b")
_RIGHT_WORDS = re.compile(r"\b(correct|right)\b")


def generated_split(split: str, sizes: dict[str, int], cache: dict[str, list[Problem]],
                    generate: Callable[[str, int, set[str]], list[Problem]],
                    key: Callable[[Problem], str]) -> list[Problem]:
    """Split ``split`` of a generated benchmark: the splits are generated in the order test,
    validation, train (``generate(name, sizes[name], taken)``), each excluding the ``key`` of every
    problem of the ones before, so they are disjoint and the test split depends only on its own
    size and the seed; generated splits are kept in ``cache``. Returns a new list."""
    taken: set[str] = set()
    for name in ("test", "validation", "train"):
        if name not in cache:
            cache[name] = generate(name, sizes[name], taken)
        if name == split:
            break
        taken |= {key(p) for p in cache[name]}
    return list(cache[split])


def verdict_line(feedback: str) -> bool | None:
    """The verdict of a feedback's verdict line, read strictly: the last line that is
    ``Verdict: correct`` (True) or ``Verdict: incorrect`` (False), in any case, with whitespace
    around its words; None when no line is exactly that (a sentence, markdown around it, a
    trailing period, or a prompt's instruction quoted in a line of its own are no verdict). Pure."""
    for line in reversed(feedback.splitlines()):
        m = _VERDICT_LINE.fullmatch(line)
        if m:
            return m.group(1).lower() == "correct"
    return None


def keyword_verdict(feedback: str) -> bool | None:
    """The labelled fallback (``verdict_fallback: keywords``): free text read by keywords, a
    wrong-word (wrong, incorrect, error, mistake, not correct) is False, else a right-word
    (correct, right) is True, else None. It misreads approvals ("There are no errors" is False)
    and prompts echoed back: never the default. Pure."""
    text = feedback.lower()
    if _WRONG_WORDS.search(text):
        return False
    if _RIGHT_WORDS.search(text):
        return True
    return None
