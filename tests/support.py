"""Test helpers importable from subprocesses (PYTHONPATH=tests), and those that several test
modules share (conftest.py holds the shared fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from mlmt_bench.types import Verdict
from mlmt_bench.verifiers.base import Verifier

if TYPE_CHECKING:
    from mlmt_bench.spec import RunSpec


class ParityVerifier(Verifier):
    """Reward 1 for an even number of generated characters: a non-degenerate, deterministic
    signal that even an untrained tiny model gets right half of the time."""

    def score(self, problem, response):
        ok = len(response) % 2 == 0
        return Verdict(float(ok), ok, response, "ok" if ok else "wrong")


# --------------------------------------------------------------------------------------------
# Helpers several test modules share (a test module never imports another). Their imports are
# inside them: a subprocess that imports ParityVerifier pays for nothing else.


def require(available: bool, what: str) -> None:
    """Skip the calling test when ``what`` (a tool or an extra) is not installed, except under CI
    (``MLMT_BENCH_CI=1``, set by ``.ci/run``, which installs every one of them): there it fails."""
    import os

    import pytest

    if available:
        return
    if os.environ.get("MLMT_BENCH_CI"):
        pytest.fail(f"{what} is not installed, under CI (MLMT_BENCH_CI)")
    pytest.skip(f"{what} is not installed")


def one_line_error(args: list[str], *fragments: str, after_warnings: bool = False) -> str:
    """Run the CLI in this process: exit 2, exactly one ``error:`` line holding ``fragments``.
    ``after_warnings``: a run that trained may have said ``warning: ...`` lines first (a tiny
    random model's completions all hit the length limit); the error is then the one last line."""
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, (res.exit_code, res.stderr[-800:])
    err = res.stderr
    if after_warnings:
        err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("warning: "))
    assert err.startswith("error: ") and err.count("\n") == 1, res.stderr[-800:]
    for f in fragments:
        assert f in err, res.stderr
    return err


# run directories, as `mlmt-bench run` writes them (tests/test_report*.py, test_input_hygiene.py)


def make_run(root: Path, dirname: str, *, seed: int, arm: str | None, curve: list[tuple],
             t1: list[int], t2: list[int], extra: dict | None = None, final: bool = True,
             feedback: bool = True, spec: str = "name: x\n", eval_extra: dict[int, dict] | None = None,
             samples: dict[int, dict[str, list[dict]]] | None = None,
             train_extra: dict[int, dict] | None = None) -> Path:
    """A run directory as `mlmt-bench run` writes it.

    curve: (step, gen_tokens, flops, acc@t1, acc@t2) per eval; the last one is the final eval,
    whose per-problem correctness is t1 / t2 over problems p0, p1, ... (earlier evals get
    all-wrong rows, which must be ignored by the final-step selection).
    eval_extra: more fields of the eval record at a step (the final record copies the last).
    samples: samples.jsonl, {step: {problem id: turns}}.
    train_extra: more fields of the train record at a step.
    """
    import numpy as np

    from mlmt_bench.report.runs import strip_stamp

    d = root / dirname
    d.mkdir(parents=True)
    manifest = {"name": strip_stamp(dirname), "status": "completed" if final else "interrupted",
                "seed": seed, "start_time": "2025-01-01T00:00:00Z", "end_time": None}
    if arm is not None:
        manifest["arm"] = arm
    (d / "manifest.json").write_text(json.dumps(manifest))
    (d / "spec.resolved.yaml").write_text(spec)
    lines, prob_lines = [], []
    for step, tok, flops, a1, a2 in curve:
        base = {"step": step, "gen_tokens": tok, "trained_tokens": tok // 2, "flops": flops, "wall_s": 1.0}
        lines.append({"kind": "train", **base, "reward_mean": 0.3, **(train_extra or {}).get(step, {})})
        ev = {"kind": "eval", **base, "n": 4, "acc@t1": a1, "acc@t2": a2}
        lines.append(dict(ev, **(eval_extra or {}).get(step, {})))
        last = step == curve[-1][0]
        for i, pid in enumerate(f"p{i}" for i in range(len(t1))):
            prob_lines.append({"step": step, "gen_tokens": tok, "problem_id": pid,
                               "t1": bool(t1[i]) if last else False,
                               "t2": bool(t2[i]) if last else False, "t2_null": None})
    x1, x2 = np.array(t1, bool), np.array(t2, bool)
    fin = dict(lines[-1], kind="final", **{"acc@t1": x1.mean(), "acc@t2": x2.mean(),
                                          "delta": x2.mean() - x1.mean(), "acc_oracle_gated": (x1 | x2).mean()})
    if feedback:
        fin.update({"i->c": (~x1 & x2).mean(), "c->i": (x1 & ~x2).mean(), "feedback_effect": 0.125,
                    "feedback_sensitivity": 0.5, "leakage_rate": 0.0, "feedback_tokens": 40.0})
    fin.update(extra or {})
    if final:
        lines.append(fin)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (d / "eval_problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prob_lines))
    if samples is not None:
        (d / "samples.jsonl").write_text("".join(json.dumps({"step": step, "problem_id": pid, "turns": turns}) + "\n"
                                                 for step, by_pid in samples.items() for pid, turns in by_pid.items()))
    return d


def table_row(md: str, label: str) -> list[str]:
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in\n{md}")


def table_column(md: str, header: str) -> list[str]:
    """The cells under ``header`` in the first Markdown table of ``md`` that has that column, top
    to bottom (comparison.md: one per arm, in the report's order of arms)."""
    col = None
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if col is None:
            col = cells.index(header) if header in cells else None
            found: list[str] = []
        elif not cells:
            return found
        elif not set(cells[0]) <= set("-:"):
            found.append(cells[col])
    if col is not None:
        return found
    raise AssertionError(f"no column {header!r} in\n{md}")


def episode(attempt: str, refine: str, ok: bool) -> list[dict]:
    """The turns of a samples.jsonl episode: a wrong attempt, a feedback, a refinement (right if ``ok``)."""
    return [{"kind": "attempt", "policy": "solver", "text": attempt, "reward": 0.0, "verdict": "wrong", "tokens": 5,
             "finish_reason": "stop"},
            {"kind": "feedback", "policy": "critic", "text": "check the carry", "reward": None, "verdict": None,
             "tokens": 4, "finish_reason": "stop"},
            {"kind": "refine", "policy": "solver", "text": refine, "reward": float(ok),
             "verdict": "ok" if ok else "wrong", "tokens": 5, "finish_reason": "stop"}]


# the shared trainer (tests/test_trainer.py, test_testbed_v3.py)


def make_spec(tmp_path, ckpt, algo="grpo", params=None, **over):
    """A validated run spec of ``algo`` on the tiny checkpoint ``ckpt`` (solver and critic), writing to tmp_path."""
    from conftest import minimal_spec
    from mlmt_bench.spec import validate_run

    d = minimal_spec(**over)
    d["output_dir"] = str(tmp_path / "runs")
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt), "lr": 1e-3},
                     "critic": {"model": "tiny", "path": str(ckpt), "lr": 1e-3}}
    d["algorithm"] = {"name": algo, "params": {"group_size": 4, **(params or {})}}
    d["backend"] = {"max_new_tokens": 12}
    d["eval"] = {"every": 0, "feedback_metrics": True}
    return validate_run(d, "test")


def launch_cli_process(args: list[str]):
    """``mlmt-bench -q ARGS`` of this checkout (not an installed copy) in a child process, with the
    test verifier registered (tests/launch_cli.py); stdout and stderr piped, as text."""
    import os
    import subprocess
    import sys

    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    return subprocess.Popen([sys.executable, str(tests / "launch_cli.py"), "-q", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def build_trainer(spec, tmp_path):
    """The trainer of ``spec``, scored by :class:`ParityVerifier`."""
    from mlmt_bench import runner
    from mlmt_bench.tracking import RunDir

    comp = runner.build(spec, progress=False)
    comp.verifier = ParityVerifier()
    run_dir = RunDir.create(spec.output_dir, spec.name, "", spec.seed)
    return runner.make_trainer(spec, comp, run_dir)


#: A shared base of a few steps of everything, on a small benchmark: seconds, not minutes
#: (tests/test_shared_base.py, test_reproducible.py).
TINY = dict(benchmark_options={"n_train": 200, "n_validation": 20, "n_test": 20}, steps=8, batch=4,
            check_problems=4, seed=0, allow_invalid=True)  # 8 steps: far from a valid critic


# sweeps with a fake runner (tests/test_sweep.py, test_sweep_report.py; fixtures in conftest.py)


def score(spec: RunSpec) -> float:
    return 1.0 - (spec.algorithm.params["lam"] - 0.3) ** 2


class FakeTrainer:
    """Evaluates at steps 0..3; ``curve(spec, step)`` gives acc@t2 at each (the last is final).
    It has no models (``policies``, ``base_critic``: what ``runner._train`` reads of a trainer)."""

    def __init__(self, spec: RunSpec, on_eval, curve):
        self.spec, self.on_eval, self.curve = spec, on_eval, curve
        self.policies: dict = {}
        self.base_critic = None

    def train(self, bar):
        record = {}
        task = bar.add_task("train", total=3, completed=0) if bar is not None else None
        for step in range(4):
            if step and bar is not None:
                bar.update(task, completed=step)
            value = self.curve(self.spec, step)
            record = {"kind": "eval", "step": step, "gen_tokens": 100 * step, "n": 8, "acc@t1": value / 2,
                      "acc@t2": value}
            if self.on_eval is not None:
                self.on_eval(record)
        if self.on_eval is not None:
            self.on_eval(record)  # the final evaluation repeats the last step's
        return {**record, "kind": "final"}


class FakeRun:
    """Stands in for runner.run; records every call."""

    def __init__(self, curve=lambda spec, step: score(spec), fail=lambda spec, trial: None):
        self.curve, self.fail, self.calls = curve, fail, []

    def __call__(self, spec, progress=True, *, extra_manifest=None, on_eval=None, bar=None, tracking_group=None):
        from mlmt_bench import runner
        from mlmt_bench.spec import dump_yaml
        from mlmt_bench.tracking import RunDir

        self.calls.append((spec, extra_manifest))
        run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
        if extra_manifest:
            run_dir.update_manifest(**extra_manifest)
        exc = self.fail(spec, extra_manifest["trial"])
        curve = self.curve

        class Trainer(FakeTrainer):
            def train(self, bar):
                if exc is not None:
                    raise exc
                return super().train(bar)

        return runner._train(Trainer(spec, on_eval, curve), run_dir, False, bar)


def mlmt_spec(out: Path) -> dict:
    """An mlmt run spec (tiny solver and critic, lam 0.5) writing its runs to ``out``."""
    from conftest import minimal_spec

    return minimal_spec(
        output_dir=str(out),
        policies={"solver": {"model": "tiny", "path": "CKPT"}, "critic": {"model": "tiny", "path": "CKPT"}},
        algorithm={"name": "mlmt", "params": {"group_size": 4, "lam": 0.5}})


class ScriptedBackend:
    """A generation backend that returns fixed texts in order (encoded + EOS), one per prompt, so
    conversations and metrics can be checked exactly."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def generate(self, model, tokenizer, prompts, *, max_new_tokens, **_):
        from mlmt_bench.rollout.backend import Generation

        out = []
        for _p in prompts:
            text = self.texts.pop(0)
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop", text))
        return out
