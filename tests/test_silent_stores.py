"""A store that accepts the connection and never answers does not hang (issue 34, item 4): the
Optuna storage of ``sweep --storage`` / ``report --sweep`` gives up in one line after its connect
timeout; the MLflow request timeout has an upper bound."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.sweep import storage
from mlmt_bench.trackers.mlflow import MLflowOptions


@pytest.fixture()
def silent_port() -> Iterator[int]:
    """A TCP port whose server accepts every connection and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in held:
        c.close()


@pytest.mark.timeout(60)
def test_a_silent_postgresql_server_is_one_line_after_the_connect_timeout(silent_port, monkeypatch):
    monkeypatch.setattr(storage, "SERVER_CONNECT_TIMEOUT_S", 2)
    url = f"postgresql+psycopg2://admin:hunter2@127.0.0.1:{silent_port}/optuna"
    t0 = time.monotonic()
    with pytest.raises(UserError, match="timeout expired") as err:
        storage.open_storage(url)
    assert time.monotonic() - t0 < 30
    assert "hunter2" not in str(err.value)
    res = CliRunner().invoke(app, ["report", "--sweep", url, "--out", "/nonexistent-never-written"])
    assert res.exit_code == 2 and "timeout expired" in res.output and "hunter2" not in res.output, res.output


def test_the_mlflow_request_timeout_is_bounded():
    assert MLflowOptions(timeout_s=600).timeout_s == 600
    with pytest.raises(ValidationError):
        MLflowOptions(timeout_s=1_000_000)


@pytest.mark.timeout(120)
def test_validate_asks_a_remote_mlflow_store_and_leaves_a_local_one_to_the_run(tiny_ckpt, silent_port, tmp_path,
                                                                               write_spec):
    from conftest import minimal_spec
    from support import one_line_error

    def spec(uri: str) -> dict:
        return minimal_spec(policies={"solver": {"model": "tiny", "path": str(tiny_ckpt)}},
                            output_dir=str(tmp_path / "runs"),
                            tracking={"report_to": ["mlflow"], "options": {"mlflow": {"tracking_uri": uri,
                                                                                     "timeout_s": 2}}})

    t0 = time.monotonic()
    one_line_error(["validate", str(write_spec(spec(f"http://admin:hunter2@127.0.0.1:{silent_port}")))],
                   "tracking.report_to: mlflow", "does not answer", "admin:***@")
    assert time.monotonic() - t0 < 60
    local = tmp_path / "store" / "mlflow.db"
    res = CliRunner().invoke(app, ["validate", str(write_spec(spec(f"sqlite:///{local}")))])
    assert res.exit_code == 0, res.output
    assert not local.parent.exists()  # validate creates nothing; the run makes its store
