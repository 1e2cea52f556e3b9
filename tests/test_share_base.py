"""``policies.share_base``: solver and critic as two named LoRA adapters on one frozen base.

Not the warm-start base (tests/test_shared_base.py): here one model object carries both roles.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
import yaml

from mlmt_bench.errors import UserError
from mlmt_bench.spec import validate_run
from support import build_trainer, launch_cli_process, make_spec, one_line_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _spec(tmp_path, ckpt, share: bool, variant: str = "full", steps: int = 2, beta: float = 0.05,
          decode: str = "generate"):
    """An mlmt spec whose roles are LoRA adapters (solver lr 1e-2, critic 5e-3) on the tiny ``ckpt``."""
    raw = make_spec(tmp_path / ("one" if share else "two"), ckpt, "mlmt", {"variant": variant, "beta": beta},
                    train={"steps": steps, "problems_per_step": 2}).model_dump(mode="json")
    raw["policies"]["share_base"] = share
    raw["backend"]["options"] = {"decode": decode}
    for role, lr in (("solver", 1e-2), ("critic", 5e-3)):
        raw["policies"][role].update(lora=LORA, lr=lr)
    return validate_run(raw, "test")


def _trainer(spec, tmp_path):
    """The trainer of ``spec``, torch seeded as a run seeds it (the adapters' initial weights draw from it)."""
    from mlmt_bench.runner import configure_torch

    configure_torch(spec)
    return build_trainer(spec, tmp_path)


def _adapter(policy) -> dict[str, torch.Tensor]:
    """The role's adapter weights, keyed as peft saves them (no adapter name)."""
    from peft import get_peft_model_state_dict

    from mlmt_bench.models.adapters import AdapterView

    if isinstance(policy.model, AdapterView):
        state = policy.model.adapter_state()
    else:
        state = get_peft_model_state_dict(policy.model)
    return {k: v.detach().clone() for k, v in state.items()}


def test_one_base_run_equals_two_lora_models_on_the_same_base(tiny_ckpt, tmp_path):
    """Same seeds, same data: the losses agree to 1e-6 and so do both roles' adapter weights."""
    runs = {}
    for share in (False, True):
        trainer = _trainer(_spec(tmp_path, tiny_ckpt, share), tmp_path)
        start = {r: _adapter(trainer.policies[r]) for r in ("solver", "critic")}
        trainer.train()
        train = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"]
        runs[share] = (trainer, start, train)
    (two, start2, m2), (one, start1, m1) = runs[False], runs[True]
    assert one.policies["solver"].model.base is one.policies["critic"].model.base  # one model object
    assert len(one.optimizers) == len(two.optimizers) == 2
    for role in ("solver", "critic"):
        assert start1[role].keys() == start2[role].keys()
        assert all(torch.equal(start1[role][k], start2[role][k]) for k in start1[role])  # same initial adapters
        w1, w2 = _adapter(one.policies[role]), _adapter(two.policies[role])
        assert any(not torch.equal(w1[k], start1[role][k]) for k in w1)  # it trained
        assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-6
    assert [r["updated"] for r in m1] == [r["updated"] for r in m2] == [["critic", "solver"]] * 2
    for a, b in zip(m1, m2):
        for key in ("loss/solver", "loss/critic", "kl/solver", "kl/critic", "reward_mean"):
            assert abs(a[key] - b[key]) < 1e-6, key
        for key in ("gen_tokens", "trained_tokens", "flops"):  # the report's cost columns: the same run's
            assert a[key] == b[key], key
    base_one = one.policies["solver"].model.get_base_model()
    base_two = two.policies["solver"].model.get_base_model()
    frozen = {k: v for k, v in base_one.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(v, base_two.state_dict()[k]) for k, v in frozen.items())  # the base never moved


@pytest.mark.parametrize("role,other", [("solver", "critic"), ("critic", "solver")])
def test_an_update_leaves_the_other_adapter_bytes_unchanged(tiny_ckpt, tmp_path, role, other):
    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, steps=1), tmp_path)
    from mlmt_bench.rollout.episodes import rollout

    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    feats, values, _ = trainer.value_predictions(ro)
    from mlmt_bench.algorithms.base import CreditInputs

    credit = trainer.algorithm.credit(ro, 0, CreditInputs(0.0, values))
    before = {r: _adapter(trainer.policies[r]) for r in ("solver", "critic")}
    base_before = {k: v.clone() for k, v in trainer.policies[role].model.get_base_model().state_dict().items()
                   if "lora_" not in k}
    updated, _ = trainer.update(credit, {role})
    assert updated == {role}
    after = {r: _adapter(trainer.policies[r]) for r in ("solver", "critic")}
    assert all(torch.equal(before[other][k], after[other][k]) for k in before[other])  # bytes unchanged
    assert any(not torch.equal(before[role][k], after[role][k]) for k in before[role])
    base_after = trainer.policies[role].model.get_base_model().state_dict()
    assert all(torch.equal(v, base_after[k]) for k, v in base_before.items())


@pytest.mark.parametrize("variant,solver_moves,critic_moves", [
    ("fixed_feedback", True, False), ("critic_only", False, True)])
def test_variants_freeze_an_adapter_of_the_shared_base(tiny_ckpt, tmp_path, variant, solver_moves, critic_moves):
    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, variant=variant, steps=1), tmp_path)
    before = {r: _adapter(trainer.policies[r]) for r in ("solver", "critic")}
    trainer.train()
    for r, moves in (("solver", solver_moves), ("critic", critic_moves)):
        after = _adapter(trainer.policies[r])
        assert any(not torch.equal(before[r][k], after[k]) for k in after) == moves
        assert all(not p.requires_grad for p in trainer.policies[r].model.parameters()) != moves
    assert len(trainer.optimizers) == 1


def test_shared_policy_is_one_adapter(tiny_ckpt, tmp_path):
    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, variant="shared_policy", steps=1), tmp_path)
    assert trainer.policies["critic"] is trainer.policies["solver"]
    assert trainer.policies["solver"].model.base.model.peft_config.keys() == {"solver"}
    trainer.train()
    assert len(trainer.optimizers) == 1


def test_the_reference_is_the_base_without_any_adapter(tiny_ckpt, tmp_path):
    """π_ref of either role is the shared base: the adapters disabled, whichever was active."""
    from mlmt_bench.models.tiny import load_checkpoint

    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, steps=1), tmp_path)
    trainer.train()  # the adapters have moved: a forward with one differs from the base
    plain, _ = load_checkpoint(tiny_ckpt)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    want = plain(input_ids=ids).logits
    for role in ("solver", "critic"):
        policy = trainer.policies[role]
        assert torch.allclose(policy.reference_logits(input_ids=ids), want, atol=1e-6)
        assert not torch.allclose(policy.model(input_ids=ids).logits, want, atol=1e-4)
    solver, critic = (trainer.policies[r].model(input_ids=ids).logits for r in ("solver", "critic"))
    assert not torch.allclose(solver, critic, atol=1e-4)  # each call runs its own adapter
    assert trainer.policies["solver"].trainable_parameters()  # disabling restored trainability


def test_generation_runs_each_turns_own_adapter(tiny_ckpt, tmp_path):
    """The hf backend (generate and the static decoder) generates each role's turn with its adapter:
    greedy continuations equal those of the same adapter alone on a model of its own."""
    from mlmt_bench.rollout.hf_backend import HFBackend

    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, steps=1), tmp_path)
    trainer.train()
    tok = trainer.policies["solver"].tokenizer
    prompts = [tok.encode("12+3=", add_special_tokens=False), tok.encode("7*8=", add_special_tokens=False)]
    for decode in ("generate", "static"):
        backend = HFBackend(decode=decode)
        out = {}
        for role in ("solver", "critic", "solver"):  # switching back and forth
            out.setdefault(role, []).append(
                [g.ids for g in backend.generate(trainer.policies[role].model, tok, prompts, max_new_tokens=8)])
        assert out["solver"][0] == out["solver"][1]
        for role in ("solver", "critic"):
            alone = _alone(trainer.policies[role], tiny_ckpt)
            assert out[role][0] == [g.ids for g in HFBackend(decode=decode).generate(alone, tok, prompts,
                                                                                     max_new_tokens=8)]


def test_static_decoders_one_per_adapter_keep_their_state_across_updates(tiny_ckpt, tmp_path):
    """Training on the static decode path: one decoder per adapter, and an optimiser step (in place)
    leaves every parameter's storage where the decoder's graphs read it, so nothing is recaptured."""
    trainer = _trainer(_spec(tmp_path, tiny_ckpt, True, steps=2, decode="static"), tmp_path)
    views = [trainer.policies[r].model for r in ("solver", "critic")]
    storage = [tuple(p.data_ptr() for p in view.parameters()) for view in views]
    trainer.train()
    decoders = trainer.actors.backend.decoders
    assert {id(v) for v in views} <= set(decoders) and decoders[id(views[0])] is not decoders[id(views[1])]
    for view, before in zip(views, storage):
        dec = decoders[id(view)]
        assert dec.model is view and dec.stats.calls >= 2 and dec.stats.recaptures == 0
        assert tuple(p.data_ptr() for p in view.parameters()) == before == dec._param_ptrs  # updated in place
    assert [r["updated"] for r in trainer.run_dir.metrics() if r["kind"] == "train"] == [["critic", "solver"]] * 2


def _alone(policy, ckpt):
    """The role's adapter on a model of its own (a fresh copy of the base)."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from mlmt_bench.models.tiny import load_checkpoint

    model, _ = load_checkpoint(ckpt)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    set_peft_model_state_dict(peft_model, policy.model.adapter_state())
    return peft_model.eval()


# validate ----------------------------------------------------------------------------------


def _raw(ckpt, **policies):
    d = {"name": "t", "benchmark": {"name": "synthetic-arith"}, "algorithm": {"name": "mlmt"},
         "policies": {"share_base": True,
                      "solver": {"model": "tiny", "path": str(ckpt), "lora": LORA},
                      "critic": {"model": "tiny", "path": str(ckpt), "lora": LORA}}}
    for role, over in policies.items():
        d["policies"][role] = {**d["policies"][role], **over} if over is not None else None
    return d


@pytest.mark.parametrize("over,match", [
    ({"critic": {"lora": None}}, "policies.critic.lora: share_base trains each role as a LoRA adapter"),
    ({"solver": {"lora": None}}, "policies.solver.lora: share_base"),
    ({"critic": {"dtype": "bfloat16"}}, "policies.critic.dtype: share_base puts every role on one base"),
    ({"critic": {"path": "/elsewhere"}}, "policies.critic.path: share_base"),
])
def test_validate_refuses_what_cannot_share_a_base(tiny_ckpt, over, match):
    with pytest.raises(UserError, match=match) as exc:
        validate_run(_raw(tiny_ckpt, **over), "spec.yaml")
    assert "\n" not in str(exc.value)


def test_validate_command_refuses_full_fine_tuning_on_a_shared_base(tiny_ckpt, write_spec):
    """`mlmt-bench validate`: exit 2, one line naming the field."""
    one_line_error(["validate", str(write_spec(_raw(tiny_ckpt, solver={"lora": None})))],
                   "policies.solver.lora: share_base", "full fine-tuning of a shared base cannot work")


def test_validate_accepts_different_adapters_and_rates(tiny_ckpt):
    spec = validate_run(_raw(tiny_ckpt, critic={"lr": 3e-5, "lora": {"r": 16, "alpha": 32}}), "spec.yaml")
    assert spec.policies.share_base and spec.policies.critic.lora.r == 16


def test_share_base_false_is_left_out_of_the_resolved_spec(tiny_ckpt):
    from mlmt_bench.spec import dump_yaml

    off = validate_run(_raw(tiny_ckpt) | {"algorithm": {"name": "grpo"},
                                          "policies": {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}}, "s")
    assert "share_base" not in dump_yaml(off)
    assert yaml.safe_load(dump_yaml(validate_run(_raw(tiny_ckpt), "s")))["policies"]["share_base"] is True


# checkpoints and resume ------------------------------------------------------------------------


def _spec_file(tmp_path, ckpt, out):
    d = _raw(ckpt, solver={"lr": 1e-2}, critic={"lr": 5e-3})
    d.update(name="resume", output_dir=str(out), seed=1)
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 4, "verifier": "parity-test"}
    d["algorithm"] = {"name": "mlmt", "params": {"group_size": 2, "beta": 0.05}}
    d["backend"] = {"max_new_tokens": 8}
    d["train"] = {"steps": 4, "problems_per_step": 2, "checkpoint_every": 2, "threads": 1}
    d["eval"] = {"every": 0}
    p = tmp_path / f"{out.name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _final(run):
    from safetensors.torch import load_file

    from mlmt_bench.io.checkpoint_state import load_state

    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    weights = {r: load_file(str(ckpt / r / "adapter_model.safetensors")) for r in ("solver", "critic")}
    state = load_state(ckpt)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return ckpt.name, weights, state["optimizers"], metrics


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_sigkill_then_resume_is_bit_identical(tiny_ckpt, tmp_path):
    """Both adapters and both optimisers resume bit-identically after a SIGKILL."""
    full = launch_cli_process(["run", str(_spec_file(tmp_path, tiny_ckpt, tmp_path / "full"))])
    assert full.wait(timeout=300) == 0, full.stderr.read()
    (full_run,) = (tmp_path / "full").iterdir()
    proc = launch_cli_process(["run", str(_spec_file(tmp_path, tiny_ckpt, tmp_path / "killed"))])
    run, deadline = None, time.time() + 300
    while time.time() < deadline:  # kill once step 3 is logged (after the checkpoint at step 2)
        runs = list((tmp_path / "killed").glob("resume-*"))
        if runs and (runs[0] / "metrics.jsonl").exists():
            run = runs[0]
            if any('"train"' in line and '"step": 3,' in line for line in
                   (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}")):
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert run is not None and json.loads((run / "manifest.json").read_text())["status"] == "running"
    resumed = launch_cli_process(["run", "--resume", str(run)])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    name_a, w_a, opt_a, m_a = _final(full_run)
    name_b, w_b, opt_b, m_b = _final(run)
    assert name_a == name_b == "step-000004"
    assert _same(w_a, w_b) and set(opt_a) == {"solver", "critic"} and _same(opt_a, opt_b)

    def strip(recs):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "gen_tok_per_s", "train_tok_per_s", "peak_mem_mb")
                 and not k.startswith("mem/")} for r in recs]

    assert strip(m_a) == strip(m_b)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    one = manifest["share_base"]  # the base once, both adapters' configs
    assert one["base"]["path"] == str(tiny_ckpt) and one["adapters"].keys() == {"solver", "critic"}
    assert [one["adapters"][r]["lr"] for r in ("solver", "critic")] == [1e-2, 5e-3]
    assert one["adapters"]["critic"]["r"] == LORA["r"] and one["adapters"]["critic"]["params"] > 0


# plan --------------------------------------------------------------------------------------------


def test_plan_holds_one_base_and_two_adapters_with_their_optimiser_states():
    """The paper-scale spec: the base's weights once; each adapter, its gradients and AdamW states
    per role; everything else (FLOPs, caches, activations) as with two models."""
    from pathlib import Path

    from mlmt_bench.plan import plan_spec

    path = Path(__file__).resolve().parents[1] / "registry" / "runs" / "paper-1b-adapters.yaml"
    one = plan_spec(path, [], device="h200")
    two = plan_spec(path, ["policies.share_base=false"], device="h200")
    held1, held2 = one["memory"]["items"]["persistent"], two["memory"]["items"]["persistent"]
    params = 1_235_814_400
    assert held1["weights (solver, critic, one frozen base)"] == held2["weights (solver)"] == \
        held2["weights (critic)"] == params * 2  # bfloat16
    adapter = one["policies"][0]["lora_params"]
    for role in ("solver", "critic"):
        assert held1[f"LoRA adapter ({role}, float32)"] == adapter * 4
        assert held1[f"gradients ({role})"] == adapter * 4 and held1[f"AdamW states ({role})"] == 2 * adapter * 4
    assert one["memory"]["peak"] == pytest.approx(two["memory"]["peak"] - params * 2)
    assert one["run"]["train_flops"] == two["run"]["train_flops"]
    assert one["policies"][1]["adapter_on_base_of"] == "solver" and one["fits"]
