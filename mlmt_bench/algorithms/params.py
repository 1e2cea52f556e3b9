"""Parameters of each built-in algorithm (light module: pydantic only, no torch).

Every **(decision)** of METHOD.md is a field here, so an ablation can flip it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LossParams(_Params):
    """The shared clipped policy loss (METHOD.md, "Shared pieces")."""

    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="ε_low: ratio clipped below at 1 − ε_low")
    clip_high: float = Field(0.2, ge=0.0, description="ε_high: ratio clipped above at 1 + ε_high")
    beta: float = Field(0.0, ge=0.0, description="KL(π_θ‖π_ref) coefficient (k3 estimator); 0 = no reference model")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant_norm"] = "token_mean"
    scale: Literal["std", "none"] = Field("std", description="divide advantages by the group std (none = Dr.GRPO)")
    epochs: int = Field(1, ge=1, description="optimisation passes over each rollout batch")


class GRPOParams(LossParams):
    group_size: int = Field(8, ge=2, description="G: samples per problem")


class SelfCorrectParams(LossParams):
    group_size: int = Field(8, ge=2, description="G: first attempts per problem")
    alpha: float = Field(10.0, ge=0.0, description="(decision) stage-II progress bonus r2 + α(r2 − r1)")
    beta2: float = Field(0.1, ge=0.0, description="(decision) stage-I KL on the first turn")
    stage1_frac: float = Field(0.3, ge=0.0, le=1.0, description="(decision) share of steps in stage I")


class MLMTParams(LossParams):
    group_size: int = Field(8, ge=2, description="G: first attempts per problem")
    feedbacks: int = Field(1, ge=1, description="K: feedbacks per attempt")
    refinements: int = Field(1, ge=1, description="M: refinements per feedback")
    eta: float = Field(1.0, ge=0.0, description="(decision) turn-1 reward r1 + η·r2")
    lam: float = Field(0.5, ge=0.0, description="λ: weight of the lower-level value in R_H")
    value: Literal["learned", "mc", "none"] = Field("mc", description="V_L estimator (none sets λ = 0)")
    value_lr: float = Field(1e-3, gt=0.0, description="learning rate of the learned value head")
    lower_steps: int = Field(1, ge=1, description="t_L: solver updates per cycle")
    upper_steps: int = Field(1, ge=1, description="t_H: critic updates per cycle")
    variant: Literal["full", "fixed_feedback", "shared_policy", "oracle_feedback", "null_feedback"] = "full"


PARAMS: dict[str, type[BaseModel]] = {
    "grpo": GRPOParams,
    "self_correct": SelfCorrectParams,
    "mlmt": MLMTParams,
}
