"""The vLLM backend on CPU, with a stand-in ``vllm`` module (the real one needs a CUDA GPU).

What these tests pin down: importing the backend does not import vllm; a missing vllm is a
one-line UserError; prompts reach vLLM as token ids, unchanged; outputs become Generations with
the HF backend's EOS convention; one engine per model object, started from a directory holding
the merged weights; and sync_weights pushes merged LoRA weights (base-model names, no lora_
tensors) into the engine in place, through whichever path the installed vLLM offers.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from mlmt_bench.errors import UserError
from mlmt_bench.rollout.backend import Generation
from mlmt_bench.rollout.vllm_backend import MISSING_VLLM, VLLMBackend, iter_merged_weights

# ----------------------------------------------------------------------------------------------
# a stand-in for vllm: records what it is given, returns canned outputs


class FakeLogprob:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob
        self.rank = 1


class FakeCompletion:
    def __init__(self, token_ids, finish_reason, stop_reason=None):
        self.token_ids = list(token_ids)
        # vLLM: one {token_id: Logprob} per position, holding the sampled token (logprobs=0)
        self.logprobs = [{t: FakeLogprob(-0.5 - i)} for i, t in enumerate(token_ids)]
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.text = "ignored"


class FakeRequestOutput:
    def __init__(self, prompt_token_ids, completion):
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [completion]


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLoRARequest:
    """vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path), as it is called."""

    def __init__(self, lora_name, lora_int_id, lora_path):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class FakeVLLMModel(torch.nn.Module):
    """What vLLM's model runner holds: a module with ``load_weights(iterable of (name, tensor))``."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.loads: list[dict[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.loads.append({k: v.detach().clone() for k, v in weights})
        return set(self.loads[-1])


def _ns(**kw):
    return types.SimpleNamespace(**kw)


class FakeLLM:
    """``mode``: where the model is reachable, as in the vLLM versions the backend supports.

    v0  llm.llm_engine.model_executor.driver_worker.model_runner.model
    v1  llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.get_model()
    rpc only llm.collective_rpc(callable, args=...) (V1 engine core in another process)
    none no in-place path at all (the backend must restart the engine)
    """

    mode = "v0"
    instances: list[FakeLLM] = []
    script = None  # callable(prompt_ids) -> FakeCompletion

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple[list, object]] = []
        self.lora_calls: list[FakeLoRARequest | None] = []  # the LoRARequest of each generate call
        self.resets = 0
        self.shutdowns = 0
        self.rpc_calls = 0
        self.model = FakeVLLMModel()
        self.dir_listing = sorted(p.name for p in Path(kwargs["model"]).iterdir())
        runner = _ns(model=self.model)
        if self.mode == "v0":
            self.llm_engine = _ns(model_executor=_ns(driver_worker=_ns(model_runner=runner)),
                                  shutdown=self._shutdown)
        elif self.mode == "v1":
            runner = _ns(get_model=lambda: self.model)
            executor = _ns(driver_worker=_ns(worker=_ns(model_runner=runner)))
            self.llm_engine = _ns(engine_core=_ns(engine_core=_ns(model_executor=executor), shutdown=self._shutdown))
        else:
            self.llm_engine = _ns(engine_core=_ns(shutdown=self._shutdown))
        if self.mode == "rpc":
            self._worker = _ns(model_runner=runner)
        FakeLLM.instances.append(self)

    def _shutdown(self):
        self.shutdowns += 1

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, **_):
        self.calls.append((prompts, sampling_params))
        self.lora_calls.append(lora_request)
        script = FakeLLM.script or (lambda ids: FakeCompletion([10, 11, 4], "stop"))
        return [FakeRequestOutput(p["prompt_token_ids"], script(p["prompt_token_ids"])) for p in prompts]

    def reset_prefix_cache(self):
        self.resets += 1
        return True

    def __getattr__(self, name):
        if name == "collective_rpc" and self.__dict__.get("_worker") is not None:
            def collective_rpc(method, timeout=None, args=(), kwargs=None):
                self.rpc_calls += 1
                return [method(self._worker, *args, **(kwargs or {}))]
            return collective_rpc
        raise AttributeError(name)


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM
    mod.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", mod)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr(FakeLLM, "instances", [])
    monkeypatch.setattr(FakeLLM, "mode", "v0")
    monkeypatch.setattr(FakeLLM, "script", None)
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_INSECURE_SERIALIZATION", "WORLD_SIZE", "RANK"):
        monkeypatch.setenv(var, "x")  # so that monkeypatch restores the variable's absence
        monkeypatch.delenv(var)
    return mod


@pytest.fixture
def backend(tmp_path):
    b = VLLMBackend(work_dir=str(tmp_path / "engines"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def tok():
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def tiny(tok, seed=0):
    from mlmt_bench.models.tiny import build_tiny_model

    return build_tiny_model("tiny-0.5m", tok, seed=seed)


def tiny_lora(tok):
    """tiny-0.5m wrapped with a LoRA adapter on every linear layer, with non-zero B (so the merge
    changes the weights)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny(tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def prompts_for(tok):
    from mlmt_bench.rollout.chat import chat_ids

    return [chat_ids(tok, [{"role": "user", "content": c}], add_generation_prompt=True) for c in ("1+1=", "2*3=")]


# ----------------------------------------------------------------------------------------------


def test_importing_the_backend_does_not_import_vllm():
    code = ("import sys, mlmt_bench.rollout.vllm_backend as m; from mlmt_bench import registry; "
            "registry.backends.get('vllm'); print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_missing_vllm_is_a_one_line_user_error(monkeypatch, backend, tok):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(UserError) as err:
        backend.generate(tiny(tok), tok, prompts_for(tok), max_new_tokens=4)
    assert str(err.value) == MISSING_VLLM
    assert "\n" not in str(err.value)
    assert backend.engines == {}  # nothing was saved or started


def test_unknown_option_and_lora_mode_are_user_errors():
    with pytest.raises(UserError, match="unknown option"):
        VLLMBackend(gpu_mem=0.5)
    with pytest.raises(UserError, match="lora_mode"):
        VLLMBackend(lora_mode="adapter")


def test_prompts_go_in_as_token_ids_unchanged(fake_vllm, backend, tok):
    prompts = prompts_for(tok)
    snapshot = copy.deepcopy(prompts)
    backend.generate(tiny(tok), tok, prompts, max_new_tokens=7, temperature=0.7, top_p=0.9, stop=["\n"])
    (llm,) = FakeLLM.instances
    inputs, params = llm.calls[0]
    assert inputs == [{"prompt_token_ids": p} for p in snapshot]
    assert prompts == snapshot  # not modified
    assert params.kwargs == dict(n=1, temperature=0.7, top_p=0.9, max_tokens=7, logprobs=0, stop=["\n"],
                                 stop_token_ids=[tok.eos_token_id])


def test_temperature_zero_is_greedy_and_a_seed_gives_each_request_its_own(fake_vllm, backend, tok):
    model = tiny(tok)
    prompts = prompts_for(tok) * 2  # a group: the same prompt several times
    backend.generate(model, tok, prompts, max_new_tokens=3, temperature=0.0, top_p=0.5)
    _, params = FakeLLM.instances[0].calls[0]
    assert params.kwargs["temperature"] == 0.0 and params.kwargs["top_p"] == 1.0
    backend.generate(model, tok, prompts, max_new_tokens=3, temperature=1.0, seed=123)
    _, params = FakeLLM.instances[0].calls[1]
    assert isinstance(params, list) and len(params) == len(prompts)
    seeds = [p.kwargs["seed"] for p in params]
    assert len(set(seeds)) == len(prompts)


def test_outputs_become_generations_with_the_hf_eos_convention(fake_vllm, backend, tok):
    eos = tok.eos_token_id
    a, b = tok.convert_tokens_to_ids(["a", "b"])
    cases = {
        # prompt marker -> (vLLM completion, expected ids, expected finish_reason)
        0: (FakeCompletion([a, b, eos], "stop"), [a, b, eos], "stop"),           # EOS included (vLLM V1)
        1: (FakeCompletion([a, b], "stop"), [a, b, eos], "stop"),                # EOS left out: put back
        2: (FakeCompletion([a, b, a], "length"), [a, b, a], "length"),           # max_tokens
        3: (FakeCompletion([a, b, eos], "length"), [a, b, eos], "stop"),         # EOS on the last token
        4: (FakeCompletion([a, b], "stop", stop_reason="b"), [a, b], "stop"),    # stop string: no EOS
    }
    FakeLLM.script = lambda ids: copy.deepcopy(cases[ids[0]][0])
    gens = backend.generate(tiny(tok), tok, [[k, 5, 6] for k in cases], max_new_tokens=3, temperature=1.0)
    for k, g in zip(cases, gens):
        _, ids, reason = cases[k]
        assert isinstance(g, Generation)
        assert g.ids == ids, k
        assert g.finish_reason == reason, k
        assert len(g.logprobs) == len(g.ids)
        n = len(cases[k][0].token_ids)
        assert g.logprobs[:n] == [-0.5 - i for i in range(n)]  # the sampled tokens' log-probs
        assert g.text == tok.decode(ids, skip_special_tokens=True) == "ab" + ("a" if k == 2 else "")


def test_one_engine_per_model_object_started_from_a_saved_directory(fake_vllm, backend, tok):
    solver, critic = tiny(tok, seed=0), tiny(tok, seed=1)
    p = prompts_for(tok)
    backend.generate(solver, tok, p, max_new_tokens=2)
    backend.generate(solver, tok, p, max_new_tokens=2)
    assert len(FakeLLM.instances) == 1
    backend.generate(critic, tok, p, max_new_tokens=2)
    assert len(FakeLLM.instances) == 2
    backend.generate(critic, tok, p, max_new_tokens=2)
    assert len(FakeLLM.instances) == 2
    first = FakeLLM.instances[0]
    kw = first.kwargs
    assert kw["gpu_memory_utilization"] == 0.3
    assert kw["dtype"] == "float32"  # the training model's dtype
    assert kw["enable_prefix_caching"] is True
    assert "distributed_executor_backend" not in kw
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(first.dir_listing)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # engine core in this process
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ  # nothing is pickled to another process
    dirs = [Path(e.directory) for e in backend.engines.values()]
    backend.close()
    assert all(llm.shutdowns == 1 for llm in FakeLLM.instances)
    assert not any(d.exists() for d in dirs)


def test_the_engine_directory_holds_the_merged_lora_weights(fake_vllm, backend, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_lora(tok)
    backend.generate(model, tok, prompts_for(tok), max_new_tokens=2)
    directory = Path(FakeLLM.instances[0].kwargs["model"])
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])
    assert AutoTokenizer.from_pretrained(directory).eos_token_id == tok.eos_token_id


def test_merged_weights_have_base_names_and_no_lora_tensors(tok):
    model = tiny_lora(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = dict(iter_merged_weights(model))
    base_names = set(tiny(tok).state_dict())
    assert set(merged) == base_names
    assert not any("lora_" in k or "base_layer" in k or k.startswith("base_model.") for k in merged)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    changed = 0
    for k, v in reference.items():
        torch.testing.assert_close(merged[k], v)
        changed += not torch.equal(merged[k], tiny(tok).state_dict()[k])
    assert changed > 0  # the adapter did change some weights
    # the training model is untouched: nothing merged in place
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_merged_weights_of_a_plain_model_are_its_state_dict(tok):
    model = tiny(tok)
    merged = dict(iter_merged_weights(model))
    assert merged.keys() == model.state_dict().keys()


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_sync_weights_loads_merged_weights_in_place(fake_vllm, backend, tok, mode):
    FakeLLM.mode = mode
    model = tiny_lora(tok)
    backend.generate(model, tok, prompts_for(tok), max_new_tokens=2)
    (llm,) = FakeLLM.instances
    with torch.no_grad():  # an optimiser step on the adapter
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.add_(0.01)
    backend.sync_weights(model)
    assert len(FakeLLM.instances) == 1  # no restart
    assert backend.last_sync_path == "inprocess"
    (loaded,) = llm.model.loads
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(loaded) == set(expected)
    assert not any("lora_" in k for k in loaded)
    for k in expected:
        torch.testing.assert_close(loaded[k], expected[k])
    assert llm.resets == 1  # the prefix cache held KV computed with the old weights


def test_sync_weights_through_collective_rpc_when_the_engine_is_in_another_process(fake_vllm, backend, tok):
    FakeLLM.mode = "rpc"
    model = tiny_lora(tok)
    backend.generate(model, tok, prompts_for(tok), max_new_tokens=2)
    backend.sync_weights(model)
    (llm,) = FakeLLM.instances
    assert backend.last_sync_path == "rpc"
    assert llm.rpc_calls == 1 and llm.resets == 1
    (loaded,) = llm.model.loads
    assert set(loaded) == set(tiny(tok).state_dict())


def test_sync_weights_restarts_the_engine_when_no_in_place_path_exists(fake_vllm, backend, tok):
    FakeLLM.mode = "none"
    model = tiny_lora(tok)
    backend.generate(model, tok, prompts_for(tok), max_new_tokens=2)
    old_dir = Path(FakeLLM.instances[0].kwargs["model"])
    backend.sync_weights(model)
    assert backend.last_sync_path == "restart"
    first, second = FakeLLM.instances
    assert first.shutdowns == 1
    assert second.kwargs["model"] != first.kwargs["model"] and not old_dir.exists()
    backend.generate(model, tok, prompts_for(tok), max_new_tokens=2)
    assert len(FakeLLM.instances) == 2 and len(second.calls) == 1


def test_sync_weights_without_an_engine_is_a_no_op(fake_vllm, backend, tok):
    backend.sync_weights(tiny(tok))
    assert FakeLLM.instances == [] and backend.last_sync_path is None


def test_under_accelerate_launch_each_process_uses_the_external_launcher(fake_vllm, monkeypatch, tok, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    b = VLLMBackend(seed=7, work_dir=str(tmp_path))
    b.generate(tiny(tok), tok, prompts_for(tok), max_new_tokens=2)
    kw = FakeLLM.instances[0].kwargs
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["seed"] == 8  # seed + rank
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    b.close()


def test_an_engine_in_another_process_allows_the_rpc_path(fake_vllm, tok, tmp_path):
    b = VLLMBackend(inprocess=False, work_dir=str(tmp_path))
    b.generate(tiny(tok), tok, prompts_for(tok), max_new_tokens=2)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # vLLM's default: a separate process
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    b.close()


# roles on one base (policies.share_base): one engine, a LoRA request per adapter and turn


def _one_base_trainer(tmp_path, ckpt):
    from mlmt_bench.spec import validate_run
    from support import build_trainer, make_spec

    raw = make_spec(tmp_path, ckpt, "mlmt", {"beta": 0.0}, train={"steps": 1, "problems_per_step": 2}).model_dump(
        mode="json")
    raw["policies"]["share_base"] = True
    for role, r in (("solver", 4), ("critic", 12)):
        raw["policies"][role]["lora"] = {"r": r, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    raw["backend"] = {"name": "vllm", "max_new_tokens": 4, "options": {"work_dir": str(tmp_path / "engines")}}
    return build_trainer(validate_run(raw, "test"), tmp_path)


def _saved_adapter(request):
    from safetensors.torch import load_file

    return load_file(str(Path(request.lora_path) / "adapter_model.safetensors"))


def test_one_base_is_one_engine_and_each_turn_runs_on_its_adapters_request(fake_vllm, tiny_ckpt, tmp_path):
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.episodes import rollout

    FakeLLM.script = lambda ids: FakeCompletion([5, 6], "length")
    trainer = _one_base_trainer(tmp_path, tiny_ckpt)
    solver, critic = trainer.policies["solver"].model, trainer.policies["critic"].model
    ro = rollout(trainer.algorithm.program(0), trainer.actors, trainer.batch(0), trainer.sampling)
    (llm,) = FakeLLM.instances  # one engine for both roles
    assert {k: llm.kwargs[k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == {
        "enable_lora": True, "max_loras": 2, "max_lora_rank": 16}  # vLLM's smallest rank ≥ 12
    kinds = [k for k in ("attempt", "feedback", "refine") if ro.of_kind(k)]
    assert kinds == ["attempt", "feedback", "refine"] and len(llm.lora_calls) == 3
    served = [req.lora_name.split("-")[0] for req in llm.lora_calls]
    assert served == ["solver", "critic", "solver"]  # which adapter served which turn
    assert llm.lora_calls[0] is llm.lora_calls[2]  # no re-save between the solver's turns
    for req, view in ((llm.lora_calls[0], solver), (llm.lora_calls[1], critic)):
        want = view.adapter_state()
        got = _saved_adapter(req)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    from transformers import AutoModelForCausalLM

    engine_base = AutoModelForCausalLM.from_pretrained(llm.kwargs["model"]).state_dict()
    plain = load_checkpoint(tiny_ckpt)[0].state_dict()
    assert engine_base.keys() == plain.keys() and all(torch.equal(engine_base[k], plain[k]) for k in plain)

    with torch.no_grad():  # an update of the solver's adapter, then the sync the trainer does
        next(p for n, p in solver.named_parameters() if "lora_B" in n).add_(0.5)
    trainer.actors.backend.sync_weights(solver)
    assert not Path(llm.lora_calls[0].lora_path).exists()  # the retired adapter's copy is gone
    p = prompts_for(trainer.policies["solver"].tokenizer)
    for view in (solver, critic):
        trainer.actors.backend.generate(view, trainer.policies["solver"].tokenizer, p, max_new_tokens=2)
    new_solver, same_critic = llm.lora_calls[-2:]
    assert new_solver.lora_int_id not in {r.lora_int_id for r in llm.lora_calls[:3]}  # a new id: vLLM reloads it
    assert same_critic is llm.lora_calls[1]
    got, want = _saved_adapter(new_solver), solver.adapter_state()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert llm.shutdowns == 0 and not llm.model.loads  # the base was never reloaded
