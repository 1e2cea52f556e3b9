"""Final-answer maths verifier: extract the answer, then test equivalence with math-verify.

Extraction (:func:`extract_answer`), first rule that finds something wins:

1. the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces; ``\\boxed 5`` also works);
2. the last "final answer is X" / "the answer is X" / "Answer: X" / "#### X" phrase, up to
   the end of its sentence or line;
3. the last number in the text (``-1,234.5``, ``3/4``, ``.5``).

Equivalence (:func:`answers_equivalent`): the two strings are equal after the fallback
normaliser :func:`normalize_answer` (drops ``\\text{}``, ``\\left``/``\\right``, ``$``, spaces,
``^\\circ``, ``\\%``, unit words, thousands separators, a trailing ``.``; ``\\dfrac`` ->
``\\frac``; ``\\frac12`` -> ``\\frac{1}{2}``); two plain integers are compared by value
without math-verify (:func:`integer_rule`); otherwise math-verify's ``verify(parse(gold),
parse(pred))`` must hold for the raw or the normalised strings.

Timeouts: math-verify's own signal-based timeouts are switched off and each math-verify
check runs in a worker process with a hard deadline (``timeout`` seconds, default 5); see
:mod:`mlmt_bench.verifiers.timeout` for why. This works from any thread. ``isolation:
inline`` runs checks in the calling process instead (soft ``SIGALRM`` deadline on the main
thread, none elsewhere), for environments where subprocesses are not allowed.

Verdict kinds: ``ok`` / ``wrong`` / ``no_answer`` (nothing extracted) / ``timeout`` /
``crash`` (the checker failed, or the problem has no gold answer). ``score`` never raises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier
from mlmt_bench.verifiers.math_text import (  # re-exported (`X as X`): the maths verifier's text rules
    extract_answer,
    extract_boxed as extract_boxed,
    normalize_answer,
    strip_unit_tails as strip_unit_tails,
    unwrap_commands as unwrap_commands,
)
from mlmt_bench.verifiers.timeout import (
    CallTimeout,
    WorkerCrashed,
    WorkerPool,
    WorkerRaised,
    call_inline,
    shared_pool,
)

# ---------------------------------------------------------------------------------------
# math-verify check (runs in a worker process)
# ---------------------------------------------------------------------------------------

_quiet_done = False


def _quiet_math_verify() -> None:
    """We switch math-verify's timeouts off on purpose: silence its one-time warnings."""
    global _quiet_done
    if _quiet_done:
        return
    import logging

    import math_verify.grader as grader
    import math_verify.parser as parser

    for mod in (parser, grader):
        if hasattr(mod, "TIMEOUT_WARNING_SHOWN"):
            mod.TIMEOUT_WARNING_SHOWN = True
    try:
        import math_verify.utils as utils

        utils.TIMEOUT_WARNING_SHOWN = True
    except ImportError:
        pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _quiet_done = True


def _mv_pair(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    g = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    if not g:
        return False
    p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not p:
        return False
    return bool(verify(g, p, timeout_seconds=None))


def math_verify_equal(gold: str, pred: str) -> bool:
    """math-verify on the raw strings, then on the normalised ones (spaces kept)."""
    _quiet_math_verify()
    if _mv_pair(gold, pred):
        return True
    ng, np_ = normalize_answer(gold, strip_spaces=False), normalize_answer(pred, strip_spaces=False)
    if (ng, np_) != (gold, pred) and ng and np_:
        return _mv_pair(ng, np_)
    return False


def _check_in_worker(gold: str, pred: str) -> bool:
    return math_verify_equal(gold, pred)


_BASE_RE = re.compile(r"([0-9A-Za-z]+)_\{?(\d+)\}?")


def base_rule(gold: str, pred: str) -> bool | None:
    """Numbers written in a base (``52_8``): math-verify drops the subscript, so ``52_8``
    would equal ``52_7``. When both sides carry a base subscript, decide here: same digits
    and same base. Otherwise None (no opinion; ``52`` for ``52_8`` stays correct, the
    problem asked for the answer in base 8)."""
    g = _BASE_RE.fullmatch(normalize_answer(gold))
    p = _BASE_RE.fullmatch(normalize_answer(pred))
    if g and p:
        return (g.group(1).upper().lstrip("0"), g.group(2)) == (p.group(1).upper().lstrip("0"), p.group(2))
    return None


_INT_RE = re.compile(r"[-+]?\d+")


def integer_rule(norm_gold: str, norm_pred: str) -> bool | None:
    """Two normalised plain integers (``-12``, ``007``) are equal iff their values are, as
    math-verify would also say; decided here so most GSM8K and synthetic answers need no
    worker round-trip (and cannot time out on a loaded machine). Otherwise None."""
    if _INT_RE.fullmatch(norm_gold) and _INT_RE.fullmatch(norm_pred):
        return _canonical_int(norm_gold) == _canonical_int(norm_pred)
    return None


def _canonical_int(s: str) -> str:
    """``"-007"`` -> ``"-7"``, ``"-0"`` -> ``"0"``; on the text, so a 10,000-digit answer
    does not hit Python's int-conversion limit."""
    digits = s.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if s.startswith("-") and digits != "0" else digits


def answers_equivalent(gold: str, pred: str) -> bool:
    """Unbounded, in-process equivalence test (normaliser, base rule, then math-verify). For
    scripts; the verifier itself bounds the math-verify part with a deadline."""
    ng = normalize_answer(gold)
    npred = normalize_answer(pred)
    if ng and ng == npred:
        return True
    rule = base_rule(gold, pred)
    if rule is not None:
        return rule
    same = integer_rule(ng, npred)
    if same is not None:
        return same
    return math_verify_equal(gold, pred)


# ---------------------------------------------------------------------------------------
# Verifier
# ---------------------------------------------------------------------------------------


class MathVerifier(Verifier):
    """``MathVerifier(timeout=5.0, workers=None, isolation="process", memory_limit_mb=4096)``.

    timeout:         CPU seconds allowed for one math-verify check (hard deadline; at most
                     4x that in wall time on a loaded machine, see ``verifiers.timeout``).
    workers:         worker processes (and threads in ``score_batch``); default: CPU count.
    isolation:       "process" (default) or "inline" (see the module docstring).
    memory_limit_mb: address-space limit of each worker process (None: no limit).
    """

    name = "math"
    leak_kind = "math"

    def __init__(self, timeout: float = 5.0, workers: int | None = None, isolation: str = "process",
                 memory_limit_mb: int | None = 4096, **options: Any) -> None:
        if options:
            raise UserError(f"verifier math: unknown option(s) {', '.join(sorted(options))}")
        super().__init__(timeout=timeout, workers=workers, isolation=isolation, memory_limit_mb=memory_limit_mb)
        try:
            self.timeout = float(timeout)
        except (TypeError, ValueError):
            raise UserError(f"verifier math: timeout must be a number of seconds, got {timeout!r}") from None
        if not self.timeout > 0:
            raise UserError(f"verifier math: timeout must be > 0, got {timeout!r}")
        if isolation not in ("process", "inline"):
            raise UserError(f"verifier math: isolation must be 'process' or 'inline', got {isolation!r}")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise UserError(f"verifier math: workers must be a positive integer, got {workers!r}")
        self.isolation = isolation
        self.workers = workers
        self.memory_limit_mb = memory_limit_mb
        self._pool: WorkerPool | None = None

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = shared_pool(self.workers, self.memory_limit_mb, ("math_verify", __name__))
        return self._pool

    def _check(self, gold: str, pred: str) -> bool:
        if self.isolation == "inline":
            return call_inline(_check_in_worker, (gold, pred), self.timeout)
        return self.pool.call(_check_in_worker, (gold, pred), self.timeout)

    def score(self, problem: Problem, response: str) -> Verdict:
        try:
            return self._score(problem, response)
        except Exception as exc:  # never raise on model output
            return Verdict(0.0, False, None, "crash", f"{type(exc).__name__}: {exc}"[:300])

    def _score(self, problem: Problem, response: str) -> Verdict:
        gold = problem.answer
        if gold is None or not str(gold).strip():
            return Verdict(0.0, False, None, "crash", "problem has no gold answer")
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        pred = extract_answer(response)
        if pred is None:
            return Verdict(0.0, False, None, "no_answer", "no final answer found")
        ng = normalize_answer(gold)
        npred = normalize_answer(pred)
        if ng and ng == npred:
            return Verdict(1.0, True, pred, "ok", "equal after normalisation")
        rule = base_rule(gold, pred)
        if rule is not None:
            return Verdict(float(rule), rule, pred, "ok" if rule else "wrong", "base-subscript rule")
        same = integer_rule(ng, npred)
        if same is not None:
            return Verdict(float(same), same, pred, "ok" if same else "wrong", "integer comparison")
        try:
            equal = self._check(gold, pred)
        except CallTimeout:
            return Verdict(0.0, False, pred, "timeout", f"equivalence check exceeded {self.timeout:g} s")
        except (WorkerCrashed, WorkerRaised) as exc:
            return Verdict(0.0, False, pred, "crash", str(exc)[:300])
        if equal:
            return Verdict(1.0, True, pred, "ok", "math-verify equivalent")
        return Verdict(0.0, False, pred, "wrong", "not equivalent")

    def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """Parallel over worker processes (one thread per worker drives its calls)."""
        problems, responses = list(problems), list(responses)
        if len(problems) != len(responses):
            raise ValueError("score_batch: problems and responses differ in length")
        n_threads = 1 if self.isolation == "inline" else min(len(problems), self.pool.max_workers)
        if n_threads <= 1:
            return [self.score(p, r) for p, r in zip(problems, responses)]
        with ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="math-verify") as ex:
            return list(ex.map(self.score, problems, responses))
