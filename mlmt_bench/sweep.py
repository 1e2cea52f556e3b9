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
name a field of :class:`RunSpec`), every distribution, and the run spec with each distribution's
end points applied. Errors are one-line :class:`UserError` naming the sweep file.

Layout, with ``<dir> = <run spec's output_dir>/<sweep name>``::

    <dir>/<name>.db              the Optuna study (SQLite, unless --storage names another)
    <dir>/<study>-best.yaml      the run spec with the best parameters applied (atomic rewrite)
    <dir>/trials/<study>-t<N>-<stamp>/   one run directory per trial (manifest: sweep, trial)

Each trial applies its sampled values to the run spec (``--set`` semantics), runs it with
:func:`mlmt_bench.runner.run`, reports ``record[metric]`` at ``record["step"]`` after every
evaluation and is pruned (run status ``pruned``) when the pruner says so. A trial that raises is
recorded as failed and the study goes on (three failures in a row stop it); a :class:`UserError`
stops the sweep. The storage is transactional and the study is loaded if it exists, so running
the same command again resumes: only the missing complete + pruned trials are run. With a
PostgreSQL storage (``pip install 'mlmt-bench[postgres]'``) several machines can run the same
command at once. A trial whose process died (no heartbeat for 3 minutes) is marked failed and
its parameters are tried again once.

Optuna is imported inside the functions, so ``import mlmt_bench`` stays light.
"""

from __future__ import annotations

import copy
import contextlib
import gc
import json
import math
import re
import socket
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal

import yaml
from pydantic import Field, ValidationError

from mlmt_bench.bounded_input import short_repr, shorten
from mlmt_bench.errors import UserError
from mlmt_bench.spec import (RunSpec, SweepSpec, _Spec, apply_overrides, dump_yaml, format_validation_error,
                             is_experiment, load_raw, load_validated, parse_override, validate_run)

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["Sweep", "SweepPruned", "load_sweep", "run_sweep", "trial_spec", "best_spec", "default_storage",
           "print_summary"]

HEARTBEAT_S = 60  # a running trial writes a heartbeat this often ...
GRACE_S = 180  # ... and is declared dead (failed, retried once) after this long without one
MAX_CONSECUTIVE_FAILURES = 3
MAX_GRID_POINTS = 10_000  # values of one parameter on a grid (the grid is built in memory)

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


Dist = FloatDist | IntDist | CategoricalDist
_DISTS: dict[str, type[_Spec]] = {"float": FloatDist, "int": IntDist, "categorical": CategoricalDist}


def parse_dist(raw: Any, source: str, key: str) -> Dist:
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
    if dist.log and (isinstance(dist, FloatDist) and dist.step is not None or isinstance(dist, IntDist) and dist.step != 1):
        raise UserError(f"{where}: log: true and step cannot be used together")
    if isinstance(dist, FloatDist) and not (math.isfinite(dist.low) and math.isfinite(dist.high)):
        raise UserError(f"{where}: low and high must be finite, got low={dist.low!r}, high={dist.high!r}")
    return dist


def end_points(dist: Dist) -> list[Any]:
    """The values a validation probe tries: the bounds, or every choice."""
    if isinstance(dist, CategoricalDist):
        return list(dist.choices)
    return [dist.low, dist.high]


def grid_values(dist: Dist, where: str) -> list[Any]:
    if isinstance(dist, CategoricalDist):
        return list(dist.choices)
    if isinstance(dist, IntDist):
        n = (dist.high - dist.low) // dist.step
    elif dist.step is None:
        raise UserError(f"{where}: the grid sampler needs a `step` for float parameters")
    else:
        ratio = (dist.high - dist.low) / dist.step
        n = math.floor(ratio + 1e-9) if math.isfinite(ratio) else math.inf
    if n + 1 > MAX_GRID_POINTS:
        raise UserError(f"{where}: more than {MAX_GRID_POINTS} grid values; use a larger step or another sampler")
    if isinstance(dist, IntDist):
        return list(range(dist.low, dist.high + 1, dist.step))
    return [round(dist.low + i * dist.step, 12) for i in range(n + 1)]


def suggest(trial: "optuna.Trial", path: str, dist: Dist) -> Any:
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
    space: dict[str, Dist]
    output_dir: Path  # <run output_dir>/<sweep name>

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

    space: dict[str, Dist] = {}
    for key, raw in spec.space.items():
        _check_space_path(path, key)
        space[key] = parse_dist(raw, str(path), key)
    if spec.sampler == "grid":
        for key, dist in space.items():
            grid_values(dist, f"{path}: space.{shorten(key)}")
    _check_overrides(overrides or [], space)

    output_dir = Path(str(run_raw.get("output_dir") or "runs")) / spec.name
    sweep = Sweep(path, spec, run_path, run_raw, space, output_dir)
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


def _check_overrides(overrides: list[str], space: dict[str, Dist]) -> None:
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
    data = copy.deepcopy(sweep.run_raw)
    for key, value in params.items():
        data = set_path(data, key, value)
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


def open_storage(url: str) -> "optuna.storages.BaseStorage":
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        if str(db) not in ("", ":memory:"):
            db.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
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


def make_sampler(kind: str, sweep: Sweep, seed: int | None) -> "optuna.samplers.BaseSampler":
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        grid = {k: grid_values(d, f"{sweep.path}: space.{k}") for k, d in sweep.space.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant_liar: workers on other machines do not all sample the same point
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def make_pruner(kind: str) -> "optuna.pruners.BasePruner":
    import optuna

    if kind == "none":
        return optuna.pruners.NopPruner()
    # warmup 1: the step-0 evaluation (before any update) says nothing about the parameters
    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)


def grid_size(sweep: Sweep) -> int:
    n = 1
    for k, d in sweep.space.items():
        n *= len(grid_values(d, f"{sweep.path}: space.{k}"))
    return n


# ----------------------------------------------------------------------------------------------
# Running


class SweepPruned(Exception):
    """Raised from the eval callback to stop a trial's run; the run directory's status becomes ``pruned``."""

    run_status = "pruned"


class _TrialFailed(Exception):
    """A trial's run raised: recorded as failed, the study goes on."""


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
def _optuna_verbosity(progress: bool) -> Iterator[None]:
    import optuna

    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO if progress else optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


def run_sweep(path: Path | str, *, n_trials: int | None = None, storage: str | None = None,
              study_name: str | None = None, seed: int | None = None, overrides: list[str] | None = None,
              progress: bool = True) -> dict[str, Any]:
    """Create or resume the study and run trials until ``n_trials`` are complete or pruned.

    Returns :func:`summarize`'s dict; ``stopped`` is set when the sweep gave up on failures.
    """
    import optuna
    from optuna.trial import TrialState

    sweep = load_sweep(path, overrides, study_name)
    spec = sweep.spec
    study_name = study_name or spec.name
    url = storage or default_storage(sweep)
    target = n_trials if n_trials is not None else spec.n_trials
    if spec.sampler == "grid":
        target = min(target, grid_size(sweep))

    with _optuna_verbosity(progress):
        store = open_storage(url)
        study = optuna.create_study(storage=store, study_name=study_name, direction=spec.direction,
                                    pruner=make_pruner(spec.pruner), load_if_exists=True)
        _check_study(study, sweep, url)
        # A seeded sampler is re-seeded past the trials so far, so a resumed study draws new points.
        study.sampler = make_sampler(spec.sampler, sweep, None if seed is None else seed + len(study.trials))

        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        failures = {"consecutive": 0, "last": None, "stopped": None}

        def objective(trial: optuna.Trial) -> float:
            return _run_trial(trial, sweep, study_name)

        def on_trial_end(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
            if frozen.state == TrialState.FAIL:
                failures["consecutive"] += 1
                failures["last"] = frozen.user_attrs.get("error")
                if failures["consecutive"] >= MAX_CONSECUTIVE_FAILURES:
                    failures["stopped"] = (f"{failures['consecutive']} trials in a row failed "
                                           f"(last: {failures['last']}); see the trials' run directories")
                    study.stop()
            else:
                failures["consecutive"] = 0
            _free_memory()

        if len(study.get_trials(deepcopy=False, states=finished)) < target:
            study.optimize(objective, n_trials=None, catch=(_TrialFailed,), gc_after_trial=False,
                           callbacks=[optuna.study.MaxTrialsCallback(target, states=finished), on_trial_end])

    result = summarize(study, sweep, study_name, url, target)
    result["stopped"] = failures["stopped"]
    return result


def _check_study(study: "optuna.Study", sweep: Sweep, url: str) -> None:
    """A resumed study must optimise the same metric in the same direction."""
    direction = study.direction.name.lower()
    if direction != sweep.spec.direction:
        raise UserError(f"{sweep.path}: direction: study {study.study_name!r} in {redact(url)} was created to "
                        f"{direction} (this sweep: {sweep.spec.direction}); use --study NAME for a new study")
    attrs = study.user_attrs
    if "metric" in attrs and attrs["metric"] != sweep.spec.metric:
        raise UserError(f"{sweep.path}: metric: study {study.study_name!r} in {redact(url)} optimises "
                        f"{attrs['metric']!r} (this sweep: {sweep.spec.metric!r}); use --study NAME for a new study")
    if "metric" not in attrs:
        study.set_user_attr("metric", sweep.spec.metric)
        study.set_user_attr("run", str(sweep.run_path))


def _run_trial(trial: "optuna.Trial", sweep: Sweep, study: str) -> float:
    import optuna

    from mlmt_bench import runner

    metric = sweep.spec.metric
    params = {key: suggest(trial, key, dist) for key, dist in sweep.space.items()}
    spec = trial_spec(sweep, params, study, trial.number)
    trial.set_user_attr("run_name", spec.name)
    trial.set_user_attr("host", socket.gethostname())
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
        trial.report(float(value), step)
        if trial.should_prune():
            raise SweepPruned(f"trial {trial.number} pruned at step {step} ({metric}={value:.4g})")

    try:
        result = runner.run(spec, progress=False, extra_manifest={"sweep": study, "trial": trial.number},
                            on_eval=on_eval)
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


def _record_run_dir(trial: "optuna.Trial", sweep: Sweep, study: str) -> None:
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


def summarize(study: "optuna.Study", sweep: Sweep, study_name: str, url: str, target: int) -> dict[str, Any]:
    """Trials, counts and the best trial; writes ``<study>-best.yaml`` when a trial completed."""
    from optuna.trial import TrialState

    rows = []
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        state = t.state.name.lower()
        counts[state] = counts.get(state, 0) + 1
        last_step = max(t.intermediate_values) if t.intermediate_values else None
        rows.append({
            "number": t.number, "state": state, "value": t.value, "params": dict(t.params),
            "last_step": last_step,
            "last_value": t.intermediate_values[last_step] if last_step is not None else None,
            "run_dir": t.user_attrs.get("run_dir"), "error": t.user_attrs.get("error"),
        })
    result: dict[str, Any] = {
        "sweep": str(sweep.path), "study": study_name, "storage": redact(url), "metric": sweep.spec.metric,
        "direction": sweep.spec.direction, "n_trials": target, "counts": counts, "trials": rows,
        "trials_dir": str(sweep.trials_dir), "best": None, "best_spec": None,
    }
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        best = study.best_trial
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def print_summary(result: dict[str, Any]) -> None:
    """The trials as a rich table, then the best parameters (stdout)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"sweep {result['study']} — {result['metric']} ({result['direction']})")
    table.add_column("#", justify="right")
    table.add_column("state")
    table.add_column("value", justify="right")
    table.add_column("params", overflow="fold")
    table.add_column("run_dir (in trials/)", overflow="fold")
    for r in result["trials"]:
        params = "\n".join(f"{k}={_fmt(v)}" for k, v in r["params"].items())
        where = Path(r["run_dir"]).name if r["run_dir"] else "-"
        if r["error"]:
            where = f"{where}\n{r['error']}"
        value = _fmt(r["value"])
        if r["state"] == "pruned" and r["last_step"] is not None:
            value = f"{value} @ step {r['last_step']}"
        table.add_row(str(r["number"]), r["state"], value, params, where)
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result["counts"].items()))
    lines = [f"{counts or 'no trials'} (target: {result['n_trials']} complete + pruned) in {result['storage']}",
             f"trials: {result['trials_dir']}"]
    best = result["best"]
    if best is None:
        lines.append("no trial completed yet")
    else:
        lines.append(f"best: trial {best['number']}, {result['metric']} = {_fmt(best['value'])}")
        lines += [f"  {k} = {v!r}" for k, v in best["params"].items()]
        lines.append(f"best spec: {result['best_spec']}")
    sys.stdout.write("\n".join(lines) + "\n")
