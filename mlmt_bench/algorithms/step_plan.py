"""An algorithm's step plan: which turns one training step generates, from which context, how
many per parent, and how each kind of turn is trained — declared once, from the algorithm's
parameters, and read by everything that needs it.

- the rollout runs :meth:`StepPlan.program` (``Algorithm.program`` is derived from the plan);
- credit builds its train items through ``Algorithm.role_items``, which takes each turn's
  :class:`Training` (its kind, its context) from the plan and gives an untrained turn no item;
- the trainer checks credit's items against the plan (:meth:`StepPlan.check`) before it updates;
- ``mlmt-bench plan`` counts generated, trained and re-read tokens from it (``plan/work.py``).

The turn tree is the one the rollout runs (``rollout/episodes.py``): G attempts per problem,
then, unless the feedback source is ``none``, K feedbacks per attempt (written by the critic
model, or by a rule: the benchmark's oracle or the fixed instruction g∅) and M refinements per
feedback.

How a turn is trained (:data:`TRAIN_KINDS`), as the shared update reads it
(``algorithms/update.py``, ``core.policy_loss_terms``):

``policy``   the policy loss (clipped ratio, or the registered loss the params select);
``shaped``   an off-policy response: policy shaping −A·π/(π + γ), no ratio or clip (Critique-GRPO);
``sft``      an auxiliary term: weight × (−log π), with its own token-mean normaliser;
``distill``  an auxiliary term: weight × KL(teacher ‖ π), the teacher being the same tokens read
             after the turn's own context (an extra forward pass per step).

Auxiliary turns get no π_old or π_ref pass and are not counted among the sequences sampled
(``constant_norm``). ``context: x`` trains a turn as a response to its problem alone (the
attempt's prompt) instead of the context it was generated from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from mlmt_bench.rollout.episodes import FeedbackSource, Program, TurnKind

TrainKind = Literal["policy", "shaped", "sft", "distill"]
TRAIN_KINDS: tuple[TrainKind, ...] = ("policy", "shaped", "sft", "distill")
AUXILIARY_KINDS: frozenset[str] = frozenset({"sft", "distill"})
Context = Literal["own", "x"]
#: Who writes a turn: a model role, or a rule (the benchmark's oracle, the fixed instruction g∅).
Writer = Literal["solver", "critic", "oracle", "null"]
MODEL_WRITERS = ("solver", "critic")


@dataclass(frozen=True)
class Training:
    """How a kind of turn is trained: ``kind`` (:data:`TRAIN_KINDS`), ``context`` (``own``: on the
    context it was generated from; ``x``: as a response to its problem alone)."""

    kind: TrainKind = "policy"
    context: Context = "own"

    def __post_init__(self) -> None:
        if self.kind not in TRAIN_KINDS:
            raise ValueError(f"Training.kind {self.kind!r}: expected one of {', '.join(TRAIN_KINDS)}")
        if self.context not in ("own", "x"):
            raise ValueError(f"Training.context {self.context!r}: expected own or x")

    @property
    def auxiliary(self) -> bool:
        """Trained in the auxiliary term (no π_old / π_ref pass, not a sampled sequence)."""
        return self.kind in AUXILIARY_KINDS

    @property
    def teacher(self) -> bool:
        """A distillation teacher reads the turn after its own context once per step."""
        return self.kind == "distill"


POLICY = Training()


class Trained(Protocol):
    """What :meth:`StepPlan.check` reads of a train item (``algorithms.update.TrainItem``)."""

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class TurnPlan:
    """One kind of turn of a step: who writes it, how many per parent (G per problem, K per
    attempt, M per feedback), and how it is trained (None: it is not)."""

    kind: TurnKind
    writer: Writer
    per_parent: int
    training: Training | None = None

    @property
    def generated(self) -> bool:
        """Written by a model (tokens generated and counted), not by a rule."""
        return self.writer in MODEL_WRITERS


@dataclass(frozen=True)
class StepPlan:
    """The turns of one step, root first, each the child of the one before (attempt, then
    feedback and refinement unless the feedback source is ``none``)."""

    turns: tuple[TurnPlan, ...]

    @classmethod
    def of(cls, attempts: int, feedback: FeedbackSource = "none", feedbacks: int = 1, refinements: int = 1, *,
           train: Mapping[str, Training | None]) -> StepPlan:
        """The rollout's tree: ``attempts`` per problem; unless ``feedback`` is ``none``,
        ``feedbacks`` per attempt (written by the critic role for the ``critic`` source, whichever
        model plays it, else by the rule the source names) and ``refinements`` per feedback.
        ``train``: kind of turn -> its :class:`Training` (absent or None: not trained); a kind
        the tree does not have is an error."""
        turns = [TurnPlan("attempt", "solver", attempts, train.get("attempt"))]
        if feedback != "none":
            writer: Writer = "critic" if feedback == "critic" else feedback
            turns += [TurnPlan("feedback", writer, feedbacks, train.get("feedback")),
                      TurnPlan("refine", "solver", refinements, train.get("refine"))]
        plan = cls(tuple(turns))
        unknown = set(train) - {t.kind for t in plan.turns}
        if unknown:
            raise ValueError(f"StepPlan: training declared for turns the step does not generate: {sorted(unknown)}")
        for t in plan.turns:
            if t.training is not None and not t.generated:
                raise ValueError(f"StepPlan: {t.kind} turns written by the {t.writer} rule cannot be trained")
        return plan

    # ---------------------------------------------------------------------------- reading it
    def has(self, kind: str) -> bool:
        return any(t.kind == kind for t in self.turns)

    def turn(self, kind: str) -> TurnPlan:
        for t in self.turns:
            if t.kind == kind:
                return t
        raise ValueError(f"this step generates no {kind} turns (it generates {', '.join(t.kind for t in self.turns)})")

    def training(self, kind: str) -> Training | None:
        """How ``kind`` turns are trained; None when they are not (or the step has none)."""
        return self.turn(kind).training if self.has(kind) else None

    def trained(self) -> list[TurnPlan]:
        return [t for t in self.turns if t.training is not None]

    def count(self, kind: str, problems: int) -> int:
        """Turns of ``kind`` over ``problems`` problems: the product of per-parent counts down the tree."""
        n = problems
        for t in self.turns:
            n *= t.per_parent
            if t.kind == kind:
                return n
        raise ValueError(f"this step generates no {kind} turns")

    def program(self) -> Program:
        """What the rollout runs (``rollout/episodes.py``)."""
        attempt = self.turn("attempt")
        if not self.has("feedback"):
            return Program(attempts=attempt.per_parent, feedback="none")
        fb = self.turn("feedback")
        source: FeedbackSource = "critic" if fb.generated else fb.writer  # type: ignore[assignment]  # oracle | null
        return Program(attempts=attempt.per_parent, feedback=source, feedbacks=fb.per_parent,
                       refinements=self.turn("refine").per_parent)

    def for_eval(self) -> StepPlan:
        """One greedy episode per problem with the same turns, nothing trained."""
        return StepPlan(tuple(replace(t, per_parent=1, training=None) for t in self.turns))

    # ---------------------------------------------------------------------------- checking credit
    def kinds_of(self, role: str) -> set[str]:
        """The training kinds the plan declares for turns written by ``role``."""
        return {t.training.kind for t in self.trained() if t.writer == role and t.training is not None}

    def check(self, items: Mapping[str, Sequence[Trained]]) -> None:
        """Raise ValueError when credit handed in an item the plan does not declare: a role none
        of whose turns is trained, or a training kind no turn of that role has."""
        for role, role_items in items.items():
            allowed = self.kinds_of(role)
            bad = sorted({it.kind for it in role_items} - allowed)
            if bad:
                declared = ", ".join(sorted(allowed)) or "none"
                raise ValueError(f"credit returned {role} items trained as {', '.join(bad)}, which the step plan "
                                 f"does not declare for {role} turns (declared: {declared})")

