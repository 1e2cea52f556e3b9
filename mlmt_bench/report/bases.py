"""The shared bases' table (``mlmt-bench base SPEC --out DIR``): ``bases.json`` (what ``base
--json`` prints) and ``bases.md``, one row per base and check temperature, with the
accuracies and the critic's validity (METHOD.md v3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlmt_bench.report.formatting import DASH
from mlmt_bench.tracking import atomic_write_text
from mlmt_bench.warmstart.shared_base import MAX_FALSE_ALARM, MAX_SHORTCUT_GAP

COLUMNS = ("seed", "preset", "key", "T", "acc@t1", "acc@t2 own feedback", "acc@t2 after g∅", "acc@t2 oracle feedback",
           "false alarms on gold", "misconception ops / others (gap)", "one slip: miss / exact",
           "own attempts: false alarms / miss / exact", "valid")


def _pct(x: Any) -> str:
    return DASH if x is None else f"{100 * x:.1f}%"


def critic_line(check: dict[str, Any]) -> str:
    """One line of a check's critic validity, as ``mlmt-bench base`` prints it (empty for a check
    without critic probes)."""
    crit = check.get("critic") or {}
    gold, slip, own = crit.get("gold") or {}, crit.get("slip") or {}, crit.get("own") or {}
    if not gold:
        return ""
    gap = gold.get("shortcut_gap")
    return (f"false alarms on gold {_pct(gold.get('false_alarm_rate'))} (misconception ops "
            f"{_pct(gold.get('false_alarm_rate_in'))} vs others {_pct(gold.get('false_alarm_rate_out'))}: gap "
            f"{DASH if gap is None else f'{100 * gap:+.1f}'} pts); one slip: miss {_pct(slip.get('miss_rate'))}, "
            f"exact {_pct(slip.get('exact_correction_rate'))}; own attempts: false alarms "
            f"{_pct(own.get('false_alarm_rate'))}, miss {_pct(own.get('miss_rate'))}, exact "
            f"{_pct(own.get('exact_correction_rate'))}")


def _row(b: dict[str, Any], check: dict[str, Any], temperature: str) -> list[str]:
    crit = check.get("critic") or {}
    gold, slip, own = crit.get("gold") or {}, crit.get("slip") or {}, crit.get("own") or {}
    gap = gold.get("shortcut_gap")
    return [str(b["seed"]), b["preset"], f"`{b['key']}`", temperature, _pct(check.get("acc@t1")),
            _pct(check.get("acc@t2_critic")), _pct(check.get("acc@t2_null")), _pct(check.get("acc@t2_oracle")),
            _pct(gold.get("false_alarm_rate")),
            f"{_pct(gold.get('false_alarm_rate_in'))} / {_pct(gold.get('false_alarm_rate_out'))} "
            f"({DASH if gap is None else f'{100 * gap:+.1f}'})",
            f"{_pct(slip.get('miss_rate'))} / {_pct(slip.get('exact_correction_rate'))}",
            f"{_pct(own.get('false_alarm_rate'))} / {_pct(own.get('miss_rate'))} / "
            f"{_pct(own.get('exact_correction_rate'))}",
            ("no: " + "; ".join(b["invalid_because"])) if b.get("invalid_because") else "yes"]


def render_bases(bases: list[dict[str, Any]], command: str) -> str:
    """bases.md: a row per base greedy (the check the thresholds judge) and one at its training
    temperature."""
    lines = ["# The shared bases and their checks", "",
             f"`{command}`. One base per seed and preset; every policy of every arm of that seed starts from it. "
             "Checked on the validation split through the same `evaluate()` as every run, greedy (T = 0, what the "
             "validity thresholds judge) and at the training temperature. Critic validity (METHOD.md v3): false "
             "alarms on gold solutions, split into problems with one of the seed's misconception operations and the "
             "others (their difference is the shortcut gap); miss and exact-correction rates on gold with one random "
             "slip; the same three on the base solver's own attempts. A valid base has at most "
             f"{100 * MAX_FALSE_ALARM:.0f}% false alarms on gold and a gap of at most {100 * MAX_SHORTCUT_GAP:.0f} "
             "points.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for b in bases:
        check = b.get("check") or {}
        sampled = check.get("sampled") or {}
        lines.append("| " + " | ".join(_row(b, check, "0")) + " |")
        if sampled:
            lines.append("| " + " | ".join(_row(b, sampled, str(sampled.get("temperature")))) + " |")
    lines += ["", "SFT tokens, FLOPs, data mixture and seconds per base: `bases.json`.", ""]
    return "\n".join(lines)


def write_bases(bases: list[dict[str, Any]], out: Path, command: str) -> dict[str, str]:
    """Write ``bases.json`` and ``bases.md`` into ``out`` (atomically); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"bases.json": out / "bases.json", "bases.md": out / "bases.md"}
    atomic_write_text(paths["bases.json"], json.dumps(bases, indent=2, sort_keys=True) + "\n")
    atomic_write_text(paths["bases.md"], render_bases(bases, command))
    return {k: str(v) for k, v in paths.items()}
