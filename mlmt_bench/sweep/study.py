"""Running a study: each worker's loop (:func:`work`), one trial's run with its pruning and
failure handling, and the study's summary and best-parameters file."""

from __future__ import annotations

import gc
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mlmt_bench.errors import UserError
from mlmt_bench.machine.cpus import cpu_budget
from mlmt_bench.spec import dump_yaml
from mlmt_bench.sweep.space import suggest
from mlmt_bench.sweep.storage import (
    SURPLUS_ATTR,
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
    use_wal,
    worker_seed,
)
from mlmt_bench.sweep.sweep_file import Sweep, best_spec, find_run_dir, load_sweep, trial_spec
from mlmt_bench.sweep.workers import GRACE_FACTOR, MAX_CONSECUTIVE_FAILURES, WorkerArgs

if TYPE_CHECKING:  # pragma: no cover
    import optuna

HEARTBEAT_S = 60  # a running trial writes a heartbeat this often (default of --heartbeat) ...
WAIT_POLL_S = 5  # a worker waiting for the study's last trials looks again this often (at most)


# A worker reports what it does as events, dicts with an "event" key (the progress display reads
# them; mlmt_bench.sweep.workers sends them from worker processes as JSON lines):
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


class _Surplus(Exception):
    """A trial started after the study's last trials were taken (:func:`is_surplus`): ended at
    once, before it suggests or runs anything."""


def _past_target(trial: optuna.Trial, target: int) -> bool:
    """Whether ``target`` trials numbered below ``trial`` are complete, pruned, running or queued.

    Workers decide to start a trial from what they read, so two can start the study's last one at
    once (on two machines, or when one fails a dead trial and queues its retry while another reads).
    Storages number trials in one order, so the later one sees the earlier and yields; a surplus
    trial below it is counted, but it is surplus only when ``target`` trials are below it, which are
    then below this one too."""
    from optuna.trial import TrialState

    alive = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    below = sum(t.number < trial.number and t.state in alive and not is_surplus(t)
                for t in trial.study.get_trials(deepcopy=False))
    return below >= target


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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_sweep(path: Path | str, *, n_trials: int | None = None, storage: str | None = None,
              study_name: str | None = None, seed: int | None = None, overrides: list[str] | None = None,
              progress: bool = True, workers: int = 1, heartbeat_s: int | None = None, ray: str | None = None,
              ray_gpus: float = 0.0) -> dict[str, Any]:
    """Create or resume the study and run trials until ``n_trials`` are complete or pruned.

    ``workers`` > 1 runs them in that many worker processes (:mod:`mlmt_bench.sweep.workers`);
    ``heartbeat_s``: seconds between a running trial's heartbeats (default ``HEARTBEAT_S``);
    ``progress`` shows each trial's progress on stderr (:mod:`mlmt_bench.sweep.display`).
    ``ray`` (a cluster address): each trial is a Ray task instead (:func:`_sweep_on_ray`).
    Returns :func:`summarize`'s dict; ``stopped`` is set when the sweep gave up on failures.
    """
    import optuna

    from mlmt_bench.sweep.display import SweepDisplay

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
    if ray is not None and workers != 1:
        raise UserError("--workers and --ray exclude each other: with --ray the cluster's resources decide how many "
                        "trials go at once")
    if (workers > 1 or ray is not None) and db is not None:
        use_wal(db)

    with quiet_optuna():
        store = open_storage(url, heartbeat_s, RetryDeadTrial(sweep))
        study = optuna.create_study(storage=store, study_name=study_name, direction=spec.direction,
                                    pruner=make_pruner(spec.pruner), load_if_exists=True)
        _check_study(study, sweep, url)
        group = _tracking_group(study, sweep, study_name)
        display = SweepDisplay(study_name, spec.metric, target, done=_count_finished(study), direction=spec.direction,
                               enabled=progress, grace_s=GRACE_FACTOR * heartbeat_s)
        with display:
            if workers == 1 and ray is None:
                stopped = work(study, sweep, target, lambda event: display.handle(0, event), seed=seed, worker=0,
                               heartbeat_s=heartbeat_s)
            else:
                from mlmt_bench.sweep.workers import supervise

                overrides = sweep.overrides
                threads = (sweep.run_raw.get("train") or {}).get("threads")
                if threads is None:
                    # the workers share this machine's cores (torch would give each all of them); a Ray task: one
                    threads = 1 if ray is not None else max(1, cpu_budget() // workers)
                    overrides = [*overrides, f"train.threads={threads}"]
                args = WorkerArgs(str(sweep.path), overrides, study_name, url, target, seed, heartbeat_s)
                if ray is not None:
                    stopped = _sweep_on_ray(args, study, ray, int(threads), ray_gpus)
                else:
                    stopped = supervise(args, workers, display, sweep.output_dir / "logs")
        result = summarize(study, sweep, study_name, url, target)
    if group is not None:
        from mlmt_bench.trackers import close_group

        close_group([group[0]], group[1], "failed" if stopped else "completed")
    result["stopped"] = stopped
    return result


def work_stored(args: WorkerArgs, worker: int, emit: Emit, keep_going: Callable[[], bool]) -> str | None:
    """:func:`work` on the study ``args`` names, loaded from its storage: what a worker process
    (``--workers``) or a Ray task (``--ray``) runs."""
    import optuna

    sweep = load_sweep(args.sweep, args.overrides, args.study)
    with quiet_optuna("WARNING"):  # failed trials' tracebacks go to the worker's log
        store = open_storage(args.storage, args.heartbeat_s, RetryDeadTrial(sweep))
        study = optuna.load_study(study_name=args.study, storage=store, pruner=make_pruner(sweep.spec.pruner))
        return work(study, sweep, args.target, emit, seed=args.seed, worker=worker, heartbeat_s=args.heartbeat_s,
                    keep_going=keep_going)


def ray_trial(args: WorkerArgs, worker: int) -> str | None:
    """One Ray task of ``sweep --ray``: a single pass of :func:`work` (one trial, or one wait while
    the study's last trials run elsewhere); what it returns."""
    passes = iter([True])
    return work_stored(args, worker, lambda event: None, lambda: next(passes, False))


def _sweep_on_ray(args: WorkerArgs, study: optuna.Study, address: str, cpus: int, gpus: float) -> str | None:
    """The trials of ``study`` as Ray tasks (:func:`ray_trial`, each one
    pass of :func:`work`: one trial, or one wait while the study's last trials run), as many at
    once as the cluster holds, until ``args.target`` trials are complete or pruned. Optuna decides
    every trial's parameters from the shared storage; a task whose worker died is retried by Ray,
    and its trial, silent past the heartbeat's grace, is failed and its parameters run again by
    the next task (:class:`RetryDeadTrial`). Returns why the sweep stopped, or None."""
    from concurrent.futures import FIRST_COMPLETED, Future, wait

    from mlmt_bench.machine.cluster import RayExecutor

    stopped: str | None = None
    with RayExecutor(address, num_cpus=cpus, num_gpus=gpus) as pool:
        slots, k = pool.slots(), 0
        inflight: set[Future[Any]] = set()
        while True:
            while stopped is None and len(inflight) < slots and _count_finished(study) < args.target:
                inflight.add(pool.submit(ray_trial, args, k))
                k += 1
            if not inflight:
                return stopped
            done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
            for future in done:
                stopped = stopped or future.result()


def _tracking_group(study: optuna.Study, sweep: Sweep, study_name: str) -> tuple[Any, Any] | None:
    """The study's tracker group (:func:`mlmt_bench.trackers.open_group`), opened by the first
    command that runs the study and kept in its user attributes (``tracking_group``), where every
    worker, on any machine, reads it; with the run spec it came from. None without trackers."""
    from mlmt_bench.trackers import open_group

    spec = best_spec(sweep, {}, study_name)
    if not spec.tracking.report_to:
        return None
    saved = study.user_attrs.get("tracking_group")
    group = open_group([spec], study_name, "sweep", sweep.output_dir, saved)
    if group is not None and saved is None:
        study.set_user_attr("tracking_group", group.to_json())
    return spec, group


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
        if _past_target(trial, target):
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise _Surplus(f"trial {trial.number}: {target} trials were already taken")
        return _run_trial(trial, sweep, study.study_name, emit)

    def on_trial_end(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
        if is_surplus(frozen):
            return
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
        study.optimize(objective, n_trials=1, catch=(_TrialFailed, _Surplus), gc_after_trial=False,
                       callbacks=[on_trial_end])
    return failures["stopped"]


def _check_study(study: optuna.Study, sweep: Sweep, url: str) -> None:
    """A resumed study must optimise the same metric in the same direction."""
    import warnings

    import optuna

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
        with warnings.catch_warnings():  # experimental in Optuna 3.2+: the dashboard's name for the objective
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([sweep.spec.metric])
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
                            extra_manifest={"sweep": study, "trial": trial.number, "pid": os.getpid()},
                            tracking_group=trial.study.user_attrs.get("tracking_group"))
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
    run_dir = find_run_dir(sweep, study, trial.number)
    if run_dir is not None:
        trial.set_user_attr("run_dir", run_dir)


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()




def summarize(study: optuna.Study, sweep: Sweep, study_name: str, url: str, target: int) -> dict[str, Any]:
    """Trials, counts and the best trial; writes ``<study>-best.yaml`` when a trial completed."""
    from optuna.trial import TrialState

    rows = []
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if is_surplus(t):
            continue
        state = t.state.name.lower()
        counts[state] = counts.get(state, 0) + 1
        last_step = max(t.intermediate_values) if t.intermediate_values else None
        run_dir = t.user_attrs.get("run_dir")
        if run_dir is None and t.state == TrialState.FAIL:  # a dead worker's trial never recorded it
            run_dir = find_run_dir(sweep, study_name, t.number)
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
