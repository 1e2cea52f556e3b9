"""Fuzzing ``mlmt-bench validate`` (in this process, through the CLI's error wrapper): whatever the
spec file holds, the answer is exit code 0, or exit code 2 with one ``error:`` line — never a
traceback. Cases: (1) spec mappings, a valid spec with random values put at random field paths
(a seeded generator), and (2) YAML text, random or a valid spec's text with random edits
(Hypothesis). Both are deterministic (seeds; derandomised Hypothesis), with fixed counts, so the
cases and the run time are the same on every run.
"""

from __future__ import annotations

import contextlib
import io
import random
import tempfile
import typing
from pathlib import Path

import pytest
import typer
import yaml
from pydantic import BaseModel

from conftest import minimal_spec
from mlmt_bench import cli, registry
from mlmt_bench.spec import RunSpec
from mlmt_bench.sweep import set_path  # exactly what --set does to a mapping
from mlmt_bench.warmstart.shared_base import BaseConfig

hypothesis = pytest.importorskip("hypothesis")  # the `dev` extra
from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,  # noqa: E402
)

EXAMPLES = 600  # per Hypothesis test; with MAPPING_CASES below: 2,200 cases
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
SPEC_DIR = Path(tempfile.mkdtemp(prefix="mlmt-fuzz-"))
VALID_TEXT = yaml.safe_dump(minimal_spec(), sort_keys=False)


def field_paths(model, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every dotted field path of a pydantic model (nested models followed)."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + (name,))
        for sub in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out += field_paths(sub, prefix + (name,))
    return out


# real fields, so that values land where validation looks (algorithm parameters and the shared
# base's knobs included), and a few paths that name nothing
PATHS = sorted(set(field_paths(RunSpec))
               | {("algorithm", "params", *p) for n in registry.algorithms.names()
                  for p in field_paths(registry.algorithms.get(n).Params)}
               | {("base", *p) for p in field_paths(BaseConfig)}
               | {("extends",), ("arms",), ("base",), ("seeds",), ("benchmark", "options", "x"), ("x",)})
KEYS = sorted({part for path in PATHS for part in path})

# values a field may well accept, so that many cases get past the first error
LIKELY = [None, True, False, 0, 1, 2, 4, 8, 0.5, 1e-4, "grpo", "mlmt", "self_correct", "full", "shared_policy",
          "oracle_feedback", "tiny", "hf", "synthetic-arith", "math", "code", ["refine_all"], {"model": "tiny"},
          {"model": "tiny", "path": "CKPT"}, {}, [], "float32", "cosine", "CKPT", "../x.yaml", "/dev/null", ""]
CHARS = "ab_-. /:{}[]#&*!\\'\"\tü\u2028"


def random_value(rng: random.Random, depth: int = 0):
    """A random YAML-representable value: likely ones, odd scalars, small nested containers."""
    r = rng.random()
    if depth < 3 and r < 0.12:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and r < 0.24:
        return {rng.choice(KEYS + ["", "x y", "1"]): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if r < 0.6:
        return rng.choice(LIKELY)
    return rng.choice([
        rng.randint(-3, 10), rng.randint(-(10 ** 30), 10 ** 30), rng.uniform(-2, 2), float("nan"), float("inf"),
        -0.0, "".join(rng.choice(CHARS) for _ in range(rng.randrange(12))), 10 ** rng.randrange(4, 400)])


def validate_text(text: str) -> None:
    """Write ``text`` as a spec and validate it; exit 0, or exit 2 with exactly one error line.

    Calls the function behind ``mlmt-bench validate`` (the CLI's one-line-error wrapper
    included): building the Typer command for every case would cost 30 ms each."""
    p = SPEC_DIR / "spec.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.validate(p, None)
        except typer.Exit as exc:
            code = exc.exit_code
    assert code in (0, 2), (code, text[:300])
    if code == 2:
        assert err.getvalue().startswith("error: ") and err.getvalue().count("\n") == 1, (err.getvalue()[:300],
                                                                                          text[:300])


MAPPING_CASES = 1000


def test_fuzz_spec_mappings():
    """A valid spec with 1 to 3 random values put at random field paths (a seeded generator:
    drawing nested values through Hypothesis cost ~20 ms a case here)."""
    for seed in range(MAPPING_CASES):
        rng = random.Random(seed)
        spec = minimal_spec()
        for _ in range(rng.randint(1, 3)):
            spec = set_path(spec, ".".join(rng.choice(PATHS)), random_value(rng))
        try:
            validate_text(yaml.dump(spec, Dumper=DUMPER, allow_unicode=True))
        except AssertionError as exc:
            raise AssertionError(f"case seed {seed}: {exc}") from None


YAML_ALPHABET = st.sampled_from(list("[]{}:,-&*!|>'\"#%@`?~ \n\t.=<") + ["a", "b", "1", "0", "x: ", "- ", "&a ",
                                                                          "*a", "<<: ", "!!str ", "!!binary ",
                                                                          "2001-02-30", "\ufeff", "\x00", "\udcff"])


@FUZZ
@given(st.lists(YAML_ALPHABET, max_size=60).map("".join))
def test_fuzz_yaml_text(text):
    validate_text(text)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID_TEXT)), st.integers(0, 6),
                          st.lists(YAML_ALPHABET, max_size=6).map("".join)), min_size=1, max_size=5))
def test_fuzz_edits_of_a_valid_spec(edits):
    """A valid spec's text with a few characters deleted and others inserted at random places."""
    text = VALID_TEXT
    for at, delete, insert in edits:
        at = min(at, len(text))
        text = text[:at] + insert + text[at + delete:]
    validate_text(text)
