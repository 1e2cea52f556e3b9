"""Names become directory names: bounded at validation (issue 34, item 6), so a 250-character run
name or a long experiment + arm name is one line at ``validate``, not ENAMETOOLONG mid-run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mlmt_bench.spec import MAX_NAME_CHARS, ExperimentSpec, RunSpec, SweepSpec


@pytest.mark.parametrize("model", [RunSpec, ExperimentSpec, SweepSpec])
def test_names_past_the_bound_or_with_a_slash_are_refused(model):
    fields = RunSpec.model_fields if model is RunSpec else model.model_fields
    for bad in ("x" * (MAX_NAME_CHARS + 1), "../escape", "a/b"):
        with pytest.raises(ValidationError, match="name"):
            model.__pydantic_validator__.validate_assignment(model.model_construct(), "name", bad)
    assert "name" in fields


def test_the_longest_allowed_run_directory_can_be_made(tmp_path):
    from mlmt_bench.tracking import fresh_stamped_dir

    longest = "x" * MAX_NAME_CHARS + "-s4294967295"  # an experiment run: NAME-s<seed>, then -<stamp>[-<n>]
    for _ in range(3):  # the -1, -2 suffixes of runs started in the same second fit too
        assert fresh_stamped_dir(tmp_path, longest).is_dir()
