"""Reports published with their raw data (``mlmt-bench report EXP_DIR --out DIR --raw``): what they
hold, that ``mlmt-bench report DIR`` re-renders comparison.md and index.html byte for byte wherever
DIR lives (the source runs gone), and that the shipped per-problem outcomes recompute the table."""

from __future__ import annotations

import base64
import csv
import gzip
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.metrics.twoway import twoway_bootstrap
from mlmt_bench.report.compare import with_base_critic_arms
from mlmt_bench.report.episodes import find_disagreements
from mlmt_bench.report.runs import group_runs, load_run
from support import episode as _episode, make_run, table_column

RENDERED = ("comparison.md", "index.html", "acc_vs_tokens.png", "problems.html")


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _add_base_critic(run: Path, t2: list[int]) -> None:
    """The run as if evaluated with eval.base_critic: ``t2_base_critic`` in every problem row (``t2``
    at the last step, wrong before) and the ``base_critic/`` metrics in its eval and final records."""
    rows = [json.loads(line) for line in (run / "eval_problems.jsonl").read_text().splitlines()]
    last = max(r["step"] for r in rows)
    for r in rows:
        r["t2_base_critic"] = bool(t2[int(r["problem_id"][1:])]) if r["step"] == last else False
    (run / "eval_problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in recs:
        if rec["kind"] in ("eval", "final"):
            at_end = rec["kind"] == "final" or rec["step"] == last
            rec.update({"base_critic/acc@t1": rec["acc@t1"],
                        "base_critic/acc@t2": float(np.mean(t2)) if at_end else 0.0,
                        "base_critic/gen_tokens_eval": 900, "gen_tokens_eval": 300})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture()
def experiment(tmp_path: Path) -> Path:
    """An experiment directory as `mlmt-bench run EXPERIMENT` leaves it: grpo (2 seeds, with a base
    critic evaluation), mlmt (2 seeds), self_correct (1 seed), 8 problems; episodes logged at step 0
    (stale), at the final step of disputed problems and of p0, on which every arm agrees."""
    exp = tmp_path / "src" / "toy-20250101T000000Z"
    grpo_t = [1, 1, 0, 0, 0, 0, 0, 0]
    names: dict[str, list[str]] = {"grpo": [], "mlmt": [], "self_correct": []}
    for s in (0, 1):
        d = make_run(exp, f"toy-grpo-s{s}-2025010{s}T000000Z", seed=s, arm="grpo", feedback=False,
                     curve=[(0, 0, 0.0, .125, .125), (10, 1000 + s, 1e12, .2, .2), (20, 2000 + 50 * s, 2e12, .25, .25)],
                     t1=grpo_t, t2=grpo_t,
                     samples={0: {"p2": _episode("stale", "stale", False)},
                              20: {"p0": _episode("1", "1", True), "p2": _episode("12", "12", False)[:1]}})
        _add_base_critic(d, [1, 1, 1, 0, 0, 0, 0, s])
        names["grpo"].append(d.name)
        d = make_run(exp, f"toy-mlmt-s{s}-2025010{s}T000100Z", seed=s, arm="mlmt",
                     curve=[(0, 0, 0.0, .125, .25), (10, 3000, 3e12, .25, .6 + .1 * s),
                            (20, 6000 + 100 * s, 6e12, .25, 1.0)],
                     t1=grpo_t, t2=[1] * 7 + [s],
                     samples={20: {f"p{i}": _episode(f"attempt {i}", f"refined {i}", True) for i in range(8)}})
        names["mlmt"].append(d.name)
    d = make_run(exp, "toy-self_correct-s0-20250101T000200Z", seed=0, arm="self_correct",
                 curve=[(0, 0, 0.0, .25, .25), (20, 5000, 5e12, .5, .5)], t1=[1, 1, 0, 0, 1, 0, 0, 0],
                 t2=[1, 0, 1, 0, 1, 0, 0, 0], spec="name: x\nalgorithm: {name: self_correct}\n")
    names["self_correct"].append(d.name)
    (exp / "checkpoints-not-copied").mkdir()
    (exp / "experiment.json").write_text(json.dumps(
        {"name": "toy", "seeds": [0, 1], "arms": names, "started": "20250101T000000Z", "wall_s": {"total": 12.5},
         "comparison": {"comparison.md": str(exp / "comparison.md")}}, indent=2))
    return exp


def _published(experiment: Path, out: Path, *extra: str) -> dict:
    res = _cli("--json", "report", str(experiment), "--out", str(out), "--raw", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _bytes(d: Path) -> dict[str, bytes]:
    return {name: (d / name).read_bytes() for name in RENDERED}


def test_a_published_report_holds_its_raw_data_and_rerenders_byte_for_byte_anywhere(experiment, tmp_path, monkeypatch):
    pub = tmp_path / "reports" / "toy"
    summary = _published(experiment, pub)
    assert summary["published"]["bytes"] < 1_000_000 and not summary["published"]["over_limit"]
    # the JSON summary carries the v3 statistics
    assert summary["statistics"]["analysis"].startswith("two-way") and summary["statistics"]["n_boot"] == 10_000
    # Holm over the methods (METHOD v3): not over grpo's own test-time variant, grpo + base critic
    assert summary["statistics"]["holm_family"] == ["mlmt", "self_correct"]
    assert summary["paired"]["grpo + base critic"]["p_holm"] is None
    assert {"p_holm", "mde", "sign_flip_p", "per_seed_diff"} <= set(summary["paired"]["mlmt"])
    assert summary["paired"]["mlmt"]["per_seed_diff"] == {"0": 0.625, "1": 0.75}  # 7/8 and 8/8 against 2/8
    record = json.loads((pub / "experiment.json").read_text())
    # the arms list the copies relative to the report; the options are recorded; the source's
    # own output paths are not kept
    assert record["arms"]["grpo"] == [f"runs/toy-grpo-s{s}-2025010{s}T000000Z" for s in (0, 1)]
    assert record["report"] == {"title": "toy", "baseline": "grpo",
                                "at_flops": None, "raw": True}
    assert record["wall_s"] == {"total": 12.5} and "comparison" not in record
    runs = sorted(p.name for p in (pub / "runs").iterdir())
    assert len(runs) == 5 and sorted(p.name for p in pub.iterdir()) == sorted([*RENDERED, "experiment.json", "runs"])
    for run in runs:
        files = sorted(p.name for p in (pub / "runs" / run).iterdir())
        expected = ["eval_problems.jsonl.gz", "manifest.json", "metrics.jsonl.gz", "spec.resolved.yaml"]
        assert files in (expected, sorted([*expected, "samples.jsonl.gz"])), (run, files)
        src = experiment / run
        for name in ("metrics.jsonl", "eval_problems.jsonl"):  # the logs, whole
            assert gzip.decompress((pub / "runs" / run / f"{name}.gz").read_bytes()) == (src / name).read_bytes()
        assert (pub / "runs" / run / "manifest.json").read_bytes() == (src / "manifest.json").read_bytes()
    md = (pub / "comparison.md").read_text()
    assert "`runs/toy-grpo-s0-20250100T000000Z`" in md and str(tmp_path) not in md
    assert str(tmp_path) not in (pub / "index.html").read_text()
    # the per-seed table links each number to the run's copy in the report
    assert re.search(r'<td class="num" data-v="[0-9.]+"><a href="runs/toy-grpo-s0-20250100T000000Z/">',
                     (pub / "index.html").read_text())
    assert b"Matplotlib" not in (pub / "acc_vs_tokens.png").read_bytes()  # no version in the PNG
    first = _bytes(pub)

    # the source runs gone, the report copied elsewhere, its rendered files deleted: `mlmt-bench
    # report DIR` (in place, a relative path from another working directory) writes the same bytes
    shutil.rmtree(tmp_path / "src")
    moved = tmp_path / "elsewhere" / "deeper" / "toy-copy"
    shutil.copytree(pub, moved)
    for name in RENDERED:
        (moved / name).unlink()
    monkeypatch.chdir(tmp_path / "elsewhere")
    res = _cli("report", "deeper/toy-copy")
    assert res.exit_code == 0, res.output
    assert _bytes(moved) == first
    # and with --out naming it, or publishing it again from itself
    res = _cli("report", str(moved), "--out", str(moved), "--raw")
    assert res.exit_code == 0, res.output
    assert _bytes(moved) == first and json.loads((moved / "experiment.json").read_text()) == record


def test_the_shipped_outcomes_recompute_the_table(experiment, tmp_path):
    pub = tmp_path / "pub"
    summary = _published(experiment, pub)
    md = (pub / "comparison.md").read_text()
    record = json.loads((pub / "experiment.json").read_text())
    # an independent reading of the shipped files: each run's final step from metrics.jsonl.gz,
    # its per-problem outcomes there from eval_problems.jsonl.gz
    outcomes: dict[str, list[dict[str, bool]]] = {}
    for arm, dirs in record["arms"].items():
        for d in dirs:
            run = pub / d
            metrics = [json.loads(line)
                       for line in gzip.decompress((run / "metrics.jsonl.gz").read_bytes()).splitlines()]
            step = [m for m in metrics if m["kind"] == "final"][-1]["step"]
            rows = [json.loads(line)
                    for line in gzip.decompress((run / "eval_problems.jsonl.gz").read_bytes()).splitlines()]
            final = {r["problem_id"]: r for r in rows if r["step"] == step}
            outcomes.setdefault(arm, []).append({p: r["t2"] for p, r in final.items()})
            if any("t2_base_critic" in r for r in final.values()):
                outcomes.setdefault(f"{arm} + base critic", []).append(
                    {p: r["t2_base_critic"] for p, r in final.items()})
    arms = list(summary["arms"])
    assert arms == ["grpo", "grpo + base critic", "mlmt", "self_correct"] and set(outcomes) == set(arms)
    means = [100 * np.mean([np.mean(list(o.values())) for o in outcomes[a]]) for a in arms]
    assert [c.split("%")[0] for c in table_column(md, "acc@t2 (refine-all)")] == [f"{m:.1f}" for m in means]
    for a, cell in zip(arms, table_column(md, "acc@t2 (refine-all): 95% CI (seeds × problems)")):
        pids = sorted(outcomes[a][0])
        _, lo, hi, _ = twoway_bootstrap([[float(o[p]) for p in pids] for o in outcomes[a]], n_boot=10_000, seed=0)
        assert cell.startswith(f"{np.mean([np.mean(list(o.values())) for o in outcomes[a]]) * 100:.1f}% "
                               f"[{100 * lo:.1f}, {100 * hi:.1f}]")


def test_the_arms_that_refine_are_also_tested_against_grpo_with_the_same_test_time_help(experiment, tmp_path):
    """METHOD v3's like-for-like comparison is in the report itself: each arm that answers with a
    refinement against ``grpo + base critic``, Holm over those arms alone; grpo's derived rows and
    grpo itself are not in that family, and the differences are the ones `--baseline 'grpo + base
    critic'` gives."""
    summary = _published(experiment, tmp_path / "pub")
    help_ = summary["equal_help"]
    assert help_["baseline"] == "grpo + base critic" and help_["holm_family"] == ["mlmt", "self_correct"]
    # mlmt: 7/8 and 8/8 right; grpo + base critic: [1, 1, 1, 0, 0, 0, 0, s] (3/8 and 4/8)
    assert help_["paired"]["mlmt"]["per_seed_diff"] == {"0": 0.5, "1": 0.5}
    assert help_["paired"]["mlmt"]["mcnemar"]["0"] == {"b": 4, "c": 0, "p_value": 0.125}
    md = (tmp_path / "pub" / "comparison.md").read_text()
    section = md.split("## Against grpo + base critic (equal test-time help)\n", 1)[1].split("\n## ", 1)[0]
    assert "Holm-adjusted over the 2 methods compared with grpo + base critic" in section
    assert [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ")][1:] == [
        "| mlmt", "| self_correct"]
    assert "(and, a separate family, over the 2 methods compared with grpo + base critic)" in md
    page = (tmp_path / "pub" / "index.html").read_text()
    assert "id='equal-help'" in page
    csv_b64 = re.search(r'<a download="metrics.csv" href="data:[^;]+;base64,([A-Za-z0-9+/=]+)">', page)[1]
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(base64.b64decode(csv_b64).decode()))}
    assert float(rows["mlmt"]["acc@t2_minus_grpo + base critic"]) == pytest.approx(0.5)
    assert rows["grpo"]["acc@t2_minus_grpo + base critic"] == ""  # grpo refines after no critic of its own

    alone = _cli("--json", "report", str(experiment), "--out", str(tmp_path / "alone"), "--baseline",
                 "grpo + base critic")
    assert alone.exit_code == 0, alone.output
    alone_paired = json.loads(alone.stdout)["paired"]
    for arm in help_["holm_family"]:
        assert {k: help_["paired"][arm][k] for k in ("diff", "lo", "hi", "p_value", "mde")} == {
            k: alone_paired[arm][k] for k in ("diff", "lo", "hi", "p_value", "mde")}
    assert json.loads(alone.stdout)["equal_help"] is None  # no "+ base critic" row of that baseline


def test_only_the_episodes_the_report_reads_are_shipped(experiment, tmp_path):
    pub = tmp_path / "pub"
    _published(experiment, pub)

    def examples(exp_dir: Path):
        loaded = with_base_critic_arms({a: [load_run(p) for p in ps] for a, ps in group_runs([exp_dir]).items()})
        ex = find_disagreements(loaded)
        return ex.n_disputed, ex.n_covered, [
            (d.problem_id, {a: (e.seed, e.correct, e.turns) for a, e in d.episodes.items()}) for d in ex.shown]

    assert examples(pub) == examples(experiment)
    assert examples(pub)[:2] == (7, 1)  # p1..p7 disputed; only p2 has a right and a wrong episode
    shipped = {run.name: [json.loads(line)
                          for line in gzip.decompress((run / "samples.jsonl.gz").read_bytes()).splitlines()]
               for run in (pub / "runs").iterdir() if (run / "samples.jsonl.gz").is_file()}
    # the episodes at the final step of the first seed of each arm (grpo's serves its base-critic
    # row too): p2's for the example where the arms disagree, and every problem's for the problem
    # browser (problems.html); not step 0's, not the second seed's
    assert {name: [(r["step"], r["problem_id"]) for r in rows] for name, rows in shipped.items()} == {
        "toy-grpo-s0-20250100T000000Z": [(20, "p0"), (20, "p2")],
        "toy-mlmt-s0-20250100T000100Z": [(20, f"p{i}") for i in range(8)]}
    # so the published browser shows what one rendered from the runs themselves shows
    assert _cli("report", str(experiment), "--out", str(tmp_path / "src-report")).exit_code == 0
    assert (pub / "problems.html").read_text() == (tmp_path / "src-report" / "problems.html").read_text()


def test_a_report_read_at_equal_flops_rerenders_with_its_recorded_budget(experiment, tmp_path):
    pub = tmp_path / "pub"
    _published(experiment, pub, "--at-flops", "2e12", "--baseline", "mlmt")
    first = _bytes(pub)
    assert json.loads((pub / "experiment.json").read_text())["report"]["at_flops"] == 2e12
    assert "**Read at 2e+12 FLOPs**" in first["comparison.md"].decode() and "## Against mlmt" in first[
        "comparison.md"].decode()
    for name in RENDERED:
        (pub / name).unlink()
    res = _cli("report", str(pub))
    assert res.exit_code == 0, res.output
    assert _bytes(pub) == first


def test_publishing_refuses_what_it_would_overwrite_and_says_what_is_missing(experiment, tmp_path):
    # into an experiment directory: its experiment.json lists its own runs
    res = _cli("report", str(experiment), "--out", str(experiment), "--raw")
    assert res.exit_code == 2 and "holds an experiment's own experiment.json" in res.output
    # into a report whose runs/ holds runs this one does not use
    pub = tmp_path / "pub"
    (pub / "runs" / "old-run").mkdir(parents=True)
    res = _cli("report", str(experiment), "--out", str(pub), "--raw")
    assert res.exit_code == 2 and "holds runs this report does not use (old-run)" in res.output
    # a report copied without its runs (as the v2 reports were committed) cannot be re-rendered: said so
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(experiment / "experiment.json", bare / "experiment.json")
    res = _cli("report", str(bare))
    assert res.exit_code == 2 and "not found" in res.output and "--raw" in res.output
    # without --out, a report is re-rendered in place: that needs one experiment directory
    res = _cli("report", str(experiment / "toy-grpo-s0-20250100T000000Z"))
    assert res.exit_code == 2 and "give --out DIR" in res.output


def test_a_report_published_from_run_directories_rerenders_with_the_title_it_was_written_with(experiment, tmp_path):
    """Published from some runs (no experiment.json given, so no title: "Comparison"), the report
    re-renders in place byte for byte: the recorded empty title is kept, not replaced by the
    report directory's name."""
    pub = tmp_path / "reports" / "some-runs"
    runs = [str(p) for p in sorted(experiment.glob("toy-*-s0-*"))]
    res = _cli("report", *runs, "--out", str(pub), "--raw")
    assert res.exit_code == 0, res.output
    first = _bytes(pub)
    assert first["comparison.md"].startswith(b"# Comparison\n")
    res = _cli("report", str(pub))
    assert res.exit_code == 0, res.output
    assert _bytes(pub) == first


def test_a_renamed_experiment_directory_is_titled_with_its_spec_name(experiment, tmp_path):
    renamed = tmp_path / "src" / "headline-restored"
    experiment.rename(renamed)
    record = _published(renamed, tmp_path / "pub")
    assert record["title"] == "toy"
    assert (tmp_path / "pub" / "comparison.md").read_text().startswith("# toy\n")


def test_an_experiment_part_run_is_published_with_its_finished_runs_and_says_so(experiment, tmp_path):
    """A long experiment is published session by session (report --raw, then run --restore): an
    arm with no finished run yet is left out of the tables, listed empty in experiment.json, and
    the report says which runs have finished; the copy re-renders byte for byte."""
    record = json.loads((experiment / "experiment.json").read_text())
    shutil.rmtree(experiment / record["arms"]["self_correct"][0])
    record["arms"] = {"grpo": record["arms"]["grpo"][:1], "self_correct": [], "mlmt": record["arms"]["mlmt"]}
    (experiment / "experiment.json").write_text(json.dumps(record))
    pub = tmp_path / "partial"
    summary = _published(experiment, pub)
    assert list(summary["arms"]) == ["grpo", "grpo + base critic", "mlmt"]
    note = ("PARTIAL: 3 of 6 arm × seed runs of this experiment have finished (grpo 1 of 2; self_correct 0 of 2; "
            "mlmt 2 of 2); each arm is shown with its finished seeds only, and an arm with none is left out.")
    assert summary["notes"][0] == note and f"- {note}" in (pub / "comparison.md").read_text()
    assert json.loads((pub / "experiment.json").read_text())["arms"] == {
        "grpo": ["runs/toy-grpo-s0-20250100T000000Z"], "self_correct": [],
        "mlmt": [f"runs/toy-mlmt-s{s}-2025010{s}T000100Z" for s in (0, 1)]}
    first = _bytes(pub)
    for name in RENDERED:
        (pub / name).unlink()
    res = _cli("report", str(pub))
    assert res.exit_code == 0, res.output
    assert _bytes(pub) == first
