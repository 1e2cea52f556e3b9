"""Registries: lazy entries, did-you-mean errors, third-party plugins through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.registry import Registry, UnknownComponentError

ROOT = Path(__file__).resolve().parents[1]


def test_lazy_entry_is_imported_on_first_get():
    r = Registry("thing", "builtins:object")
    r.register("dec", "decimal:Decimal", "decimal numbers")
    assert r.entry("dec").is_lazy
    import decimal

    assert r.get("dec") is decimal.Decimal
    assert not r.entry("dec").is_lazy


def test_unknown_name_lists_known_and_closest():
    with pytest.raises(UnknownComponentError) as exc:
        registry.benchmarks.get("gsm8")
    msg = str(exc.value)
    assert "unknown benchmark 'gsm8'; did you mean 'gsm8k'?" in msg and "math500" in msg


def test_unknown_name_without_close_match():
    with pytest.raises(UnknownComponentError) as exc:
        registry.algorithms.get("zzzzzz")
    assert "did you mean" not in str(exc.value) and "grpo" in str(exc.value)


def test_every_unknown_name_gets_the_same_did_you_mean():
    from mlmt_bench.algorithms.params import MLMTParams
    from mlmt_bench.io.bounded_input import did_you_mean
    from support import one_line_error

    assert did_you_mean("grop", ["grpo", "mlmt"]) == "; did you mean 'grpo'?"
    assert did_you_mean("zzzz", ["grpo", "mlmt"]) == ""
    assert did_you_mean("gr\x1bpo", ["grpo"]) == ""  # not shown in the message, so not hinted at either
    assert did_you_mean("local_mcq", ["local_mc", "local_mcr", "other"], n=3) == \
        "; did you mean 'local_mc', 'local_mcr'?"
    with pytest.raises(ValueError, match="unknown variant 'ful'; did you mean 'full'\\? \\(known: full, "):
        MLMTParams(variant="ful")
    one_line_error(["list", "algoritm"], "unknown kind 'algoritm'; did you mean 'algorithm'? (known: benchmark, ")


def test_missing_optional_dependency_is_a_user_error():
    r = Registry("backend", "mlmt_bench.rollout.backend:Backend")
    r.register("ghost", "surely_not_installed_pkg_xyz:Engine", "needs a package that is absent")
    with pytest.raises(UserError, match="needs a package that is not installed"):
        r.get("ghost")


def test_descriptions_are_one_line():
    with pytest.raises(ValueError):
        Registry("x", "builtins:object").register("a", object, "two\nlines")
    for reg in registry.REGISTRIES.values():
        for e in reg.entries():
            assert e.description and "\n" not in e.description


def test_an_entry_that_does_not_subclass_the_registrys_base_is_refused_in_one_line():
    """Each registry is typed by its kind's base class: an object that does not subclass it is
    refused at registration, a lazy entry when first imported (and again on every later get)."""
    from mlmt_bench.benchmarks.base import Benchmark

    class Plain:  # a benchmark by its methods' names only
        name = "plain"

        def load(self, split):
            return []

    assert {k: r.base for k, r in registry.REGISTRIES.items()} == {
        "benchmark": "mlmt_bench.benchmarks.base:Benchmark", "verifier": "mlmt_bench.verifiers.base:Verifier",
        "model": "mlmt_bench.models.factory:ModelFactory", "backend": "mlmt_bench.rollout.backend:Backend",
        "algorithm": "mlmt_bench.algorithms.base:Algorithm", "tracker": "mlmt_bench.trackers:Tracker"}
    r: Registry = Registry("benchmark", "mlmt_bench.benchmarks.base:Benchmark")
    with pytest.raises(UserError) as err:
        r.register("plain", Plain, "by name only")
    assert str(err.value) == ("benchmark 'plain' must subclass mlmt_bench.benchmarks.base.Benchmark "
                              "(it is the class Plain)")
    assert "plain" not in r._entries
    r.register("lazy", "decimal:Decimal", "not a benchmark")
    for _ in range(2):
        with pytest.raises(UserError, match=r"^benchmark 'lazy' must subclass mlmt_bench\.benchmarks\.base\.Benchmark "
                                            r"\(it is the class Decimal\)$"):
            r.get("lazy")
        assert r.entry("lazy").is_lazy
    r.register("ok", type("Sub", (Benchmark,), {}), "a subclass")
    assert issubclass(r.get("ok"), Benchmark)


def test_duplicate_registration_refused():
    r = Registry("x", "builtins:object")
    r.register("a", object, "a")
    with pytest.raises(ValueError):
        r.register("a", object, "again")


def test_every_builtin_entry_imports():
    # vllm is optional (GPU extra); everything else must resolve
    for kind, reg in registry.REGISTRIES.items():
        for e in list(reg.entries()):
            if e.name == "vllm":
                continue
            assert reg.get(e.name) is not None, (kind, e.name)


def test_import_is_light():
    code = ("import sys, mlmt_bench, mlmt_bench.registry, mlmt_bench.spec, mlmt_bench.cli; "
            "print([m for m in ('vllm', 'lm_eval', 'optuna', 'torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_validating_a_tiny_spec_builds_no_model():
    """`mlmt-bench validate` of the quickstart (hf backend, tiny models, a shared base) checks every
    field, registry name and backend option without loading transformers, and the hf backend's
    declarations (its options, traits) and the algorithms' parameter models (declared in the
    registry) are read without importing torch: torch took 6-9 s of validate on a busy machine."""
    code = ("import sys; import mlmt_bench.rollout.hf_backend as hf; "
            "assert hf.HFBackend.traits.supports_fsdp and 'torch' not in sys.modules; "
            "from mlmt_bench import spec; "
            f"exp, arms = spec.load_any({str(ROOT / 'registry' / 'runs' / 'quickstart.yaml')!r}); "
            "assert len(arms) == 4 and all(s.backend.name == 'hf' and s.base is not None for s in arms.values()); "
            "print([m for m in ('torch', 'transformers', 'peft') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_declared_parameter_models_are_the_algorithms_own():
    """The registry names each built-in algorithm's parameter model so that validation need not
    import the algorithm; it must be the class's own Params (one definition, two pointers)."""
    from mlmt_bench.algorithms.params import GRPOParams

    names = registry.algorithms.names()
    assert {"grpo", "mlmt", "self_correct", "critique_grpo", "self_distill"} <= set(names)
    for name in names:
        declared = registry.algorithms.declared_params(name)
        if registry.algorithms.entry(name).source == "builtin":
            assert declared is registry.algorithms.get(name).Params, name
        else:
            assert declared is None or declared is registry.algorithms.get(name).Params, name
    reg: registry.Registry = registry.Registry("algorithm", "mlmt_bench.algorithms.base:Algorithm")
    reg.register("x", "mlmt_bench.algorithms.grpo:GRPO", "x", params="mlmt_bench.algorithms.params:GRPOParams")
    reg.register("y", "mlmt_bench.algorithms.grpo:GRPO", "y")
    assert reg.declared_params("x") is GRPOParams and reg.declared_params("y") is None


def test_help_shows_readable_value_names():
    """Every command's --help names what an option takes (FIELD=VALUE, FLOPS, N), not Python types."""
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    shown = {}
    for command in ("validate", "plan", "run", "verify", "base", "report", "eval", "sweep"):
        res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, command
        assert "<list[str]>" not in res.stdout and "range>" not in res.stdout, (command, res.stdout)
        shown[command] = res.stdout
    assert "FIELD=VALUE" in shown["run"] and "NAME=RUN_DIR" in shown["report"]
    assert "FLOPS" in shown["report"] and "[x>=0]" not in shown["report"]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The demo plugin (tests/plugin_pkg) installed with pip into a private target directory."""
    import shutil

    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "plugin_pkg"  # a copy: building writes build/ into it
    shutil.copytree(ROOT / "tests" / "plugin_pkg", source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True)
    return target


def _cli(args, site: Path):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "mlmt_bench.cli", *args], capture_output=True, text=True, env=env)


def test_plugin_components_are_listed(plugin_site):
    res = _cli(["--json", "list"], plugin_site)
    assert res.returncode == 0, res.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(res.stdout)}
    assert rows[("benchmark", "demo-echo")]["source"] == "mlmt-bench-demo-plugin"
    assert rows[("verifier", "demo-exact")]["description"] == "exact string match (plugin demo)"
    assert rows[("algorithm", "demo-refine")]["source"] == rows[("backend", "demo-loop")]["source"] \
        == "mlmt-bench-demo-plugin"
    assert rows[("algorithm", "grpo")]["source"] == "builtin"


def test_plugin_components_are_usable(plugin_site, tmp_path):
    lines = [{"benchmark": "demo-echo", "id": "train/2", "response": "2"},
             {"benchmark": "demo-echo", "id": "train/3", "response": "4"}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = _cli(["--json", "verify", "demo-exact", str(inp), "--out", str(tmp_path / "out.jsonl")], plugin_site)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["correct"] == 1


def _plugin_spec(tmp_path: Path, ckpt: Path) -> Path:
    """A run of the plugin's algorithm on its benchmark (scored by its verifier), generated by its
    backend: 1 evaluation problem, 1 step of 2 problems × 2 attempts, 3 tokens a turn."""
    import yaml

    spec = {"name": "plugin", "output_dir": str(tmp_path / "runs"),
            "benchmark": {"name": "demo-echo", "eval_limit": 1},
            "policies": {"solver": {"model": "tiny", "path": str(ckpt)}},
            "backend": {"name": "demo-loop", "max_new_tokens": 3, "options": {"record": str(tmp_path / "calls.jsonl")}},
            "algorithm": {"name": "demo-refine", "params": {"group_size": 2, "beta": 0.01}},
            "train": {"steps": 1, "problems_per_step": 2, "threads": 1}}
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_plugin_algorithm_verifier_and_backend_run_end_to_end(plugin_site, tmp_path, tiny_ckpt):
    """`mlmt-bench run` of a spec naming only the plugin's components (the tiny model aside): its
    backend generates every turn, its algorithm's credit trains the solver, and the leakage metric
    is its verifier's own check (the oracle spells the answer out: "the answer is two", which the
    built-in rules, looking for "2", would call no leak)."""
    from mlmt_bench.verifiers.leaks import is_leak

    res = _cli(["--json", "run", str(_plugin_spec(tmp_path, tiny_ckpt))], plugin_site)
    assert res.returncode == 0, res.stderr[-2000:]
    final = json.loads(res.stdout)
    run_dir = Path(final["run_dir"])
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    # evaluation (steps 0 and 1): the attempt, the refinement, the refinement after g∅; training: 4 attempts, 4 refines
    assert [c["prompts"] for c in calls] == [1, 1, 1, 4, 4, 1, 1, 1]
    assert final["gen_tokens"] == calls[3]["tokens"] + calls[4]["tokens"] > 0
    train = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(train) == 1 and train[0]["updated"] == ["solver"] and train[0]["demo_refines"] == 4.0
    assert json.loads((run_dir / "manifest.json").read_text())["roles"] == {
        "solver": "trained", "critic": "absent", "feedback": "oracle"}
    assert final["leakage_rate"] == 1.0
    episodes = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    feedbacks = [(t["text"], e["problem_id"].split("/")[1]) for e in episodes for t in e["turns"]
                 if t["kind"] == "feedback"]
    assert feedbacks and all(not is_leak(text, gold, "exact") and not is_leak(text, gold, "math")
                             for text, gold in feedbacks)


def test_a_plugin_algorithms_params_are_validated(plugin_site, tmp_path, tiny_ckpt):
    res = _cli(["validate", str(_plugin_spec(tmp_path, tiny_ckpt)), "--set", "algorithm.params.group_sise=3"],
               plugin_site)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "algorithm.params.group_sise: unknown field; did you mean 'group_size'?" in res.stderr
