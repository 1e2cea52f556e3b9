"""Resource bounds (robustness issue, "no hang, no memory exhaustion, ever"): every size a user
or a copied run directory controls is checked against a named limit before it is allocated, and
a violation is one ``error:`` line with exit code 2, never a MemoryError, a traceback or a hang.

- a sweep grid's size is its product, computed, never built (:data:`mlmt_bench.sweep.space.MAX_GRID_SIZE`);
- the counts that size a run (``group_size``, ``max_new_tokens``, ``problems_per_step``, their
  product per step) and ``seed`` have upper limits, and every float of a spec is finite;
- ``report`` and ``run --resume`` read a run directory through bounded readers (manifest.json,
  spec.resolved.yaml, the JSONL logs, gzip included), as ``verify`` reads its input;
- ``\\boxed`` extraction and answer normalisation are linear in the response.

Huge inputs are cheap here: sparse files (``truncate``), gzip members concatenated (a small file
that decompresses to hundreds of MiB), or a limit lowered with monkeypatch and a file just over it.
A check that must not hang runs in a subprocess with a generous timeout; nothing asserts a time.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench import spec as specs
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.io import bounded_input
from mlmt_bench.models import policy_spec
from mlmt_bench.report.runs import load_run
from mlmt_bench.sweep import load_sweep, space as sweeps
from mlmt_bench.tracking import read_jsonl
from mlmt_bench.verifiers.math import extract_answer, extract_boxed, normalize_answer, unwrap_commands
from support import one_line_error

REPO = Path(__file__).resolve().parents[1]


def cli_ok(args: list[str]) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (res.exit_code, res.stderr[-800:])
    return res.stdout


def run_spec_file(tmp_path: Path, **over) -> Path:
    data = minimal_spec(output_dir=str(tmp_path / "runs"), **over)
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# ----------------------------------------------------------------------------------------------
# 1. sweep grids: the product is bounded, computed without building it


# Twelve integer fields that take any value from 1 up to 10,000 in a valid run spec.
INT_FIELDS = ["train.steps", "train.warmup_steps", "train.checkpoint_every", "train.grad_accum",
              "train.micro_batch_tokens", "train.token_budget", "eval.every", "eval.samples", "eval.limit",
              "benchmark.train_limit", "benchmark.eval_limit", "seed"]


def grid_sweep(tmp_path: Path, counts: list[int]) -> Path:
    """A grid sweep whose i-th parameter (``INT_FIELDS[i]``) takes the ``counts[i]`` values 1 ... counts[i]."""
    run = run_spec_file(tmp_path)
    space = {INT_FIELDS[i]: {"type": "int", "low": 1, "high": n} for i, n in enumerate(counts)}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump({"name": "g", "run": run.name, "sampler": "grid", "n_trials": 5, "space": space}))
    return p


def test_a_grid_of_ten_to_the_twelve_points_is_one_line(tmp_path):
    """Each parameter has 10 values (far below the per-parameter limit); the product, 10^12
    points, was 3.4 GB of tuples in Optuna's GridSampler and a MemoryError."""
    p = grid_sweep(tmp_path, [10] * 12)
    one_line_error(["validate", str(p)], "space: the grid has more than 100,000 points")
    one_line_error(["sweep", str(p)], "more than 100,000 points")
    assert not (tmp_path / "runs").exists()  # refused before the study is created


def test_grid_size_limit_is_exact(tmp_path):
    at_limit = grid_sweep(tmp_path, [10, 10, 10, 10, 10])  # 10^5 = MAX_GRID_SIZE
    assert json.loads(cli_ok(["--json", "validate", str(at_limit)]))["grid_points"] == sweeps.MAX_GRID_SIZE
    over = grid_sweep(tmp_path, [11, 9091])  # 100,001 points
    with pytest.raises(UserError, match="more than 100,000 points"):
        load_sweep(over)


def test_grid_count_is_computed_not_listed():
    big = sweeps.IntDist(type="int", low=0, high=10**18, step=10**14)  # 10,001 values: one too many
    with pytest.raises(UserError, match="more than 10000 grid values"):
        sweeps.grid_count(big, "w")
    assert sweeps.grid_count(sweeps.IntDist(type="int", low=0, high=10**18, step=10**15), "w") == 1001
    floats = sweeps.FloatDist(type="float", low=0.0, high=1.0, step=0.25)
    assert sweeps.grid_count(floats, "w") == 5 == len(sweeps.grid_values(floats, "w"))
    choices = sweeps.CategoricalDist(type="categorical", choices=list(range(sweeps.MAX_GRID_POINTS + 1)))
    with pytest.raises(UserError, match="grid values"):
        sweeps.grid_count(choices, "w")


# ----------------------------------------------------------------------------------------------
# 2. counts that size a run


@pytest.mark.parametrize("override,fragment", [
    ("algorithm.params.group_size=1000000000", "algorithm.params.group_size: must be ≤ 4096, got 1000000000"),
    ("backend.max_new_tokens=1000000000", "backend.max_new_tokens: must be ≤ 131072"),
    ("backend.feedback_max_new_tokens=131073", "backend.feedback_max_new_tokens: must be ≤ 131072"),
    ("train.problems_per_step=1000000000000", "train.problems_per_step: must be ≤ 100000"),
    ("algorithm.params.epochs=1000000", "algorithm.params.epochs: must be ≤ 1024"),
    ("algorithm.params.dynamic_sampling_rounds=1000000", "must be ≤ 64"),
    ("policies.solver.lora.r=1000000000", "policies.solver.lora.r: must be ≤ 16384"),
    ("train.threads=1000000000", "train.threads: must be ≤ 1024"),
    ("train.steps=" + "1" + "0" * 400, "train.steps: must be ≤ 10000000"),  # a run that never ends
])
def test_sizes_past_their_limit_are_refused_at_validation(tmp_path, override, fragment):
    one_line_error(["validate", str(run_spec_file(tmp_path)), "--set", override], fragment)


def test_mlmt_counts_and_value_model_are_bounded(tmp_path):
    spec = minimal_spec(output_dir=str(tmp_path / "runs"))
    spec["algorithm"] = {"name": "mlmt", "params": {"group_size": 4}}
    spec["policies"]["critic"] = {"model": "tiny", "path": "CKPT"}
    p = tmp_path / "mlmt.yaml"
    p.write_text(yaml.safe_dump(spec))
    for override, fragment in [("algorithm.params.feedbacks=5000", "feedbacks: must be ≤ 4096"),
                               ("algorithm.params.refinements=5000", "refinements: must be ≤ 4096"),
                               ("algorithm.params.value_hidden=1000000000", "value_hidden: must be ≤ 65536"),
                               ("algorithm.params.value_fit_steps=1000000000000", "must be ≤ 100000")]:
        one_line_error(["validate", str(p), "--set", override], fragment)
    # each factor within its limit, their product not: P × G × K × M sequences in one turn
    one_line_error(["validate", str(p), "--set", "train.problems_per_step=65", "--set", "algorithm.params.feedbacks=64",
                    "--set", "algorithm.params.refinements=64"],  # 65 × 4 × 64 × 64
                   "train.problems_per_step × algorithm.params.group_size × algorithm.params.feedbacks × "
                   "algorithm.params.refinements = 1,064,960 sequences per step, more than the limit of 1,048,576")


def test_the_limits_themselves_are_valid(tmp_path):
    p = run_spec_file(tmp_path)
    cli_ok(["validate", str(p), "--set", "backend.max_new_tokens=131072", "--set", "train.problems_per_step=256",
            "--set", "algorithm.params.group_size=4096", "--set", "train.steps=10000000"])  # 256 × 4096 = 2^20
    # sequences: exactly the limit
    one_line_error(["validate", str(p), "--set", "train.problems_per_step=257", "--set",
                    "algorithm.params.group_size=4096"], "= 1,052,672 sequences per step")


# ----------------------------------------------------------------------------------------------
# 3. finite floats, bounded seeds


@pytest.mark.parametrize("override,fragment", [
    ("policies.solver.lr=.inf", "policies.solver.lr: must be a finite number, got inf"),
    ("backend.temperature=.inf", "backend.temperature: must be a finite number, got inf"),
    ("backend.temperature=.nan", "backend.temperature: must be a finite number, got nan"),
    ("policies.solver.temperature=-.inf", "policies.solver.temperature: must be a finite number, got -inf"),
    ("train.flop_budget=.inf", "train.flop_budget: must be a finite number"),
    ("algorithm.params.clip_high=.nan", "algorithm.params.clip_high: must be a finite number, got nan"),
    ("backend.options.x=.inf", "backend.options.x: must be a finite number"),  # free-form
    ("benchmark.verifier_options.timeout=[1.0, .nan]", "benchmark.verifier_options.timeout.1: must be a finite"),
    ("base.lr=.inf", "base.lr: must be a finite number"),  # the shared base's own model
    ("seed=18446744073709551616", "seed: must be ≤ 4294967295"),
    ("seed=-1", "seed: must be ≥ 0"),
    ("base.seed=18446744073709551616", "base.seed: must be in [0, 4294967295], got 18446744073709551616"),
])
def test_non_finite_floats_and_huge_seeds_are_refused(tmp_path, override, fragment):
    one_line_error(["validate", str(run_spec_file(tmp_path)), "--set", override], fragment)


def test_every_float_field_of_the_models_refuses_inf():
    """No float field escapes: every model of a spec and of the algorithms' parameters refuses
    ``inf`` whatever its bounds (pydantic's allow_inf_nan=False, inherited)."""
    from pydantic import ValidationError

    from mlmt_bench.registry import algorithms

    models = {policy_spec.LoraSpec, policy_spec.PolicySpec, specs.BackendSpec, specs.TrainSpec, specs.EvalSpec,
              sweeps.FloatDist, *(algorithms.get(n).Params for n in algorithms.names())}
    checked = 0
    for model in models:
        for name, f in model.model_fields.items():
            if float not in (f.annotation, *getattr(f.annotation, "__args__", ())):
                continue
            bad = {"k": float("inf")} if getattr(f.annotation, "__origin__", None) is dict else float("inf")
            with pytest.raises(ValidationError, match="finite number"):
                model.model_validate({"type": "float", "low": 0, "high": 1, name: bad}
                                     if model is sweeps.FloatDist else {name: bad})
            checked += 1
    assert checked >= 25


def test_seed_limits_in_runs_and_experiments(tmp_path):
    cli_ok(["validate", str(run_spec_file(tmp_path)), "--set", f"seed={2**32 - 1}"])
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "e", "base": "run.yaml", "seeds": [0, 2**64], "arms": {"a": {}}}))
    one_line_error(["validate", str(exp)], "seeds.1: must be ≤ 4294967295")


# ----------------------------------------------------------------------------------------------
# 4. run directories: report and run --resume


def make_run_dir(root: Path) -> Path:
    """A run directory as `mlmt-bench run` writes it: manifest, resolved spec, metrics, eval_problems."""
    d = root / "r-20250101T000000Z"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"name": "r", "status": "completed", "seed": 0}))
    (d / "spec.resolved.yaml").write_text(yaml.safe_dump(minimal_spec(output_dir=str(root))))
    ev = {"kind": "eval", "step": 0, "n": 2, "acc@t1": 0.5, "acc@t2": 0.5, "gen_tokens": 10}
    (d / "metrics.jsonl").write_text(json.dumps(ev) + "\n" + json.dumps({**ev, "kind": "final"}) + "\n")
    (d / "eval_problems.jsonl").write_text("".join(json.dumps({"step": 0, "problem_id": f"p{i}", "t1": i == 0}) + "\n"
                                                   for i in range(2)))
    return d


def report_error(run: Path, *fragments: str) -> str:
    return one_line_error(["report", str(run), "--out", str(run.parent / "report")], *fragments)


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_valid_run_directory_loads(tmp_path):
    run = load_run(make_run_dir(tmp_path))
    assert run.final["acc@t2"] == 0.5 and run.problems == {"p0": {"t1": True, "t2": True, "t2_null": None,
                                                                   "t2_base_critic": None},
                                                            "p1": {"t1": False, "t2": False, "t2_null": None,
                                                                   "t2_base_critic": None}}
    assert run.protocol["benchmark.name"] == "synthetic-arith" and run.algorithm == "grpo"


def test_report_on_an_alias_bomb_spec(tmp_path):
    run = make_run_dir(tmp_path)
    spec = yaml.safe_dump(minimal_spec()).replace("benchmark:\n", "benchmark:\n  options: {x: *a8}\n", 1)
    assert "options: {x: *a8}" in spec
    (run / "spec.resolved.yaml").write_text(alias_bomb() + spec)  # 10^9 options once expanded (before: a hang)
    report_error(run, "spec.resolved.yaml: YAML has more than 50000 nodes")


def test_report_on_a_3_gib_metrics_line(tmp_path):
    """A sparse file: 3 GiB of NUL bytes on line 2, no newline; read no further than 16 MiB."""
    run = make_run_dir(tmp_path)
    with open(run / "metrics.jsonl", "r+b") as f:
        f.truncate(3 << 30)
    report_error(run, "metrics.jsonl:3: line longer than 16 MiB")


def test_report_on_a_2_gib_manifest(tmp_path):
    run = make_run_dir(tmp_path)
    with open(run / "manifest.json", "r+b") as f:
        f.truncate(2 << 30)
    report_error(run, "manifest.json: 2147483648 bytes, more than the limit of 4 MiB")


def test_report_on_a_gzip_bomb_log(tmp_path):
    """Gzip members concatenated (one stream to gzip's reader): 40 KB that decompress to 320 MiB
    of blank 1 MiB lines, past the 256 MiB limit; a line of spaces is not one too long."""
    run = make_run_dir(tmp_path)
    member = gzip.compress(b" " * ((1 << 20) - 1) + b"\n", compresslevel=9)
    metrics = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl.gz").write_bytes(gzip.compress(metrics) + member * 320)
    assert (run / "metrics.jsonl.gz").stat().st_size < 500_000
    report_error(run, "metrics.jsonl.gz:", "more than the limit of 256 MiB of JSON Lines (decompressed)")


def test_report_on_too_many_json_values(tmp_path, monkeypatch):
    monkeypatch.setattr(bounded_input, "MAX_JSONL_NODES", 1000)
    run = make_run_dir(tmp_path)
    with open(run / "eval_problems.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, "problem_id": "p2", "t1": True, "pad": [[]] * 1000}) + "\n")
    report_error(run, "eval_problems.jsonl:3: more than the limit of 1,000 JSON values in one file")


def test_report_on_too_many_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(bounded_input, "MAX_JSONL_LINES", 100)
    run = make_run_dir(tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("\n" * 200)
    report_error(run, "metrics.jsonl:101: more than the limit of 100 lines in one file")


def test_report_on_a_huge_experiment_json(tmp_path):
    exp = tmp_path / "exp"
    make_run_dir(exp)
    with open(exp / "experiment.json", "wb") as f:
        f.truncate(1 << 30)
    one_line_error(["report", str(exp), "--out", str(tmp_path / "out")], "experiment.json: 1073741824 bytes, "
                   "more than the limit of 4 MiB")


def test_report_on_logs_that_are_devices(tmp_path):
    """A log that is a symlink to /dev/zero is not a log (and is never read)."""
    run = make_run_dir(tmp_path)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    report_error(run, "no metrics.jsonl")
    with pytest.raises(UserError, match="not a regular file"):
        read_jsonl(run / "metrics.jsonl")


def test_resume_reads_the_run_directory_within_bounds(tmp_path):
    run = make_run_dir(tmp_path)
    (run / "checkpoints").mkdir()
    with open(run / "manifest.json", "r+b") as f:
        f.truncate(2 << 30)
    one_line_error(["run", "--resume", str(run)], "manifest.json: 2147483648 bytes, more than the limit of 4 MiB")
    (run / "manifest.json").write_text(json.dumps({"name": "r", "status": "running", "seed": 0}))
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    one_line_error(["run", "--resume", str(run)], "metrics.jsonl", "refused")


def test_resume_log_truncation_reads_a_3_gib_line_no_further(tmp_path):
    """What `run --resume` does with the logs after loading the checkpoint (RunDir.truncate_logs_after)."""
    from mlmt_bench.tracking import RunDir

    run = make_run_dir(tmp_path)
    with open(run / "metrics.jsonl", "r+b") as f:
        f.truncate(3 << 30)
    with pytest.raises(UserError, match=r"metrics\.jsonl:3: line longer than 16 MiB"):
        RunDir(run).truncate_logs_after(0)


# ----------------------------------------------------------------------------------------------
# 5. verify: the whole input is bounded; \boxed extraction is linear


def verify_args(tmp_path: Path, inp: Path | str) -> list[str]:
    return ["verify", "math", str(inp), "--out", str(tmp_path / "out.jsonl")]


PROBLEM = {"id": "p", "benchmark": "x", "prompt": "6*7?", "answer": "42"}


def test_verify_many_small_containers_stop_at_the_value_limit(tmp_path, monkeypatch):
    """``[[],[],…]`` takes ~20 times its size once parsed: the input's JSON values are counted
    line by line and the input is refused past MAX_JSONL_NODES (here lowered), not kept."""
    monkeypatch.setattr(bounded_input, "MAX_JSONL_NODES", 10_000)
    inp = tmp_path / "in.jsonl"
    line = json.dumps({"problem": PROBLEM, "response": "42", "pad": [[]] * 3000}) + "\n"
    inp.write_text(line * 5)
    one_line_error(verify_args(tmp_path, inp), "in.jsonl:4: more than the limit of 10,000 JSON values")
    assert not (tmp_path / "out.jsonl").exists()


def test_verify_gzip_bomb_of_lines(tmp_path):
    """320 MiB of blank lines from a 40 KB file: read up to the 256 MiB limit, then one line."""
    inp = tmp_path / "in.jsonl.gz"
    inp.write_bytes(gzip.compress(b" " * ((1 << 20) - 1) + b"\n", compresslevel=9) * 320)
    one_line_error(verify_args(tmp_path, inp), "in.jsonl.gz:257: more than the limit of 256 MiB of JSON Lines "
                   "(decompressed) in one file")


def test_verify_input_just_over_the_total_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(bounded_input, "MAX_JSONL_BYTES", 4096)
    inp = tmp_path / "in.jsonl"
    line = json.dumps({"problem": PROBLEM, "response": "the answer is 42"}) + "\n"
    inp.write_text(line * (4096 // len(line)))
    cli_ok(verify_args(tmp_path, inp))  # at the limit: scored
    inp.write_text(line * (4096 // len(line) + 1))
    one_line_error(verify_args(tmp_path, inp), "more than the limit of 4096 bytes of JSON Lines")


def test_boxed_extraction_is_exact_on_known_inputs():
    assert extract_boxed(r"so \boxed{\frac{1}{2}} and \boxed {x^{2}}") == "x^{2}"
    assert extract_boxed(r"\boxed{1} \boxed{ } \boxed{2") == "1"  # empty and unclosed ones are skipped
    assert extract_boxed(r"\boxed{a \boxed{b}}") == "b"  # the last one opened
    assert extract_boxed(r"\boxed{\{x\}}") == r"\{x\}"  # escaped braces do not count
    assert extract_boxed(r"\fbox 5\boxed7 x") == "7"
    assert extract_boxed(r"\boxed $5$") is None and extract_boxed(r"\boxedx{5}") is None
    # nested ones too; at an unclosed one only the command word goes, and the rest is kept
    assert unwrap_commands(r"5\text{ cm} and \textbf{\text{b}} \text{c", ("text", "textbf")) == "5  cm and   b {c"
    assert normalize_answer("3 sq. ft") == "3" and normalize_answer("5 . cm") == "5"


SLOW_INPUTS = r'''
from mlmt_bench.verifiers.math import extract_answer, normalize_answer
n = 1 << 20
cases = [
    (r"\boxed{42} " + r"\boxed{" * (n // 7), "42"),       # a million unclosed \boxed{ after the answer
    (r"\boxed{" * (n // 7) + r"\boxed{7}", "7"),
    (r"\boxed{" * (n // 14) + "9" + "}" * (n // 14), "9"),  # nested: the innermost
    (r"\boxed5" * (n // 7), "5"),
]
for text, want in cases:
    got = extract_answer(text)
    assert got == want, (want, got[:40] if got else got)
assert normalize_answer("5" + " " * n + "x") == "5x"           # one run of spaces, once
assert normalize_answer("5" + "  cm" * (n // 4)) == "5"        # a unit tail after another
assert normalize_answer(r"\text{a}" * (n // 8)) == "a" * (n // 8)
print("ok")
'''


def test_linear_extraction_of_a_megabyte_of_boxed():
    """Quadratic before (60 KB of unclosed ``\\boxed{``: 38 s; 10,000 spaces in an answer: 84 s);
    the timeout only catches a hang."""
    proc = subprocess.run([sys.executable, "-c", SLOW_INPUTS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_verify_scores_a_megabyte_response(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"problem": PROBLEM, "response": r"\boxed{42} " + r"\boxed{" * 150_000}) + "\n")
    cli_ok(verify_args(tmp_path, inp))
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["verdict"]["kind"] == "ok" and out[0]["verdict"]["extracted"] == "42"
    assert extract_answer(r"\boxed{" * 10 + "no answer") is None
