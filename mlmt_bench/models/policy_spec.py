"""A role's policy as a run spec declares it (``policies.solver``, ``policies.critic``): the model's
registry name and path, its LoRA adapter, dtype, learning rate, gradient checkpointing and sampling
temperature.

The model factories (:mod:`mlmt_bench.models.factory`, :mod:`mlmt_bench.models.policy`) take a
:class:`PolicySpec`, so it lives here, beside them; :mod:`mlmt_bench.spec` composes it into a run
spec. Every section of a spec is a :class:`SpecSection`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: the largest ``lora.r``: the hidden size of the largest models (the other limits of a spec: :mod:`mlmt_bench.spec`)
MAX_LORA_RANK = 1 << 14


class SpecSection(BaseModel):
    """The base of every section of a run spec: an unknown key is an error, and so is a float that is
    ``.inf`` or ``.nan``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraSpec(SpecSection):
    r: int = Field(8, ge=1, le=MAX_LORA_RANK)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # all-linear by default, as the README's examples and TRL/peft's own examples use (every linear layer
    # but the output head); a list names modules instead (q_proj, v_proj was the default before 2026-12-04)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class PolicySpec(SpecSection):
    model: str = Field("tiny", description="model registry name: tiny | hf | a plugin's")
    path: str | None = Field(None, description="hub name or checkpoint dir; tiny: default the shared base")
    lora: LoraSpec | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lr: float = Field(1e-4, gt=0.0)
    trainable: bool = True
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass "
                                                            "(less memory, ~1/3 more compute)")
    temperature: float | None = Field(None, ge=0.0, description="this role's sampling temperature in training "
                                      "(METHOD v3: each role its own); default backend.temperature")
