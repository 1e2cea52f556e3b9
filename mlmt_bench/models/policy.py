"""Policies: a causal LM + its tokenizer, optionally wrapped with a LoRA adapter (peft).

``model: hf``   loads any HF causal LM by hub name or local directory (``policies.X.path``).
``model: tiny`` loads the shared base (``mlmt-bench base``; warmstart/shared_base.py), or ``path``.
Both return the same :class:`Policy`; nothing downstream knows which one it got.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mlmt_bench.errors import UserError
from mlmt_bench.models.hf_quiet import quiet_transformers

if TYPE_CHECKING:
    from mlmt_bench.models.policy_spec import PolicySpec


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: a torch dtype as a safetensors header names it
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                       torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


@dataclass
class Policy:
    """role: "solver" or "critic". ``n_params`` counts the parameters that run (for FLOPs).
    ``init_path``/``dtype``: where the initial weights were loaded from, so that π_ref is exactly
    the initial policy for the whole run, a resumed one included (METHOD.md v2)."""

    role: str
    model: Any
    tokenizer: Any
    trainable: bool
    lr: float
    n_params: int
    init_path: str
    dtype: str = "float32"
    is_lora: bool = False
    ref_model: Any = None  # the initial weights, for KL when full fine-tuning; None with LoRA (adapter off)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference_logits(self, **inputs: Any) -> torch.Tensor:
        """Logits of π_ref: the adapter disabled (LoRA) or the frozen initial copy."""
        with torch.no_grad():
            if self.is_lora:
                with self.model.disable_adapter():
                    return self.model(**inputs).logits
            if self.ref_model is None:
                raise RuntimeError(f"{self.role}: no reference model (enable with beta > 0)")
            return self.ref_model(**inputs).logits

    def ensure_reference(self) -> None:
        """Load π_ref (full fine-tuning) from the initial weights at ``init_path``: never a copy of
        the current model, which after ``--resume`` would be the checkpoint's."""
        if not self.is_lora and self.ref_model is None:
            first = next(self.model.parameters())
            ref, _ = _load(self.init_path, self.dtype, None if first.device.type == "cpu" else str(first.device))
            self.ref_model = ref.to(first.dtype).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

    def check_weights_fit(self, directory: Path) -> None:
        """A one-line UserError unless the weights in ``directory`` (what :meth:`load_weights`
        reads) fit this policy exactly, read from the safetensors headers without loading them:
        the same tensor names (a full model's tied ``lm_head`` may be absent), shapes and dtypes.
        A wrong-shape, missing or extra tensor, or weights cast to another dtype, would otherwise
        be a long traceback mid-resume or a silently different run."""
        from safetensors import safe_open

        expected = {k: (tuple(v.shape), v.dtype) for k, v in self._saved_state().items()}
        files = [directory / "adapter_model.safetensors"] if self.is_lora else sorted(directory.glob("*.safetensors"))
        found: dict[str, tuple[tuple[int, ...], str]] = {}
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for k in st.keys():
                    sl = st.get_slice(k)
                    found[k] = (tuple(sl.get_shape()), sl.get_dtype())
        extra = sorted(set(found) - set(expected))
        missing = sorted(k for k in set(expected) - set(found) if self.is_lora or "lm_head" not in k)
        if extra or missing:
            raise UserError(f"{directory}: the weights do not fit the {self.role} policy ("
                            + "; ".join(x for x in (f"extra tensors {extra[:2]}" if extra else "",
                                                    f"missing {missing[:2]}" if missing else "") if x) + ")")
        for k, (shape, dtype) in found.items():
            want_shape, want_dtype = expected[k]
            if shape != want_shape:
                raise UserError(f"{directory}: tensor {k} has shape {list(shape)}, the {self.role} policy's is "
                                f"{list(want_shape)}")
            if dtype != _SAFETENSORS_DTYPES.get(want_dtype, str(want_dtype)):
                raise UserError(f"{directory}: tensor {k} is {dtype}, the {self.role} policy's is "
                                f"{_SAFETENSORS_DTYPES.get(want_dtype, want_dtype)}")

    def _saved_state(self) -> dict[str, torch.Tensor]:
        """The tensors :meth:`save` writes, by the names it writes them under."""
        if self.is_lora:
            from peft import get_peft_model_state_dict

            from mlmt_bench.models.adapters import adapter_target

            peft_model, adapter = adapter_target(self.model)
            return dict(get_peft_model_state_dict(peft_model, adapter_name=adapter))
        return dict(self.model.state_dict())

    def load_weights(self, directory: Path) -> None:
        """Weights from a directory :meth:`save` wrote (adapter weights only, with LoRA)."""
        from safetensors.torch import load_file

        from mlmt_bench.models.frozen_cast import drop_cached_casts

        if self.is_lora:
            from peft import set_peft_model_state_dict

            from mlmt_bench.models.adapters import adapter_target

            peft_model, adapter = adapter_target(self.model)  # a shared base's view: its own adapter
            set_peft_model_state_dict(peft_model, load_file(str(directory / "adapter_model.safetensors")),
                                      adapter_name=adapter)
            drop_cached_casts()
            return
        state = {}
        for f in sorted(directory.glob("*.safetensors")):
            state.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(f"{directory}: checkpoint does not match the model ({missing[:3]}, {unexpected[:3]})")
        if hasattr(self.model, "tie_weights"):
            self.model.tie_weights()
        drop_cached_casts()  # a load inside an autocast region: no stale cast of the old weights

    def save(self, directory: Path, state_dict: dict[str, Any] | None = None) -> None:
        """HF-format directory (a peft adapter directory with LoRA) + the tokenizer; ``state_dict``:
        the weights to write instead of the model's own (FSDP: gathered from the shards)."""
        directory.mkdir(parents=True, exist_ok=True)
        with quiet_transformers():
            self.model.save_pretrained(directory, **({"state_dict": state_dict} if state_dict is not None else {}))
            self.tokenizer.save_pretrained(directory)


def check_model_dir(local: Path, path: str) -> None:
    """UserError unless the existing ``local`` (``path`` as given) is a model directory: a
    directory with a config.json (or a peft adapter's adapter_config.json). Without this,
    ``/etc`` reaches the tokenizer loaders and ends in a sentencepiece traceback."""
    from mlmt_bench.io.bounded_input import kind_of

    try:
        mode = local.stat().st_mode
    except (OSError, ValueError, RuntimeError):
        raise UserError(f"model {path!r}: not a model directory (cannot stat it)") from None
    if not stat.S_ISDIR(mode):
        raise UserError(f"model {path!r}: is {kind_of(mode)}, not a model directory")
    if not any((local / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise UserError(f"model {path!r}: not a model directory (no config.json)")
    from mlmt_bench.models import model_dir_check

    # what it holds, as eval and export check it: safetensors only, a config its weights fit, no
    # device or FIFO inside, an adapter's base a hub id or a directory that passes too
    model_dir_check.check_model_dir(local)


def _load(path: str, dtype: str, device: str | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.models import hub

    local = Path(path).expanduser()
    cache_only = False  # a hub name the hub cannot give now: from the local hub cache alone
    if local.exists():
        check_model_dir(local, path)
    elif hub.missing_local(path):
        raise UserError(f"model {path!r}: {hub.missing_local(path)}")
    else:
        cache_only = hub.hub_load_from_cache(path)  # fails fast when neither the hub nor the cache has it
    model: Any  # transformers' typing of PreTrainedModel.to (a decorated method) refuses model.to(device)
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(local) if local.exists() else path,
                                                      local_files_only=cache_only)
            from mlmt_bench.models import cpu_attention

            cpu_attention.install()
            model = AutoModelForCausalLM.from_pretrained(str(local) if local.exists() else path, dtype=_DTYPES[dtype],
                                                         local_files_only=cache_only)
    except OSError as exc:
        raise UserError(f"model {path!r}: cannot load ({str(exc).splitlines()[0]})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if device:
        model.to(device)
    return model, tokenizer


def _enable_checkpointing(model: Any) -> None:
    """Activation (gradient) checkpointing of every decoder layer, non-reentrant: it works with
    frozen inputs (LoRA) and under no_grad. transformers applies it in training mode only, so
    generation (in eval mode) keeps its KV cache."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise UserError(f"gradient_checkpointing: {type(model).__name__} does not support it")


def _lora_config(lora: Any) -> Any:
    """The peft ``LoraConfig`` of a spec's ``lora:`` section."""
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, task_type="CAUSAL_LM")


def _wrap_lora(model: Any, lora: Any) -> Any:
    from peft import get_peft_model

    return get_peft_model(model, _lora_config(lora))


def build_policy(role: str, spec: PolicySpec, path: str, device: str | None = None) -> Policy:
    """A :class:`Policy` from a ``PolicySpec`` and the resolved checkpoint ``path``."""
    model, tokenizer = _load(path, spec.dtype, device)
    n_params = sum(p.numel() for p in model.parameters())
    if spec.gradient_checkpointing:
        _enable_checkpointing(model)
    is_lora = False
    if spec.lora is not None:
        model = _wrap_lora(model, spec.lora)
        is_lora = True
    if not spec.trainable:
        for p in model.parameters():
            p.requires_grad_(False)
    model.train()
    return Policy(role=role, model=model, tokenizer=tokenizer, trainable=spec.trainable, lr=spec.lr,
                  n_params=n_params, init_path=path, dtype=spec.dtype, is_lora=is_lora)


def load_hf_policy(role: str, spec: PolicySpec, base_dir: Path | None = None, device: str | None = None) -> Policy:
    if not spec.path:
        raise UserError(f"policies.{role}.path: model 'hf' needs a hub name or directory")
    return build_policy(role, spec, spec.path, device)


def load_tiny_policy(role: str, spec: PolicySpec, base_dir: Path | None = None, device: str | None = None) -> Policy:
    """The tiny model at ``path``, or else the shared base every role starts from."""
    path = spec.path or base_dir
    if path is None:
        raise UserError(f"policies.{role}: model 'tiny' needs `path` or a `base:` section in the spec")
    return build_policy(role, spec, str(path), device)


def adapters_on_one_base(base: Policy, specs: dict[str, PolicySpec]) -> dict[str, Policy]:
    """``policies.share_base``: one policy per role of ``specs`` (in order), each a named LoRA
    adapter (its spec's ``lora``, ``lr``, ``trainable``) on the frozen model of ``base`` (a policy
    built without LoRA), see :mod:`mlmt_bench.models.adapters`. Every role counts the base's
    ``n_params`` (what runs), and starts, as its π_ref does, from ``base``'s weights."""
    from mlmt_bench.models.adapters import share_one_base

    views = share_one_base(base.model, {role: (_lora_config(s.lora), s.trainable) for role, s in specs.items()},
                           base.init_path)
    return {role: Policy(role=role, model=views[role], tokenizer=base.tokenizer, trainable=s.trainable, lr=s.lr,
                         n_params=base.n_params, init_path=base.init_path, dtype=base.dtype, is_lora=True)
            for role, s in specs.items()}
