"""Generation with vLLM's offline engine (``vllm.LLM``), colocated with training on the same GPU.

Same interface as :class:`mlmt_bench.rollout.hf_backend.HFBackend`: token ids in, token ids out
(:class:`~mlmt_bench.rollout.backend.Generation`), nothing re-tokenised.

Engines. One ``vllm.LLM`` per distinct policy model object (solver and critic may be two models;
a shared policy is one object, hence one engine). An engine is started on the first ``generate``
for its model, from a temporary HF directory holding the model's *current* weights (LoRA merged
into the base weights, base-model parameter names) and its tokenizer.

Roles on one base (``policies.share_base``: each role a LoRA adapter, a
:class:`~mlmt_bench.models.adapters.AdapterView`): one engine for the base, started from the
base's own weights (adapters off) with LoRA enabled (``max_loras``: the base's adapters,
``max_lora_rank``: vLLM's smallest rank at least theirs); each ``generate`` call is sent with its
adapter's ``LoRARequest``, saved as a peft adapter directory on first use. ``sync_weights`` of an
adapter retires its request: the next call saves the current adapter under a new LoRA id (vLLM
caches adapters by id), so the engine's base weights are never reloaded.

Weight sync. ``sync_weights(model)`` pushes the model's current (merged) weights into its engine
in place, without a restart, by the first path that works in the installed vLLM:

1. ``inprocess``: the engine runs in this process (vLLM V0, or V1 with
   ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which this backend sets by default, or the
   ``external_launcher`` executor under ``accelerate launch``): the vLLM model object is reached
   through ``llm.llm_engine[.engine_core.engine_core].model_executor.driver_worker[.worker]
   .model_runner`` and its ``load_weights`` is called with a generator of (name, tensor) pairs.
2. ``rpc``: ``llm.collective_rpc(fn, args=(weights,))``, ``fn`` running ``load_weights`` on
   every worker (the V1 multiprocess engine; the weights are pickled to the engine process as
   CPU tensors, which needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which this backend sets
   when the engine core runs in another process).
3. ``restart``: shut the engine down and start a new one from a freshly saved directory.

After an in-place load the prefix cache is reset (its KV blocks were computed with the old
weights). The path used is logged (at INFO the first time and whenever it changes) and kept in
``last_sync_path``.

Options (``backend.options`` of a run spec): ``gpu_memory_utilization`` (0.3: the fraction of
the GPU *each* engine may take, so training fits beside it), ``dtype`` (default: the training
model's dtype), ``enforce_eager``, ``max_model_len``, ``enable_prefix_caching`` (True),
``seed`` (engine sampling seed; the process rank is added under ``accelerate launch``),
``lora_mode`` ("merged", the only mode), ``inprocess`` (True), ``work_dir`` (where the
temporary model directories go), ``engine_kwargs`` (anything else for ``vllm.LLM``).

Importing this module does not import vllm (or torch); vLLM is imported on first use.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlmt_bench.errors import UserError
from mlmt_bench.models.adapters import AdapterView
from mlmt_bench.models.lora_weights import is_peft, lora_layers, merged_weight, uses_dora
from mlmt_bench.rollout.backend import (
    Backend,
    BackendTraits,
    Generation,
    GenerationLoad,
    MemoryItem,
    reject_unknown_options,
    with_defaults,
)

log = logging.getLogger(__name__)

MISSING_VLLM = "backend vllm needs the gpu extra: pip install 'mlmt-bench[gpu]' (and a CUDA GPU)"

#: state-dict path components that belong to a peft adapter, not to the base model
_ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector",
                  "original_module")


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise UserError(MISSING_VLLM) from None
    return vllm


@dataclass
class _Engine:
    llm: Any
    directory: Path
    model: Any  # keeps the policy model alive so its id() stays unique while the engine exists
    tokenizer: Any


class VLLMBackend(Backend):
    """``generate(model, tokenizer, prompts, ...)`` on a vLLM engine per model; see the module doc.

    Traits: each engine holds its own copy of the weights (reloaded by ``sync_weights``), so FSDP
    is refused; in memory an engine takes ``gpu_memory_utilization`` of the device, its KV cache
    and activations included.
    """

    name = "vllm"
    traits = BackendTraits(holds_weights=True, supports_fsdp=False, gpu_only=True)

    @classmethod
    def throughput_key(cls, options: dict[str, Any]) -> str:
        return "vllm"

    @classmethod
    def generation_memory(cls, load: GenerationLoad, options: dict[str, Any]) -> list[MemoryItem]:
        """One engine per generating model, held throughout: its fraction of the device (nothing
        when the device's memory is not known)."""
        if load.device_memory is None:
            return []
        util = float(with_defaults(cls, options)["gpu_memory_utilization"])
        return [("persistent", f"vLLM engine ({load.role}: {util:g} x device memory)", util * load.device_memory)]

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        dtype: str | None = None,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int | None = None,
        lora_mode: str = "merged",
        inprocess: bool = True,
        work_dir: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        reject_unknown_options(VLLMBackend, "vllm", unknown)
        if lora_mode != "merged":
            raise UserError(f"backend.options.lora_mode: only 'merged' is supported, got {lora_mode!r}")
        if not 0.0 < float(gpu_memory_utilization) <= 1.0:
            raise UserError(f"backend.options.gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed
        self.lora_mode = lora_mode
        self.inprocess = inprocess
        self.work_dir = work_dir
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engines: dict[int, _Engine] = {}
        self.last_sync_path: str | None = None
        self.lora_requests: dict[tuple[int, str], tuple[Any, Path]] = {}  # (id(base), adapter) -> (request, dir)
        self._lora_ids = 0  # the last LoRA id handed out (ids are never reused: vLLM caches by id)

    # ------------------------------------------------------------------------------------------
    def generate(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> list[Generation]:
        if not prompts:
            return []
        self._prepare_env()
        vllm = _import_vllm()
        engine = self._engine(model, tokenizer)
        eos_id = tokenizer.eos_token_id
        greedy = temperature <= 0
        base: dict[str, Any] = dict(
            n=1,
            temperature=0.0 if greedy else float(temperature),
            top_p=1.0 if greedy else float(top_p),
            max_tokens=int(max_new_tokens),
            logprobs=0,  # the sampled token's log-prob only
        )
        if stop:
            base["stop"] = list(stop)
        if eos_id is not None:
            base["stop_token_ids"] = [int(eos_id)]
        if seed is None:
            params: Any = vllm.SamplingParams(**base)
        else:
            # one seed per request: the same seed for every copy of a prompt would make a whole
            # GRPO group identical
            params = [vllm.SamplingParams(**base, seed=(int(seed) + i) % (2**31 - 1)) for i in range(len(prompts))]
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]  # token-in: ids unchanged
        lora = {"lora_request": self._lora_request(model)} if isinstance(model, AdapterView) else {}
        outputs = engine.llm.generate(inputs, params, use_tqdm=False, **lora)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        return [_to_generation(out, tokenizer, eos_id, special) for out in outputs]

    def sync_weights(self, model: Any) -> None:
        """Push ``model``'s current weights (LoRA merged) into its engine; no-op without an engine.
        An adapter of a shared base: its next call sends its current weights as a new LoRA request."""
        if isinstance(model, AdapterView):
            old = self.lora_requests.pop((id(model.base), model.adapter), None)
            if old is not None:
                shutil.rmtree(old[1], ignore_errors=True)
                self.last_sync_path = "lora"
            return
        engine = self.engines.get(id(model))
        if engine is None:
            log.debug("vllm: no engine for this model yet; it will start from the current weights")
            return
        path = None
        runner_model = _inprocess_model(engine.llm)
        if runner_model is not None:
            import torch

            with torch.no_grad():
                runner_model.load_weights(iter_merged_weights(model))
            path = "inprocess"
        elif callable(getattr(engine.llm, "collective_rpc", None)):
            import torch

            with torch.no_grad():
                weights = [(k, v.detach().to("cpu").contiguous()) for k, v in iter_merged_weights(model)]
            try:
                engine.llm.collective_rpc(_worker_load_weights, args=(weights,))
                path = "rpc"
            except Exception as exc:  # an engine that refuses callables / pickled tensors
                log.warning("vllm: in-place weight load through collective_rpc failed (%s); restarting", exc)
        if path is None:
            self._restart(model, engine)
            path = "restart"
        else:
            _reset_prefix_cache(engine.llm)
        if path != self.last_sync_path:
            log.info("vllm: weights synced by the %r path", path)
        else:
            log.debug("vllm: weights synced by the %r path", path)
        self.last_sync_path = path

    def close(self) -> None:
        """Shut every engine down and remove the temporary model directories."""
        for key in list(self.engines):
            engine = self.engines.pop(key)
            _shutdown(engine.llm)
            shutil.rmtree(engine.directory, ignore_errors=True)
        for _, directory in self.lora_requests.values():
            shutil.rmtree(directory, ignore_errors=True)
        self.lora_requests.clear()
        gc.collect()

    # ------------------------------------------------------------------------------------------
    def _engine(self, model: Any, tokenizer: Any) -> _Engine:
        if isinstance(model, AdapterView):  # one engine for the shared base, started from it alone
            engine = self.engines.get(id(model.base))
            if engine is None:
                with model.disable_adapter():
                    directory = self._save(model, tokenizer)
                engine = _Engine(self._start(directory, model, lora=_lora_engine_kwargs(model)), directory,
                                 model.base, tokenizer)
                self.engines[id(model.base)] = engine
            return engine
        engine = self.engines.get(id(model))
        if engine is None:
            directory = self._save(model, tokenizer)
            engine = _Engine(self._start(directory, model), directory, model, tokenizer)
            self.engines[id(model)] = engine
        return engine

    def _lora_request(self, view: AdapterView) -> Any:
        """The ``LoRARequest`` of ``view``'s adapter as it is now (saved on first use after a sync)."""
        key = (id(view.base), view.adapter)
        if key not in self.lora_requests:
            from importlib import import_module

            directory = self._directory()
            view.save_pretrained(directory)
            self._lora_ids += 1
            request = import_module("vllm.lora.request").LoRARequest(
                f"{view.adapter}-{self._lora_ids}", self._lora_ids, str(directory))
            self.lora_requests[key] = (request, directory)
        return self.lora_requests[key][0]

    def _directory(self) -> Path:
        """A new temporary directory, removed at exit at the latest (model copies never stay behind)."""
        if self.work_dir:
            Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="mlmt-vllm-", dir=self.work_dir))
        atexit.register(shutil.rmtree, directory, True)
        return directory

    def _save(self, model: Any, tokenizer: Any) -> Path:
        directory = self._directory()
        save_merged(model, tokenizer, directory)
        return directory

    def _prepare_env(self) -> None:
        """vLLM reads these when an engine starts (set before vllm is imported; user values win)."""
        if _distributed_world() > 1:
            return  # the external_launcher executor runs the engine in this process
        if self.inprocess:
            # keep the V1 engine core in this process, so sync_weights can reach its model
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            # engine core in another process: the `rpc` sync path pickles a function and CPU
            # tensors to it
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    def _start(self, directory: Path, model: Any, lora: dict[str, Any] | None = None) -> Any:
        """A ``vllm.LLM`` on ``directory``; ``lora``: the engine arguments that enable LoRA requests."""
        self._prepare_env()
        vllm = _import_vllm()
        distributed = _distributed_world() > 1
        kwargs: dict[str, Any] = dict(
            model=str(directory),
            tokenizer=str(directory),
            dtype=self.dtype or _dtype_name(model),
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
        )
        if self.max_model_len is not None:
            kwargs["max_model_len"] = int(self.max_model_len)
        seed = self.seed
        if distributed:
            # one engine per process on its own GPU, inside the existing torch.distributed world
            # (the way TRL's colocate mode runs vLLM)
            kwargs["distributed_executor_backend"] = "external_launcher"
            seed = (seed or 0) + _distributed_rank()
        if seed is not None:
            kwargs["seed"] = int(seed)
        kwargs.update(lora or {})
        kwargs.update(self.engine_kwargs)
        log.info("vllm: starting an engine for %s (%s)", directory,
                 ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()) if k not in ("model", "tokenizer")))
        return vllm.LLM(**kwargs)

    def _restart(self, model: Any, engine: _Engine) -> None:
        _shutdown(engine.llm)
        engine.llm = None
        gc.collect()
        _empty_cuda_cache()
        old = engine.directory
        engine.directory = self._save(model, engine.tokenizer)
        engine.llm = self._start(engine.directory, model)  # never an adapter view's (they sync as requests)
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# weights

#: the ``max_lora_rank`` values vLLM accepts
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _lora_engine_kwargs(view: AdapterView) -> dict[str, Any]:
    """Engine arguments for the adapters of ``view``'s base: LoRA on, a slot per adapter, the
    smallest rank vLLM accepts that holds the largest of them."""
    ranks = [int(c.r) for c in view.base.model.peft_config.values()]
    rank = next((r for r in _VLLM_LORA_RANKS if r >= max(ranks)), max(ranks))
    return {"enable_lora": True, "max_loras": len(ranks), "max_lora_rank": rank}


def iter_merged_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs of ``model``'s weights under the base model's parameter names.

    A peft LoRA model yields each adapted weight as ``W + ΔW`` of its active adapters (the
    model itself is not modified: nothing is merged in place) and no ``lora_*`` tensors; other
    models yield their state dict. Tensors stay where they are (device and dtype).
    """
    if not is_peft(model):
        for name, tensor in model.state_dict().items():
            yield name, tensor.detach()
        return
    base = model.get_base_model()
    lora = lora_layers(base)
    if any(uses_dora(m) for m in lora.values()):
        # DoRA's merged weight is not W + BA: merge a copy instead (costs one model copy)
        yield from _merged_copy_weights(model)
        return
    for key, tensor in base.state_dict().items():
        parts = key.split(".")
        if any(p in _ADAPTER_PARTS for p in parts):
            continue
        owner, leaf = ".".join(parts[:-1]), parts[-1]
        name = key
        if owner.endswith(".base_layer"):
            owner = owner[: -len(".base_layer")]
            name = f"{owner}.{leaf}"
            layer = lora.get(owner)
            if layer is not None and leaf == "weight":
                tensor = merged_weight(layer, tensor)
        if ".modules_to_save." in name:  # a fully trained copy of a module (peft modules_to_save)
            head, _, rest = name.partition(".modules_to_save.")
            name = f"{head}.{rest.split('.', 1)[1]}"
        yield name, tensor.detach()


def _merged_copy_weights(model: Any) -> Iterator[tuple[str, Any]]:
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    for name, tensor in merged.state_dict().items():
        yield name, tensor.detach()


def save_merged(model: Any, tokenizer: Any, directory: Path) -> Path:
    """An HF checkpoint directory (config, safetensors, tokenizer) of the merged weights."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    import torch

    with torch.no_grad():
        if is_peft(model):
            base = model.get_base_model()
            state = {k: v.to("cpu").clone() for k, v in iter_merged_weights(model)}
            # the base model's own save: its config, generation config and tied-weight handling
            base.save_pretrained(str(directory), state_dict=state)
        else:
            model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))  # vLLM's detokenizer (stop strings) reads it here
    return directory


def _dtype_name(model: Any) -> str:
    try:
        dtype = next(model.parameters()).dtype
    except (StopIteration, AttributeError, TypeError):
        return "auto"
    return str(dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------------------------
# vLLM internals (all version-dependent, all optional)


def _inprocess_model(llm: Any) -> Any:
    """The engine's model object when the engine runs in this process, else None."""
    engine = getattr(llm, "llm_engine", None)
    if engine is None:
        return None
    executors = []
    for path in (("model_executor",), ("engine_core", "engine_core", "model_executor")):
        obj = engine
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None:
            executors.append(obj)
    for executor in executors:
        worker = getattr(executor, "driver_worker", None)
        if worker is None:
            continue
        runner = getattr(worker, "model_runner", None) or getattr(getattr(worker, "worker", None), "model_runner", None)
        if runner is None:
            continue
        get_model = getattr(runner, "get_model", None)
        model = get_model() if callable(get_model) else getattr(runner, "model", None)
        if model is not None and callable(getattr(model, "load_weights", None)):
            return model
    return None


def _worker_load_weights(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs inside each vLLM worker (``collective_rpc``): load ``weights`` into its model."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    get_model = getattr(runner, "get_model", None)
    model = get_model() if callable(get_model) else runner.model
    device = next(model.parameters()).device
    model.load_weights((name, tensor.to(device)) for name, tensor in weights)
    return len(weights)


def _reset_prefix_cache(llm: Any) -> None:
    reset = getattr(llm, "reset_prefix_cache", None)
    if callable(reset):
        reset()


def _shutdown(llm: Any) -> None:
    if llm is None:
        return
    engine = getattr(llm, "llm_engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        stop = getattr(obj, "shutdown", None)
        if callable(stop):
            try:
                stop()
            except Exception as exc:  # best effort: the engine is being thrown away
                log.debug("vllm: shutdown: %s", exc)
            break


def _empty_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


def _distributed_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _distributed_rank() -> int:
    return int(os.environ.get("RANK", "0"))


# ----------------------------------------------------------------------------------------------
# outputs


def _to_generation(out: Any, tokenizer: Any, eos_id: int | None, special: set[int]) -> Generation:
    """A ``RequestOutput`` as a :class:`Generation`, normalised to the HF backend's conventions:
    ``ids`` end with EOS exactly when the model stopped by emitting it."""
    c = out.outputs[0]
    ids = [int(t) for t in c.token_ids]
    logprobs = _sampled_logprobs(ids, c.logprobs)
    reason: Literal["stop", "length"] = "length" if c.finish_reason == "length" else "stop"
    if eos_id is not None:
        if ids and ids[-1] == eos_id:
            reason = "stop"  # EOS on the last allowed token: the HF backend reports "stop" too
        elif (c.finish_reason == "stop" and getattr(c, "stop_reason", None) is None
              and not (ids and ids[-1] in special)):
            # stopped by EOS, but this vLLM left it out of token_ids: put it back (log-prob unknown)
            ids.append(int(eos_id))
            logprobs.append(0.0)
    return Generation(ids=ids, logprobs=logprobs, finish_reason=reason,
                      text=tokenizer.decode(ids, skip_special_tokens=True))


def _sampled_logprobs(ids: list[int], entries: Any) -> list[float]:
    """Log-prob of each sampled id from vLLM's per-position ``{token_id: Logprob}`` mappings."""
    if entries is None:
        return [0.0] * len(ids)
    out = []
    for i, tok in enumerate(ids):
        try:
            entry = entries[i][tok]
        except (IndexError, KeyError, TypeError):
            out.append(0.0)
            continue
        out.append(float(getattr(entry, "logprob", entry)))
    return out
