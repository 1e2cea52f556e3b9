"""Experiment trackers: every ``metrics.jsonl`` record also goes to TensorBoard, MLflow or W&B.

A run spec's ``tracking:`` section names them (``report_to``, any subset; none by default) and
their options (``options.<name>``)::

    tracking:
      report_to: [tensorboard, mlflow, wandb]
      options:
        mlflow: {tracking_uri: "http://mlflow.internal:5000", experiment: rl-feedback}
        wandb: {project: mlmt-bench, mode: online}

The run directory stays the source of truth: :class:`RunTrackers` is attached to the
:class:`~mlmt_bench.tracking.RunDir`, which writes each record to ``metrics.jsonl`` first and
then hands it on. A tracker that raises while the run goes on prints one warning and is dropped
for the rest of the run; the run and its records are untouched. What could fail before that is
checked when the spec is validated (:func:`check_tracking`: the names, the options, the package
installed, the form of a tracking URI) and once more when the run starts (:meth:`Tracker.preflight`:
the store reached), each a one-line :class:`UserError`.

What a tracker receives (:func:`~mlmt_bench.trackers.names.logged`, :func:`axes_of`): every numeric
field of a record as ``<kind>/<field>`` (``train/reward_mean``, ``eval/acc_at_t2``,
``final/acc_at_t2``; strings, lists and nulls are left out), under one name that every tracker
accepts, with TRL's names alongside where a metric means the same (``train/reward``,
``train/kl`` ...; :mod:`mlmt_bench.trackers.names`), and the record's step, generated tokens and
FLOPs (:class:`Axes`).
Experiments and sweeps group their runs (:func:`open_group`, once, in the process that
schedules them): a group's name is the experiment's or the study's directory, and each run's tags
say its arm and seed, or its trial. Trackers are a registry kind (``tracker``, see
:mod:`mlmt_bench.registry`): a plugin adds one by registering a :class:`Tracker` subclass.

Packages: ``pip install 'mlmt-bench[trackers]'`` (tensorboard, mlflow-skinny, wandb).

Why this fan-out and not ``accelerate.tracking``: ``Accelerator.log`` calls each tracker in a plain
loop, so one that raises ends the run, where here it is dropped with one warning; and its MLflow
tracker logs through MLflow's one global active run (``mlflow.start_run``), where arms that run side
by side in one process each log to their own run (``MlflowClient``) and a resume reopens it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from mlmt_bench.errors import UserError
from mlmt_bench.trackers.names import logged

EXTRA = "pip install 'mlmt-bench[trackers]'"


class NoOptions(BaseModel):
    """A tracker's options model (``tracking.options.<name>``): extra keys are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True)
class Axes:
    """Where a record lies on the three axes of a run: the trainer's step, the tokens generated in
    training so far and the FLOPs spent so far (METHOD.md v2 counting)."""

    step: int
    gen_tokens: int
    flops: float


@dataclass(frozen=True)
class Group:
    """An experiment's or a sweep's runs, grouped: ``name`` (its directory's name), ``kind``
    (``experiment`` | ``sweep``), ``root`` (the directory the group's runs are written under) and
    each tracker's state from :meth:`Tracker.open_group` (e.g. MLflow's parent run)."""

    name: str
    kind: str
    root: str
    state: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "root": self.root, "state": self.state}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Group | None:
        if not data:
            return None
        return cls(str(data["name"]), str(data["kind"]), str(data["root"]), dict(data.get("state") or {}))


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told about the run it follows.

    ``root``: the directory the run's directory was created in (its spec's ``output_dir``);
    ``config``: the resolved spec (JSON types); ``tags``: arm, seed, trial ... as strings;
    ``resume``: a resumed run's position, the counters of the checkpoint it continues from
    (records after it were dropped from ``metrics.jsonl`` and are logged again), else None;
    ``state``: what this tracker's :meth:`Tracker.state` recorded in the manifest before (resume).
    """

    run_dir: Path
    root: Path
    config: dict[str, Any]
    tags: dict[str, str]
    group: Group | None = None
    resume: Axes | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.run_dir.name


class Tracker:
    """One experiment tracker, following one run: made by ``Tracker(options, run)`` when the run
    starts (or resumes), then :meth:`log` for every record and :meth:`close` at the end.

    Class attributes: ``Options``, the pydantic model of ``tracking.options.<name>``; ``package``,
    the module whose absence makes the tracker unavailable (checked at validation).
    """

    Options: ClassVar[type[BaseModel]] = NoOptions
    package: ClassVar[str] = ""

    @classmethod
    def check(cls, options: BaseModel, root: Path) -> None:
        """Cheap checks at validation (no import of the tracker's library, no I/O beyond a path
        check): a UserError for an option that cannot work, e.g. a malformed URI."""

    @classmethod
    def preflight(cls, options: BaseModel, root: Path) -> None:
        """When a run, experiment or sweep starts, before anything is trained: a UserError if the
        tracker cannot work (its store unreachable). Default: nothing to try."""

    @classmethod
    def reach(cls, options: BaseModel, root: Path) -> None:
        """At ``mlmt-bench validate``: a UserError if a store on another machine (a tracking
        server, a database) does not answer, without creating anything on this one (a local store
        is made when the run starts). Default: nothing to reach."""

    @classmethod
    def open_group(cls, options: BaseModel, group: Group, config: dict[str, Any]) -> dict[str, Any]:
        """Once per experiment or sweep, in the scheduling process: whatever the group needs (a
        parent run) as JSON, handed to every run as ``run.group.state[<name>]``. Default: {}."""
        return {}

    @classmethod
    def close_group(cls, options: BaseModel, group: Group, status: str) -> None:
        """When the experiment or sweep ends (``status``: completed or failed). Default: nothing."""

    def __init__(self, options: Any, run: RunInfo) -> None:
        """Start following ``run`` (a new tracker run, or the one ``run.state`` names)."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """JSON recorded in the run's manifest (``trackers.<name>``) so that a resume continues
        the same tracker run; also what the user reads to find it (a run id, a directory)."""
        return {}

    def log(self, metrics: dict[str, float], axes: Axes) -> None:
        """One record: ``metrics`` from :func:`~mlmt_bench.trackers.names.logged` (name → value),
        logged under these names as they are (every tracker the same)."""
        raise NotImplementedError

    def close(self, status: str) -> None:
        """The run ended with ``status`` (the manifest's: completed, failed, interrupted, pruned)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------
# What a record becomes


def axes_of(record: dict[str, Any]) -> Axes:
    """A record's step, generated tokens and FLOPs (every record carries the counters)."""
    return Axes(int(record.get("step", 0)), int(record.get("gen_tokens", 0)), float(record.get("flops", 0.0)))


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested spec as dotted keys → strings (``algorithm.params.group_size`` → ``"8"``): what
    trackers with flat parameters (MLflow) record. Lists are kept whole, as their JSON."""
    import json

    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, path + "."))
        else:
            out[path] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return out


# ----------------------------------------------------------------------------------------------
# Validation


def _cls(name: str) -> type[Tracker]:
    from mlmt_bench import registry

    return registry.trackers.get(name)  # a Tracker subclass (the registry checks)


def tracker_options(name: str, raw: dict[str, Any] | None) -> BaseModel:
    """``tracking.options.<name>`` validated by the tracker's own model (ValidationError if wrong)."""
    return _cls(name).Options.model_validate(raw or {})


def check_tracking(report_to: list[str], options: dict[str, dict[str, Any]], root: Path) -> None:
    """A UserError (``tracking...: ...``, without the file) for a ``tracking:`` section that cannot
    work: an unknown or repeated name, options for a tracker that is not used, options its model
    refuses, its package not installed, an option :meth:`Tracker.check` refuses."""
    from mlmt_bench import registry

    for i, name in enumerate(report_to):
        if name not in registry.trackers:
            raise UserError(f"tracking.report_to.{i}: {registry.trackers.unknown_message(name)}")
        if name in report_to[:i]:
            raise UserError(f"tracking.report_to.{i}: {name!r} is listed twice")
    for name in options:
        if name not in report_to:
            raise UserError(f"tracking.options.{name}: options for a tracker that is not in tracking.report_to "
                            f"({', '.join(report_to) or 'empty'})")
    for name in report_to:
        cls = _cls(name)
        try:
            opts = cls.Options.model_validate(options.get(name) or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise UserError(f"tracking.options.{name}.{where}: {err['msg']}") from None
        if cls.package and importlib.util.find_spec(cls.package) is None:
            raise UserError(f"tracking.report_to: {name} needs the {cls.package} package, which is not installed "
                            f"({EXTRA})")
        try:
            cls.check(opts, root)
        except UserError as exc:
            raise UserError(f"tracking.options.{name}: {exc}") from None


def preflight(report_to: Iterable[str], options: dict[str, dict[str, Any]], root: Path) -> None:
    """:meth:`Tracker.preflight` of each tracker, before a run, experiment or sweep starts."""
    _each(report_to, options, root, "preflight")


def reach(report_to: Iterable[str], options: dict[str, dict[str, Any]], root: Path) -> None:
    """:meth:`Tracker.reach` of each tracker: what ``validate`` checks of the stores a spec names."""
    _each(report_to, options, root, "reach")


def _each(report_to: Iterable[str], options: dict[str, dict[str, Any]], root: Path,
          check: Literal["preflight", "reach"]) -> None:
    """One of the trackers' checks on each tracker, its refusal prefixed with the tracker's name."""
    for name in report_to:
        cls = _cls(name)
        try:
            (cls.preflight if check == "preflight" else cls.reach)(tracker_options(name, options.get(name)), root)
        except UserError as exc:
            raise UserError(f"tracking.report_to: {name}: {exc}") from None


def open_group(specs: Iterable[Any], name: str, kind: str, root: Path | str,
               saved: dict[str, Any] | None = None) -> Group | None:
    """The group of an experiment's or a sweep's runs (``specs``: their RunSpecs), or None when
    no run reports to a tracker. Each tracker any run uses is preflighted and opens its part of
    the group once, with the options of the first run that names it; ``saved`` (the group as
    :meth:`Group.to_json` recorded it: a resumed experiment or study) is reused as it is."""
    if saved:
        return Group.from_json(saved)
    chosen: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for spec in specs:
        for t in spec.tracking.report_to:
            chosen.setdefault(t, (spec.tracking.options.get(t) or {}, spec.model_dump(mode="json")))
    if not chosen:
        return None
    group = Group(name, kind, str(root))
    state = {}
    for t, (raw, config) in chosen.items():
        opts = tracker_options(t, raw)
        try:
            _cls(t).preflight(opts, Path(root))
            state[t] = _cls(t).open_group(opts, group, config)
        except UserError as exc:
            raise UserError(f"tracking.report_to: {t}: {exc}") from None
    return Group(name, kind, str(root), state)


def close_group(specs: Iterable[Any], group: Group | None, status: str) -> None:
    """:meth:`Tracker.close_group` of each tracker of ``group``; a failure is one warning line."""
    if group is None:
        return
    chosen: dict[str, dict[str, Any]] = {}
    for spec in specs:
        for t in spec.tracking.report_to:
            chosen.setdefault(t, spec.tracking.options.get(t) or {})
    for t, raw in chosen.items():
        try:
            _cls(t).close_group(tracker_options(t, raw), group, status)
        except Exception as exc:  # noqa: BLE001 - the experiment's results are written already
            sys.stderr.write(f"warning: tracker {t}: could not close group {group.name} ({_one_line(exc)})\n")


# ----------------------------------------------------------------------------------------------
# The trackers of one run


class RunTrackers:
    """The trackers following one run: the :class:`~mlmt_bench.tracking.RunDir` hands it every
    record after writing it (:meth:`log`) and closes it when the run ends. A tracker that raises
    is reported with one line on stderr and dropped; nothing it does reaches the run."""

    def __init__(self, trackers: dict[str, Tracker], warn: Callable[[str], Any] | None = None) -> None:
        self.trackers = trackers
        self.failed: dict[str, str] = {}
        self._warn = warn or (lambda text: sys.stderr.write(text))  # stderr as it is when a warning comes

    @classmethod
    def start(cls, report_to: Iterable[str], options: dict[str, dict[str, Any]], run: RunInfo,
              saved: dict[str, Any] | None = None, warn: Callable[[str], Any] | None = None) -> RunTrackers:
        """Start each tracker for ``run`` (``saved``: the manifest's ``trackers`` of a resumed run)."""
        hub = cls({}, warn)
        for name in report_to:
            try:
                state = (saved or {}).get(name) or {}
                run_t = RunInfo(run.run_dir, run.root, run.config, run.tags, run.group, run.resume, state)
                hub.trackers[name] = _cls(name)(tracker_options(name, options.get(name)), run_t)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops a run
                hub._drop(name, "start", exc)
        return hub

    def state(self) -> dict[str, Any]:
        """Each tracker's :meth:`Tracker.state`, and ``{"error": ...}`` for a dropped one."""
        out: dict[str, Any] = {name: {"error": why} for name, why in self.failed.items()}
        for name, t in self.trackers.items():
            try:
                out[name] = t.state()
            except Exception as exc:  # noqa: BLE001
                out[name] = {"error": _one_line(exc)}
        return out

    def log(self, record: dict[str, Any]) -> None:
        if not self.trackers:
            return
        metrics, axes = logged(record), axes_of(record)
        for name, t in list(self.trackers.items()):
            try:
                t.log(metrics, axes)
            except Exception as exc:  # noqa: BLE001 - the record is in metrics.jsonl already
                self._drop(name, f"step {axes.step}", exc)

    def close(self, status: str) -> None:
        for name, t in list(self.trackers.items()):
            try:
                t.close(status)
            except Exception as exc:  # noqa: BLE001
                self._drop(name, "close", exc)
        self.trackers = {}

    def _drop(self, name: str, when: str, exc: BaseException) -> None:
        self.trackers.pop(name, None)
        self.failed[name] = f"{when}: {_one_line(exc)}"
        self._warn(f"warning: tracker {name} failed ({when}: {_one_line(exc)}); it gets no more records of this run, "
                   "metrics.jsonl has them all\n")


def _one_line(exc: BaseException) -> str:
    from mlmt_bench.io.bounded_input import shorten

    text = " ".join(str(exc).split())
    return shorten(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)

