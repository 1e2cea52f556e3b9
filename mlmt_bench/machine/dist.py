"""Data parallelism for the shared trainer, through ``accelerate launch`` (DDP semantics).

Each process generates the rollouts of its share of a step's problems (whole groups, so
group-relative advantages stay local), computes its gradient with the *global* loss
normalisation, and the gradients are summed across processes before every optimiser step, so
all replicas hold identical weights. One process (rank 0) evaluates and writes the run
directory. With a single process every method is a no-op.
"""

from __future__ import annotations

import os
from typing import Any

import torch


class Dist:
    """Collectives used by the trainer; ``world == 1`` makes them all no-ops.

    ``from_env``: join the processes ``accelerate launch`` started (``WORLD_SIZE`` > 1); False: one
    process whatever the environment (what a caller that hands no Dist gets). A run builds one Dist
    and hands it to everything that communicates (``runner.make_trainer``)."""

    def __init__(self, *, from_env: bool = True) -> None:
        self.rank, self.world = 0, 1
        self._dist = None
        self.device = torch.device("cpu")
        if from_env and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            state = PartialState(cpu=not torch.cuda.is_available())
            self.rank, self.world = state.process_index, state.num_processes
            self.device = state.device  # NCCL reduces only tensors on the process's GPU
            import torch.distributed as dist

            self._dist = dist

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def shard(self, items: list[Any]) -> list[Any]:
        """This process's share of ``items`` (strided)."""
        return items[self.rank::self.world]

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        assert self._dist is not None  # enabled: set in __init__
        self._dist.all_reduce(t)
        return float(t)

    def max(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        assert self._dist is not None  # enabled: set in __init__
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return float(t)

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world

    def mean_each(self, values: dict[str, float | None]) -> dict[str, float]:
        """The mean over processes of each statistic, over the processes that have it (not None).

        Processes need not report the same keys (one process's groups may all be flat, so that a
        statistic of its critic groups is missing there); a collective per key in each process's
        own order would then pair different statistics and hang. The keys are gathered first and
        reduced in one tensor in sorted order; the result keeps this process's order, then the
        keys only others had (sorted)."""
        present = {k: float(v) for k, v in values.items() if v is not None}
        if not self.enabled:
            return present
        assert self._dist is not None  # enabled: set in __init__
        gathered: list[Any] = [None] * self.world
        self._dist.all_gather_object(gathered, sorted(present))
        keys = sorted(set().union(*gathered))
        t = torch.tensor([[present.get(k, 0.0), 1.0 if k in present else 0.0] for k in keys],
                         dtype=torch.float64, device=self.device).reshape(len(keys), 2)
        self._dist.all_reduce(t)
        means = {k: float(total / count) for k, (total, count) in zip(keys, t.tolist()) if count > 0}
        return {**{k: means[k] for k in present}, **{k: means[k] for k in keys if k not in present}}

    def cat_rows(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """Every process's ``rows`` concatenated along dim 0 in rank order (None: this process has
        none; None when no process has any), on this process's device. One process: ``rows``."""
        if not self.enabled:
            return rows
        assert self._dist is not None  # enabled: set in __init__
        gathered: list[Any] = [None] * self.world
        self._dist.all_gather_object(gathered, rows.detach().cpu() if rows is not None else None)
        parts = [g for g in gathered if g is not None]
        if not parts:
            return None
        return torch.cat(parts).to(rows.device if rows is not None else self.device)

    def any(self, flag: bool) -> bool:
        return self.sum(1.0 if flag else 0.0) > 0

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over processes (a parameter without a gradient contributes zeros); FSDP's
        sharded parameters (DTensors, mlmt_bench/fsdp.py) were summed by its reduce-scatter."""
        if not self.enabled:
            return
        assert self._dist is not None  # enabled: set in __init__
        for p in _replicated(params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._dist.all_reduce(p.grad)

    def replica_spread(self, params: list[torch.nn.Parameter]) -> float:
        """max − min over processes of a weight checksum: 0.0 when every replica holds the same weights
        (FSDP's sharded parameters are not replicas and are left out)."""
        if not self.enabled:
            return 0.0
        checksum = torch.tensor([sum(float(p.detach().double().sum()) for p in _replicated(params))],
                                dtype=torch.float64, device=self.device)
        hi, lo = checksum.clone(), checksum.clone()
        assert self._dist is not None  # enabled: set in __init__
        self._dist.all_reduce(hi, op=self._dist.ReduceOp.MAX)
        self._dist.all_reduce(lo, op=self._dist.ReduceOp.MIN)
        return float(hi - lo)

    def broadcast(self, obj: Any) -> Any:
        if not self.enabled:
            return obj
        box = [obj]
        assert self._dist is not None  # enabled: set in __init__
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            assert self._dist is not None  # enabled: set in __init__
            self._dist.barrier()


def _replicated(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters every process holds whole (not an FSDP shard)."""
    from torch.distributed.tensor import DTensor

    return [p for p in params if not isinstance(p, DTensor)]


class NullRunDir:
    """What non-main processes write to: nothing."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def metrics(self) -> list[dict[str, Any]]:
        return []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None
