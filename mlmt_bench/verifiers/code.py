"""Code verifier: extract a Python program from a response and run the problem's tests on it.

``CodeVerifier(timeout_s=10, memory_mb=512, workers=None, sandbox_disable=())``;
``score(problem, response)``; ``score_batch(problems, responses)`` runs up to ``workers``
sandboxes at once (threads, each waiting on its own sandbox process tree). ``sandbox_disable``
names isolation mechanisms to switch off (:data:`~mlmt_bench.verifiers.sandbox.MECHANISMS`): the
only way to weaken the sandbox, logged here and, in a run, printed at start and recorded in the
manifest (``sandbox_disabled``).

Reward is the fraction of ``problem.tests`` that pass; ``correct`` means all pass. Kinds:

* ``ok`` all tests pass; ``wrong`` the program ran and some test failed;
* ``no_answer`` no program found in the response;
* ``timeout`` wall clock or CPU limit hit (reward = tests passed before that);
* ``crash`` syntax error, exception while loading the program (``sys.exit`` included, reward 0)
  or the process ended before the tests finished (reward = tests passed before that);
* ``sandbox_violation`` network use, output cap, file-size or memory limit: reward 0.

Order of execution in the sandbox, as in MBPP: the program, then ``problem.setup`` (MBPP
``test_setup_code`` / ``test_imports``; it may use the program's names), then the tests, each
evaluated by the judge's evaluator process, sandboxed too (tests that come with a ``verify``
input line or a dataset are untrusted; see :mod:`mlmt_bench.verifiers.sandbox`). The program runs as a
module named ``__solution__`` (``if __name__ == "__main__":`` blocks are skipped), with the
standard library only; builtins it monkeypatches are restored before each answer is sent.

What the judge trusts: the tests' own text, stdlib modules, and from the setup only its stdlib
imports and plain-literal assignments. Anything else the setup defines lives in the candidate's
process, so it is fine as an *input* (``root = Node(1)``) but must not hold an expected value.
Results cross from the candidate as plain data (numbers, strings, bytes, containers, Counter,
deque, Decimal, Fraction, iterators as lists); any other object arrives as an opaque token that
only has its truth value and equals nothing but itself.
"""

from __future__ import annotations

import ast
import logging
import re
import textwrap
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import shorten
from mlmt_bench.machine.cpus import cpu_budget
from mlmt_bench.types import Problem, Verdict, VerdictKind
from mlmt_bench.verifiers.base import Verifier
from mlmt_bench.verifiers.sandbox import Limits, RunResult, capabilities, check_disable, check_environment, run_tests

log = logging.getLogger(__name__)

_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`]*)[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`]*)[^\n]*\n", re.M)
_PY_LANGS = {"python", "py", "python3", "py3", "pycon", "ipython"}


# compiling model output must not print its SyntaxWarnings / DeprecationWarnings (invalid
# escapes ...) in the host; catch_warnings touches global state, hence the lock
_quiet = threading.Lock()


def _parses(text: str) -> bool:
    try:
        with _quiet, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def extract_program(response: Any) -> str | None:
    """The candidate program in a response.

    The last fenced block tagged python (py, python3); else the last fenced block of any
    language; else, when there is no complete block, an unterminated final python fence (a
    truncated generation); else the whole text if it parses as Python. ``None`` if none.
    """
    if not isinstance(response, str) or not response.strip():
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(response)]
    chosen = None
    for lang, body in reversed(blocks):
        if lang in _PY_LANGS:
            chosen = body
            break
    if chosen is None and blocks:
        chosen = blocks[-1][1]
    if chosen is None:
        opens = list(_OPEN_FENCE.finditer(response))
        if opens and opens[-1].group(1).lower() in _PY_LANGS | {""}:
            chosen = response[opens[-1].end():]
    if chosen is not None:
        chosen = textwrap.dedent(chosen).strip("\n")
        return chosen if chosen.strip() else None
    text = response.strip("\n")
    if _parses(text):
        return text
    return None


def _syntax_error(program: str) -> str | None:
    try:
        with _quiet, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(program, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return f"{type(exc).__name__}: {exc.msg}{where}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def verdict_from_run(run: RunResult, program: str) -> Verdict:
    """Map a sandbox :class:`RunResult` to a :class:`Verdict` (see the module docstring)."""
    total = len(run.passed)
    n = run.n_passed
    frac = n / total if total else 0.0
    first_fail = next((f"test {i + 1}: {d or 'failed'}" for i, (p, d) in enumerate(zip(run.passed, run.details))
                       if not p), "")
    summary = f"{n}/{total} tests passed" + (f"; {first_fail}" if first_fail else "")

    def v(reward: float, kind: VerdictKind, detail: str) -> Verdict:
        return Verdict(reward=float(reward), correct=kind == "ok", extracted=program, kind=kind,
                       detail=detail[:500])

    if run.status == "sandbox_error":
        log.warning("sandbox error: %s", run.error)
        return v(0.0, "crash", f"sandbox error: {run.error}")
    if run.violation or run.status == "output_limit":
        return v(0.0, "sandbox_violation", f"sandbox violation: {run.violation or 'output limit'}")
    if run.status == "load_error":
        if run.error_type == "MemoryError":
            return v(0.0, "sandbox_violation", f"sandbox violation: memory limit ({run.error})")
        return v(0.0, "crash", f"program failed while loading: {run.error}")
    if run.status == "died" and run.exit_signal == 25:  # SIGXFSZ
        return v(0.0, "sandbox_violation", "sandbox violation: file size limit")
    if run.status == "timeout" or (run.status == "died" and run.exit_signal == 24):  # SIGXCPU
        return v(frac, "timeout", f"time limit exceeded; {summary}")
    if run.status in ("died", "protocol"):
        why = run.exit or run.status
        return v(frac, "crash", f"program stopped before the tests finished ({why}); {summary}")
    if total and n == total:
        return v(1.0, "ok", summary)
    return v(frac, "wrong", summary)


class CodeVerifier(Verifier):
    """Runs the extracted program against ``problem.tests`` in the sandbox."""

    name = "code"
    leak_kind = "code"

    def __init__(self, timeout_s: float = 10.0, memory_mb: int = 512, workers: int | None = None,
                 nproc: int = 32, fsize_mb: int = 16, output_bytes: int = 1 << 20,
                 max_program_chars: int = 200_000, sandbox_disable: Sequence[str] = (), **options: Any) -> None:
        if options:
            raise UserError(f"verifier code: unknown option(s) {', '.join(sorted(map(str, options)))}")
        check_environment()
        self.sandbox_disabled = check_disable(sandbox_disable)
        super().__init__(timeout_s=timeout_s, memory_mb=memory_mb, workers=workers,
                         sandbox_disable=list(self.sandbox_disabled))
        try:
            self.limits = Limits(timeout_s=float(timeout_s), memory_mb=int(memory_mb), nproc=int(nproc),
                                 fsize_mb=int(fsize_mb), output_bytes=int(output_bytes))
            self.workers = max(1, int(workers) if workers else cpu_budget())
            self.max_program_chars = int(max_program_chars)
        except (TypeError, ValueError) as exc:
            raise UserError(f"verifier code: options must be numbers ({shorten(str(exc))})") from None
        if self.sandbox_disabled:
            log.warning("code sandbox weakened on request: %s switched off (option sandbox_disable)",
                        ", ".join(self.sandbox_disabled))

    def score(self, problem: Problem, response: str) -> Verdict:
        try:
            return self._score(problem, response)
        except Exception as exc:  # noqa: BLE001 - never raise on model output
            log.exception("code verifier failed on %s", getattr(problem, "id", "?"))
            return Verdict(0.0, False, None, "crash", f"verifier error: {type(exc).__name__}: {exc}"[:500])

    def _score(self, problem: Problem, response: str) -> Verdict:
        program = extract_program(response)
        if program is None:
            return Verdict(0.0, False, None, "no_answer", "no Python program found in the response")
        if len(program) > self.max_program_chars:
            return Verdict(0.0, False, program[:1000], "crash",
                           f"program longer than {self.max_program_chars} characters")
        err = _syntax_error(program)
        if err is not None:
            return Verdict(0.0, False, program, "crash", err)
        if not problem.tests:
            return Verdict(0.0, False, program, "wrong", "problem has no tests")
        caps = capabilities(disable=self.sandbox_disabled) if self.sandbox_disabled else None
        run = run_tests(program, list(problem.tests), problem.setup or "", self.limits, caps=caps)
        return verdict_from_run(run, program)

    def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        if len(problems) != len(responses):
            raise ValueError(f"{len(problems)} problems but {len(responses)} responses")
        if self.workers == 1 or len(problems) <= 1:
            return [self.score(p, r) for p, r in zip(problems, responses)]
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="code-verifier") as pool:
            return list(pool.map(self.score, problems, responses))
