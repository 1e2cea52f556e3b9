"""A sweep's search space: the distributions of a ``space:`` mapping, their end points, grid sizes
(counted without building the grid) and Optuna suggestions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import short_repr, shorten
from mlmt_bench.spec import _Spec, format_validation_error

if TYPE_CHECKING:  # pragma: no cover
    import optuna

MAX_GRID_POINTS = 10_000  # values of one parameter on a grid (the grid is built in memory)
# Points of the whole grid (the product of every parameter's values): Optuna's GridSampler builds
# them all as tuples in every worker (~100 bytes each: 10 MB here; 10^12 points were 3.4 GB and a
# MemoryError), and a sweep of RL runs never gets through more than ~10^4 trials.
MAX_GRID_SIZE = 100_000



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
    if dist.step is not None and dist.step > dist.high - dist.low:  # one value: nothing is searched
        raise UserError(f"{where}: step {short_repr(dist.step)} is larger than high - low "
                        f"({short_repr(dist.high - dist.low)}), so every trial would get low={short_repr(dist.low)}")
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


