"""Declared contracts: backends and model factories say what they can do, and nothing outside them
recognises them by name (a plugin's gets the same treatment as a built-in one)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import minimal_spec
from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.fsdp import Sharding
from mlmt_bench.models.factory import ModelFactory, model_factory
from mlmt_bench.rollout.backend import Backend, BackendTraits, GenerationLoad, backend_class
from mlmt_bench.spec import validate_run


@contextmanager
def registered(reg: registry.Registry[Any], name: str, target: Any) -> Iterator[None]:
    """``target`` registered as ``name`` in ``reg`` for the duration (removed afterwards)."""
    reg.register(name, target, "a plugin's (test)", source="test-plugin", overwrite=True)
    try:
        yield
    finally:
        reg._entries.pop(name, None)


class NoFSDPBackend(Backend):
    """A plugin backend that declares nothing."""

    name = "plugin-plain"


class FSDPBackend(Backend):
    """A plugin backend that generates with the training model, so it declares FSDP support."""

    name = "plugin-fsdp"
    traits = BackendTraits(holds_weights=False, supports_fsdp=True)


class BareBackend:
    """Written against the bare protocol: not a Backend subclass (the registry refuses it)."""

    name = "plugin-bare"

    def generate(self, *a: Any, **k: Any) -> list[Any]:
        return []


class PlanningBackend(Backend):
    """A plugin backend with its own throughput key and memory estimate."""

    name = "plugin-engine"

    def __init__(self, reserve_gb: float = 7.0) -> None:
        self.reserve_gb = reserve_gb

    @classmethod
    def throughput_key(cls, options: dict[str, Any]) -> str:
        return "plugin-engine"

    @classmethod
    def generation_memory(cls, load: GenerationLoad, options: dict[str, Any]) -> list[tuple[str, str, float]]:
        gb = float(options.get("reserve_gb", 7.0))
        return [("persistent", f"plugin engine ({load.role})", gb * 1e9)]


# ----------------------------------------------------------------------------------------------
# backends: FSDP


@pytest.fixture
def fsdp_env(monkeypatch):
    """`accelerate launch` with the FSDP config, two processes (nothing is sharded here)."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("FSDP_VERSION", "2")
    return SimpleNamespace(enabled=True)  # a Dist whose processes are up


def test_a_plugin_backend_that_declares_no_fsdp_is_refused_in_one_line(fsdp_env):
    cls = NoFSDPBackend
    with registered(registry.backends, cls.name, cls):
        with pytest.raises(UserError) as err:
            Sharding(fsdp_env, cls.name, backend_class(cls.name).traits)
    msg = str(err.value)
    assert "\n" not in msg and repr(cls.name) in msg and "FSDP" in msg


def test_a_backend_that_does_not_subclass_backend_is_refused_in_one_line():
    with pytest.raises(UserError) as err:
        registry.backends.register(BareBackend.name, BareBackend, "a plugin's (test)", source="test-plugin")
    assert str(err.value) == ("backend 'plugin-bare' must subclass mlmt_bench.rollout.backend.Backend "
                              "(it is the class BareBackend)")
    assert BareBackend.name not in registry.backends


def test_a_plugin_backend_that_declares_fsdp_is_accepted(fsdp_env):
    with registered(registry.backends, FSDPBackend.name, FSDPBackend):
        sharding = Sharding(fsdp_env, FSDPBackend.name, backend_class(FSDPBackend.name).traits)
    assert sharding.enabled


def test_builtin_backends_declare_their_traits_and_defaults_are_conservative():
    assert backend_class("hf").traits == BackendTraits(holds_weights=False, supports_fsdp=True, keeps_prefixes=True)
    assert backend_class("vllm").traits == BackendTraits(holds_weights=True, supports_fsdp=False, gpu_only=True)
    assert BackendTraits() == NoFSDPBackend.traits == BackendTraits(holds_weights=True, supports_fsdp=False)


def test_asking_traits_imports_neither_vllm_nor_torch():
    code = ("import sys; from mlmt_bench.rollout.backend import backend_class; "
            "from mlmt_bench.models.factory import model_factory; "
            "t = backend_class('vllm').traits; m = model_factory('tiny'); "
            "print(t.supports_fsdp, [x for x in ('vllm', 'torch', 'transformers') if x in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False []"


# ----------------------------------------------------------------------------------------------
# model factories


class BaseStartingFactory(ModelFactory):
    """A plugin model that, without a path, starts from the shared base (as tiny does)."""

    def starts_from_base(self, spec: Any) -> bool:
        return not spec.path

    def shape(self, role: str, spec: Any, base: dict[str, Any] | None) -> Any:
        from mlmt_bench.models.configs import shape_of_preset

        return shape_of_preset("tiny-0.5m")


def _algorithm(spec: Any) -> Any:
    cls = registry.algorithms.get(spec.algorithm.name)
    return cls(cls.Params.model_validate(spec.algorithm.params), spec.train.steps)


def test_a_plugin_factory_that_starts_from_the_base_needs_it_whatever_its_name():
    from mlmt_bench.runner import needs_base

    name = "plugin-from-base"
    with registered(registry.models, name, BaseStartingFactory(lambda *a: None)):
        spec = validate_run(minimal_spec(policies={"solver": {"model": name}}), "t")
        assert needs_base(spec, _algorithm(spec))
        with_path = validate_run(minimal_spec(policies={"solver": {"model": name, "path": "CKPT"}}), "t")
        assert not needs_base(with_path, _algorithm(with_path))


def test_a_plain_factory_declares_nothing_and_a_plain_function_is_refused():
    def build(role, spec, base_dir=None, device=None):
        return ("built", role, base_dir)

    name = "plugin-function"
    with pytest.raises(UserError, match=r"^model 'plugin-function' must be an instance of "
                                        r"mlmt_bench\.models\.factory\.ModelFactory \(it is a function\)$"):
        registry.models.register(name, build, "a plugin's (test)", source="test-plugin")
    with registered(registry.models, name, ModelFactory(build)):
        from mlmt_bench.runner import needs_base

        spec = validate_run(minimal_spec(policies={"solver": {"model": name}}), "t")
        assert not needs_base(spec, _algorithm(spec))
        factory = model_factory(name)
        assert factory("solver", spec.policies.solver) == ("built", "solver", None)
        assert factory.offline_tokenizer(spec.policies.solver) is None
        assert factory.real_benchmark_note("gsm8k") == ""
        with pytest.raises(UserError, match="needs a hub name or directory"):
            factory.shape("solver", spec.policies.solver, None)


def test_builtin_factories_declare_the_shared_base():
    spec = validate_run(minimal_spec(policies={"solver": {"model": "tiny"}}), "t")
    tiny, hf = model_factory("tiny"), model_factory("hf")
    assert tiny.starts_from_base(spec.policies.solver) and not hf.starts_from_base(spec.policies.solver)
    assert not tiny.starts_from_base(spec.policies.solver.model_copy(update={"path": "CKPT"}))
    assert "smoke test" in tiny.real_benchmark_note("gsm8k") and hf.real_benchmark_note("gsm8k") == ""


# ----------------------------------------------------------------------------------------------
# plan asks the backend and the model factory


def test_plan_asks_the_backend_for_its_throughput_key_and_memory(tiny_ckpt):
    from mlmt_bench.plan import load_table, plan_run, resolve_device
    from mlmt_bench.plan.throughput import backend_key

    with registered(registry.backends, PlanningBackend.name, PlanningBackend):
        d = minimal_spec(backend={"name": PlanningBackend.name, "options": {"reserve_gb": 3.5}})
        d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
        spec = validate_run(d, "t")
        assert backend_key(spec) == "plugin-engine"
        table = load_table()
        plan = plan_run(spec, resolve_device("h200", table), 1, table)
    persistent = plan["memory"]["items"]["persistent"]
    assert persistent["plugin engine (solver)"] == 3.5e9
    assert not plan["memory"]["items"]["generation"]  # the backend said it keeps nothing else
    assert "no plugin-engine figure" in plan["time"]["basis"]["solver"]["backend"]


def test_a_backend_that_declares_nothing_is_planned_conservatively():
    shape = SimpleNamespace(layers=2, kv_dim=8, hidden=16, intermediate=32, vocab=100)
    load = GenerationLoad("solver", shape, 2, sequences=300, length=50.0, prompt=20.0, device_memory=None, gpu=False)
    items = dict((what, b) for _, what, b in Backend.generation_memory(load, {}))
    hf = dict((what, b) for _, what, b in backend_class("hf").generation_memory(load, {}))
    # every sequence at once (no batch size known) versus hf's 256 rows per forward
    assert items["KV cache of generate (solver)"] == 300 * 50.0 * (2 * 2 * 8 * 2)
    assert hf["KV cache of generate (solver)"] == 256 * 50.0 * (2 * 2 * 8 * 2)
    assert Backend.throughput_key({}) == "hf-generate" and backend_class("vllm").throughput_key({}) == "vllm"
    assert backend_class("hf").throughput_key({"decode": "static"}) == "hf-static"
    assert backend_class("vllm").generation_memory(load, {}) == []  # no device memory known: nothing to reserve


def test_plan_sizes_a_plugin_model_from_its_factory():
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    name = "plugin-from-base"
    with registered(registry.models, name, BaseStartingFactory(lambda *a: None)):
        spec = validate_run(minimal_spec(policies={"solver": {"model": name}}), "t")
        table = load_table()
        plan = plan_run(spec, resolve_device("cpu", table), 1, table)
    from mlmt_bench.models.configs import shape_of_preset

    assert plan["policies"][0]["params"] == shape_of_preset("tiny-0.5m").params


# ---------------------------------------------------------------------------------------------
# verifiers declare their leak check; benchmarks declare their oracle


def _leakage_with(verifier, tiny_ckpt, tmp_path) -> float:
    from mlmt_bench import runner
    from mlmt_bench.evaluate import evaluate
    from mlmt_bench.rollout.episodes import Actors, Program, Sampling
    from support import ScriptedBackend

    spec = validate_run(minimal_spec(output_dir=str(tmp_path), policies={
        "solver": {"model": "tiny", "path": str(tiny_ckpt)}, "critic": {"model": "tiny", "path": str(tiny_ckpt)}},
        algorithm={"name": "mlmt", "params": {"group_size": 2}}), "t")
    comp = runner.build(spec, progress=False)
    problem = comp.eval_problems[0]
    feedback = f"the answer is SECRET-{problem.answer}"
    backend = ScriptedBackend(["1+1=2;#2", feedback, "#2", "#2"])
    actors = Actors(comp.policies["solver"], comp.policies["critic"], backend, comp.templates, verifier)
    res = evaluate(Program(1, "critic", 1, 1), actors, [problem], Sampling(0.0, 1.0, 8, 40),
                   feedback_metrics=True, n_samples=0, protocols=("refine_all",))
    return res.metrics["leakage_rate"]


def test_evaluate_asks_the_verifier_whether_a_feedback_leaks(tiny_ckpt, tmp_path):
    """A plugin verifier's own leak check decides leakage_rate, whatever its name: the same
    feedback leaks for a verifier that says so and not for one that says it never leaks."""
    from mlmt_bench.verifiers.synthetic import SyntheticVerifier

    class SaysLeak(SyntheticVerifier):
        name = "plugin-says-leak"

        def leaks(self, feedback, gold):
            return "SECRET-" in feedback

    class NeverLeaks(SaysLeak):
        name = "plugin-never"

        def leaks(self, feedback, gold):
            return False

    assert _leakage_with(SaysLeak(), tiny_ckpt, tmp_path) == 1.0
    assert _leakage_with(NeverLeaks(), tiny_ckpt, tmp_path) == 0.0


def test_builtin_verifiers_declare_the_leak_rule_of_their_answers():
    from mlmt_bench.verifiers.io import build_verifier

    rules = {name: build_verifier(name).leak_kind for name in ("math", "choice", "code", "synthetic")}
    assert rules == {"math": "math", "choice": "choice", "code": "code", "synthetic": "exact"}
    assert build_verifier("math").leaks("so the result is 12", "12") is True
    assert build_verifier("math").leaks("so the result is 123", "12") is False


def test_an_oracle_is_declared_by_subclassing_not_by_method_names(tmp_path):
    """A benchmark with methods named like the oracle's but not declared an OracleBenchmark has
    no oracle: oracle feedback is refused for it, and the shared base will not train on it."""
    from mlmt_bench import runner
    from mlmt_bench.benchmarks.base import Benchmark, OracleBenchmark
    from mlmt_bench.benchmarks.synthetic import SyntheticArith
    from mlmt_bench.warmstart.shared_base import synthetic_benchmark

    class LooksLikeOne(Benchmark):
        name = "plugin-looks-like-oracle"
        default_verifier = "synthetic"
        solution = oracle_feedback = inject_errors = apply_feedback = SyntheticArith.solution

        def load(self, split):
            return SyntheticArith().load(split)

    assert issubclass(SyntheticArith, OracleBenchmark) and not issubclass(LooksLikeOne, OracleBenchmark)
    with registered(registry.benchmarks, LooksLikeOne.name, LooksLikeOne):
        with pytest.raises(UserError, match="not an OracleBenchmark"):
            synthetic_benchmark(LooksLikeOne.name, {})
        spec = validate_run(minimal_spec(output_dir=str(tmp_path), benchmark={"name": LooksLikeOne.name},
                                         algorithm={"name": "mlmt", "params": {"variant": "oracle_feedback"}}), "t")
        with pytest.raises(UserError, match="oracle feedback needs a benchmark with an oracle critic"):
            runner.build(spec, progress=False)


# ----------------------------------------------------------------------------------------------
# algorithms: the parameters are the class's Params, declared once


def test_an_algorithms_params_are_its_class_params_and_nothing_else_is_accepted():
    from mlmt_bench.algorithms.base import Algorithm
    from mlmt_bench.algorithms.params import LossParams
    from mlmt_bench.spec import algorithm_params_model

    for name in registry.algorithms.names():
        assert algorithm_params_model(name) is registry.algorithms.get(name).Params
    assert algorithm_params_model("grpo").model_fields["group_size"].default == 8

    class Bare(Algorithm):  # declares no parameters of its own: the shared loss's
        pass

    class NotAnAlgorithm:
        Params = LossParams

    class OwnParams(Algorithm):
        Params = dict  # type: ignore[assignment]  # not a LossParams

    with registered(registry.algorithms, "plugin-bare-algo", Bare):
        spec = validate_run(minimal_spec(algorithm={"name": "plugin-bare-algo", "params": {"clip_high": 0.28}}), "t")
        assert spec.algorithm.params["clip_high"] == 0.28 and algorithm_params_model("plugin-bare-algo") is LossParams
    with pytest.raises(UserError, match="algorithm 'plugin-not-algo' must subclass mlmt_bench.algorithms.base"):
        registry.algorithms.register("plugin-not-algo", NotAnAlgorithm, "a plugin's (test)", source="test-plugin")
    with registered(registry.algorithms, "plugin-own-params", OwnParams):
        with pytest.raises(UserError, match="algorithm 'plugin-own-params': its Params must subclass "
                                            "mlmt_bench.algorithms.params.LossParams"):
            validate_run(minimal_spec(algorithm={"name": "plugin-own-params"}), "t")
