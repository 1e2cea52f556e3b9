"""The declared step plan (issue 36): one description of a step's turns and how each is trained,
read by the rollout (its program), credit (``role_items``), the trainer (``check``) and ``plan``
(tests/test_plan.py runs its parity over every registered algorithm × variant)."""

from __future__ import annotations

import pytest
import torch

from mlmt_bench import registry
from mlmt_bench.algorithms.base import Algorithm, CreditInputs
from mlmt_bench.algorithms.mlmt import MLMT
from mlmt_bench.algorithms.params import MLMT_VARIANTS, MLMTParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan, Training
from mlmt_bench.algorithms.update import TrainItem
from mlmt_bench.rollout.episodes import Program, Rollout, TurnSample
from mlmt_bench.types import Problem


def test_counts_multiply_down_the_tree_and_the_program_is_the_rollouts():
    plan = StepPlan.of(4, "critic", 3, 2, train={"attempt": POLICY, "feedback": POLICY})
    assert [plan.count(k, 5) for k in ("attempt", "feedback", "refine")] == [20, 60, 120]
    assert plan.program() == Program(attempts=4, feedback="critic", feedbacks=3, refinements=2)
    assert [t.kind for t in plan.trained()] == ["attempt", "feedback"] and plan.training("refine") is None
    assert plan.for_eval().program() == Program(attempts=1, feedback="critic", feedbacks=1, refinements=1)
    assert plan.for_eval().trained() == []
    one_turn = StepPlan.of(8, train={"attempt": POLICY})
    assert one_turn.program() == Program(attempts=8, feedback="none") and not one_turn.has("refine")
    assert one_turn.training("refine") is None
    with pytest.raises(ValueError, match="no refine turns"):
        one_turn.count("refine", 1)


@pytest.mark.parametrize("source", ["oracle", "null"])
def test_rule_written_feedback_is_not_generated_and_cannot_be_trained(source):
    plan = StepPlan.of(2, source, train={"attempt": POLICY, "refine": POLICY})
    assert plan.turn("feedback").writer == source and not plan.turn("feedback").generated
    assert plan.program().feedback == source
    with pytest.raises(ValueError, match="cannot be trained"):
        StepPlan.of(2, source, train={"feedback": POLICY})


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="does not generate"):
        StepPlan.of(2, train={"refine": POLICY})  # no feedback: no refinement
    with pytest.raises(ValueError, match="Training.kind"):
        Training("ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Training.context"):
        Training("policy", "z")  # type: ignore[arg-type]
    assert Training("distill", "x").auxiliary and Training("distill").teacher
    assert Training("sft").auxiliary and not Training("sft").teacher and not Training("shaped").auxiliary


def test_check_refuses_items_the_plan_does_not_declare():
    plan = StepPlan.of(2, "critic", train={"attempt": POLICY, "refine": Training("shaped", "x")})
    plan.check({"solver": [TrainItem([1], [2], 1.0), TrainItem([1], [2], 1.0, kind="shaped")]})
    with pytest.raises(ValueError, match="solver items trained as sft"):
        plan.check({"solver": [TrainItem([1], [2], 1.0, kind="sft")]})
    with pytest.raises(ValueError, match=r"critic items trained as policy.*declared: none"):
        plan.check({"critic": [TrainItem([1], [2], 1.0)]})
    plan.check({"critic": []})  # an empty list trains nothing


def test_an_algorithm_declares_its_step_once():
    with pytest.raises(TypeError, match="declares step_plan"):
        type("TwoDeclarations", (Algorithm,), {"program": lambda self, step: Program(2)})


def _tree(r1s, r2s):
    """One problem: an attempt per r1, one feedback each, one refinement per feedback with r2."""
    turns = []
    for r1, r2 in zip(r1s, r2s):
        turns.append(TurnSample("attempt", "solver", 0, None, [1], [3, 4], [0.0, 0.0], "a", reward=r1))
        turns.append(TurnSample("feedback", "critic", 0, len(turns) - 1, [5], [6], [0.0], "g"))
        turns.append(TurnSample("refine", "solver", 0, len(turns) - 1, [7], [8, 9, 10], [0.0] * 3, "y", reward=r2))
        turns[-3].children.append(len(turns) - 2)
        turns[-2].children.append(len(turns) - 1)
    return Rollout([Problem(id="0", benchmark="t", prompt="q")], turns, {"solver": 0, "critic": 0}, 0.0)


def test_a_variant_row_decides_which_solver_turns_train():
    """Credit trains what the variant's row of MLMT_VARIANTS declares, through the step plan:
    ``critic_only`` trains no solver turn (its items were built and thrown away before), and
    every variant's items pass the plan's check."""
    ro = _tree([1.0, 0.0], [1.0, 0.0])  # r1 + η·r̄2, r2 and ū all ±1 after standardisation
    for name, row in MLMT_VARIANTS.items():
        algo = MLMT(MLMTParams(group_size=2, value="none", variant=name), 10)
        plan = algo.step_plan(0)
        credit = algo.credit(ro, 0, CreditInputs())
        plan.check(credit.items)
        kinds = {ro.turns[i].kind for i, t in enumerate(ro.turns) if credit.advantages.get(i)}
        solver_trains = "solver" in row.roles.trained()
        trained_solver_turns = {t.kind for t in plan.trained() if t.writer == "solver"}
        assert trained_solver_turns == (set(row.solver_trains) if solver_trains else set()), name
        assert kinds >= trained_solver_turns  # advantages are still computed (logged) for every scored turn
        n_items = len(credit.items.get("solver", []))
        assert n_items == (2 * len(trained_solver_turns)), name  # ±1 advantages: every trained turn has an item
        assert credit.sampled.get("solver", 0) == n_items


def test_every_registered_algorithm_declares_a_plan_for_each_of_its_variants():
    for name in registry.algorithms.names():
        cls = registry.algorithms.get(name)
        for variant, over in cls.Params.variants().items():
            algo = cls(cls.Params.model_validate(over), 5)
            plan = algo.step_plan(0)
            assert plan.trained(), (name, variant)
            assert {t.writer for t in plan.trained()} <= {"solver", "critic"}
            assert algo.program(0) == plan.program() and algo.eval_program() == algo.eval_plan().program()
            assert algo.eval_program().attempts == 1


def test_role_items_trains_each_kind_as_declared_and_counts_what_it_samples():
    ro = _tree([1.0, 0.0], [0.0, 1.0])
    algo = MLMT(MLMTParams(group_size=2, value="none"), 10)
    plan = StepPlan.of(2, "critic", train={"attempt": POLICY, "refine": Training("sft", "x")})
    attempts, refines = ro.of_kind("attempt"), ro.of_kind("refine")
    items, sampled = algo.role_items(ro, plan, [("attempt", attempts, torch.tensor([1.0, -1.0]), 0.0),
                                                ("refine", refines, [0.5, 0.5], 0.0),
                                                ("feedback", ro.of_kind("feedback"), [1.0, -1.0], 0.0)])
    assert [it.kind for it in items] == ["policy", "policy", "sft", "sft"]
    assert sampled == 2  # the auxiliary sft items are not sampled sequences; feedback is not trained
    assert items[2].prompt_ids == [1] and items[2].teacher_prompt_ids == [7]  # context x: the attempt's prompt
