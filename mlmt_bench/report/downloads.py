"""The numbers of a comparison as CSV, for a reader's own analysis: ``index.html`` links them as
downloads embedded in the page (``data:`` URLs, so the page stays one self-contained file).

- ``metrics.csv``: one row per arm: its seeds, every metric of the table as the mean and sample
  std over seeds (fractions, not percentages), the 95% intervals of acc@t1 / acc@t2 / acc@t2
  after g∅ and what they resampled, the gain over the arm's own step 0 and the difference from
  the baseline (and from ``<baseline> + base critic``, where the report has that comparison) with
  their intervals and p-values (Holm-adjusted for the differences).
- ``outcomes.csv.gz``: one row per run and problem of the final evaluation (the evaluation read,
  under ``--at-flops``): arm, seed, run (as the report shows it), problem id and 0/1 for t1, t2,
  t2 after g∅ (empty when not measured). Gzip without a timestamp: the same runs give the same bytes.
"""

from __future__ import annotations

import csv
import gzip
import io
from typing import TYPE_CHECKING, Any

from mlmt_bench.report.formatting import CI_METRICS, TABLE_METRICS

if TYPE_CHECKING:
    from mlmt_bench.report.runs import RunRecord

#: the columns of a gain or a difference: (record key, column suffix)
_CHANGE = (("lo", "lo"), ("hi", "hi"), ("p_value", "p"))


def _csv(rows: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([["" if v is None else v for v in row] for row in rows])
    return buf.getvalue().encode("utf-8", "backslashreplace")  # a lone surrogate from a copied log: its escape


def metrics_csv(summary: dict[str, Any]) -> bytes:
    """``metrics.csv`` of a :func:`~mlmt_bench.report.compare.build_comparison` summary."""
    contrasts = []  # (baseline, its paired records): the baseline, then <baseline> + base critic
    if summary.get("baseline") is not None:
        contrasts.append((summary["baseline"], summary["paired"]))
    if summary.get("equal_help"):
        contrasts.append((summary["equal_help"]["baseline"], summary["equal_help"]["paired"]))
    keys = [key for key, _, _ in TABLE_METRICS if any(key in s["metrics"] for s in summary["arms"].values())]
    header = ["arm", "seeds"] + [f"{k}_{m}" for k in keys for m in ("mean", "std")]
    header += [f"{k}_ci_{m}" for k, _ in CI_METRICS for m in ("lo", "hi", "interval")]
    header += ["gain_acc@t2", *(f"gain_acc@t2_{s}" for _, s in _CHANGE)]
    for baseline, _ in contrasts:
        header += [f"acc@t2_minus_{baseline}", *(f"acc@t2_minus_{baseline}_{s}" for _, s in _CHANGE[:2]),
                   f"acc@t2_minus_{baseline}_p_holm"]
    rows: list[list[Any]] = [header]
    for arm, s in summary["arms"].items():
        row: list[Any] = [arm, " ".join(str(seed) for seed in s["seeds"])]
        row += [(s["metrics"].get(k) or {}).get(m) for k in keys for m in ("mean", "std")]
        row += [(s["ci"].get(k) or {}).get(m) for k, _ in CI_METRICS for m in ("lo", "hi", "interval")]
        g = s.get("gain") or {}
        row += [g.get("mean"), *(g.get(k) for k, _ in _CHANGE)]
        for _, paired in contrasts:
            p = paired.get(arm) or {}
            row += [p.get("diff"), p.get("lo"), p.get("hi"), p.get("p_holm")]
        rows.append(row)
    return _csv(rows)


def outcomes_csv_gz(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> bytes:
    """``outcomes.csv.gz``: every run's per-problem outcomes at the evaluation the report read."""
    rows: list[list[Any]] = [["arm", "seed", "run", "problem_id", "t1", "t2", "t2_null"]]
    for arm, results in loaded.items():
        shown = summary["arms"][arm]["runs"]
        for run, path in zip(results, shown):
            for pid, o in sorted(run.problems.items()):
                rows.append([arm, run.seed, path, pid,
                             *(None if o.get(t) is None else int(bool(o[t])) for t in ("t1", "t2", "t2_null"))])
    return gzip.compress(_csv(rows), mtime=0)
