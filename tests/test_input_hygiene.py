"""Input hygiene (the robustness issue's "Input hygiene" part): what a user hands in that is
well-formed enough to get past the bounds of :mod:`mlmt_bench.io.bounded_input` but wrong in a way
that used to pass silently or end in a traceback. Each case must end with exit code 2 and exactly
one ``error: ...`` line that names the file / field at fault:

1. a YAML key given twice (PyYAML kept the last: a second ``train:`` dropped ``token_budget``);
2. control characters and bidi overrides reaching the terminal raw through an error message;
3. a symbolic link loop as the spec or as an ``extends:`` target (a RuntimeError traceback);
4. an ``output_dir`` that is a file, holds a NUL or lies under /proc (refused at validation);
5. a ``benchmark.path`` that is a device or FIFO, an hf model path that is no model directory;
6. ``report --baseline`` naming no arm (exit 0, the comparison silently dropped).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.io import bounded_input

ESC_RED, RLO = "\x1b[31m", "\u202e"


def one_line_error(args: list[str], *fragments: str) -> str:
    """Run the CLI in this process: exit 2, exactly one ``error:`` line holding ``fragments``, and
    no character in it that a terminal would act on (as tests/test_untrusted.py's, plus that)."""
    res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, (res.exit_code, res.stderr[-800:])
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr[-800:]
    assert_printable(res.stderr[:-1])
    for f in fragments:
        assert f in res.stderr, res.stderr
    return res.stderr


def assert_printable(text: str) -> None:
    raw = sorted({f"U+{ord(c):04X}" for c in text if not c.isprintable()})
    assert not raw, (raw, ascii(text))


def spec_text(**over: object) -> str:
    return yaml.safe_dump(minimal_spec(**over), sort_keys=False, allow_unicode=True)


# ----------------------------------------------------------------------------------------------
# 1. duplicate keys


def test_a_second_train_mapping_is_an_error_naming_the_key_and_both_lines(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(textwrap.dedent("""\
        name: t
        benchmark: {name: synthetic-arith}
        algorithm: {name: grpo, params: {group_size: 4}}
        train:
          token_budget: 1000
        policies: {solver: {model: tiny, path: CKPT}}
        train:
          steps: 3
        """))
    for command in ("validate", "run", "plan"):
        one_line_error([command, str(p)], f"{p}: duplicate key 'train' at lines 4 and 7")


def test_a_nested_duplicate_key_and_one_in_an_extends_parent(tmp_path):
    parent = tmp_path / "parent.yaml"
    parent.write_text(spec_text().replace("  steps: 2\n", "  steps: 2\n  problems_per_step: 4\n  steps: 5\n"))
    one_line_error(["validate", str(parent)], "duplicate key 'steps' at lines")
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\ndescription: x\n")
    one_line_error(["validate", str(child)], f"{parent}: duplicate key 'steps'")
    deep = tmp_path / "deep.yaml"  # a flow mapping: both on one line, told apart by column
    deep.write_text(spec_text(algorithm={"name": "grpo", "params": {"group_size": 4}}).replace(
        "group_size: 4", "{group_size: 4, group_size: 8}").replace("params:\n    {", "params: {"))
    one_line_error(["validate", str(deep)], "duplicate key 'group_size' at line")


def test_a_duplicate_key_in_a_set_value_is_an_error_not_a_string(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(spec_text())
    one_line_error(["validate", str(p), "--set", "train={steps: 1, steps: 9}"],
                   "--set train: duplicate key 'steps' at line 1, columns 2 and 12")


def test_a_key_that_is_no_name_is_not_shown():
    with pytest.raises(UserError) as err:
        bounded_input.load_yaml('"\\e[31mx": 1\n"\\e[31mx": 2\n', "f.yaml")  # YAML's \e: ESC
    assert str(err.value) == ("f.yaml: duplicate key (not shown) at lines 1 and 2 (the second would silently "
                              "replace the first)")


@pytest.mark.parametrize("text, expected", [
    # a merge key's values may be overridden: not duplicates
    ("b: &B {p: 1, q: 2}\nc:\n  <<: *B\n  p: 3\n", {"b": {"p": 1, "q": 2}, "c": {"p": 3, "q": 2}}),
    ("a: &A {p: 1}\nb: &B {p: 2}\nc: {<<: [*A, *B], p: 3}\n", {"a": {"p": 1}, "b": {"p": 2}, "c": {"p": 3}}),
    # a mapping merged (so rewritten in place) before it is built itself: still checked as written
    ("x:\n  deep:\n    B: &B {<<: {p: 1}, p: 2}\ny: {<<: *B}\n", None),
    # the same key in different mappings, and in a list of mappings
    ("a: {k: 1}\nb: {k: 1}\n", {"a": {"k": 1}, "b": {"k": 1}}),
    ("- k: 1\n- k: 2\n", [{"k": 1}, {"k": 2}]),
])
def test_what_is_not_a_duplicate_loads_as_before(text, expected):
    got = bounded_input.load_yaml(text, "f.yaml")
    assert got == (expected if expected is not None else yaml.safe_load(text))


def test_the_shipped_specs_have_no_duplicate_keys():
    repo = Path(__file__).resolve().parents[1]
    files = sorted((repo / "registry").rglob("*.yaml"))
    assert files
    for f in files:  # raises on a duplicate
        bounded_input.load_yaml(bounded_input.read_text(f), str(f))


# ----------------------------------------------------------------------------------------------
# 2. control characters


def test_printable_escapes_controls_and_bidi_and_keeps_the_rest():
    assert bounded_input.printable(f"a{ESC_RED}b{RLO}c\x00\x07\r\x9b\u2066\udcff") == \
        r"a\x1b[31mb\u202ec\x00\x07\x0d\x9b\u2066\udcff"
    assert bounded_input.printable("≥ 2, got 'grpo' … ∅ é 中") == "≥ 2, got 'grpo' … ∅ é 中"


def test_a_name_or_unknown_component_with_controls_gives_a_clean_line(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(spec_text(name=f"x{ESC_RED}red{RLO}"))
    one_line_error(["validate", str(p)], "name: must match")
    p.write_text(spec_text(benchmark={"name": f"synth{ESC_RED}{RLO}\x07"}))
    one_line_error(["validate", str(p)], "benchmark.name: unknown benchmark")


def test_controls_that_messages_do_echo_are_escaped(tmp_path):
    """The spec's own path, an experiment's arm name, a --set value, an output_dir: each of these
    is quoted in the message, and used to reach the terminal raw."""
    odd = tmp_path / f"odd{ESC_RED}{RLO}.yaml"
    odd.write_text(spec_text(benchmark={"name": "nope"}))
    one_line_error(["validate", str(odd)], r"odd\x1b[31m\u202e.yaml: benchmark.name")
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "e", "base": minimal_spec(),
                                   "arms": {f"a{ESC_RED}{RLO}": {"name": "ok", "train": {"steps": -1}}}}))
    one_line_error(["validate", str(exp)], r"arms.a\x1b[31m\u202e: train.steps")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text())
    one_line_error(["validate", str(spec), "--set", f"train.stepz{ESC_RED}\r{RLO}=1"], r"\x1b[31m\x0d\u202e")
    spec.write_text(spec_text(output_dir=str(tmp_path / "a\0b")))
    # a path holding a NUL is no path: its text (whatever a file put there) is not shown at all
    one_line_error(["validate", str(spec)], "output_dir:", "NUL byte, not shown")


def test_json_errors_and_the_success_line_are_escaped_too(tmp_path):
    odd = tmp_path / f"ok{ESC_RED}.yaml"
    odd.write_text(spec_text())
    res = CliRunner().invoke(app, ["validate", str(odd)])
    assert res.exit_code == 0, res.stderr
    assert_printable(res.stdout.rstrip("\n"))
    assert r"ok\x1b[31m.yaml: valid run spec 't'" in res.stdout
    odd.write_text(spec_text(benchmark={"name": "nope"}))
    res = CliRunner().invoke(app, ["--json", "validate", str(odd)])
    assert res.exit_code == 2
    assert_printable(res.stdout.rstrip("\n"))
    assert "\\\\x1b[31m" in res.stdout  # escaped, then JSON-escaped


# ----------------------------------------------------------------------------------------------
# 3. symbolic link loops


@pytest.fixture()
def loop(tmp_path: Path) -> Path:
    """``loop1.yaml -> loop2.yaml -> loop1.yaml``."""
    os.symlink("loop2.yaml", tmp_path / "loop1.yaml")
    os.symlink("loop1.yaml", tmp_path / "loop2.yaml")
    return tmp_path / "loop1.yaml"


@pytest.mark.parametrize("command", ["validate", "run", "plan", "base"])
def test_a_symlink_loop_as_the_spec(loop, command):
    one_line_error([command, str(loop)], f"{loop}: cannot read (a symbolic link loop)")


@pytest.mark.parametrize("command", ["validate", "run", "plan", "base"])
def test_a_symlink_loop_as_an_extends_target(loop, command):
    child = loop.parent / "child.yaml"
    child.write_text("extends: loop1.yaml\n" + spec_text())
    one_line_error([command, str(child)], f"{child}: extends: {loop}: cannot read (a symbolic link loop)")


def test_a_symlink_loop_as_an_experiments_base(loop):
    exp = loop.parent / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "e", "base": "loop1.yaml", "arms": {"a": {}}}))
    one_line_error(["validate", str(exp)], f"{loop}: cannot read (a symbolic link loop)")


# ----------------------------------------------------------------------------------------------
# 4. output_dir


@pytest.fixture()
def no_run(monkeypatch):
    """Fail the test if a run gets as far as being built."""
    from mlmt_bench import experiment, runner

    def refuse(*a, **k):
        raise AssertionError("reached the run: the output_dir was not checked at validation")

    monkeypatch.setattr(runner, "run", refuse)
    monkeypatch.setattr(experiment, "run_experiment", refuse)


def _bad_output_dirs(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "a-file").write_text("x")
    return [(str(tmp_path / "a-file"), "is a regular file, not a directory"),
            (str(tmp_path / "a\0b"), "unusable path"),
            ("x\0root:$6$hash-of-a-shadow-line", "NUL byte, not shown"),  # its text is never echoed
            ("/proc/self/runs", "refused")]


@pytest.mark.parametrize("command", ["validate", "run", "plan"])
def test_a_bad_output_dir_is_refused_at_validation(tmp_path, no_run, command):
    spec = tmp_path / "spec.yaml"
    for output_dir, why in _bad_output_dirs(tmp_path):
        spec.write_text(spec_text(output_dir=output_dir))
        err = one_line_error([command, str(spec)], f"{spec}: output_dir: ", why)
        assert "hash-of-a-shadow-line" not in err


def test_an_experiments_bad_output_dir_is_its_own_not_an_arms(tmp_path, no_run):
    exp = tmp_path / "exp.yaml"
    for output_dir, why in _bad_output_dirs(tmp_path):
        exp.write_text(yaml.safe_dump({"name": "e", "base": minimal_spec(), "arms": {"a": {}},
                                       "output_dir": output_dir}))
        for command in ("validate", "run"):
            err = one_line_error([command, str(exp)], f"{exp}: output_dir: ", why)
            assert "arms." not in err
    exp.write_text(yaml.safe_dump({"name": "e", "base": minimal_spec(), "arms": {"a": {}}}))
    one_line_error(["validate", str(exp), "--set", f"output_dir={tmp_path / 'a-file'}"],
                   "--set output_dir=", "is a regular file")


# ----------------------------------------------------------------------------------------------
# 5. benchmark.path and model paths


def test_a_device_or_fifo_as_benchmark_path_says_what_it_is(tmp_path, no_run):
    os.mkfifo(tmp_path / "fifo")
    spec = tmp_path / "spec.yaml"
    for path, what in (("/dev/zero", "is a character device, refused"), (str(tmp_path / "fifo"), "is a FIFO, refused"),
                       (str(tmp_path / "nope.jsonl"), "does not exist")):
        spec.write_text(spec_text(benchmark={"name": "synthetic-arith", "path": path}))
        for command in ("validate", "run"):
            one_line_error([command, str(spec)], f"benchmark.path: {path} {what}")


def test_the_data_loader_says_what_a_path_is(tmp_path):
    from mlmt_bench.benchmarks.math500 import Math500

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UserError, match=r"path /dev/zero is a character device, refused"):
        Math500(path="/dev/zero").load("test")
    with pytest.raises(UserError, match=r"fifo is a FIFO, refused"):
        Math500(path=str(tmp_path / "fifo")).load("test")


def test_a_model_path_that_is_no_model_directory(tmp_path):
    from mlmt_bench.models.policy import _load, check_model_dir

    with pytest.raises(UserError, match=r"^model '/etc': not a model directory \(no config.json\)$"):
        _load("/etc", "float32", None)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match=r"is a regular file, not a model directory"):
        _load(str(tmp_path / "weights.bin"), "float32", None)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    # what it holds is checked as eval checks it (models/model_dir_check.py): an adapter for no model is none
    with pytest.raises(UserError, match="no base_model_name_or_path"):
        check_model_dir(tmp_path / "adapter", "adapter")
    import torch
    from safetensors.torch import save_file

    (tmp_path / "adapter" / "adapter_config.json").write_text('{"base_model_name_or_path": "org/base"}')
    save_file({"lora_A.weight": torch.zeros(2, 2)}, str(tmp_path / "adapter" / "adapter_model.safetensors"))
    check_model_dir(tmp_path / "adapter", "adapter")  # a peft adapter directory is one
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    (tmp_path / "adapter" / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(UserError):  # pickle weights only: refused before torch unpickles them
        check_model_dir(tmp_path / "adapter", "adapter")


def test_run_with_an_hf_model_path_of_etc_is_one_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(output_dir=str(tmp_path / "runs"), policies={"solver": {"model": "hf", "path": "/etc"}}))
    one_line_error(["run", str(spec)], "model '/etc': not a model directory (no config.json)")


# ----------------------------------------------------------------------------------------------
# 6. report --baseline


@pytest.fixture()
def two_arms(tmp_path: Path) -> list[Path]:
    from support import make_run

    r = tmp_path / "runs"
    return [make_run(r, f"{arm}-20250101T000000Z", seed=0, arm=arm, feedback=False,
                     curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5)], t1=[1, 0, 0, 1], t2=[1, 1, 0, 1])
            for arm in ("grpo", "mlmt")]


def test_an_unknown_baseline_is_an_error_with_did_you_mean(tmp_path, two_arms):
    out = tmp_path / "out"
    one_line_error(["report", *map(str, two_arms), "--out", str(out), "--baseline", "grop"],
                   "--baseline: unknown arm 'grop'; did you mean 'grpo'? (known: grpo, mlmt)")
    assert not out.exists()  # refused before anything is written
    one_line_error(["report", *map(str, two_arms), "--out", str(out), "--baseline", "zzz"],
                   "unknown arm 'zzz' (known: grpo, mlmt)")


def test_a_baseline_check_accepts_an_arm_and_its_base_critic_row():
    from mlmt_bench.report.compare import check_baseline

    check_baseline("grpo", ["grpo", "mlmt"])
    check_baseline("grpo + base critic", ["grpo", "mlmt"])
    with pytest.raises(UserError, match="unknown arm"):
        check_baseline("sc + base critic", ["grpo", "mlmt"])


def test_notes_and_warnings_reach_the_current_stderr_escaped(capsys):
    """The library's notes go through one place (mlmt_bench.io.notes), which escapes what a spec put in."""
    from mlmt_bench.io import notes

    notes.warn(f"sandbox weakened for {ESC_RED}x{RLO}")
    notes.note("base cached")
    notes.tell("warning: a line as it is")
    assert capsys.readouterr().err == ("warning: sandbox weakened for \\x1b[31mx\\u202e\n"
                                       "note: base cached\nwarning: a line as it is\n")
