"""Weights & Biases: a W&B run per mlmt-bench run, offline unless the spec says otherwise.

Offline (the default, ``mode: offline``) the run is written under ``<run dir>/wandb/`` and sent
later with ``wandb sync <run dir>/wandb/offline-run-*``; ``mode: online`` logs as it goes (it
needs ``wandb login`` or ``WANDB_API_KEY``). The run's config is the resolved spec, its name the run
directory's; the runs of an experiment or a sweep share a group named after its directory, with
the arm as job type and tags ``arm=...``, ``seed=...`` (or ``trial=...``). Every record's
numeric fields are logged at its step (``train/gen_tokens`` and ``train/flops`` among them, from the
step-0 evaluation on: choose either as the x-axis), under the names every tracker uses
(:mod:`mlmt_bench.trackers.names`: ``eval/acc_at_t2``, TRL's ``train/reward`` ...). System metrics,
code and git state are not collected. A resumed run continues the same W&B run id (``resume: allow``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mlmt_bench.trackers import Axes, NoOptions, RunInfo, Tracker


class WandbOptions(NoOptions):
    project: str = Field("mlmt-bench", min_length=1)
    entity: str | None = Field(None, description="W&B user or team; default the account's")
    mode: Literal["offline", "online", "disabled"] = Field("offline", description="offline: files only, sent "
                                                           "later by `wandb sync`")
    dir: str | None = Field(None, description="where W&B writes; default the run directory")


class WandbTracker(Tracker):
    Options = WandbOptions
    package = "wandb"

    def __init__(self, options: WandbOptions, run: RunInfo) -> None:
        import wandb

        where = Path(options.dir) if options.dir else run.run_dir
        settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False,
                                  x_disable_stats=True, x_disable_meta=True, x_save_requirements=False)
        run_id = run.state.get("id")
        self.run = wandb.init(
            project=options.project, entity=options.entity, mode=options.mode, dir=str(where),
            name=run.name, group=run.group.name if run.group is not None else None,
            job_type=run.tags.get("arm") or ("trial" if "trial" in run.tags else "run"),
            tags=[f"{k}={v}"[:64] for k, v in run.tags.items()], config={**run.config, "mlmt_bench": run.tags},
            id=run_id, resume="allow" if run_id else None, reinit="create_new", settings=settings)

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "dir": str(self.run.dir)}

    def log(self, metrics: dict[str, float], axes: Axes) -> None:
        self.run.log(metrics, step=axes.step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status in ("completed", "pruned") else 1)
