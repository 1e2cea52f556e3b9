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
                           "start": time.monotonic(), "last": 0.0, "decile": -1, "first": completed}
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
            elapsed = now - t["start"]
            done = t["completed"] - t["first"]  # since this process started (a resumed run starts part way)
            eta = f" ETA {duration(elapsed * (t['total'] - t['completed']) / done)}" if done > 0 and frac < 1 else ""
            self.announce(f"{t['description']}: {count}{100 * frac:.0f}% {elapsed:.0f}s{eta} {extra}".rstrip())

    def announce(self, text: str) -> None:
        """One line, now (a phase that starts or ends)."""
        self.stream.write(text + "\n")
        self.stream.flush()


def duration(seconds: float) -> str:
    """``42 s``, ``6 min 30 s``, ``2 h 05 min``: a wall time or an ETA for a person to read."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def announce(bar: Any, text: str) -> None:
    """Print ``text`` as its own line beside a progress bar: above a rich bar, as a line of a
    :class:`LineProgress` log; nothing without a bar, or with a stand-in that only counts steps
    (a sweep's). Never wrapped mid-word into the next line of a log: rich's soft wrap keeps a path
    whole."""
    if bar is None:
        return
    if isinstance(bar, LineProgress):
        bar.announce(text)
    elif getattr(bar, "console", None) is not None:
        bar.console.print(text, soft_wrap=True, markup=False, highlight=False)


_PLAIN = {"lines": False}


def plain_lines() -> None:
    """From now on this process shows progress as plain lines even on a terminal (a worker
    process beside others writing to the same terminal: a live bar would garble their lines)."""
    _PLAIN["lines"] = True


def _is_terminal() -> bool:
    return not _PLAIN["lines"] and bool(getattr(sys.stderr, "isatty", lambda: False)())


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
    rows = [[key, f"{final[key]:.4g}" if isinstance(final[key], float) else str(final[key])]
            for key in SUMMARY_KEYS if final.get(key) is not None]
    print_table("final evaluation", ["metric", "value"], rows, [f"run directory: {run_dir}"])


def print_table(title: str, header: list[str], rows: list[list[str]], lines: list[str]) -> None:
    """A small table on stderr (every column but the first right-aligned), then ``lines``.
    A cell is never wrapped and a line (a path) is never wrapped mid-word, on a terminal or in a
    log: a log is 80 columns wide to rich, and a run path is longer."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(stderr=True)
    if not console.is_terminal:  # a log: as wide as the table, nothing cut
        console = Console(stderr=True, width=max(console.width, table_width(header, rows)))
    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(escape(c) for c in row))
    console.print(table)
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def table_width(header: list[str], rows: list[list[str]]) -> int:
    """The width a rich table of these cells needs: the widest cell of each column, its padding
    (2) and borders (1 per column, plus 1)."""
    return sum(max(len(c) for c in col) + 3 for col in zip(header, *rows)) + 1
