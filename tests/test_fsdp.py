"""mlmt_bench/fsdp.py in one process (the two-process runs are in test_distributed.py)."""

from __future__ import annotations

import torch

from mlmt_bench.fsdp import Sharding, _adapter_to_model_keys, _param_names, gathered, is_sharded
from mlmt_bench.machine.dist import Dist
from mlmt_bench.models.policy import build_policy
from mlmt_bench.models.policy_spec import PolicySpec


def test_saved_adapter_names_map_back_to_the_model_parameters(tiny_ckpt, tmp_path):
    from safetensors.torch import load_file

    spec = PolicySpec(model="tiny", path=str(tiny_ckpt),
                      lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    policy = build_policy("solver", spec, str(tiny_ckpt))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_" in n:
                p.normal_()
    policy.save(tmp_path / "adapter")
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    mapped = _adapter_to_model_keys(policy.model, "default", saved)
    params = dict(policy.model.named_parameters())
    lora = {n for n in params if "lora_" in n}
    assert set(mapped) == lora and len(lora) == 8  # 2 layers × (q, v) × (A, B)
    assert all(torch.equal(mapped[n], params[n].detach()) for n in lora)


def test_optimizer_ids_are_the_parameter_order(tiny_ckpt):
    policy = build_policy("solver", PolicySpec(model="tiny", path=str(tiny_ckpt)), str(tiny_ckpt))
    opt = torch.optim.AdamW(policy.trainable_parameters())
    names = _param_names(policy.model, opt)
    assert names == [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert len(opt.state_dict()["param_groups"][0]["params"]) == len(names)


def test_without_fsdp_everything_is_the_plain_path(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # but one process: nothing to shard
    policy = build_policy("solver", PolicySpec(model="tiny", path=str(tiny_ckpt)), str(tiny_ckpt))
    sharding = Sharding(Dist())
    assert not sharding.enabled
    sharding.shard([policy])
    assert not is_sharded(policy.model) and sharding.models == []
    opt = torch.optim.AdamW(policy.trainable_parameters())
    state, optim = sharding.full_state(policy, opt)
    assert state is None and optim == opt.state_dict()
    with sharding.full_params(), gathered(policy.model):
        pass
