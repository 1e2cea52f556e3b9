"""A prompt template is checked at validation (issue 34, item 6): only its own placeholders, bare;
``{prompt}`` for ``{problem}`` failed with a KeyError once the run had started, and
``{problem:>900000000}`` validated and then aborted the run at 5 GB."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mlmt_bench.spec import TemplateSpec
from mlmt_bench.types import PromptTemplates


@pytest.mark.parametrize(("field", "text", "fragment"), [
    ("attempt", "Solve {prompt}", "unknown placeholder {prompt} (this template's: {problem}"),
    ("feedback", "{problem}\n{attempt}\n{answer}", "unknown placeholder {answer}"),
    ("refine", "{problem}", "unknown placeholder {problem} (this template's: {feedback}"),
    ("null_feedback", "Check {feedback}", "this template's: none"),
    ("attempt", "{problem:>900000000}", "takes no format spec"),
    ("attempt", "{problem!r}", "takes no format spec or conversion"),
    ("attempt", "{}", "unknown placeholder {}"),
    ("attempt", "an open { brace", "not a format template"),
])
def test_bad_templates_are_refused_at_validation(field, text, fragment):
    with pytest.raises(ValidationError, match=f"{field}") as err:
        TemplateSpec(**{field: text})
    assert fragment in str(err.value)


def test_good_templates_pass_and_render():
    spec = TemplateSpec(attempt="Solve: {problem} {{literal}}", feedback="{problem}\n{attempt}", refine="{feedback}",
                        null_feedback="Check again.")
    assert spec.attempt == "Solve: {problem} {{literal}}"
    tpl = PromptTemplates(attempt=spec.attempt)
    from mlmt_bench.types import Problem
    assert tpl.render_attempt(Problem("p", "b", "2+2")) == "Solve: 2+2 {literal}"


def test_the_default_templates_pass():
    d = PromptTemplates()
    TemplateSpec(attempt=d.attempt, feedback=d.feedback, refine=d.refine, null_feedback=d.null_feedback)
