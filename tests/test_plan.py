"""`mlmt-bench plan`: offline architectures (registry/models), per-step tokens that match a real
rollout, a memory model calibrated against what autograd keeps, refusal of specs that do not fit,
and the paper-scale and verl-baseline specs validated and planned without a download."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app
from mlmt_bench.models.configs import shape_from_registry_file, shape_of_path, shape_of_preset
from mlmt_bench.models.policy_spec import LoraSpec, PolicySpec
from mlmt_bench.plan import text as plan_text
from mlmt_bench.spec import validate_run
from support import build_trainer

ROOT = Path(__file__).resolve().parents[1]
HUB_FILES = sorted((ROOT / "registry" / "models").glob("*-instruct.yaml"))
PAPER_SPECS = sorted((ROOT / "registry" / "runs").glob("paper-*.yaml")) + \
    sorted((ROOT / "registry" / "runs").glob("verl-gsm8k-*.yaml"))
runner = CliRunner()


@pytest.mark.parametrize("path", HUB_FILES, ids=lambda p: p.stem)
def test_hub_configs_build_their_published_size(path):
    data = yaml.safe_load(path.read_text())
    shape = shape_from_registry_file(path)
    published = float(data["published_params_billions"]) * 1e9
    assert abs(shape.params - published) / published < 0.01, (shape.params, published)
    assert shape.name == data["hub"] and "Source:" in path.read_text()


def test_hub_names_resolve_offline_and_unknown_ones_say_what_to_add():
    assert shape_of_path("Qwen/Qwen2.5-1.5B-Instruct").params == 1_543_714_304
    assert shape_of_path("qwen/qwen2.5-1.5b-instruct").hidden == 1536
    from mlmt_bench.errors import UserError

    with pytest.raises(UserError, match="registry/models"):
        shape_of_path("someone/not-a-model")


def test_lora_count_matches_peft(tiny_ckpt):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    shape = shape_of_path(str(tiny_ckpt))
    for lora in (LoraSpec(r=8, target_modules=["q_proj", "v_proj"]), LoraSpec(r=4, target_modules="all-linear")):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt))
        peft = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules,
                                                task_type="CAUSAL_LM"))
        assert shape.lora_params(lora) == peft.get_nb_trainable_parameters()[0]
        wrapped = [m.base_layer.weight.numel() for m in peft.modules() if hasattr(m, "lora_A")]
        assert shape.adapted_params(lora) == sum(wrapped) and wrapped  # what merge_lora copies


def test_merge_lora_is_planned_as_a_copy_of_the_adapted_weights():
    from types import SimpleNamespace

    from mlmt_bench.rollout.backend import GenerationLoad, backend_class

    shape = SimpleNamespace(layers=2, kv_dim=8, hidden=16, intermediate=32, vocab=100)
    hf = backend_class("hf")

    def items(adapted: int, **options):
        load = GenerationLoad("critic", shape, 4, sequences=8, length=50.0, prompt=20.0, device_memory=None,
                              gpu=False, adapted=adapted)
        return {what: (kind, b) for kind, what, b in hf.generation_memory(load, {"decode": "static", **options})}

    assert items(1000, merge_lora=True)["merged LoRA weights (critic, merge_lora)"] == ("persistent", 4000)
    assert not any("merged" in k for k in items(1000)) and not any("merged" in k for k in items(0, merge_lora=True))


def test_kept_prefixes_are_planned_as_their_budget_or_a_calls_rows_if_fewer():
    from types import SimpleNamespace

    from mlmt_bench.rollout.backend import GenerationLoad, backend_class

    shape = SimpleNamespace(layers=2, kv_dim=8, hidden=16, intermediate=32, vocab=100)
    load = GenerationLoad("solver", shape, 4, sequences=8, length=50.0, prompt=20.0, device_memory=None, gpu=False)
    name = "kept prefixes (solver, prefix_cache_mb)"

    def items(**options):
        return {what: (kind, b) for kind, what, b in
                backend_class("hf").generation_memory(load, {"decode": "static", **options})}

    rows = 8 * 50 * load.kv_bytes  # every row of a call (all its chunks), each as long as the load's sequences
    assert items(prefix_cache_mb=64)[name] == items(prefix_cache_mb=64, batch_size=2)[name] == ("persistent", rows)
    assert items(prefix_cache_mb=0.01)[name] == ("persistent", 0.01 * 2 ** 20) and 0.01 * 2 ** 20 < rows
    assert name not in items()
    critic = dataclasses.replace(load, role="critic")  # the critic's calls are never marked keep
    assert not any("kept" in what for _, what, _ in
                   backend_class("hf").generation_memory(critic, {"decode": "static", "prefix_cache_mb": 64}))


def test_qwen_0_5b_with_verls_adapter_has_the_size_verls_log_printed():
    """verl's GSM8K log: "PeftModelForCausalLM contains 511.63M parameters" (r 32, all-linear)."""
    shape = shape_of_path("Qwen/Qwen2.5-0.5B-Instruct")
    assert round((shape.params + shape.lora_params(LoraSpec(r=32, target_modules="all-linear"))) / 1e6, 2) == 511.63


def test_the_308m_preset_is_the_issues_model(tiny_ckpt):
    shape = shape_of_preset("llama-308m")
    assert shape.params == 308_435_968 and (shape.layers, shape.hidden) == (24, 1024)
    # a checkpoint directory is read from its config.json: same count as the loaded model
    from mlmt_bench.models.tiny import load_checkpoint, num_parameters

    assert shape_of_path(str(tiny_ckpt)).params == num_parameters(load_checkpoint(tiny_ckpt)[0])


# ----------------------------------------------------------------------------------------------
# tokens per step


def _two_problem_spec(ckpt, algo, params, new_tokens, feedback_tokens, steps, **over):
    """A validated spec: 2 synthetic-arith problems per step, tiny solver and critic from ``ckpt``."""
    d = minimal_spec(**over)
    d["benchmark"] = {"name": "synthetic-arith", "train_limit": 2, "eval_limit": 2}
    d["policies"] = {"solver": {"model": "tiny", "path": str(ckpt)}, "critic": {"model": "tiny", "path": str(ckpt)}}
    d["algorithm"] = {"name": algo, "params": params}
    d["backend"] = {"max_new_tokens": new_tokens, "feedback_max_new_tokens": feedback_tokens}
    d["train"] = {"steps": steps, "problems_per_step": 2}
    return validate_run(d, "test")


class FullLengthBackend:
    """Every turn runs to its limit with plain characters, as the plan's upper bound assumes; each row of a
    call its own letter, so that sibling turns differ as sampled ones do (what the update reads depends on it)."""

    def generate(self, model, tokenizer, prompts, *, max_new_tokens, **_):
        from mlmt_bench.rollout.backend import Generation

        texts = [chr(ord("a") + k % 26) * max_new_tokens for k in range(len(prompts))]
        return [Generation(tokenizer.encode(t, add_special_tokens=False), [0.0] * max_new_tokens, "length", t)
                for t in texts]


def _registered_algorithm_variants():
    """Every registered algorithm × every step-plan variant its Params declare (``variants()``)."""
    from mlmt_bench import registry

    return [pytest.param(name, over, id=f"{name}-{variant}")
            for name in registry.algorithms.names()
            for variant, over in registry.algorithms.get(name).Params.variants().items()]


def _every_turn_trains(params_model, over):
    """Small counts (G 2, K 2, M 2 where the params have them: even groups of distinct rewards
    standardise to no zero advantage) and every refinement kept where a param filters them, so
    that every turn the plan counts has a gradient."""
    fields = params_model.model_fields
    small = {"group_size": 2, "feedbacks": 2, "refinements": 2, "refinements_in_group": "all", "distill_on": "all"}
    return {**{k: v for k, v in small.items() if k in fields}, **over}


@pytest.mark.parametrize("algo,variant", _registered_algorithm_variants())
def test_plan_counts_what_a_full_length_step_generates_and_trains(tiny_ckpt, tmp_path, algo, variant):
    """The plan's sequences, prefill, generated, trained and extra-forward tokens per role equal
    those of a real rollout at full length and the items its credit returns (with every turn
    carrying a gradient), for every registered algorithm and variant, read off its step plan."""
    from mlmt_bench import registry, runner as run
    from mlmt_bench.algorithms.base import CreditInputs
    from mlmt_bench.models.forward import seq_len
    from mlmt_bench.plan import load_table, plan_run, resolve_device
    from mlmt_bench.rollout.episodes import Actors, Sampling, rollout

    cls = registry.algorithms.get(algo)
    params = _every_turn_trains(cls.Params, variant)
    # a rule's (the oracle's) feedback is planned at the feedback limit, an upper bound: give it room
    oracle = cls(cls.Params.model_validate(params), 3).step_plan(0).program().feedback == "oracle"
    t_fb = 96 if oracle else 7
    spec = _two_problem_spec(tiny_ckpt, algo, params, 12, t_fb, steps=3)
    table = load_table()
    plan = plan_run(spec, resolve_device("cpu", table), 1, table)

    comp = run.build(spec, progress=False)
    algorithm = comp.algorithm
    actors = Actors(comp.policies["solver"], comp.policies["critic"], FullLengthBackend(), comp.templates,
                    _CountingVerifier(), getattr(comp.benchmark, "oracle_feedback", None))  # every turn trains
    ro = rollout(algorithm.step_plan(0).program(), actors, comp.train_problems[:2], Sampling(1.0, 1.0, 12, t_fb))
    prefill, generated, sequences = {}, {}, {}
    slack = 0  # the plan's t_fb tokens where the oracle wrote fewer, over the refinements' prompts
    for t in ro.turns:
        if t.policy in ("solver", "critic"):
            prefill[t.policy] = prefill.get(t.policy, 0) + len(t.prompt_ids)
            generated[t.policy] = generated.get(t.policy, 0) + len(t.ids)
            sequences[f"{t.kind} ({t.policy})"] = sequences.get(f"{t.kind} ({t.policy})", 0) + 1
        if t.kind == "refine" and oracle:  # the plan's t_fb tokens where the oracle wrote fewer
            written = len(comp.policies["solver"].tokenizer.encode(ro.turns[t.parent].refiner_text,
                                                                   add_special_tokens=False))
            assert written <= t_fb
            slack += t_fb - written
    prefill["solver"] = prefill["solver"] + slack
    tokens = plan["per_step"]["tokens"]
    assert plan["per_step"]["sequences"] == sequences
    assert tokens["generated"] == pytest.approx(generated)
    assert tokens["prefill"] == pytest.approx(prefill)

    contexts = algorithm.value_contexts(ro) if algorithm.value_model is not None else []
    values = torch.zeros(len(contexts), dtype=torch.float64) if contexts else None
    credit = algorithm.credit(ro, 0, CreditInputs(max_new_tokens=12, values=values))
    algorithm.step_plan(0).check(credit.items)
    updated = set().union(*(algorithm.updates(s) for s in range(3)))
    items = {role: its for role, its in credit.items.items() if its and role in updated}
    assert items, "every variant trains something"
    refine = algorithm.step_plan(0).training("refine")
    own_slack = slack if refine is not None and refine.context == "own" else 0  # trained in the planned prompt
    trained = {role: sum(map(seq_len, its)) + (own_slack if role == "solver" else 0) for role, its in items.items()}
    assert tokens["trained"] == pytest.approx(trained)
    # what the update reads (train.share_prompts, the default): each distinct prompt of the policy-loss items once,
    # the auxiliary items whole; the oracle's slack once per attempt, which its K·M refinements share (a rule
    # writes an attempt's K feedbacks alike)
    assert spec.train.share_prompts
    read = {role: sum(len(p) for p in {tuple(it.prompt_ids) for it in its if it.kind not in ("sft", "distill")})
            + sum(len(it.ids) for it in its if it.kind not in ("sft", "distill"))
            + sum(seq_len(it) for it in its if it.kind in ("sft", "distill")) for role, its in items.items()}
    if own_slack:
        read["solver"] += own_slack / params.get("refinements", 1) / params.get("feedbacks", 1)
    assert tokens["read"] == pytest.approx(read)
    # extra forwards: π_ref over the policy-loss items (β > 0), the KL teacher, the value's features
    ref = algorithm.params.needs_reference()
    forward = {role: sum(seq_len(it) for it in its if it.kind not in ("sft", "distill")) * ref
               + sum(len(it.teacher_prompt_ids) + len(it.ids) for it in its if it.kind == "distill")
               for role, its in items.items()}
    teacher_slack = slack if refine is not None and refine.teacher else 0  # the teacher reads the own context
    forward["solver"] = forward.get("solver", 0) + sum(map(len, contexts)) + own_slack * ref + teacher_slack
    assert tokens["forward"] == pytest.approx({r: v for r, v in forward.items() if v})
    from mlmt_bench.metrics import cost

    p = plan["policies"][0]["params"]
    assert plan["per_step"]["flops"]["training"] == pytest.approx(sum(cost.training_flops(p, int(v))
                                                                      for v in trained.values()))


def test_extra_forward_passes_are_counted(tiny_ckpt):
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    def forward(params):
        d = minimal_spec(algorithm={"name": "grpo", "params": {"group_size": 4, **params}})
        d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
        table = load_table()
        plan = plan_run(validate_run(d, "t"), resolve_device("cpu", table), 1, table)
        return plan["per_step"]["tokens"]["forward"].get("solver", 0), plan["per_step"]["tokens"]["trained"]["solver"]

    assert forward({})[0] == 0
    f, trained = forward({"beta": 0.1, "epochs": 2})  # trained twice; reference and old log-probs once each
    assert f == pytest.approx(trained)
    f, trained = forward({"beta": 0.1})
    assert f == pytest.approx(trained)


# ----------------------------------------------------------------------------------------------
# memory


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "prompts-read-once"])
@pytest.mark.parametrize("preset,dtype", [("tiny-2m", torch.float32), ("tiny-2m", torch.bfloat16),
                                          ("tiny-8m", torch.float32)])
def test_activation_estimate_is_calibrated_against_autograd(preset, dtype, shared):
    """What the plan counts per trained token (activations + the float32 log-softmax it keeps)
    against the bytes of the tensors autograd saves for backward in the trainer's forward: the plain
    one (every row whole) and the one that reads each distinct prompt once (train.share_prompts), whose
    micro-batch the plan counts as the prompts, the completions and the prompts' keys and values
    gathered to every row (plan/memory.py training_candidate)."""
    from mlmt_bench.algorithms.update import TrainItem, sequence_logprobs
    from mlmt_bench.models import cpu_attention
    from mlmt_bench.models.shared_prompts import shared_prompt_logprobs
    from mlmt_bench.models.tiny import build_tiny_model
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.plan.memory import MicroBatch, act_bytes_per_token, training_candidate
    from mlmt_bench.plan.work import PlannedPolicy

    tok = build_char_tokenizer()
    model = build_tiny_model(preset, tok, 0).to(dtype).train()
    shape = shape_of_preset(preset)
    prompts, group, prompt, new = 2, 4, 30, 40
    rows = prompts * group
    items = [TrainItem([10 + k, *range(11, 10 + prompt)], list(range(20, 20 + new)), 1.0)
             for k in range(prompts) for _ in range(group)]
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        (shared_prompt_logprobs if shared else sequence_logprobs)(model, items, tok.pad_token_id)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(v for k, v in storages.items() if k not in params)
    b = torch.finfo(dtype).bits // 8
    if shared:
        policy = PlannedPolicy("solver", PolicySpec(model="tiny", dtype=str(dtype).removeprefix("torch.")), shape, 0,
                               True)
        _, lines = training_candidate(policy, MicroBatch(rows, new, new, prompts, prompt))
        estimate = next(v for k, v in lines.items() if k.startswith("activations")) + rows * new * shape.vocab * 4
        if dtype in cpu_attention._FAILED:  # the math backend's attention matrices, as below: the prompts' and
            # the completions' against prompt + completion, which the plan does not count
            entries = shape.layers * shape.heads * (prompts * prompt ** 2 + rows * new * (prompt + new))
            assert 0 < saved - estimate <= (b + 4) * entries, (saved, estimate, entries)
            return
        assert 1.0 <= estimate / saved <= 1.3, estimate / saved
        return
    estimate = rows * (prompt + new) * act_bytes_per_token(shape, b, False) + rows * (new + 1) * shape.vocab * 4
    if dtype in cpu_attention._FAILED:
        # this CPU's flash kernel cannot run in this dtype under the pin (models/cpu_attention.py): the
        # math backend also keeps each head's T x T attention, in this dtype and in float32 (measured:
        # 5.6 bytes an entry on the Xeon), which the plan, made for the flash kernel, does not count
        entries = shape.layers * shape.heads * rows * (prompt + new) ** 2
        assert (b + 2) * entries < saved - estimate <= (b + 4) * entries, (saved, estimate, entries)
        return
    assert 1.0 <= estimate / saved <= 1.3, estimate / saved


def test_micro_batches_are_counted_as_the_update_reads_them():
    """With prompts read once a turn's ``siblings`` share one (G attempts of a problem): two groups of
    four rows fit 2 × 30 + 8 × 40 = 380 tokens, and split into their groups at 379; read whole, 8 rows
    of 70 tokens take 560, so 379 holds 5 of them."""
    from mlmt_bench.plan.memory import MicroBatch, micro_batch_shapes
    from mlmt_bench.plan.work import Turn

    turns = [Turn("attempt", "solver", 8, 30.0, 40, siblings=4)]
    assert micro_batch_shapes(turns, ["solver"], 1, 380, shared=True) == [MicroBatch(8, 40, 40, 2, 30)]
    assert micro_batch_shapes(turns, ["solver"], 1, 379, shared=True) == [MicroBatch(4, 40, 40, 1, 30)] * 2
    assert micro_batch_shapes(turns, ["solver"], 1, 379) == [MicroBatch(5, 70, 40), MicroBatch(3, 70, 40)]
    assert micro_batch_shapes(turns, ["critic"], 1, 379, shared=True) == []


def test_gradient_checkpointing_reads_every_prompt_whole_in_the_plan_too(write_spec):
    """A model with gradient checkpointing does not share prompts (update.LossConfig.shares): the plan
    counts its update reading every trained token."""
    solver = {"model": "hf", "path": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "bfloat16"}
    for checkpointing, shared in ((False, True), (True, False)):
        policy = {**solver, "gradient_checkpointing": checkpointing}
        spec = write_spec({**minimal_spec(), "policies": {"solver": policy}}, f"ckpt-{checkpointing}.yaml")
        res = runner.invoke(app, ["--json", "plan", str(spec), "--device", "h200"])
        assert res.exit_code == 0, res.stderr
        tokens = json.loads(res.stdout)["per_step"]["tokens"]
        assert (tokens["read"]["solver"] < tokens["trained"]["solver"]) is shared
        assert tokens["read"]["solver"] <= tokens["trained"]["solver"]


def test_a_spec_that_does_not_fit_is_refused_unless_forced(write_spec):
    solver = {"model": "hf", "path": "meta-llama/Llama-3.2-3B-Instruct", "dtype": "float32"}
    spec = write_spec({**minimal_spec(), "policies": {"solver": solver},
                       "backend": {"max_new_tokens": 1024}, "train": {"problems_per_step": 64, "grad_accum": 256}})
    res = runner.invoke(app, ["plan", str(spec), "--device", "a100-40gb"])
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "exceeds" in err and "--force" in err
    assert "DOES NOT FIT" in res.stdout
    forced = runner.invoke(app, ["plan", str(spec), "--device", "a100-40gb", "--force"])
    assert forced.exit_code == 0 and "DOES NOT FIT" in forced.stdout
    as_json = runner.invoke(app, ["--json", "plan", str(spec), "--device", "h200"])
    plan = json.loads(as_json.stdout)
    assert as_json.exit_code == 0 and plan["fits"] and plan["policies"][0]["params"] == 3_212_749_824


def test_unknown_device_and_hub_model_are_one_line_errors(write_spec):
    spec = write_spec({**minimal_spec(), "policies": {"solver": {"model": "hf", "path": "org/unknown"}}})
    res = runner.invoke(app, ["plan", str(spec), "--device", "h200"])
    assert res.exit_code == 2 and "registry/models" in res.stderr and res.stderr.count("\n") == 1
    res = runner.invoke(app, ["plan", str(spec), "--device", "tpu"])
    assert res.exit_code == 2 and "unknown device" in res.stderr


def test_every_throughput_row_says_how_it_was_measured():
    """A user reads each row's source under the time estimate: it says how the numbers were
    measured, never a reference to the project's own issue tracker."""
    from mlmt_bench.plan import load_table

    for row in load_table()["rows"]:
        assert "measured" in row["source"] or "perf/" in row["source"], row["model"]
        assert "issue" not in row["source"].lower() and "not measured here" not in row["source"], row["model"]
    res = runner.invoke(app, ["plan", str(ROOT / "registry" / "runs" / "paper-math500.yaml"), "--device", "h200"])
    assert res.exit_code == 0, res.stderr
    assert "source: measured on one H200" in res.stdout and "issue 14" not in res.stdout


def test_a_known_device_without_throughput_says_so_plainly(write_spec, tiny_ckpt):
    spec = write_spec({**minimal_spec(), "policies": {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}})
    res = runner.invoke(app, ["plan", str(spec), "--device", "a100-40gb"])
    assert res.exit_code == 0, res.stderr
    line = next(t for t in res.stdout.splitlines() if t.startswith("time"))
    assert line.startswith("time: not estimated: no throughput has been measured on a100-40gb (measured on: cpu, h200)")
    assert "time (estimate)" not in res.stdout


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_a_gpu_only_backend_is_not_planned_for_a_cpu(write_spec, tiny_ckpt, monkeypatch, device):
    """`--device auto` on a machine without a GPU planned vLLM engines and thousands of hours
    scaled from the tiny CPU rows; it is one line naming the GPUs to plan for instead."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = write_spec({**minimal_spec(), "backend": {"name": "vllm"},
                       "policies": {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}})
    res = runner.invoke(app, ["plan", str(spec), "--device", device])
    assert res.exit_code == 2 and res.stdout == ""
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "backend vllm generates on a CUDA GPU only" in err and "--device h200" in err
    assert ("found no CUDA GPU" in err) == (device == "auto")
    assert runner.invoke(app, ["plan", str(spec), "--device", "h200"]).exit_code == 0


def test_time_comes_from_the_nearest_measured_row_scaled_by_parameters(tiny_ckpt):
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    table = {"devices": {"cpu": {}}, "rows": [
        {"device": "cpu", "model": "small", "params": 1000, "gen": {"hf-generate": 100.0}, "train": 300.0,
         "source": "test"},
        {"device": "cpu", "model": "big", "params": 10 ** 9, "gen": {"hf-generate": 1.0}, "train": 1.0,
         "source": "test"}]}
    d = minimal_spec()
    d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
    spec = validate_run(d, "t")
    plan = plan_run(spec, resolve_device("cpu", load_table()), 1, table)
    p = plan["policies"][0]["params"]
    t = plan["per_step"]["tokens"]
    scale = 1000 / p  # the tiny model (0.5M) is nearer 1000 than 1e9 on a log scale
    # the update is timed on what it reads: with shared prompts (the default) less than the trained tokens
    assert t["read"]["solver"] < t["trained"]["solver"]
    expected = t["generated"]["solver"] / (100 * scale) + t["read"]["solver"] / (300 * scale)
    assert plan["time"]["per_step_s"] == pytest.approx(expected)
    assert plan["time"]["basis"]["solver"]["row"] == "small"


# ----------------------------------------------------------------------------------------------
# the paper-scale and verl specs


_PLAN_ALL = """
import json, sys
from mlmt_bench import spec as specs
from mlmt_bench.plan import plan_spec
out = {}
for path in sys.argv[1:]:
    specs.load_any(path)  # what `mlmt-bench validate` checks
    out[path] = plan_spec(path, [], device="h200")
print(json.dumps(out, default=str))
"""


def test_paper_scale_specs_validate_and_plan_offline():
    """All of them in one subprocess with the hub unreachable: nothing may be downloaded."""
    assert len(PAPER_SPECS) == 7  # paper-1b-adapters.yaml: two LoRA adapters on one base
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-c", _PLAN_ALL, *map(str, PAPER_SPECS)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)
    for path, result in results.items():
        assert result["fits"], path
        plans = result["arms"].values() if result["kind"] == "experiment" else [result]
        for plan in plans:
            assert plan["memory"]["fits"] and plan["time"]["available"], path
            for pol in plan["policies"]:
                assert pol["params"] > 4e8 and "registry/models" in pol["source"], path
            assert sum(plan["run"]["train_flops"].values()) > 1e16, path
    arms = results[str(ROOT / "registry" / "runs" / "paper-math500.yaml")]["arms"]
    assert {a: [p["params"] for p in plan["policies"]] for a, plan in arms.items()} == {
        "mlmt-2x1b": [1_235_814_400, 1_235_814_400], "mlmt-2x1b-fixed_feedback": [1_235_814_400, 1_235_814_400],
        "grpo-3b": [3_212_749_824]}


def test_plan_command_on_a_paper_spec(tmp_path):
    res = runner.invoke(app, ["plan", str(ROOT / "registry" / "runs" / "verl-gsm8k-qwen2.5-0.5b-grpo-lora.yaml"),
                              "--device", "h200"])
    assert res.exit_code == 0, res.stderr
    assert "Qwen/Qwen2.5-0.5B-Instruct: 494M parameters, LoRA r 32 (adapter 17.6M)" in res.stdout
    assert "memory per GPU" in res.stdout and "time (estimate)" in res.stdout


@pytest.mark.parametrize("path", HUB_FILES + [ROOT / "registry" / "models" / "llama-308m.yaml"], ids=lambda p: p.stem)
def test_config_arithmetic_equals_counting_a_model_built_on_the_meta_device(path):
    from transformers import AutoConfig

    from mlmt_bench.models import configs

    data = yaml.safe_load(path.read_text())
    if data.get("kind") == "hf":
        cfg = dict(data["config"])
        cfg.pop("torch_dtype", None)
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    else:
        from mlmt_bench.models.tiny import tiny_config
        from mlmt_bench.models.tokenizer import build_char_tokenizer

        config = tiny_config(path.stem, build_char_tokenizer())
    assert configs._llama_family_counts(config) == configs._meta_counts(config)


@pytest.mark.parametrize("kind", ["qwen3", "llama-biases"])
def test_config_arithmetic_covers_norms_and_biases(kind):
    from transformers import AutoConfig

    from mlmt_bench.models import configs

    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    config = (AutoConfig.for_model("qwen3", head_dim=24, tie_word_embeddings=False, **common) if kind == "qwen3" else
              AutoConfig.for_model("llama", attention_bias=True, mlp_bias=True, **common))
    assert configs._llama_family_counts(config) == configs._meta_counts(config)


class _CountingVerifier:
    """A different reward for every response, so every group has a spread and every turn trains."""

    def __init__(self):
        self.n = 0

    def score_batch(self, problems, responses):
        from mlmt_bench.types import Verdict

        out = []
        for _ in responses:
            self.n += 1
            out.append(Verdict(float(self.n % 7) / 7, False, "", "wrong"))
        return out


@pytest.mark.parametrize("algo,params", [("grpo", {"group_size": 3, "beta": 0.1, "epochs": 2}),
                                         ("self_correct", {"group_size": 2}),
                                         ("mlmt", {"group_size": 2, "feedbacks": 2}),
                                         ("critique_grpo", {"group_size": 2, "refinements_in_group": "all",
                                                            "beta": 0.1, "epochs": 2}),
                                         ("self_distill", {"group_size": 2, "distill": "sft", "distill_on": "all",
                                                           "beta": 0.1, "epochs": 2}),
                                         ("self_distill", {"group_size": 2, "distill": "kl", "distill_on": "all",
                                                           "critique_source": "mlmt"})])
def test_a_steps_flops_are_what_the_trainer_counts(tiny_ckpt, tmp_path, algo, params):
    """One real training step at full length, every turn with a gradient: the trainer's FLOP counter
    (METHOD.md v2, metrics/cost.py) equals the plan's per-step FLOPs."""
    from mlmt_bench import runner as run
    from mlmt_bench.plan import load_table, plan_run, resolve_device
    from mlmt_bench.tracking import RunDir

    spec = _two_problem_spec(tiny_ckpt, algo, params, 10, 6, steps=1, output_dir=str(tmp_path / "runs"),
                             eval={"every": 0, "feedback_metrics": False, "samples": 0})
    table = load_table()
    planned = sum(plan_run(spec, resolve_device("cpu", table), 1, table)["per_step"]["flops"].values())

    comp = run.build(spec, progress=False)
    comp.backend.generate = FullLengthBackend().generate
    comp.verifier = _CountingVerifier()
    run_dir = RunDir.create(spec.output_dir, spec.name, "", spec.seed)
    trainer = run.make_trainer(spec, comp, run_dir)
    trainer.train(None)
    assert trainer.counters.step == 1
    assert trainer.counters.flops == pytest.approx(planned, rel=1e-9)


def test_throughput_rows_from_the_benchmark_feed_the_time_estimate(capsys, tiny_ckpt):
    """perf/plan_throughput.py prints table rows; plan reads them as it reads the committed ones."""
    saved_path, threads = list(sys.path), torch.get_num_threads()
    sys.path.insert(0, str(ROOT / "perf"))
    try:
        import plan_throughput

        assert plan_throughput.main(["--presets", "tiny-0.5m", "--prompts", "2", "--max-new-tokens", "4",
                                     "--repeats", "1"]) == 0
    finally:
        sys.path[:] = saved_path
        torch.set_num_threads(threads)
    rows = yaml.safe_load(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["model"] == "tiny-0.5m" and rows[0]["device"] == "cpu"
    assert rows[0]["gen"]["hf-generate"] > 0 and rows[0]["gen"]["hf-static"] > 0 and rows[0]["train"] > 0
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    d = minimal_spec(backend={"options": {"decode": "static"}})
    d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
    plan = plan_run(validate_run(d, "t"), resolve_device("cpu", load_table()), 1,
                    {"devices": {"cpu": {}}, "rows": rows})
    assert plan["time"]["available"] and plan["time"]["basis"]["solver"]["backend"] == "hf-static"


def test_a_run_is_timed_from_rows_measured_as_it_will_run():
    """The throughput row of the run's CPU matmul dtype and kind of training wins over a nearer size."""
    from mlmt_bench.plan.throughput import throughput

    def row(model, params, gen, **kw):
        return {"device": "cpu", "model": model, "params": params, "gen": {"hf-generate": gen}, "train": gen,
                "source": "test", **kw}

    table = {"rows": [row("a", 100, 10.0), row("b", 400, 4.0, cpu_dtype="bfloat16"),
                      row("c", 400, 8.0, cpu_dtype="bfloat16", lora=True)]}
    assert throughput(table, "cpu", 100, "hf-generate")["row"] == "a"  # float32, full: the default
    got = throughput(table, "cpu", 100, "hf-generate", "bfloat16")
    assert got["row"] == "b (bfloat16 matmuls)" and got["gen"] == 4.0 * 4  # scaled by 400 / 100
    assert throughput(table, "cpu", 100, "hf-generate", "bfloat16", lora=True)["row"] == "c (bfloat16 matmuls) (LoRA)"
    # no row of the run's kind: the nearest size of those there are
    assert throughput(table, "cpu", 100, "hf-generate", "float32", lora=True)["row"] == "a"


class _CountingFullLength(FullLengthBackend):
    """:class:`FullLengthBackend`, counting the prompt tokens it reads and the tokens it writes."""

    def __init__(self) -> None:
        self.prefill = self.generated = 0

    def generate(self, model, tokenizer, prompts, *, max_new_tokens, **kw):
        out = super().generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, **kw)
        self.prefill += sum(map(len, prompts))
        self.generated += sum(len(g.ids) for g in out)
        return out


@pytest.mark.parametrize("algo,params,over", [
    ("grpo", {"group_size": 2}, {"eval": {"base_critic": True}}),
    ("mlmt", {"group_size": 2, "value": "none"}, {"feedback": {"redact": True, "eval_unredacted": True}}),
    ("mlmt", {"group_size": 2, "value": "none"}, {}),
], ids=["grpo-base_critic", "mlmt-unredacted", "mlmt"])
def test_plan_counts_what_the_evaluations_generate(tiny_ckpt, tmp_path, monkeypatch, algo, params, over):
    """The plan's evaluation tokens (step 0 and the final one, with the base critic's pass of every
    evaluation and the final one's unredacted refinements) equal what the trainer's evaluations
    ask the backend for, at full length."""
    from mlmt_bench.plan import load_table, plan_run, resolve_device

    monkeypatch.setenv("MLMT_BENCH_EVAL_MEMO", "0")
    spec = _two_problem_spec(tiny_ckpt, algo, params, 12, 7, steps=1, output_dir=str(tmp_path / "runs"), **over)
    table = load_table()
    plan = plan_run(spec, resolve_device("cpu", table), 1, table)
    assert plan["run"]["evaluations"] == 2
    trainer = build_trainer(spec, tmp_path)
    trainer.actors.backend = backend = _CountingFullLength()
    trainer.after_train = None
    trainer.evaluate(time.perf_counter())
    trainer.evaluate(time.perf_counter(), final=True)
    tokens = plan["run"]["eval_tokens"]
    assert (backend.prefill, backend.generated) == (sum(tokens["prefill"].values()),
                                                    sum(tokens["generated"].values()))


def test_an_experiment_plan_ends_with_its_runs_and_their_time_one_after_another(write_spec):
    """Every arm's estimate once per seed, less the step-0 evaluations seeds after the first read from the
    eval memo (a pretrained model's weights are every seed's), in the JSON and as the plan's last line;
    with eval.memo off, every seed evaluates."""
    solver = {"model": "hf", "path": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "bfloat16"}
    base = {**minimal_spec(), "policies": {"solver": solver}}
    spec = write_spec({"name": "e", "base": base, "seeds": [0, 1, 2], "budget": "none",
                       "arms": {"a": {"train": {"steps": 3}}, "b": {"train": {"steps": 7}}}}, "exp.yaml")
    res = runner.invoke(app, ["--json", "plan", str(spec), "--device", "h200"])
    assert res.exit_code == 0, res.stderr
    plan = json.loads(res.stdout)
    each = {arm: p["time"]["total_s"] for arm, p in plan["arms"].items()}
    step0 = {arm: p["time"]["per_eval_s"] for arm, p in plan["arms"].items()}
    assert plan["runs"] == 6 and each["b"] > each["a"] > 0 and step0["a"] > 0
    assert all(p["step0_memo"] for p in plan["arms"].values())
    assert plan["memo_saved_s"] == pytest.approx(2 * (step0["a"] + step0["b"]))
    assert plan["total_s"] == pytest.approx(3 * (each["a"] + each["b"]) - 2 * (step0["a"] + step0["b"]))
    text = runner.invoke(app, ["plan", str(spec), "--device", "h200"]).stdout.strip().splitlines()
    assert text[-1].startswith("== experiment e: 2 arms x 3 seeds = 6 runs; time (estimate) ")
    assert ("one after another (each arm's estimate x 3 seeds, less "
            f"{plan_text._dur(plan['memo_saved_s'])} of step-0 evaluations that seeds after the first read from "
            "the eval memo; ") in text[-1]

    res = runner.invoke(app, ["--json", "plan", str(spec), "--device", "h200", "--set", "eval.memo=false"])
    plan = json.loads(res.stdout)
    assert plan["memo_saved_s"] == 0 and not plan["arms"]["a"]["step0_memo"]
    assert plan["total_s"] == pytest.approx(3 * sum(p["time"]["total_s"] for p in plan["arms"].values()))
    text = runner.invoke(app, ["plan", str(spec), "--device", "h200", "--set", "eval.memo=false"]).stdout
    assert "one after another (each arm's estimate x 3 seeds; estimates from measured throughput" in text


@pytest.mark.parametrize(("changes", "shared"), [
    ({}, True),  # a pretrained model: every seed's weights
    ({"eval": {"temperature": 0.7}}, False),  # a sampled evaluation draws on the run's random state
    ({"eval": {"memo": False}}, False),
    ({"policies": {"solver": {"model": "tiny"}}, "base": {}}, False),  # a shared base seeded by the run's seed
    ({"policies": {"solver": {"model": "tiny"}}, "base": {"seed": 10}}, True),  # a base with its own seed
])
def test_step0_memo_across_seeds_needs_greedy_memoised_seed_free_weights(changes, shared):
    from mlmt_bench import registry
    from mlmt_bench.plan import planned_policies, step0_memo_across_seeds

    spec = validate_run(minimal_spec(**{"policies": {"solver": {"model": "hf", "path": "Qwen/Qwen2.5-0.5B-Instruct"}},
                                        **changes}), "spec")
    algorithm = registry.algorithms.get(spec.algorithm.name)(spec.algorithm.validated_params(), spec.train.steps)
    policies = planned_policies(spec, algorithm)
    assert (step0_memo_across_seeds(spec, policies, gpus=1) is not None) == shared
    assert step0_memo_across_seeds(spec, policies, gpus=2) is None  # several processes may shard (FSDP)
