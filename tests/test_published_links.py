"""Published data cannot leak through a symbolic link (issue 34, item 1): ``report --raw`` and
``run --restore`` refuse a link in one line, never copy its target, and write nothing before every
input has passed; ``--restore`` also bounds the bytes it writes in all (item 8)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.io import bounded_input
from mlmt_bench.report import publish
from support import make_run

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot-for-publishing\n"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture()
def experiment(tmp_path: Path) -> Path:
    """An experiment directory with one grpo and one mlmt run of seed 0 (4 problems)."""
    exp = tmp_path / "src" / "toy-20250101T000000Z"
    names = {}
    for arm in ("grpo", "mlmt"):
        d = make_run(exp, f"toy-{arm}-s0-20250101T000000Z", seed=0, arm=arm, feedback=arm == "mlmt",
                     curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 1, 0])
        manifest = json.loads((d / "manifest.json").read_text())
        (d / "manifest.json").write_text(json.dumps({**manifest, "experiment": "toy"}))
        names[arm] = [d.name]
    (exp / "experiment.json").write_text(json.dumps({"name": "toy", "seeds": [0], "arms": names}))
    return exp


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_bytes(SECRET)
    return path


def _holds_secret(root: Path) -> bool:
    return any(SECRET in p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("name", ["spec.resolved.yaml", "manifest.json", "metrics.jsonl", "eval_problems.jsonl"])
def test_publishing_a_run_whose_file_is_a_link_is_refused_and_writes_nothing(experiment, secret, tmp_path, name):
    run = next(experiment.glob("toy-mlmt-*"))
    (run / name).unlink()
    (run / name).symlink_to(secret)
    out = tmp_path / "published"
    res = _cli("report", str(experiment), "--out", str(out), "--raw")
    assert res.exit_code == 2, res.output
    assert "symbolic link" in res.output and name in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not out.exists() or not _holds_secret(out)
    assert not (out / "runs").exists()  # nothing copied, not even the runs that passed


def test_a_published_report_holding_a_link_is_not_restored_and_nothing_is_written(experiment, secret, tmp_path):
    out = tmp_path / "published"
    assert _cli("report", str(experiment), "--out", str(out), "--raw").exit_code == 0
    runs = sorted((out / "runs").iterdir())
    # the second run (in restore order) carries the link: the first must not be restored either
    (runs[1] / "spec.resolved.yaml").unlink()
    (runs[1] / "spec.resolved.yaml").symlink_to(secret)
    exp_dir = tmp_path / "restored"
    exp_dir.mkdir()
    with pytest.raises(UserError, match="symbolic link"):
        publish.restore_runs(out, exp_dir, "toy")
    assert list(exp_dir.iterdir()) == []


def test_a_run_directory_that_is_a_link_is_refused_on_restore(experiment, tmp_path):
    out = tmp_path / "published"
    assert _cli("report", str(experiment), "--out", str(out), "--raw").exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    run = next((out / "runs").iterdir())
    run.rename(elsewhere)
    run.symlink_to(elsewhere, target_is_directory=True)
    exp_dir = tmp_path / "restored"
    exp_dir.mkdir()
    with pytest.raises(UserError, match="symbolic link"):
        publish.restore_runs(out, exp_dir, "toy")
    assert list(exp_dir.iterdir()) == []


def test_restore_refuses_a_report_past_its_total_bound_before_writing(experiment, tmp_path, monkeypatch):
    out = tmp_path / "published"
    assert _cli("report", str(experiment), "--out", str(out), "--raw").exit_code == 0
    exp_dir = tmp_path / "restored"
    exp_dir.mkdir()
    assert sorted(publish.restore_runs(out, exp_dir, "toy")) == sorted(p.name for p in (out / "runs").iterdir())
    one_run = sum(p.stat().st_size for p in next(exp_dir.iterdir()).iterdir())
    monkeypatch.setattr(publish, "MAX_RESTORE_BYTES", one_run + one_run // 2)  # room for one run, not two
    again = tmp_path / "restored-again"
    again.mkdir()
    with pytest.raises(UserError, match="more than the limit"):
        publish.restore_runs(out, again, "toy")
    assert list(again.iterdir()) == []


def test_read_bytes_refuses_a_link_only_where_links_are_not_followed(secret, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(secret)
    assert bounded_input.read_bytes(link) == SECRET  # a user's own path: links are theirs to use
    with pytest.raises(UserError, match="symbolic link"):
        bounded_input.read_bytes(link, follow_links=False)
    with pytest.raises(UserError, match="symbolic link"):
        bounded_input.read_text(link, follow_links=False)
    assert bounded_input.read_bytes(secret, follow_links=False) == SECRET
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        bounded_input.read_bytes(fifo, follow_links=False)
