"""A sweep file read and checked up front (:func:`load_sweep`), and the run specs it makes: each
trial's and the best parameters'. Also where a trial's run directory lies."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import short_repr, shorten
from mlmt_bench.spec import (
    RunSpec,
    SweepSpec,
    apply_overrides,
    is_experiment,
    load_raw,
    load_validated,
    parse_override,
    validate_run,
)
from mlmt_bench.sweep.space import SearchDistribution, check_grid_size, end_points, parse_dist

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # RunSpec.name: trial runs are named <study>-t<N>


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



def find_run_dir(sweep: Sweep, study: str, number: int) -> str | None:
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
