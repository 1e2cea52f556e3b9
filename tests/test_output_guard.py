"""One guard for every output path and store (issue 34, item 7): nothing is written into a system
directory, named directly, through a symlink, or as a new path under one; a cache is never rooted at
``/``, /tmp itself or a system directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.trackers.mlflow import MLflowOptions, MLflowTracker
from mlmt_bench.tracking import cache_env_dir, check_output_dir, check_output_file


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture()
def etc_link(tmp_path: Path) -> Path:
    link = tmp_path / "etc-link"
    link.symlink_to("/etc", target_is_directory=True)
    return link


@pytest.mark.parametrize("where", ["/etc", "/etc/mlmt-report", "/usr/share/mlmt/new/deeper", "link", "link/new"])
def test_no_output_directory_in_a_system_directory(where, etc_link):
    path = str(etc_link) + where[4:] if where.startswith("link") else where
    with pytest.raises(UserError, match="system directory /(etc|usr)"):
        check_output_dir(path, "--out")
    with pytest.raises(UserError, match="system directory /(etc|usr)"):
        check_output_file(Path(path) / "x.jsonl", "--out")


def test_own_directories_stay_writable(tmp_path):
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert check_output_file(tmp_path / "x.jsonl") == tmp_path / "x.jsonl"


def test_report_and_verify_refuse_etc(tmp_path, etc_link):
    src = Path(__file__).resolve().parents[1] / "reports" / "testbed-v3"
    for out in ("/etc/mlmt-report", str(etc_link / "mlmt-report")):
        res = _cli("report", str(src), "--out", out)
        assert res.exit_code == 2 and "system directory /etc" in res.output, res.output
    assert not Path("/etc/mlmt-report").exists()
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"response": "#4", "answer": "4"}\n')
    res = _cli("verify", "math", str(inp), "--out", "/etc/mlmt-verdicts.jsonl")
    assert res.exit_code == 2 and "system directory /etc" in res.output, res.output
    assert not Path("/etc/mlmt-verdicts.jsonl").exists()


def test_an_mlflow_sqlite_store_in_etc_is_refused(tmp_path):
    for uri in ("sqlite:////etc/mlflow.db", "sqlite:////etc/new-dir/mlflow.db"):
        with pytest.raises(UserError, match="system directory /etc"):
            MLflowTracker.check(MLflowOptions(tracking_uri=uri), tmp_path)


@pytest.mark.parametrize("value", ["/", "/tmp", "/etc", "/usr/lib/mlmt", "/proc/self/cache", "FILE", "FILE/sub"])
def test_the_cache_is_never_rooted_in_a_system_directory_or_a_file(value, monkeypatch, tmp_path):
    (tmp_path / "FILE").write_text("a file")
    monkeypatch.setenv("MLMT_BENCH_CACHE", value.replace("FILE", str(tmp_path / "FILE")))
    with pytest.raises(UserError, match="MLMT_BENCH_CACHE"):
        cache_env_dir()


def test_a_cache_of_ones_own_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    assert cache_env_dir() == tmp_path / "cache"
    monkeypatch.delenv("MLMT_BENCH_CACHE")
    assert cache_env_dir() is None
