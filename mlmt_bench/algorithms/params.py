"""Parameters of each built-in algorithm, and the roles each one plays (light module: pydantic only).

Every **(decision)** of METHOD.md is a field here, so an ablation can flip it. The MLMT variants
live in one table, :data:`MLMT_VARIANTS`: what each does with the two roles, where the
feedback comes from and which of the solver's turns train. A new variant is a row here: the step
plan (``mlmt.py``), credit, the trainer and ``mlmt-bench plan`` read it from there.

Limits: every float must be finite (``allow_inf_nan=False``), and the counts that multiply a
step's work or memory have upper limits far beyond real use, so that a typo is a one-line error
at validation, not a MemoryError or a run that never ends (the run's own limits, and the bound on
problems × G × K × M per step: :mod:`mlmt_bench.spec`):

================================  ==============================================================
``MAX_SAMPLES_PER_PROBLEM``       4,096: ``group_size`` (G), ``feedbacks`` (K), ``refinements``
                                  (M); published GRPO runs use G = 8-64, a few use 512.
``MAX_EPOCHS``                    1,024 passes over a rollout batch (PPO uses 1-4).
``MAX_DYNAMIC_SAMPLING_ROUNDS``   64 extra rollouts per step (DAPO needs a few).
``MAX_VALUE_HIDDEN``              65,536: width of the value model's MLP (a hidden × H matrix).
``MAX_VALUE_FIT_STEPS``           100,000 Adam steps of the value model per training step.
================================  ==============================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from mlmt_bench.algorithms import advantages, losses
from mlmt_bench.registry import unknown_message
from mlmt_bench.rollout.episodes import FeedbackSource, TurnKind

#: What an algorithm does with a role's policy: ``trained`` (built and updated), ``frozen``
#: (built, never updated), ``shared`` (the solver's weights play it: one model, both prompts),
#: ``absent`` (no model: the role is not in the episode, or a rule plays it).
RoleMode = Literal["trained", "frozen", "shared", "absent"]

MAX_SAMPLES_PER_PROBLEM = 4096
MAX_EPOCHS = 1024
MAX_DYNAMIC_SAMPLING_ROUNDS = 64
MAX_VALUE_HIDDEN = 1 << 16
MAX_VALUE_FIT_STEPS = 100_000
_ROLES = ("solver", "critic")  # the roles of Roles, in order


@dataclass(frozen=True)
class Roles:
    """The policies an algorithm needs. ``feedback``: who writes the second turn."""

    solver: RoleMode = "trained"
    critic: RoleMode = "absent"
    feedback: FeedbackSource = "none"

    def mode(self, role: str) -> RoleMode:
        mode: RoleMode = getattr(self, role)  # a field of this class
        return mode

    def built(self) -> list[str]:
        """Roles whose policy is loaded from a spec (trained or frozen)."""
        return [r for r in _ROLES if self.mode(r) in ("trained", "frozen")]

    def trained(self) -> list[str]:
        return [r for r in _ROLES if self.mode(r) == "trained" or
                (self.mode(r) == "shared" and self.solver == "trained")]


@dataclass(frozen=True)
class MLMTVariant:
    """A row of :data:`MLMT_VARIANTS`: the roles, and which of the solver's turns are trained
    (when the solver is: the attempt on r1 + η·r̄2, the refinement on r2)."""

    roles: Roles
    solver_trains: tuple[TurnKind, ...] = ("attempt", "refine")


#: variant -> its roles and trained solver turns (METHOD.md, "Variants of mlmt").
MLMT_VARIANTS: dict[str, MLMTVariant] = {
    "full": MLMTVariant(Roles("trained", "trained", "critic")),
    "fixed_feedback": MLMTVariant(Roles("trained", "frozen", "critic")),   # the paper's fixed critic
    "shared_policy": MLMTVariant(Roles("trained", "shared", "critic")),    # one model plays both roles
    "oracle_feedback": MLMTVariant(Roles("trained", "absent", "oracle")),  # a rule that sees y*: an upper bound
    "null_feedback": MLMTVariant(Roles("trained", "absent", "null")),      # g = g∅
    "critic_only": MLMTVariant(Roles("frozen", "trained", "critic")),      # CTRL-style: only the critic learns
    "refine_only": MLMTVariant(Roles("trained", "trained", "critic"), ("refine",)),  # the attempt turn not trained
}


@dataclass(frozen=True)
class LossTerms:
    """The policy loss an algorithm's parameters select, as the shared update reads it (with the
    run's micro-batching, accumulation and clipping: ``algorithms.update.LossConfig``)."""

    clip_low: float
    clip_high: float
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant_norm"]
    epochs: int
    ratio: str = "token"
    loss: str = "clip"
    cispo_max: float = losses.CISPO_MAX
    shaping_gamma: float = losses.SHAPING_GAMMA
    loss_options: dict[str, float] = field(default_factory=dict)  # the loss's own options (losses.py)


class AlgorithmParams(BaseModel):
    """What an algorithm's parameters declare to the trainer, ``plan`` and validation (nothing
    outside the algorithm reads its fields): its roles, its loss, whether it needs a reference
    model, its per-problem sample counts and its dynamic-sampling rounds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def roles(self) -> Roles:
        """The policies the algorithm with these parameters needs (default: one trained solver)."""
        return Roles("trained", "absent", "none")

    def sample_factors(self) -> dict[str, int]:
        """Field name -> count, for the counts that multiply a step's largest turn per problem
        (G, K, M); the spec's bound on sequences per step multiplies them."""
        return {}

    @classmethod
    def variants(cls) -> dict[str, dict[str, object]]:
        """Named parameter settings that change the algorithm's step plan (which turns it
        generates or trains, and how): each is checked against ``mlmt-bench plan`` by the plan
        parity test (tests/test_plan.py) without a line there. Default: the defaults alone."""
        return {"default": {}}


class LossParams(AlgorithmParams):
    """The shared clipped policy loss (METHOD.md, "Shared pieces")."""

    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="ε_low: ratio clipped below at 1 − ε_low")
    clip_high: float = Field(0.2, ge=0.0, description="ε_high: ratio clipped above at 1 + ε_high")
    beta: float = Field(0.0, ge=0.0, description="KL(π_θ‖π_ref) coefficient (k3 estimator); 0 = no reference model")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant_norm"] = Field(
        "token_mean", description="token_mean (DAPO), seq_mean_token_mean (GRPO), constant_norm (Dr.GRPO: the sum over "
                                  "completion tokens / (max_new_tokens × sequences sampled))")
    scale: Literal["std", "none"] = Field("std", description="divide advantages by the group std (none = Dr.GRPO); "
                                                           "the older spelling of advantage: grpo | dr_grpo, read "
                                                           "only when advantage is not set")
    advantage: str | dict[str, str] | None = Field(
        None, description="the advantage estimator: one name for every trained role, or {role: name} (solver, "
                          "critic; a role not named gets the default), each one of the estimators registered in "
                          f"mlmt_bench/algorithms/advantages.py: {', '.join(advantages.ADVANTAGES)}; default "
                          "(null): grpo, or dr_grpo with scale: none")
    epochs: int = Field(1, ge=1, le=MAX_EPOCHS, description="optimisation passes over each rollout batch")
    ratio: str = Field(
        "token", description="importance ratio per token, or one length-normalised ratio per sequence (GSPO); "
                             f"one of the ratios of mlmt_bench/algorithms/losses.py: {', '.join(losses.RATIOS)}")
    loss: str = Field(
        "clip", description="clip: PPO's clipped surrogate; cispo: the clipped, stop-gradiented weight times "
                            "the REINFORCE term of every token; one of the policy losses registered in "
                            f"mlmt_bench/algorithms/losses.py: {', '.join(losses.POLICY_LOSSES)}")
    loss_options: dict[str, float] = Field(
        default_factory=dict, description="the chosen loss's own options (keyword arguments of its function in "
                                          "losses.py, beyond clip_low, clip_high and cispo_max)")
    cispo_max: float = Field(losses.CISPO_MAX, gt=0.0, description="CISPO's cap on the importance weight (ε_max)")
    overlong_buffer: int = Field(0, ge=0, description="DAPO overlong shaping: a penalty ramping from 0 to "
                                                      "-overlong_penalty over the last N tokens before the limit "
                                                      "(0: off)")
    overlong_penalty: float = Field(1.0, ge=0.0, description="the overlong penalty at the token limit")
    mask_truncated: bool = Field(False, description="drop completions cut by the token limit from the loss "
                                                    "(DAPO's overlong filtering); they still count in the group's "
                                                    "statistics")

    @field_validator("ratio")
    @classmethod
    def _known_ratio(cls, v: str) -> str:
        losses.ratio_of(v)  # ValueError with a did-you-mean
        return v

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        losses.policy_loss(v)
        return v

    @field_validator("loss_options")
    @classmethod
    def _options_of_the_loss(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        if "loss" in info.data:  # else the loss itself is already reported
            losses.check_options(info.data["loss"], v)
        return v

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, v: str | dict[str, str] | None) -> str | dict[str, str] | None:
        for name in (v.values() if isinstance(v, dict) else [] if v is None else [v]):
            advantages.estimator(name)  # ValueError with a did-you-mean
        for role in (v if isinstance(v, dict) else []):
            if role not in _ROLES:
                raise ValueError(unknown_message("role", role, list(_ROLES)))
        return v

    @model_validator(mode="after")
    def _advantage_fits_the_roles(self) -> LossParams:
        if isinstance(self.advantage, dict):
            trained = self.roles().trained()
            for role in self.advantage:
                if role not in trained:
                    raise ValueError(f"advantage.{role}: these parameters train no {role} "
                                     f"(trained: {', '.join(trained) or 'none'})")
        given = (self.advantage.values() if isinstance(self.advantage, dict)
                 else [] if self.advantage is None else [self.advantage])
        if self.scale == "none" and any(n != advantages.SCALE_ESTIMATORS["none"] for n in given):
            raise ValueError(f"scale: none (Dr.GRPO) contradicts advantage: {self.advantage}; drop scale and "
                             "set advantage alone")
        return self

    def advantage_of(self, role: str) -> str:
        """The name of the advantage estimator of ``role`` (``solver`` or ``critic``)."""
        named = self.advantage.get(role) if isinstance(self.advantage, dict) else self.advantage
        return named or advantages.SCALE_ESTIMATORS[self.scale]

    def loss_terms(self) -> LossTerms:
        return LossTerms(self.clip_low, self.clip_high, self.loss_agg, self.epochs, self.ratio, self.loss,
                         self.cispo_max, loss_options=dict(self.loss_options))

    def needs_reference(self) -> bool:
        """Whether some trained turn carries a KL term to π_ref (a reference model is kept)."""
        return self.beta > 0

    def extra_rollout_rounds(self) -> int:
        """DAPO's dynamic sampling: at most this many extra rollouts per step (0: off)."""
        return 0


class GRPOParams(LossParams):
    group_size: int = Field(8, ge=2, le=MAX_SAMPLES_PER_PROBLEM, description="G: samples per problem")
    dynamic_sampling: bool = Field(False, description="DAPO: sample more problems until the step holds "
                                                      "problems_per_step groups with non-zero reward variance "
                                                      "(the extra tokens count in every budget)")
    dynamic_sampling_rounds: int = Field(3, ge=1, le=MAX_DYNAMIC_SAMPLING_ROUNDS,
                                         description="at most this many extra rollouts per step")

    def sample_factors(self) -> dict[str, int]:
        return {"group_size": self.group_size}

    def extra_rollout_rounds(self) -> int:
        return self.dynamic_sampling_rounds if self.dynamic_sampling else 0


class CritiqueGRPOParams(GRPOParams):
    critique_source: Literal["critic", "oracle"] = Field(
        "critic", description="the fixed feedback: the frozen base critic, or the oracle (an upper bound)")
    refinements_in_group: Literal["correct", "all"] = Field(
        "correct", description="refinements added to the group as responses to x: the correct ones, or all")
    shaping_gamma: float = Field(losses.SHAPING_GAMMA, gt=0.0,
                                 description="policy shaping of the off-policy tokens: π / (π + γ)")

    def loss_terms(self) -> LossTerms:
        return dataclasses.replace(super().loss_terms(), shaping_gamma=self.shaping_gamma)

    def roles(self) -> Roles:
        return Roles("trained", "frozen" if self.critique_source == "critic" else "absent", self.critique_source)

    @classmethod
    def variants(cls) -> dict[str, dict[str, object]]:
        return {source: {"critique_source": source} for source in ("critic", "oracle")}


_SELF_DISTILL_CRITIC: dict[str, RoleMode] = {"critic": "frozen", "oracle": "absent", "mlmt": "trained"}


class SelfDistillParams(GRPOParams):
    critique_source: Literal["critic", "oracle", "mlmt"] = Field(
        "critic", description="the feedback: the frozen base critic, the oracle (an upper bound), or a critic "
                              "trained as MLMT-RL's higher level")
    distill: Literal["sft", "kl"] = Field("sft", description="log-likelihood of refinements as responses to x, or a "
                                                             "token-level KL toward the feedback-conditioned solver")
    distill_on: Literal["correct", "all"] = Field("correct", description="which refinements are distilled")
    delta: float = Field(0.1, ge=0.0, description="δ: weight of the distillation term")

    def roles(self) -> Roles:
        return Roles("trained", _SELF_DISTILL_CRITIC[self.critique_source],
                     "oracle" if self.critique_source == "oracle" else "critic")

    @classmethod
    def variants(cls) -> dict[str, dict[str, object]]:
        return {f"{source}-{distill}": {"critique_source": source, "distill": distill}
                for source in _SELF_DISTILL_CRITIC for distill in ("sft", "kl")}


class SelfCorrectParams(LossParams):
    group_size: int = Field(8, ge=2, le=MAX_SAMPLES_PER_PROBLEM, description="G: first attempts per problem")
    alpha: float = Field(10.0, ge=0.0, description="(decision) stage-II progress bonus r2 + α(r2 − r1)")
    beta2: float = Field(0.1, ge=0.0, description="(decision) stage-I KL on the first turn")
    stage1_frac: float = Field(0.3, ge=0.0, le=1.0, description="(decision) share of training in stage I")

    def roles(self) -> Roles:
        return Roles("trained", "absent", "null")

    def sample_factors(self) -> dict[str, int]:
        return {"group_size": self.group_size}

    def needs_reference(self) -> bool:
        return self.beta > 0 or self.beta2 > 0  # stage I's KL on the first turn


class MLMTParams(LossParams):
    group_size: int = Field(8, ge=2, le=MAX_SAMPLES_PER_PROBLEM, description="G: first attempts per problem")
    feedbacks: int = Field(1, ge=1, le=MAX_SAMPLES_PER_PROBLEM, description="K: feedbacks per attempt")
    refinements: int = Field(1, ge=1, le=MAX_SAMPLES_PER_PROBLEM, description="M: refinements per feedback")
    eta: float = Field(1.0, ge=0.0, description="(decision) turn-1 reward r1 + η·r2")
    lam: float = Field(0.5, ge=0.0, description="λ: weight of the lower-level value in the critic's advantage, "
                                                "added after standardisation in its units (METHOD v4): "
                                                "std_group(R) + λ·(V − mean_group V)/σ_V, σ_V the batch std of V")
    value: Literal["learned", "none"] = Field("learned", description="V_L: a learned value model, or none (λ = 0)")
    value_features: Literal["feedback_pool", "last"] = Field(
        "feedback_pool", description="what the value model reads of the solver's refinement context (x, z, g): "
                                     "feedback_pool = its last-layer hidden state at the last token concatenated "
                                     "with their mean over the feedback message's tokens (METHOD v4: features that "
                                     "see g); last = the last token's state alone (v3)")
    value_lr: float = Field(1e-3, gt=0.0, description="Adam learning rate of the value model")
    value_hidden: int = Field(64, ge=1, le=MAX_VALUE_HIDDEN, description="hidden width of the value model's MLP")
    value_fit_steps: int = Field(32, ge=1, le=MAX_VALUE_FIT_STEPS,
                                 description="Adam steps on the value model per training step")
    value_batch: int = Field(64, ge=1, description="minibatch of the value model's fitting")
    value_buffer: int = Field(2048, ge=1, description="at most this many of the newest refinements in the value "
                                                      "model's buffer (see value_buffer_steps)")
    value_buffer_steps: int = Field(2, ge=1, description="the value model fits on the refinements of the last N "
                                                         "training steps only (features of a recent solver, never "
                                                         "stale ones; METHOD.md v3)")
    critic_reward: Literal["helpfulness", "helpfulness+verdict"] = Field(
        "helpfulness", description="the critic's reward before the value: helpfulness = ū (the paper); "
                                   "helpfulness+verdict = ū + ν·1[the feedback's verdict on z matches the verifier] "
                                   "(Critique-RL), standardised per group like ū")
    nu: float = Field(0.5, ge=0.0, description="ν: reward of a feedback whose verdict (right / wrong) matches the "
                                               "verifier (critic_reward: helpfulness+verdict; accepted and ignored "
                                               "with helpfulness)")
    schedule: Literal["simultaneous", "alternate"] = Field(
        "simultaneous", description="simultaneous: both policies update every step; alternate: t_L solver-only steps, "
                                    "then t_H critic-only steps")
    lower_steps: int = Field(1, ge=1, description="t_L: solver-only steps per block (schedule: alternate)")
    upper_steps: int = Field(1, ge=1, description="t_H: critic-only steps per block (schedule: alternate)")
    variant: str = Field("full", description=f"one of {', '.join(MLMT_VARIANTS)} (METHOD.md)")

    @field_validator("value", mode="before")
    @classmethod
    def _no_mc(cls, v: object) -> object:
        if v == "mc":
            raise ValueError("'mc' was removed in METHOD.md v2: a Monte-Carlo value equal to ū only rescales ū and "
                             "gives the advantages of 'none' (docs/METHOD.md, MLMT-RL); use learned or none")
        return v

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, v: str) -> str:
        if v not in MLMT_VARIANTS:
            raise ValueError(unknown_message("variant", v, list(MLMT_VARIANTS)))
        return v

    def roles(self) -> Roles:
        return MLMT_VARIANTS[self.variant].roles

    @classmethod
    def variants(cls) -> dict[str, dict[str, object]]:
        return {name: {"variant": name} for name in MLMT_VARIANTS}

    def sample_factors(self) -> dict[str, int]:
        return {"group_size": self.group_size, "feedbacks": self.feedbacks, "refinements": self.refinements}
