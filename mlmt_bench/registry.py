"""Named, lazily imported components.

One :class:`Registry` per component kind (benchmark, verifier, model, backend, algorithm).
An entry is either an object or a ``"module:attribute"`` string that is imported on first
use, so choosing ``backend: vllm`` imports vLLM and nothing else does.

Third-party packages add entries through the entry-point group ``mlmt_bench.plugins``:
each entry point names a callable ``register(registries: dict[str, Registry]) -> None``.
Plugins are loaded the first time a name is missing or a listing is asked for.

Each registry is typed by its kind's base class (``Registry[type[Benchmark]]``, ...), as lm-eval's
are: an entry must subclass it (a model factory: be an instance of it), checked when the entry is
first imported, so what a component can do is read from the base's declared attributes and
methods, never probed with ``getattr``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from mlmt_bench.errors import UserError

if TYPE_CHECKING:
    from mlmt_bench.algorithms.base import Algorithm
    from mlmt_bench.benchmarks.base import Benchmark
    from mlmt_bench.models.factory import ModelFactory
    from mlmt_bench.rollout.backend import Backend
    from mlmt_bench.trackers import Tracker
    from mlmt_bench.verifiers.base import Verifier

T = TypeVar("T")

PLUGIN_GROUP = "mlmt_bench.plugins"
_PARAMS = "mlmt_bench.algorithms.params"  # the built-in algorithms' parameter models


@dataclass
class Entry:
    name: str
    target: Any  # the object, or "module:attribute"
    description: str
    source: str = "builtin"  # "builtin" or the plugin's distribution name
    # "module:attribute" of the component's parameters model when it can be read without
    # importing the component (an algorithm's Params, in a module free of torch: `validate`
    # checks a spec without loading torch); None: the component's own ``Params``.
    params: str | None = None

    @property
    def is_lazy(self) -> bool:
        return isinstance(self.target, str)


class UnknownComponentError(UserError):
    pass


class Registry(Generic[T]):
    """name -> component, with lazy imports and did-you-mean errors.

    ``base``: ``"module:Class"``, the class every entry subclasses (``instances``: is an instance
    of), checked at registration for an object and on first import for a ``"module:attribute"``
    entry; anything else is a one-line :class:`UserError`.
    """

    def __init__(self, kind: str, base: str, *, instances: bool = False) -> None:
        self.kind = kind
        self.base = base
        self.instances = instances
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target: Any, description: str, *, source: str = "builtin",
                 overwrite: bool = False, params: str | None = None) -> None:
        if not description or "\n" in description:
            raise ValueError(f"{self.kind} {name!r}: description must be one non-empty line")
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if not isinstance(target, str):
            self._check(name, target)
        self._entries[name] = Entry(name, target, description, source, params)

    def _check(self, name: str, target: Any) -> None:
        """A one-line UserError unless ``target`` subclasses (is an instance of) the base."""
        module_name, _, attr = self.base.partition(":")
        # looked up, not imported: a subclass or instance has imported the base's module already
        # (so refusing one never imports torch, which the algorithms' base needs)
        base = getattr(sys.modules.get(module_name), attr, None)
        if base is not None and (isinstance(target, base) if self.instances
                                 else isinstance(target, type) and issubclass(target, base)):
            return
        what = "be an instance of" if self.instances else "subclass"
        shown = target.__name__ if isinstance(target, type) else type(target).__name__
        raise UserError(f"{self.kind} {name!r} must {what} {module_name}.{attr} "
                        f"({'it is the class' if isinstance(target, type) else 'it is a'} {shown})")

    def __contains__(self, name: str) -> bool:
        if name in self._entries:
            return True
        load_plugins()
        return name in self._entries

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry]:
        load_plugins()
        for name in sorted(self._entries):
            yield self._entries[name]

    def entry(self, name: str) -> Entry:
        if name not in self:
            raise UnknownComponentError(self.unknown_message(name))
        return self._entries[name]

    def get(self, name: str) -> T:
        """The component registered as ``name``, importing it if lazy."""
        entry = self.entry(name)
        if entry.is_lazy:
            module_name, _, attr = entry.target.partition(":")
            try:
                module = importlib.import_module(module_name)
                target = getattr(module, attr) if attr else module
            except ImportError as exc:
                raise UserError(
                    f"{self.kind} {name!r} needs a package that is not installed "
                    f"({exc.name or exc}); see the README for the extra that provides it"
                ) from exc
            self._check(name, target)
            entry.target = target
        return cast(T, entry.target)  # checked against the base (:meth:`_check`)

    def declared_params(self, name: str) -> Any | None:
        """The parameters model the entry ``name`` declares (imported from its ``params`` pointer,
        not from the component), or None when it declares none."""
        entry = self.entry(name)
        if entry.params is None:
            return None
        module_name, _, attr = entry.params.partition(":")
        return getattr(importlib.import_module(module_name), attr)

    def unknown_message(self, name: str) -> str:
        return unknown_message(self.kind, name, self.names())


def unknown_message(kind: str, name: Any, known: list[str]) -> str:
    """``unknown <kind> 'grop'; did you mean 'grpo'? (known: ...)``: the message for a name not in
    ``known`` (components here; also e.g. a report's arms), the name shown only if plain."""
    from mlmt_bench.io.bounded_input import did_you_mean, echo

    name = str(name)  # the user's (maybe a file's): shown only if plain, and only then worth a hint
    return f"unknown {kind} {echo(name)}{did_you_mean(name, known)} (known: {', '.join(known)})"


benchmarks: Registry[type[Benchmark]] = Registry("benchmark", "mlmt_bench.benchmarks.base:Benchmark")
verifiers: Registry[type[Verifier]] = Registry("verifier", "mlmt_bench.verifiers.base:Verifier")
models: Registry[ModelFactory] = Registry("model", "mlmt_bench.models.factory:ModelFactory", instances=True)
backends: Registry[type[Backend]] = Registry("backend", "mlmt_bench.rollout.backend:Backend")
algorithms: Registry[type[Algorithm]] = Registry("algorithm", "mlmt_bench.algorithms.base:Algorithm")
trackers: Registry[type[Tracker]] = Registry("tracker", "mlmt_bench.trackers:Tracker")  # tracking.report_to

REGISTRIES: dict[str, Registry[Any]] = {
    "benchmark": benchmarks,
    "verifier": verifiers,
    "model": models,
    "backend": backends,
    "algorithm": algorithms,
    "tracker": trackers,
}

_plugins_loaded = False


def load_plugins() -> None:
    """Call every ``mlmt_bench.plugins`` entry point once (idempotent)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        # a broken plugin is one line, never a traceback; SystemExit too (a plugin calling
        # sys.exit(0) at import made `list` exit 0 with no output)
        try:
            register = ep.load()
        except (Exception, SystemExit) as exc:
            raise UserError(f"plugin {ep.name!r} ({ep.value}) failed to load: {_why(exc)}") from None
        if not callable(register):
            raise UserError(f"plugin {ep.name!r} ({ep.value}): its entry point is a {type(register).__name__}, not "
                            "a register(registries) function")
        source = ep.dist.name if ep.dist is not None else ep.name
        _PluginView.current_source = source
        try:
            register({k: _PluginView(r, source) for k, r in REGISTRIES.items()})
        except (Exception, SystemExit) as exc:  # e.g. re-registering a built-in name (ValueError)
            raise UserError(f"plugin {ep.name!r} ({ep.value}): register() failed: {_why(exc)}") from None
        finally:
            _PluginView.current_source = "builtin"


def _why(exc: BaseException) -> str:
    """An exception as a few words: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class _PluginView:
    """What a plugin's ``register`` sees: ``registries["benchmark"].register(name, target, desc)``."""

    current_source = "builtin"

    def __init__(self, registry: Registry[Any], source: str) -> None:
        self._registry = registry
        self._source = source

    def register(self, name: str, target: Any, description: str) -> None:
        self._registry.register(name, target, description, source=self._source)


def _builtin() -> None:
    # Benchmarks (mlmt_bench/benchmarks/). Synthetic ones take a `difficulty` option.
    b = benchmarks.register
    b("math500", "mlmt_bench.benchmarks.math500:Math500", "MATH-500 competition maths (500 test problems)")
    b("gsm8k", "mlmt_bench.benchmarks.gsm8k:GSM8K", "GSM8K grade-school maths word problems (test split)")
    b("mbpp", "mlmt_bench.benchmarks.mbpp:MBPP", "MBPP full (974 tasks; prompt/train/validation/test by task id)")
    b("mbpp-sanitized", "mlmt_bench.benchmarks.mbpp:MBPPSanitized", "MBPP sanitized (427 hand-checked tasks)")
    b("gpqa-diamond", "mlmt_bench.benchmarks.gpqa:GPQADiamond", "GPQA diamond: 198 graduate science multiple-choice")
    b("gpqa-main", "mlmt_bench.benchmarks.gpqa:GPQAMain", "GPQA main: 448 graduate science multiple-choice")
    b("gpqa-extended", "mlmt_bench.benchmarks.gpqa:GPQAExtended", "GPQA extended: 546 graduate science multiple-choice")
    b("synthetic-arith", "mlmt_bench.benchmarks.synthetic:SyntheticArith",
      "multi-step integer arithmetic with written steps and a rule-based oracle critic")
    b("nl-arith", "mlmt_bench.benchmarks.nl_arith:NLArith",
      "arithmetic and word problems in natural language with difficulty knobs and an answer-free oracle critic")
    # Verifiers (mlmt_bench/verifiers/).
    v = verifiers.register
    v("math", "mlmt_bench.verifiers.math:MathVerifier", "final-answer extraction + math-verify equivalence")
    v("code", "mlmt_bench.verifiers.code:CodeVerifier", "runs code against tests in a resource-limited sandbox")
    v("choice", "mlmt_bench.verifiers.choice:ChoiceVerifier", "multiple-choice letter extraction")
    v("synthetic", "mlmt_bench.verifiers.synthetic:SyntheticVerifier", "exact integer answer of a synthetic problem")
    v("stated-answer", "mlmt_bench.verifiers.stated_answer:StatedAnswerVerifier",
      "exact integer of the last answer statement ('Answer: N', 'the answer is N'), no last-number fallback")
    # Policies (mlmt_bench/models/): ModelFactory objects (models/factory.py: what each needs).
    m = models.register
    m("hf", "mlmt_bench.models.factory:hf", "any HF causal LM from a hub name, a local directory or a shipped alias "
      "(smollm2-135m-instruct: mlmt_bench/models/pretrained.py)")
    m("tiny", "mlmt_bench.models.factory:tiny", "tiny Llama-architecture LM built from a preset config")
    # Generation backends (mlmt_bench/rollout/).
    k = backends.register
    k("hf", "mlmt_bench.rollout.hf_backend:HFBackend",
      "transformers generate, or a static KV cache + CUDA graphs (options.decode: static)")
    k("vllm", "mlmt_bench.rollout.vllm_backend:VLLMBackend", "vLLM offline engine (GPU only; pip install .[gpu])")
    # Algorithms (mlmt_bench/algorithms/).
    a = algorithms.register
    # params=: the class's Params, named so that `validate` reads it without importing torch
    # (tests/test_contracts.py checks that each is the class's own Params).
    a("grpo", "mlmt_bench.algorithms.grpo:GRPO", "GRPO: one turn, group-relative advantages",
      params=f"{_PARAMS}:GRPOParams")
    a("self_correct", "mlmt_bench.algorithms.self_correct:SelfCorrect",
      "single-level multi-turn self-correction (SCoRe-style two stages)", params=f"{_PARAMS}:SelfCorrectParams")
    a("mlmt", "mlmt_bench.algorithms.mlmt:MLMT", "MLMT-RL: bi-level feedback writer + refining solver",
      params=f"{_PARAMS}:MLMTParams")
    a("critique_grpo", "mlmt_bench.algorithms.critique_grpo:CritiqueGRPO",
      "Critique-GRPO: refinements after fixed feedback join the group as shaped off-policy responses",
      params=f"{_PARAMS}:CritiqueGRPOParams")
    a("self_distill", "mlmt_bench.algorithms.self_distill:SelfDistill",
      "GRPO + δ · distillation of the feedback-conditioned solver into the unconditioned one (sft or kl)",
      params=f"{_PARAMS}:SelfDistillParams")
    # Experiment trackers (mlmt_bench/trackers/): tracking.report_to; pip install 'mlmt-bench[trackers]'.
    t = trackers.register
    t("tensorboard", "mlmt_bench.trackers.tensorboard:TensorBoardTracker",
      "TensorBoard event files (torch SummaryWriter) per axis: step, tokens, FLOPs")
    t("mlflow", "mlmt_bench.trackers.mlflow:MLflowTracker",
      "MLflow runs with the spec as params; local SQLite store by default, any tracking URI")
    t("wandb", "mlmt_bench.trackers.wandb:WandbTracker", "Weights & Biases runs, offline unless configured")


_builtin()
