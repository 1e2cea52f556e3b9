"""Critic diagnostics (METHOD.md v3 metrics table): does the critic *check*?

Pure functions over per-feedback arrays. Each feedback judges one attempt; ``says_right`` is the
feedback's verdict as the benchmark reads it (:meth:`Benchmark.feedback_verdict`: True = it
approves the attempt, False = it asks for a change, None = no verdict could be read),
``correct`` whether the verifier judged the attempt correct, and ``exact`` (optional, synthetic
benchmarks) whether the feedback is exactly the oracle's: it names the first wrong step and its
right value.

| metric | definition (rates in [0, 1]; None when the denominator is empty) |
|---|---|
| ``false_alarm_rate`` | P(verdict wrong │ attempt right): an unreadable verdict counts as "wrong" \
(it asks for no approval) |
| ``miss_rate`` | P(verdict right │ attempt wrong) |
| ``exact_correction_rate`` | P(feedback is the oracle's │ attempt wrong) |
| ``verdict_accuracy`` | P(verdict matches the verifier); an unreadable verdict is a mismatch |
| ``verdict_unparsed`` | P(verdict unreadable): evaluation's ``critic/verdict_unparsed`` |

METHOD v4's critic gate reads :func:`detection` instead: there a feedback *flags* an attempt only
when its verdict says it is wrong, so an unreadable verdict counts as "not flagged" (an
unreadable critic detects nothing, and it cannot pass the gate by false alarms either).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DIAGNOSTICS: tuple[str, ...] = ("false_alarm_rate", "miss_rate", "exact_correction_rate", "verdict_accuracy")


def _rate(hits: Sequence[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def critic_diagnostics(says_right: Sequence[bool | None], correct: Sequence[bool],
                       exact: Sequence[bool] | None = None) -> dict[str, Any]:
    """The four diagnostics of ``F`` feedbacks (see the module docstring), the share of
    unreadable verdicts ``verdict_unparsed`` (None for no feedback), plus the counts they rest
    on: ``n_right`` and ``n_wrong`` attempts. ``exact`` None: no oracle, so no
    ``exact_correction_rate`` (it is None)."""
    if len(says_right) != len(correct) or (exact is not None and len(exact) != len(correct)):
        raise ValueError(f"need arrays of one length, got {len(says_right)}, {len(correct)}"
                         f"{'' if exact is None else f', {len(exact)}'}")
    right = [i for i, c in enumerate(correct) if c]
    wrong = [i for i, c in enumerate(correct) if not c]
    return {
        "false_alarm_rate": _rate([says_right[i] is not True for i in right]),
        "miss_rate": _rate([says_right[i] is True for i in wrong]),
        "exact_correction_rate": None if exact is None else _rate([bool(exact[i]) for i in wrong]),
        "verdict_accuracy": _rate([says_right[i] is not None and says_right[i] == correct[i]
                                   for i in range(len(correct))]),
        "verdict_unparsed": _rate([s is None for s in says_right]),
        "n_right": len(right), "n_wrong": len(wrong),
    }


def shortcut_gap(says_right: Sequence[bool | None], flagged_group: Sequence[bool]) -> dict[str, Any]:
    """False alarms on **correct** attempts split by a property of their problems (the base
    check: whether the problem uses one of the seed's misconception operations).

    Returns ``false_alarm_rate`` over all, ``..._in`` / ``..._out`` within and outside the group,
    and ``shortcut_gap`` = in − out (None if either side is empty): a critic that checks
    arithmetic false-alarms as rarely on one side as on the other.
    """
    if len(says_right) != len(flagged_group):
        raise ValueError(f"need arrays of one length, got {len(says_right)} and {len(flagged_group)}")
    alarms = [s is not True for s in says_right]
    inside = [a for a, g in zip(alarms, flagged_group) if g]
    outside = [a for a, g in zip(alarms, flagged_group) if not g]
    fa_in, fa_out = _rate(inside), _rate(outside)
    return {"false_alarm_rate": _rate(alarms), "false_alarm_rate_in": fa_in, "false_alarm_rate_out": fa_out,
            "shortcut_gap": None if fa_in is None or fa_out is None else fa_in - fa_out,
            "n_in": len(inside), "n_out": len(outside)}


def detection(says_right: Sequence[bool | None], correct: Sequence[bool]) -> dict[str, Any]:
    """How well ``F`` verdicts detect wrong attempts (METHOD v4, "Critic gate").

    A verdict *flags* its attempt when it says wrong (``says_right`` False); an unreadable verdict
    (None) is **not** a flag. ``recall`` = P(flagged │ attempt wrong), ``false_alarm_rate`` =
    P(flagged │ attempt right) and Youden's ``J`` = recall − false_alarm_rate, in [−1, 1]: 0 for a
    critic that approves everything (and for one that flags everything), 1 for a perfect one.
    A rate is None when its denominator is empty, and J then too. Also ``unreadable``, the share
    of verdicts that could not be read, and the counts ``n_right`` and ``n_wrong``."""
    if len(says_right) != len(correct):
        raise ValueError(f"need arrays of one length, got {len(says_right)} and {len(correct)}")
    flagged = [s is False for s in says_right]
    recall = _rate([f for f, c in zip(flagged, correct) if not c])
    false_alarm = _rate([f for f, c in zip(flagged, correct) if c])
    return {"recall": recall, "false_alarm_rate": false_alarm,
            "J": None if recall is None or false_alarm is None else recall - false_alarm,
            "unreadable": _rate([s is None for s in says_right]),
            "n_right": sum(bool(c) for c in correct), "n_wrong": sum(not c for c in correct)}
