"""Turn-level metrics of a two-turn evaluation (METHOD.md "Metrics").

Inputs are per-problem correctness of the first attempt z (turn 1) and of the final
answer y_hat (turn 2), as Python sequences or numpy arrays of bools or 0/1 values,
aligned by problem. All rates are fractions in [0, 1] of the N problems.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def as_bool_array(values: Sequence[bool] | np.ndarray, name: str = "values") -> np.ndarray:
    """Convert per-problem correctness to a 1-D bool array [N], refusing non-0/1 values.

    A partial reward such as 0.5 (fraction of tests passed) is not "correct": convert
    with `reward == 1` before calling, so the caller decides, not a silent bool(0.5).
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != bool:
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must hold bools or 0/1, got values {np.unique(arr)[:5]}")
        arr = arr.astype(bool)
    return arr


def _paired(a, b, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = as_bool_array(a, name_a), as_bool_array(b, name_b)
    if x.shape != y.shape:
        raise ValueError(f"{name_a} and {name_b} differ in length: {x.size} vs {y.size}")
    if x.size == 0:
        raise ValueError("no problems: metrics over an empty set are undefined")
    return x, y


def turn_metrics(
    correct_t1: Sequence[bool] | np.ndarray, correct_t2: Sequence[bool] | np.ndarray
) -> dict[str, float | None]:
    """Accuracy per turn and the wrong/correct transition table.

    correct_t1: [N] whether the first attempt z was correct.
    correct_t2: [N] whether the refinement y_hat was correct (refine-all protocol).
    returns: {
      "acc@t1", "acc@t2":   mean correctness per turn,
      "delta":              acc@t2 - acc@t1,
      "i->c", "c->i", "i->i": fraction of all N problems going wrong->correct,
                            correct->wrong, wrong->wrong (c->c = 1 minus the three),
      "correction_rate":    i->c / P(z wrong): how often a wrong first attempt gets fixed;
                            None when no first attempt was wrong,
      "regression_rate":    c->i / P(z correct): how often a right attempt gets broken;
                            None when no first attempt was right }.
    """
    t1, t2 = _paired(correct_t1, correct_t2, "correct_t1", "correct_t2")
    acc1, acc2 = float(t1.mean()), float(t2.mean())
    i_c = float((~t1 & t2).mean())
    c_i = float((t1 & ~t2).mean())
    i_i = float((~t1 & ~t2).mean())
    p_wrong = 1.0 - acc1
    return {
        "acc@t1": acc1,
        "acc@t2": acc2,
        "delta": acc2 - acc1,
        "i->c": i_c,
        "c->i": c_i,
        "i->i": i_i,
        "correction_rate": i_c / p_wrong if p_wrong > 0 else None,
        "regression_rate": c_i / acc1 if acc1 > 0 else None,
    }


def oracle_gated_accuracy(
    correct_t1: Sequence[bool] | np.ndarray, correct_t2: Sequence[bool] | np.ndarray
) -> float:
    """Oracle-gated accuracy (METHOD.md "Evaluation protocol"; always report it labelled).

    Only problems whose z was wrong are refined, and a problem counts as solved if either
    turn solved it: mean(t1 or (not t1 and t2)) = mean(t1 or t2). `correct_t2` entries
    where z was right are ignored (those problems would not have been refined).
    It equals acc@t1 + i->c >= acc@t2, which is why it is optimistic.
    """
    t1, t2 = _paired(correct_t1, correct_t2, "correct_t1", "correct_t2")
    return float((t1 | (~t1 & t2)).mean())
