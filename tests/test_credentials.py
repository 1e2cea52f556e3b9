"""No message prints a password (issue 34, item 5): every error line and note passes through
``bounded_input.printable``, which masks the password of every URL in it."""

from __future__ import annotations

import pytest
import typer

from mlmt_bench import cli
from mlmt_bench.io import notes
from mlmt_bench.io.bounded_input import mask_credentials, printable
from mlmt_bench.sweep import redact


@pytest.mark.parametrize(("text", "masked"), [
    ("tracking_uri postgresql+psycopg2://admin:s3cret@db.example/mlflow: the MLflow store does not answer",
     "tracking_uri postgresql+psycopg2://admin:***@db.example/mlflow: the MLflow store does not answer"),
    ("postgresql://u:p@ss@h:5432/d", "postgresql://u:***@h:5432/d"),  # an '@' in the password: masked whole
    ("a mysql://v:q@h2/e and redis://:pw@h3/0", "a mysql://v:***@h2/e and redis://:***@h3/0"),
    ("sqlite:////tmp/study.db", "sqlite:////tmp/study.db"),
    ("http://localhost:5000/api", "http://localhost:5000/api"),  # a port is no password
    ("https://user@host/x", "https://user@host/x"),
    ("no url here: a:b@c", "no url here: a:b@c"),
])
def test_mask_credentials(text, masked):
    assert mask_credentials(text) == masked
    assert printable(text) == masked


def test_the_sweep_storage_redaction_is_the_same_mask():
    assert redact("postgresql+psycopg2://admin:pw@db/optuna") == "postgresql+psycopg2://admin:***@db/optuna"


def test_error_lines_and_notes_never_print_a_password(capsys):
    notes.warn("the store postgresql://admin:hunter2@db/mlflow is slow")
    with pytest.raises(typer.Exit):
        cli._exit_with_error("tracking_uri postgresql+psycopg2://admin:hunter2@db/mlflow: the MLflow store does "
                             "not answer")
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert err.count("admin:***@db/mlflow") == 2
