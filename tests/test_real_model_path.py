"""The real-model path (issue 32): what tiny-model runs never showed.

- a ``share_base`` role's saved adapter names its base, so peft alone loads it (offline);
- truncation is measured (``completions/clipped_ratio``, overall and per turn kind, in training
  and evaluation metrics) and said once when a step trains nothing or is mostly clipped;
- ``validate`` refuses a local model path that does not exist, and fails fast on a hub name the
  machine cannot reach; ``plan`` reads a local path as local.
"""

from __future__ import annotations

import json

import pytest

from mlmt_bench.spec import validate_run
from support import build_trainer, make_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _share_base_spec(tmp_path, ckpt, **over):
    raw = make_spec(tmp_path, ckpt, "mlmt", train={"steps": 1, "problems_per_step": 2}, **over).model_dump(mode="json")
    raw["policies"]["share_base"] = True
    for role in ("solver", "critic"):
        raw["policies"][role]["lora"] = LORA
    return validate_run(raw, "test")


def test_a_share_base_critic_checkpoint_loads_with_peft_alone(tiny_ckpt, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    trainer = build_trainer(_share_base_spec(tmp_path, tiny_ckpt), tmp_path)
    trainer.train()
    ckpt = trainer.save_checkpoint()
    assert ckpt is not None
    for role in ("solver", "critic"):
        config = json.loads((ckpt / role / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(tiny_ckpt.resolve())  # was null for the critic
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoPeftModelForCausalLM.from_pretrained(str(ckpt / "critic"))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    saved = trainer.policies["critic"].model.adapter_state()
    assert len(loaded) == len(saved) > 0
    for key, value in saved.items():  # the critic's own adapter, not the solver's
        match = [v for k, v in loaded.items() if k.replace(".default", "") == key]
        assert len(match) == 1 and match[0].equal(value), key


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]


def test_truncation_is_measured_and_said_once(tiny_ckpt, tmp_path, capsys):
    """Two tokens per turn: an untrained tiny model almost never stops that soon."""
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", train={"steps": 2, "problems_per_step": 2})
    spec.backend.max_new_tokens = spec.backend.feedback_max_new_tokens = 2
    spec.eval.every = 2
    trainer = build_trainer(spec, tmp_path)
    trainer.train()
    rows = trainer.run_dir.metrics()
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(train) == 2 and evals
    for r in train + evals:
        for kind in ("", "/attempt", "/feedback", "/refine"):
            assert 0.5 < r[f"completions/clipped_ratio{kind}"] <= 1.0
    lines = _warnings(capsys)
    assert len(lines) == 1 and "hit the length limit" in lines[0], lines  # once, not every step
    assert "raise backend.max_new_tokens" in lines[0]


class ClippingBackend:
    """Every generation runs to the length limit: ``max_new_tokens`` copies of one character."""

    def generate(self, model, tokenizer, prompts, *, max_new_tokens, **_):
        from mlmt_bench.rollout.backend import Generation

        ids = tokenizer.encode("7", add_special_tokens=False) * max_new_tokens
        return [Generation(list(ids), [0.0] * len(ids), "length", tokenizer.decode(ids)) for _ in prompts]


def test_a_step_that_trains_nothing_is_said_once(tiny_ckpt, tmp_path, capsys):
    """All clipped to one length: every group's rewards tie (ParityVerifier), no token trains."""
    spec = make_spec(tmp_path, tiny_ckpt, "grpo", train={"steps": 2, "problems_per_step": 2})
    trainer = build_trainer(spec, tmp_path)
    trainer.actors.backend = ClippingBackend()
    trainer.train()
    train = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"]
    assert [(r["completions/clipped_ratio"], r["completions/clipped_ratio/attempt"]) for r in train] == [(1.0, 1.0)] * 2
    assert all(r.get("trained_tokens/solver", 0) == 0 for r in train)
    lines = _warnings(capsys)
    assert len(lines) == 1 and lines[0].startswith("warning: step 1 trained no token"), lines
    assert "100% of its completions hit the length limit (attempt 100%)" in lines[0]


def test_no_warning_when_completions_end(tiny_ckpt, tmp_path, capsys):
    from support import ScriptedBackend

    class Scripted(ScriptedBackend):
        def sync_weights(self, *args, **kwargs):
            pass

    spec = make_spec(tmp_path, tiny_ckpt, "grpo", train={"steps": 1, "problems_per_step": 1})
    trainer = build_trainer(spec, tmp_path)
    trainer.actors.backend = Scripted(["12", "123"] * 40)  # even and odd lengths: rewards 1 and 0
    trainer.train()
    train = [r for r in trainer.run_dir.metrics() if r["kind"] == "train"]
    assert train[0]["completions/clipped_ratio"] == 0.0 and train[0]["completions/clipped_ratio/attempt"] == 0.0
    assert train[0]["trained_tokens/solver"] > 0
    assert _warnings(capsys) == []


# model paths: validate, plan, load --------------------------------------------------------------


def _hf_spec(write_spec, path: str):
    return str(write_spec({"name": "t", "benchmark": {"name": "synthetic-arith", "eval_limit": 8},
                           "policies": {"solver": {"model": "hf", "path": path}},
                           "algorithm": {"name": "grpo", "params": {"group_size": 2}},
                           "train": {"steps": 1, "problems_per_step": 2}}))


@pytest.mark.parametrize("path", ["./nowhere", "../nowhere-at-all", "/no/such/model", "~/no-such-model-dir",
                                  "ckpt/step-9"])
def test_validate_refuses_a_local_model_path_that_does_not_exist(tiny_ckpt, write_spec, monkeypatch, path):
    from support import one_line_error

    monkeypatch.chdir(tiny_ckpt.parent.parent)  # "ckpt/step-9": its first folder exists here
    (tiny_ckpt.parent.parent / "ckpt").mkdir(exist_ok=True)
    one_line_error(["validate", _hf_spec(write_spec, path)], f"policies.solver.path: {path}: no such local directory")
    # plan reads it as a local path too (it said "no registry/models/*.yaml with hub: ./nowhere")
    one_line_error(["plan", _hf_spec(write_spec, path)], "no such local directory")


def test_validate_accepts_a_local_directory_and_does_not_look_up_hub_names(tiny_ckpt, write_spec, monkeypatch):
    from typer.testing import CliRunner

    from mlmt_bench.cli import app

    monkeypatch.chdir(tiny_ckpt.parent)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in ("./ckpt", str(tiny_ckpt), "someorg/not-cached-here", "smollm2-135m-instruct"):
        res = CliRunner().invoke(app, ["validate", _hf_spec(write_spec, path)])
        assert res.exit_code == 0, (path, res.stderr)


def test_plan_reads_a_relative_local_path_as_local(tiny_ckpt, write_spec, monkeypatch):
    from mlmt_bench.plan import plan_spec

    monkeypatch.chdir(tiny_ckpt.parent)
    plan = plan_spec(_hf_spec(write_spec, "./ckpt"), [], device="cpu")
    assert plan["policies"][0]["source"].endswith("ckpt/config.json")


def test_looks_local():
    from mlmt_bench.models.hub import looks_local

    for path in ("/a/b", "./a", "../a", "~/a", ".", "tests/nowhere"):
        assert looks_local(path), path
    for path in ("org/name", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "smollm2-135m-instruct"):
        assert not looks_local(path), path


def _fake_hub_cache(root, repo: str) -> None:
    """The hub client's cache layout holding ``repo``'s config.json at one commit."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


def test_a_hub_name_the_hub_cannot_give_fails_fast(tmp_path, monkeypatch):
    """No network (the endpoint refuses at once) or HF_HUB_OFFLINE: an uncached hub name is one
    line before the hub client is asked (its retries took 58 s); a cached one loads from the
    cache alone."""
    import transformers
    from huggingface_hub import constants

    from mlmt_bench.errors import UserError
    from mlmt_bench.models import hub
    from mlmt_bench.models.policy import _load

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "_reachable", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _fake_hub_cache(tmp_path, "someorg/cached")
    assert not hub.hub_reachable()
    assert hub.hub_load_from_cache("someorg/cached") is True

    def hub_client(*args, **kwargs):  # the hub client's retries are what took a minute: it is never asked
        raise AssertionError("the hub client was asked")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub_client)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", hub_client)
    with pytest.raises(UserError, match="'someorg/nomodel': not a local directory, not in the local hub cache, "
                                        "and the hub did not answer within 3 s"):
        _load("someorg/nomodel", "float32", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the local hub cache, and HF_HUB_OFFLINE is set"):
        _load("someorg/nomodel", "float32", None)
    assert hub.hub_load_from_cache("someorg/cached") is True
