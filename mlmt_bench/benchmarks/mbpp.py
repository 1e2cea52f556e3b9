"""MBPP: Mostly Basic Python Problems, full (974) and sanitized (427).

Full (``mbpp.jsonl``, hub ``google-research-datasets/mbpp`` config ``full``): rows
``task_id, text, code, test_list, test_setup_code, challenge_test_list``.
Sanitized (``sanitized-mbpp.json``, hub config ``sanitized``): rows ``task_id, prompt,
code, test_list, test_imports, source_file``.

Splits follow the upstream README, by task id, for both variants:
``prompt`` 1-10, ``test`` 11-510, ``validation`` 511-600, ``train`` 601-974. The full set
has 10 / 500 / 90 / 374 tasks; the sanitized set (ids 2-809) has 7 / 257 / 43 / 120, which
are exactly the four splits of the hub's ``sanitized`` config. They are disjoint, as METHOD.md
v2 asks (sweeps read ``validation``, reports read ``test``, the split papers report).

Each :class:`~mlmt_bench.types.Problem` has:

* ``prompt``: the task text, then "Your code should pass these tests:" and the first
  ``shown_tests`` asserts (default 1, which names the function and its call signature);
* ``tests``: ``test_list`` (all of them, including the one shown);
* ``setup``: ``test_setup_code`` (full) or the ``test_imports`` lines (sanitized). Upstream
  runs it after the candidate program and before the asserts (two full-set tasks build
  trees with a ``Node`` class that the solution defines);
* ``metadata``: ``task_id``, ``code`` (reference solution), ``entry_point`` (the function
  the tests call), ``challenge_tests`` (full set; kept out of ``tests``), ``source_file``
  (sanitized).

``\\r\\n`` line breaks are normalised to ``\\n`` everywhere.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any, ClassVar

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.benchmarks.data import DataSpec, HubSource, load_records
from mlmt_bench.benchmarks.perturbations import code_perturbations
from mlmt_bench.benchmarks.redaction import last_code_block, redact_code
from mlmt_bench.errors import UserError
from mlmt_bench.types import VERDICT_INSTRUCTION, Problem, PromptTemplates, Redaction

CODE_TEMPLATES = PromptTemplates(
    attempt=(
        "{problem}\n\nWrite the Python solution in a single ```python code block. "
        "Define the function with exactly the name and arguments used in the tests."
    ),
    feedback=(
        "Here is a programming task and an attempted solution.\n\nTask:\n{problem}\n\n"
        "Attempted solution:\n{attempt}\n\n"
        "Review the code. Point out the first bug, if any, and explain how to fix it. "
        "Do not write the corrected code. " + VERDICT_INSTRUCTION
    ),
    refine=(
        "Feedback on your solution:\n{feedback}\n\n"
        "Using this feedback, write the corrected Python solution in a single ```python code block."
    ),
    null_feedback="Check your code carefully for bugs.",
)

#: (split, first task id, last task id), from the MBPP README.
ID_RANGES: tuple[tuple[str, int, int], ...] = (
    ("prompt", 1, 10),
    ("test", 11, 510),
    ("validation", 511, 600),
    ("train", 601, 974),
)


def split_of(task_id: int) -> str | None:
    for split, lo, hi in ID_RANGES:
        if lo <= task_id <= hi:
            return split
    return None


def _nl(s: Any) -> str:
    return str(s or "").replace("\r\n", "\n").replace("\r", "\n")


def entry_point(code: str, tests: list[str]) -> str | None:
    """The function the tests call: a top-level ``def`` of the reference code whose name is
    called in the first test; failing that, the first name called in the first assert."""
    first = tests[0] if tests else ""
    try:
        with warnings.catch_warnings():  # upstream code has invalid escapes such as "\d"
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    except SyntaxError:
        names = []
    for name in names:
        if re.search(r"\b" + re.escape(name) + r"\s*\(", first):
            return name
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:math\.isclose\(|set\(|sorted\()?\s*([A-Za-z_]\w*)\s*\(", first)
    return m.group(1) if m else None


def _to_int(v: Any, origin: str, index: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise UserError(f"{origin}: record {index + 1} has a non-integer task_id") from None


def _str_list(v: Any, what: str, origin: str, index: int) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)) or not all(isinstance(t, str) for t in v):
        raise UserError(f"{origin}: record {index + 1}: {what} must be a list of strings")
    return [_nl(t).strip() for t in v if str(t).strip()]


class _MBPPBase(Benchmark):
    default_verifier = "code"
    splits = ("prompt", "train", "validation", "test")
    templates = CODE_TEMPLATES
    data_spec: ClassVar[DataSpec]
    id_prefix: ClassVar[str]

    def __init__(self, path: str | None = None, seed: int = 0, shown_tests: int = 1, **options: Any) -> None:
        super().__init__(path=path, seed=seed, **options)
        if isinstance(shown_tests, bool) or not isinstance(shown_tests, int) or shown_tests < 0:
            raise UserError(f"benchmark {self.name}: shown_tests must be an integer >= 0, got {shown_tests!r}")
        self.shown_tests = shown_tests
        self._problems: list[Problem] | None = None
        self.origin: str | None = None

    # -- row conversion ---------------------------------------------------------------
    def _statement(self, row: dict[str, Any]) -> str:
        raise NotImplementedError

    def _setup(self, row: dict[str, Any], origin: str, index: int) -> str:
        raise NotImplementedError

    def _extra(self, row: dict[str, Any], origin: str, index: int) -> dict[str, Any]:
        return {}

    def make_problem(self, row: dict[str, Any], index: int, origin: str) -> Problem:
        task_id = _to_int(row["task_id"], origin, index)
        tests = _str_list(row["test_list"], "test_list", origin, index)
        if not tests:
            raise UserError(f"{origin}: record {index + 1} (task {task_id}) has no tests")
        code = _nl(row.get("code"))
        text = _nl(self._statement(row)).strip()
        prompt = text
        if self.shown_tests:
            prompt += "\nYour code should pass these tests:\n" + "\n".join(tests[: self.shown_tests])
        return Problem(
            id=f"{self.id_prefix}/{task_id}",
            benchmark=self.name,
            prompt=prompt,
            answer=None,
            tests=tuple(tests),
            setup=self._setup(row, origin, index),
            metadata={
                "task_id": task_id,
                "split": split_of(task_id),
                "text": text,
                "code": code,
                "entry_point": entry_point(code, tests),
                **self._extra(row, origin, index),
            },
        )

    def all_problems(self) -> list[Problem]:
        """Every task, in task-id order (loaded once per instance)."""
        if self._problems is None:
            found = load_records(self.data_spec, self.path)
            self.origin = found.origin
            problems = [self.make_problem(r, i, found.origin) for i, r in enumerate(found.rows)]
            problems.sort(key=lambda p: p.metadata["task_id"])
            seen: set[str] = set()
            for p in problems:
                if p.id in seen:
                    raise UserError(f"{found.origin}: duplicate task_id {p.metadata['task_id']}")
                seen.add(p.id)
            self._problems = problems
        return self._problems

    def load(self, split: str) -> list[Problem]:
        self.check_split(split)
        return [p for p in self.all_problems() if p.metadata["split"] == split]

    def redact_feedback(self, problem: Problem, attempt: str, feedback: str) -> Redaction:
        """Code (METHOD v4): fenced code blocks and inline code become ``[…]``
        (:func:`~mlmt_bench.benchmarks.redaction.redact_code`)."""
        return redact_code(feedback)

    def stated_answer(self, feedback: str) -> str | None:
        """The feedback's last fenced code block, as a ```` ```python ```` block; None if none."""
        code = last_code_block(feedback)
        return None if code is None else f"```python\n{code}\n```"

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """Code's rows (:func:`~mlmt_bench.benchmarks.perturbations.code_perturbations`): code is
        the value a code feedback can supply; ``last_shifted`` and ``oracle`` do not apply."""
        return code_perturbations(feedback, problem.metadata.get("code") or None)


def _hub_full(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")}


def _hub_sanitized(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ("source_file", "task_id", "prompt", "code", "test_imports", "test_list")}


_HUB_SPLITS = ("prompt", "test", "validation", "train")

MBPP_DATA = DataSpec(
    benchmark="mbpp",
    filenames=("mbpp.jsonl",),
    extra_names=("mbpp.jsonl.gz",),
    required=("task_id", "text", "code", "test_list"),
    hub=HubSource("google-research-datasets/mbpp", "full", _HUB_SPLITS, sort_key="task_id", convert=_hub_full),
)

MBPP_SANITIZED_DATA = DataSpec(
    benchmark="mbpp-sanitized",
    filenames=("sanitized-mbpp.json",),
    extra_names=("sanitized-mbpp.json.gz", "mbpp_sanitized.json"),
    required=("task_id", "prompt", "code", "test_list"),
    hub=HubSource("google-research-datasets/mbpp", "sanitized", _HUB_SPLITS, sort_key="task_id",
                  convert=_hub_sanitized),
)


class MBPP(_MBPPBase):
    """``MBPP(path=None, seed=0, shown_tests=1)``; splits prompt / train / validation / test
    (10 / 374 / 90 / 500). ``seed`` is accepted and unused (the split is fixed by task id)."""

    name = "mbpp"
    data_spec = MBPP_DATA
    id_prefix = "mbpp"

    def _statement(self, row: dict[str, Any]) -> str:
        return row["text"]

    def _setup(self, row: dict[str, Any], origin: str, index: int) -> str:
        return _nl(row.get("test_setup_code")).strip()

    def _extra(self, row: dict[str, Any], origin: str, index: int) -> dict[str, Any]:
        return {"challenge_tests": _str_list(row.get("challenge_test_list"), "challenge_test_list", origin, index)}


class MBPPSanitized(_MBPPBase):
    """``MBPPSanitized(path=None, seed=0, shown_tests=1)``; the same id-range splits
    (7 / 120 / 43 / 257 tasks)."""

    name = "mbpp-sanitized"
    data_spec = MBPP_SANITIZED_DATA
    id_prefix = "mbpp-sanitized"

    def _statement(self, row: dict[str, Any]) -> str:
        return row["prompt"]

    def _setup(self, row: dict[str, Any], origin: str, index: int) -> str:
        imports = _str_list(row.get("test_imports"), "test_imports", origin, index)
        return "\n".join(imports)

    def _extra(self, row: dict[str, Any], origin: str, index: int) -> dict[str, Any]:
        return {"source_file": row.get("source_file")}
