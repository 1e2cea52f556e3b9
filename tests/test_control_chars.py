"""Raw control characters from data reach no terminal and no directory name (issue 34, item 9):
``mlmt-bench list`` escapes a plugin's name and description; ``run --restore`` refuses a published
run whose name holds control characters before writing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlmt_bench import registry
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.report import publish

ESC = "\x1b]8;;http://evil\x1b\\\x1b[2J\u202e"


def test_list_escapes_a_components_name_and_description(monkeypatch):
    monkeypatch.setitem(registry.verifiers._entries, "evil" + ESC,
                        registry.Entry("evil" + ESC, "x:y", "clears your screen" + ESC, "evil-plugin"))
    res = CliRunner().invoke(app, ["list", "verifier"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\u202e" not in res.output
    assert "\\x1b" in res.output


def test_restore_refuses_a_run_named_with_control_characters(tmp_path: Path):
    report = tmp_path / "report"
    bad = report / "runs" / ("toy-grpo-s0-x\x1b[2J\n")
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_text(json.dumps({"experiment": "toy", "status": "completed"}))
    (bad / "spec.resolved.yaml").write_text("name: x\n")
    (report / "experiment.json").write_text(json.dumps({"name": "toy", "arms": {}}))
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    with pytest.raises(UserError, match=r"control characters") as err:
        publish.restore_runs(report, exp_dir, "toy")
    assert "\x1b" not in str(err.value)
    assert list(exp_dir.iterdir()) == []


RAW = ("\x1b", "\u202e", "\x9b")  # ESC, the bidi override, a C1 control (CSI)


def _evil_experiment(root: Path) -> tuple[Path, str]:
    """An experiment of two arms, one named with an OSC 8 link, a screen clear, U+202E and a C1 CSI."""
    from support import make_run

    evil = "mlmt" + ESC + "\x9b31m"
    exp = root / "toy-20250101T000000Z"
    names = {}
    for arm in ("grpo", evil):
        d = make_run(exp, f"toy-{'grpo' if arm == 'grpo' else 'mlmt'}-s0-20250101T000000Z", seed=0, arm=arm,
                     feedback=arm != "grpo", curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5)],
                     t1=[1, 1, 0, 0], t2=[1, 1, 1, 0])
        manifest = json.loads((d / "manifest.json").read_text())
        (d / "manifest.json").write_text(json.dumps({**manifest, "experiment": "toy"}))
        names[arm] = [d.name]
    (exp / "experiment.json").write_text(json.dumps({"name": "toy" + ESC, "seeds": [0], "arms": names}))
    return exp, evil


def test_comparison_md_escapes_arm_names_from_a_published_report(tmp_path: Path):
    """issue 34 item 9: an arm name holding ESC / OSC sequences, U+202E or a C1 control in a
    published report's experiment.json was written raw into comparison.md (15 raw ESC); it is written
    escaped, in the report and in the report of the published report."""
    from mlmt_bench.io import bounded_input

    exp, evil = _evil_experiment(tmp_path)
    pub, again = tmp_path / "published", tmp_path / "again"
    for src, out, extra in ((exp, pub, ["--raw"]), (pub, again, [])):
        res = CliRunner().invoke(app, ["report", str(src), "--out", str(out), *extra])
        assert res.exit_code == 0, res.output
        md = (out / "comparison.md").read_text(encoding="utf-8")
        assert not any(c in md for c in RAW), [c for c in RAW if c in md]
        assert f"\n| {bounded_input.printable(evil)} | " in md  # the arm's row, its name shown escaped
        assert md.startswith("# toy\\x1b]8;;http://evil\\x1b\\\\x1b[2J\\u202e\n")
    assert evil in json.loads((pub / "experiment.json").read_text())["arms"]  # the data itself is kept


def test_the_figure_labels_arms_escaped_and_matplotlib_prints_no_raw_escape(tmp_path: Path):
    """matplotlib warned 'Glyph 27 (\\x1b) missing from font(s)' with the raw ESC on stderr: every
    text of the figure (titles, legend) holds the names escaped."""
    import warnings

    import matplotlib.text

    from mlmt_bench.report.figures import _png, acc_vs_cost_figure
    from mlmt_bench.report.runs import load_run

    exp, evil = _evil_experiment(tmp_path)
    runs = {arm: [load_run(exp / d) for d in dirs]
            for arm, dirs in json.loads((exp / "experiment.json").read_text())["arms"].items()}
    fig = acc_vs_cost_figure(runs, target=0.5, baseline=evil, title="t" + ESC)
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert any("mlmt\\x1b]8" in t for t in texts)
    assert not [t for t in texts if any(c in t for c in RAW)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _png(fig)
    assert not [str(w.message) for w in caught if any(c in str(w.message) for c in RAW)]
