"""`mlmt-bench eval`: lm-evaluation-harness on a checkpoint, with local task files (no hub)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlmt_bench.errors import UserError
from mlmt_bench.external_eval import harness_model_args, resolve_checkpoint, summarise
from support import require

QUESTIONS = [f"{a}+{b}=" for a in range(1, 5) for b in range(1, 4)]


@pytest.fixture
def harness() -> None:
    """lm-evaluation-harness (the `eval` extra, which `make test` installs): the tests that run it
    skip without it, and fail under CI."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        require(False, "lm-evaluation-harness (the `eval` extra: pip install .[eval])")


def _task_dir(tmp_path: Path, rows: list[dict], gen_targets: list[str] | None = None) -> Path:
    d = tmp_path / "tasks"
    d.mkdir(exist_ok=True)
    data = d / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (d / "mc.yaml").write_text(
        "task: local_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    (d / "gen.yaml").write_text(
        "task: local_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{target}}'\ngeneration_kwargs:\n  until: ['\\n']\n  max_gen_toks: 4\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return d


def _loglik(model, tok, context: str, continuation: str) -> float:
    """Sum of log p(continuation | context) with the model, computed here (not by the harness)."""
    import torch

    from mlmt_bench.models.tokenizer import encode

    ctx, cont = encode(tok, context), encode(tok, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    return float(sum(logp[len(ctx) - 1 + i, t] for i, t in enumerate(cont)))


def _greedy(model, tok, context: str, n: int) -> str:
    import torch

    from mlmt_bench.models.tokenizer import encode

    ids = torch.tensor([encode(tok, context)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0]


@pytest.fixture(scope="module")
def model_and_rows(tiny_ckpt: Path):
    from mlmt_bench.models.tiny import load_checkpoint

    model, tok = load_checkpoint(tiny_ckpt)
    model.eval()
    rows = []
    for i, q in enumerate(QUESTIONS):
        a, b = (int(x) for x in q[:-1].split("+"))
        choices = [str(a + b), str(a + b + 1), str(a * b + 7)]
        greedy = _greedy(model, tok, q, 4)
        rows.append({"question": q, "choices": choices, "label": i % 3,
                     "target": greedy if i % 2 == 0 else greedy + "#"})
    return model, tok, rows


def test_the_harness_scores_our_checkpoint_as_an_independent_computation_does(harness, tiny_ckpt, model_and_rows,
                                                                              tmp_path):
    from mlmt_bench.external_eval import run_lm_eval

    model, tok, rows = model_and_rows
    tasks = _task_dir(tmp_path, rows)
    out = tmp_path / "res" / "lm_eval.json"
    summary = run_lm_eval(tiny_ckpt, ["local_mc", "local_gen"], include_path=tasks, device="cpu",
                          batch_size=4, out=out)
    # multiple choice: argmax of log p(" " + choice | question), computed here
    right = [max(range(3), key=lambda j: _loglik(model, tok, r["question"], " " + r["choices"][j])) == r["label"]
             for r in rows]
    assert summary["tasks"]["local_mc"]["acc"] == pytest.approx(sum(right) / len(rows), abs=1e-9)
    # generation: every other target is the model's own greedy output, the rest are not
    assert summary["tasks"]["local_gen"]["exact_match"] == pytest.approx(0.5)
    assert summary["n_samples"] == {"local_mc": len(rows), "local_gen": len(rows)}
    record = json.loads(out.read_text())
    assert record["tasks"] == summary["tasks"] and record["model_args"]["pretrained"] == str(tiny_ckpt)
    assert not list(out.parent.glob(".*tmp*"))


def test_lm_eval_conventions_pass_through_and_its_own_files_are_written_beside_ours(harness, tiny_ckpt,
                                                                                     model_and_rows, tmp_path):
    """``--model-args``, ``--gen-kwargs`` and ``--log-samples`` reach the harness; with ``--out``
    lm-eval's results_<time>.json (and samples_<task>_<time>.jsonl) lie beside ours, in its own
    format; run outside any git repository, nothing says "fatal: not a git repository"."""
    _, _, rows = model_and_rows
    tasks = _task_dir(tmp_path, rows)
    out = tmp_path / "res" / "ours.json"
    work = tmp_path / "elsewhere"  # no git repository here or above (pytest's tmp under /tmp)
    work.mkdir()
    r = subprocess.run([sys.executable, "-m", "mlmt_bench.cli", "--json", "eval", str(tiny_ckpt),
                        "--tasks", "local_mc,local_gen", "--include-path", str(tasks), "--device", "cpu",
                        "--limit", "4", "--model-args", "dtype=float32,max_length=64",
                        "--gen-kwargs", "max_gen_toks=1", "--log-samples", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not a git repository" not in r.stderr and "fatal" not in r.stderr, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    ours = json.loads(out.read_text())
    assert ours["model_args"] == {"pretrained": str(tiny_ckpt), "dtype": "float32", "max_length": 64}
    assert ours["gen_kwargs"] == {"max_gen_toks": 1}
    theirs_path = Path(summary["lm_eval_results"])
    assert theirs_path.parent.parent == out.parent and theirs_path.name.startswith("results_")
    theirs = json.loads(theirs_path.read_text())
    assert summarise(theirs["results"]) == ours["tasks"] == summary["tasks"]
    assert theirs["config"]["model_args"] == ours["model_args"] and theirs["n-samples"]["local_mc"]["effective"] == 4
    assert theirs["configs"]["local_gen"]["generation_kwargs"]["max_gen_toks"] == 1  # the task said 4
    assert theirs["git_hash"] == _checkout_commit() and set(theirs["task_hashes"]) == {"local_mc", "local_gen"}
    samples = {Path(p).name.split("_2")[0]: p for p in summary["lm_eval_samples"]}
    assert set(samples) == {"samples_local_mc", "samples_local_gen"}
    for name, path in samples.items():
        lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert [d["doc"]["question"] for d in lines] == [row["question"] for row in rows[:4]], name
        assert all({"resps", "filtered_resps", "doc_hash", "target"} <= set(d) for d in lines)
    gen = [json.loads(line) for line in Path(samples["samples_local_gen"]).read_text().splitlines()]
    assert all(d["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] == 1 for d in gen)


def _checkout_commit() -> str | None:
    """This checkout's HEAD commit (git's own answer), or None outside one."""
    r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    return r.stdout.strip() if r.returncode == 0 else None


def test_harness_args_are_lm_evals_key_value_strings(harness):
    from mlmt_bench.external_eval import parse_harness_args

    assert parse_harness_args("temperature=0.7,do_sample=True,max_gen_toks=16,until=x", "--gen-kwargs") == {
        "temperature": 0.7, "do_sample": True, "max_gen_toks": 16, "until": "x"}
    assert parse_harness_args(None, "--model-args") == {} and parse_harness_args(" ", "--model-args") == {}
    with pytest.raises(UserError, match="--model-args: 'dtype' is not key=value"):
        parse_harness_args("dtype,trust_remote_code=True", "--model-args")
    with pytest.raises(UserError, match="--gen-kwargs: '=3' is not key=value"):
        parse_harness_args("=3", "--gen-kwargs")


def test_log_samples_without_out_is_one_line(tiny_ckpt):
    from mlmt_bench.external_eval import run_lm_eval

    with pytest.raises(UserError, match="--log-samples needs --out"):
        run_lm_eval(tiny_ckpt, ["local_mc"], log_samples=True)


def test_resolve_checkpoint_accepts_run_step_and_model_dirs(tiny_ckpt, tmp_path):
    from mlmt_bench.io.checkpoint_state import save_state

    run = tmp_path / "run"
    for step in ("step-000002", "step-000010"):
        shutil.copytree(tiny_ckpt, run / "checkpoints" / step / "solver")
        save_state(run / "checkpoints" / step, {"counters": {"step": int(step[5:])}, "w": torch.zeros(2)})
    (run / "checkpoints" / "step-000011").mkdir()  # no solver/: skipped
    assert resolve_checkpoint(run) == run / "checkpoints" / "step-000010" / "solver"
    # a planted step-000099 (a copy of step 2, its state at step 2) is not the run's latest (issue 34)
    shutil.copytree(run / "checkpoints" / "step-000002", run / "checkpoints" / "step-000099")
    assert resolve_checkpoint(run) == run / "checkpoints" / "step-000010" / "solver"
    assert resolve_checkpoint(run / "checkpoints" / "step-000002") == run / "checkpoints" / "step-000002" / "solver"
    assert resolve_checkpoint(tiny_ckpt) == tiny_ckpt
    with pytest.raises(UserError, match="'critic' checkpoint"):
        resolve_checkpoint(run, policy="critic")
    with pytest.raises(UserError, match="no such file"):
        resolve_checkpoint(tmp_path / "missing")


def test_a_peft_adapter_is_evaluated_on_its_base(tmp_path):
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    assert harness_model_args(d) == {"pretrained": "Qwen/Qwen2.5-0.5B", "dtype": "auto", "peft": str(d)}
    assert harness_model_args(d, "vllm") == {"pretrained": "Qwen/Qwen2.5-0.5B", "dtype": "auto",
                                             "enable_lora": True, "lora_local_path": str(d)}
    (d / "adapter_config.json").write_text("{}")
    with pytest.raises(UserError, match="base_model_name_or_path"):
        harness_model_args(d)
    with pytest.raises(UserError, match="--backend"):
        harness_model_args(d, "sglang")


def test_summarise_drops_the_default_filter_suffix():
    import numpy as np

    res = {"t": {"alias": "t", "acc,none": np.float64(0.25), "acc_stderr,none": 0.1, "exact_match,strict": 1.0}}
    assert summarise(res) == {"t": {"acc": 0.25, "acc_stderr": 0.1, "exact_match,strict": 1.0}}


def test_cli_errors_are_one_line(harness, tiny_ckpt, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlmt_bench.cli", *args], capture_output=True, text=True)

    r = cli("eval", str(tiny_ckpt), "--tasks", "local_mcq", "--include-path", str(_task_dir(tmp_path, [])))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: lm-eval: unknown task 'local_mcq'; did you mean 'local_mc'")
    r = cli("eval", str(tmp_path / "nope"), "--tasks", "x")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or directory"
    r = cli("eval", str(tiny_ckpt), "--tasks", "x", "--limit", "0")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --limit must be > 0 (a count, or a fraction below 1), got 0"


class _Runs:
    """A pickle whose loading would run code: it creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_odd_model_directories_are_one_line_before_anything_is_loaded(tiny_ckpt, tmp_path):
    """issue 34 item 6: a pickle-only directory, a config sizing an embedding its weights do not
    hold, weights linked to /dev/zero and an adapter whose base is /etc were 58-92-line tracebacks
    from inside the harness (exit 1); each is one line, exit 2, and no pickle is opened."""
    import os

    from safetensors.torch import save_file

    cases: dict[str, tuple[Path, str]] = {}
    marker = tmp_path / "pickle-ran"
    d = tmp_path / "pickle"
    shutil.copytree(tiny_ckpt, d)
    (d / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "x": _Runs(marker)}, d / "pytorch_model.bin")
    cases["pickle"] = (d, f"error: {d}: its weights are pytorch_model.bin, pickle files")
    d = tmp_path / "vocab"
    shutil.copytree(tiny_ckpt, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": 2 ** 40}))
    cases["vocab"] = (d, f"error: {d / 'config.json'}: vocab_size x hidden_size is {2 ** 40 * config['hidden_size']:,}")
    d = tmp_path / "zero"
    shutil.copytree(tiny_ckpt, d)
    (d / "model.safetensors").unlink()
    os.symlink("/dev/zero", d / "model.safetensors")
    cases["zero"] = (d, f"error: {d / 'model.safetensors'}: not a regular file (a character device), refused")
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/etc", "peft_type": "LORA"}))
    save_file({"base_model.model.lora_A.weight": torch.zeros(2, 2)}, str(d / "adapter_model.safetensors"))
    cases["adapter"] = (d, f"error: {d / 'adapter_config.json'}: its base is refused: /etc: not a model directory")
    tasks = _task_dir(tmp_path, [{"question": "1+1=", "choices": ["2", "3"], "label": 0}])
    for name, (path, line) in cases.items():  # a task the harness knows: unchecked, it loaded each model
        r = subprocess.run([sys.executable, "-m", "mlmt_bench.cli", "eval", str(path), "--tasks", "local_mc",
                            "--include-path", str(tasks), "--device", "cpu"],
                           capture_output=True, text=True, timeout=300)
        assert (r.returncode, r.stderr.count("\n")) == (2, 1), (name, r.returncode, r.stderr[-500:])
        assert r.stderr.startswith(line), (name, r.stderr)
    assert not marker.exists()


def test_a_model_directory_that_fits_passes_and_a_shard_outside_it_does_not(tiny_ckpt, tmp_path):
    from mlmt_bench.models.model_dir_check import check_model_dir

    check_model_dir(tiny_ckpt)
    d = tmp_path / "adapter"
    d.mkdir()
    from safetensors.torch import save_file

    save_file({"base_model.model.lora_A.weight": torch.zeros(2, 2)}, str(d / "adapter_model.safetensors"))
    for base in (str(tiny_ckpt), "Qwen/Qwen2.5-0.5B"):  # a local base that passes, a hub id
        (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
        check_model_dir(d)
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "not a hub id;"}))
    with pytest.raises(UserError, match="neither a hub id"):
        check_model_dir(d)
    s = tmp_path / "sharded"
    shutil.copytree(tiny_ckpt, s)
    (s / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../model.safetensors"}}))
    with pytest.raises(UserError, match="is not a file name in"):
        check_model_dir(s)
