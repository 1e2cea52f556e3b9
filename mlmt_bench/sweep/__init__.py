"""Sweeps: an Optuna study over the fields of a run spec (``mlmt-bench sweep SWEEP.yaml``).

A sweep file (:class:`mlmt_bench.spec.SweepSpec`) names a run spec and a search space::

    name: quickstart-mlmt-sweep
    run: ../registry/runs/quickstart-mlmt.yaml     # relative to the sweep file
    metric: acc@t2                                 # any key of the eval records
    direction: maximize
    n_trials: 20                                   # complete + pruned trials, in total
    sampler: tpe                                   # tpe | random | grid
    pruner: median                                 # median | none
    space:
      algorithm.params.lam: {type: float, low: 0.0, high: 1.0}
      policies.solver.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
      train.problems_per_step: {type: int, low: 4, high: 16, step: 4}
      algorithm.params.value: {type: categorical, choices: [mc, learned]}

Everything is checked before the first trial: the sweep's fields, every ``space`` path (it must
name a field of :class:`RunSpec`), every distribution, the size of a grid (``MAX_GRID_POINTS``
values per parameter, ``MAX_GRID_SIZE`` points in all, counted without building it), and the run
spec with each distribution's end points applied. Errors are one-line :class:`UserError` naming
the sweep file.

Layout, with ``<dir> = <run spec's output_dir>/<sweep name>``::

    <dir>/<name>.db              the Optuna study (SQLite, unless --storage names another)
    <dir>/<study>-best.yaml      the run spec with the best parameters applied (atomic rewrite)
    <dir>/trials/<study>-t<N>-<stamp>/   one run directory per trial (manifest: sweep, trial, pid)
    <dir>/logs/<study>-w<K>.log  what worker process K printed (``--workers N`` > 1 only)

Each trial applies its sampled values to the run spec (``--set`` semantics), runs it with
:func:`mlmt_bench.runner.run`, reports ``record[metric]`` at ``record["step"]`` after every
evaluation and is pruned (run status ``pruned``) when the pruner says so. A trial that raises is
recorded as failed and the study goes on (three failures in a row stop it); a :class:`UserError`
stops the sweep. The storage is transactional and the study is loaded if it exists, so running
the same command again resumes: only the missing complete + pruned trials are run.

Several workers share one study: ``--workers N`` starts N worker processes on this machine
(:mod:`mlmt_bench.sweep.workers`), and with a PostgreSQL storage (``pip install
'mlmt-bench[postgres]'``) several machines can run the same command at once (SQLite is for one
machine: it is switched to write-ahead logging and waits for locks). Each worker runs
:func:`work`: it starts a trial while complete + pruned + running trials are fewer than
``n_trials``, and otherwise waits until the study is done. Two workers can still start the
study's last trial at one moment (each read the counts before the other wrote): the one with the
higher trial number ends it at once, before it samples, as a *surplus* trial (:func:`is_surplus`:
failed in Optuna's storage, left out of summaries and reports), so a study never overshoots.
A running trial writes a heartbeat every ``heartbeat_s`` seconds; one without a heartbeat for ``GRACE_FACTOR`` times
that long belongs to a dead process: it is marked failed (and its run directory's manifest
too), and its parameters are tried once more as a new trial.

Optuna is imported inside the functions, so ``import mlmt_bench`` stays light.

The package: :mod:`~mlmt_bench.sweep.space` (distributions), :mod:`~mlmt_bench.sweep.sweep_file`
(reading a sweep, trial specs), :mod:`~mlmt_bench.sweep.storage` (Optuna storages, samplers,
pruners), :mod:`~mlmt_bench.sweep.study` (running trials, summaries), and the worker processes:
:mod:`~mlmt_bench.sweep.workers` (the supervisor), :mod:`~mlmt_bench.sweep.worker` (one worker)
and :mod:`~mlmt_bench.sweep.display` (progress).
"""

from __future__ import annotations

from mlmt_bench.sweep.space import SearchDistribution, parse_dist
from mlmt_bench.sweep.storage import (
    RetryDeadTrial,
    default_storage,
    grid_size,
    is_surplus,
    make_pruner,
    make_sampler,
    open_storage,
    quiet_optuna,
    redact,
    sqlite_path,
)
from mlmt_bench.sweep.study import SweepPruned, run_sweep, summarize, work, write_best
from mlmt_bench.sweep.sweep_file import Sweep, best_spec, load_sweep, set_path, trial_spec

__all__ = ["RetryDeadTrial", "SearchDistribution", "Sweep", "SweepPruned", "best_spec", "default_storage",
           "grid_size", "is_surplus", "load_sweep", "make_pruner", "make_sampler", "open_storage", "parse_dist",
           "quiet_optuna", "redact", "run_sweep", "set_path", "sqlite_path", "summarize", "trial_spec", "work",
           "write_best"]
