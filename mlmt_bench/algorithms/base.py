"""What an algorithm is (METHOD.md): an episode program, a credit assignment, an update schedule,
and the roles it plays.

The trainer never branches on the algorithm: it builds the policies :meth:`Algorithm.roles`
names, asks for the step plan of a step (:meth:`Algorithm.step_plan`: the turns generated and
how each is trained, ``algorithms/step_plan.py``) and rolls out its program, hands the rollout
(and, for an algorithm with a value model, the value predictions it computed) to
:meth:`Algorithm.credit`, checks the items credit returns against the plan, and updates the roles
:meth:`Algorithm.updates` names with them.

Credit is pure: it reads rewards from the rollout (and values from its inputs) and returns
advantages as train items; it never writes into the rollout and never runs a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.advantages import estimator
from mlmt_bench.algorithms.params import LossParams, Roles
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan, Training
from mlmt_bench.algorithms.update import TrainItem
from mlmt_bench.models.tokenizer import encode
from mlmt_bench.rollout.episodes import Program, Rollout

if TYPE_CHECKING:

    from mlmt_bench.algorithms.value import ValueModel
    from mlmt_bench.types import Problem


#: Turns of one kind for :meth:`Algorithm.role_items`: (kind, turn indices, advantages or
#: weights ``[N]``, KL weight).
Part = tuple[str, Sequence[int], "torch.Tensor | Sequence[float]", float]


@dataclass
class CreditInputs:
    """What credit may use besides the rollout: the share of training done, the value model's
    predictions ``[F]`` for the contexts :meth:`Algorithm.value_contexts` named, the solver's
    generation limit (for overlong shaping; 0: unknown), and ``verdict_match`` ``[F]``: per
    feedback of the rollout (``of_kind("feedback")`` order), 1.0 where its verdict on its attempt
    matches the verifier's judgement of that attempt, else 0.0 (see :func:`verdict_matches`;
    None: not read)."""

    frac_done: float = 0.0
    values: torch.Tensor | None = None
    max_new_tokens: int = 0
    verdict_match: torch.Tensor | None = None


@dataclass
class Credit:
    """What credit assignment returns.

    items:      train items per role (turns with a gradient);
    sampled:    sequences of each role sampled this step (``constant_norm`` counts them all,
                zero-advantage ones included);
    advantages: advantage of every generated turn credit scored, by turn index;
    rewards:    the reward credit used where it is not the verifier's (the critic's R_H), by turn index;
    stats:      logged statistics.
    """

    items: dict[str, list[TrainItem]]
    sampled: dict[str, int]
    advantages: dict[int, float] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    def merged(self, other: Credit) -> Credit:
        """A new Credit holding this one's roles, turns and stats and ``other``'s (another role's
        credit, e.g. :func:`mlmt_bench.algorithms.critic_credit.critic_credit`'s); neither is changed."""
        return Credit({**self.items, **other.items}, {**self.sampled, **other.sampled},
                      {**self.advantages, **other.advantages}, {**self.rewards, **other.rewards},
                      {**self.stats, **other.stats})


class Algorithm:
    """Base class: subclasses set ``Params`` and implement :meth:`program` and :meth:`credit`."""

    #: The algorithm's parameters (``algorithm.params`` of a spec): declared here once, read by
    #: validation (``spec.algorithm_params_model``), the trainer and ``plan``. Default: the shared
    #: clipped loss's alone.
    Params: ClassVar[type[LossParams]] = LossParams
    #: Whether a step's work depends on the share of the budget spent (``CreditInputs.frac_done``):
    #: then a run read at a smaller budget (``report --at-flops``) is not one stopped there.
    budget_dependent: ClassVar[bool] = False
    #: How a refinement trained as a response to x alone (``to_x``) reads as one: the benchmark's
    #: :meth:`Benchmark.full_response`, tokenised by the solver's tokenizer. The runner hands it in
    #: (mlmt_bench/runner.py, ``build``); None: the refinement's own ids.
    response_to_x: ResponseToX | None = None

    def __init__(self, params: LossParams, total_steps: int) -> None:
        if not isinstance(params, LossParams):  # the contract the trainer, plan and validation read
            raise TypeError(f"{type(self).__name__}: its Params must subclass mlmt_bench.algorithms.params.LossParams, "
                            f"got {type(params).__name__}")
        self.params = params
        self.total_steps = total_steps

    def roles(self) -> Roles:
        """Which policies this algorithm needs and what it does with each: its parameters say
        (``Params.roles()``; one trained solver unless they say otherwise)."""
        return self.params.roles()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for derived in ("program", "eval_program", "eval_plan"):
            if derived in vars(cls):  # one declaration: a second would drift from the plan
                raise TypeError(f"{cls.__name__} defines {derived}(): an algorithm declares step_plan(step) "
                                f"(mlmt_bench/algorithms/step_plan.py) and the program follows from it")

    def step_plan(self, step: int) -> StepPlan:
        """The turns ``step`` generates and how each is trained (from the params): what the
        rollout runs, credit trains, the trainer checks and ``mlmt-bench plan`` counts."""
        raise NotImplementedError

    def program(self, step: int) -> Program:
        """The rollout's program of ``step``: :meth:`step_plan`'s."""
        return self.step_plan(step).program()

    def eval_plan(self) -> StepPlan:
        """One greedy episode per problem with the final step's turns, nothing trained."""
        return self.step_plan(self.total_steps).for_eval()

    def eval_program(self) -> Program:
        return self.eval_plan().program()

    def updates(self, step: int) -> set[str]:
        """Roles updated at ``step`` (default: every trained role, every step)."""
        return set(self.roles().trained())

    @property
    def value_model(self) -> ValueModel | None:
        """The value model whose predictions credit needs (None: no value model)."""
        return None

    def value_contexts(self, rollout: Rollout) -> list[list[int]]:
        """Token-id contexts the value model predicts for (one per value in ``CreditInputs.values``)."""
        return []

    def value_spans(self, rollout: Rollout) -> list[tuple[int, int]] | None:
        """A token span ``(start, end)`` per value context whose hidden states the value's features
        also pool (mean) beside the last token's; None: the last token's state alone."""
        return None

    def value_targets(self, rollout: Rollout) -> tuple[list[int], torch.Tensor]:
        """(index into :meth:`value_contexts` of each target, targets) the value model is fitted on."""
        return [], torch.zeros(0)

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        raise NotImplementedError

    def informative(self, rollout: Rollout) -> set[int]:
        """Problems of ``rollout`` whose groups carry a gradient (dynamic sampling keeps sampling
        until ``problems_per_step`` of them): by default those whose attempts' rewards differ."""
        by_problem: dict[int, set[float]] = {}
        for i in rollout.of_kind("attempt"):
            by_problem.setdefault(rollout.turns[i].problem, set()).add(float(rollout.turns[i].scored_reward))
        return {p for p, rs in by_problem.items() if len(rs) > 1}

    # loss-variant helpers shared by every algorithm's credit ------------------------------
    def solver_rewards(self, rollout: Rollout, indices: Sequence[int], inputs: CreditInputs,
                       lengths: Sequence[int] | None = None) -> torch.Tensor:
        """Verifier rewards of solver turns, with DAPO's overlong shaping when the params ask for it
        (on ``lengths``, default the turns' own: those of what is trained, e.g. full responses)."""
        r = rewards(rollout, indices)
        buffer = self.params.overlong_buffer
        if buffer and inputs.max_new_tokens:
            n = torch.tensor(list(lengths) if lengths is not None else [len(rollout.turns[i].ids) for i in indices])
            r = r + core.overlong_penalty(n, inputs.max_new_tokens, buffer, self.params.overlong_penalty)
        return r

    def role_items(self, rollout: Rollout, plan: StepPlan, parts: Sequence[Part]) -> tuple[list[TrainItem], int]:
        """One role's train items and sampled count from ``parts``: each ``(kind, indices,
        advantages, beta)``, turns of one kind with their advantages (or weights) and KL weight,
        trained as ``plan`` declares that kind (:class:`Training`: kind and context). A kind the
        plan does not train gives no item; the sampled count (``constant_norm``) is the turns of
        the trained, non-auxiliary parts."""
        items: list[TrainItem] = []
        sampled = 0
        for kind, indices, advantages, beta in parts:
            training = plan.training(kind)
            if training is None:
                continue
            assert all(rollout.turns[i].kind == kind for i in indices), f"role_items: not every turn is a {kind}"
            items += self.items(rollout, indices, advantages, beta, training)
            sampled += 0 if training.auxiliary else len(indices)
        return items, sampled

    def items(self, rollout: Rollout, indices: Sequence[int], advantages: torch.Tensor | Sequence[float],
              beta: float, training: Training = POLICY) -> list[TrainItem]:
        """:func:`train_items`, without the completions cut by the token limit when ``mask_truncated``."""
        if self.params.mask_truncated:
            keep = [k for k, i in enumerate(indices) if rollout.turns[i].finish_reason != "length"]
            advs = advantages.tolist() if isinstance(advantages, torch.Tensor) else list(advantages)
            indices, advantages = [indices[k] for k in keep], [advs[k] for k in keep]
        return train_items(rollout, indices, advantages, beta, training, self.response_to_x)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# ------------------------------------------------------------------------------------------
# Pure helpers every algorithm's credit uses


def rewards(rollout: Rollout, indices: Sequence[int]) -> torch.Tensor:
    """``[N]`` verifier rewards of the turns at ``indices`` (float64)."""
    return torch.tensor([float(rollout.turns[i].scored_reward) for i in indices], dtype=torch.float64)


def reward_stats(r1: torch.Tensor, r2: torch.Tensor | None, reward: torch.Tensor) -> dict[str, float]:
    """The reward statistics every algorithm logs: ``r1`` and ``r2``, the mean verifier rewards of the
    attempts ``[N1]`` and of the refinements ``[N2]`` (no ``r2`` for a one-turn algorithm: None;
    0.0 when there is none), and ``reward_mean`` / ``reward_std`` of ``reward``, the rewards the
    algorithm's main group advantage is computed on (its r1 or its r2; std 0.0 for one value)."""
    out = {"r1": float(r1.mean())}
    if r2 is not None:
        out["r2"] = float(r2.mean()) if len(r2) else 0.0
    out.update(reward_mean=float(reward.mean()), reward_std=float(reward.std()) if len(reward) > 1 else 0.0)
    return out


def problem_of(rollout: Rollout, indices: Sequence[int]) -> list[int]:
    """The problem index of each turn: the usual sibling group."""
    return [rollout.turns[i].problem for i in indices]


def group_advantages(values: torch.Tensor, groups: Sequence[int], advantage: str) -> tuple[torch.Tensor, float]:
    """Advantages ``[N]`` of ``values`` by the estimator ``advantage`` (a name of
    :data:`mlmt_bench.algorithms.advantages.ADVANTAGES`: the params' :meth:`LossParams.advantage_of`
    the role) over the sibling ``groups``, and the share of zero-variance groups."""
    gid = torch.tensor(list(groups), dtype=torch.long)
    return estimator(advantage)(values, gid), core.frac_zero_std(values, gid)


def train_items(rollout: Rollout, indices: Sequence[int], advantages: torch.Tensor | Sequence[float],
                beta: float, training: Training = POLICY, respond: ResponseToX | None = None) -> list[TrainItem]:
    """Train items of the turns at ``indices`` with a non-zero gradient (advantage ≠ 0 or a KL term).

    Dropping zero-advantage turns saves their forward/backward pass and takes them out of the
    token_mean normaliser (as with DAPO's dynamic sampling, a flat group leaves the batch);
    ``constant_norm`` still counts them, through :attr:`Credit.sampled`.

    ``training``: how the turns are trained (:class:`Training`: the item's kind, and its context).
    With ``context: x`` each turn (a refinement) is trained as a response to the problem alone: its
    context becomes its attempt's prompt x, and its own context (x, z, g) is kept as the teacher's
    (``TrainItem.teacher_prompt_ids``, for "distill"). Its ids are those of its full response
    (``respond``, :class:`ResponseToX`; the refinement's own without it), so that π_old, π_ref and
    policy shaping read the full response. "distill" keeps the refinement's own ids, the only
    tokens its teacher (x, z, g) has distributions for, and puts the attempt's kept part before
    them (the full response's text before the refinement) in the student's context x.
    """
    advs = advantages.tolist() if isinstance(advantages, torch.Tensor) else list(advantages)
    out = []
    for i, a in zip(indices, advs):
        turn = rollout.turns[i]
        if not turn.ids or (a == 0.0 and beta <= 0):
            continue
        if training.context == "own":
            out.append(TrainItem(turn.prompt_ids, turn.ids, a, beta, training.kind))
            continue
        x = rollout.turns[ancestor(rollout, i, 2)].prompt_ids
        full, kept = response_to_x(rollout, i, respond)
        if training.kind == "distill":
            out.append(TrainItem(x + (kept or []), turn.ids, a, beta, training.kind, turn.prompt_ids))
        else:
            out.append(TrainItem(x, full, a, beta, training.kind, turn.prompt_ids))
    return out


@dataclass(frozen=True)
class ResponseToX:
    """A refinement read as a complete response to its problem alone (what ``critique_grpo`` and
    ``self_distill`` train as a response to x): ``full_response`` (the benchmark's
    :meth:`Benchmark.full_response`) of (problem, attempt text, refinement text), tokenised by
    ``tokenizer`` (the solver's). A pure function of the rollout: credit calls it and stays pure.
    """

    full_response: Callable[[Problem, str, str], str]
    tokenizer: Any

    def __call__(self, rollout: Rollout, index: int) -> tuple[list[int], list[int] | None]:
        """(ids, kept) of refinement turn ``index``: ids are the full response's tokens with EOS
        where the refinement ended with it (the refinement's own ids when the full response is its
        text); kept are the tokens of the full response's text before the refinement's (empty when
        they are the same text; None when the full response does not end with the refinement)."""
        turn = rollout.turns[index]
        attempt = rollout.turns[ancestor(rollout, index, 2)]
        text = self.full_response(rollout.problems[turn.problem], attempt.text, turn.text)
        if text == turn.text:
            return turn.ids, []
        eos = self.tokenizer.eos_token_id
        tail = turn.ids[-1:] if turn.ids and eos is not None and turn.ids[-1] == eos else []
        kept = encode(self.tokenizer, text[:len(text) - len(turn.text)]) if text.endswith(turn.text) else None
        return encode(self.tokenizer, text) + tail, kept


def response_to_x(rollout: Rollout, index: int, respond: ResponseToX | None) -> tuple[list[int], list[int] | None]:
    """:class:`ResponseToX` of turn ``index``, or (its own ids, no kept part) without one."""
    return respond(rollout, index) if respond is not None else (rollout.turns[index].ids, [])


def verdict_matches(rollout: Rollout, verdict: Callable[[str], bool | None]) -> torch.Tensor:
    """``[F]`` per feedback turn: 1.0 where ``verdict(feedback text)`` (True = "the attempt is
    right", :meth:`Benchmark.feedback_verdict`) equals whether its parent attempt is correct
    (the verifier's verdict; reward == 1 where it left none), 0.0 otherwise, an unreadable
    verdict (None) included. For ``CreditInputs.verdict_match``."""
    out = []
    for f in rollout.of_kind("feedback"):
        fb = rollout.turns[f]
        assert fb.parent is not None
        attempt = rollout.turns[fb.parent]
        correct = bool(attempt.verdict.correct) if attempt.verdict is not None else attempt.reward == 1.0
        says = verdict(fb.text)
        out.append(1.0 if says is not None and says == correct else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def by_turn(indices: Sequence[int], values: torch.Tensor) -> dict[int, float]:
    """``{turn index: value}`` for :attr:`Credit.advantages` / :attr:`Credit.rewards`."""
    return dict(zip(indices, values.tolist()))


def ancestor(rollout: Rollout, index: int, levels: int) -> int:
    """The turn ``levels`` generations above ``index`` (refine -> feedback -> attempt)."""
    for _ in range(levels):
        parent = rollout.turns[index].parent
        assert parent is not None
        index = parent
    return index
