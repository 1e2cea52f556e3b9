"""Progress bars with ETA and the end-of-run summary table (rich), silent when disabled.

On a terminal the bars are rich's; when stderr is not a terminal (a log file, CI) a bar prints a
plain line now and then instead (every 10% and at least every 30 s), so that a long job written
to a log never stays silent for minutes.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class LineProgress:
    """The subset of ``rich.progress.Progress`` the project uses, as occasional plain lines on stderr."""

    def __init__(self, every_s: float = 30.0, stream: Any = None) -> None:
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields: Any) -> int:
        tid = len(self.tasks)
        self.tasks[tid] = {"description": description, "total": total, "completed": completed, "fields": fields,
                           "start": time.monotonic(), "last": 0.0, "decile": -1}
        return tid

    def update(self, task: int, *, advance: float = 0, completed: float | None = None, total: float | None = None,
               description: str | None = None, **fields: Any) -> None:
        t = self.tasks[task]
        t["completed"] = completed if completed is not None else t["completed"] + advance
        if total is not None:
            t["total"] = total
        if description is not None:
            t["description"] = description
        t["fields"].update(fields)
        now = time.monotonic()
        frac = t["completed"] / t["total"] if t["total"] else 0.0
        decile = int(frac * 10)
        if decile > t["decile"] or now - t["last"] >= self.every_s:
            t["decile"], t["last"] = decile, now
            extra = " ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in t["fields"].items())
            count = f"{t['completed']:.0f}/{t['total']:.0f} " if t["total"] and t["total"] != 100 else ""
            self.stream.write(f"{t['description']}: {count}{100 * frac:.0f}% {now - t['start']:.0f}s {extra}".rstrip()
                              + "\n")
            self.stream.flush()


def _is_terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


@contextlib.contextmanager
def stage_progress(enabled: bool, make_rich: Callable[[], Any]) -> Iterator[Any]:
    """``make_rich()`` (a rich Progress) on a terminal, a :class:`LineProgress` otherwise, None when disabled."""
    if not enabled:
        yield None
    elif not _is_terminal():
        yield LineProgress()
    else:
        with make_rich() as bar:
            yield bar


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Any]:
    def rich_bar() -> Any:
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False)

    with stage_progress(enabled, rich_bar) as bar:
        yield bar


SUMMARY_KEYS = ("acc@t1", "acc@t2", "delta", "correction_rate", "regression_rate", "acc_oracle_gated",
                "feedback_effect", "feedback_sensitivity", "leakage_rate", "step", "gen_tokens", "trained_tokens",
                "flops", "wall_s")


def print_summary(final: dict[str, Any], run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"final evaluation — {run_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in SUMMARY_KEYS:
        if final.get(key) is None:
            continue
        v = final[key]
        table.add_row(key, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console(stderr=True).print(table)
