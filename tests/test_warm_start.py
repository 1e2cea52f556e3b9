"""The warm start of a pretrained chat model (issue 33, ``warmstart/pretrained_base.py``): its
conversations are the rollout's own contexts, its curriculum keeps out the held-out problems, the
build is cached under a key and checked on load, and a run's roles load it."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
import yaml

from mlmt_bench.benchmarks.base import verdict_line
from mlmt_bench.benchmarks.nl_arith import NLArith
from mlmt_bench.errors import UserError
from mlmt_bench.models.tokenizer import build_char_tokenizer
from mlmt_bench.rollout.chat import close_turn
from mlmt_bench.rollout.episodes import attempt_prompt, feedback_prompt, refine_prompt
from mlmt_bench.warmstart import pretrained_base as ws
from mlmt_bench.warmstart.chat_curriculum import conversation, encode, token_example


@pytest.fixture(scope="module")
def bench():
    return NLArith()


def test_each_kind_targets_what_the_oracle_says(bench):
    p = bench.load("train")[0]
    gold = bench.solution(p)
    rng = random.Random(0)
    solve = conversation(bench, bench.templates, "solve", p, "own", [], rng)
    assert (solve.target, solve.attempt, solve.source) == (gold, "", None)
    critique = conversation(bench, bench.templates, "critique", p, "gold", [], rng)
    assert critique.attempt == gold and verdict_line(critique.target) is True
    slip = conversation(bench, bench.templates, "critique", p, "slip", [], rng)
    assert slip.attempt != gold and verdict_line(slip.target) is False
    wrong = "Step 1: 1 + 1 = 3.\nAnswer: 3"
    refine = conversation(bench, bench.templates, "refine", p, "own", [wrong], rng)
    assert refine.attempt == wrong and refine.feedback == bench.oracle_feedback(p, wrong)
    assert refine.target == gold
    kept = conversation(bench, bench.templates, "refine", p, "gold", [], rng)
    assert verdict_line(kept.feedback) is True and kept.target == gold  # approved: z again (here gold)
    resolve = conversation(bench, bench.templates, "resolve", p, "own", [wrong], rng)
    assert resolve.feedback == bench.templates.null_feedback and resolve.target == gold


def test_worked_critiques_show_their_working_and_the_refiner_reads_them_redacted():
    bench = NLArith(ops="*", steps=2)
    p = next(q for q in bench.load("train") if q.metadata["steps"][1][0] >= 10)  # a two-digit second product
    a, _, b, r = p.metadata["steps"][1]
    wrong = bench.solution(p).replace(str(r), str(r + 3))  # the step and the answer line
    rng = random.Random(0)
    critique = conversation(bench, bench.templates, "critique", p, "own", [wrong], rng, worked=True)
    assert critique.target == bench.worked_feedback(p, wrong) != bench.oracle_feedback(p, wrong)
    assert f"= {r}; the step says {r + 3}: not the same, a calculation error" in critique.target
    assert verdict_line(critique.target) is False
    refine = conversation(bench, bench.templates, "refine", p, "own", [wrong], rng, worked=True)
    assert refine.feedback == bench.redact_feedback(p, wrong, critique.target).text
    assert str(r) not in refine.feedback.replace(f"{r + 3}", "") and refine.target == bench.solution(p)
    worked = conversation(bench, bench.templates, "refine", p, "own", [wrong], rng, worked=True, worked_refine=True)
    assert worked.feedback == refine.feedback and worked.target == bench.worked_refinement(p, wrong)
    assert f"Step 2: {a} * {b}: " in worked.target and worked.target.endswith(f"Answer: {r}")
    kept = conversation(bench, bench.templates, "refine", p, "gold", [], rng, worked=True, worked_refine=True)
    assert verdict_line(kept.feedback) is True and kept.target == kept.attempt  # approved: z again


@pytest.mark.parametrize("kind", ["solve", "critique", "refine", "resolve"])
def test_an_example_is_the_rollouts_context_then_the_target_and_eos(bench, kind):
    tok = build_char_tokenizer()
    p = bench.load("train")[1]
    c = conversation(bench, bench.templates, kind, p, "slip", [], random.Random(1))
    ids, spans = token_example(tok, bench.templates, c)
    if kind == "critique":
        context = feedback_prompt(tok, bench.templates, p, c.attempt)
    else:
        context = attempt_prompt(tok, bench.templates, p)
        if kind != "solve":
            z = encode(tok, c.attempt)
            context = refine_prompt(tok, bench.templates, p, context, z, c.attempt, c.feedback)
            assert close_turn(tok, z)[-1] == tok.eos_token_id
    assert ids[:len(context)] == context
    assert spans == [(len(context), len(ids), 1.0)]
    assert ids[len(context):] == encode(tok, c.target) + [tok.eos_token_id]


def test_curriculum_keeps_out_every_held_out_problem_and_names_its_levels(bench):
    levels = [{"ops": "+-", "n_train": 40, "n_validation": 0, "n_test": 0},
              {"ops": "*", "n_train": 60, "n_validation": 0, "n_test": 0}]  # products: the run's own space
    problems = ws.curriculum_problems("nl-arith", {}, levels)
    held_out = {bench.identity(p) for s in ("validation", "test") for p in bench.load(s)}
    idents = [bench.identity(p) for p in problems]
    assert not held_out & set(idents) and len(set(idents)) == len(idents)
    assert [p.id for p in problems[:33]] == [p.id for p in bench.load("train")]
    assert {p.id.split("/")[0] for p in problems[33:]} == {"L1"}
    # the products level can only add products the run's splits do not hold: none are left
    assert not any(p.id.startswith("L2/") for p in problems)


def test_config_refuses_unknown_kinds_and_a_zero_mix():
    with pytest.raises(ValueError, match="unknown mix key"):
        ws.WarmStartConfig(model="m", mix={"solv": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        ws.WarmStartConfig(model="m", sources={"own": 0.0})


def test_key_follows_config_templates_weights_and_the_runs_benchmark(bench):
    """A run on another level of the benchmark holds out other problems: another warm start."""
    cfg = ws.WarmStartConfig(model="m")
    k = cfg.key(bench.templates, "w", "nl-arith", {})
    assert k == ws.WarmStartConfig(model="m").key(bench.templates, "w", "nl-arith", {})
    assert k != cfg.model_copy(update={"steps": 7}).key(bench.templates, "w", "nl-arith", {})
    assert k != cfg.key(bench.templates, "w2", "nl-arith", {})
    assert k != cfg.key(bench.templates, "w", "nl-arith", {"ops": "+"})
    from dataclasses import replace

    assert k != cfg.key(replace(bench.templates, null_feedback="Try again."), "w", "nl-arith", {})


def test_a_field_added_later_keys_only_off_its_default(bench):
    """``refine`` came after warm starts were built: at its default the key is the one they have."""
    cfg = ws.WarmStartConfig(model="m", critique="worked")
    config = cfg.model_dump(mode="json", exclude={*ws._NOT_IN_KEY, "refine"})
    payload = {"format": ws.WARM_START_FORMAT, "config": config,
               "templates": bench.templates.__dict__, "weights": "w", "benchmark": {"name": "nl-arith", "options": {}}}
    before = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert cfg.key(bench.templates, "w", "nl-arith", {}) == before
    assert cfg.model_copy(update={"refine": "worked"}).key(bench.templates, "w", "nl-arith", {}) != before
    with pytest.raises(ValueError, match="set critique: worked"):
        ws.WarmStartConfig(model="m", refine="worked")


def test_build_caches_a_checked_hf_checkpoint_and_a_run_loads_it(tiny_ckpt, tmp_path, monkeypatch, write_spec,
                                                                 one_torch_thread):
    """A 4-step warm start of the tiny checkpoint: an entry with the merged weights (changed by the
    SFT), its record, reuse without a rebuild, refusal of a changed weight file, and a run whose
    solver loads the warm start (its manifest says so)."""
    import torch
    from safetensors.torch import load_file

    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    cfg = ws.WarmStartConfig(model=str(tiny_ckpt), steps=4, batch=2, lr=1e-2, own_samples=1, max_new_tokens=8,
                             levels=[{"ops": "+", "n_train": 6, "n_validation": 0, "n_test": 0}])
    bench = NLArith()
    built = ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, progress=False)
    r = built.record
    assert r["sft"]["steps"] == 4 and r["own_attempts"]["n"] == r["data"]["problems"] == 33 + 6
    assert sum(r["data"]["conversations"].values()) == 8
    before = load_file(str(tiny_ckpt / "model.safetensors"))
    after = load_file(str(built.model_dir / "model.safetensors"))
    assert set(after) == set(before)  # merged: an ordinary checkpoint, no adapter tensors
    assert any(not torch.equal(before[k], after[k]) for k in before)
    again = ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, progress=False)
    assert again.directory == built.directory and again.record == r

    spec = {"name": "w", "seed": 3, "benchmark": {"name": "nl-arith"},
            "policies": {"solver": {"model": "hf", "path": str(tiny_ckpt), "lora": {"r": 2, "alpha": 4}}},
            "backend": {"name": "hf", "max_new_tokens": 8}, "algorithm": {"name": "grpo", "params": {"group_size": 2}},
            "train": {"steps": 1, "problems_per_step": 1}, "eval": {"every": 0, "limit": 2},
            "warm_start": json.loads(cfg.model_dump_json()), "output_dir": str(tmp_path / "runs")}
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    # the critic gate (METHOD v4): the tiny checkpoint never solves nl-arith, so J cannot be measured
    out = CliRunner().invoke(app, ["-q", "run", str(write_spec(spec))])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
    assert f"warm start {r['key']} fails the critic gate" in out.output and "warm_start.allow_invalid" in out.output
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("manifest.json"))
    gates = json.loads((built.directory / "gate.json").read_text())
    assert list(gates) == ["n=96,solver_T=1,critic_T=1,tokens=8/8,seed=0"]  # the run's temperatures, its limits
    assert gates[next(iter(gates))]["greedy"]["n_right"] == 0

    from mlmt_bench import runner

    measured = []
    monkeypatch.setattr(runner, "_gate_on", lambda *a, **k: measured.append(1))  # read from gate.json, not redone
    spec["warm_start"]["allow_invalid"] = True
    out = CliRunner().invoke(app, ["-q", "run", str(write_spec(spec))])
    assert out.exit_code == 0, out.output
    assert measured == []
    manifest = json.loads(next((tmp_path / "runs").rglob("manifest.json")).read_text())
    assert manifest["warm_start"]["key"] == r["key"]
    assert manifest["warm_start"]["gate"] == gates[next(iter(gates))]
    assert any("cannot be measured" in w for w in manifest["warm_start"]["invalid_because"])
    from mlmt_bench.report.compare import invalid_bases
    from mlmt_bench.report.runs import invalid_allowed_by, load_run

    invalid = invalid_bases({"grpo": [load_run(next((tmp_path / "runs").rglob("manifest.json")).parent)]})
    assert len(invalid) == 1 and invalid[0].startswith(f"warm start `{r['key']}` (from {tiny_ckpt})")
    assert invalid_allowed_by(invalid) == "`base.allow_invalid` or `warm_start.allow_invalid`"
    assert manifest["weights"]["solver"]["source"] == "warm start"
    assert manifest["weights"]["solver"]["sha256"] == r["sha256"]
    resolved = yaml.safe_load(next((tmp_path / "runs").rglob("spec.resolved.yaml")).read_text())
    assert resolved["policies"]["solver"]["path"] == str(tiny_ckpt)  # the spec as written: rebuilt on restore

    (built.model_dir / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(UserError, match="delete .* to build the warm start again"):
        ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, progress=False)


def test_a_shipped_warm_start_installs_the_same_checkpoint_without_a_build(tiny_ckpt, tmp_path, monkeypatch,
                                                                          one_torch_thread):
    """Shipped: the record, gate and adapter only; installed into an empty cache, the adapter merged
    into the pretrained weights gives the built checkpoint's sha256 (no SFT runs); a changed adapter
    file is refused in one line, and a merge that gives other weights too."""
    from mlmt_bench.warmstart import lora_merge, shipped_warm_starts as sw

    cfg = ws.WarmStartConfig(model=str(tiny_ckpt), steps=2, batch=2, lr=1e-2, own_samples=0, max_new_tokens=8)
    bench = NLArith()
    built = ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, tmp_path / "built", progress=False)
    assert (built.directory / "adapter" / "adapter.safetensors").is_file()
    (built.directory / "gate.json").write_text('{"slot": {}}\n')
    root = tmp_path / "shipped"
    entry = sw.ship(built.directory, root)
    assert sorted(json.loads((entry / "files.json").read_text())) == [
        "adapter/adapter.json", "adapter/adapter.safetensors", "gate.json", "warm_start.json"]
    assert not (entry / "model").exists()
    monkeypatch.setattr(sw, "SHIPPED_DIR", root)
    monkeypatch.setattr(sw.install, "__defaults__", (root,))
    monkeypatch.setattr(ws, "build", lambda *a, **k: pytest.fail("a shipped warm start was built"))
    installed = ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, tmp_path / "fresh", progress=False)
    assert installed.record == built.record and installed.directory != built.directory
    assert (installed.directory / "gate.json").read_text() == '{"slot": {}}\n'

    adapter = entry / "adapter" / "adapter.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-1] ^= 1
    adapter.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"^shipped warm start [0-9a-f]{16}: adapter/adapter\.safetensors is missing "
                                        r"or differs from its sha256"):
        ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, tmp_path / "fresh2", progress=False)
    assert [p.name for p in (tmp_path / "fresh2").iterdir() if not p.name.startswith(".lock")] == []

    entry = sw.ship(built.directory, root)
    pairs = lora_merge.load_adapter(entry / "adapter")
    name = next(iter(pairs))
    a, b, s = pairs[name]
    lora_merge.save_adapter({**pairs, name: (a, b, s * 2)}, entry / "adapter")  # other weights, files re-hashed
    files = json.loads((entry / "files.json").read_text())
    (entry / "files.json").write_text(json.dumps({k: hashlib.sha256((entry / k).read_bytes()).hexdigest()
                                                  for k in files}))
    with pytest.raises(UserError, match=r"^shipped warm start [0-9a-f]{16}: its adapter merged here does not give "
                                        r"the weights it was built with"):
        ws.ensure_warm_start(cfg, bench.templates, "nl-arith", {}, tmp_path / "fresh3", progress=False)


def test_exact_merge_matches_peft_and_is_a_fixed_order_sum():
    """The exact merge equals peft's merge to float32 rounding, and is W + s·Σ_k B[:,k]A[k,:] in float64
    rounded once (checked against numbers summed by hand in that order)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from mlmt_bench.warmstart import lora_merge

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            p.data.normal_()
    pairs = lora_merge.lora_pairs(peft_model)
    assert len(pairs) == 7 and all(s == 2.0 for _, _, s in pairs.values())
    reference = {k: v.clone() for k, v in peft_model.merge_and_unload().state_dict().items()}
    torch.manual_seed(0)
    plain = LlamaForCausalLM(model.config)
    before = plain.model.layers[0].mlp.down_proj.weight.detach().clone()
    lora_merge.merge_exact(plain, pairs)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, reference[k], rtol=0, atol=1e-6)
    a, b, s = pairs["model.layers.0.mlp.down_proj"]
    i, j = 3, 5
    want = float(before[i, j]) + s * (float(b[i, 0]) * float(a[0, j]) + float(b[i, 1]) * float(a[1, j]))
    assert plain.model.layers[0].mlp.down_proj.weight[i, j].item() == torch.tensor(want).float().item()


def test_validate_refuses_a_warm_start_no_role_loads_or_worked_critiques_unredacted(write_spec, tmp_path):
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    spec = {"name": "w", "benchmark": {"name": "nl-arith"},
            "policies": {"solver": {"model": "hf", "path": str(tmp_path)}},
            "algorithm": {"name": "grpo"}, "warm_start": {"model": "smollm2-135m-instruct"}}
    out = CliRunner().invoke(app, ["validate", str(write_spec(spec))])
    assert out.exit_code == 2 and "warm_start.model: no role of the run loads" in out.output
    spec["warm_start"] = {"model": "smollm2-135m-instruct", "critique": "worked"}
    spec["policies"]["solver"]["path"] = "smollm2-135m-instruct"
    out = CliRunner().invoke(app, ["validate", str(write_spec(spec))])
    assert out.exit_code == 2 and "set feedback.redact: true" in out.output
    assert len(out.output.strip().splitlines()) == 1  # worked critiques state values: never read unredacted
    spec["feedback"] = {"redact": True}
    assert CliRunner().invoke(app, ["validate", str(write_spec(spec))]).exit_code == 0
    spec["warm_start"] = {"model": str(tmp_path), "mix": {"solve": -1}}
    out = CliRunner().invoke(app, ["validate", str(write_spec(spec))])
    assert out.exit_code == 2 and "warm_start" in out.output and len(out.output.strip().splitlines()) == 1
