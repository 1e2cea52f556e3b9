"""The further arms of METHOD.md v2 (critique_grpo, self_distill) and the GRPO-family options
(overlong shaping, truncated-completion masking, dynamic sampling): credit and losses on hand-built
episodes, checked against numbers computed by hand, and one training step of each arm."""

from __future__ import annotations

import pytest
import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.base import CreditInputs
from mlmt_bench.algorithms.critique_grpo import CritiqueGRPO, CritiqueGRPOParams
from mlmt_bench.algorithms.grpo import GRPO
from mlmt_bench.algorithms.params import GRPOParams
from mlmt_bench.algorithms.self_distill import SelfDistill, SelfDistillParams
from mlmt_bench.algorithms.update import LossConfig, TrainItem, update_policy
from mlmt_bench.rollout.episodes import Rollout, TurnSample, merge_rollouts
from mlmt_bench.types import Problem

DONE = CreditInputs(frac_done=1.0)


def episode(problem: int, r1: float, r2: float | None, turns: list, *, length: int = 2, finish="stop"):
    """One attempt (prompt [1, problem]), and if r2 is given a feedback and a refinement."""
    turns.append(TurnSample("attempt", "solver", problem, None, [1, problem], [3] * length, [0.0] * length, "z",
                            finish, reward=r1))
    a = len(turns) - 1
    if r2 is None:
        return
    turns.append(TurnSample("feedback", "critic", problem, a, [7, problem], [8], [0.0], "g"))
    f = len(turns) - 1
    turns[a].children.append(f)
    turns.append(TurnSample("refine", "solver", problem, f, [1, problem, 3, 3, 8], [5, 6], [0.0, 0.0], "y", reward=r2))
    turns[f].children.append(len(turns) - 1)


def rollout_of(rows):
    turns: list = []
    for problem, r1, r2 in rows:
        episode(problem, r1, r2, turns)
    n = 1 + max(p for p, _, _ in rows)
    return Rollout([Problem(id=str(i), benchmark="t", prompt="q") for i in range(n)], turns, {"solver": 0}, 0.0)


def test_critique_grpo_mixes_correct_refinements_into_the_group_as_responses_to_x():
    # one problem, G = 2: attempts r1 = [0, 0]; refinements r2 = [1, 0] -> only the first joins
    ro = rollout_of([(0, 0.0, 1.0), (0, 0.0, 0.0)])
    algo = CritiqueGRPO(CritiqueGRPOParams(group_size=2), 10)
    assert algo.roles().critic == "frozen" and algo.program(0).feedback == "critic"
    c = algo.credit(ro, 0, DONE)
    # mixed group [0, 0, 1]: mean 1/3, sample std 0.5774 -> [-0.5774, -0.5774, 1.1547]
    advs = [c.advantages[i] for i in (0, 3, 2)]
    # the wrong refinement stays out
    assert advs == pytest.approx([-0.5774, -0.5774, 1.1547], abs=1e-4) and 5 not in c.advantages
    off = [it for it in c.items["solver"] if it.kind == "shaped"]
    assert len(off) == 1 and off[0].prompt_ids == [1, 0] and off[0].ids == [5, 6]  # x alone, the refinement's ids
    assert c.sampled == {"solver": 3}
    # all refinements: group [0, 0, 1, 0]
    c = CritiqueGRPO(CritiqueGRPOParams(group_size=2, refinements_in_group="all"), 10).credit(ro, 0, DONE)
    assert c.advantages[2] == pytest.approx(1.5, abs=1e-4) and c.advantages[5] == pytest.approx(-0.5, abs=1e-4)
    assert CritiqueGRPO(CritiqueGRPOParams(critique_source="oracle"), 10).roles().critic == "absent"


@pytest.mark.parametrize("distill,mode", [("sft", "sft"), ("kl", "distill")])
def test_self_distill_is_grpo_plus_a_weighted_distillation_of_the_refinements(distill, mode):
    ro = rollout_of([(0, 1.0, 1.0), (0, 0.0, 1.0), (0, 0.0, 0.0)])
    c = SelfDistill(SelfDistillParams(group_size=3, distill=distill, delta=0.25), 10).credit(ro, 0, DONE)
    # GRPO on r1 = [1, 0, 0]: mean 1/3, std 0.5774 -> [1.1547, -0.5774, -0.5774]
    assert [c.advantages[i] for i in (0, 3, 6)] == pytest.approx([1.1547, -0.5774, -0.5774], abs=1e-4)
    aux = [it for it in c.items["solver"] if it.kind == mode]
    assert len(aux) == 2 and all(it.advantage == 0.25 and it.prompt_ids[:2] == [1, 0] for it in aux)
    assert all(it.teacher_prompt_ids == [1, 0, 3, 3, 8] for it in aux)  # the feedback-conditioned context
    assert c.sampled == {"solver": 3} and "critic" not in c.items
    trained = SelfDistill(SelfDistillParams(group_size=3, critique_source="mlmt"), 10)
    assert trained.roles().critic == "trained"
    c = trained.credit(ro, 0, DONE)
    assert len(c.items["critic"]) == 3  # ū = [1, 1, 0] over the problem's feedbacks: all non-zero


def test_auxiliary_term_by_hand(tiny_ckpt):
    """SFT: δ·(−log π(y|x)) averaged over the term's tokens; DISTILL: δ·KL(teacher ‖ π) likewise."""
    from mlmt_bench.models.forward import completion_logits
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    sft = TrainItem([10, 11], [12, 13, 14], 0.5, kind="sft")
    kl = TrainItem([10, 11], [15, 16], 0.5, kind="distill", teacher_prompt_ids=[20, 21, 22, 10, 11])
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([[10, 11, 12, 13, 14]])).logits[0], -1)
        nll = -sum(lp[i + 1, t].item() for i, t in enumerate([12, 13, 14]))
        s_logits, _ = completion_logits(model, [kl], tok.pad_token_id)
        t_logits, _ = completion_logits(model, [kl], tok.pad_token_id, [kl.teacher_prompt_ids])
        kl_sum = float(core.distill_kl(s_logits, t_logits).sum())
    policy = Policy("solver", model, tok, True, 1e-3, 1, init_path=str(tiny_ckpt))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = update_policy(policy, opt, None, [sft, kl], LossConfig(0.2, 0.2, "token_mean", 1, 1, 1e9))
    assert stats["aux_loss"] == pytest.approx(0.5 * (nll + kl_sum) / 5, rel=1e-5)
    assert kl_sum > 0 and stats["trained_tokens"] == 5 and stats["loss"] == 0.0


def test_overlong_shaping_and_truncated_masking():
    assert core.overlong_penalty(torch.tensor([10, 16, 18, 20]), 20, 4, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0]
    turns: list = []
    episode(0, 1.0, None, turns, length=18)
    episode(0, 0.0, None, turns, length=4)
    episode(0, 1.0, None, turns, length=20, finish="length")
    ro = Rollout([Problem(id="0", benchmark="t", prompt="q")], turns, {"solver": 0}, 0.0)
    params = GRPOParams(group_size=3, overlong_buffer=4, mask_truncated=True)
    c = GRPO(params, 10).credit(ro, 0, CreditInputs(1.0, max_new_tokens=20))
    # shaped rewards [1 - 0.5, 0, 1 - 1] = [.5, 0, 0]: mean 1/6, std .2887 -> [1.1547, -.5774, -.5774]
    assert [c.advantages[i] for i in range(3)] == pytest.approx([1.1547, -0.5774, -0.5774], abs=1e-4)
    assert len(c.items["solver"]) == 2  # the truncated completion is out of the loss, not of the group


def test_dynamic_sampling_counts_informative_groups_and_merges_rollouts():
    a = rollout_of([(0, 1.0, None), (0, 1.0, None), (1, 0.0, None), (1, 1.0, None)])
    b = rollout_of([(0, 0.0, None), (0, 1.0, None)])
    algo = GRPO(GRPOParams(group_size=2, dynamic_sampling=True), 10)
    assert algo.informative(a) == {1}
    m = merge_rollouts(a, b)
    assert len(m.problems) == 3 and algo.informative(m) == {1, 2}
    assert [t.problem for t in m.turns] == [0, 0, 1, 1, 2, 2]


def _spec(tmp_path, ckpt, algo, params):
    from conftest import minimal_spec
    from mlmt_bench.spec import validate_run

    d = minimal_spec()
    d["output_dir"] = str(tmp_path / "runs")
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt), "lr": 1e-2},
                     "critic": {"model": "tiny", "path": str(ckpt)}}
    d["algorithm"] = {"name": algo, "params": {"group_size": 2, **params}}
    d["backend"] = {"max_new_tokens": 8}
    d["train"] = {"steps": 1, "problems_per_step": 2}
    d["eval"] = {"every": 0, "limit": 2}
    return validate_run(d, "test")


@pytest.mark.parametrize("algo,params", [
    ("critique_grpo", {"critique_source": "oracle", "refinements_in_group": "all"}),
    ("self_distill", {"distill": "kl", "distill_on": "all", "critique_source": "oracle"}),
    ("self_distill", {"critique_source": "mlmt", "distill_on": "all"}),
    ("grpo", {"dynamic_sampling": True, "ratio": "sequence", "loss": "cispo", "overlong_buffer": 2}),
])
def test_one_training_step_of_each_arm(tiny_ckpt, tmp_path, algo, params):
    from mlmt_bench import runner
    from mlmt_bench.tracking import RunDir
    from support import ParityVerifier

    spec = _spec(tmp_path, tiny_ckpt, algo, params)
    comp = runner.build(spec, progress=False)
    comp.verifier = ParityVerifier()
    trainer = runner.make_trainer(spec, comp, RunDir.create(spec.output_dir, spec.name, "", spec.seed))
    before = {k: v.clone() for k, v in trainer.policies["solver"].model.state_dict().items()}
    trainer.train()
    after = trainer.policies["solver"].model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rec = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"][0]
    assert rec["flops"] > 0 and rec["gen_tokens"] > 0
    if params.get("dynamic_sampling"):
        assert "dynamic_sampling/rounds" in rec
    if algo == "self_distill":
        assert rec["aux_loss/solver"] > 0
