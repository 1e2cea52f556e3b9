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
