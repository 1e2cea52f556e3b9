"""The names a metric has in every tracker: one name per metric, the same in TensorBoard, MLflow
and W&B, and TRL's names beside ours where a metric means the same.

``metrics.jsonl`` keeps its own keys (reports and committed raw data read them); this module is the
one place that turns a record into what trackers log (:func:`logged`):

- **one name everywhere** (:func:`tracker_name`): ``<kind>/<field>`` spelled as MLflow accepts it
  (letters, digits and ``_ - . / : space``), since MLflow refuses ``@`` and ``>``: ``->`` → ``_to_``,
  ``@`` → ``_at_``, any other refused character → ``_``. So ``acc@t2`` is ``eval/acc_at_t2`` and
  ``i->c`` is ``eval/i_to_c`` in TensorBoard and W&B too, not only in MLflow. Written here because
  no tracker renames: MLflow refuses such a name (an exception) and the others take it as it is.
- **TRL's names as aliases** (:data:`TRL_ALIASES`), logged alongside ours with the same value: a
  train record's ``reward_mean`` is also ``train/reward``, ``frac_zero_std`` also
  ``train/frac_reward_zero_std``; the solver's ``kl/solver``, ``entropy/solver`` and
  ``clip_frac/solver`` (the share of trained tokens whose clipped branch is active: TRL's region
  clip) are also ``train/kl``, ``train/entropy``, ``train/clip_ratio/region_mean`` (TRL trains one
  policy, the solver; the critic's keep only their own names). Like TRL's, the KL is there only when
  β > 0: with no reference there is none. ``len/<kind>`` (the mean length of
  a turn kind's completions, in tokens) is also ``train/completions/mean_length/<kind>``, and
  ``train/completions/mean_length`` when one kind was generated (single-turn: TRL's meaning; with
  several kinds TRL's mean over all completions cannot be had from per-kind means).
  ``completions/clipped_ratio`` and ``reward_std`` already are TRL's names.
- **the x-axes at step 0**: the evaluation before any training also carries ``train/gen_tokens``
  and ``train/flops`` (both 0), so a chart of an evaluation metric against either starts at the
  starting point (W&B's custom x-axes need the axis in the same step's row; a train record comes
  only from step 1 on).
"""

from __future__ import annotations

import re
from typing import Any

_REFUSED = re.compile(r"[^\w\-. /:]")  # what MLflow refuses in a metric name

#: a train record's field → TRL's GRPOTrainer name for the same quantity (logged as ``train/<name>``)
TRL_ALIASES = {
    "reward_mean": "reward",
    "frac_zero_std": "frac_reward_zero_std",
    "kl/solver": "kl",
    "entropy/solver": "entropy",
    "clip_frac/solver": "clip_ratio/region_mean",
}
MEAN_LENGTH = "completions/mean_length"
AXES = ("gen_tokens", "flops")  # the counters charts are drawn against, besides the step


def tracker_name(key: str) -> str:
    """``key`` as every tracker logs it: ``->`` → ``_to_``, ``@`` → ``_at_``, any other character
    MLflow refuses → ``_`` (``eval/acc@t2`` → ``eval/acc_at_t2``)."""
    return _REFUSED.sub("_", key.replace("->", "_to_").replace("@", "_at_"))


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a ``metrics.jsonl`` record as ``<kind>/<field>`` → float (ints,
    floats, non-finite included; booleans, strings, lists and nulls are not metrics), under the
    record's own keys."""
    kind = record.get("kind", "metrics")
    return {f"{kind}/{k}": float(v) for k, v in record.items()
            if k != "kind" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def aliases(record: dict[str, Any]) -> dict[str, float]:
    """TRL's names for a train record's fields (``train/<TRL name>`` → value; {} for other kinds)."""
    if record.get("kind") != "train":
        return {}
    fields = {k[len("train/"):]: v for k, v in scalars(record).items()}
    out = {f"train/{trl}": fields[ours] for ours, trl in TRL_ALIASES.items() if ours in fields}
    lengths = {k[len("len/"):]: v for k, v in fields.items() if k.startswith("len/")}
    out.update({f"train/{MEAN_LENGTH}/{kind}": v for kind, v in lengths.items()})
    if len(lengths) == 1:
        out[f"train/{MEAN_LENGTH}"] = next(iter(lengths.values()))
    return out


def logged(record: dict[str, Any]) -> dict[str, float]:
    """What every tracker logs of ``record``: its :func:`scalars` under :func:`tracker_name`, TRL's
    :func:`aliases`, and for the evaluation at step 0 the training axes (``train/gen_tokens``,
    ``train/flops``)."""
    out = {tracker_name(k): v for k, v in scalars(record).items()}
    out.update(aliases(record))
    if record.get("kind") == "eval" and record.get("step") == 0:
        out.update({f"train/{axis}": float(record.get(axis, 0)) for axis in AXES})
    return out
