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
(:mod:`mlmt_bench.sweep_workers`), and with a PostgreSQL storage (``pip install
'mlmt-bench[postgres]'``) several machines can run the same command at once (SQLite is for one
machine: it is switched to write-ahead logging and waits for locks). Each worker runs
:func:`work`: it starts a trial while complete + pruned + running trials are fewer than
``n_trials`` (so the study does not overshoot, except by a trial when two workers start one at
the same moment), and otherwise waits until the study is done. A running trial writes a
heartbeat every ``heartbeat_s`` seconds; one without a heartbeat for ``GRACE_FACTOR`` times
that long belongs to a dead process: it is marked failed (and its run directory's manifest
too), and its parameters are tried once more as a new trial.

Optuna is imported inside the functions, so ``import mlmt_bench`` stays light.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, ValidationError

from mlmt_bench.bounded_input import short_repr, shorten
from mlmt_bench.errors import UserError
from mlmt_bench.spec import (
    RunSpec,
    SweepSpec,
    _Spec,
    apply_overrides,
    dump_yaml,
    format_validation_error,
    is_experiment,
    load_raw,
    load_validated,
    parse_override,
    validate_run,
)
from mlmt_bench.sweep_workers import GRACE_FACTOR, MAX_CONSECUTIVE_FAILURES

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["Sweep", "SweepPruned", "load_sweep", "run_sweep", "work", "trial_spec", "best_spec", "default_storage",
           "open_storage"]

HEARTBEAT_S = 60  # a running trial writes a heartbeat this often (default of --heartbeat) ...
SQLITE_LOCK_TIMEOUT_S = 60  # how long a SQLite writer waits for another worker's lock
WAIT_POLL_S = 5  # a worker waiting for the study's last trials looks again this often (at most)
MAX_GRID_POINTS = 10_000  # values of one parameter on a grid (the grid is built in memory)
# Points of the whole grid (the product of every parameter's values): Optuna's GridSampler builds
# them all as tuples in every worker (~100 bytes each: 10 MB here; 10^12 points were 3.4 GB and a
# MemoryError), and a sweep of RL runs never gets through more than ~10^4 trials.
MAX_GRID_SIZE = 100_000

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # RunSpec.name: trial runs are named <study>-t<N>


# ----------------------------------------------------------------------------------------------
# Search space


class FloatDist(_Spec):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0.0, description="discretisation step (needed by the grid sampler)")


class IntDist(_Spec):
    type: Literal["int"]
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False


class CategoricalDist(_Spec):
    type: Literal["categorical"]
    choices: list[Any] = Field(min_length=1)


SearchDistribution = FloatDist | IntDist | CategoricalDist
_DISTS: dict[str, type[SearchDistribution]] = {"float": FloatDist, "int": IntDist, "categorical": CategoricalDist}


def parse_dist(raw: Any, source: str, key: str) -> SearchDistribution:
    """The distribution of ``space[key]`` in the sweep file ``source``."""
    where = f"{source}: space.{shorten(key)}"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping like {{type: float, low: 0, high: 1}}, got {short_repr(raw)}")
    kind = raw.get("type")
    if kind is None:
        raise UserError(f"{where}: missing `type` (one of: {', '.join(_DISTS)})")
    if kind not in _DISTS:
        raise UserError(f"{where}.type: must be one of {', '.join(repr(k) for k in _DISTS)}, got {short_repr(kind)}")
    model = _DISTS[kind]
    try:
        dist = model.model_validate(raw)
    except ValidationError as exc:
        raise UserError(format_validation_error(source, exc, f"space.{key}", model)) from None
    if isinstance(dist, CategoricalDist):
        for c in dist.choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise UserError(f"{where}.choices: each choice must be a string, number, bool or null, "
                                f"got {short_repr(c)}")
        return dist
    if not dist.low < dist.high:
        raise UserError(f"{where}: low must be < high, got low={short_repr(dist.low)}, high={short_repr(dist.high)}")
    if dist.log and dist.low <= 0:
        raise UserError(f"{where}: log: true needs low > 0, got low={short_repr(dist.low)}")
    if dist.log and (isinstance(dist, FloatDist) and dist.step is not None
                     or isinstance(dist, IntDist) and dist.step != 1):
        raise UserError(f"{where}: log: true and step cannot be used together")
    if isinstance(dist, FloatDist) and not (math.isfinite(dist.low) and math.isfinite(dist.high)):
        raise UserError(f"{where}: low and high must be finite, got low={dist.low!r}, high={dist.high!r}")
    return dist


def end_points(dist: SearchDistribution) -> list[Any]:
    """The values a validation probe tries: the bounds, or every choice."""
    if isinstance(dist, CategoricalDist):
        return list(dist.choices)
    return [dist.low, dist.high]


def grid_count(dist: SearchDistribution, where: str) -> int:
    """How many values ``dist`` has on the grid, computed without listing them; UserError past
    ``MAX_GRID_POINTS`` or for a float without a ``step``."""
    n: float  # an int but for math.inf
    if isinstance(dist, CategoricalDist):
        n = len(dist.choices) - 1
    elif isinstance(dist, IntDist):
        n = (dist.high - dist.low) // dist.step
    elif dist.step is None:
        raise UserError(f"{where}: the grid sampler needs a `step` for float parameters")
    else:
        ratio = (dist.high - dist.low) / dist.step
        n = math.floor(ratio + 1e-9) if math.isfinite(ratio) else math.inf
    if n + 1 > MAX_GRID_POINTS:
        raise UserError(f"{where}: more than {MAX_GRID_POINTS} grid values; use a larger step or another sampler")
    return int(n) + 1


def check_grid_size(space: dict[str, SearchDistribution], where: str) -> int:
    """The number of points of the grid over ``space`` (the product of the parameters' counts,
    computed, never built); UserError past ``MAX_GRID_SIZE``."""
    total = 1
    for key, dist in space.items():
        total *= grid_count(dist, f"{where}: space.{shorten(key)}")
        if total > MAX_GRID_SIZE:  # stop multiplying: the product of 50,000 counts is no small number
            raise UserError(f"{where}: space: the grid has more than {MAX_GRID_SIZE:,} points (the product of "
                            "every parameter's values); use larger steps, fewer parameters or another sampler")
    return total


def grid_values(dist: SearchDistribution, where: str) -> list[Any]:
    n = grid_count(dist, where) - 1
    if isinstance(dist, CategoricalDist):
        return list(dist.choices)
    if isinstance(dist, IntDist):
        return list(range(dist.low, dist.high + 1, dist.step))
    assert dist.step is not None  # grid_count refused a float without one
    return [round(dist.low + i * dist.step, 12) for i in range(n + 1)]


def suggest(trial: optuna.Trial, path: str, dist: SearchDistribution) -> Any:
    if isinstance(dist, FloatDist):
        return trial.suggest_float(path, dist.low, dist.high, log=dist.log, step=dist.step)
    if isinstance(dist, IntDist):
        return trial.suggest_int(path, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_categorical(path, dist.choices)


# ----------------------------------------------------------------------------------------------
# Loading and checking a sweep


@dataclass
class Sweep:
    path: Path  # the sweep file
    spec: SweepSpec
    run_path: Path  # the run spec it tunes
    run_raw: dict[str, Any]  # that spec, extends resolved, --set overrides applied
    space: dict[str, SearchDistribution]
    output_dir: Path  # <run output_dir>/<sweep name>
    overrides: list[str]  # --set, already in run_raw

    @property
    def trials_dir(self) -> Path:
        return self.output_dir / "trials"


def set_path(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``data`` with ``path`` (dotted) set to ``value``, exactly as ``--set path=value`` would."""
    out = copy.deepcopy(data)
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = copy.deepcopy(value)
    return out


def _check_space_path(sweep_path: Path, path: str) -> None:
    """A path that names no field of RunSpec is an error (spec.py's ``--set`` check)."""
    text = f"{path}=0"
    try:
        apply_overrides({}, [text], RunSpec)
    except UserError as exc:
        msg = str(exc).removeprefix(f"--set {shorten(text)}: ")
        raise UserError(f"{sweep_path}: space.{shorten(path)}: {msg}") from None


def load_sweep(path: Path | str, overrides: list[str] | None = None, study_name: str | None = None) -> Sweep:
    """Read and check a sweep file up front; ``overrides`` (``--set``) apply to its run spec."""
    path = Path(path)
    spec = load_validated(path, SweepSpec)
    for name, what in ((spec.name, "name"), (study_name, "--study")):
        if name is not None and not _NAME.match(name):
            raise UserError(f"{path}: {what}: must match {_NAME.pattern} (it names run directories), "
                            f"got {short_repr(name)}")
    run_path = path.parent / spec.run
    if not run_path.is_file():
        raise UserError(f"{path}: run: file not found: {shorten(str(run_path), 200)}")
    run_raw = load_raw(run_path)
    if is_experiment(run_raw):
        raise UserError(f"{path}: run: {run_path} is an experiment spec (arms:); a sweep tunes a run spec")
    run_raw = apply_overrides(run_raw, overrides or [], RunSpec)

    space: dict[str, SearchDistribution] = {}
    for key, raw in spec.space.items():
        _check_space_path(path, key)
        space[key] = parse_dist(raw, str(path), key)
    if spec.sampler == "grid":
        check_grid_size(space, str(path))
    _check_overrides(overrides or [], space)

    output_dir = Path(str(run_raw.get("output_dir") or "runs")) / spec.name
    sweep = Sweep(path, spec, run_path, run_raw, space, output_dir, list(overrides or []))
    # The run spec alone, then with each distribution's end points (others at their first value).
    study = study_name or spec.name
    first = {k: end_points(d)[0] for k, d in space.items()}
    validate_run(_trial_data(sweep, {}, study, 0), str(run_path))
    for key, dist in space.items():
        for value in end_points(dist):
            params = {**first, key: value}
            validate_run(_trial_data(sweep, params, study, 0),
                         f"{path}: space.{shorten(key)}={short_repr(value)} applied to {run_path}")
    return sweep


def _check_overrides(overrides: list[str], space: dict[str, SearchDistribution]) -> None:
    """A ``--set`` that every trial would undo is an error: the name (trials are named
    <study>-t<N>) and a path at or inside a searched parameter."""
    for text in overrides:
        parts = parse_override(text)[0]
        if parts == ["name"]:
            raise UserError(f"--set {shorten(text)}: a sweep names its trials <study>-t<N>; use --study NAME")
        for key in space:
            if parts[:len(key.split("."))] == key.split("."):
                raise UserError(f"--set {shorten(text)}: space.{shorten(key)} is searched, so every trial sets it; "
                                "drop it from the space or from --set")


def _trial_data(sweep: Sweep, params: dict[str, Any], study: str, number: int) -> dict[str, Any]:
    """A trial's run spec: evaluated on the sweep's tuning split (``validation``: METHOD.md v2 keeps
    ``test`` for reports), ``params`` applied, named ``<study>-t<number>``, in trials/."""
    data = copy.deepcopy(sweep.run_raw)
    for key, value in params.items():
        data = set_path(data, key, value)
    data = set_path(data, "benchmark.eval_split", sweep.spec.eval_split)
    data["name"] = f"{study}-t{number}"
    data["output_dir"] = str(sweep.trials_dir)
    return data


def trial_spec(sweep: Sweep, params: dict[str, Any], study: str, number: int) -> RunSpec:
    """The run spec of trial ``number``: ``params`` applied, named ``<study>-t<number>``, in trials/."""
    return validate_run(_trial_data(sweep, params, study, number), f"{sweep.path}: trial {number}")


def best_spec(sweep: Sweep, params: dict[str, Any], study: str) -> RunSpec:
    """The run spec with ``params`` applied, named ``<study>-best``, in the run spec's output dir."""
    data = copy.deepcopy(sweep.run_raw)
    for key, value in params.items():
        data = set_path(data, key, value)
    data["name"] = f"{study}-best"
    return validate_run(data, f"{sweep.path}: best parameters applied to {sweep.run_path}")


# ----------------------------------------------------------------------------------------------
# Storage


def default_storage(sweep: Sweep) -> str:
    return "sqlite:///" + str((sweep.output_dir / f"{sweep.spec.name}.db").resolve())


def redact(url: str) -> str:
    """The storage URL without its password (it is printed and stored in results)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///FILE`` URL; None for other databases and in-memory ones."""
    if not url.startswith("sqlite:///"):
        return None
    db = url.removeprefix("sqlite:///")
    return None if db in ("", ":memory:") else Path(db)


def use_wal(db: Path) -> None:
    """Switch the SQLite database ``db`` (created if missing) to write-ahead logging, which stays
    set in the file: readers then never block the writer, so several worker processes on this
    machine can share it. WAL needs a local disk (not NFS), as SQLite itself does here."""
    import sqlite3

    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=SQLITE_LOCK_TIMEOUT_S)) as con:
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:
        raise UserError(f"storage sqlite:///{db}: cannot open: {exc}") from None


def open_storage(url: str, heartbeat_s: int | None = None,
                 on_stale: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
                 ) -> optuna.storages.BaseStorage:
    """The Optuna storage at ``url``.

    With ``heartbeat_s``, a running trial records a heartbeat every ``heartbeat_s`` seconds, and
    one without a heartbeat for ``GRACE_FACTOR * heartbeat_s`` seconds is marked failed (by any
    worker, before it starts a trial) and passed to ``on_stale``. A SQLite writer waits up to
    ``SQLITE_LOCK_TIMEOUT_S`` for another process's lock instead of failing at once.
    """
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    engine_kwargs: dict[str, Any] = {}
    db = sqlite_path(url)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": SQLITE_LOCK_TIMEOUT_S}
    heartbeat: dict[str, Any] = {}
    if heartbeat_s is not None:
        heartbeat = {"heartbeat_interval": heartbeat_s, "grace_period": GRACE_FACTOR * heartbeat_s,
                     "heartbeat_stale_trial_callback": on_stale}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
        except ImportError:
            if url.startswith("postgres"):
                raise UserError(f"storage {redact(url)}: the PostgreSQL driver (psycopg2) is not installed; "
                                "install the `postgres` extra: pip install 'mlmt-bench[postgres]'") from None
            dialect = url.split(":", 1)[0]
            raise UserError(f"storage {redact(url)}: the database driver for {dialect!r} is not installed") from None
        except SQLAlchemyError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"storage {redact(url)}: cannot open: {first}") from None
        except ValueError as exc:  # e.g. a storage written by a newer Optuna
            raise UserError(f"storage {redact(url)}: {str(exc).splitlines()[0]}") from None


class RetryDeadTrial:
    """The storage's stale-trial callback: a trial whose process died (Optuna has just marked it
    failed) is tried once more with the same parameters as a new trial (Optuna's
    ``RetryHeartbeatStaleTrialCallback``, ``max_retry=1``), and its run directory, when this
    machine can see it, is marked failed instead of staying ``running`` forever."""

    def __init__(self, sweep: Sweep) -> None:
        import optuna

        self.sweep = sweep
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        from mlmt_bench.tracking import RunDir, utc_now

        self.retry(study, trial)
        found = _find_run_dir(self.sweep, study.study_name, trial.number)
        if found is None:
            return
        run_dir = RunDir(Path(found))
        with contextlib.suppress(UserError, OSError):
            if run_dir.manifest().get("status") == "running":
                run_dir.update_manifest(status="failed", end_time=utc_now(),
                                        error="its process stopped sending heartbeats (killed?)")


def make_sampler(kind: str, sweep: Sweep, seed: int | None) -> optuna.samplers.BaseSampler:
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        check_grid_size(sweep.space, str(sweep.path))
        grid = {k: grid_values(d, f"{sweep.path}: space.{k}") for k, d in sweep.space.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant_liar: workers on other machines do not all sample the same point
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def worker_seed(seed: int | None, n_trials_so_far: int, worker: int) -> int | None:
    """The sampler seed of worker ``worker``: distinct per worker (else two random samplers draw the
    same points), and past the trials so far, so a resumed study draws new points."""
    return None if seed is None else seed + n_trials_so_far + 100_003 * worker


def make_pruner(kind: str) -> optuna.pruners.BasePruner:
    import optuna

    if kind == "none":
        return optuna.pruners.NopPruner()
    # warmup 1: the step-0 evaluation (before any update) says nothing about the parameters
    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)


def grid_size(sweep: Sweep) -> int:
    return check_grid_size(sweep.space, str(sweep.path))


# ----------------------------------------------------------------------------------------------
# Running

# A worker reports what it does as events, dicts with an "event" key (the progress display reads
# them; mlmt_bench.sweep_workers sends them from worker processes as JSON lines):
#   {"event": "start", "trial": N, "steps": S, "params": {...}, "retry_of": M | None}
#   {"event": "step", "trial": N, "step": s, "steps": S}           at most STEP_EVENTS_PER_S a second
#   {"event": "eval", "trial": N, "step": s, "value": metric}
#   {"event": "end", "trial": N, "state": "complete"|"pruned"|"fail", "value": v, "step": s, "error": e}
#   {"event": "wait", "trials": [N, ...]}                           the study's last trials run elsewhere
Emit = Callable[[dict[str, Any]], None]
STEP_EVENTS_PER_S = 4


class SweepPruned(Exception):
    """Raised from the eval callback to stop a trial's run; the run directory's status becomes ``pruned``."""

    run_status = "pruned"


class _TrialFailed(Exception):
    """A trial's run raised: recorded as failed, the study goes on."""


class _StepEvents:
    """Stands in for the trainer's progress bar (``add_task`` / ``update``) and emits ``step`` events."""

    def __init__(self, trial: int, emit: Emit) -> None:
        self.trial, self.emit, self.total, self.last = trial, emit, 0, -math.inf

    def add_task(self, description: str, total: int | None = None, completed: int = 0, **_: Any) -> int:
        self.total = int(total or 0)
        self._send(completed, force=True)
        return 0

    def update(self, task: int, completed: int | None = None, **_: Any) -> None:
        if completed is not None:
            self._send(completed, force=completed >= self.total)

    def _send(self, step: int, force: bool) -> None:
        now = time.monotonic()
        if force or now - self.last >= 1 / STEP_EVENTS_PER_S:
            self.last = now
            self.emit({"event": "step", "trial": self.trial, "step": int(step), "steps": self.total})


def _find_run_dir(sweep: Sweep, study: str, number: int) -> str | None:
    """The run directory of a trial that raised (runner.run returned none): newest matching manifest."""
    found = []
    for manifest in sweep.trials_dir.glob(f"{study}-t{number}-*/manifest.json"):
        try:
            m = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if m.get("sweep") == study and m.get("trial") == number:
            found.append((m.get("start_time") or "", str(manifest.parent)))
    return max(found)[1] if found else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def quiet_optuna(level: str = "ERROR") -> Iterator[None]:
    """Optuna's log lines below ``level`` off (the sweep's display reports trials; at WARNING, a
    failed trial's traceback, which a worker's log keeps) and its experimental-API warnings
    (heartbeats, fail_stale_trials) silenced."""
    import optuna

    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(getattr(optuna.logging, level))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(old)


def run_sweep(path: Path | str, *, n_trials: int | None = None, storage: str | None = None,
              study_name: str | None = None, seed: int | None = None, overrides: list[str] | None = None,
              progress: bool = True, workers: int = 1, heartbeat_s: int | None = None) -> dict[str, Any]:
    """Create or resume the study and run trials until ``n_trials`` are complete or pruned.

    ``workers`` > 1 runs them in that many worker processes (:mod:`mlmt_bench.sweep_workers`);
    ``heartbeat_s``: seconds between a running trial's heartbeats (default ``HEARTBEAT_S``);
    ``progress`` shows each trial's progress on stderr (:mod:`mlmt_bench.sweep_display`).
    Returns :func:`summarize`'s dict; ``stopped`` is set when the sweep gave up on failures.
    """
    import optuna

    from mlmt_bench.sweep_display import SweepDisplay

    if workers < 1:
        raise UserError(f"--workers must be ≥ 1, got {workers}")
    heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    if heartbeat_s < 1:
        raise UserError(f"--heartbeat must be ≥ 1 second, got {heartbeat_s}")
    sweep = load_sweep(path, overrides, study_name)
    spec = sweep.spec
    study_name = study_name or spec.name
    url = storage or spec.storage or default_storage(sweep)
    target = n_trials if n_trials is not None else spec.n_trials
    if spec.sampler == "grid":
        target = min(target, grid_size(sweep))
    db = sqlite_path(url)
    if workers > 1 and db is not None:
        use_wal(db)

    with quiet_optuna():
        store = open_storage(url, heartbeat_s, RetryDeadTrial(sweep))
        study = optuna.create_study(storage=store, study_name=study_name, direction=spec.direction,
                                    pruner=make_pruner(spec.pruner), load_if_exists=True)
        _check_study(study, sweep, url)
        display = SweepDisplay(study_name, spec.metric, target, done=_count_finished(study), direction=spec.direction,
                               enabled=progress, grace_s=GRACE_FACTOR * heartbeat_s)
        with display:
            if workers == 1:
                stopped = work(study, sweep, target, lambda event: display.handle(0, event), seed=seed, worker=0,
                               heartbeat_s=heartbeat_s)
            else:
                from mlmt_bench.sweep_workers import WorkerArgs, supervise

                overrides = sweep.overrides
                if (sweep.run_raw.get("train") or {}).get("threads") is None:
                    # the workers share this machine's cores (torch would give each all of them)
                    overrides = [*overrides, f"train.threads={max(1, (os.cpu_count() or 1) // workers)}"]
                args = WorkerArgs(str(sweep.path), overrides, study_name, url, target, seed, heartbeat_s)
                stopped = supervise(args, workers, display, sweep.output_dir / "logs")
        result = summarize(study, sweep, study_name, url, target)
    result["stopped"] = stopped
    return result


def _count_finished(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def work(study: optuna.Study, sweep: Sweep, target: int, emit: Emit, *, seed: int | None, worker: int,
         heartbeat_s: int, keep_going: Callable[[], bool] = lambda: True) -> str | None:
    """Worker ``worker``'s loop over ``study``: start a trial while complete + pruned + running
    trials are fewer than ``target``; while the study's last trials run elsewhere, wait (one of
    them may die and come back as a retry); return when ``target`` trials are complete or pruned.

    Returns None, or why the worker gave up (``MAX_CONSECUTIVE_FAILURES`` of its trials failed
    in a row). ``keep_going()`` false (a worker whose parent has gone) ends the loop between trials.
    """
    import optuna
    from optuna.trial import TrialState

    study.sampler = make_sampler(sweep.spec.sampler, sweep, worker_seed(seed, len(study.trials), worker))
    poll_s = min(heartbeat_s, WAIT_POLL_S)
    failures: dict[str, Any] = {"consecutive": 0, "stopped": None}  # "stopped": why the sweep ends, or None

    def objective(trial: optuna.Trial) -> float:
        return _run_trial(trial, sweep, study.study_name, emit)

    def on_trial_end(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
        state = frozen.state.name.lower()
        steps = frozen.intermediate_values
        emit({"event": "end", "trial": frozen.number, "state": state, "value": frozen.value,
              "step": max(steps) if steps else None, "error": frozen.user_attrs.get("error")})
        if frozen.state == TrialState.FAIL:
            failures["consecutive"] += 1
            if failures["consecutive"] >= MAX_CONSECUTIVE_FAILURES:
                failures["stopped"] = (f"{failures['consecutive']} trials in a row failed "
                                       f"(last: {frozen.user_attrs.get('error')}); see the trials' run directories")
        else:
            failures["consecutive"] = 0
        _free_memory()

    waiting_for: list[int] | None = None
    while failures["stopped"] is None and keep_going():
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, its retry queued
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        if done >= target:
            return None
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        queued = any(t.state == TrialState.WAITING for t in trials)
        if not queued and done + len(running) >= target:
            if running != waiting_for:
                emit({"event": "wait", "trials": running})
                waiting_for = running
            time.sleep(poll_s)
            continue
        waiting_for = None
        study.optimize(objective, n_trials=1, catch=(_TrialFailed,), gc_after_trial=False, callbacks=[on_trial_end])
    return failures["stopped"]


def _check_study(study: optuna.Study, sweep: Sweep, url: str) -> None:
    """A resumed study must optimise the same metric in the same direction."""
    direction = study.direction.name.lower()
    if direction != sweep.spec.direction:
        raise UserError(f"{sweep.path}: direction: study {study.study_name!r} in {redact(url)} was created to "
                        f"{direction} (this sweep: {sweep.spec.direction}); use --study NAME for a new study")
    attrs = study.user_attrs
    if "metric" in attrs and attrs["metric"] != sweep.spec.metric:
        raise UserError(f"{sweep.path}: metric: study {study.study_name!r} in {redact(url)} optimises "
                        f"{attrs['metric']!r} (this sweep: {sweep.spec.metric!r}); use --study NAME for a new study")
    if "metric" not in attrs:  # a new study: what `report --sweep` needs to rebuild the best spec
        study.set_user_attr("metric", sweep.spec.metric)
        study.set_user_attr("run", str(sweep.run_path))
        study.set_user_attr("sweep", str(sweep.path.resolve()))
        study.set_user_attr("overrides", sweep.overrides)


def _retry_of(trial: optuna.Trial) -> int | None:
    """The number of the dead trial that ``trial`` retries (RetryHeartbeatStaleTrialCallback's mark)."""
    from optuna.trial import TrialState

    for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number == trial.number:
            return t.system_attrs.get("failed_trial")
    return None


def _run_trial(trial: optuna.Trial, sweep: Sweep, study: str, emit: Emit) -> float:
    import optuna

    from mlmt_bench import runner

    metric = sweep.spec.metric
    params = {key: suggest(trial, key, dist) for key, dist in sweep.space.items()}
    spec = trial_spec(sweep, params, study, trial.number)
    trial.set_user_attr("run_name", spec.name)
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    emit({"event": "start", "trial": trial.number, "steps": spec.train.steps, "params": params,
          "retry_of": _retry_of(trial)})
    reported: set[int] = set()

    def on_eval(record: dict[str, Any]) -> None:
        value = record.get(metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            shown = ", ".join(k for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            raise UserError(f"{sweep.path}: metric: {metric!r} is not a number in this run's evaluations "
                            f"(got {value!r}; numeric keys: {shown})")
        step = int(record.get("step", len(reported)))
        if step in reported:  # the final evaluation can repeat the last periodic one
            return
        reported.add(step)
        emit({"event": "eval", "trial": trial.number, "step": step, "value": float(value)})
        trial.report(float(value), step)
        if trial.should_prune():
            raise SweepPruned(f"trial {trial.number} pruned at step {step} ({metric}={value:.4g})")

    try:
        result = runner.run(spec, progress=False, bar=_StepEvents(trial.number, emit), on_eval=on_eval,
                            extra_manifest={"sweep": study, "trial": trial.number, "pid": os.getpid()})
    except SweepPruned as exc:
        _record_run_dir(trial, sweep, study)
        raise optuna.TrialPruned(str(exc)) from None
    except UserError as exc:
        _record_run_dir(trial, sweep, study)
        trial.set_user_attr("error", _one_line(exc)[:500])
        raise
    except Exception as exc:
        _record_run_dir(trial, sweep, study)
        trial.set_user_attr("error", _one_line(exc)[:500])
        raise _TrialFailed(_one_line(exc)) from exc
    trial.set_user_attr("run_dir", str(result.get("run_dir")))
    value = result.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UserError(f"{sweep.path}: metric: {metric!r} is not in the run's final metrics (got {value!r})")
    return float(value)


def _record_run_dir(trial: optuna.Trial, sweep: Sweep, study: str) -> None:
    run_dir = _find_run_dir(sweep, study, trial.number)
    if run_dir is not None:
        trial.set_user_attr("run_dir", run_dir)


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Results


def summarize(study: optuna.Study, sweep: Sweep, study_name: str, url: str, target: int) -> dict[str, Any]:
    """Trials, counts and the best trial; writes ``<study>-best.yaml`` when a trial completed."""
    from optuna.trial import TrialState

    rows = []
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        state = t.state.name.lower()
        counts[state] = counts.get(state, 0) + 1
        last_step = max(t.intermediate_values) if t.intermediate_values else None
        run_dir = t.user_attrs.get("run_dir")
        if run_dir is None and t.state == TrialState.FAIL:  # a dead worker's trial never recorded it
            run_dir = _find_run_dir(sweep, study_name, t.number)
        rows.append({
            "number": t.number, "state": state, "value": t.value, "params": dict(t.params),
            "last_step": last_step,
            "last_value": t.intermediate_values[last_step] if last_step is not None else None,
            "run_dir": run_dir, "error": t.user_attrs.get("error"),
            "retry_of": t.system_attrs.get("failed_trial"),
        })
    result: dict[str, Any] = {
        "sweep": str(sweep.path), "study": study_name, "storage": redact(url), "metric": sweep.spec.metric,
        "direction": sweep.spec.direction, "n_trials": target, "counts": counts, "trials": rows,
        "trials_dir": str(sweep.trials_dir), "best": None, "best_spec": None,
    }
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        best = study.best_trial
        assert best.value is not None  # a complete trial's
        result["best"] = {"number": best.number, "value": best.value, "params": dict(best.params),
                          "run_dir": best.user_attrs.get("run_dir")}
        result["best_spec"] = str(write_best(sweep, study_name, best.params, best.number, best.value))
    return result


def write_best(sweep: Sweep, study: str, params: dict[str, Any], number: int, value: float) -> Path:
    from mlmt_bench.tracking import atomic_write_text

    spec = best_spec(sweep, params, study)
    out = sweep.output_dir / f"{study}-best.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Best parameters of sweep {sweep.spec.name} (study {study}): trial {number}, "
              f"{sweep.spec.metric} = {value:.6g}\n"
              f"# {yaml.safe_dump(params, default_flow_style=True, width=10**6).strip()}\n"
              f"# run it: mlmt-bench run {out}\n")
    atomic_write_text(out, header + dump_yaml(spec))
    return out
