"""Run directories: fresh per run, append-only logs, atomic checkpoints."""

from __future__ import annotations

import json

import pytest

from mlmt_bench.errors import UserError
from mlmt_bench.tracking import RunDir, atomic_write_text, read_jsonl


def test_two_runs_in_the_same_second_get_distinct_dirs(tmp_path):
    a = RunDir.create(tmp_path, "x", "name: x\n", seed=0)
    b = RunDir.create(tmp_path, "x", "name: x\n", seed=1)
    assert a.path != b.path and a.path.exists() and b.path.exists()
    assert json.loads((a.path / "manifest.json").read_text())["seed"] == 0
    assert json.loads((b.path / "manifest.json").read_text())["seed"] == 1


def test_manifest_fields(tmp_path):
    m = RunDir.create(tmp_path, "x", "name: x\n", seed=3).manifest()
    for key in ("git_sha", "versions", "seed", "host", "start_time", "end_time", "status"):
        assert key in m
    assert m["status"] == "running" and "torch" in m["versions"]


def test_metrics_are_flushed_line_by_line(tmp_path):
    run = RunDir.create(tmp_path, "x", "", seed=0)
    run.log_metrics({"kind": "train", "step": 1})
    # readable before close: flushed as written
    assert read_jsonl(run.path / "metrics.jsonl") == [{"kind": "train", "step": 1}]
    run.finish("completed")
    assert run.manifest()["status"] == "completed" and run.manifest()["end_time"]


def test_torn_last_line_is_ignored_but_corruption_inside_is_an_error(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"a": 1}\n{"a": 2')
    assert read_jsonl(p) == [{"a": 1}]
    p.write_bytes('{"a": 1}\n{"b": "\u00e9"}'.encode()[:-3])  # cut inside a two-byte character
    assert read_jsonl(p) == [{"a": 1}]
    p.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(UserError, match=r"m.jsonl:2: invalid JSON"):
        read_jsonl(p)
    p.write_text('{"a": 1}\n{"a": 2\n')  # a complete (newline-ended) last line is not torn: an error
    with pytest.raises(UserError, match=r"m.jsonl:2: invalid JSON"):
        read_jsonl(p)


def test_checkpoint_is_atomic_and_latest_is_found(tmp_path):
    run = RunDir.create(tmp_path, "x", "", seed=0)
    tmp = run.begin_checkpoint(2)
    (tmp / "w").write_text("two")
    assert run.latest_checkpoint() is None  # an unfinished checkpoint is never picked up
    run.commit_checkpoint(tmp, 2)
    tmp = run.begin_checkpoint(4)
    (tmp / "w").write_text("four")
    run.commit_checkpoint(tmp, 4)
    assert run.latest_checkpoint().name == "step-000004"
    assert (run.latest_checkpoint() / "w").read_text() == "four"


def test_truncate_logs_after_checkpoint(tmp_path):
    run = RunDir.create(tmp_path, "x", "", seed=0)
    for s in range(5):
        run.log_metrics({"kind": "train", "step": s})
    run.close()
    run.truncate_logs_after(2)
    assert [r["step"] for r in run.metrics()] == [0, 1, 2]


def test_open_rejects_non_run_dirs(tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        RunDir.open(tmp_path)


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "f.txt"
    atomic_write_text(p, "old")
    atomic_write_text(p, "new")
    assert p.read_text() == "new" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]
