"""Run-spec validation: every malformed spec gets one precise line and exit code 2."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.spec import RunSpec, apply_overrides, load_any, load_run_spec, parse_override

runner = CliRunner()


def validate(path, *extra):
    res = runner.invoke(app, ["validate", str(path), *extra])
    return res.exit_code, res.stderr.strip()


def test_good_spec_is_valid(write_spec):
    code, err = validate(write_spec(minimal_spec()))
    assert code == 0, err


BAD = [
    # (name, spec content, expected fragment of the one-line error)
    ("missing field", {k: v for k, v in minimal_spec().items() if k != "algorithm"},
     "algorithm: required field is missing"),
    ("wrong type", minimal_spec(train={"steps": "many"}), "train.steps: input should be a valid integer"),
    ("below minimum", minimal_spec(algorithm={"name": "grpo", "params": {"group_size": 1}}),
     "algorithm.params.group_size: must be ≥ 2, got 1"),
    ("unknown component", minimal_spec(benchmark={"name": "math50"}),
     "benchmark.name: unknown benchmark 'math50'; did you mean 'math500'?"),
    ("unknown algorithm", minimal_spec(algorithm={"name": "grp0"}), "unknown algorithm 'grp0'; did you mean 'grpo'?"),
    ("unknown field", {**minimal_spec(), "trian": {}}, "trian: unknown field; did you mean 'train'?"),
    ("unknown param", minimal_spec(algorithm={"name": "grpo", "params": {"group_sise": 4}}),
     "algorithm.params.group_sise: unknown field; did you mean 'group_size'?"),
    ("bad literal", minimal_spec(algorithm={"name": "grpo", "params": {"loss_agg": "mean"}}),
     "algorithm.params.loss_agg: must be one of 'token_mean', 'seq_mean_token_mean' or 'constant_norm', got 'mean'"),
    ("bad name pattern", minimal_spec(name="has space"), "name: must match"),
    ("mlmt without critic", minimal_spec(algorithm={"name": "mlmt"}), "policies.critic: required by algorithm mlmt"),
    ("non-YAML file", "name: [unclosed\n", "invalid YAML: line 2"),
    ("empty file", "", "empty file, expected a YAML mapping"),
    ("top-level list", "- a\n- b\n", "expected a YAML mapping at the top level, got list"),
    ("negative lr", minimal_spec(policies={"solver": {"lr": -1}}), "policies.solver.lr: must be > 0.0, got -1"),
    ("bad base knob", minimal_spec(base={"stepz": 3}),
     "base.stepz: unknown field; did you mean 'steps'?"),
    ("unknown verifier", minimal_spec(benchmark={"name": "synthetic-arith", "verifier": "maths"}),
     "benchmark.verifier: unknown verifier 'maths'; did you mean 'math'?"),
]


@pytest.mark.parametrize("name,content,fragment", BAD, ids=[b[0] for b in BAD])
def test_malformed_specs(write_spec, name, content, fragment):
    path = write_spec(content)
    code, err = validate(path)
    assert code == 2
    assert err.count("\n") == 0, err  # exactly one line
    assert err.startswith(f"error: {path}"), err
    assert fragment in err, err
    assert "Traceback" not in err


def test_missing_file(tmp_path):
    code, err = validate(tmp_path / "nope.yaml")
    assert code == 2 and err == f"error: {tmp_path / 'nope.yaml'}: file not found"


def test_binary_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_bytes(b"\xff\xfe\x00\x81")
    code, err = validate(p)
    assert code == 2 and "not a text file" in err


def test_circular_extends(write_spec):
    write_spec("extends: b.yaml\nname: a\n", "a.yaml")
    b = write_spec("extends: a.yaml\n", "b.yaml")
    code, err = validate(b)
    assert code == 2 and "circular extends" in err and "b.yaml" in err and "a.yaml" in err


def test_extends_missing_parent(write_spec):
    p = write_spec("extends: parent.yaml\nname: a\n")
    code, err = validate(p)
    assert code == 2 and "extends: file not found" in err


def test_extends_merges_nested_mappings(write_spec):
    write_spec(minimal_spec(train={"steps": 7, "problems_per_step": 3}), "base.yaml")
    child = write_spec("extends: base.yaml\nname: child\ntrain: {steps: 9}\n", "child.yaml")
    spec = load_run_spec(child)
    assert spec.name == "child" and spec.train.steps == 9 and spec.train.problems_per_step == 3


def test_override_coerces_types(write_spec):
    spec = load_run_spec(write_spec(minimal_spec()), ["train.steps=5", "backend.temperature=0.5",
                                                       "train.deterministic=false", "algorithm.params.group_size=6"])
    assert spec.train.steps == 5 and spec.backend.temperature == 0.5
    assert spec.train.deterministic is False and spec.algorithm.params["group_size"] == 6


def test_bad_override_path(write_spec):
    code, err = validate(write_spec(minimal_spec()), "--set", "trian.steps=3")
    assert code == 2 and err == "error: --set trian.steps=3: the spec has no field 'trian'; did you mean 'train'?"


def test_bad_override_syntax(write_spec):
    code, err = validate(write_spec(minimal_spec()), "--set", "train.steps")
    assert code == 2 and "expected KEY.PATH=VALUE" in err


def test_override_value_validated(write_spec):
    code, err = validate(write_spec(minimal_spec()), "--set", "train.steps=-3")
    assert code == 2 and "train.steps: must be ≥ 0, got -3" in err


def test_parse_override():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=null") == (["a"], None)
    with pytest.raises(UserError):
        parse_override("a..b=1")


def test_apply_overrides_into_free_mappings():
    out = apply_overrides({"benchmark": {"name": "x"}}, ["benchmark.options.difficulty=4"], RunSpec)
    assert out["benchmark"]["options"]["difficulty"] == 4


def test_experiment_spec_arms(write_spec):
    base = minimal_spec()
    base["train"]["token_budget"] = 1000
    exp = {"name": "e", "base": base, "arms": {"grpo": {}, "sc": {"algorithm": {"name": "self_correct"}}},
           "seeds": [0, 1]}
    loaded = load_any(write_spec(exp))
    assert isinstance(loaded, tuple)
    _, arms = loaded
    assert arms["sc"].algorithm.name == "self_correct" and arms["sc"].name == "e-sc"


def test_experiment_arm_error_names_the_arm(write_spec):
    exp = {"name": "e", "base": minimal_spec(),
           "arms": {"bad": {"algorithm": {"name": "grpo", "params": {"group_size": 0}}}}}
    p = write_spec(exp)
    code, err = validate(p)
    assert code == 2 and f"{p}: arms.bad: algorithm.params.group_size: must be ≥ 2, got 0" in err


def test_debug_shows_traceback(write_spec):
    res = runner.invoke(app, ["--debug", "validate", str(write_spec(""))])
    assert res.exit_code != 0 and isinstance(res.exception, UserError)


def test_json_mode(write_spec):
    import json

    res = runner.invoke(app, ["--json", "validate", str(write_spec(minimal_spec()))])
    assert res.exit_code == 0 and json.loads(res.stdout)["valid"] is True
    res = runner.invoke(app, ["--json", "validate", str(write_spec("", "e.yaml"))])
    assert res.exit_code == 2 and "empty file" in json.loads(res.stdout)["error"]


# ---------------------------------------------------------------- --set on experiments: applied or refused


def _experiment(write_spec, **arms):
    base = minimal_spec()
    base["train"]["token_budget"] = 1000
    return write_spec({"name": "e", "base": base, "output_dir": "from-file",
                       "arms": arms or {"grpo": {}, "long": {"train": {"steps": 9}}}})


def test_experiment_output_dir_override_moves_every_run(write_spec, tmp_path):
    exp, arms = load_any(_experiment(write_spec), [f"output_dir={tmp_path / 'elsewhere'}"])
    assert exp.output_dir == str(tmp_path / "elsewhere")
    assert {a.output_dir for a in arms.values()} == {str(tmp_path / "elsewhere")}


def test_experiment_fields_can_be_set(write_spec):
    exp, arms = load_any(_experiment(write_spec), ["seeds=[3, 4]", "name=renamed", "budget=none"])
    assert exp.seeds == [3, 4] and exp.name == "renamed" and exp.budget == "none"
    assert arms["grpo"].name == "renamed-grpo"


def test_override_wins_over_an_arm_that_sets_the_same_field(write_spec):
    exp, arms = load_any(_experiment(write_spec), ["train.steps=3"])
    assert {arm: s.train.steps for arm, s in arms.items()} == {"grpo": 3, "long": 3}
    assert exp.base["train"]["steps"] == 3


def test_overrides_an_experiment_cannot_apply_are_errors(write_spec):
    p = _experiment(write_spec)
    code, err = validate(p, "--set", "seed=5")
    assert code == 2 and "seeds: list; use --set seeds=[...]" in err and err.count("\n") == 0
    for field in ("seed", "output_dir"):
        bad = _experiment(write_spec, a={field: 1 if field == "seed" else "x"})
        code, err = validate(bad)
        assert code == 2 and f"arms.a: {field}: an arm cannot set it" in err, err


@pytest.mark.parametrize(("backend", "options", "message"), [
    ("hf", {"batch_sise": 8}, "unknown option(s) for hf: batch_sise (known: batch_size, decode"),
    ("hf", {"decode": "fast"}, "options.decode must be one of generate, static, got 'fast'"),
    ("hf", {"batch_size": 0}, "options.batch_size must be an integer"),
    ("vllm", {"gpu_mem": 0.5}, "unknown option(s) for vllm: gpu_mem (known: gpu_memory_utilization"),
])
def test_backend_options_are_checked_when_the_spec_is(write_spec, backend, options, message):
    """A misspelt or impossible backend option fails `validate`, not (or silently ignored in) a run."""
    from mlmt_bench.spec import load_any

    spec = minimal_spec(backend={"name": backend, "options": options})
    with pytest.raises(UserError, match=re.escape(message)):
        load_any(write_spec(spec))


def test_set_under_a_yaml_alias_changes_only_that_place(write_spec):
    """`critic: *solver` shares one mapping in the parsed YAML; --set policies.critic.lr must not
    also change the solver's learning rate."""
    text = ("name: t\nbenchmark: {name: synthetic-arith}\nalgorithm: {name: mlmt}\n"
            "policies:\n  solver: &pol {model: tiny, lr: 1.0e-4}\n  critic: *pol\n")
    spec = load_any(write_spec(text), ["policies.critic.lr=0.003"])
    assert spec.policies.critic.lr == 0.003 and spec.policies.solver.lr == 1.0e-4


def test_validate_checks_a_sweep_spec_and_its_run_spec(write_spec, tmp_path):
    """`validate SWEEP.yaml` checks the sweep (space paths, grid) and its run spec at each
    parameter's end points, instead of calling it a run spec without a benchmark."""
    write_spec(minimal_spec(), "run.yaml")
    good = write_spec({"name": "s", "run": "run.yaml", "sampler": "grid", "pruner": "none", "n_trials": 4,
                       "space": {"algorithm.params.loss": {"type": "categorical", "choices": ["clip", "cispo"]}}},
                      "sweep.yaml")
    res = runner.invoke(app, ["validate", str(good)])
    assert res.exit_code == 0 and "valid sweep spec 's' over algorithm.params.loss" in res.stdout
    bad = write_spec({"name": "s", "run": "run.yaml",
                      "space": {"algorithm.params.loss": {"type": "categorical", "choices": ["clip", "cipso"]}}},
                     "bad.yaml")
    code, err = validate(bad)
    assert code == 2 and "cipso" in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------------------------
# algorithm.params: validated once, by the spec


def test_algorithm_params_are_validated_once_and_plan_reuses_them(monkeypatch, tmp_path):
    """validate_run validates ``algorithm.params`` (its errors are the one-line ones above); the
    runner and ``plan`` read the same object, never the Params model again."""
    import mlmt_bench.spec as spec_module
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    spec = spec_module.validate_run(minimal_spec(output_dir=str(tmp_path), policies={"solver": {"model": "tiny"}},
                                                 base={}), "t")
    params = spec.algorithm.validated_params()
    assert params.group_size == 4 and spec.algorithm.params == params.model_dump()

    def no_second_validation(*args, **kwargs):
        raise AssertionError("algorithm.params validated again")

    monkeypatch.setattr(spec_module, "algorithm_params_model", no_second_validation)
    monkeypatch.setattr(type(params), "model_validate", no_second_validation)
    assert spec.algorithm.validated_params() is params
    table = load_table()
    assert plan_run(spec, resolve_device("cpu", table), 1, table)["algorithm"] == "grpo"
    monkeypatch.undo()
    spec.algorithm.params = {**spec.algorithm.params, "group_size": 1}  # changed since: validated again
    with pytest.raises(UserError) as err:
        spec.algorithm.validated_params("t")
    assert str(err.value).startswith("t: algorithm.params.group_size: must be ≥ 2, got 1")


@pytest.mark.parametrize("name", ["grpo", "self_correct", "mlmt", "critique_grpo", "self_distill"])
def test_validated_params_are_what_their_dump_validates_to(name):
    """The runner reuses the object validated from the spec's own params, where it once validated
    their dump again: the same object for every built-in algorithm and step-plan variant."""
    from mlmt_bench.spec import algorithm_params_model

    model = algorithm_params_model(name)
    for over in model.variants().values():
        params = model.model_validate(over)
        assert model.model_validate(params.model_dump()) == params, (name, over)
