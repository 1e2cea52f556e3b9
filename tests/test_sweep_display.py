"""mlmt_bench.sweep.display: the trials table at terminal widths, and per-trial progress."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from mlmt_bench.sweep import display as sweep_display
from mlmt_bench.sweep.display import SweepDisplay, fmt, print_summary, short_names

PARAMS = ["algorithm.params.lam", "algorithm.params.eta", "policies.solver.lr", "policies.critic.lr",
          "algorithm.params.value"]


def quickstart_like_result() -> dict:
    """A summary shaped like sweeps/quickstart-mlmt.yaml's: five parameters, every state."""
    values = [(0.8444, 1.516, 6.937e-05, 3.295e-05, "learned"), (0.7838, 0.6066, 8.978e-05, 0.0001468, "mc"),
              (0.2818, 1.512, 0.0001725, 3.17e-05, "mc"), (0.7298, 1.798, 0.0002333, 8.796e-05, "mc"),
              (0.3538, 0.6324, 0.0001909, 2.564e-05, "learned"), (0.5214, 0.1246, 0.000687, 0.0006792, "mc")]
    states = ["complete", "complete", "pruned", "fail", "complete", "complete"]
    scores = [0.4049, 0.5047, 0.3101, None, 0.7197, 0.4427]
    trials = [{"number": n, "state": s, "value": v, "params": dict(zip(PARAMS, p)),
               "last_step": 4 if s == "pruned" else 40,
               "last_value": v, "run_dir": f"runs/q/trials/q-t{n}-20261130T203956Z", "retry_of": 3 if n == 5 else None,
               "error": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" if s == "fail" else None}
              for n, (s, v, p) in enumerate(zip(states, scores, values))]
    return {"study": "quickstart-mlmt-sweep", "metric": "acc@t2", "direction": "maximize", "n_trials": 20,
            "counts": {"complete": 4, "pruned": 1, "fail": 1}, "trials": trials,
            "storage": "sqlite:////home/me/runs/quickstart-mlmt-sweep/quickstart-mlmt-sweep.db",
            "trials_dir": "runs/q/trials", "best_spec": "runs/q/q-best.yaml",
            "best": {"number": 4, "value": 0.7197, "params": trials[4]["params"], "run_dir": trials[4]["run_dir"]}}


def render(result: dict, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    print_summary(result, console)
    return console.export_text()


def test_short_names():
    assert short_names(PARAMS) == {"algorithm.params.lam": "lam", "algorithm.params.eta": "eta",
                                   "policies.solver.lr": "solver.lr", "policies.critic.lr": "critic.lr",
                                   "algorithm.params.value": "value"}
    assert short_names(["a.lr", "b.a.lr", "train.steps"]) == {"a.lr": "a.lr", "b.a.lr": "b.a.lr",
                                                               "train.steps": "steps"}


def test_table_fits_80_columns_with_every_number_whole():
    result = quickstart_like_result()
    text = render(result, 80)
    table = text.split("trial 3 failed:")[0]
    assert max(len(line) for line in table.splitlines()) <= 80, table
    rows = {line.split()[0]: line.split() for line in table.splitlines()
            if line.split() and line.split()[0][0].isdigit()}
    for r in result["trials"]:
        state = "pruned@4" if r["state"] == "pruned" else r["state"]
        key = f"{r['number']}*" if r["number"] == 4 else str(r["number"])
        assert rows[key] == [key, state, fmt(r["value"])] + [fmt(r["params"][k], 3) for k in PARAMS]
    header = next(line for line in table.splitlines() if "solver.lr" in line).split()
    assert header == ["#", "state", "acc@t2", "lam", "eta", "solver.lr", "critic.lr", "value"]
    assert "trial 3 failed: RuntimeError: CUDA out of memory" in text
    assert "trial 5 retries trial 3 (its process died)" in text
    assert "best: trial 4, acc@t2 = 0.7197" in text and "  policies.solver.lr = 0.0001909" in text


def test_narrow_terminal_stacks_the_parameters():
    text = render(quickstart_like_result(), 50)
    table = text.split("trial 3 failed:")[0]
    assert max(len(line) for line in table.splitlines()) <= 50, table
    assert "params" in table and "solver.lr=6.94e-05" in table and "value=learned" in table
    assert sum("solver.lr=" in line for line in table.splitlines()) == 6  # one line per trial, not folded


def events(display: SweepDisplay) -> None:
    params = dict(zip(PARAMS, (0.31, 1.2, 1.2e-4, 3.3e-5, "learned")))
    display.handle(0, {"event": "start", "trial": 4, "steps": 200, "params": params, "retry_of": None})
    display.handle(1, {"event": "start", "trial": 5, "steps": 200, "params": params, "retry_of": 2})
    for step in range(1, 121):
        display.handle(0, {"event": "step", "trial": 4, "step": step, "steps": 200})
    display.handle(0, {"event": "eval", "trial": 4, "step": 100, "value": 0.41234})
    display.handle(1, {"event": "end", "trial": 5, "state": "pruned", "value": 0.1, "step": 30, "error": None})
    display.handle(1, {"event": "wait", "trials": [4]})


def test_plain_progress_is_a_few_lines(monkeypatch):
    out = io.StringIO()
    with SweepDisplay("s", "acc@t2", 20, done=3, grace_s=180, console=Console(file=out, width=200)) as display:
        events(display)
    lines = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]  # without the time of day
    assert lines == [
        "sweep s: 3 of 20 trials complete or pruned; optimising acc@t2",
        "trial 4 started (worker 0): lam=0.31, eta=1.2, solver.lr=0.00012, critic.lr=3.3e-05, value=learned",
        "trial 5 started (worker 1, retrying trial 2): lam=0.31, eta=1.2, solver.lr=0.00012, critic.lr=3.3e-05, "
        "value=learned",
        "trial 5 pruned: acc@t2 0.1 at step 30 (worker 1, 0:00); 4/20 done",
        "worker 1 waits: trial(s) 4 running elsewhere (retried if silent for 180 s)",
    ]  # 120 steps and an evaluation within PLAIN_EVERY_S: no line
    monkeypatch.setattr(sweep_display, "PLAIN_EVERY_S", 0.0)
    out = io.StringIO()
    with SweepDisplay("s", "acc@t2", 20, done=3, console=Console(file=out, width=200)) as display:
        events(display)
    assert "trial 4: step 120/200, acc@t2 0.4123 at step 100" in out.getvalue()


def test_quiet_shows_only_warnings():
    out = io.StringIO()
    with SweepDisplay("s", "acc@t2", 20, done=0, enabled=False, console=Console(file=out, width=200)) as display:
        events(display)
        display.warn("worker 1 (pid 7) was killed by SIGKILL")
    assert out.getvalue().count("\n") == 1 and "was killed by SIGKILL" in out.getvalue()


def snapshot(display: SweepDisplay, width: int) -> list[str]:
    shot = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    shot.print(display.progress.get_renderable())
    return shot.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 60])
def test_live_progress_shows_each_worker_within_the_width(width):
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    with SweepDisplay("quickstart-mlmt-sweep", "acc@t2", 20, done=3, console=console) as display:
        assert display.live
        display.handle(0, {"event": "start", "trial": 4, "steps": 200, "params": {}, "retry_of": None})
        overall, w0 = snapshot(display, width)
        assert w0.startswith("w0 t4") and "0/200" in w0 and "starting" in w0  # loading models, evaluating step 0
        events(display)
        overall, w0, w1 = snapshot(display, width)
        assert w0.startswith("w0 t4") and "120/200" in w0 and "acc@t2 0.412 @100" in w0
        assert w1.startswith("w1 wait") and "for t4" in w1
        display.handle(0, {"event": "end", "trial": 4, "state": "complete", "value": 0.5, "step": 200, "error": None})
        overall, w0, w1 = snapshot(display, width)
        parts = w0.split()  # an empty bar and the elapsed time: no stale step count or metric
        assert parts[:2] == ["w0", "idle"] and len(parts) == 3 and re.fullmatch(r"\d+:\d\d:\d\d", parts[2])
        display.handle(0, {"event": "start", "trial": 6, "steps": 50, "params": {}, "retry_of": None})
        display.handle(0, {"event": "step", "trial": 6, "step": 10, "steps": 50})
        display.handle(0, {"event": "eval", "trial": 6, "step": 10, "value": 0.25})
        lines = snapshot(display, width)
    assert all(len(line) <= width for line in lines)
    overall, w0, w1 = lines
    assert overall.startswith("trials") and "5/20" in overall and "best acc@t2 0.5 (t4)" in overall
    assert w0.startswith("w0 t6") and "10/50" in w0 and "acc@t2 0.25 @10" in w0
