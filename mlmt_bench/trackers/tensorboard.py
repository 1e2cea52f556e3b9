"""TensorBoard: event files written by torch's ``SummaryWriter``, one per axis.

``<run dir>/tensorboard/{step,tokens,flops}/`` each hold the same scalar tags, named as in every
tracker (``train/reward_mean``, ``eval/acc_at_t2``, TRL's ``train/reward`` ...:
:mod:`mlmt_bench.trackers.names`), as ordinary scalar summaries (float32, as TensorBoard stores
scalars, so that ``tensorboard --inspect``, its scalars dashboard and
``EventAccumulator(...).Tags()["scalars"]`` list them; ``metrics.jsonl`` keeps the exact values),
with the trainer's step, the generated tokens or the FLOPs (as an integer) as TensorBoard's step,
so ``tensorboard --logdir <output_dir>`` draws every metric against each axis (filter runs by
``/step$``, ``/tokens$`` or ``/flops$``). The resolved spec and the run's tags are a text summary
(``spec``). A resumed run purges, on each axis, the events after the checkpoint it continues from
(``purge_step``: TensorBoard's readers drop them), so a redone step is not drawn twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from mlmt_bench.trackers import Axes, NoOptions, RunInfo, Tracker

AXES = ("step", "tokens", "flops")


class TensorBoardOptions(NoOptions):
    log_dir: str | None = Field(None, description="where the event files go; default <run dir>/tensorboard "
                                "(a relative path is relative to the run directory)")
    flush_secs: int = Field(30, ge=1, description="seconds between flushes of the event files")


def axis_value(axes: Axes, axis: str) -> int:
    """A record's TensorBoard step on ``axis`` (step, tokens, flops; FLOPs rounded down to an int)."""
    return axes.step if axis == "step" else axes.gen_tokens if axis == "tokens" else int(axes.flops)


class TensorBoardTracker(Tracker):
    Options = TensorBoardOptions
    package = "tensorboard"

    def __init__(self, options: TensorBoardOptions, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        root = Path(options.log_dir) if options.log_dir else Path("tensorboard")
        self.log_dir = root if root.is_absolute() else run.run_dir / root
        # Each writer starts with a session start at purge_step: TensorBoard drops the events at or after
        # it of the sessions before; a run's first session purges nothing (0), a resumed one the events
        # after its checkpoint, on each axis in its own unit.
        purge = {a: axis_value(run.resume, a) + 1 if run.resume is not None else 0 for a in AXES}
        self.writers = {a: SummaryWriter(str(self.log_dir / a), purge_step=purge[a], flush_secs=options.flush_secs)
                        for a in AXES}
        if run.resume is None:
            text = yaml.safe_dump({"tags": run.tags, "group": run.group.name if run.group else None,
                                   "spec": run.config}, sort_keys=False)
            self.writers["step"].add_text("spec", "```\n" + text + "\n```", global_step=0)

    def state(self) -> dict[str, Any]:
        return {"log_dir": str(self.log_dir)}

    def log(self, metrics: dict[str, float], axes: Axes) -> None:
        for axis, writer in self.writers.items():
            at = axis_value(axes, axis)
            for key, value in metrics.items():
                writer.add_scalar(key, value, global_step=at)  # a scalar summary (simple_value, float32)

    def close(self, status: str) -> None:
        for writer in self.writers.values():
            writer.close()
