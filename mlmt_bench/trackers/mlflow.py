"""MLflow: a run per mlmt-bench run, through ``MlflowClient``, in a local SQLite store by default.

The store: ``tracking_uri`` (any URI MLflow takes: ``http(s)://`` a tracking server,
``sqlite:///path.db``, ``postgresql://...``, ``file:///dir`` or a plain directory), by default
``sqlite:///<output_dir>/mlflow.db`` beside the run directories (an experiment's or sweep's:
under the directory its runs are written in). Open it with ``mlflow ui --backend-store-uri
sqlite:///runs/mlflow.db``. Runs go to the MLflow experiment ``experiment`` (default
``mlmt-bench``); the runs of an mlmt-bench experiment or sweep are children of one parent run
named after its directory (tags ``arm``, ``seed``, or ``trial``).

Each run's parameters are its resolved spec, flattened to dotted keys (:func:`flat_params`); its
metrics are every record's numeric fields at the record's step (``train/gen_tokens`` and
``train/flops`` among them: choose either as the x-axis in the UI), under the names every tracker
uses (:mod:`mlmt_bench.trackers.names`: ``acc@t2`` is ``acc_at_t2``, as MLflow's names allow
letters, digits and ``_ - . / : space`` only). A resumed run continues the same MLflow run (its id is in the
manifest); the steps it redoes are logged again, with the same values on a CPU.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import Field

from mlmt_bench.errors import UserError
from mlmt_bench.machine.environ import temporary_environ
from mlmt_bench.trackers import Axes, Group, NoOptions, RunInfo, Tracker, flat_params

#: URI schemes MLflow's client resolves to a tracking store (a plain path: a file store)
SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")
_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "pruned": "FINISHED"}
MAX_METRICS, MAX_PARAMS, MAX_PARAM_CHARS = 1000, 100, 6000  # MLflow's limits per log_batch / per value


class MLflowOptions(NoOptions):
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; default sqlite:///<output_dir>/mlflow.db")
    experiment: str = Field("mlmt-bench", min_length=1, description="the MLflow experiment the runs go to")
    timeout_s: int = Field(10, ge=1, le=600, description="seconds a request to a tracking server may take (no retries "
                           "while checking that it answers)")


def default_uri(root: Path | str) -> str:
    return f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URI, else None."""
    head = "sqlite:///"
    return Path(uri[len(head):]) if uri.startswith(head) and len(uri) > len(head) else None


@contextlib.contextmanager
def _quiet(timeout_s: int) -> Iterator[None]:
    """MLflow's INFO lines (the database migrations) off, and its HTTP requests bounded: one try
    of ``timeout_s`` seconds instead of seven retries with backoff."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with temporary_environ(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(timeout_s)):
        yield


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client: Any, name: str, root: Path) -> str:
    """The id of MLflow experiment ``name``, created (artifacts under ``root``) if missing; two
    processes creating it at once both end with the one that was made."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=(root / "mlflow-artifacts").resolve().as_uri()))
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


class MLflowTracker(Tracker):
    Options = MLflowOptions
    package = "mlflow"

    @classmethod
    def check(cls, options: MLflowOptions, root: Path) -> None:  # type: ignore[override]
        uri = options.tracking_uri
        if uri is None:
            return
        scheme = urlparse(uri).scheme
        if scheme and scheme not in SCHEMES and not re.fullmatch(r"[a-z]+\+[a-z0-9_]+", scheme):
            raise UserError(f"tracking_uri: unknown scheme {scheme!r} (MLflow takes {', '.join(SCHEMES)}, a "
                            "database URL such as postgresql+psycopg2://, or a directory)")
        db = _sqlite_file(uri)
        if scheme == "sqlite" and db is None:
            raise UserError(f"tracking_uri: {uri!r} names no database file (sqlite:///relative.db or "
                            "sqlite:////absolute.db)")
        if db is not None:
            from mlmt_bench.tracking import check_output_dir, check_output_file

            check_output_dir(db.parent, "tracking_uri")  # never in a system directory, made or not
            if db.parent.is_dir():  # a new directory is made when the run starts
                check_output_file(db, "tracking_uri")

    @classmethod
    def preflight(cls, options: MLflowOptions, root: Path) -> None:  # type: ignore[override]
        uri = options.tracking_uri or default_uri(root)
        db = _sqlite_file(uri)
        with _quiet(options.timeout_s):
            try:
                if db is not None:
                    db.parent.mkdir(parents=True, exist_ok=True)
                _client(uri).search_experiments(max_results=1)
            except Exception as exc:  # noqa: BLE001 - whatever the store says, as one line
                from mlmt_bench.trackers import _one_line

                raise UserError(f"tracking_uri {uri}: the MLflow store does not answer ({_one_line(exc)})") from None

    @classmethod
    def reach(cls, options: MLflowOptions, root: Path) -> None:  # type: ignore[override]
        """A tracking server or database store is asked once (within ``timeout_s``); a local
        SQLite file or directory store is left to the run, which creates it."""
        uri = options.tracking_uri
        if uri is None or _sqlite_file(uri) is not None or urlparse(uri).scheme in ("", "file"):
            return
        cls.preflight(options, root)

    @classmethod
    def open_group(cls, options: MLflowOptions, group: Group,  # type: ignore[override]
                   config: dict[str, Any]) -> dict[str, Any]:
        uri = options.tracking_uri or default_uri(group.root)
        with _quiet(options.timeout_s):
            client = _client(uri)
            exp_id = _experiment_id(client, options.experiment, Path(group.root))
            parent = client.create_run(exp_id, run_name=group.name, tags={"mlmt_bench.kind": group.kind,
                                                                          "mlmt_bench.dir": group.name})
        return {"tracking_uri": uri, "experiment_id": exp_id, "parent_run_id": parent.info.run_id}

    @classmethod
    def close_group(cls, options: MLflowOptions, group: Group, status: str) -> None:  # type: ignore[override]
        state = group.state.get("mlflow") or {}
        if state.get("parent_run_id"):
            with _quiet(options.timeout_s):
                _client(state["tracking_uri"]).set_terminated(state["parent_run_id"], _STATUS.get(status, "FINISHED"))

    def __init__(self, options: MLflowOptions, run: RunInfo) -> None:
        from mlflow.entities import Param

        shared = (run.group.state.get("mlflow") or {}) if run.group is not None else {}
        self.uri = run.state.get("tracking_uri") or shared.get("tracking_uri") or options.tracking_uri \
            or default_uri(run.root)
        self.client = _client(self.uri)
        if run.state.get("run_id"):  # a resumed run continues its MLflow run
            self.run_id = str(run.state["run_id"])
            self.client.update_run(self.run_id, status="RUNNING")
            return
        exp_id = shared.get("experiment_id") or _experiment_id(self.client, options.experiment, run.root)
        tags = {**run.tags, "mlmt_bench.run_dir": str(run.run_dir.resolve())}
        if shared.get("parent_run_id"):
            tags["mlflow.parentRunId"] = shared["parent_run_id"]
        self.run_id = self.client.create_run(exp_id, run_name=run.name, tags=tags).info.run_id
        params = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in flat_params(run.config).items()]
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS])

    def state(self) -> dict[str, Any]:
        return {"tracking_uri": self.uri, "run_id": self.run_id}

    def log(self, metrics: dict[str, float], axes: Axes) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, axes.step) for k, v in metrics.items()]
        for i in range(0, len(batch), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MAX_METRICS])

    def close(self, status: str) -> None:
        self.client.set_tag(self.run_id, "mlmt_bench.status", status)
        self.client.set_terminated(self.run_id, _STATUS.get(status, "FAILED"))
