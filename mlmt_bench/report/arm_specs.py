"""What each arm of a comparison is: the settings of its runs' ``spec.resolved.yaml`` that tell it
apart from the other arms, for the results page's "Arms" table.

A fixed set of columns a reader of the method looks for first (:data:`COLUMNS`: algorithm,
variant, λ, group size G, learning rates, sampling temperatures) and the base checkpoint's key
(``manifest.json``), then, per arm, every other setting whose value is not the one most arms of
the comparison share (on a tie, the first arm's: the baseline's in a report, which lists it
first): algorithm parameters compared among the arms of the same algorithm
(GRPO has no λ to differ in), the rest among all arms. The per-run fields (name, seed, output
directory, description) never count. An arm is read from its first run; the fields in which its
seeds' specs differ from each other are listed too.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlmt_bench.report.runs import RunRecord

#: the fixed columns: (header, dotted spec field)
COLUMNS = (
    ("algorithm", "algorithm.name"), ("variant", "algorithm.params.variant"), ("λ", "algorithm.params.lam"),
    ("G", "algorithm.params.group_size"), ("lr (solver)", "policies.solver.lr"),
    ("lr (critic)", "policies.critic.lr"), ("temperature", "backend.temperature"),
    ("T (solver)", "policies.solver.temperature"), ("T (critic)", "policies.critic.temperature"),
)
#: fields that differ from run to run by construction, never a difference between arms
PER_RUN = ("name", "seed", "output_dir", "description")
#: the prefix of the fields compared only among arms of one algorithm
_PARAMS = "algorithm.params."


def flatten(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested spec as ``{"a.b.c": leaf}``; an empty mapping is no field."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass
class ArmSpec:
    """One arm: ``columns``: its value per :data:`COLUMNS` header (absent: not in its spec);
    ``base``: its base checkpoint's key; ``other``: (field, value) of its other distinguishing
    settings; ``seeds_differ``: the fields its seeds' specs disagree on."""

    arm: str
    columns: dict[str, Any]
    base: str | None
    other: list[tuple[str, Any]] = field(default_factory=list)
    seeds_differ: list[str] = field(default_factory=list)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def arm_specs(runs: dict[str, list[RunRecord]]) -> list[ArmSpec]:
    """The :class:`ArmSpec` of each arm of ``runs`` (each arm's own runs: pass
    :func:`~mlmt_bench.report.runs.own_arms`); empty when no run has a spec."""
    flat = {arm: [{k: v for k, v in flatten(r.spec).items() if k not in PER_RUN} for r in results]
            for arm, results in runs.items() if results}
    if not any(spec for specs in flat.values() for spec in specs):
        return []
    first = {arm: specs[0] for arm, specs in flat.items()}
    fixed = {f for _, f in COLUMNS}
    absent = object()
    out = []
    for arm, spec in first.items():
        peers = [s for s in first.values() if s.get("algorithm.name") == spec.get("algorithm.name")]
        other = []
        for key in sorted({k for s in first.values() for k in s} - fixed):
            group = peers if key.startswith(_PARAMS) else list(first.values())
            common, _ = Counter(_key(s.get(key, absent)) for s in group).most_common(1)[0]
            if key in spec and _key(spec[key]) != common:
                other.append((key, spec[key]))
        seeds = flat[arm]
        differ = sorted(k for k in {k for s in seeds for k in s} if len({_key(s.get(k, absent)) for s in seeds}) > 1)
        base = runs[arm][0].manifest.get("base")
        out.append(ArmSpec(arm, {h: spec[f] for h, f in COLUMNS if f in spec},
                           str(base["key"]) if isinstance(base, dict) and base.get("key") else None, other, differ))
    return out
