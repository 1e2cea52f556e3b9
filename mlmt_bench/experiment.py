"""Experiments: every arm × seed of an :class:`ExperimentSpec`, then one comparison report.

Writes ``<output_dir>/<name>-<UTC stamp>/`` with ``experiment.json`` (rewritten atomically after
each run, so a crash keeps the list of finished runs; it records whether every seed starts from
one base, :func:`base_seeds`), the runs themselves, ``comparison.md`` and ``acc_vs_tokens.png``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import json
import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.notes import tell, warn
from mlmt_bench.machine.cpus import cpu_budget
from mlmt_bench.spec import ExperimentSpec, RunSpec
from mlmt_bench.trackers import close_group
from mlmt_bench.tracking import atomic_write_text, computing_versions, fresh_stamped_dir


def check_equal_budgets(exp: ExperimentSpec, arms: dict[str, RunSpec]) -> None:
    """Every arm must stop at the same budget of the kind ``exp.budget`` names (METHOD.md v2: equal
    generated tokens, or equal FLOPs), and at no budget of the other kind, which would stop it first."""
    if exp.budget == "none":
        return
    field, other = ("token_budget", "flop_budget") if exp.budget == "tokens" else ("flop_budget", "token_budget")
    budgets = {arm: getattr(s.train, field) for arm, s in arms.items()}
    if None in budgets.values() or len(set(budgets.values())) > 1:
        raise UserError(f"experiment {exp.name}: budget: {exp.budget} needs the same train.{field} in every arm, "
                        f"got {budgets}")
    extra = {arm: getattr(s.train, other) for arm, s in arms.items() if getattr(s.train, other) is not None}
    if extra:
        raise UserError(f"experiment {exp.name}: budget: {exp.budget}, but train.{other} is set in {extra}; "
                        f"set it to null")


def base_seeds(arms: dict[str, RunSpec]) -> dict[str, Any]:
    """Whether the experiment's seeds share one shared base (METHOD v4, "One checkpoint for every
    seed"), as ``experiment.json`` records it.

    An arm's base follows the run's seed unless its ``base:`` section names one (``base.seed: 10``,
    :meth:`BaseConfig.with_seed`); with a fixed base seed every seed of the arm starts from the same
    weights and the run's seed varies only RL sampling, data order and the value model's
    initialisation. Returns ``{"base_per_seed": bool, "base_seed": int | None}``: ``base_per_seed``
    is true when some arm's base follows the run's seed; ``base_seed`` is the one fixed base seed of
    every arm with a base (None when they follow the run's seed, differ, or no arm has a base: then
    every seed starts from the same given checkpoints). Arms whose fixed seeds differ add
    ``"base_seeds": {arm: seed, or None for the run's}``."""
    per_arm = {arm: (int(spec.base["seed"]) if spec.base.get("seed") is not None else None)
               for arm, spec in arms.items() if spec.base is not None}  # validated: spec.validate_run
    fixed = set(per_arm.values())
    out: dict[str, Any] = {"base_per_seed": None in fixed,
                           "base_seed": fixed.pop() if len(fixed) == 1 and None not in fixed else None}
    if len(set(per_arm.values())) > 1:
        out["base_seeds"] = per_arm
    return out


def run_experiment(exp: ExperimentSpec, arms: dict[str, RunSpec], progress: bool = True, *,
                   workers: int = 1, resume: Path | str | None = None, ray: str | None = None,
                   ray_gpus: float = 0.0, restore: list[Path] | None = None,
                   publish: Path | None = None) -> dict[str, Any]:
    """Run every arm × seed (seed-major), then compare them.

    ``workers`` > 1 runs that many runs at once, each in its own process with
    ``cpu_budget() // workers`` torch threads (the CPUs this process may use:
    :mod:`mlmt_bench.machine.cpus`) unless the spec sets ``train.threads``; each missing
    shared base is built once, by one process, before the runs that need it. ``resume`` names
    the directory of an earlier, interrupted run of the same experiment: its finished runs are
    kept (their specs must equal this spec's, the thread count, micro-batch size and gradient
    checkpointing aside), a run cut short is continued from its last checkpoint, the rest are
    started. ``restore`` names reports published with ``--raw``
    (:func:`mlmt_bench.report.publish.restore_runs`): their finished runs of this
    experiment are copied into the experiment's directory first and kept like its own, so an
    experiment too long for one machine's session goes on from what was committed; the step-0
    evaluations they published go back into the memo (:func:`~mlmt_bench.report.publish.restore_memo`).
    ``publish`` (a new directory, or a report published with ``--raw``, e.g. the one ``restore``
    names): after every finished run, the experiment so far is published there with its raw data,
    as ``mlmt-bench report EXP_DIR --out PUBLISH --raw`` does (:func:`_publish`), so a session
    that ends before the experiment does loses no finished run.

    ``ray`` (a cluster address) runs every run and base build as a Ray task instead
    (:class:`mlmt_bench.machine.cluster.RayExecutor`), with ``train.threads`` CPUs (default 1) and
    ``ray_gpus`` GPUs each, as many at once as the cluster holds; a task whose worker dies is
    retried by Ray and continues the run directory it had begun (:func:`_run_job`)."""
    from mlmt_bench.report.compare import build_comparison

    check_equal_budgets(exp, arms)
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if ray is not None:
        if workers != 1:
            raise UserError("--workers and --ray exclude each other: with --ray the cluster's resources decide how "
                            "many runs go at once")
        arms = {a: _with_threads(s, 0) for a, s in arms.items()}
    elif workers > 1:
        arms = {a: _with_threads(s, workers) for a, s in arms.items()}
    if publish is not None:  # refused before anything runs, not after the first run's hours
        from mlmt_bench.report.publish import check_publish_target

        check_publish_target(Path(publish))
    if restore:
        from mlmt_bench.report.publish import check_restorable, restore_memo, restore_runs

        for report_dir in restore:  # a wrong path fails before an experiment directory exists
            check_restorable(report_dir)
        for report_dir in restore:  # a cache: written before the experiment, whatever it then does
            n_memo = restore_memo(report_dir)
            if progress and n_memo:
                tell(f"restored {n_memo} step-0 evaluation(s) into the memo from {report_dir}")
    exp_dir, record = _open_experiment(exp, arms, resume)
    if restore:
        from mlmt_bench.report.publish import restore_wall_s

        for report_dir in restore:
            walls = restore_wall_s(report_dir)  # read (and refused) before any run is copied in
            names = restore_runs(report_dir, exp_dir, exp.name)
            for key, wall in walls.items():  # the runs' own pace, on any machine
                if _arm_of(key) in arms and isinstance(wall, (int, float)) and not isinstance(wall, bool) \
                        and math.isfinite(wall) and wall >= 0:
                    record["wall_s"].setdefault(key, float(wall))
            if progress:
                tell(f"restored {len(names)} finished run(s) of {exp.name} from {report_dir}")
    t_start = time.perf_counter()
    jobs, seed_of = _pending_jobs(exp, arms, exp_dir, record)
    group = _tracking_group(exp, arms, exp_dir, record) if jobs else None
    jobs = [dataclasses.replace(j, tracking_group=json.dumps(group.to_json())) for j in jobs] if group else jobs
    if resume is not None and not jobs:  # nothing to run: its comparison stays as it was written
        raise UserError(f"--resume {exp_dir}: every arm × seed of {exp.name!r} has finished; nothing to resume "
                        f"(to re-render its comparison: mlmt-bench report {exp_dir})")
    _check_cached_bases(jobs, record, exp_dir)
    if jobs and ray is None:  # before hours of runs that would not join (Ray's workers: checked as each ends)
        from mlmt_bench.tracking import package_versions

        join_versions(record, package_versions(), "this environment", f"experiment {exp_dir}", sets=False)
    total, n_done = len(arms) * len(exp.seeds), len(arms) * len(exp.seeds) - len(jobs)

    def finished(job: _Job, run_name: str, wall_s: float) -> None:
        nonlocal n_done
        join_base(record, json.loads((exp_dir / run_name / "manifest.json").read_text()), run_name,
                  f"experiment {exp_dir}")
        n_done += 1
        seed_of[run_name] = job.seed  # each arm's runs are listed in seed order, whatever order they end in
        runs = [*record["arms"][job.arm], run_name]
        record["arms"][job.arm] = sorted(runs, key=lambda n: exp.seeds.index(seed_of[n]))
        record["wall_s"][f"{job.arm}/s{job.seed}"] = round(wall_s, 1)
        atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
        if progress:
            tell(f"[{n_done}/{total}] {job.arm} seed {job.seed} finished in {wall_s:.0f} s: {run_name}")
        if publish is not None:
            _publish(exp_dir, Path(publish), progress, n_done)

    try:
        if ray is not None:
            from mlmt_bench.machine.cluster import RayExecutor

            cpus = max(RunSpec.model_validate_json(j.spec_json).train.threads or 1 for j in jobs) if jobs else 1
            with RayExecutor(ray, num_cpus=cpus, num_gpus=ray_gpus) as pool:
                _run_parallel(jobs, exp.name, pool.slots(), finished, progress, pool)
        elif workers == 1:
            for i, job in enumerate(jobs):
                if progress:
                    tell(f"[{n_done + 1}/{total}] {job.arm} seed {job.seed}"
                         + _to_go_text(record["wall_s"], [j.arm for j in jobs[i:]]))
                finished(job, *_run_job(job, exp.name, progress))
        else:
            _run_parallel(jobs, exp.name, workers, finished, progress)
    except BaseException:
        close_group(arms.values(), group, "failed")
        raise
    close_group(arms.values(), group, "completed")
    record["wall_s"]["total"] = round(record["wall_s"].get("total", 0.0) + time.perf_counter() - t_start, 1)
    baseline = "grpo" if "grpo" in arms else None
    summary = build_comparison({a: [exp_dir / d for d in dirs] for a, dirs in record["arms"].items()}, exp_dir,
                               baseline=baseline, title=exp.name)
    record["comparison"] = summary["files"]
    atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
    return {"run_dir": str(exp_dir), "experiment": record, "comparison": summary}


def time_to_go(wall_s: dict[str, float], pending: list[str]) -> tuple[float, int] | None:
    """Wall seconds that the ``pending`` runs (one entry per run: its arm) take one after another,
    each at its arm's mean over the finished runs in ``wall_s`` (an experiment record's
    ``{"<arm>/s<seed>": seconds}``; its ``total`` is no run), an arm with none at the mean of all
    of them; with the number of finished runs that pace is from. None before any run has finished."""
    by_arm: dict[str, list[float]] = {}
    for key, seconds in wall_s.items():
        arm = _arm_of(key)
        if arm is not None:
            by_arm.setdefault(arm, []).append(float(seconds))
    done = [s for runs in by_arm.values() for s in runs]
    if not done:
        return None
    overall = sum(done) / len(done)
    return sum(sum(by_arm[a]) / len(by_arm[a]) if a in by_arm else overall for a in pending), len(done)


def _arm_of(key: Any) -> str | None:
    """The arm of an experiment record's ``wall_s`` key ``"<arm>/s<seed>"``; None for another key
    (``total``, or anything a published record may hold)."""
    if not isinstance(key, str):
        return None
    arm, sep, seed = key.rpartition("/s")
    return arm if sep and seed.isascii() and seed.isdigit() else None


def _to_go_text(wall_s: dict[str, float], pending: list[str]) -> str:
    """`` (N runs to go: about 5 h 10 min at the pace of the K finished, one after another)``, or ""."""
    from mlmt_bench.io.progress import duration

    est = time_to_go(wall_s, pending)
    if est is None:
        return ""
    seconds, n = est
    return (f" ({len(pending)} run{'s' if len(pending) > 1 else ''} to go: about {duration(seconds)} at the pace of "
            f"the {n} finished, one after another)")


def _publish(exp_dir: Path, out: Path, progress: bool, n_runs: int) -> None:
    """Publish the experiment's finished runs with their raw data into ``out`` (``report --raw``).
    A failure is said in one line and the experiment goes on: its runs stay in ``exp_dir``, and
    the next finished run (or ``mlmt-bench report EXP_DIR --out OUT --raw``) publishes them."""
    from mlmt_bench.report.compare import report_from_dirs

    try:
        summary = report_from_dirs([exp_dir], out, raw=True)
    except (UserError, OSError, ValueError) as e:
        warn(f"publishing {exp_dir} into {out} failed ({e}); the runs are kept in {exp_dir}")
        return
    if progress:
        tell(f"published {n_runs} finished run(s) with their raw data into {out} "
             f"({summary['published']['bytes'] / 1e6:.1f} MB)")


@dataclass(frozen=True)
class _Job:
    """One arm × seed: its run spec (as JSON, to cross a process boundary) and, when an earlier
    attempt was cut short, the run directory to continue."""

    arm: str
    seed: int
    spec_json: str
    resume_dir: str | None = None
    tracking_group: str | None = None  # the experiment's tracker group (trackers.Group, as JSON)


def _with_threads(spec: RunSpec, workers: int) -> RunSpec:
    """``spec`` with ``train.threads`` = the CPUs this process may use / ``workers`` (0: one
    thread, a Ray task's CPU), unless it sets them."""
    if spec.train.threads is not None:
        return spec
    threads = max(1, cpu_budget() // workers) if workers else 1
    return spec.model_copy(update={"train": spec.train.model_copy(update={"threads": threads})}, deep=True)


def _run_spec(spec: RunSpec, exp_dir: Path, seed: int) -> RunSpec:
    return spec.model_copy(update={"seed": seed, "output_dir": str(exp_dir), "name": f"{spec.name}-s{seed}"},
                           deep=True)


def _open_experiment(exp: ExperimentSpec, arms: dict[str, RunSpec],
                     resume: Path | str | None) -> tuple[Path, dict[str, Any]]:
    if resume is None:
        Path(exp.output_dir).mkdir(parents=True, exist_ok=True)
        exp_dir = fresh_stamped_dir(Path(exp.output_dir), exp.name)
        record: dict[str, Any] = {"name": exp.name, "seeds": exp.seeds, "arms": {a: [] for a in arms},
                                  "started": _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ"), "wall_s": {},
                                  **base_seeds(arms)}
        atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
        return exp_dir, record
    exp_dir = Path(resume)
    try:
        record = json.loads((exp_dir / "experiment.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--resume {exp_dir}: not an experiment directory (experiment.json: {exc})") from None
    if record.get("name") != exp.name or sorted(record.get("arms", {})) != sorted(arms):
        raise UserError(f"--resume {exp_dir}: it holds experiment {record.get('name')!r} with arms "
                        f"{sorted(record.get('arms', {}))}, the spec is {exp.name!r} with arms {sorted(arms)}")
    record["seeds"] = sorted(set(record.get("seeds", [])) | set(exp.seeds))
    record.pop("base_seeds", None)
    record.update(base_seeds(arms))  # its finished runs are kept only if their specs are these arms'
    record.pop("comparison", None)
    return exp_dir, record


def _comparable(spec: RunSpec, cpu_dtype: str | None = None) -> dict[str, Any]:
    """A run spec's fields that decide what the run computes (not where it writes or its name).
    ``cpu_dtype``: what its CPU matmuls ran in (the manifest's, or what this machine would run),
    in place of the setting: ``auto`` is float32 on one CPU and bfloat16 on another, so a run
    finished elsewhere (``--restore``) joins only runs made in the same dtype."""
    d = spec.model_dump(mode="json")
    for key in ("name", "output_dir", "tracking"):  # trackers change nothing a run computes
        d.pop(key, None)
    # how the arithmetic is laid out, not what it computes: the same sums in another order or
    # recomputed (tests/test_memory.py), as with threads; a later run may need less memory
    d.get("train", {}).pop("threads", None)
    d.get("train", {}).pop("micro_batch_tokens", None)
    for role in (d.get("policies") or {}).values():
        if isinstance(role, dict):
            role.pop("gradient_checkpointing", None)
    if cpu_dtype is not None:
        d.setdefault("train", {})["cpu_dtype"] = cpu_dtype
    d.get("eval", {}).pop("memo", None)  # a memo gives the result the evaluation would
    return d


def _mark_abandoned(run_dir: Path) -> None:
    """A run that died before its first checkpoint (its manifest still says "running") has nothing
    to continue: it is redone as a new run, and its manifest now says "abandoned", so nobody reads
    it as live. A run another process still holds is refused (one line), not touched."""
    from mlmt_bench.tracking import RunDir, utc_now

    run = RunDir.open(run_dir)
    run.lock()
    try:
        run.update_manifest(status="abandoned", end_time=utc_now(),
                            abandoned="ended before its first checkpoint; --resume of its experiment redid it")
    finally:
        run.unlock()


def _pending_jobs(exp: ExperimentSpec, arms: dict[str, RunSpec], exp_dir: Path,
                  record: dict[str, Any]) -> tuple[list[_Job], dict[str, int]]:
    """The arm × seed runs still to do, and the seed of each finished run (by directory name). A
    finished run in ``exp_dir`` counts only if its resolved spec is this arm's; a run with a
    checkpoint but not finished is continued rather than redone; one still "running" without a
    checkpoint is marked abandoned and redone. Sets ``record["arms"]`` to the finished runs in
    seed order."""
    from mlmt_bench import runner
    from mlmt_bench.spec import load_run_spec

    finished, partial, dead = {}, {}, []
    for manifest_path in sorted(exp_dir.glob("*/manifest.json")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        key = (manifest.get("arm"), manifest.get("seed"))
        if manifest.get("experiment") != exp.name or key[0] not in arms:
            continue
        run_dir = manifest_path.parent
        if manifest.get("status") == "completed":
            join_base(record, manifest, run_dir.name, f"--resume {exp_dir}")
            want_spec = _run_spec(arms[key[0]], exp_dir, key[1])
            ran = (manifest.get("cpu_dtype") or {}).get("dtype")
            want = _comparable(want_spec, runner.cpu_dtype(want_spec)["dtype"] if ran else None)
            have = _comparable(load_run_spec(run_dir / "spec.resolved.yaml"), ran)
            ran_here = want.get("train", {}).get("cpu_dtype")
            if ran and ran_here != ran and {**want, "train": {**want["train"], "cpu_dtype": ran}} == have:
                raise UserError(f"--resume {exp_dir}: finished run {run_dir.name} ({key[0]}, seed {key[1]}) ran its "
                                f"CPU matmuls in {ran}, this machine would run the rest in {ran_here}; set "
                                f"train.cpu_dtype: {ran} in the spec, so that every run of the experiment computes "
                                "in one dtype")
            if want != have:
                diff = sorted(k for k in want if want.get(k) != have.get(k))
                raise UserError(f"--resume {exp_dir}: finished run {run_dir.name} ({key[0]}, seed {key[1]}) was made "
                                f"with a different spec (fields {diff}); start a new experiment instead")
            finished[key] = run_dir.name
        elif any((run_dir / "checkpoints").glob("*")):
            join_base(record, manifest, run_dir.name, f"--resume {exp_dir}")
            partial[key] = str(run_dir)
        elif manifest.get("status") == "running":
            dead.append(run_dir)
    for run_dir in dead:  # once every finished run has passed its check: a refused resume marks nothing
        _mark_abandoned(run_dir)
    for arm in arms:  # the record lists exactly the finished runs, in seed order
        record["arms"][arm] = [finished[(arm, s)] for s in exp.seeds if (arm, s) in finished]
    jobs = [_Job(arm, seed, _run_spec(spec, exp_dir, seed).model_dump_json(), partial.get((arm, seed)))
            for seed in exp.seeds for arm, spec in arms.items() if (arm, seed) not in finished]
    return jobs, {name: seed for (_, seed), name in finished.items()}


def join_base(record: dict[str, Any], manifest: dict[str, Any], run_name: str, where: str) -> None:
    """Admit a run's shared base into the experiment: every run of one base config (its key:
    seed, preset, data, ...) must have started from the same weights. The first run records the
    weights' sha256 under ``record["bases"][key]``; a run whose base hash differs (a base built
    on another machine, or unpinned) is refused with one line. Likewise a pretrained model's warm
    start: every run of one warm-start key must have loaded the same weights (``record["warm_starts"]``)."""
    _join_warm_start(record, manifest, run_name, where)
    join_versions(record, manifest.get("versions") or {},
                  f"run {run_name} ({manifest.get('arm')}, seed {manifest.get('seed')})", where)
    base = manifest.get("base")
    if not base:
        return
    bases = record.setdefault("bases", {})
    env = base.get("environment") or {}
    have = bases.setdefault(base["key"], {"sha256": base.get("sha256"), "seed": base.get("seed"),
                                          "preset": base.get("preset"), "cpu": env.get("cpu"),
                                          "pinned": env.get("pinned")})
    if have["sha256"] != base.get("sha256"):
        raise UserError(f"{where}: run {run_name} ({manifest.get('arm')}, seed {manifest.get('seed')}) started from "
                        f"base {base['key']} ({base.get('preset')}, seed {base.get('seed')}) with weights sha256 "
                        f"{_short(base.get('sha256'))} (cpu {env.get('cpu')!r}, pinned {env.get('pinned')}), but "
                        f"the experiment's runs of that base have {_short(have['sha256'])} (cpu {have.get('cpu')!r}, "
                        f"pinned {have.get('pinned')}); it does not join the experiment: rebuild the base with the "
                        "CPU pin on (MLMT_BENCH_CPU_PIN unset) and redo the run, or start a new experiment")


def _join_warm_start(record: dict[str, Any], manifest: dict[str, Any], run_name: str, where: str) -> None:
    warm = manifest.get("warm_start")
    if not warm or not warm.get("sha256"):
        return
    have = record.setdefault("warm_starts", {}).setdefault(warm["key"], {"sha256": warm["sha256"], "first": run_name})
    if have["sha256"] != warm["sha256"]:
        raise UserError(f"{where}: run {run_name} ({manifest.get('arm')}, seed {manifest.get('seed')}) loaded warm "
                        f"start {warm['key']} with weights sha256 {_short(warm['sha256'])}, but run {have['first']} "
                        f"of the experiment loaded {_short(have['sha256'])} (a warm start built on another machine); "
                        "it does not join the experiment: ship the first one (mlmt_bench.warmstart."
                        "shipped_warm_starts) and redo the run, or start a new experiment")


def join_versions(record: dict[str, Any], versions: dict[str, str], who: str, where: str,
                  sets: bool = True) -> None:
    """Admit one set of package versions (``who``'s: a run's manifest ``versions``, or this
    environment's before runs start in it, ``sets=False``: checked, never recorded) into the
    experiment. The first run's set ``record["versions"]`` (the computing packages only,
    :data:`mlmt_bench.tracking.COMPUTING_PACKAGES`); a set
    that differs in any package both have is refused with one line naming each difference and the
    ``pip install`` that restores the experiment's. A run without recorded versions joins unchecked."""
    mine = computing_versions(versions)
    if not mine or ("versions" not in record and not sets):
        return
    have = record.setdefault("versions", {"packages": mine, "from": who})
    differ = sorted(k for k in mine if k in have["packages"] and have["packages"][k] != mine[k])
    if differ:
        said = ", ".join(f"{k} {mine[k]} where the experiment has {have['packages'][k]}" for k in differ)
        pins = " ".join(f"{k}=={have['packages'][k]}" for k in differ)
        raise UserError(f"{where}: {who} has {said} (from {have['from']}); one experiment computes with one set of "
                        f"versions: pip install {pins}, or start a new experiment")


def _short(sha: str | None) -> str:
    return sha[:16] if sha else "none (a base built before weight hashes)"


def _check_cached_bases(jobs: list[_Job], record: dict[str, Any], exp_dir: Path) -> None:
    """Before any run starts: a base this experiment already used that is in this machine's cache
    with other weights (built elsewhere or unpinned) refuses the runs that would start from it."""
    from mlmt_bench import runner
    from mlmt_bench.warmstart.shared_base import ensure_base, is_cached

    known = record.get("bases") or {}
    for job in jobs:
        spec = RunSpec.model_validate_json(job.spec_json)
        if spec.base is None or job.resume_dir is not None:
            continue
        cfg = runner.base_config(spec)
        if cfg.key() in known and is_cached(cfg):
            base = ensure_base(cfg, progress=False, require_valid=False)
            join_base(record, {"base": base.summary(), "arm": job.arm, "seed": job.seed},
                      f"(not started) {spec.name}", f"--resume {exp_dir}")


def _run_job(job: _Job, exp_name: str, progress: bool, again: bool = False) -> tuple[str, float]:
    """Runs one job in this process; returns the run directory's name and its wall time (s).

    ``again``: the job may have been begun before (a Ray task retried after its worker died): a run
    directory of this arm × seed left by an earlier attempt is continued (from its last
    checkpoint, or from the start), and a finished one is returned as it is, so that no run is
    done twice or left behind."""
    from mlmt_bench import runner

    t0 = time.perf_counter()
    spec = RunSpec.model_validate_json(job.spec_json)
    earlier = job.resume_dir or (_earlier_attempt(Path(spec.output_dir), exp_name, job) if again else None)
    if earlier is not None and _status(Path(earlier)) == "completed":
        return Path(earlier).name, time.perf_counter() - t0
    if earlier is not None:
        result = runner.resume_run(earlier, progress=progress)
    else:
        result = runner.run(spec, progress=progress, extra_manifest={"arm": job.arm, "experiment": exp_name},
                            tracking_group=json.loads(job.tracking_group) if job.tracking_group else None)
    _release_run_memory()
    return Path(result["run_dir"]).name, time.perf_counter() - t0


def _release_run_memory() -> None:
    """The next run in this process starts from what the last one left: its models are garbage
    once it returns (reference cycles included, hence the collection), and the heap pages they
    held go back to the kernel instead of waiting for allocations that fit them."""
    from mlmt_bench.machine import memory

    gc.collect()
    if not memory.TRACKER.cuda:
        memory.release_freed_heap()


def _status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _earlier_attempt(exp_dir: Path, exp_name: str, job: _Job) -> str | None:
    """The run directory an earlier attempt of ``job`` made in ``exp_dir`` (its manifest names the
    experiment, arm and seed), if any; the newest when there are several."""
    found = []
    for manifest in exp_dir.glob("*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if (m.get("experiment"), m.get("arm"), m.get("seed")) == (exp_name, job.arm, job.seed):
            found.append((m.get("start_time") or "", str(manifest.parent)))
    return max(found)[1] if found else None


def _tracking_group(exp: ExperimentSpec, arms: dict[str, RunSpec], exp_dir: Path, record: dict[str, Any]) -> Any:
    """The experiment's tracker group (:func:`mlmt_bench.trackers.open_group`: an MLflow parent run
    ...), opened once here and kept in ``experiment.json`` for a resume; None without trackers."""
    from mlmt_bench.trackers import open_group

    group = open_group(arms.values(), exp_dir.name, "experiment", exp.output_dir, record.get("tracking_group"))
    if group is not None and "tracking_group" not in record:
        record["tracking_group"] = group.to_json()
        atomic_write_text(exp_dir / "experiment.json", json.dumps(record, indent=2))
    return group


def _build_base(spec_json: str, progress: bool) -> str:
    """Builds a shared base in a worker process, its progress and check as plain lines on stderr."""
    from mlmt_bench import runner
    from mlmt_bench.io.progress import plain_lines
    from mlmt_bench.warmstart.shared_base import ensure_base

    plain_lines()
    cfg = runner.base_config(RunSpec.model_validate_json(spec_json))
    return ensure_base(cfg, progress=progress).summary()["key"]


def _run_parallel(jobs: list[_Job], exp_name: str, workers: int,
                  finished: Callable[[_Job, str, float], None], progress: bool, executor: Any = None) -> None:
    """Runs ``jobs`` in ``workers`` processes (spawned: no torch state is forked), keeping every
    process busy. Missing shared bases are built by up to half the processes (all, when no run can
    start), each by one process only; the others take the first job (in seed-major order) whose
    base is in the cache. On a failure the work under way finishes, nothing new starts, and the
    first error is raised. ``executor``: where the work goes instead of local processes (a
    :class:`mlmt_bench.machine.cluster.RayExecutor`; ``workers``: its slots)."""
    from mlmt_bench import runner
    from mlmt_bench.warmstart.shared_base import is_cached

    base_of: dict[int, str | None] = {}
    configs: dict[str, Any] = {}
    missing: dict[str, str] = {}  # base key -> a job spec that needs it, in job order
    for i, job in enumerate(jobs):
        spec = RunSpec.model_validate_json(job.spec_json)
        cfg = runner.base_config(spec) if spec.base is not None and job.resume_dir is None else None
        base_of[i] = cfg.key() if cfg is not None else None
        if cfg is not None and not is_cached(cfg):
            configs[cfg.key()] = cfg
            missing.setdefault(cfg.key(), job.spec_json)
    queue = list(range(len(jobs)))
    building: set[str] = set()
    inflight: dict[Future, tuple[str, Any]] = {}
    error: BaseException | None = None
    ctx = multiprocessing.get_context("spawn")
    with executor or ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        while (queue and error is None) or inflight:
            while error is None and len(inflight) < workers:
                for built in [k for k in missing if k not in building and is_cached(configs[k])]:
                    missing.pop(built)  # built meanwhile by another process (e.g. `mlmt-bench base`)
                ready = next((i for i in queue if base_of[i] is None or base_of[i] not in missing), None)
                key = next((k for k in missing if k not in building), None)
                # long base builds start early, on half the processes, so that no run waits at the end
                if key is not None and (ready is None or len(building) < max(1, workers // 2)):
                    building.add(key)
                    inflight[pool.submit(_build_base, missing[key], progress)] = ("base", key)
                elif ready is not None:
                    queue.remove(ready)
                    inflight[pool.submit(_run_job, jobs[ready], exp_name, False, executor is not None)] = ("run", ready)
                else:
                    break
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for future in done:
                kind, what = inflight.pop(future)
                try:
                    result = future.result()
                except BaseException as exc:  # noqa: BLE001 - re-raised once the work under way is done
                    building.discard(what)
                    if error is None:
                        error = exc
                        if progress:
                            where = f"base {what}" if kind == "base" else f"{jobs[what].arm} seed {jobs[what].seed}"
                            tell(f"{where} failed: {exc}; nothing new starts")
                    continue
                if kind == "base":  # the worker said it is ready, with its check
                    missing.pop(what)
                    building.discard(what)
                else:
                    finished(jobs[what], *result)
    if error is not None:
        raise error
