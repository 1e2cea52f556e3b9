"""External evaluation of a checkpoint with EleutherAI's lm-evaluation-harness (`eval` extra).

``mlmt-bench eval PATH --tasks gsm8k,arc_easy`` runs harness tasks on a model that
mlmt-bench trained (or any HF checkpoint), so a result can be compared with numbers other
projects report through the same harness. PATH may be

- an HF checkpoint directory (``config.json``) or a peft adapter directory
  (``adapter_config.json``: evaluated on top of its ``base_model_name_or_path``);
- a checkpoint step directory ``checkpoints/step-NNNNNN`` (its ``solver/``, or the policy
  named by ``policy``);
- a run directory (its latest checkpoint step that holds that policy).

Tasks come from the harness's own registry (their datasets from the hub, on a machine that
reaches it) and from ``include_path``, a folder of task YAML files, which is how local data
is evaluated offline (``dataset_path: json`` with ``data_files``). Results are the
harness's metric values per task, optionally written as JSON to ``out`` (atomically).

lm-eval's own conventions, as its CLI has them: ``model_args`` and ``gen_kwargs`` are its
``key=value,key=value`` strings, passed through to ``simple_evaluate`` (``model_args`` over the
ones the checkpoint implies, so ``dtype=float32`` wins over ``auto``); with ``out`` the harness's
results file is written beside ours, by its own ``EvaluationTracker`` as ``lm_eval
--output_path <out's directory>`` writes it (``<model>/results_<time>.json``), and with
``log_samples`` its per-document ``samples_<task>_<time>.jsonl`` next to it. The harness records
the git commit of the code that evaluated (``git_hash``): here mlmt-bench's checkout's, asked of
git with its messages captured (the harness's own ``git describe`` in the working directory printed
"fatal: not a git repository" on every run outside a repository); None for an installed package.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import did_you_mean, read_json
from mlmt_bench.models.model_dir_check import check_model_dir
from mlmt_bench.tracking import atomic_write_text, check_output_dir, check_output_file

#: lm-eval's own model types (the harness's ``--model``: ``hf`` is its HFLM, ``vllm`` its VLLM), not
#: mlmt-bench's backend registry; each with the ``model_args`` that put a peft adapter on its base
HARNESS_ADAPTER_ARGS: dict[str, Any] = {
    "hf": lambda adapter_dir: {"peft": str(adapter_dir)},
    "vllm": lambda adapter_dir: {"enable_lora": True, "lora_local_path": str(adapter_dir)},
}
BACKENDS = tuple(HARNESS_ADAPTER_ARGS)  # the harness model types ``--backend`` accepts


def resolve_checkpoint(path: Path | str, policy: str = "solver") -> Path:
    """The model directory that ``path`` names (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return path
    if (path / policy).is_dir():
        return resolve_checkpoint(path / policy, policy)
    steps = sorted(p for p in (path / "checkpoints").glob("step-*") if (p / policy).is_dir())
    from mlmt_bench.io.checkpoint_state import recorded_step

    for step in reversed(steps):  # the newest whose trainer state is at the step its name says: not a planted one
        if step.name[5:].isdigit() and recorded_step(step) == int(step.name[5:]):
            return resolve_checkpoint(step / policy, policy)
    if steps:
        raise UserError(f"{path}: no checkpoint whose trainer state matches its step (newest: {steps[-1].name})")
    raise UserError(f"{path}: not a model directory, a checkpoint step or a run directory with a "
                    f"{policy!r} checkpoint")


def harness_model_args(model_dir: Path, backend: str = "hf", dtype: str = "auto") -> dict[str, Any]:
    """``model_args`` for the harness's ``hf`` or ``vllm`` model type (lm-eval's names; a dict, so
    paths may hold commas)."""
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    args: dict[str, Any] = {"pretrained": str(model_dir), "dtype": dtype}
    adapter = model_dir / "adapter_config.json"
    if adapter.is_file():
        config = read_json(adapter)  # bounded, a regular file
        base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
        if not base:
            raise UserError(f"{adapter}: no base_model_name_or_path; cannot tell which model the adapter is for")
        args["pretrained"] = base
        args.update(HARNESS_ADAPTER_ARGS[backend](model_dir))
    return args


def _check_tasks(task_manager: Any, tasks: Sequence[str]) -> None:
    known = set(task_manager.all_tasks)
    for task in tasks:
        if task not in known:
            raise UserError(f"lm-eval: unknown task {task!r}{did_you_mean(task, sorted(known), n=3)}")


def parse_harness_args(text: str | None, flag: str) -> dict[str, Any]:
    """lm-eval's ``key=value,key=value`` string (``--model-args``, ``--gen-kwargs``) as a dict, its
    values typed as the harness types them (``0.7`` a float, ``True`` a bool); a UserError for an
    item without ``=`` or without a key."""
    if not text or not text.strip():
        return {}
    for item in (i for i in text.split(",") if i.strip()):
        key, eq, _ = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"{flag}: {item.strip()!r} is not key=value (lm-eval's form: key=value,key=value)")
    from lm_eval.utils import simple_parse_args_string

    return dict(simple_parse_args_string(text))


def _code_commit() -> str | None:
    """The commit of the mlmt-bench checkout this module runs from (lm-eval's ``git_hash``), git's
    messages kept off the terminal; None when it is no checkout or git is missing."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = r.stdout.strip() if r.returncode == 0 else ""
    return commit or None


def _plain(value: Any) -> Any:
    """Harness results hold numpy scalars; JSON wants Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def summarise(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{task: {metric: value}}`` from the harness's ``results`` (the ``,none`` filter suffix
    dropped; other filters keep theirs), stderr entries included."""
    out: dict[str, dict[str, Any]] = {}
    for task, metrics in results.items():
        row: dict[str, Any] = {}
        for key, value in metrics.items():
            if key in ("alias", "name") or not isinstance(_plain(value), (int, float)):
                continue
            row[key.removesuffix(",none")] = _plain(value)
        out[task] = row
    return out


def run_lm_eval(
    path: Path | str,
    tasks: Sequence[str],
    *,
    policy: str = "solver",
    include_path: Path | None = None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int | str = 8,
    device: str | None = None,
    backend: str = "hf",
    apply_chat_template: bool = False,
    seed: int = 0,
    out: Path | None = None,
    model_args: str | None = None,
    gen_kwargs: str | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """Run the harness; returns ``{"model", "tasks": {task: {metric: value}}, "n_samples", "out",
    "lm_eval_results", "lm_eval_samples"}`` (the last two: the harness's own files, with ``out``).
    ``model_args``, ``gen_kwargs``: lm-eval's ``key=value,...`` strings; ``log_samples``: write
    the harness's per-document samples (needs ``out``)."""
    if not tasks:
        raise UserError("--tasks: give at least one task")
    if log_samples and out is None:
        raise UserError("--log-samples needs --out (the samples are written beside the results)")
    extra_args = parse_harness_args(model_args, "--model-args")
    generation = parse_harness_args(gen_kwargs, "--gen-kwargs") or None
    if out is not None:  # before the evaluation: a regular file or a new path, its directory made at the end
        check_output_dir(Path(out).parent, "--out")
        if Path(out).parent.is_dir():
            check_output_file(out, "--out")
    model_dir = resolve_checkpoint(path, policy)
    check_model_dir(model_dir)  # before the harness loads it: no pickle, no device, a config its weights fit
    args = {**harness_model_args(model_dir, backend), **extra_args}
    if include_path is not None and not Path(include_path).is_dir():
        raise UserError(f"--include-path {include_path}: not a directory")
    try:
        from lm_eval import evaluator
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise UserError("lm-eval is not installed; install the eval extra: pip install -e '.[eval]'") from None

    task_manager = TaskManager(include_path=str(include_path) if include_path else None)
    _check_tasks(task_manager, tasks)
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    tracker = None
    if out is not None:
        from lm_eval.loggers import EvaluationTracker

        tracker = EvaluationTracker(output_path=str(Path(out).resolve().parent))
    try:
        with mock.patch.object(evaluator, "get_git_commit_hash", _code_commit):
            res = evaluator.simple_evaluate(
                model=backend, model_args=args, tasks=list(tasks), task_manager=task_manager,
                num_fewshot=num_fewshot, batch_size=batch_size, device=device, limit=limit,
                apply_chat_template=apply_chat_template, gen_kwargs=generation, log_samples=log_samples,
                evaluation_tracker=tracker, random_seed=seed, numpy_random_seed=seed,
                torch_random_seed=seed, fewshot_random_seed=seed,
            )
    except (ConnectionError, TimeoutError) as exc:  # a task's dataset on an unreachable hub
        raise UserError(f"lm-eval: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                        "(a hub task needs network access; local data goes through --include-path)") from None
    summary: dict[str, Any] = {
        "model": str(model_dir),
        "tasks": summarise(res["results"]),
        "n_samples": {t: _plain(v.get("effective", v.get("original")))
                      for t, v in (res.get("n-samples") or {}).items()},
        "out": str(out) if out else None,
    }
    if out is not None and tracker is not None:
        samples: dict[str, Any] = res.pop("samples", None) or {}  # present with log_samples only
        tracker.save_results_aggregated(results=res, samples=samples or None)
        where = Path(tracker.output_path) / str(tracker.general_config_tracker.model_name_sanitized)
        written = []
        for task in res["configs"] if samples else ():
            tracker.save_results_samples(task_name=task, samples=samples[task])
            written.append(str(where / f"samples_{task}_{tracker.date_id}.jsonl"))
        summary.update(lm_eval_results=str(where / f"results_{tracker.date_id}.json"), lm_eval_samples=written)
        record = {**summary, "model_args": args, "gen_kwargs": generation, "backend": backend, "limit": limit,
                  "num_fewshot": num_fewshot, "apply_chat_template": apply_chat_template, "seed": seed,
                  "versions": res.get("versions"), "n-shot": res.get("n-shot"), "configs": res.get("configs")}
        atomic_write_text(Path(out), json.dumps(record, indent=2, default=str) + "\n")
    return summary
