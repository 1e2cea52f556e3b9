"""The HTML report (index.html): its content from hand-built run directories, the example
episodes where arms disagree, escaping of model output, the inline SVG charts, and the page as
headless Chromium renders it (no console error, every figure decoded or drawn, nothing fetched
from outside the file)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from headless_chromium import find_chromium, load_page
from mlmt_bench.report.compare import build_comparison
from mlmt_bench.report.episodes import find_disagreements
from mlmt_bench.report.html import esc
from mlmt_bench.report.page_script import CSP, SORT_JS
from mlmt_bench.report.runs import load_run
from mlmt_bench.report.svg import Interval, Series, bar_chart, forest_chart, line_chart, nice_ticks, padded
from support import episode as _episode, make_run

# Model output that would run script, load an image or break the page if it were not escaped;
# with a NUL and a lone surrogate (a broken generation) that UTF-8 cannot encode.
HOSTILE = ('</pre></div><script>console.error("injected")</script><img src="x" onerror="console.error(1)">'
           '<style>body{display:none}</style> & \x00 \ud800 done')


def _feedback_evals(scale: float) -> dict[int, dict]:
    return {step: {"feedback_effect": scale * i / 10, "feedback_sensitivity": 0.1 * i, "leakage_rate": 0.0,
                   "correction_rate": 0.2 * i, "regression_rate": 0.05, "i->i": 0.5 - 0.1 * i}
            for i, step in enumerate((0, 10, 20))}


@pytest.fixture()
def experiment(tmp_path: Path) -> dict[str, list[Path]]:
    """grpo (2 seeds) right on p0, p1 of 8 problems; mlmt (2 seeds) right on all 8 at the end,
    with feedback metrics over training; samples at step 0 (stale) and at the final step; train
    records with a KL (grpo's 0), and mlmt's with the critic's KL and the attempts' length."""
    r = tmp_path / "runs"
    grpo_t = [1, 1, 0, 0, 0, 0, 0, 0]
    grpo = [make_run(r, f"grpo-2025010{s}T000000Z", seed=s, arm="grpo", feedback=False,
                     curve=[(0, 0, 0.0, .125, .125), (10, 1000 + s, 1e12, .2, .2), (20, 2000 + 50 * s, 2e12, .25, .25)],
                     t1=grpo_t, t2=grpo_t, train_extra={step: {"kl/solver": 0.0} for step in (0, 10, 20)},
                     samples={20: {"p2": [dict(_episode("12", "12", False)[0], verdict="wrong")]}})
            for s in (0, 1)]
    mlmt = [make_run(r, f"mlmt-2025010{s}T000000Z", seed=s, arm="mlmt",
                     curve=[(0, 0, 0.0, .125, .25), (10, 3000, 3e12, .25, .6 + .1 * s),
                            (20, 6000 + 100 * s, 6e12, .25, 1.0)],
                     t1=grpo_t, t2=[1] * 8, eval_extra=_feedback_evals(1 + s),
                     train_extra={step: {"kl/solver": 0.01 * i * (1 + s), "kl/critic": 0.02, "len/attempt": 20 + s}
                                  for i, step in enumerate((0, 10, 20))},
                     samples={0: {"p2": _episode("stale", "stale", False)},
                              20: {"p2": _episode("7 + 5 = 13", HOSTILE, True),
                                   "p3": _episode("9", "10", True)}})
            for s in (0, 1)]
    return {"grpo": grpo, "mlmt": mlmt}


def test_disagreements_come_from_the_final_step_most_disputed_first(experiment):
    loaded = {arm: [load_run(p) for p in paths] for arm, paths in experiment.items()}
    ex = find_disagreements(loaded, limit=3)
    # p2..p7: grpo 0% (both seeds), mlmt 100%; only p2 has a logged episode in both arms
    # (grpo's p2 turns end wrong, mlmt's right); p3 has mlmt's only, so it shows no contrast
    assert (ex.n_disputed, ex.n_covered) == (6, 1)
    [d] = ex.shown
    assert d.problem_id == "p2" and d.accuracy == {"grpo": 0.0, "mlmt": 1.0}
    assert d.episodes["mlmt"].seed == 0 and d.episodes["mlmt"].correct
    assert d.episodes["mlmt"].turns[2]["text"] == HOSTILE  # the final step's episode, not step 0's
    assert not d.episodes["grpo"].correct


def test_index_html_content_and_escaping(experiment, tmp_path):
    out = tmp_path / "report"
    summary = build_comparison(experiment, out, baseline="grpo", title="toy <b>")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert summary["files"]["index.html"] == str(out / "index.html")
    # self-contained: no script but the table sorter, which the page's policy alone lets run; no
    # external reference; the PNG embedded, the other figures inline SVG: the forest chart of the
    # differences from grpo, 5 feedback-metric panels (mlmt's eval records have them), the transition
    # bars and the training dynamics: reward and KL of both arms, the response length of mlmt's alone
    # (grpo's row says it logged none)
    assert page.count("<script") == 1 and f"<script>{SORT_JS}</script>" in page
    assert f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 1 and page.count("<svg ") == 1 + 5 + 1 + 5
    # the forest chart: mlmt's one row, its +75.0 pp significant (a filled dot), in the baseline's section
    forest = re.search(r'<svg [^>]*aria-label="final acc@t2 − grpo \(points\)".*?</svg>', page).group(0)
    assert page.index(forest) > page.index("<h2 id='baseline'>") and forest.count("<circle") == 1
    assert re.search(r'<circle [^>]*fill="#ff7f0e" stroke="#ff7f0e"[^>]*><title>mlmt: \+75\.0 pp \[', forest)
    assert page.count("<p class=sub>not logged</p>") == 1
    # every run-supplied text escaped: the title and the model's output
    assert "<title>toy &lt;b&gt;</title>" in page and "toy <b>" not in page
    assert HOSTILE not in page and esc(HOSTILE[:40]) in page and "\x00" not in page
    # the same numbers as comparison.md; the significant difference marked (sign flips over 6
    # problems, all +1: p = 2/64); oracle-gated numbers labelled
    md = (out / "comparison.md").read_text()
    assert "100.0% ± 0.0" in md and ">100.0% ± 0.0<" in page
    assert summary["paired"]["mlmt"]["sign_flip_p"] == pytest.approx(2 / 64)
    assert re.search(r'<td class="num sig up">\+75\.0 pp \*<div class="sub">95% CI', page)
    assert '<span class="badge">oracle-gated</span>' in page
    # cost per method: trained tokens and wall seconds too (tok // 2 and 1.0 s in make_run)
    assert re.search(r"<th>mlmt</th><td class=\"num\">6050 ± 71</td><td class=\"num\">3025 ± 35</td>", page)
    assert "1 of them with logged episodes" in page
    # per seed: each run's final acc@t1 → acc@t2, no link to runs outside the report's directory
    # (sorted by acc@t2, the cell's data-v, not by the acc@t1 its text starts with)
    assert ('<tr><th>mlmt</th><td class="num" data-v="1.0">25.0% → 100.0%</td>'
            '<td class="num" data-v="1.0">25.0% → 100.0%</td></tr>' in page) and "<th class=sort>seed 1</th>" in page


def _tables(page: str) -> list[list[list[str]]]:
    """Each <table> of the page as rows of cell texts (tags stripped, the first line of a cell)."""
    def text(cell: str) -> str:
        return html.unescape(re.sub(r"<[^>]+>", "", re.split(r"<div", cell, maxsplit=1)[0])).strip()

    return [[[text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
             for row in re.findall(r"<tr>(.*?)</tr>", table)]
            for table in re.findall(r"<table[^>]*>(.*?)</table>", page)]


def test_arms_are_rows_with_the_baseline_first(experiment, tmp_path):
    """The headline table lists arms as rows, the baseline first whatever order the arms came in,
    metrics as columns; the other metrics' tables, per seed and cost, the same rows in the same order."""
    out = tmp_path / "report"
    build_comparison({"mlmt": experiment["mlmt"], "grpo": experiment["grpo"]}, out, baseline="grpo", title="toy")
    page = (out / "index.html").read_text(encoding="utf-8")
    tables = _tables(page)
    headline = tables[0]
    assert headline[0] == ["arm", "acc@t1", "acc@t2", "gain in acc@t2", "acc@t2 − grpo's", "seeds × problems"]
    assert [row[0] for row in headline[1:]] == ["grpobaseline", "mlmt"]
    assert headline[1][2] == "25.0% ± 0.0" and headline[2][2] == "100.0% ± 0.0"
    assert headline[1][4] == "baseline" and headline[2][4] == "+75.0 pp *"
    both = [[row[0] for row in t[1:]] for t in tables if t[0][0] == "arm" and len(t) == 3]  # not the paired one
    assert len(both) == 6 and all(arms == ["grpobaseline", "mlmt"] for arms in both)
    assert "<th class=sort>acc@t2<div class=sub>(refine-all)</div></th>" in page


def test_what_each_arm_is(tmp_path):
    """The arms' distinguishing settings: the fixed columns (those every arm shares said once above
    the table), then each arm's settings that most arms (of its algorithm) do not share; its seeds'
    disagreements; a link to its spec.resolved.yaml."""
    from mlmt_bench.report.arm_specs import arm_specs

    def spec(name: str, algorithm: str, params: str, extra: str = "") -> str:
        return (f"name: {name}\nseed: 0\noutput_dir: runs/{name}\nalgorithm:\n  name: {algorithm}\n  params:\n"
                + "".join(f"    {p}\n" for p in params.split(";") if p)
                + f"policies:\n  solver:\n    lr: 0.0001\n{extra}")

    r = tmp_path / "runs"
    mlmt = "group_size: 8;lam: 0.5;variant: full;value: learned"
    specs = {"grpo": [spec("g", "grpo", "group_size: 8", "eval:\n  base_critic: true\n")],
             "mlmt": [spec("m", "mlmt", mlmt), spec("m1", "mlmt", mlmt, "train:\n  steps: 9\n")],
             "mlmt-value_none": [spec("n", "mlmt", mlmt.replace("learned", "none"))],
             "mlmt-verdict": [spec("v", "mlmt", mlmt + ";critic_reward: helpfulness+verdict")]}
    dirs = {arm: [make_run(r, f"{arm}-2025010{s}T000000Z", seed=s, arm=arm, curve=[(0, 0, 0.0, .5, .5)],
                           t1=[1, 0], t2=[1, 0], spec=text) for s, text in enumerate(texts)]
            for arm, texts in specs.items()}
    loaded = {arm: [load_run(p) for p in paths] for arm, paths in dirs.items()}
    got = {a.arm: a for a in arm_specs(loaded)}
    assert got["grpo"].columns == {"algorithm": "grpo", "G": 8, "lr (solver)": 0.0001}
    assert got["mlmt"].columns == {"algorithm": "mlmt", "variant": "full", "λ": 0.5, "G": 8, "lr (solver)": 0.0001}
    assert got["grpo"].other == [("eval.base_critic", True)]  # the others have none: not "false" for three arms
    assert got["mlmt"].other == [] and got["mlmt"].seeds_differ == ["train.steps"]
    assert got["mlmt-value_none"].other == [("algorithm.params.value", "none")]
    assert got["mlmt-verdict"].other == [("algorithm.params.critic_reward", "helpfulness+verdict")]
    build_comparison(dirs, tmp_path, baseline="grpo")  # the runs inside the report's directory: linked
    page = (tmp_path / "index.html").read_text()
    table = next(t for t in _tables(page) if "base" in t[0])
    assert table[0] == ["arm", "algorithm", "variant", "λ", "base",
                        "its other settings that most arms (of its algorithm) do not share", "spec"]
    assert table[1] == ["grpobaseline", "grpo", "–", "–", "–", "eval.base_critic: true", "spec.resolved.yaml"]
    assert table[3][:4] == ["mlmt-value_none", "mlmt", "full", "0.5"]
    assert "<p class=sub>Every arm: G 8, lr (solver) 0.0001.</p>" in page
    assert '<a href="runs/mlmt-20250101T000000Z/spec.resolved.yaml">' not in page  # the arm's first run's
    assert '<a href="runs/mlmt-20250100T000000Z/spec.resolved.yaml">spec.resolved.yaml</a>' in page
    build_comparison(dirs, tmp_path / "report", baseline="grpo")  # outside: no link that breaks on a copy
    assert "spec.resolved.yaml</a>" not in (tmp_path / "report" / "index.html").read_text()


def test_train_curves_read_a_metric_under_either_of_its_names(tmp_path):
    """A train metric logged as TRL's ``kl`` by one seed and as ``kl/solver`` by the other: the
    curve is the mean of both at each step, and their spread."""
    from mlmt_bench.report.figures import aggregate_curves

    r = tmp_path / "runs"
    runs = [make_run(r, f"a-2025010{s}T000000Z", seed=s, arm="a", curve=[(0, 0, 0.0, .5, .5), (10, 100, 1e9, .5, .5)],
                     t1=[1, 0], t2=[1, 0], train_extra={0: {key: 0.1 + 0.2 * s}, 10: {key: 0.3 + 0.2 * s}})
            for s, key in enumerate(("kl", "kl/solver"))]
    c = aggregate_curves([load_run(p) for p in runs], "gen_tokens", ("kl", "kl/solver"), train=True)
    assert c["x"].tolist() == [0, 100] and c["n"].tolist() == [2, 2]
    assert c["y"] == pytest.approx([0.2, 0.4]) and c["sd"] == pytest.approx([0.2 / 2 ** 0.5] * 2)
    assert aggregate_curves([load_run(p) for p in runs], "gen_tokens", "kl", train=True)["n"].tolist() == [1, 1]


def test_training_dynamics_grid(experiment):
    """One row per arm (the baseline first), a column per metric some arm logged (the arms share
    its axes), the baseline's lines in grey behind the other arms', "not logged" where an arm has
    none of a column's keys; a line constant across every arm says so instead of spanning -1..1."""
    from mlmt_bench.report.dynamics import BASELINE_GREY, dynamics_grid
    from mlmt_bench.report.svg import arm_color

    loaded = {arm: [load_run(p) for p in paths] for arm, paths in experiment.items()}
    grid = dynamics_grid(loaded, "grpo")
    assert grid is not None
    assert [p.title for p in grid.panels] == ["reward (batch mean)", "KL to the reference",
                                              "response length (tokens/turn)"]
    (grpo, (reward_g, kl_g, length_g)), (mlmt, (reward_m, kl_m, length_m)) = grid.rows
    assert (grpo, mlmt) == ("grpo", "mlmt") and length_g is None and length_m is not None
    assert reward_g is not None and kl_g is not None and reward_m is not None and kl_m is not None
    assert BASELINE_GREY in reward_m and BASELINE_GREY not in reward_g
    # reward_mean 0.3 in every run: one tick at 0.3, and said; the KL column spans mlmt's 0..0.06
    assert "constant 0.3" in reward_g and ">0.3</text>" in reward_g and "constant" not in kl_g
    # mlmt's KL: grpo's solver line in grey, its own solver line solid and critic line dashed
    assert kl_m.count("<polyline") == 3 and kl_m.count('stroke-dasharray="4 3"') == 1
    ticks = re.findall(r">([^<]*)</text>", kl_g)
    assert ticks == ["0", "0.025", "0", "5k"] and re.findall(r">([^<]*)</text>", kl_m) == ticks  # shared axes
    # a row derived from grpo's runs (its + base critic evaluation) trained nothing of its own: no
    # row, and mlmt keeps the colour of its place among all the page's arms (the third)
    with_derived = {"grpo": loaded["grpo"], "grpo + base critic": loaded["grpo"], "mlmt": loaded["mlmt"]}
    again = dynamics_grid(with_derived, "grpo")
    assert again is not None and [arm for arm, _ in again.rows] == ["grpo", "mlmt"]
    assert arm_color(2) in str(again.rows[1][1][0]) and arm_color(1) not in str(again.rows[1][1][0])


def test_the_table_and_the_outcomes_download_as_csv_from_the_page(experiment, tmp_path):
    """index.html embeds metrics.csv (the table's numbers, as fractions) and outcomes.csv.gz (each
    run's final per-problem outcomes) as downloads; their values are the summary's and the runs'."""
    import base64
    import csv
    import gzip
    import io

    out = tmp_path / "report"
    summary = build_comparison(experiment, out, baseline="grpo", title="toy")
    page = (out / "index.html").read_text(encoding="utf-8")
    files = {m[0]: base64.b64decode(m[1]) for m in
             re.findall(r'<a download="([^"]+)" href="data:[^;]+;base64,([A-Za-z0-9+/=]+)">', page)}
    assert sorted(files) == ["metrics.csv", "outcomes.csv.gz"]
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(files["metrics.csv"].decode()))}
    assert sorted(rows) == ["grpo", "mlmt"] and rows["mlmt"]["seeds"] == "0 1"
    assert float(rows["mlmt"]["acc@t2_mean"]) == 1.0 and float(rows["grpo"]["acc@t2_mean"]) == 0.25
    ci = summary["arms"]["mlmt"]["ci"]["acc@t2"]
    assert float(rows["mlmt"]["acc@t2_ci_lo"]) == ci["lo"] and rows["mlmt"]["acc@t2_ci_interval"] == ci["interval"]
    assert float(rows["mlmt"]["acc@t2_minus_grpo"]) == pytest.approx(0.75)
    assert float(rows["mlmt"]["acc@t2_minus_grpo_p_holm"]) == summary["paired"]["mlmt"]["p_holm"]
    assert rows["grpo"]["acc@t2_minus_grpo"] == ""  # the baseline against itself: empty, not 0
    outcomes = list(csv.DictReader(io.StringIO(gzip.decompress(files["outcomes.csv.gz"]).decode())))
    assert len(outcomes) == 2 * 2 * 8  # arms x seeds x problems
    mlmt_s1 = {r["problem_id"]: (r["t1"], r["t2"]) for r in outcomes if r["arm"] == "mlmt" and r["seed"] == "1"}
    assert mlmt_s1 == {f"p{i}": ("1" if i < 2 else "0", "1") for i in range(8)}
    assert {r["run"] for r in outcomes if r["arm"] == "grpo"} == set(summary["arms"]["grpo"]["runs"])
    build_comparison(experiment, tmp_path / "again", baseline="grpo", title="toy")  # the same bytes again (gzip
    assert (tmp_path / "again" / "index.html").read_text(encoding="utf-8") == page   # without a timestamp)


def test_the_page_says_when_samples_cover_no_disagreement(tmp_path):
    r = tmp_path / "runs"
    a = make_run(r, "grpo-20250101T000000Z", seed=0, arm="grpo", feedback=False, curve=[(0, 0, 0.0, .5, .5)],
                 t1=[1, 1, 0, 0], t2=[1, 1, 0, 0], samples={0: {"p0": _episode("1", "1", True)}})
    b = make_run(r, "m-20250101T000000Z", seed=0, arm="m", curve=[(0, 0, 0.0, .5, .75)],
                 t1=[1, 1, 0, 0], t2=[1, 1, 1, 0], samples={0: {"p0": _episode("1", "1", True)}})
    build_comparison({"grpo": [a], "m": [b]}, tmp_path / "o")
    page = (tmp_path / "o" / "index.html").read_text()
    assert "1 problem where the arms" in page and "samples.jsonl covers none of the problems" in page
    assert "No arm recorded feedback metrics" in page  # curves come from eval records; these have none


def test_svg_charts_ticks_bands_and_escaping():
    assert nice_ticks(*padded(0, 100)) == [0, 25, 50, 75, 100]
    assert nice_ticks(*padded(0, 6100, 0.03)) == [0, 2000, 4000, 6000]
    assert nice_ticks(-0.013, 0.0) == [-0.01, -0.005, 0.0]
    nasty = '</svg><script>alert(1)</script>'
    two_seeds = Series(nasty, "#1f77b4", [0, 1, 2], [1.0, 2.0, 3.0], [0.5, 1.5, 2.5], [1.5, 2.5, 3.5])
    one_seed = Series("b", "#ff7f0e", [0, 1, 2], [3.0, 2.0, 1.0], [float("nan")] * 3, [float("nan")] * 3)
    chart = line_chart([two_seeds, one_seed], title=nasty, x_label="tokens")
    assert "<script" not in chart and chart.count("</svg>") == 1 and "&lt;script&gt;" in chart
    assert chart.count("<polygon") == 1 and chart.count("<polyline") == 2 and chart.count("<circle") == 6
    assert "not recorded" in line_chart([], title="t", x_label="x")
    # a long title wraps onto a second line inside the chart's width, and moves the plot area down
    long = "value explained variance (mean of the steps since the last evaluation)"
    wrapped = line_chart([two_seeds], title=long, x_label="tokens")
    lines = re.findall(r'font-weight="600" text-anchor="middle">([^<]*)</text>', wrapped)
    assert " ".join(lines) == long and len(lines) == 2 and all(len(t) * 6.8 <= 380 for t in lines)
    assert '<rect x="48" y="38"' in wrapped and '<rect x="48" y="24"' in chart
    # a constant series: its one value as the only tick, not a -1..1 axis
    flat = line_chart([Series("z", "#000", [0, 1, 2], [0.0, 0.0, 0.0])], title="leakage", x_label="x")
    assert "constant 0" in flat and ">-1</text>" not in flat and ">0</text>" in flat
    bars = bar_chart(["i→c", "c→i"], [Series(nasty, "#1f77b4", [0, 1], [10.0, float("nan")], None, [2.0, None])],
                     y_label="%")
    assert "<script" not in bars and bars.count('fill="#1f77b4"') == 1 and bars.count("<path") == 1


def test_forest_chart_rows_against_zero():
    """One row per finite interval, top to bottom in order; the dot at the estimate, filled when
    marked; the dashed zero line inside the axis even when every interval lies on one side of it."""
    nasty = '</svg><script>alert(1)</script>'
    rows = [Interval("up", "#111111", 5.0, 2.0, 8.0, marked=True, tip=nasty),
            Interval(nasty, "#222222", -1.0, -4.0, 2.0),
            Interval("nan", "#333333", float("nan"), 0.0, 1.0)]
    chart = forest_chart(rows, x_label="acc@t2 − grpo (points)")
    assert "<script" not in chart and chart.count("</svg>") == 1 and chart.count("<circle") == 2
    dots = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="4" fill="(#\w+)" stroke="(#\w+)"', chart)
    (ux, uy, ufill, _), (dx, dy, dfill, dstroke) = dots
    zero = float(re.search(r'<line x1="([\d.]+)" x2="\1" [^>]*stroke-dasharray', chart).group(1))
    assert float(ux) > zero > float(dx) and float(uy) < float(dy)  # "up" right of zero and on top
    assert ufill == "#111111" and (dfill, dstroke) == ("#fff", "#222222")
    one_sided = forest_chart([Interval("a", "#111111", 5.0, 2.0, 8.0)], x_label="x")
    frame = re.search(r'<rect x="(\d+)" y="\d+" width="(\d+)"', one_sided)
    left, width = int(frame.group(1)), int(frame.group(2))
    zero = float(re.search(r'<line x1="([\d.]+)" x2="\1" [^>]*stroke-dasharray', one_sided).group(1))
    assert left <= zero <= left + width
    assert forest_chart([Interval("nan", "#333333", float("nan"), 0.0, 1.0)], x_label="x") is None


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install chromium)")
def test_index_html_in_headless_chromium(experiment, tmp_path):
    out = tmp_path / "report"
    build_comparison(experiment, out, baseline="grpo", title="toy")
    report = load_page(CHROMIUM, out / "index.html", probes={
        "scripts": "document.scripts.length",
        "hostile_shown_as_text": "document.body.innerText.includes('<script>console.error(\"injected\")</script>')",
        "significant_cells": "document.querySelectorAll('td.sig').length",
        "tables": "document.querySelectorAll('table').length",
        # every inline SVG figure (the forest chart against grpo, 5 feedback panels, the transition bars)
        # laid out at a readable size and holding its marks
        "svgs_drawn": "[...document.querySelectorAll('figure > svg, .panels > svg')].map(s =>"
                      " s.getBoundingClientRect().width > 300"
                      " && s.querySelectorAll('polyline, rect[fill^=\"#\"]').length > 0)",
        # the training dynamics: a row per arm, its panels side by side at a legible width
        "dynamics": "[...document.querySelectorAll('.dyn svg')].map(s => s.getBoundingClientRect().width > 100"
                    " && s.querySelectorAll('polyline').length > 0)",
        # at 1280 px nothing scrolls sideways: not the page, not the headline table
        "fits": "[document.documentElement.scrollWidth <= 1280,"
                " (w => w.scrollWidth <= w.clientWidth)(document.querySelector('.wide'))]",
        "body_visible": "getComputedStyle(document.body).display !== 'none'",
        # a table too wide for its box scrolls sideways with its first column (metric, arm) in view
        "first_column_stays": "(() => { const w = document.querySelector('.wide'); w.style.maxWidth = '300px';"
                              " w.scrollLeft = 200; const c = w.querySelector('tr > :first-child');"
                              " return [w.scrollLeft > 0,"
                              " Math.abs(c.getBoundingClientRect().left - w.getBoundingClientRect().left) < 2]; })()",
    })
    (tmp_path / "index.png").write_bytes(report.screenshot)
    assert report.errors() == []
    assert [(i["alt"], i["ok"]) for i in report.images] == [
        ("eval acc@t2 against generated tokens, one panel per arm, and against FLOPs", True)]
    assert report.images[0]["width"] > 1000
    # nothing but the file and its embedded images: no network
    assert report.requests[0] == (out / "index.html").resolve().as_uri()
    assert all(u.startswith("data:image/png;base64,") for u in report.requests[1:])
    assert report.title == "toy"
    # significant: mlmt's gain over step 0 (8 of 8 problems up: p = 2/256), its difference from
    # grpo in the metrics table and in the paired table (p = 2/64); grpo's gain (2 problems) is not
    # tables: the headline, turns, feedback, cost to reach grpo's accuracy, per seed, against grpo,
    # cost (the runs' specs hold only a name: no table of what each arm is)
    assert report.probes == {"scripts": 1, "hostile_shown_as_text": True, "significant_cells": 3, "tables": 7,
                             "svgs_drawn": [True] * 7, "dynamics": [True] * 5, "fits": [True, True],
                             "body_visible": True, "first_column_stays": [True, True]}
    assert report.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(report.screenshot) > 50_000


def _table_js(first: str) -> str:
    """JavaScript: the table whose second header cell (its first metric) starts with ``first``."""
    return (f"[...document.querySelectorAll('table')].find(t => t.rows[0].cells[1]"
            f" && t.rows[0].cells[1].textContent.startsWith({first!r}))")


def _sort_probe(first: str, header: str) -> str:
    """JavaScript: in the table of :func:`_table_js`, click the header cell whose text starts with
    ``header``, then read the arms' order (each body row's first cell) and the header's aria-sort."""
    return (f"(() => {{ const t = {_table_js(first)};"
            f" const h = [...t.querySelectorAll('th.sort')].find(c => c.textContent.startsWith({header!r}));"
            f" h.click(); return [[...t.rows].slice(1).map(r => r.cells[0].textContent),"
            f" h.getAttribute('aria-sort')]; }})()")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium or Chrome on this machine")
def test_tables_sort_when_a_header_is_clicked(experiment, tmp_path):
    """Every table has arms as rows and sorts them by a clicked column; the first click puts the
    largest value first, the second the smallest; every cell moves with its arm."""
    out = tmp_path / "report"
    build_comparison(experiment, out, baseline="grpo", title="toy")
    report = load_page(CHROMIUM, out / "index.html", probes={
        # acc@t2: grpo 25.0%, mlmt 100.0% (the headline table)
        "acc_t2_down": _sort_probe("acc@t1", "acc@t2(refine-all)"),
        # the cells moved with their arm: the first row's acc@t2 is now mlmt's
        "moved_with_arm": f"{_table_js('acc@t1')}.rows[1].cells[2].textContent.startsWith('100.0%')",
        "acc_t2_up": _sort_probe("acc@t1", "acc@t2(refine-all)"),
        # seed 0: grpo 25.0% → 25.0%, mlmt 25.0% → 100.0% (sorted by acc@t2, not the acc@t1 it starts with)
        "seed_0_down": _sort_probe("seed 0", "seed 0"),
        # generated tokens: grpo 2025 ± 35, mlmt 6050 ± 71 (the cost table)
        "tokens_up": f"(() => {{ {_table_js('generated tokens')}.querySelector('th.sort').click(); return 0; }})()",
        "tokens": _sort_probe("generated tokens", "generated tokens"),
    })
    assert report.errors() == []
    assert report.probes == {
        "acc_t2_down": [["mlmt", "grpobaseline"], "descending"], "moved_with_arm": True,
        "acc_t2_up": [["grpobaseline", "mlmt"], "ascending"],
        "seed_0_down": [["mlmt", "grpobaseline"], "descending"],
        "tokens_up": 0, "tokens": [["grpobaseline", "mlmt"], "ascending"]}


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium or Chrome on this machine")
def test_the_page_policy_runs_no_script_but_its_own(experiment, tmp_path):
    """Were escaping ever to fail, the Content-Security-Policy is the second wall: a script and an
    event handler planted in the page do not run, images load from nothing but ``data:`` URLs (the
    browser reports refusing each), and the table sorter still runs."""
    out = tmp_path / "report"
    build_comparison(experiment, out, baseline="grpo", title="toy")
    page = out / "index.html"
    planted = ("<script>document.title = 'planted'</script>"
               "<img src='x' onerror=\"document.title = 'handler'\"><img src='http://127.0.0.1:9/x.png'>")
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", planted + "</body>"), encoding="utf-8")
    report = load_page(CHROMIUM, page, probes={"sorts": _sort_probe("seed 0", "seed 0")})
    assert report.title == "toy"
    assert report.probes == {"sorts": [["mlmt", "grpobaseline"], "descending"]}
    refused = [e for e in report.errors() if "violates the following Content Security Policy" in e]
    assert [e for e in report.errors() if e not in refused] == []
    assert sum("Executing inline script" in e for e in refused) == 1
    assert sum("Executing inline event handler" in e for e in refused) == 1
    images = ((out / "x").as_uri(), "http://127.0.0.1:9/x.png")
    assert sum(f"Loading the image '{u}'" in e for e in refused for u in images) == 2


def test_the_problem_browser_lists_every_problem_with_each_arms_outcomes(experiment, tmp_path):
    """problem_rows: every problem of the final evaluation, each arm's transition on every seed and
    its first logged episode; the statement and gold from samples.jsonl, else from a generated
    benchmark; problems.html: a card per problem, tokens the filter reads, escaped, one script that
    its policy lets run."""
    from mlmt_bench.report.page_script import BROWSER_JS, csp
    from mlmt_bench.report.problem_set import problem_rows

    loaded = {arm: [load_run(p) for p in paths] for arm, paths in experiment.items()}
    rows = problem_rows(loaded)
    assert [r.problem_id for r in rows] == [f"p{i}" for i in range(8)]
    p2 = rows[2]
    assert (p2.text, p2.gold) == (None, None)  # no samples record says, and the spec names no benchmark
    assert p2.arms["grpo"].runs == [(0, False, False), (1, False, False)]
    assert p2.arms["mlmt"].transitions == ["i->c", "i->c"] and rows[0].arms["mlmt"].transitions == ["c->c"] * 2
    assert p2.arms["mlmt"].episode_seed == 0 and p2.arms["mlmt"].episode[2]["text"] == HOSTILE
    assert rows[4].arms["mlmt"].episode == [] and rows[4].arms["mlmt"].episode_seed is None

    out = tmp_path / "report"
    summary = build_comparison(experiment, out, baseline="grpo", title="toy")
    page = (out / "problems.html").read_text(encoding="utf-8")
    assert summary["files"]["problems.html"] == str(out / "problems.html")
    cards = re.findall(r'<article class=prob data-t="([^"]*)">', page)
    assert len(cards) == 8 and cards[2] == "0:ii 1:ic" and cards[0] == "0:cc 1:cc"
    assert page.count("<script") == 1 and f"<script>{BROWSER_JS}</script>" in page
    assert f"content=\"{csp(BROWSER_JS)}\"" in page and HOSTILE not in page and esc(HOSTILE[:40]) in page
    assert "<a href='problems.html'>" in (out / "index.html").read_text(encoding="utf-8")


def test_the_problem_statement_comes_from_samples_or_a_generated_benchmark(tmp_path):
    import json

    from mlmt_bench.report.problem_set import problem_rows

    r = tmp_path / "runs"
    spec = "name: x\nbenchmark:\n  name: synthetic-arith\n  options: {}\n  eval_split: test\n"
    run = make_run(r, "a-20250101T000000Z", seed=0, arm="a", curve=[(0, 0, 0.0, .5, .5)], t1=[1, 0, 1], t2=[1, 0, 1],
                   spec=spec, samples={0: {"p2": _episode("1", "1", True)}})
    problems = run / "eval_problems.jsonl"
    problems.write_text(problems.read_text().replace('"p0"', '"test/000000"').replace('"p1"', '"test/000001"'))
    with (run / "samples.jsonl").open("a") as f:  # a run that logs the statement: it wins
        f.write(json.dumps({"step": 0, "problem_id": "test/000001", "problem": "1+1", "gold": "2", "turns": []}) + "\n")
    from mlmt_bench import registry

    test0 = registry.benchmarks.get("synthetic-arith")().load("test")[0]
    rows = {row.problem_id: row for row in problem_rows({"a": [load_run(run)]})}
    assert (rows["test/000000"].text, rows["test/000000"].gold) == (test0.prompt, test0.answer)
    assert (rows["test/000001"].text, rows["test/000001"].gold) == ("1+1", "2")
    assert (rows["p2"].text, rows["p2"].gold) == (None, None)  # not a problem of the benchmark's split


def _choose(select: str, value: str) -> str:
    """JavaScript: choose ``value`` in ``select#<select>`` as a reader would (a change event)."""
    return (f"(() => {{ const s = document.getElementById({select!r}); s.value = {value!r};"
            " s.dispatchEvent(new Event('change')); return 0; })()")


_SHOWN = ("[document.querySelectorAll('article.prob:not([hidden])').length,"
          " document.getElementById('count').textContent]")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium or Chrome on this machine")
def test_the_problem_browser_filters_by_arm_and_transition(experiment, tmp_path):
    """grpo (arm 0) never changes its answer; mlmt (arm 1) fixes p2..p7 on both seeds."""
    out = tmp_path / "report"
    build_comparison(experiment, out, baseline="grpo", title="toy")
    report = load_page(CHROMIUM, out / "problems.html", probes={
        "all": _SHOWN,
        "mlmt": _choose("f-arm", "1"), "mlmt_fixed": f"({_choose('f-t', 'ic')}, {_SHOWN})",
        "grpo_fixed": f"({_choose('f-arm', '0')}, {_SHOWN})",
        "any_fixed": f"({_choose('f-arm', '')}, {_SHOWN})",
        "hostile_shown_as_text": "document.body.innerText.includes('<script>console.error(\"injected\")</script>')",
    })
    assert report.errors() == []
    assert report.probes == {"all": [8, "1–8 of 8 problems (page 1 of 1)"], "mlmt": 0,
                             "mlmt_fixed": [6, "1–6 of 6 problems (page 1 of 1)"],
                             "grpo_fixed": [0, "no problem matches"],
                             "any_fixed": [6, "1–6 of 6 problems (page 1 of 1)"],
                             "hostile_shown_as_text": True}


REPO = Path(__file__).resolve().parents[1]
#: per committed headline report: (arms' rows, trained arms' rows of training curves, curves drawn)
HEADLINES = {"headline-v3": (12, 11, 11 * 7), "headline-v3-flops": (12, 11, 11 * 7), "headline-v4": (20, 7, 7 * 8)}
#: the screenshots the README shows: each report's final-metrics table at 1280 px, taken with
#: `python tests/headless_chromium.py PAGE OUT.png --between '#metrics' 'table.arms'` (docs/screenshots/README.md)
SCREENSHOTS = ("headline-v4.png", "quickstart.png")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium or Chrome on this machine")
@pytest.mark.parametrize("report", list(HEADLINES))
def test_the_committed_headline_at_1280_px(report, tmp_path):
    """A committed headline report (v3 also read at equal FLOPs) as a reader opens it 1280 px wide:
    every arm's row of every table in view without scrolling sideways, the training curves of its
    trained arms drawn, and the problem browser listing all 500 problems of the final evaluation,
    25 at a time."""
    rows, trained, curves = HEADLINES[report]
    index = load_page(CHROMIUM, REPO / "reports" / report / "index.html", probes={
        "page_fits": "document.documentElement.scrollWidth <= 1280",
        "tables_fit": "[...document.querySelectorAll('.wide')].every(w => w.scrollWidth <= w.clientWidth)",
        "in_view": "[...document.querySelectorAll('table.arms td')]"
                   ".every(c => c.getBoundingClientRect().right <= 1280)",
        "headline_rows": "document.querySelector('table.arms').rows.length - 1",
        "dynamics_rows": "document.querySelectorAll('.dyn-arm').length",
        "curves": "[...document.querySelectorAll('.dyn svg')].filter(s => s.querySelector('polyline')).length",
    })
    (tmp_path / "headline.png").write_bytes(index.screenshot)
    assert index.errors() == []
    assert index.probes == {"page_fits": True, "tables_fit": True, "in_view": True, "headline_rows": rows,
                            "dynamics_rows": trained, "curves": curves}
    assert _png_size(index.screenshot)[0] == 1280
    browser = load_page(CHROMIUM, REPO / "reports" / report / "problems.html", probes={
        "cards": "document.querySelectorAll('article.prob').length", "shown": _SHOWN,
        "page_fits": "document.documentElement.scrollWidth <= 1280"})
    assert browser.errors() == []
    assert browser.probes == {"cards": 500, "shown": [25, "1–25 of 500 problems (page 1 of 20)"], "page_fits": True}


def _png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_the_readme_shows_the_screenshots_of_the_pages():
    """docs/screenshots: the final-metrics table of the headline's and the quickstart's index.html at
    1280 px, small enough to keep in the repository, each shown by the README."""
    readme = (REPO / "README.md").read_text()
    for name in SCREENSHOTS:
        png = (REPO / "docs" / "screenshots" / name).read_bytes()
        assert _png_size(png)[0] == 1280 and len(png) < 400_000, name
        assert f"docs/screenshots/{name}" in readme


def test_a_crafted_spec_does_not_make_the_report_generate_a_billion_problems(tmp_path):
    """Options above MAX_REBUILT_OPTION (n_test: 150000 here; a billion would do as well) are not
    rebuilt: the statement stays unknown, where rebuilding would have found it."""
    from mlmt_bench.report.problem_set import MAX_REBUILT_OPTION, problem_rows

    n = MAX_REBUILT_OPTION + 50_000
    spec = (f"name: x\nbenchmark:\n  name: synthetic-arith\n  options: {{n_test: {n}, difficulty: 8}}\n"
            "  eval_split: test\n")
    run = make_run(tmp_path, "a-20250101T000000Z", seed=0, arm="a", curve=[(0, 0, 0.0, .5, .5)], t1=[1], t2=[1],
                   spec=spec)
    problems = run / "eval_problems.jsonl"
    problems.write_text(problems.read_text().replace('"p0"', '"test/000000"'))
    [row] = problem_rows({"a": [load_run(run)]})
    assert (row.problem_id, row.text) == ("test/000000", None)


def test_the_pages_show_control_characters_escaped(tmp_path):
    """An arm named with an ESC sequence, a C1 CSI and the bidi override U+202E, a model output with
    them (and a NUL, a lone surrogate, lines and a tab): the pages write each as its escape
    (``\\x1b``), as comparison.md does, never raw; line breaks and tabs of the output stay."""
    from mlmt_bench.io.bounded_input import printable
    from mlmt_bench.report.escape import esc as escape

    evil = "mlmt\x1b[2J\u202e\x9b31m"
    output = "line 1\n\tline 2 \x00 \ud800 \x1b]8;;http://x\x1b\\"
    r = tmp_path / "runs"
    runs = {arm: [make_run(r, f"{name}-20250101T000000Z", seed=0, arm=arm, curve=[(0, 0, 0.0, .5, .5)],
                           t1=[1, 0], t2=[1, 1], samples={0: {"p1": _episode("1", output, True)}})]
            for arm, name in (("grpo", "grpo"), (evil, "mlmt"))}
    build_comparison(runs, tmp_path / "o", baseline="grpo")
    for name in ("index.html", "problems.html"):
        page = (tmp_path / "o" / name).read_text(encoding="utf-8")
        assert not [c for c in ("\x1b", "\u202e", "\x9b", "\x00") if c in page], name
        assert escape(printable(evil)) in page and "mlmt\\x1b[2J\\u202e\\x9b31m" in page
    assert "line 1\n\tline 2 \\x00 \\ud800 \\x1b]8;;http://x\\x1b\\" in (tmp_path / "o" / "problems.html").read_text()
    assert escape("\x1b") == "\\x1b" and escape("a\n\tb") == "a\n\tb" and escape("<\u202e>") == "&lt;\\u202e&gt;"


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium or Chrome on this machine")
@pytest.mark.parametrize("seeds", [(0, 1, 2), (10,)])
def test_four_arms_like_the_quickstart_fit_1280_px(seeds, tmp_path):
    """The quickstart's four arms (given in an order that puts the baseline third): its row first,
    each arm's row and every metric column in view at 1280 px with nothing scrolling sideways; with
    three seeds, and with the quickstart's one, whose intervals say "(1 seed: problems only)" (its
    headline table was 1,700 px wide: the gain column cut, the last two out of view)."""
    r = tmp_path / "runs"
    arms = ["mlmt", "self_correct", "grpo", "mlmt-critic_only"]
    runs = {arm: [make_run(r, f"{arm}-2025010{s}T000000Z", seed=s, arm=arm, feedback=arm != "grpo",
                           curve=[(0, 0, 0.0, .25, .25), (10, 1000 + s, 1e12, .4 + .1 * i, .5 + .1 * i)],
                           t1=[1, 0, 1, 0] * 25, t2=[1, 1, 0, 0] * 25,
                           train_extra={0: {"kl/solver": 0.0}, 10: {"kl/solver": 0.01 * i}})
                 for s in seeds]
            for i, arm in enumerate(arms)}
    out = tmp_path / "report"
    build_comparison(runs, out, baseline="grpo", title="quickstart-like")
    report = load_page(CHROMIUM, out / "index.html", probes={
        "rows": "[...document.querySelector('table.arms').rows].slice(1).map(r => r.cells[0].textContent)",
        "in_view": "[...document.querySelectorAll('table.arms td')]"
                   ".every(c => c.getBoundingClientRect().right <= 1280)",
        "fits": "[...document.querySelectorAll('.wide')].every(w => w.scrollWidth <= w.clientWidth)"
                " && document.documentElement.scrollWidth <= 1280",
        "dynamics_rows": "[...document.querySelectorAll('.dyn-arm')].map(d => d.textContent)",
    })
    (tmp_path / "quickstart.png").write_bytes(report.screenshot)
    assert report.errors() == []
    assert report.probes == {"rows": ["grpobaseline", "mlmt", "self_correct", "mlmt-critic_only"], "in_view": True,
                             "fits": True, "dynamics_rows": ["grpo", "mlmt", "self_correct", "mlmt-critic_only"]}
