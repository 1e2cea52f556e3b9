"""Tiny Llama presets: read from registry/models, built deterministically, saved and reloaded exactly."""

from __future__ import annotations

import pytest
import torch

from mlmt_bench.errors import UserError
from mlmt_bench.models.tiny import (
    build_tiny_model,
    load_checkpoint,
    load_preset,
    num_parameters,
    preset_names,
    save_checkpoint,
    tiny_config,
)
from mlmt_bench.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_presets_come_from_the_registry_yaml(tok):
    assert {"tiny-0.5m", "tiny-2m", "tiny-8m", "tiny-20m"} <= set(preset_names())
    for name, (lo, hi) in {"tiny-0.5m": (0.3e6, 0.8e6), "tiny-2m": (1.5e6, 2.5e6),
                           "tiny-8m": (6e6, 10e6), "tiny-20m": (15e6, 25e6)}.items():
        cfg = tiny_config(name, tok)
        assert cfg.hidden_size == load_preset(name)["config"]["hidden_size"]
        assert cfg.vocab_size == len(tok) and cfg.tie_word_embeddings and cfg.bos_token_id is None
        assert cfg.eos_token_id == tok.eos_token_id and cfg.pad_token_id == tok.pad_token_id
        assert cfg.max_position_embeddings <= 1024
        # Parameters of a Llama with tied embeddings, from the config numbers alone.
        d, f, n, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
        kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
        params = v * d + n * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d
        assert lo <= params <= hi, (name, params)
    assert num_parameters(build_tiny_model("tiny-0.5m", tok)) == \
        sum(p.numel() for p in build_tiny_model("tiny-0.5m", tok).model.parameters())


def test_an_installed_copy_finds_the_presets_under_its_prefix(tmp_path, monkeypatch):
    """What a wheel install sees: no registry/ in the working directory or beside the package,
    the presets in <sys.prefix>/share/mlmt-bench/registry/models (pyproject's data-files)."""
    import shutil
    import sys

    import mlmt_bench.models.tiny as tiny

    share = tmp_path / "prefix" / "share" / "mlmt-bench" / "registry" / "models"
    share.mkdir(parents=True)
    shutil.copy(tiny.registry_dirs()[-2] / "tiny-2m.yaml", share / "tiny-2m.yaml")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tiny, "__file__", str(tmp_path / "site-packages" / "mlmt_bench" / "models" / "tiny.py"))
    monkeypatch.delenv("MLMT_BENCH_REGISTRY", raising=False)
    assert preset_names() == ["tiny-2m"]
    assert load_preset("tiny-2m")["name"] == "tiny-2m"


def test_unknown_preset_says_what_exists(tok):
    with pytest.raises(UserError, match="did you mean 'tiny-2m'"):
        build_tiny_model("tiny-2n", tok)


def test_init_is_deterministic_and_leaves_the_global_rng_alone(tok):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_tiny_model("tiny-0.5m", tok, seed=7)
    assert torch.equal(torch.rand(3), expected)
    b = build_tiny_model("tiny-0.5m", tok, seed=7)
    c = build_tiny_model("tiny-0.5m", tok, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_save_load_gives_bit_identical_logits(tok, tmp_path):
    model = build_tiny_model("tiny-0.5m", tok, seed=1)
    with torch.no_grad():  # move the weights off their init so that tying and loading matter
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.eval()
    save_checkpoint(model, tok, tmp_path / "ckpt")
    loaded, tok2 = load_checkpoint(tmp_path / "ckpt")
    assert type(loaded).__name__ == "LlamaForCausalLM" and len(tok2) == len(tok)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([tok("<|user|>7+5*3-4<|end|><|assistant|>7+5=12;")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    from transformers import AutoModelForCausalLM

    auto = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, auto(ids).logits)


def test_a_lora_spec_adapts_every_linear_layer_by_default(tiny_ckpt):
    """``lora: {r: 2}`` puts an adapter on all seven projections of every layer, not on the head."""
    from mlmt_bench.models.policy import build_policy
    from mlmt_bench.models.policy_spec import LoraSpec, PolicySpec

    policy = build_policy("solver", PolicySpec(model="tiny", lora=LoraSpec(r=2)), str(tiny_ckpt))
    adapted = {name.split(".")[-2] for name, _ in policy.model.named_modules() if name.endswith(".lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
