"""FSDP2 for models that do not fit one GPU: ``accelerate launch --config_file registry/accelerate/fsdp.yaml``.

Under that config (``ACCELERATE_USE_FSDP=true`` in the environment, more than one process)
every *trained* policy's model is sharded with torch's ``fully_shard`` over all processes:
each decoder layer is one unit (accelerate's transformer-based wrap: the model's
``_no_split_modules``) and the rest of the model the root unit, so parameters, gradients and
AdamW states take ``1/world`` of their size on each process. Everything else is the
data-parallel trainer of mlmt_bench/machine/dist.py: each process rolls out its share of the problems
and the loss is normalised by global counts; FSDP's reduce-scatter *sums* the gradients
(divide factor 1, sum-only collectives), which is what ``Dist.sum_grads`` does for unsharded
models, so the update equals the single-process update on the whole batch.

When the parameters are gathered (:meth:`Sharding.full_params`): generation, the value
model's features and evaluation need whole weights on one process (evaluation runs on the
main process only, and ``generate`` steps each process to its own length), so every process
gathers every unit (FSDP2 ``unshard``, with resharding after forward turned off) for the
duration and frees the gathered copy afterwards. The update and its π_old log-prob pass run
sharded, every process running the same number of micro-batches (padded with empty ones).

Not sharded: frozen policies and π_ref (full fine-tuning loads it from the initial weights;
with LoRA it is the sharded model with the adapter off) stay whole on every process. Roles on a
shared base (``policies.share_base``) are one peft model, sharded once: the frozen base's weights
and every role's adapter take ``1/world`` each, and each role's optimiser holds its own adapter's
shards; its checkpoint is its adapter alone, as without FSDP.
Checkpoints are gathered to the main process (torch.distributed.checkpoint's full state
dicts): ordinary HF (or peft) directories, and the optimiser state in the layout of a plain
``optimizer.state_dict()``, so an FSDP checkpoint resumes with or without FSDP, on any number
of processes.

Why not ``accelerator.prepare``: accelerate (1.15) turns FSDP on only for GPU-type
distributed runs (``AcceleratorState`` sets ``DistributedType.FSDP`` inside its MULTI_GPU/XPU/…
branch; on CPU it stays ``MULTI_CPU`` and ``prepare`` wraps the model in DDP), so the path
could not be tested here. This module reads the same config through accelerate's
``FullyShardedDataParallelPlugin`` (reshard_after_forward, the wrap policy, CPU offload) and
applies ``fully_shard`` itself, the same calls accelerate makes, on CPU (gloo) and GPU (NCCL).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from mlmt_bench.errors import UserError

if TYPE_CHECKING:
    from mlmt_bench.rollout.backend import BackendTraits


def requested() -> bool:
    """Whether ``accelerate launch`` was given an FSDP config (and more than one process)."""
    return (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
            and int(os.environ.get("WORLD_SIZE", "1")) > 1)


def _module(model: Any) -> Any:
    """What FSDP shards for ``model``: a shared base's view stands for the one peft model that
    carries every role's adapter (:func:`mlmt_bench.models.adapters.shared_module`)."""
    from mlmt_bench.models.adapters import shared_module

    return shared_module(model)


def is_sharded(model: Any) -> bool:
    """Whether ``model`` (or the shared base it is a view of) was sharded by ``fully_shard`` (its
    forward and backward are collectives)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(_module(model), FSDPModule)


def scalar(value: torch.Tensor) -> float:
    """A 0-d tensor as a float; a DTensor (e.g. FSDP's global grad norm) is gathered first."""
    full = getattr(value, "full_tensor", None)
    return float(full() if full is not None else value)


class Sharding:
    """The FSDP state of a run; with FSDP off (the default) every method is the plain path.

    ``backend`` names the run's backend and ``traits`` are what its class declares
    (:class:`~mlmt_bench.rollout.backend.BackendTraits`; None: the conservative defaults, no FSDP):
    FSDP is refused with one line unless the backend declares ``supports_fsdp``.
    """

    def __init__(self, dist: Any, backend: str = "", traits: BackendTraits | None = None) -> None:
        self.dist = dist
        self.enabled = requested() and dist.enabled
        self.models: list[Any] = []  # the sharded models, in a fixed order (collectives line up)
        self._plugin: Any = None
        if self.enabled:
            from accelerate.utils import FullyShardedDataParallelPlugin

            from mlmt_bench.rollout.backend import BackendTraits

            if not (traits or BackendTraits()).supports_fsdp:
                raise UserError(f"FSDP (ACCELERATE_USE_FSDP): backend {backend!r} does not declare FSDP support "
                                "(use backend hf): an engine holding its own weights would need the gathered "
                                "weights after every update")
            self._plugin = FullyShardedDataParallelPlugin()
            if self._plugin.fsdp_version != 2:
                raise UserError(f"fsdp_config.fsdp_version: {self._plugin.fsdp_version} is not supported; use 2 "
                                "(registry/accelerate/fsdp.yaml)")

    # sharding -------------------------------------------------------------------------------
    def shard(self, policies: Iterable[Any]) -> None:
        """Shard each policy's model in place (before its optimiser is built on the parameters)."""
        if not self.enabled:
            return
        from mlmt_bench.models.adapters import reindex

        policies = list(policies)
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy, get_module_children_bottom_up
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.dist.device.type, (self.dist.world,))
        plugin = self._plugin
        kwargs = dict(mesh=mesh, reshard_after_forward=plugin.reshard_after_forward,
                      offload_policy=plugin.cpu_offload,
                      mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy())
        # a shared base is sharded once, its frozen weights and every role's adapter together; each
        # role's optimiser is then built on its adapter's sharded parameters (reindex)
        for model in dict.fromkeys(_module(p.model) for p in policies):
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            plugin.set_auto_wrap_policy(base)  # the decoder layer class from base._no_split_modules
            wrap = fsdp2_prepare_auto_wrap_policy(plugin, base)
            if wrap is not None:
                for module in get_module_children_bottom_up(model)[:-1]:
                    if wrap(module) and not isinstance(module, FSDPModule):
                        fully_shard(module, **kwargs)
            fully_shard(model, **kwargs)
            _RESHARD[model] = plugin.reshard_after_forward
            for unit in _units(model):
                # sum, not mean: the loss is already normalised by global counts (gloo has no
                # PREMUL_SUM, so the collectives are forced to plain sums)
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)
            # FSDP initialises at the first forward of the module it is entered through, which
            # must be the root: peft's generate() enters the base model directly
            with torch.no_grad():
                model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.dist.device))
            self.models.append(model)
        for policy in policies:
            reindex(policy.model)

    @contextmanager
    def full_params(self) -> Iterator[None]:
        """Every sharded model whole on every process for the block (see :func:`gathered`)."""
        with gathered(*self.models):
            yield

    # checkpoints ----------------------------------------------------------------------------
    def full_state(self, policy: Any, optimizer: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(model state dict or None, optimiser state dict) to save; for a sharded model both are
        gathered whole on the main process (every process must call this, in the same order). A
        shared base's view gets its own adapter's weights, in peft's saved form."""
        model = _module(policy.model)
        if model not in self.models:
            return None, optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=opts)
        # a tied weight comes back once per name, as separate tensors: keep the first name only, as
        # save_pretrained does for the model's own (shared) tensors
        names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        optim: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=opts)  # keyed by name
        if optim:  # the main process: the plain optimizer.state_dict() layout, as without FSDP
            index = {name: i for i, name in enumerate(_param_names(policy.model, optimizer))}
            optim = {"state": {index[k]: v for k, v in optim["state"].items()},
                     "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in optim["param_groups"]]}
        state = {k: v for k, v in state.items() if k in names}
        if model is not policy.model and state:  # a view: its adapter alone, as its save_pretrained writes it
            from peft import get_peft_model_state_dict

            from mlmt_bench.models.adapters import adapter_target

            peft_model, adapter = adapter_target(policy.model)
            state = get_peft_model_state_dict(peft_model, state_dict=state, adapter_name=adapter)
        return state, optim

    def load_weights(self, policy: Any, directory: Path) -> None:
        """:meth:`Policy.load_weights`, sharding the saved full tensors when the model is sharded."""
        model = _module(policy.model)
        if model not in self.models:
            policy.load_weights(directory)
            return
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from mlmt_bench.models.adapters import adapter_target

        if policy.is_lora:
            state = _adapter_to_model_keys(*adapter_target(policy.model),
                                           load_file(str(directory / "adapter_model.safetensors")))
        else:
            state = {}
            for f in sorted(directory.glob("*.safetensors")):
                state.update(load_file(str(f)))
        # cast: torch types the argument dict[str, ValueType] (invariant), which a dict of tensors is not
        set_model_state_dict(model, cast(dict[str, Any], state),
                             options=StateDictOptions(full_state_dict=True, strict=False))

    def load_optimizer(self, policy: Any, optimizer: Any, state: dict[str, Any]) -> None:
        model = _module(policy.model)
        if model not in self.models:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(policy.model, optimizer)
        by_name: dict[str, Any] = {
            "state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


_RESHARD: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # model -> its reshard_after_forward


def _units(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(*models: Any) -> Iterator[None]:
    """The sharded ones of ``models`` whole on every process for the block: a collective (every
    process enters it, with the same models); forwards inside need no communication, so one
    process may run alone (evaluation) or to its own length (``generate``). No-op for others."""
    shared = dict.fromkeys(_module(m) for m in models)  # two views of one base: gathered once
    units = [(m, u) for m in shared if is_sharded(m) for u in _units(m)]
    for _, u in units:
        u.set_reshard_after_forward(False, recurse=False)
    for _, u in units:
        u.unshard()
    try:
        yield
    finally:
        for m, u in units:
            u.reshard()
            u.set_reshard_after_forward(_RESHARD.get(m, True), recurse=False)


def _param_names(model: Any, optimizer: Any) -> list[str]:
    """The names of the optimiser's parameters, in its order (the ids of ``optimizer.state_dict()``)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _adapter_to_model_keys(model: Any, adapter: str, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's saved names of ``model``'s adapter ``adapter`` → the model's parameter names, through
    peft's own renaming (``get_peft_model_state_dict`` applied to the names, coded as tensors)."""
    from peft import get_peft_model_state_dict

    names = [k for k, _ in model.named_parameters()] + [k for k, _ in model.named_buffers()]
    coded = get_peft_model_state_dict(model, state_dict={n: torch.tensor(i) for i, n in enumerate(names)},
                                      adapter_name=adapter)
    to_model = {saved_name: names[int(code)] for saved_name, code in coded.items()}
    unknown = sorted(set(saved) - set(to_model))
    if unknown:
        raise RuntimeError(f"adapter checkpoint does not match the model: {unknown[:3]}")
    return {to_model[k]: v for k, v in saved.items()}
