"""Several roles on one frozen base model: each role a named LoRA adapter (``policies.share_base``).

peft holds any number of named adapters on one model, one of them *active*: its LoRA layers add
only the active adapter's ``B·A·x`` to the frozen base's output. :class:`OneBase` is that model
with the bookkeeping peft leaves to its caller (which adapter is active, which adapters train);
:class:`AdapterView` is one role's handle on it, and is what that role's
:class:`~mlmt_bench.models.policy.Policy` holds as its ``model``:

- calling it (``view(**inputs)``, ``view.generate(...)``) first makes its adapter the active one,
  so forward passes, log-prob passes and generation read this role's weights, whoever calls them;
- ``parameters()`` are the weights it runs: the frozen base's and its own adapter's, never the
  other roles' adapters; only its adapter's require gradients (unless its role is frozen), so
  the optimiser built on a policy's trainable parameters, gradient clipping and data-parallel
  gradient sums touch its adapter alone;
- ``disable_adapter()`` is the shared base itself: π_ref of every role (METHOD.md: the common
  starting point);
- ``save_pretrained`` writes a standard peft adapter directory of its adapter alone
  (``adapter_config.json`` + ``adapter_model.safetensors``, keys without the adapter's name),
  the same files a policy with a LoRA of its own writes, so checkpoints and ``--resume`` read both
  the same way (:func:`adapter_target`).

Nothing above the models layer knows whether two roles share a base: the trainer keeps one
optimiser per policy object, the update touches ``policy.model``'s parameters, and a backend that
runs a model's modules directly (the static decoder) calls :func:`activate` first.

Activation is persistent (the last adapter activated stays active), and costs nothing when the
adapter is already active, so a decode loop that calls the model per token pays once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module imports neither torch nor peft
    import torch

_LORA_PREFIX = "lora_"  # peft's LoRA parameter containers: lora_A, lora_B, lora_embedding_A, ...


def _adapter_of(param_name: str) -> str | None:
    """The adapter a peft parameter belongs to (``...q_proj.lora_A.<adapter>.weight`` → adapter), or
    None for a base-model weight."""
    parts = param_name.split(".")
    for i in range(len(parts) - 1):
        if parts[i].startswith(_LORA_PREFIX):
            return parts[i + 1]
    return None


class OneBase:
    """A peft model carrying one named LoRA adapter per role on one frozen base.

    ``peft_model``: a ``PeftModel`` whose adapters are all added (:func:`share_one_base`).
    ``trainable``: adapter name → whether its weights train (a frozen role's adapter never does).
    """

    def __init__(self, peft_model: Any, trainable: dict[str, bool]) -> None:
        self.model = peft_model
        self.trainable = dict(trainable)
        self.active: str | None = None
        self.reindex()

    def reindex(self) -> None:
        """Read the model's parameters again: at construction, and after FSDP has replaced them
        with sharded ones (:meth:`mlmt_bench.fsdp.Sharding.shard`)."""
        self.params: dict[str, list[tuple[str, torch.nn.Parameter]]] = {name: [] for name in self.trainable}
        #: every parameter in the model's order, with its adapter (None: the base's)
        self.named: list[tuple[str, torch.nn.Parameter, str | None]] = []
        for pname, p in self.model.named_parameters():
            adapter = _adapter_of(pname)
            self.named.append((pname, p, adapter))
            if adapter is not None:
                self.params[adapter].append((pname, p))
            else:
                p.requires_grad_(False)  # the base is frozen for every role
        self._fix_grads()

    def _fix_grads(self) -> None:
        """peft's ``set_adapter`` / ``enable_adapters`` mark the active adapter trainable and every
        other frozen; here an adapter trains iff its role does, whichever is active."""
        for name, params in self.params.items():
            for _, p in params:
                p.requires_grad_(self.trainable[name])

    def activate(self, name: str) -> None:
        """Make adapter ``name`` the one the LoRA layers apply (no-op when it already is)."""
        if self.active != name:
            # the tuner's set_adapter, not PeftModel's: since peft 0.22 PeftModel.set_adapter reshards
            # every FSDP2 unit first, which inside mlmt_bench.fsdp.gathered() (one process generating
            # alone) leaves the root's weights sharded mid-evaluation; _fix_grads sets requires_grad on
            # the sharded parameters themselves (reindex), which that reshard exists to reach
            self.model.base_model.set_adapter(name)
            self.model.active_adapter = name
            self._fix_grads()
            self.active = name


class AdapterView:
    """One role's handle on a :class:`OneBase`: the model a shared-base policy holds (see the
    module docstring). Attributes it does not define (``config``, ``training``, ``train``,
    ``eval``, ``get_base_model``, ...) are the shared peft model's."""

    def __init__(self, base: OneBase, name: str) -> None:
        self.base = base
        self.adapter = name

    def __getattr__(self, attr: str) -> Any:  # only reached for names this class does not define
        return getattr(self.__dict__["base"].model, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.base.activate(self.adapter)
        return self.base.model(*args, **kwargs)

    forward = __call__

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.base.activate(self.adapter)
        return self.base.model.generate(*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The base's weights and this adapter's, under the shared model's names and in its order."""
        return ((n, p) for n, p, adapter in self.base.named if adapter in (None, self.adapter))

    def parameters(self, *args: Any, **kwargs: Any) -> Iterator[torch.nn.Parameter]:
        return (p for _, p in self.named_parameters())

    @contextlib.contextmanager
    def disable_adapter(self) -> Iterator[None]:
        """The shared base without any adapter (π_ref); trainability is restored on exit."""
        self.base.activate(self.adapter)
        try:
            with self.base.model.disable_adapter():
                yield
        finally:
            self.base._fix_grads()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """This adapter's weights in peft's saved form (keys without the adapter's name)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.base.model, adapter_name=self.adapter)

    def save_pretrained(self, directory: Path | str, state_dict: dict[str, Any] | None = None) -> None:
        """A peft adapter directory of this adapter alone (what ``PeftModel.save_pretrained`` writes
        for a model whose only adapter is ``default``). ``state_dict``: weights to write instead."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.adapter_state()
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()},
                  str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
        self.base.model.peft_config[self.adapter].save_pretrained(str(directory))  # adapter_config.json


def activate(model: Any) -> None:
    """Make ``model``'s weights the ones its modules run: an :class:`AdapterView` activates its
    adapter; any other model runs only its own weights already. For code that calls a model's
    modules directly (the static decoder) rather than the model itself."""
    if isinstance(model, AdapterView):
        model.base.activate(model.adapter)


def shared_module(model: Any) -> Any:
    """The module that holds ``model``'s weights: a view's shared peft model (the same object for
    every role on that base), or ``model`` itself."""
    return model.base.model if isinstance(model, AdapterView) else model


def reindex(model: Any) -> None:
    """After ``model``'s module had its parameters replaced (FSDP): a view's base reads them again."""
    if isinstance(model, AdapterView):
        model.base.reindex()


def adapter_target(model: Any) -> tuple[Any, str]:
    """(peft model, adapter name) that a LoRA policy's saved adapter weights load into: a view's
    shared model and its adapter, or a peft model with its own (active) adapter."""
    if isinstance(model, AdapterView):
        return model.base.model, model.adapter
    return model, model.active_adapter


def base_name_or_path(model: Any, base_path: str | None = None) -> str | None:
    """What an adapter's ``adapter_config.json`` names as its base (``base_model_name_or_path``,
    what ``AutoPeftModelForCausalLM.from_pretrained`` loads): ``base_path`` (where the base was
    loaded from), else the transformers ``model``'s own ``name_or_path``; a local directory as an
    absolute path, so the adapter loads from any working directory; None when neither names one."""
    name = base_path or getattr(model, "name_or_path", None) or None
    if name is not None and Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    return name


def share_one_base(model: Any, adapters: dict[str, tuple[Any, bool]],
                   base_path: str | None = None) -> dict[str, AdapterView]:
    """Wrap the frozen base ``model`` (a transformers causal LM) with one LoRA adapter per entry of
    ``adapters`` (name → (peft ``LoraConfig``, trainable)), added in the given order (each
    adapter's initial weights draw from torch's RNG as ``get_peft_model`` would for a model of its
    own); returns each name's :class:`AdapterView`. Every adapter's config names the base
    (:func:`base_name_or_path` of ``base_path``, where it was loaded from): peft names it only
    for the first adapter, so a saved second role loaded by peft alone asked the hub for None."""
    from peft import get_peft_model

    names = list(adapters)
    base_name = base_name_or_path(model, base_path)
    peft_model = get_peft_model(model, adapters[names[0]][0], adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, adapters[name][0])
    for name in names:
        peft_model.peft_config[name].base_model_name_or_path = base_name
    base = OneBase(peft_model, {name: trainable for name, (_, trainable) in adapters.items()})
    base.activate(names[0])
    return {name: AdapterView(base, name) for name in names}
