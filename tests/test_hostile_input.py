"""Hostile input through every way a user hands in structured text: run, experiment and sweep
specs (and their ``extends:`` / ``base:`` / ``run:`` files), ``--set`` values and ``verify`` input
lines. Each case must end with exit code 2, exactly one ``error: ...`` line on stderr, and
quickly (the wall time is measured here, in the test's own process; the bound is generous).

The inputs are generated: nesting depth, alias expansion ("billion laughs"), sizes, endless
files (a device, a FIFO), numbers and dates YAML / JSON cannot build, and huge values that an
error message would otherwise echo whole.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app
from mlmt_bench.io import bounded_input

WALL_S = 10.0
FAST_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # writing 1 MB in pure Python takes seconds
REPO = Path(__file__).resolve().parents[1]


def expect_one_line_error(args: list[str], fragment: str = "") -> str:
    """Run the CLI in this process; assert exit 2, one ``error:`` line, the time bound."""
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, args)
    wall = time.perf_counter() - t0
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, (res.exit_code, res.stderr[-500:])
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr[:500]
    assert len(res.stderr) < 600, f"the error echoes too much input: {len(res.stderr)} characters"
    assert fragment in res.stderr, res.stderr
    assert wall < WALL_S, f"took {wall:.1f} s"
    return res.stderr


def expect_one_line_error_subprocess(args: list[str], fragment: str = "") -> str:
    """The same through a real ``mlmt-bench`` process, for inputs that could block forever."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlmt_bench.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr[:500]
    assert fragment in proc.stderr, proc.stderr
    assert wall < WALL_S, f"took {wall:.1f} s"
    return proc.stderr


# ----------------------------------------------------------------------------------------------
# generators


def flow_nesting(depth: int) -> str:
    return "[" * depth + "]" * depth


def block_nesting(depth: int) -> str:
    return "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "b: 1\n"


def laughs(levels: int = 9, width: int = 10, indent: str = "") -> str:
    """A mapping whose last key expands to width**levels scalars (YAML anchors and aliases)."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "".join(indent + line + "\n" for line in lines)


def laughs_flow(levels: int = 9, width: int = 10) -> str:
    """The same bomb on one line (a ``--set`` value)."""
    parts = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    parts += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


def spec_with(tmp_path: Path, section: str, body: str) -> Path:
    """A valid run spec whose free-form ``section`` (benchmark.options, algorithm.params or
    base) holds the block-style YAML ``body``."""
    spec = minimal_spec()
    spec["algorithm"] = {"name": "grpo"}
    *parents, leaf = section.split(".")
    node = spec
    for key in parents:
        node = node[key]
    node[leaf] = "BODY"
    indent = "  " * len(section.split("."))
    text = yaml.safe_dump(spec, sort_keys=False).replace(
        f"{leaf}: BODY\n", f"{leaf}:\n" + "".join(indent + line + "\n" for line in body.splitlines()))
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------------------------
# spec files


@pytest.mark.parametrize("section", ["benchmark.options", "algorithm.params", "base"])
def test_alias_bomb_under_a_free_form_field(tmp_path, section):
    p = spec_with(tmp_path, section, laughs())
    expect_one_line_error(["validate", str(p)], "nodes (aliases counted as copies)")


def test_alias_bomb_at_the_limit_edge(tmp_path):
    """Just above MAX_NODES through aliases is refused; the same shape just below is read."""
    big = minimal_spec(description="x")
    below = yaml.safe_dump(big) + "base:\n" + laughs(levels=2, width=100, indent="  ")  # ~10^4 nodes
    p = tmp_path / "below.yaml"
    p.write_text(below)
    res = CliRunner().invoke(app, ["validate", str(p)])
    assert res.exit_code == 2 and "base.l0: unknown field" in res.stderr, res.stderr  # read, then checked
    above = yaml.safe_dump(big) + "base:\n" + laughs(levels=3, width=40, indent="  ")  # ~66,000
    p.write_text(above)
    expect_one_line_error(["validate", str(p)], "more than 50000 nodes")


@pytest.mark.parametrize("depth,fragment", [(65, "nested deeper than 64 levels"),
                                            (100_000, "invalid YAML")])
def test_deeply_nested_flow_document(tmp_path, depth, fragment):
    p = tmp_path / "deep.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()) + "description: " + flow_nesting(depth) + "\n")
    expect_one_line_error(["validate", str(p)], fragment)


def test_deeply_nested_block_document(tmp_path):
    p = tmp_path / "deep.yaml"
    nested = "".join("  " + line + "\n" for line in block_nesting(200).splitlines())
    p.write_text(yaml.safe_dump(minimal_spec()) + "base:\n" + nested)
    expect_one_line_error(["validate", str(p)], "nested deeper than 64 levels")


def test_depth_reached_through_an_alias(tmp_path):
    """Each part is 40 deep; the alias puts one inside the other: 80 levels once expanded."""
    text = yaml.safe_dump(minimal_spec()) + f"description: &deep {flow_nesting(40)}\n" \
        + "base: {x: " + "[" * 39 + "*deep" + "]" * 39 + "}\n"
    p = tmp_path / "deep.yaml"
    p.write_text(text)
    expect_one_line_error(["validate", str(p)], "with aliases expanded")


def test_alias_inside_the_node_it_names(tmp_path):
    p = tmp_path / "loop.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()) + "base: &me {self: *me}\n")
    expect_one_line_error(["validate", str(p)], "inside the node it names")


def test_file_over_the_size_limit(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()) + "description: " + "x" * (bounded_input.MAX_FILE_BYTES + 1) + "\n")
    expect_one_line_error(["validate", str(p)], "more than the limit of 1 MiB")


@pytest.mark.parametrize("value,fragment", [("9" * 5000, "4300 digits"), ("2001-02-30", "day is out of range"),
                                            ("!!binary 'not base64!'", "invalid YAML")])
def test_values_yaml_cannot_build(tmp_path, value, fragment):
    p = tmp_path / "value.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()) + f"description: {value}\n")
    expect_one_line_error(["validate", str(p)], fragment)


def test_huge_values_are_not_echoed_whole(tmp_path):
    """A 300 KB benchmark name, key, field value and data path: the error quotes a few dozen characters."""
    huge = "b" * 300_000
    for over in (dict(benchmark={"name": huge}), {huge: 1}, dict(train={"steps": huge}), dict(seed=[huge] * 3),
                 dict(benchmark={"name": "synthetic-arith", "path": huge})):
        p = tmp_path / "huge.yaml"
        p.write_text(yaml.dump(minimal_spec(**over), Dumper=FAST_DUMPER))
        expect_one_line_error(["validate", str(p)])


@pytest.mark.timeout(60)  # were a FIFO opened, this would block: fail rather than hang
@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "link-to-zero", "directory"])
def test_endless_or_odd_file_through_extends(tmp_path, target):
    """A device, a FIFO (opening one blocks until a writer comes), a symlink to a device and a
    directory, named by ``extends:``: refused before being opened."""
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    elif target == "link-to-zero":
        os.symlink("/dev/zero", tmp_path / "link-to-zero")
    elif target == "directory":
        (tmp_path / "directory").mkdir()
    p = tmp_path / "child.yaml"
    p.write_text(f"extends: {target}\n" + yaml.safe_dump(minimal_spec()))
    want = "is a directory" if target == "directory" else "not a regular file"
    expect_one_line_error(["validate", str(p)], want)


def test_fifo_as_the_spec_itself(tmp_path):
    """In a real CLI process: nothing before the check may open the file either."""
    os.mkfifo(tmp_path / "spec.yaml")
    expect_one_line_error_subprocess(["validate", str(tmp_path / "spec.yaml")], "not a regular file")


def test_long_extends_chain(tmp_path):
    n = bounded_input.MAX_EXTENDS + 4
    (tmp_path / "f0.yaml").write_text(yaml.safe_dump(minimal_spec()))
    for i in range(1, n):
        (tmp_path / f"f{i}.yaml").write_text(f"extends: f{i - 1}.yaml\ndescription: level {i}\n")
    expect_one_line_error(["validate", str(tmp_path / f"f{n - 1}.yaml")], "extends: chain of more than 16 files")


def test_extends_with_a_huge_or_nul_path(tmp_path):
    for target in ("a" * 100_000, "bad\0name"):
        p = tmp_path / "child.yaml"
        p.write_text(yaml.safe_dump({"extends": target, **minimal_spec()}))
        expect_one_line_error(["validate", str(p)], "extends: file not found")


@pytest.mark.timeout(60)
def test_experiment_base_file_is_bounded(tmp_path):
    os.mkfifo(tmp_path / "base.yaml")
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "e", "base": "base.yaml", "arms": {"a": {}}}))
    expect_one_line_error(["validate", str(exp)], "not a regular file")


def test_alias_bomb_in_an_experiment_arm(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "e", "base": minimal_spec()}) + "arms:\n  a:\n    base:\n"
                   + laughs(indent="      "))
    expect_one_line_error(["validate", str(exp)], "nodes")


# ----------------------------------------------------------------------------------------------
# --set


@pytest.mark.parametrize("value,fragment", [
    (laughs_flow(), "nodes (aliases counted as copies)"),
    (flow_nesting(65), "nested deeper than 64 levels"),
    (flow_nesting(100_000), ""),  # past libyaml's own depth limit: not YAML, so a string (not a mapping)
    ("x" * (bounded_input.MAX_FILE_BYTES + 1), "more than the limit of 1 MiB"),
    ("9" * 5000, "4300 digits"),
    ("\udcff", "not valid UTF-8"),  # an undecodable byte of a command-line argument
])
def test_hostile_override_values(tmp_path, value, fragment):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()))
    expect_one_line_error(["validate", str(p), "--set", f"benchmark.options={value}"], fragment)


def test_override_paths_too_deep_or_too_long(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(minimal_spec()))
    expect_one_line_error(["validate", str(p), "--set", "benchmark.options." + ".".join(["a"] * 100) + "=1"],
                          "more than 64 components")
    expect_one_line_error(["validate", str(p), "--set", "z" * 500_000 + "=1"], "has no field")


# ----------------------------------------------------------------------------------------------
# sweep specs


def write_sweep(tmp_path: Path, run_text: str, space_text: str = "", sampler: str = "random") -> Path:
    (tmp_path / "run.yaml").write_text(run_text)
    space = space_text or "  algorithm.params.lam: {type: float, low: 0.0, high: 1.0}\n"
    p = tmp_path / "sweep.yaml"
    p.write_text(f"name: sw\nrun: run.yaml\nsampler: {sampler}\nspace:\n{space}")
    return p


def mlmt_run_text() -> str:
    return yaml.safe_dump(minimal_spec(algorithm={"name": "mlmt", "params": {"variant": "shared_policy"}}))


def test_alias_bomb_in_a_sweep_file(tmp_path):
    bomb = "  algorithm.params.lam:\n    type: categorical\n    choices:\n      - 0.1\n    extra:\n" \
        + laughs(indent="      ")
    expect_one_line_error(["sweep", str(write_sweep(tmp_path, mlmt_run_text(), bomb))], "nodes")


def test_deep_sweep_file(tmp_path):
    space = f"  algorithm.params.lam: {{type: categorical, choices: {flow_nesting(80)}}}\n"
    expect_one_line_error(["sweep", str(write_sweep(tmp_path, mlmt_run_text(), space))], "nested deeper")


@pytest.mark.timeout(60)
def test_sweep_run_spec_extends_an_endless_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    p = write_sweep(tmp_path, "extends: fifo\n" + mlmt_run_text())
    expect_one_line_error(["sweep", str(p)], "not a regular file")


def test_sweep_override_bomb(tmp_path):
    p = write_sweep(tmp_path, mlmt_run_text())
    expect_one_line_error(["sweep", str(p), "--set", f"benchmark.options={laughs_flow()}"], "nodes")


def test_sweep_grid_too_large_to_build(tmp_path):
    for space in ("  train.steps: {type: int, low: 1, high: 1000000000000}\n",
                  "  algorithm.params.lam: {type: float, low: 0.0, high: 1.0e300, step: 1.0e-300}\n"):
        p = write_sweep(tmp_path, mlmt_run_text(), space, sampler="grid")
        expect_one_line_error(["sweep", str(p)], "grid values")


# ----------------------------------------------------------------------------------------------
# verify input lines


def verify_args(tmp_path: Path, inp: Path | str) -> list[str]:
    return ["verify", "math", str(inp), "--out", str(tmp_path / "out.jsonl")]


@pytest.mark.parametrize("line,fragment", [
    (flow_nesting(65), "JSON nested deeper than 64 levels"),
    (flow_nesting(200_000), "nested too deeply"),
    ('{"response": "x", "benchmark": "gsm8k", "id": ' + "9" * 5000 + "}", "4300 digits"),
    ('{"response": "' + "x" * (bounded_input.MAX_LINE_BYTES + 10) + '"}', "line longer than 16 MiB"),
    ('{"response": "x", "benchmark": "gsm8k", "id": "' + "z" * 300_000 + '"}', "has no problem with id"),
])
def test_hostile_verify_lines(tmp_path, line, fragment):
    inp = tmp_path / "in.jsonl"
    inp.write_text(line + "\n")
    expect_one_line_error(verify_args(tmp_path, inp), fragment)


def test_verify_gzip_bomb_line(tmp_path):
    """100 MiB of zeros without a newline, gzip-compressed to ~100 KB: read no further than the limit."""
    inp = tmp_path / "in.jsonl.gz"
    inp.write_bytes(gzip.compress(b"0" * (100 << 20), compresslevel=1))
    expect_one_line_error(verify_args(tmp_path, inp), "line longer than 16 MiB")


def test_verify_endless_input(tmp_path):
    """/dev/zero in this process; a FIFO in a real CLI process."""
    expect_one_line_error(verify_args(tmp_path, "/dev/zero"), "not a regular file")
    os.mkfifo(tmp_path / "fifo")
    expect_one_line_error_subprocess(verify_args(tmp_path, tmp_path / "fifo"), "not a regular file")
