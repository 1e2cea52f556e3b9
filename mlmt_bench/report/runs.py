"""Loading run directories for reports: one :class:`RunRecord` per run, and arms from experiment
directories (docs/run-directory.md describes the files).

``metrics.jsonl`` gives the eval curve and the ``final`` record, ``eval_problems.jsonl`` the
per-problem correctness at every evaluation (step 0 included), ``manifest.json`` the arm and seed,
``spec.resolved.yaml`` the protocol (benchmark, split, evaluation settings) a report must not mix.
A log may be gzip-compressed as ``<name>.jsonl.gz`` (a report published with its raw data,
:mod:`mlmt_bench.report.publish`): :func:`log_file` finds either.

A run directory may come from someone else, so every file of it is read within the limits of
:mod:`mlmt_bench.io.bounded_input` (a size limit per JSON file, the spec limits for the YAML, a line
and a decompressed-size limit for the logs): a crafted one is a one-line error, never a
MemoryError.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import echo, echo_path, is_name, read_json, read_yaml_file
from mlmt_bench.report.numbers import is_num as is_num  # re-exported: reports read it from here
from mlmt_bench.report.run_time import RUN_TIME_KEYS, run_time
from mlmt_bench.tracking import read_jsonl_lines

# A run directory is ``<name>-<YYYYmmddTHHMMSSZ>`` with ``-<i>`` when two started the same second.
_STAMP_RE = re.compile(r"-\d{8}T\d{6}Z(?:-\d+)?$")

@dataclass
class RunRecord:
    """What a comparison needs from one run directory.

    final:    the ``final`` record of metrics.jsonl (or the last ``eval`` record when the run has
              none, e.g. it was interrupted; ``has_final`` says which).
    curve:    ``eval`` records, one per step (the last one logged wins), sorted by step.
    by_step:  per-problem correctness at every evaluated step, ``{step: {problem_id: {"t1", "t2",
              "t2_null", "t2_base_critic"}}}``; empty when the run wrote no eval_problems.jsonl.
    problems: (property) that of the final eval step (``final_step``).
    first:    (property) that of the first evaluation (step 0: the arm's starting point).
    train:    ``train`` records (one per step, the last one logged wins), sorted by step; under
              ``at_flops``, those up to the step the run is read at.
    algorithm: the algorithm's registry name (spec.resolved.yaml), None when not recorded.
    spec:     the run's spec.resolved.yaml as read ({} when the run has none).
    protocol: what a report must not mix: benchmark and options, evaluated split, evaluation
              settings (from spec.resolved.yaml; empty when the run has none).
    read_at:  when the run is read at a FLOPs budget B (``load_run(..., at_flops=B)``):
              ``{"flops_budget": B, "step", "flops", "gen_tokens", "reached", "ratio", "within"}``,
              the evaluation used (:func:`_cut_at_flops`: the one nearest B within
              ±``AT_FLOPS_TOLERANCE``·B, else the last one below B; ``ratio``: its flops / B;
              ``within``: it is within the tolerance; ``reached``: the run spent B or more in
              all), else None.
    """

    path: Path
    name: str
    arm: str
    seed: int | None
    status: str | None
    manifest: dict[str, Any]
    final: dict[str, Any]
    has_final: bool
    curve: list[dict[str, Any]]
    final_step: int | None
    by_step: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    read_at: dict[str, Any] | None = None
    algorithm: str | None = None
    train: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def problems(self) -> dict[str, dict[str, Any]]:
        return self.by_step.get(self.final_step, {}) if self.final_step is not None else {}

    @property
    def first(self) -> dict[str, dict[str, Any]]:
        return self.by_step[min(self.by_step)] if self.by_step else {}

    def outcomes(self, turn: str = "t2", at: str | int = "final") -> dict[str, float]:
        """``{problem id: 0/1}`` of ``turn`` ("t1", "t2", "t2_null") at the final or first
        evaluation, or at the evaluation of step ``at`` (empty when none was logged there)."""
        rows = self.problems if at == "final" else self.first if at == "first" else self.by_step.get(int(at), {})
        return {pid: float(r[turn]) for pid, r in rows.items() if r.get(turn) is not None}

    def curve_xy(self, x_key: str, y_key: str = "acc@t2") -> tuple[list[float], list[float]]:
        """Points (x, y) of the eval curve where both are recorded."""
        xs, ys = [], []
        for rec in self.curve:
            x, y = rec.get(x_key), acc_t2(rec) if y_key == "acc@t2" else rec.get(y_key)
            if is_num(x) and is_num(y):
                xs.append(float(x))
                ys.append(float(y))
        return xs, ys


#: a ``step`` of a log record must be an integer in [0, MAX_STEP) (a float that is one, e.g. 3.0, too)
MAX_STEP = 2 ** 53


def record_step(rec: dict[str, Any], where: str) -> int | None:
    """The ``step`` of a log record as an int (None when absent); a one-line UserError naming
    ``where`` (``file:line``) when it is not a step count (a string, NaN, -1, 2.5, 10**30)."""
    step = rec.get("step")
    if step is None:
        return None
    if not is_num(step) or step != int(step) or not 0 <= step < MAX_STEP:
        from mlmt_bench.io.bounded_input import echo

        raise UserError(f"{where}: 'step' must be a whole number of steps, got {echo(step)}")
    return int(step)


def acc_t2(rec: dict[str, Any]) -> Any:
    """acc@t2 of a record; single-turn runs (GRPO) have acc@t2 = acc@t1 (run-directory.md)."""
    for key in ("acc@t2", "acc@t1", "acc"):
        if is_num(rec.get(key)):
            return rec[key]
    return None


def strip_stamp(name: str) -> str:
    """``grpo-20250101T120000Z`` (or ``...Z-1``) -> ``grpo``."""
    return _STAMP_RE.sub("", name)


def log_file(run_dir: Path, name: str) -> Path:
    """``run_dir / name`` (e.g. ``metrics.jsonl``), or its gzip copy ``name + ".gz"`` when only that
    exists (the reader recognises gzip by its magic bytes); ``run_dir / name`` when neither does."""
    plain = Path(run_dir) / name
    packed = plain.with_name(name + ".gz")
    return packed if not plain.is_file() and packed.is_file() else plain


def _read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of a JSONL file, as tracking.read_jsonl_lines parses it (a torn
    last line is ignored, any other bad line is a file:line UserError); each record must be an
    object."""
    out = read_jsonl_lines(path)
    for lineno, rec in out:
        if not isinstance(rec, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
    return out


def load_run(path: Path | str, at_flops: float | None = None) -> RunRecord:
    """Read one run directory; a :class:`UserError` (one line) if it cannot be compared.

    ``at_flops``: read the run as if it had stopped at that FLOPs budget: its ``final`` and
    ``problems`` become those of its evaluation nearest the budget within ±10% (else of its last
    evaluation below it, flagged: :func:`_cut_at_flops`), and the curve ends there.
    This equals a run stopped by ``train.flop_budget`` only for an algorithm whose steps do not
    depend on the budget (``Algorithm.budget_dependent``: not ``self_correct``, whose stage switch
    is a share of it); a report says which evaluation each run was read at (``read_at``)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a directory")
    metrics_path = log_file(path, "metrics.jsonl")
    manifest_path = path / "manifest.json"
    if not metrics_path.is_file() and not manifest_path.is_file():
        raise UserError(f"{path}: not a run directory (no manifest.json / metrics.jsonl)")
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        manifest = read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise UserError(f"{manifest_path}: expected a JSON object")
    if not metrics_path.is_file():
        raise UserError(f"{path}: no metrics.jsonl (the run wrote no metrics yet)")

    records = _read_records(metrics_path)
    by_step: dict[int, dict[str, Any]] = {}
    final: dict[str, Any] | None = None
    value_ev: dict[int, float] = {}
    train: dict[int, dict[str, Any]] = {}
    for lineno, rec in records:
        kind = rec.get("kind")
        step = record_step(rec, f"{metrics_path}:{lineno}") if kind in ("eval", "final", "train") else None
        if kind == "eval":
            by_step[step if step is not None else len(by_step)] = _with_derived(rec)  # last logged per step wins
        elif kind == "final":
            final = _with_derived(rec)
        elif kind == "train" and step is not None:
            train[step] = rec
            if is_num(rec.get(VALUE_EV)):
                value_ev[step] = float(rec[VALUE_EV])
    if not by_step and final is None:
        raise UserError(f"{metrics_path}: no eval records (the run has not been evaluated yet)")
    curve = [by_step[s] for s in sorted(by_step)]
    _attach_value_ev(curve, value_ev)
    has_final = final is not None
    if final is None:
        final = curve[-1]
    read_at = None
    if at_flops is not None:
        curve, final, read_at = _cut_at_flops(curve, final, float(at_flops), metrics_path)
    if value_ev:
        within = [v for s, v in value_ev.items() if not is_num(final.get("step")) or s <= final["step"]]
        final = {**final, "value_ev_mean": float(sum(within) / len(within)) if within else None}

    final_step = final.get("step") if is_num(final.get("step")) else None
    final = {**final, **run_time([rec for _, rec in records], int(final_step) if read_at and final_step is not None
                                 else None)}
    trained = [train[s] for s in sorted(train) if read_at is None or final_step is None or s <= final_step]
    problems_at = _problems_by_step(log_file(path, "eval_problems.jsonl"))
    if problems_at:
        final_step = int(final_step) if is_num(final_step) and int(final_step) in problems_at else max(problems_at)

    name = str(manifest.get("name") or strip_stamp(path.name))
    arm = str(manifest.get("arm") or strip_stamp(name))
    seed = manifest.get("seed")
    return RunRecord(
        path=path, name=name, arm=arm,
        seed=int(seed) if is_num(seed) else None,
        status=manifest.get("status"), manifest=manifest,
        final=final, has_final=has_final, curve=curve,
        final_step=int(final_step) if final_step is not None else None,
        by_step=problems_at, read_at=read_at, train=trained, **_from_spec(path / "spec.resolved.yaml"),
    )


#: ``report --at-flops B`` reads a run at an evaluation within this share of B (METHOD v4,
#: "Budgets that are budgets"); a run with none there is read below B and flagged in its cell
AT_FLOPS_TOLERANCE = 0.10


def near_budget(flops: float, budget: float) -> bool:
    """Whether ``flops`` is within ``AT_FLOPS_TOLERANCE`` of ``budget`` (both FLOPs)."""
    return abs(flops - budget) <= AT_FLOPS_TOLERANCE * budget


def _cut_at_flops(curve: list[dict[str, Any]], final: dict[str, Any], budget: float,
                  where: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The curve up to the evaluation a run is read at under a FLOPs ``budget``, that evaluation,
    and where it is (``RunRecord.read_at``). The evaluation: the one nearest the budget among those
    within ±``AT_FLOPS_TOLERANCE``·budget (the lower one on a tie), so that a run stopped by
    ``train.flop_budget`` just after crossing it is read at its end; else the last one below the
    budget, which the report flags (``within`` false: that run is not read at equal FLOPs)."""
    evals = [rec for rec in curve if is_num(rec.get("flops"))]
    near = [rec for rec in evals if near_budget(rec["flops"], budget)]
    below = [rec for rec in evals if rec["flops"] <= budget]
    if not near and not below:
        raise UserError(f"{where}: no evaluation within {budget:.3g} FLOPs (the runs log no flops, or "
                        "the budget is below the first evaluation)")
    at = min(near, key=lambda rec: (abs(rec["flops"] - budget), rec["flops"])) if near else below[-1]
    spent = final.get("flops") if is_num(final.get("flops")) else curve[-1].get("flops")
    reached = bool(is_num(spent) and spent >= budget)
    info = {"flops_budget": budget, "step": at.get("step"), "flops": at["flops"],
            "gen_tokens": at.get("gen_tokens"), "reached": reached,
            "ratio": at["flops"] / budget if budget else None, "within": bool(near)}
    return evals[: next(i for i, rec in enumerate(evals) if rec is at) + 1], at, info


def _problems_by_step(path: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """Per-problem correctness at every evaluated step; a resumed run may repeat a step: the
    last line wins."""
    if not path.is_file():
        return {}
    by_step: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for lineno, row in _read_records(path):
        step, pid = record_step(row, f"{path}:{lineno}"), row.get("problem_id")
        if step is None or pid is None or "t1" not in row:
            raise UserError(f"{path}:{lineno}: record lacks step / problem_id / t1")
        t1 = bool(row["t1"])
        t2 = bool(row["t2"]) if row.get("t2") is not None else t1
        null, bc = row.get("t2_null"), row.get("t2_base_critic")
        by_step[int(step)][str(pid)] = {"t1": t1, "t2": t2, "t2_null": None if null is None else bool(null),
                                        "t2_base_critic": None if bc is None else bool(bc),
                                        **{k: bool(row[k]) for k in COPY_CHANNEL_ROWS if row.get(k) is not None}}
    return dict(by_step)


#: the value model's out-of-sample skill, logged per training step (algorithms/value.py)
VALUE_EV = "value/explained_variance"
#: METHOD v3: a run whose mean explained variance stays below this is reported "value not exercised"
VALUE_EXERCISED_EV = 0.1
#: eval-record keys of the single-turn arm's refine evaluation with the frozen base critic
BASE_CRITIC_PREFIX = "base_critic/"
#: eval-record keys of the final evaluation repeated with redaction off (METHOD v4, ``feedback.eval_unredacted``)
UNREDACTED_PREFIX = "unredacted/"
#: per-problem keys of METHOD v4's copy-channel rows (eval_problems.jsonl): the critic's stated
#: answer scored (its own evaluation, and the base critic's), and the refinement without redaction
#: (after its own critic's feedback, and after the base critic's)
COPY_CHANNEL_ROWS = ("t2_critic_solver", "t2_base_critic_solver", "t2_unredacted", "t2_base_critic_unredacted")


def _with_derived(rec: dict[str, Any]) -> dict[str, Any]:
    """An eval (or final) record with what reports derive from it: test-time generated tokens per
    problem (``test_tokens_per_problem``) and test-time FLOPs per problem (``test_flops_per_problem``:
    ``2·P·(prompt + generated)`` of every turn of the evaluation, each role at its model's P, as the
    trainer logs it in ``test_flops_eval``; absent in runs from before it did), also for its
    base-critic evaluation."""
    out = dict(rec)
    n = rec.get("n")
    for prefix in ("", BASE_CRITIC_PREFIX, UNREDACTED_PREFIX):
        for total, per_problem in (("gen_tokens_eval", "test_tokens_per_problem"),
                                   ("test_flops_eval", "test_flops_per_problem")):
            value = rec.get(f"{prefix}{total}")
            if is_num(value) and is_num(n) and n:
                out[f"{prefix}{per_problem}"] = value / n
    return out


def _attach_value_ev(curve: list[dict[str, Any]], value_ev: dict[int, float]) -> None:
    """Each evaluation gets ``value_ev``: the mean explained variance of the training steps since
    the evaluation before it (its curve in the report)."""
    prev = -1
    for rec in curve:
        step = rec.get("step")
        if not is_num(step):
            continue
        window = [v for s, v in value_ev.items() if prev < s <= step]
        if window:
            rec["value_ev"] = sum(window) / len(window)
        prev = int(step)


def with_base_critic(run: RunRecord) -> RunRecord | None:
    """The run read in its ``eval.base_critic`` evaluation (the ``<arm> + base critic`` row: the
    same solver, refined after the frozen base's feedback), or None when it has none."""
    if not any(k.startswith(BASE_CRITIC_PREFIX) for k in run.final):
        return None

    def read(rec: dict[str, Any]) -> dict[str, Any]:
        own = {k: v for k, v in rec.items() if not k.startswith(BASE_CRITIC_PREFIX)
               and k in (*_OWN_KEYS, "value_ev_mean")}
        return {**own, **{k[len(BASE_CRITIC_PREFIX):]: v for k, v in rec.items() if k.startswith(BASE_CRITIC_PREFIX)}}

    def rows(by_pid: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {pid: {"t1": r["t1"], "t2": r["t2_base_critic"], "t2_null": None,
                      **({"t2_critic_solver": r["t2_base_critic_solver"]} if "t2_base_critic_solver" in r else {}),
                      **({"t2_unredacted": r["t2_base_critic_unredacted"]} if "t2_base_critic_unredacted" in r else {})}
                for pid, r in by_pid.items() if r.get("t2_base_critic") is not None}

    return dataclasses.replace(run, arm=f"{run.arm} + base critic", final=read(run.final),
                               curve=[read(r) for r in run.curve],
                               by_step={s: rows(by) for s, by in run.by_step.items()})


#: Fields of a run spec that define what its numbers mean: runs that differ in one are never
#: compared in one table.
PROTOCOL_FIELDS = (("benchmark", "name"), ("benchmark", "options"), ("benchmark", "eval_split"),
                   ("benchmark", "eval_limit"), ("eval", "limit"), ("eval", "temperature"))


def _from_spec(path: Path) -> dict[str, Any]:
    """``{"protocol": {...}, "algorithm": name, "spec": the spec}`` from a run's spec.resolved.yaml
    (empty, None, {} without it)."""
    if not path.is_file():
        return {"protocol": {}, "algorithm": None, "spec": {}}
    spec = read_yaml_file(path) or {}  # an alias bomb or a 3 GiB file: one line, not a MemoryError
    if not isinstance(spec, dict):
        return {"protocol": {}, "algorithm": None, "spec": {}}
    out = {}
    for section, key in PROTOCOL_FIELDS:
        part = spec.get(section)
        if isinstance(part, dict) and key in part:
            out[f"{section}.{key}"] = part[key]
    algorithm = spec.get("algorithm")
    name = algorithm.get("name") if isinstance(algorithm, dict) else None
    return {"protocol": out, "algorithm": str(name) if name is not None else None, "spec": spec}


# ---------------------------------------------------------------------------------------------
# grouping run directories into arms


def _experiment_arms(exp_dir: Path) -> dict[str, list[Path]]:
    path = exp_dir / "experiment.json"
    arms = experiment_record(exp_dir).get("arms")
    if not isinstance(arms, dict) or not arms:
        raise UserError(f"{path}: no 'arms' mapping of arm -> run directories")
    out: dict[str, list[Path]] = {}
    for arm, entries in arms.items():
        key = arm if is_name(arm) else "(a key not shown)"
        if isinstance(entries, (str, dict)):
            entries = [entries]
        if not isinstance(entries, list):
            raise UserError(f"{path}: arms.{key} must be a list of run directories")
        dirs = []
        for e in entries:
            p = e.get("run_dir") or e.get("path") if isinstance(e, dict) else e
            if not isinstance(p, str):
                raise UserError(f"{path}: arms.{key}: cannot read a run directory from {echo(e)}")
            run = Path(p)
            try:
                if not run.is_absolute() and ((exp_dir / run).exists() or not run.exists()):
                    run = exp_dir / run  # relative to the experiment directory (else to the working directory)
                found = run.is_dir()
            except (OSError, ValueError):  # a name too long for the system, a NUL byte
                found = False
            if not found:
                raise UserError(f"{path}: arms.{key}: run directory {echo_path(p)} not found (relative to {exp_dir} "
                                "or to the working directory); a report copied without its runs cannot be re-rendered: "
                                "publish it with `mlmt-bench report EXP_DIR --out DIR --raw`")
            dirs.append(run)
        out[str(arm)] = dirs
    return out


def experiment_record(exp_dir: Path) -> dict[str, Any]:
    """The experiment.json of an experiment (or published report) directory; {} when there is none."""
    path = Path(exp_dir) / "experiment.json"
    if not path.is_file():
        return {}
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def group_runs(paths: list[Path]) -> dict[str, list[Path]]:
    """Arms of run / experiment directories: an experiment dir (holding experiment.json) gives
    its arms; a run dir goes to its manifest's ``arm`` (else its name without the timestamp)."""
    arms: dict[str, list[Path]] = {}
    for p in map(Path, paths):
        if (p / "experiment.json").is_file():
            for arm, dirs in _experiment_arms(p).items():
                arms.setdefault(arm, []).extend(dirs)
        else:
            arms.setdefault(load_run(p).arm, []).append(p)
    return arms


#: what a base-critic or copy-channel row keeps of its run's records besides what it derives: the run's cost
_OWN_KEYS = ("kind", "step", "gen_tokens", "trained_tokens", "flops", "wall_s", "n", *RUN_TIME_KEYS)


def with_critic_solver(run: RunRecord) -> RunRecord | None:
    """The run's critic scored as a second solver (METHOD v4; ``acc_critic_as_solver``): acc@t2 is
    the share of problems whose answer the critic's feedback states is right, with no refinement,
    at the attempt's and the feedback's test-time tokens; None when the run logged none."""
    if not is_num(run.final.get("acc_critic_as_solver")):
        return None

    def read(rec: dict[str, Any]) -> dict[str, Any]:
        own = {k: v for k, v in rec.items() if k in _OWN_KEYS}
        if not is_num(rec.get("acc_critic_as_solver")):
            return own
        return {**own, "acc@t1": rec.get("acc@t1"), "acc@t2": rec["acc_critic_as_solver"],
                "critic_states_answer_rate": rec.get("critic_states_answer_rate"),
                "test_tokens_per_problem": rec.get("critic_as_solver_tokens")}

    def rows(by_pid: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {pid: {"t1": r["t1"], "t2": r["t2_critic_solver"], "t2_null": None}
                for pid, r in by_pid.items() if r.get("t2_critic_solver") is not None}

    name = f"{run.arm} as second solver" if run.arm.endswith(" critic") else f"{run.arm} critic as second solver"
    return dataclasses.replace(run, arm=name, final=read(run.final), curve=[read(r) for r in run.curve],
                               by_step={s: rows(by) for s, by in run.by_step.items()})


def with_unredacted(run: RunRecord) -> RunRecord | None:
    """The run's final evaluation repeated with redaction off (METHOD v4, ``feedback.eval_unredacted``:
    the ``<arm> without redaction`` row), or None when it has none. Only the final evaluation ran
    both ways, so the row has no curve and no step-0 point."""
    if not any(k.startswith(UNREDACTED_PREFIX) for k in run.final):
        return None

    def read(rec: dict[str, Any]) -> dict[str, Any]:
        own = {k: v for k, v in rec.items() if k in _OWN_KEYS}
        return {**own, **{k[len(UNREDACTED_PREFIX):]: v for k, v in rec.items() if k.startswith(UNREDACTED_PREFIX)}}

    def rows(by_pid: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {pid: {"t1": r["t1"], "t2": r["t2_unredacted"], "t2_null": None}
                for pid, r in by_pid.items() if r.get("t2_unredacted") is not None}

    return dataclasses.replace(run, arm=f"{run.arm} without redaction", final=read(run.final),
                               curve=[read(r) for r in run.curve if any(k.startswith(UNREDACTED_PREFIX) for k in r)],
                               by_step={s: rows(by) for s, by in run.by_step.items()})


def own_arms(loaded: dict[str, list[RunRecord]]) -> dict[str, list[RunRecord]]:
    """The arms without the rows derived from another arm's runs (``<arm> + base critic``,
    ``<arm> without redaction``, ...: :func:`with_base_critic_arms` lists each after its arm), so
    that each run counts once, under its own arm."""
    seen: set[str] = set()
    out = {}
    for arm, results in loaded.items():
        paths = {str(r.path) for r in results}
        if not paths <= seen or not paths:
            out[arm] = results
        seen |= paths
    return out


def with_base_critic_arms(loaded: dict[str, list[RunRecord]]) -> dict[str, list[RunRecord]]:
    """Each arm followed by its derived rows, where its runs logged them: ``<arm> without
    redaction`` and ``<arm> critic as second solver`` (METHOD v4's copy-channel controls), then
    ``<arm> + base critic`` (METHOD v3, equal test-time compute), that critic as second solver and
    its row without redaction."""
    out: dict[str, list[RunRecord]] = {}

    def add(results: list[RunRecord], derive: Any, name: str) -> list[RunRecord]:
        """The derived records, named by the report's arm (a run's own ``arm`` may be its spec's name)."""
        derived = [dataclasses.replace(d, arm=name) for d in map(derive, results) if d is not None]
        if derived:
            out[name] = derived
        return derived

    for arm, results in loaded.items():
        out[arm] = results
        add(results, with_unredacted, f"{arm} without redaction")
        add(results, with_critic_solver, f"{arm} critic as second solver")
        base_critic = add(results, with_base_critic, f"{arm} + base critic")
        add(base_critic, with_critic_solver, f"{arm} + base critic as second solver")
        add(base_critic, with_unredacted, f"{arm} + base critic without redaction")
    return out


WARM_START_ENTRY = "warm start"


def invalid_allowed_by(invalid: list[str]) -> str:
    """The spec fields that allowed the :func:`~mlmt_bench.report.compare.invalid_bases` lines (a report's words)."""
    warm = any(line.startswith(WARM_START_ENTRY) for line in invalid)
    return "`base.allow_invalid`" + (" or `warm_start.allow_invalid`" if warm else "")
