"""Progress bars with ETA and the end-of-run summary table (rich), silent when disabled."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False) as bar:
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
