"""What a run, a base build and an experiment print while they work and when they end (issue 22):
an ETA in a log's progress lines, every evaluation announced when it starts and when it is done,
a base build that says it happens once and ends with its check, an experiment that ends with a
table of its arms and the paths of its comparison, and paths never wrapped mid-word in a log."""

from __future__ import annotations

import io
import json
import re

from mlmt_bench.io import progress
from mlmt_bench.io.progress import LineProgress, announce, duration, print_table
from support import TINY, make_run


def test_a_log_line_gives_the_eta_from_the_rate_since_this_process_started(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    bar = LineProgress(stream=out)
    task = bar.add_task("train", total=100, completed=50)  # a resumed run: half done before this process
    now[0] = 130.0
    bar.update(task, completed=60)  # 10 % in 30 s: 40 % left is 120 s
    bar.update(task, completed=100)
    lines = out.getvalue().splitlines()
    assert lines[0] == "train: 60% 30s ETA 2 min 00 s"
    assert lines[1] == "train: 100% 30s"  # done: no ETA
    assert [duration(s) for s in (0.4, 59, 61, 3600 + 5 * 60)] == ["0 s", "59 s", "1 min 01 s", "1 h 05 min"]


def test_announce_prints_a_line_beside_any_bar_and_nothing_without_one():
    out = io.StringIO()
    announce(LineProgress(stream=out), "evaluating 8 test problems at step 0 ...")
    announce(None, "never shown")

    class StepsOnly:  # a sweep's stand-in that counts steps and has no console
        def add_task(self, *a, **k):
            return 0

    announce(StepsOnly(), "never shown")
    assert out.getvalue() == "evaluating 8 test problems at step 0 ...\n"


def test_a_tiny_runs_evaluations_are_announced_start_and_end(tiny_ckpt, tmp_path, capsys):
    """Step 0's evaluation and the last one say when they start and that they reached all problems;
    the run ends with its table and its directory on a line of its own."""
    from conftest import minimal_spec
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    spec = minimal_spec(output_dir=str(tmp_path / "runs"))
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    spec["eval"] = {"every": 0}
    result = runner.run(validate_run(spec, "t"), progress=True)
    err = capsys.readouterr().err
    assert "evaluating 8 test problems at step 0 (the starting point) ...\n" in err
    assert re.search(r"^evaluated step 0: 8/8 problems \(100%\) in \d+ s, acc@t1 \d+\.\d%, acc@t2 \d+\.\d%$", err,
                     re.M), err
    assert "evaluating 8 test problems at step 2 ...\n" in err and "evaluated step 2: 8/8 problems (100%)" in err
    assert f"run directory: {result['run_dir']}\n" in err  # whole, on one line


def test_a_base_build_says_it_happens_once_and_ends_with_its_check(tmp_path, capsys):
    from mlmt_bench.warmstart.shared_base import BaseConfig, ensure_base

    cfg = BaseConfig(**TINY)
    ensure_base(cfg, cache_dir=tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "building shared base tiny-0.5m seed 0 (first run only: cached for every later run)" in err
    assert re.search(r"first run only: cached for every later run\): \d/8 \d+% \d+s ETA ", err), err
    assert f"checking base {cfg.key()} on 4 validation problems (greedy and at T=" in err
    done = next(line for line in err.splitlines() if line.startswith("shared base "))
    assert re.fullmatch(rf"shared base {cfg.key()} built in \d+ s on 1 thread, cached at {tmp_path / cfg.key()} "
                        r"\(later runs reuse it\): validation acc@t1 \d+\.\d%, acc@t2 after its own feedback "
                        r"\d+\.\d%, after g∅ \d+\.\d%, after the oracle's \d+\.\d%; INVALID testbed: .+", done), done
    ensure_base(cfg, cache_dir=tmp_path, progress=True)  # cached: nothing to say
    assert capsys.readouterr().err == ""


def test_an_experiment_ends_with_a_table_of_its_arms_and_where_its_comparison_is(tmp_path, capsys):
    from mlmt_bench.cli import _experiment_summary
    from mlmt_bench.report.compare import build_comparison

    curve = [(0, 0, 0.0, .25, .25), (5, 100, 1e9, .5, .5)]
    a = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="grpo", curve=curve, t1=[1, 1, 0, 0], t2=[1, 1, 0, 0],
                 feedback=False)
    b = make_run(tmp_path, "b-20250101T000000Z", seed=0, arm="mlmt", curve=curve, t1=[1, 0, 0, 0], t2=[1, 1, 1, 0])
    out = tmp_path / ("a-long-directory-name-" * 4) / "exp"
    summary = build_comparison({"grpo": [a], "mlmt": [b]}, out, baseline="grpo", title="quickstart")
    _experiment_summary({"run_dir": str(out), "comparison": summary})
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    header = next(line for line in lines if "arm" in line and "acc@t1" in line)
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["arm", "acc@t1", "acc@t2 [95% CI]",
                                                                 "gain over step 0", "vs grpo (p Holm)"]
    rows = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("│").split("│")] for line in lines
                                  if line.startswith("│"))}
    t2 = summary["arms"]["mlmt"]["ci"]["acc@t2"]
    assert rows["mlmt"][:2] == ["25.0%", f"75.0% [{100 * t2['lo']:.1f}, {100 * t2['hi']:.1f}] (1 seed: problems only)"]
    assert rows["grpo"][3] == "baseline" and rows["mlmt"][3].startswith("+25.0 pp [")
    assert f"comparison: {out / 'comparison.md'}" in lines and f"page: {out / 'index.html'}" in lines
    assert captured.out == f"run directory: {out}\n"


def test_a_table_in_a_log_is_as_wide_as_it_needs_and_paths_stay_whole(capsys):
    path = "/runs/" + "x" * 150 + "/comparison.md"
    print_table("t", ["arm", "value"], [["a" * 90, "1"]], [f"comparison: {path}"])
    err = capsys.readouterr().err
    assert f"comparison: {path}\n" in err and "a" * 90 in err and "…" not in err
    assert json.dumps(err)  # plain text
