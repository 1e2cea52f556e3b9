"""The shared trainer: token-in/token-out bookkeeping, schedules, variants, resume."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import minimal_spec
from mlmt_bench import runner
from mlmt_bench.algorithms.base import CreditInputs
from mlmt_bench.rollout.chat import chat_ids
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, rollout
from mlmt_bench.spec import validate_run
from support import ScriptedBackend, build_trainer, launch_cli_process, make_spec


def test_mlmt_episode_is_token_in_token_out(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt")
    comp = runner.build(spec, progress=False)
    solver = comp.policies["solver"]
    prob = comp.train_problems[0]
    backend = ScriptedBackend(["1+2=3;#3", "step 1 wrong", "1+2=4;#4"])
    actors = Actors(solver, comp.policies["critic"], backend, comp.templates, comp.verifier)
    ro = rollout(Program(1, "critic", 1, 1), actors, [prob], Sampling(1.0, 1.0, 12, 12))
    attempt, feedback, refine = ro.turns
    tok, tpl = solver.tokenizer, comp.templates
    messages = [{"role": "user", "content": tpl.render_attempt(prob)},
                {"role": "assistant", "content": attempt.text},
                {"role": "user", "content": tpl.render_refine(feedback.text)},
                {"role": "assistant", "content": refine.text}]
    # the solver's whole conversation, as generated, equals the chat template of its messages
    assert refine.prompt_ids + refine.ids == chat_ids(tok, messages, add_generation_prompt=False)
    assert attempt.prompt_ids + attempt.ids == chat_ids(tok, messages[:2], add_generation_prompt=False)
    critic_msgs = [{"role": "user", "content": tpl.render_feedback(prob, attempt.text)},
                   {"role": "assistant", "content": feedback.text}]
    assert feedback.prompt_ids + feedback.ids == chat_ids(comp.policies["critic"].tokenizer, critic_msgs,
                                                          add_generation_prompt=False)


def test_trained_ids_are_the_generated_ids(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt")
    trainer = build_trainer(spec, tmp_path)
    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    feats, values, tokens = trainer.value_predictions(ro)
    # value_features: feedback_pool (the default): the last token's hidden state (128) beside its mean
    # over the feedback's tokens (128)
    assert feats.shape == (len(ro.of_kind("feedback")), 256) and values.shape == (len(ro.of_kind("feedback")),)
    assert tokens == sum(len(ro.turns[ro.turns[f].children[0]].prompt_ids) for f in ro.of_kind("feedback"))
    credit = trainer.algorithm.credit(ro, 0, CreditInputs(0.0, values))
    generated = {(tuple(t.prompt_ids), tuple(t.ids)) for t in ro.turns}
    for role in ("solver", "critic"):
        for it in credit.items[role]:
            assert (tuple(it.prompt_ids), tuple(it.ids)) in generated
    assert credit.items["solver"] and credit.items["critic"]


def _weights(policy):
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


def _changed(before, policy):
    after = policy.model.state_dict()
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("variant,solver_moves,critic_moves", [
    ("full", True, True), ("fixed_feedback", True, False)])
def test_variants_update_the_right_policies(tiny_ckpt, tmp_path, variant, solver_moves, critic_moves):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"variant": variant}, train={"steps": 1, "problems_per_step": 2})
    trainer = build_trainer(spec, tmp_path)
    s0, c0 = _weights(trainer.policies["solver"]), _weights(trainer.policies["critic"])
    trainer.train()
    assert _changed(s0, trainer.policies["solver"]) == solver_moves
    assert _changed(c0, trainer.policies["critic"]) == critic_moves


def test_shared_policy_is_one_model(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"variant": "shared_policy"},
                     train={"steps": 1, "problems_per_step": 2})
    trainer = build_trainer(spec, tmp_path)
    assert trainer.policies["critic"] is trainer.policies["solver"]
    trainer.train()
    rec = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"][0]
    assert rec["updated"] == ["critic", "solver"]
    assert len(trainer.optimizers) == 1


S, C, SC = {"solver"}, {"critic"}, {"solver", "critic"}


@pytest.mark.parametrize("schedule,tl,th,expected", [
    ("simultaneous", 1, 1, [SC] * 6),
    ("simultaneous", 2, 2, [SC] * 6),  # t_L, t_H only shape the alternate schedule
    ("alternate", 1, 1, [S, C, S, C, S, C]),
    ("alternate", 2, 2, [S, S, C, C, S, S]),  # (2, 2) is not (1, 1): METHOD.md v2
    ("alternate", 2, 1, [S, S, C, S, S, C]),
    ("alternate", 1, 2, [S, C, C, S, C, C])])
def test_bilevel_schedule(schedule, tl, th, expected):
    from mlmt_bench.algorithms.mlmt import MLMT
    from mlmt_bench.algorithms.params import MLMTParams

    algo = MLMT(MLMTParams(schedule=schedule, lower_steps=tl, upper_steps=th), total_steps=6)
    assert [algo.updates(s) for s in range(6)] == expected
    frozen = MLMT(MLMTParams(schedule=schedule, lower_steps=tl, upper_steps=th, variant="fixed_feedback"), 6)
    assert [frozen.updates(s) for s in range(6)] == [e & S for e in expected]


@pytest.mark.parametrize("variant,source", [("oracle_feedback", "oracle"), ("null_feedback", "null")])
def test_feedback_sources(tiny_ckpt, tmp_path, variant, source):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"variant": variant})
    trainer = build_trainer(spec, tmp_path)
    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    fbs = [t for t in ro.turns if t.kind == "feedback"]
    assert fbs and all(t.policy == source and t.ids == [] for t in fbs)
    if source == "null":
        assert {t.text for t in fbs} == {trainer.actors.templates.null_feedback}
    assert trainer.algorithm.updates(0) == {"solver"}


def test_self_correct_stage_one_trains_turn_one_only_through_kl(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "self_correct", {"stage1_frac": 0.5, "beta2": 0.1})
    trainer = build_trainer(spec, tmp_path)
    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    credit = trainer.algorithm.credit(ro, 0, CreditInputs(frac_done=0.0))
    items, stats = credit.items, credit.stats
    assert stats["stage"] == 1.0
    attempt_ids = {tuple(t.ids) for t in ro.turns if t.kind == "attempt"}
    first = [it for it in items["solver"] if tuple(it.ids) in attempt_ids and it.beta == 0.1]
    assert first and all(it.advantage == 0.0 for it in first)
    credit = trainer.algorithm.credit(ro, 0, CreditInputs(frac_done=0.6))
    assert credit.stats["stage"] == 2.0 and all(it.beta == 0.0 for it in credit.items["solver"])


def test_eval_metrics_are_logged(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", train={"steps": 1, "problems_per_step": 2})
    trainer = build_trainer(spec, tmp_path)
    final = trainer.train()
    for key in ("acc@t1", "acc@t2", "delta", "i->c", "c->i", "i->i", "correction_rate", "acc_oracle_gated",
                "feedback_effect", "feedback_sensitivity", "leakage_rate", "feedback_tokens", "feedback_share",
                "gen_tokens", "trained_tokens", "flops", "wall_s"):
        assert key in final, key
    rows = [json.loads(line) for line in (trainer.run_dir.path / "eval_problems.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 8 and {"t1", "t2", "t2_null"} <= set(rows[0])
    assert final["gen_tokens"] > 0 and final["flops"] > 0


def test_the_final_evaluation_logs_every_problems_episode(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", train={"steps": 1, "problems_per_step": 2})
    spec.eval.samples = 3
    trainer = build_trainer(spec, tmp_path)
    trainer.train()
    samples = trainer.run_dir.path / "samples.jsonl"
    by_step = {}
    for rec in map(json.loads, samples.read_text().splitlines()):
        by_step.setdefault(rec["step"], []).append(rec)
    assert sorted(by_step) == [0, 1] and len(by_step[0]) == 3  # eval.samples at step 0
    # the final evaluation: every evaluated problem, each with its whole episode
    assert [r["problem_id"] for r in by_step[1]] == [p.id for p in trainer.eval_problems]
    assert [t["kind"] for t in by_step[1][0]["turns"]] == ["attempt", "feedback", "refine"]

    spec.eval.final_samples = False  # off: the final evaluation logs eval.samples episodes too
    trainer.evaluate(time.perf_counter(), final=True)
    assert len(samples.read_text().splitlines()) == 3 + 8 + 3


# ---------------------------------------------------------------------------------------------
# resume after SIGKILL


def _spec_file(tmp_path, ckpt, out):
    d = minimal_spec()
    d.update(name="resume", output_dir=str(out), seed=1)
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt), "lr": 3e-3}}
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 4, "verifier": "parity-test"}
    d["algorithm"] = {"name": "grpo", "params": {"group_size": 4}}
    d["backend"] = {"max_new_tokens": 10}
    d["train"] = {"steps": 6, "problems_per_step": 2, "checkpoint_every": 2, "threads": 1}
    d["eval"] = {"every": 3}
    p = tmp_path / f"{out.name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _launch(tmp_path, args):
    return launch_cli_process(args)


def _final_state(run: Path):
    from safetensors.torch import load_file

    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    weights = load_file(str(ckpt / "solver" / "model.safetensors"))
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return ckpt.name, weights, final


def test_sigkill_then_resume_matches_uninterrupted_run(tiny_ckpt, tmp_path):
    full = _launch(tmp_path, ["run", str(_spec_file(tmp_path, tiny_ckpt, tmp_path / "full"))])
    assert full.wait(timeout=300) == 0, full.stderr.read()
    (full_run,) = (tmp_path / "full").iterdir()

    proc = _launch(tmp_path, ["run", str(_spec_file(tmp_path, tiny_ckpt, tmp_path / "killed"))])
    deadline = time.time() + 300
    run = None
    while time.time() < deadline:  # kill once step 3 is logged (after the checkpoint at step 2)
        runs = list((tmp_path / "killed").glob("resume-*"))
        if runs and (runs[0] / "metrics.jsonl").exists():
            run = runs[0]
            steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                     if line.endswith("}") and '"train"' in line]
            if 3 in steps:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert run is not None and json.loads((run / "manifest.json").read_text())["status"] == "running"

    resumed = _launch(tmp_path, ["run", "--resume", str(run)])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()

    name_a, w_a, m_a = _final_state(full_run)
    name_b, w_b, m_b = _final_state(run)
    assert name_a == name_b == "step-000006"
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)

    def strip(recs):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "gen_tok_per_s", "train_tok_per_s", "peak_mem_mb")
                 and not k.startswith("mem/")} for r in recs]

    assert strip(m_a) == strip(m_b)  # same records, every step exactly once
    train_steps = [r["step"] for r in m_b if r["kind"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "manifest.json").read_text())["status"] == "completed"


def test_sigterm_ends_a_run_as_ctrl_c_does(tiny_ckpt, tmp_path):
    """`kill` / `docker stop` (SIGTERM) mid-run: exit 130 and the manifest says interrupted (Python's
    default would end the process at once, leaving "running" and the trackers open), and it resumes."""
    proc = _launch(tmp_path, ["run", str(_spec_file(tmp_path, tiny_ckpt, tmp_path / "termed"))])
    deadline, run = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:  # stop once step 1 is logged
        runs = list((tmp_path / "termed").glob("resume-*"))
        if runs and '"train"' in ((runs[0] / "metrics.jsonl").read_text() if (runs[0] / "metrics.jsonl").exists()
                                  else ""):
            run = runs[0]
            break
        time.sleep(0.05)
    assert run is not None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 130
    assert "interrupted" in proc.stderr.read()
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    resumed = _launch(tmp_path, ["run", "--resume", str(run)])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert json.loads((run / "manifest.json").read_text())["status"] == "completed"


def test_lora_policy_trains_only_the_adapter_and_checkpoints_as_peft(tiny_ckpt, tmp_path):
    d = minimal_spec()
    d.update(output_dir=str(tmp_path / "runs"))
    d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2,
                                "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}}
    d["algorithm"] = {"name": "grpo", "params": {"group_size": 4, "beta": 0.1}}  # KL against the adapter-off base
    d["backend"] = {"max_new_tokens": 10}
    d["train"] = {"steps": 1, "problems_per_step": 2}
    d["eval"] = {"every": 0, "limit": 2}
    spec = validate_run(d, "test")
    trainer = build_trainer(spec, tmp_path)
    policy = trainer.policies["solver"]
    assert policy.is_lora and policy.ref_model is None
    before = _weights(policy)
    trainer.train()
    after = policy.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved)  # the base weights never move
    ckpt = trainer.run_dir.latest_checkpoint() / "solver"
    assert (ckpt / "adapter_config.json").exists() and (ckpt / "adapter_model.safetensors").exists()


def test_sequence_logprobs_runs_the_lm_head_only_where_tokens_are_trained(tiny_ckpt: Path) -> None:
    from mlmt_bench.algorithms.update import TrainItem, sequence_logprobs
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (7, 2), (5, 6)]  # (prompt, completion) lengths: L = 11, shortest prompt 3
    items = [TrainItem(torch.randint(5, 90, (p,), generator=gen).tolist(),
                       torch.randint(5, 90, (c,), generator=gen).tolist(), 0.0)
             for p, c in shapes]
    seen: list[tuple[int, ...]] = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        logp, mask, entropy = sequence_logprobs(model, items, tok.pad_token_id, with_entropy=True)
    hook.remove()
    assert seen == [(3, 11 - 2, model.config.vocab_size)]  # positions 2..10, not all 11
    assert logp.shape == mask.shape == entropy.shape == (3, 8)
    for b, it in enumerate(items):  # each row against its own full, unpadded forward pass
        ids = torch.tensor([it.prompt_ids + it.ids])
        with torch.no_grad():
            full = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        expected = full[len(it.prompt_ids) - 1:, :].gather(1, torch.tensor(it.ids)[:, None])[:, 0]
        torch.testing.assert_close(logp[b, mask[b]].double(), expected, atol=1e-5, rtol=0)
        assert int(mask[b].sum()) == len(it.ids)


def test_micro_batched_run_logs_peak_memory_per_phase(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"value": "learned", "beta": 0.1, "epochs": 2},
                     train={"steps": 1, "problems_per_step": 2, "micro_batch_tokens": 64})
    trainer = build_trainer(spec, tmp_path)
    trainer.train()
    records = trainer.run_dir.metrics()
    (train,) = [r for r in records if r["kind"] == "train"]
    assert train["micro_batches/solver"] > 1 and train["micro_batches/critic"] > 1
    phases = {f"mem/peak_mb/{p}" for p in ("rollout", "logprobs", "update", "value")}
    assert phases <= set(train) and all(train[k] > 0 for k in phases)
    assert train["mem/source"] == "cpu_rss" and train["peak_mem_mb"] >= max(train[k] for k in phases) - 0.1
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and all(r["mem/peak_mb/eval"] > 0 for r in evals)
