"""``mlmt-bench report --sweep STORAGE [--study NAME] --out DIR``: what an Optuna sweep found.

STORAGE is an Optuna storage URL (``sqlite:///...``, ``postgresql+psycopg2://...``) or the path
of a SQLite study file (``<sweep dir>/<name>.db``); it is only read. Written atomically into DIR:

- ``sweep.md``: the study (metric, direction, trials by state), the optimisation history (each
  trial's state and value, the best value so far), the parameter importances (Optuna's
  ``get_param_importances`` with PED-ANOVA, which needs no scikit-learn, over complete trials;
  or why there are none) and the best trial.
- ``sweep_history.png``: Optuna's ``plot_optimization_history`` (complete trials as dots, the best
  so far as a line), with the pruned trials added at their last reported value as crosses, whole
  trial numbers on the axis and the failed trials counted in the legend.
- ``sweep_importances.png``: Optuna's ``plot_param_importances`` with the PED-ANOVA evaluator of
  the table; where the table has no importances (fewer than :data:`MIN_IMPORTANCE_TRIALS` complete
  trials, all of one value), a figure that says why.

Both come from ``optuna.visualization.matplotlib`` (offline; no plotly), drawn inside a
``matplotlib.rc_context`` since Optuna switches the process's style to ggplot for good, which
would change every figure drawn after it (a report's ``acc_vs_tokens.png`` among them).
- ``sweep_best.yaml``: the best trial's run spec (the run spec with the best parameters): built
  from the sweep file the study recorded, as ``mlmt-bench sweep`` writes ``<study>-best.yaml``;
  else the best trial's own ``spec.resolved.yaml``, renamed; else (neither readable here) the
  best parameters alone, with a comment that says so.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mlmt_bench.errors import UserError
from mlmt_bench.tracking import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:  # pragma: no cover
    import optuna

MIN_IMPORTANCE_TRIALS = 4  # on fewer complete trials an importance ranks noise


def storage_url(storage: str) -> str:
    """``storage`` as a URL: a path is a SQLite file, which must exist (reading never creates one)."""
    import sqlite3

    from mlmt_bench.sweep import sqlite_path

    url = storage if "://" in storage else f"sqlite:///{Path(storage).resolve()}"
    db = sqlite_path(url)
    if db is not None:
        if not db.is_file():
            raise UserError(f"--sweep {storage}: no such study file")
        try:  # read-only: RDBStorage would create its tables in any SQLite file
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                found = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='studies'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"--sweep {storage}: not an Optuna study file ({exc})") from None
        if found is None:
            raise UserError(f"--sweep {storage}: not an Optuna study file (no `studies` table)")
    return url


def load_study(storage: str, study: str | None) -> optuna.Study:
    """The study named ``study`` in ``storage``, or its only study."""
    import optuna

    from mlmt_bench.sweep import open_storage, quiet_optuna, redact

    url = storage_url(storage)
    with quiet_optuna():
        store = open_storage(url)
        names = [s.study_name for s in optuna.study.get_all_study_summaries(store, include_best_trial=False)]
        if not names:
            raise UserError(f"--sweep {redact(url)}: the storage holds no study")
        if study is None:
            if len(names) > 1:
                raise UserError(f"--sweep {redact(url)}: the storage holds {len(names)} studies; "
                                f"name one with --study ({', '.join(sorted(names))})")
            study = names[0]
        elif study not in names:
            raise UserError(f"--study {study}: no such study in {redact(url)} (it holds: {', '.join(sorted(names))})")
        return optuna.load_study(study_name=study, storage=store)


def history(study: optuna.Study) -> list[dict[str, Any]]:
    """Each trial in order: number, state, value (a pruned trial's: its last reported one), best so far."""
    from optuna.trial import TrialState

    from mlmt_bench.sweep import is_surplus

    maximize = study.direction.name == "MAXIMIZE"
    best, rows = None, []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if is_surplus(t):
            continue
        value = t.value
        if t.state == TrialState.PRUNED and value is None and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        if t.state == TrialState.COMPLETE and value is not None:
            if best is None or (value > best if maximize else value < best):
                best = value
        rows.append({"number": t.number, "state": t.state.name.lower(), "value": value, "best": best,
                     "params": dict(t.params)})
    return rows


def importances(study: optuna.Study) -> tuple[dict[str, float], str | None]:
    """(parameter -> PED-ANOVA importance, summing to 1), or ({}, why there are none)."""
    import optuna
    from optuna.trial import TrialState

    from mlmt_bench.sweep import quiet_optuna

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return {}, (f"parameter importances need at least {MIN_IMPORTANCE_TRIALS} complete trials; "
                    f"this study has {len(complete)}")
    if len({t.value for t in complete}) == 1:
        return {}, f"all {len(complete)} complete trials have the same value; no parameter explains a difference"
    try:
        with quiet_optuna():  # PED-ANOVA is experimental in some Optuna 4 releases
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ImportError) as exc:
        return {}, f"parameter importances could not be computed: {str(exc).splitlines()[0]}"
    return {k: float(v) for k, v in found.items()}, None


def best_spec_yaml(study: optuna.Study) -> str:
    """The best trial's run spec as YAML (see the module docstring for where it comes from)."""
    from mlmt_bench.spec import dump_yaml, load_run_spec
    from mlmt_bench.sweep import best_spec, load_sweep

    best = study.best_trial
    metric = study.user_attrs.get("metric", "value")
    header = (f"# Best trial of study {study.study_name}: trial {best.number}, {metric} = {best.value:.6g}\n"
              f"# {yaml.safe_dump(dict(best.params), default_flow_style=True, width=10**6).strip()}\n")
    sweep_file = study.user_attrs.get("sweep")
    if sweep_file and Path(sweep_file).is_file():
        try:
            sweep = load_sweep(sweep_file, study.user_attrs.get("overrides") or [], study.study_name)
            spec = best_spec(sweep, best.params, study.study_name)
            return header + f"# from the sweep file {sweep_file}\n" + dump_yaml(spec)
        except UserError as exc:  # edited since the study began: the spec the best trial ran instead
            header += f"# the sweep file {sweep_file} no longer applies ({exc})\n"
    run_dir = best.user_attrs.get("run_dir")
    resolved = Path(run_dir) / "spec.resolved.yaml" if run_dir else None
    if resolved is not None and resolved.is_file():
        spec = load_run_spec(resolved).model_copy(update={"name": f"{study.study_name}-best"})
        return header + f"# from the best trial's run directory {run_dir}\n" + dump_yaml(spec)
    return (header + "# neither the sweep file nor the best trial's run directory is readable here: "
            "the best parameters only (apply them to the run spec with --set)\n"
            + yaml.safe_dump(dict(best.params), sort_keys=False))


def plot_history(study: optuna.Study, rows: list[dict[str, Any]], path: Path, *, metric: str, title: str) -> None:
    """The optimisation history as a PNG (see the module docstring), written atomically."""
    _save(lambda: history_figure(study, rows, metric=metric, title=title), path)


def plot_importances(study: optuna.Study, path: Path, *, metric: str, why_not: str | None) -> None:
    """The parameter importances as a PNG (see the module docstring), written atomically."""
    _save(lambda: importances_figure(study, metric=metric, why_not=why_not), path)


def _save(draw: Callable[[], Any], path: Path) -> None:
    """Draw a figure with Optuna inside an rc_context (its ggplot style does not outlive it) and
    write it as a 7 x 4 in PNG at 120 dpi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"figure.figsize": (7, 4), "figure.autolayout": True}):
        fig = draw()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120)
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def history_figure(study: optuna.Study, rows: list[dict[str, Any]], *, metric: str, title: str) -> Any:
    """``plot_optimization_history``'s figure (call inside an rc_context: it sets the ggplot style),
    with trial numbers on whole ticks (a trial 1.5 is none), the pruned trials of ``rows``
    (:func:`history`) as crosses at their last reported value, and the failed ones counted."""
    import optuna.visualization.matplotlib as ovm
    from matplotlib.ticker import MaxNLocator

    from mlmt_bench.sweep import quiet_optuna

    with quiet_optuna(), warnings.catch_warnings():  # experimental in Optuna; its legend of no trial warns
        warnings.filterwarnings("ignore", "No artists with labels", UserWarning)
        ax = ovm.plot_optimization_history(study, target_name=metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    pruned = [(r["number"], r["value"]) for r in rows if r["state"] == "pruned" and r["value"] is not None]
    if pruned:
        numbers, values = zip(*pruned)
        ax.scatter(numbers, values, marker="x", color="0.45", s=24, label=f"pruned ({len(pruned)}: last reported)",
                   zorder=3)
    failed = sum(r["state"] == "fail" for r in rows)
    if failed:
        ax.plot([], [], " ", label=f"failed: {failed} (no value)")
    if not any(r["best"] is not None for r in rows) and not pruned:
        ax.text(0.5, 0.5, "no trial has a value yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    legend = ax.get_legend()
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)  # inside the axes: Optuna's, beside them, takes a third of 7 in
    elif legend is not None:
        legend.remove()
    return ax.figure


def importances_figure(study: optuna.Study, *, metric: str, why_not: str | None) -> Any:
    """``plot_param_importances``' figure with the PED-ANOVA evaluator of :func:`importances` (call
    inside an rc_context), or, where ``why_not`` says there are none, a figure that says why."""
    import optuna
    import optuna.visualization.matplotlib as ovm

    from mlmt_bench.sweep import quiet_optuna

    if why_not is None:
        with quiet_optuna():  # experimental in Optuna
            ax = ovm.plot_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                                            target_name=metric)
        ax.set_title(f"{study.study_name}: parameter importances for {metric} (PED-ANOVA)", loc="left")
        return ax.figure
    import textwrap

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_axis_off()
    ax.text(0.5, 0.5, "No parameter importances:\n" + textwrap.fill(why_not, 60), ha="center", va="center",
            transform=ax.transAxes)
    ax.set_title(f"{study.study_name}: parameter importances for {metric}")
    return fig


def render_markdown(study: optuna.Study, rows: list[dict[str, Any]], found: dict[str, float],
                    why_not: str | None, url: str) -> str:
    from mlmt_bench.report.compare import _md_table
    from mlmt_bench.sweep.display import fmt, short_names

    metric = study.user_attrs.get("metric", "value")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r["params"] if k not in keys]
    names = short_names(keys)
    out = [f"# Sweep {study.study_name}", "",
           f"Storage `{url}`; {metric} ({study.direction.name.lower()}); "
           + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", "",
           "![optimisation history](sweep_history.png)", "", "## Optimisation history", "",
           "Pruned trials show their last reported value; the best so far counts complete trials only.", ""]
    table = [[str(r["number"]), r["state"], fmt(r["value"]), fmt(r["best"])]
             + [fmt(r["params"].get(k), 4) for k in keys] for r in rows]
    out += [_md_table(["trial", "state", metric, "best so far"] + [names[k] for k in keys], table), ""]
    out += ["## Parameter importances", ""]
    if why_not:
        out += [why_not + ".", ""]
    else:
        out += ["PED-ANOVA (Optuna's `get_param_importances`) over the complete trials: how differently each "
                "parameter is distributed in the best 10 % of them than in all; they sum to 1, and with few "
                "trials they are rough.", "",
                _md_table(["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in found.items()]), "",
                "![parameter importances](sweep_importances.png)", ""]
    out += ["## Best trial", ""]
    if any(r["state"] == "complete" for r in rows):
        best = study.best_trial
        out += [f"Trial {best.number}: {metric} = {fmt(best.value)}. Its run spec: `sweep_best.yaml`.", "",
                _md_table(["parameter", "value"], [[k, repr(v)] for k, v in best.params.items()]), ""]
    else:
        out += ["No trial completed yet.", ""]
    return "\n".join(out)


def report_sweep(storage: str, out_dir: Path, study: str | None = None) -> dict[str, Any]:
    """Write the sweep report of ``study`` in ``storage`` into ``out_dir``; returns a summary."""
    from mlmt_bench.sweep import redact

    st = load_study(storage, study)
    url = redact(storage_url(storage))
    rows = history(st)
    found, why_not = importances(st)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"markdown": out_dir / "sweep.md", "history": out_dir / "sweep_history.png",
             "importances": out_dir / "sweep_importances.png"}
    metric = st.user_attrs.get("metric", "value")
    plot_history(st, rows, files["history"], metric=metric,
                 title=f"{st.study_name}: {metric} ({st.direction.name.lower()})")
    plot_importances(st, files["importances"], metric=metric, why_not=why_not)
    if any(r["state"] == "complete" for r in rows):
        files["best_spec"] = out_dir / "sweep_best.yaml"
        atomic_write_text(files["best_spec"], best_spec_yaml(st))
    atomic_write_text(files["markdown"], render_markdown(st, rows, found, why_not, url))
    return {"study": st.study_name, "storage": url, "trials": len(rows),
            "counts": {s: sum(r["state"] == s for r in rows) for s in sorted({r["state"] for r in rows})},
            "importances": found, "importances_note": why_not,
            "best": None if "best_spec" not in files else {"number": st.best_trial.number, "value": st.best_trial.value,
                                                          "params": dict(st.best_trial.params)},
            "files": {k: str(v) for k, v in files.items()}}
