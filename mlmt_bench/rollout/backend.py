"""The contract every generation backend meets, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

#: one entry of a memory estimate: (phase, what, bytes); phase "persistent" (held throughout the
#: run) or "generation" (alive while generating), as :mod:`mlmt_bench.plan.memory` adds them up
MemoryItem = tuple[str, str, float]


@dataclass
class Generation:
    """One sampled continuation.

    ids:           generated token ids, including the EOS token when the model stopped by itself.
    logprobs:      log-prob of each generated id under the sampling distribution (after temperature
                   and top-p), len == len(ids). Trainers recompute log-probs under the policy with a
                   forward pass, so these are diagnostics, not the importance-ratio denominator.
    finish_reason: "stop" (EOS or a stop string) or "length" (max_new_tokens reached).
    text:          ids decoded without special tokens.
    """

    ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    text: str


@dataclass(frozen=True)
class BackendTraits:
    """What a backend class can do, read before it is built (``Backend.traits``).

    holds_weights:  it keeps its own copy of the weights (an engine such as vLLM's), reloaded by
                    ``sync_weights`` after every update; False: it generates with the training
                    model object itself.
    supports_fsdp:  it can generate from a model sharded with FSDP (mlmt_bench/fsdp.py gathers the
                    parameters around generation); an engine holding its own copy would need the
                    gathered weights after every update, so a backend says so only when it can.
    gpu_only:       it generates on CUDA GPUs only (vLLM's engine): ``mlmt-bench plan`` refuses to
                    plan it for a CPU instead of pricing an engine that cannot start there.
    keeps_prefixes: its ``generate`` takes ``keep=True``, a hint that later prompts will begin
                    with these prompts and their generations (a rollout's attempts, which its
                    refinements repeat), so it may keep their keys and values for them.

    The defaults are the conservative ones a backend that declares nothing gets.
    """

    holds_weights: bool = True
    supports_fsdp: bool = False
    gpu_only: bool = False
    keeps_prefixes: bool = False


@dataclass(frozen=True)
class GenerationLoad:
    """One model's generation in a planned run, as ``mlmt-bench plan`` hands it to a backend class
    for its memory estimate (:meth:`Backend.generation_memory`).

    role:         the policy's role (labels only).
    shape:        its architecture (:class:`mlmt_bench.models.configs.ModelShape`: ``layers``,
                  ``hidden``, ``intermediate``, ``kv_dim``, ``vocab``).
    dtype_bytes:  bytes per element of its weights and activations.
    sequences:    the most sequences one generate call is given.
    length:       the longest prompt + generated tokens of a sequence.
    prompt:       the longest prompt, tokens.
    device_memory: bytes of one device (None: not known, e.g. a CPU).
    gpu:          whether the device is a GPU.
    adapted:      parameters of the base weights its LoRA adapter wraps (0: no adapter).
    """

    role: str
    shape: Any
    dtype_bytes: int
    sequences: float
    length: float
    prompt: float
    device_memory: float | None
    gpu: bool
    adapted: int = 0

    @property
    def kv_bytes(self) -> int:
        """K and V of every layer, per row and cache slot."""
        return 2 * self.shape.layers * self.shape.kv_dim * self.dtype_bytes


def forward_memory(load: GenerationLoad, rows: float) -> list[MemoryItem]:
    """What a transformers-style forward over ``rows`` sequences keeps while generating: the
    prefill activations of the longest prompt and the float32 sampling logits."""
    s = load.shape
    return [("generation", f"prefill activations ({load.role})",
             rows * load.prompt * (2 * s.intermediate + 4 * s.hidden) * load.dtype_bytes),
            ("generation", f"sampling logits ({load.role})", rows * s.vocab * 4 * 4)]


class Backend:
    """A generation engine (``hf``, ``vllm``, a plugin's), built from the spec's ``backend.options``.

    Every backend class subclasses this one; a plugin that declares nothing more gets the
    conservative defaults below. Construction rejects an unknown option with a one-line
    ``UserError`` naming the known ones. ``generate`` samples a continuation of each tokenised
    prompt (token-in/token-out: prompts are ids, nothing is re-tokenised) with the model's current
    weights; ``sync_weights`` is called after every optimiser step of ``model`` (an engine holding
    its own copy reloads it); ``close`` releases engines and files at the end of a run (the runner
    always calls it).

    What the class declares, read without building it (``backend_class(name)``):

    - ``traits``: a :class:`BackendTraits` (FSDP is refused unless ``supports_fsdp``);
    - ``check_values(**options)``: one-line errors for option values it cannot use (``validate``);
    - ``throughput_key(options)``: the row of ``mlmt_bench/data/throughput.yaml``'s ``gen`` figures
      that times its generation (default ``hf-generate``, the slowest measured engine);
    - ``generation_memory(load, options)``: its memory per generating model for ``mlmt-bench plan``
      (default: a dynamic KV cache for every sequence at once, plus :func:`forward_memory`).

    Option defaults are the constructor's own (:func:`option_defaults`), never copied elsewhere.
    """

    name: ClassVar[str] = ""
    traits: ClassVar[BackendTraits] = BackendTraits()

    @staticmethod
    def check_values(**options: Any) -> None:
        """Nothing checked beyond the options' names (:func:`reject_unknown_options`)."""

    @classmethod
    def throughput_key(cls, options: dict[str, Any]) -> str:
        return "hf-generate"

    @classmethod
    def generation_memory(cls, load: GenerationLoad, options: dict[str, Any]) -> list[MemoryItem]:
        rows = load.sequences
        return [("generation", f"KV cache of generate ({load.role})", rows * load.length * load.kv_bytes),
                *forward_memory(load, rows)]

    def generate(self, model: Any, tokenizer: Any, prompts: list[list[int]], *, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None) -> list[Generation]:
        raise NotImplementedError

    def sync_weights(self, model: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def backend_class(name: str) -> type[Backend]:
    """The declarations of the backend registered as ``name`` (imports its module, which for
    ``vllm`` does not import vLLM)."""
    from mlmt_bench import registry

    return registry.backends.get(name)  # a Backend subclass (the registry checks)


def known_options(backend_cls: type[Backend]) -> list[str]:
    """The ``backend.options`` a backend class takes: its constructor's named parameters."""
    import inspect

    params = inspect.signature(backend_cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def option_defaults(backend_cls: type[Backend]) -> dict[str, Any]:
    """The default of each ``backend.options`` entry a backend class takes (its constructor's)."""
    import inspect

    params = inspect.signature(backend_cls.__init__).parameters
    return {n: params[n].default for n in known_options(backend_cls) if params[n].default is not params[n].empty}


def with_defaults(backend_cls: type[Backend], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` over the backend class's defaults: the values an instance would use."""
    return {**option_defaults(backend_cls), **options}


def reject_unknown_options(backend_cls: type[Backend], name: str, options: dict[str, Any]) -> None:
    """A one-line error naming ``options`` the backend does not take (a typo is never ignored)."""
    from mlmt_bench.errors import UserError

    known = known_options(backend_cls)
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise UserError(f"backend.options: unknown option(s) for {name}: {', '.join(unknown)} "
                        f"(known: {', '.join(known)})")
