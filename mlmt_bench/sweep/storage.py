"""Where a study lives and how it samples: Optuna storages (SQLite in write-ahead mode, PostgreSQL),
the dead-trial retry, samplers, pruners and Optuna's logging."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import mask_credentials
from mlmt_bench.sweep.space import check_grid_size, grid_values
from mlmt_bench.sweep.sweep_file import Sweep, find_run_dir
from mlmt_bench.sweep.workers import GRACE_FACTOR

if TYPE_CHECKING:  # pragma: no cover
    import optuna

SQLITE_LOCK_TIMEOUT_S = 60  # how long a SQLite writer waits for another worker's lock
SURPLUS_ATTR = "surplus"  # a trial's user attribute: it started past the study's target and never ran


def is_surplus(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` started after the study's last trials were taken (see
    :func:`mlmt_bench.sweep.study.work`): Optuna records it as failed (at once, so it is never a
    stale trial to retry); summaries and reports leave it out."""
    return bool(trial.user_attrs.get(SURPLUS_ATTR))


#: seconds a database server (PostgreSQL, MySQL) may take to accept a connection and answer its
#: start-up, before ``sweep --storage`` / ``report --sweep`` give up in one line
SERVER_CONNECT_TIMEOUT_S = 10


def default_storage(sweep: Sweep) -> str:
    return "sqlite:///" + str((sweep.output_dir / f"{sweep.spec.name}.db").resolve())


def redact(url: str) -> str:
    """The storage URL without its password (it is printed and stored in results)."""
    return mask_credentials(url)


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
    elif url.startswith(("postgres", "mysql")):  # a server that accepts and never answers must not hang a sweep
        engine_kwargs["connect_args"] = {"connect_timeout": SERVER_CONNECT_TIMEOUT_S}
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
        found = find_run_dir(self.sweep, study.study_name, trial.number)
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
