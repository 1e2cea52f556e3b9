"""The memo of step-0 evaluations (``mlmt_bench/io/eval_memo.py``): runs that start from the same
weights read the first one's starting evaluation instead of generating it again, and what they log
equals what evaluating would have logged."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mlmt_bench.evaluate import EvalResult
from mlmt_bench.io import eval_memo
from mlmt_bench.rollout.episodes import Rollout


def _tiny_lora(seed: int, tiny_ckpt):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt))
    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))


def test_weights_identity_sees_the_weights_not_the_fresh_adapter_or_the_wrapping(tiny_ckpt):
    from transformers import AutoModelForCausalLM

    plain = eval_memo.weights_identity(AutoModelForCausalLM.from_pretrained(str(tiny_ckpt)))
    a, b = _tiny_lora(0, tiny_ckpt), _tiny_lora(1, tiny_ckpt)
    assert eval_memo.weights_identity(a) == eval_memo.weights_identity(b) == plain  # B = 0: a no-op adapter
    next(p for n, p in b.named_parameters() if "lora_B" in n).data[0, 0] = 1e-3
    assert eval_memo.weights_identity(b) is None  # trained: not the start
    base = next(p for n, p in a.named_parameters() if "lora_" not in n and p.dim() == 2)
    base.data[0, 0] += 1.0
    assert eval_memo.weights_identity(a) not in (None, plain)


def test_the_key_tells_cpus_of_one_name_with_other_kernels_apart(monkeypatch):
    """"AMD EPYC" names a Zen 3 (AVX2) and a Zen 4 (AVX-512, bfloat16 instructions) alike; their
    kernels round differently, so a memo written on one is not read on the other."""
    from mlmt_bench.machine import cpus

    parts = {"what": "step 0"}
    here = eval_memo.memo_key(parts)
    assert eval_memo.memo_key(parts) == here  # the same machine: the same key
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "NOT-THIS-ONE")
    other_isa = eval_memo.memo_key(parts)
    monkeypatch.undo()
    monkeypatch.setattr(cpus, "bf16_instructions", lambda cpuinfo=None: ["NOT-THIS-ONE"])
    assert len({here, other_isa, eval_memo.memo_key(parts)}) == 3


def test_the_key_tells_package_versions_that_compute_apart(monkeypatch):
    """peft 0.21.2 and 0.22.0 may run the same weights differently: another version of a package
    that computes is another key; one that computes nothing (optuna) is not."""
    from mlmt_bench import tracking

    installed = tracking.package_versions()
    parts = {"what": "step 0"}
    here = eval_memo.memo_key(parts)
    monkeypatch.setattr(tracking, "package_versions", lambda: {**installed, "optuna": "0.0.1"})
    assert eval_memo.memo_key(parts) == here
    monkeypatch.setattr(tracking, "package_versions", lambda: {**installed, "peft": "0.0.1"})
    assert eval_memo.memo_key(parts) != here


def test_evaluate_once_reads_a_stored_result_and_slices_its_episodes(tmp_path):
    calls = []

    def run(n: int) -> EvalResult:
        calls.append(n)
        return EvalResult({"acc@t1": 0.5, "n": 3}, [{"problem_id": f"p{i}", "t1": i == 0} for i in range(3)],
                          [{"problem_id": f"p{i}"} for i in range(n)], {"solver": 10}, {"solver": 7},
                          rollout=episodes)

    episodes = Rollout([], [], {"solver": 7}, 1.0)  # kept in memory, never stored
    first, read = eval_memo.evaluate_once("k", 1, 3, run, EvalResult, tmp_path)
    assert (read, calls, [s["problem_id"] for s in first.samples]) == (False, [3], ["p0"])
    assert first.rollout is episodes and "rollout" not in json.loads((tmp_path / "k.json").read_text())
    again, read = eval_memo.evaluate_once("k", 2, 3, run, EvalResult, tmp_path)
    assert read and calls == [3] and [s["problem_id"] for s in again.samples] == ["p0", "p1"]
    assert again.rollout is None
    assert (again.metrics, again.per_problem, again.gen_tokens) == (first.metrics, first.per_problem, {"solver": 7})
    (tmp_path / "k.json").write_text("{not json")
    _, read = eval_memo.evaluate_once("k", 0, 3, run, EvalResult, tmp_path)
    assert not read and calls == [3, 3]  # an unreadable entry is evaluated again and replaced
    assert json.loads((tmp_path / "k.json").read_text())["metrics"]["acc@t1"] == 0.5
    _, read = eval_memo.evaluate_once(None, 0, 3, run, EvalResult, tmp_path)
    assert not read and calls == [3, 3, 0]


def _run(tiny_ckpt, tmp_path, seed: int, algorithm: dict, extra_eval: dict | None = None) -> list[dict]:
    from mlmt_bench import runner
    from mlmt_bench.spec import RunSpec

    spec = RunSpec.model_validate({
        "name": f"m{seed}", "seed": seed, "benchmark": {"name": "nl-arith"},
        "policies": {"solver": {"model": "hf", "path": str(tiny_ckpt), "lora": {"r": 2, "alpha": 4}},
                     "critic": {"model": "hf", "path": str(tiny_ckpt), "lora": {"r": 2, "alpha": 4}}},
        "backend": {"name": "hf", "max_new_tokens": 6}, "algorithm": algorithm,
        "train": {"steps": 1, "problems_per_step": 1}, "eval": {"every": 0, "limit": 3, "samples": 1,
                                                                **(extra_eval or {})},
        "output_dir": str(tmp_path / "runs")})
    run_dir = Path(runner.run(spec, progress=False)["run_dir"])
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    return evals, json.loads((run_dir / "manifest.json").read_text()).get("eval_memo")


_NOT_COMPARED = {"wall_s", "memory", "rss_peak_mb"}


def _same(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b)
            if k not in _NOT_COMPARED and not k.startswith("mem") and a.get(k) != b.get(k)}


def test_a_second_seed_reads_the_first_seeds_starting_evaluation(tiny_ckpt, tmp_path, one_torch_thread):
    """Seeds 0, 1 and 2 of mlmt start from the same weights: seed 1's step-0 evaluation is read from
    the memo (its manifest says so) and logs what seed 0's logged; its final one is evaluated. With
    ``eval.memo: false`` seed 2 evaluates, and gets the same numbers."""
    mlmt = {"name": "mlmt", "params": {"group_size": 2}}
    (s0, memo0), (s1, memo1), (s2, memo2) = (_run(tiny_ckpt, tmp_path, seed, mlmt, extra)
                                             for seed, extra in ((0, None), (1, None), (2, {"memo": False})))
    assert s0[0]["step"] == s1[0]["step"] == s2[0]["step"] == 0 and s1[-1]["step"] > 0
    assert memo0 is None and memo2 is None and list(memo1) == ["eval"]  # only step 0's
    assert (tmp_path / "eval-memo" / f"{memo1['eval']}.json").is_file()
    assert _same(s0[0], s1[0]) == {} and _same(s0[0], s2[0]) == {}


def test_grpo_with_a_base_critic_reads_mlmts_starting_refine_evaluation(tiny_ckpt, tmp_path, one_torch_thread):
    """The frozen critic of ``eval.base_critic`` and a fresh adapter on it are the same weights: grpo's
    step-0 base-critic evaluation is mlmt's step-0 evaluation, read from the memo."""
    mlmt, _ = _run(tiny_ckpt, tmp_path, 0, {"name": "mlmt", "params": {"group_size": 2}})
    grpo, memo = _run(tiny_ckpt, tmp_path, 0, {"name": "grpo", "params": {"group_size": 2}}, {"base_critic": True})
    assert list(memo) == ["base_critic"]
    for k in ("acc@t1", "acc@t2", "gen_tokens_eval"):
        assert grpo[0][f"base_critic/{k}"] == mlmt[0][k]
