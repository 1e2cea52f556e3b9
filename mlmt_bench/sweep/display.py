"""How a sweep looks on a terminal: each trial's progress while it runs, and the table of trials.

:class:`SweepDisplay` reads the workers' events (see "Running" in :mod:`mlmt_bench.sweep`) and
writes to stderr: on a terminal, a live line per worker (trial, step/steps, latest value of the
metric, time) under a line for the study; elsewhere (a log file, CI), a line when a trial starts
or ends and at most one progress line per worker every ``PLAIN_EVERY_S`` seconds. A line is also
printed when a trial ends, so the history stays on screen.

:func:`print_summary` prints the trials as a table that fits the terminal: one column per
parameter (named by the shortest unique end of its dotted path) when they fit, else the
parameters stacked in one column; numbers are never wrapped.
"""

from __future__ import annotations

import time
from typing import Any

PLAIN_EVERY_S = 30.0  # non-terminal output: a worker's progress line at most this often


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted path -> its shortest ending that no other path ends with
    (``policies.solver.lr`` and ``policies.critic.lr`` -> ``solver.lr``, ``critic.lr``)."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != key and (o == tail or o.endswith("." + tail)) for o in keys):
                break
        out[key] = tail
    return out


def fmt(value: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits; None as ``-``; anything else as str."""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "-" if value is None else str(value)


def fmt_params(params: dict[str, Any], sep: str = ", ") -> str:
    names = short_names(list(params))
    return sep.join(f"{names[k]}={fmt(v, 3)}" for k, v in params.items())


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class SweepDisplay:
    """Progress of a sweep from its workers' events (``handle``); a context manager.

    ``done``: complete + pruned trials already in the study; ``grace_s``: after how long without
    a heartbeat a trial counts as dead (shown when a worker waits for others' trials).
    """

    def __init__(self, study: str, metric: str, target: int, *, done: int, direction: str = "maximize",
                 enabled: bool = True, grace_s: float = 0.0, console: Any = None) -> None:
        from rich.console import Console

        self.study, self.metric, self.target, self.done, self.grace_s = study, metric, target, done, grace_s
        self.maximize = direction == "maximize"
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.best: tuple[int, float] | None = None
        self.workers: dict[int, dict[str, Any]] = {}
        self.progress: Any = None

    # context ----------------------------------------------------------------------------------
    def __enter__(self) -> SweepDisplay:
        if self.enabled:
            self._line(f"sweep {self.study}: {self.done} of {self.target} trials complete or pruned; "
                       f"optimising {self.metric}")
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            self.progress = Progress(
                TextColumn("{task.description}", table_column=Column(no_wrap=True, min_width=7)),
                BarColumn(bar_width=16), TextColumn("{task.fields[count]}", justify="right"),
                TextColumn("{task.fields[info]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                TimeElapsedColumn(), console=self.console, transient=True)
            self.progress.start()
            self.overall = self.progress.add_task("trials", total=self.target, completed=self.done, info="",
                                                  count=f"{self.done}/{self.target}")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    # events -----------------------------------------------------------------------------------
    def handle(self, worker: int, event: dict[str, Any]) -> None:
        """Show one event of worker ``worker``."""
        if not self.enabled:
            return
        kind = event.get("event")
        w = self.workers.setdefault(worker, {"task": None, "trial": None, "steps": 0, "step": 0, "eval": None,
                                             "waiting": [], "started": time.monotonic(), "shown": 0.0})
        if kind == "start":
            w.update(trial=event["trial"], steps=event.get("steps") or 0, step=0, eval=None, waiting=[],
                     started=time.monotonic(), shown=time.monotonic())
            retry = f", retrying trial {event['retry_of']}" if event.get("retry_of") is not None else ""
            self._line(f"trial {event['trial']} started (worker {worker}{retry}): "
                       f"{fmt_params(event.get('params', {}))}")
        elif kind == "step":
            w.update(step=event["step"], steps=event.get("steps") or w["steps"])
        elif kind == "eval":
            w["eval"] = (event["step"], event["value"])
        elif kind == "end":
            self._trial_ended(worker, w, event)
        elif kind == "wait":
            w.update(trial=None, steps=0, step=0, eval=None, waiting=list(event.get("trials", [])))
            trials = ", ".join(str(n) for n in w["waiting"])
            self._line(f"worker {worker} waits: trial(s) {trials} running elsewhere (retried if silent for "
                       f"{self.grace_s:g} s)")
        self._refresh(worker, w, kind)

    def warn(self, text: str) -> None:
        """A line about the sweep itself (a worker died), shown even when progress is off."""
        self._line(text, always=True)

    # ------------------------------------------------------------------------------------------
    def _trial_ended(self, worker: int, w: dict[str, Any], event: dict[str, Any]) -> None:
        n, state, value = event["trial"], event["state"], event.get("value")
        if state in ("complete", "pruned"):
            self.done += 1
        if state == "complete" and value is not None:
            if self.best is None or (value > self.best[1] if self.maximize else value < self.best[1]):
                self.best = (n, value)
        text = f"trial {n} {state}"
        if value is not None:
            text += f": {self.metric} {fmt(value)}"
        if state == "pruned" and event.get("step") is not None:
            text += f" at step {event['step']}"
        if event.get("error"):
            text += f": {event['error']}"
        self._line(f"{text} (worker {worker}, {_clock(time.monotonic() - w['started'])}); "
                   f"{self.done}/{self.target} done")
        w.update(trial=None, steps=0, step=0, eval=None)

    def _refresh(self, worker: int, w: dict[str, Any], kind: Any) -> None:
        latest = f"{self.metric} {fmt(w['eval'][1], 3)} @{w['eval'][0]}" if w["eval"] else ""
        if self.progress is not None:
            if w["trial"] is not None:  # before its first step a trial loads models and evaluates step 0
                desc, info = f"w{worker} t{w['trial']}", latest or ("" if w["step"] else "starting")
            elif w["waiting"]:
                desc, info = f"w{worker} wait", "for " + ", ".join(f"t{n}" for n in w["waiting"])
            else:
                desc, info = f"w{worker} idle", ""
            count = f"{w['step']}/{w['steps']}" if w["trial"] is not None and w["steps"] else ""
            fields = {"description": desc, "total": w["steps"] or 1, "completed": w["step"], "info": info,
                      "count": count}
            if w["task"] is None:
                w["task"] = self.progress.add_task(**fields)
            elif kind == "start":  # a new trial: its own elapsed time
                self.progress.reset(w["task"], **fields)
            else:
                self.progress.update(w["task"], **fields)
            best = f"best {self.metric} {fmt(self.best[1], 3)} (t{self.best[0]})" if self.best else ""
            self.progress.update(self.overall, completed=self.done, info=best, count=f"{self.done}/{self.target}")
        elif kind in ("step", "eval") and time.monotonic() - w["shown"] >= PLAIN_EVERY_S:
            w["shown"] = time.monotonic()
            at = f", {self.metric} {fmt(w['eval'][1])} at step {w['eval'][0]}" if w["eval"] else ""
            self._line(f"trial {w['trial']}: step {w['step']}/{w['steps']}{at}")

    def _line(self, text: str, always: bool = False) -> None:
        if not (self.enabled or always):
            return
        if not self.live:
            text = time.strftime("%H:%M:%S ") + text
        self.console.print(text, markup=False, highlight=False, soft_wrap=not self.live)


def print_summary(result: dict[str, Any], console: Any = None) -> None:
    """The trials as a table that fits the terminal, then the best parameters (stdout)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    keys: list[str] = []
    for r in result["trials"]:
        keys += [k for k in r["params"] if k not in keys]
    names = short_names(keys)
    best = result["best"]["number"] if result["best"] else None
    title = f"sweep {result['study']}: {result['metric']} ({result['direction']}), * best"

    def table(stacked: bool) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        t.add_column("#", justify="right", no_wrap=True, min_width=len(str(len(result["trials"]))) + 1)
        t.add_column("state", no_wrap=True)
        t.add_column(result["metric"], justify="right", no_wrap=True)
        if stacked:
            t.add_column("params", overflow="fold")  # folds only where even one "name=value" is too wide
        else:
            for k in keys:
                t.add_column(names[k], justify="right", no_wrap=True)
        for r in result["trials"]:
            state = r["state"]
            if state == "pruned" and r["last_step"] is not None:
                state = f"pruned@{r['last_step']}"
            cells = [f"{r['number']}{'*' if r['number'] == best else ''}", state, fmt(r["value"])]
            if stacked:
                cells.append("\n".join(f"{names[k]}={fmt(r['params'].get(k), 3)}" for k in keys if k in r["params"]))
            else:
                cells += [fmt(r["params"].get(k), 3) for k in keys]
            t.add_row(*cells)
        return t

    wide = table(stacked=False)
    unbounded = console.options.update_width(10**6)  # measure() is clamped to the width it is given
    console.print(wide if console.measure(wide, options=unbounded).maximum <= console.width else table(stacked=True))
    lines = []
    for r in result["trials"]:
        if r.get("retry_of") is not None:
            lines.append(f"trial {r['number']} retries trial {r['retry_of']} (its process died)")
        if r["error"]:
            lines.append(f"trial {r['number']} failed: {r['error']}")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result["counts"].items()))
    lines += [f"{counts or 'no trials'} (target: {result['n_trials']} complete + pruned) in {result['storage']}",
              f"trials: {result['trials_dir']}"]
    b = result["best"]
    if b is None:
        lines.append("no trial completed yet")
    else:
        lines.append(f"best: trial {b['number']}, {result['metric']} = {fmt(b['value'])}")
        lines += [f"  {k} = {v!r}" for k, v in b["params"].items()]
        lines.append(f"best spec: {result['best_spec']}")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
