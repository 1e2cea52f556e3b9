"""The shared base (METHOD.md v2, "Where every policy starts"): one tiny model per seed, trained
on the union of every role's skill, from which every policy of every arm starts.

Real runs start every policy from one pretrained checkpoint; the tiny CPU setting mirrors that
with a base trained by supervised fine-tuning on the curriculum of
:mod:`mlmt_bench.benchmarks.synthetic_curriculum` (solve, refine after feedback, re-solve after
g∅, write feedback). The solver, the critic, and the single policy of GRPO and self_correct
all load the same weights; roles differ only by their prompts. A parameter-matched arm trains
a larger preset on exactly the same conversations (the data never depends on a model).

Reproducible: a base is a pure function of its :class:`BaseConfig` — seeded initialisation,
data and order, and a fixed number of torch CPU threads (the float summation order, hence the
weights, depends on it), all in the cache key. It is cached under
``<cache_dir>/<key>/`` with ``model/`` (an ordinary HF checkpoint with its tokenizer) and
``base.json`` (the config, what it was trained on, and its check on the validation split),
written under a temporary name and renamed into place, so an entry is complete or absent; the
temporary folder of a build that was killed is removed by the next build. The default cache is
``$MLMT_BENCH_CACHE`` or ``~/.cache/mlmt-bench/bootstrap``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlmt_bench.errors import UserError
from mlmt_bench.models.hf_quiet import quiet_transformers

#: Bumped whenever a change here would change the weights a config produces (part of the key).
BASE_FORMAT = 2


class BaseMix(BaseModel):
    """Share of SFT steps on each kind of conversation (one kind per step; they need not sum to 1)."""

    model_config = ConfigDict(extra="forbid")

    solve: float = Field(0.3, ge=0, description="turn-1 solutions")
    refine: float = Field(0.3, ge=0, description="revisions after the oracle's feedback")
    resolve: float = Field(0.1, ge=0, description="new attempts after the null feedback g∅")
    critique: float = Field(0.3, ge=0, description="feedback on attempts (the critic's skill)")

    @model_validator(mode="after")
    def _some(self) -> "BaseMix":
        if self.solve + self.refine + self.resolve + self.critique <= 0:
            raise ValueError("at least one mixture weight must be positive")
        return self


class BaseConfig(BaseModel):
    """What the shared base is trained on and how. Every field is in the cache key."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str = Field("synthetic-arith", description="registry name of a synthetic benchmark with an oracle critic")
    benchmark_options: dict[str, Any] = Field(default_factory=dict,
                                              description="options of the benchmark (as in the run spec's benchmark.options)")
    seed: int | None = Field(None, description="seeds initialisation, data and misconceptions; default: the run's seed")
    preset: str = Field("tiny-0.5m", description="tiny model preset (registry/models/)")
    steps: int = Field(2400, ge=0, description="SFT optimizer steps")
    batch: int = Field(16, ge=1, description="conversations per step")
    lr: float = Field(2e-3, gt=0, description="peak learning rate (AdamW, warmup then cosine to 10%)")
    warmup_frac: float = Field(0.05, ge=0, le=1, description="share of steps with linear learning-rate warmup")
    mix: BaseMix = Field(default_factory=BaseMix, description="share of steps per conversation kind")
    n_problems: int | None = Field(None, ge=1, description="use only the first N training problems (None: all)")
    misconceptions: float = Field(
        0.3, ge=0, le=1, description="share of the operations (op, operand), e.g. '+7', that the base is taught to "
                                     "get one too high when it computes: systematic errors, how often it starts right")
    solver_error_rate: float = Field(0.1, ge=0, le=1,
                                     description="share of solutions and new attempts with injected (random) slips")
    refine_correct_frac: float = Field(0.3, ge=0, le=1,
                                       description="share of refine/resolve conversations whose attempt is the taught one")
    counterfactual_frac: float = Field(
        0.3, ge=0, le=1, description="share of corrective feedbacks stating a made-up value that the revision follows")
    feedback_token_weight: float = Field(3.0, ge=0, description="loss weight of the revision tokens the feedback dictates")
    critic_wrong_frac: float = Field(0.5, ge=0, le=1, description="share of critique attempts with injected errors")
    critic_noise: float = Field(0.1, ge=0, le=1, description="share of critique targets replaced by wrong feedback")
    critic_token_weight: float = Field(3.0, ge=0, description="loss weight of the critic's verdicts and computed values")
    threads: int = Field(1, ge=1, description="torch CPU threads while training: the weights depend on it, so it is "
                                               "part of the key (1: the same weights whatever the machine's load)")
    check_problems: int = Field(200, ge=1, description="validation problems of the base's check")

    @field_validator("benchmark_options")
    @classmethod
    def _json_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(v, sort_keys=True)
        except TypeError as exc:
            raise ValueError(f"must be JSON-serialisable ({exc})") from None
        return v

    def with_seed(self, seed: int) -> "BaseConfig":
        """This config with ``seed`` filled in when it names none."""
        return self if self.seed is not None else self.model_copy(update={"seed": seed})

    def key(self) -> str:
        """First 16 hex digits of the sha256 of the canonical config JSON and the format version."""
        if self.seed is None:
            raise ValueError("a base's key needs its seed (BaseConfig.with_seed)")
        payload = json.dumps({"format": BASE_FORMAT, **self.model_dump(mode="json")}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class Base:
    """A built base: ``model_dir`` (HF checkpoint + tokenizer) and its ``report`` (base.json)."""

    directory: Path
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        return self.directory / "model"

    def summary(self) -> dict[str, Any]:
        """What a run records about its base: key, seed, preset, parameters, data and tokens."""
        r = self.report
        return {"key": r["key"], "seed": r["config"]["seed"], "preset": r["config"]["preset"], "params": r["params"],
                "tokens": r["sft"]["tokens"], "trained_tokens": r["sft"]["trained_tokens"],
                "flops": r["flops"], "steps_by_kind": r["steps_by_kind"], "config": r["config"],
                "path": str(self.directory)}


def default_cache_dir() -> Path:
    env = os.environ.get("MLMT_BENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mlmt-bench" / "bootstrap"


def synthetic_benchmark(name: str, options: dict[str, Any]) -> Any:
    """The benchmark, checked to have the oracle critic the curriculum needs."""
    from mlmt_bench import registry

    bench = registry.benchmarks.get(name)(**options)
    missing = [m for m in ("solution", "oracle_feedback", "inject_errors", "apply_feedback") if not hasattr(bench, m)]
    if missing:
        raise UserError(f"base.benchmark: {name!r} has no oracle critic ({', '.join(missing)} missing); "
                        "the shared base needs a synthetic benchmark such as synthetic-arith")
    return bench


# --------------------------------------------------------------------------- cache


def is_cached(cfg: BaseConfig, cache_dir: Path | None = None) -> bool:
    """Whether the base of ``cfg`` is built (in the cache)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _load(cache_dir / cfg.key()) is not None


def ensure_base(cfg: BaseConfig, cache_dir: Path | None = None, progress: bool = True) -> Base:
    """The base of ``cfg`` (its seed set): built and checked on first use, reused afterwards."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cfg.key()
    final = cache_dir / key
    cached = _load(final)
    if cached is not None:
        return cached
    bench = synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)  # fail on a bad benchmark before any work
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=cache_dir))
    try:
        report = _build(cfg, bench, tmp, progress)
        report["key"] = key
        with torch_threads(cfg.threads):
            report["check"] = check_base(Base(tmp, report), bench, cfg.check_problems)
        (tmp / "base.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if _load(final) is None:  # another process finished the same config first: keep theirs
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result = _load(final)
    assert result is not None
    return result


def _load(directory: Path) -> Base | None:
    meta = directory / "base.json"
    if not meta.is_file():
        return None
    return Base(directory, json.loads(meta.read_text()))


def _remove_abandoned(cache_dir: Path) -> None:
    """Temporary folders of builds whose process is gone (killed: SIGKILL runs no cleanup)."""
    for tmp in cache_dir.glob(".tmp-*"):
        parts = tmp.name.split("-")  # ".tmp", key, pid, mkdtemp's suffix
        pid = int(parts[2]) if len(parts) >= 4 and parts[2].isdigit() else None
        if pid is not None and not _alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- training


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _build(cfg: BaseConfig, bench: Any, out: Path, progress: bool) -> dict[str, Any]:
    import torch
    import transformers

    from mlmt_bench.benchmarks.synthetic_curriculum import KINDS, Curriculum
    from mlmt_bench.metrics.cost import training_flops
    from mlmt_bench.models.sft import sft
    from mlmt_bench.models.tiny import build_tiny_model, num_parameters, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.progress import stage_progress

    assert cfg.seed is not None
    tok = build_char_tokenizer()
    data = Curriculum(cfg, bench, tok, cfg.seed)
    weights = [getattr(cfg.mix, k) for k in KINDS]
    kinds_rng = random.Random(f"base:{cfg.seed}:kinds")
    plan = [kinds_rng.choices(KINDS, weights=weights)[0] for _ in range(cfg.steps)]
    with torch_threads(cfg.threads), quiet_transformers(), stage_progress(progress, _rich_bar) as bar:
        model = build_tiny_model(cfg.preset, tok, seed=cfg.seed)
        task = bar.add_task(f"base {cfg.preset} seed {cfg.seed}", total=cfg.steps, loss=float("nan")) if bar else None

        def on_step(step: int, loss: float) -> None:
            if bar is not None:
                bar.update(task, advance=1, loss=loss)

        summary = sft(model, lambda rng, step: data.example(plan[step], rng), steps=cfg.steps, batch=cfg.batch,
                      lr=cfg.lr, warmup_frac=cfg.warmup_frac, rng=random.Random(f"base:{cfg.seed}:data"),
                      pad_id=tok.pad_token_id, on_step=on_step)
        model.eval()
        save_checkpoint(model, tok, out / "model")
    params = num_parameters(model)
    return {"config": cfg.model_dump(mode="json"), "format": BASE_FORMAT, "params": params,
            "n_problems": len(data.problems), "steps_by_kind": {k: plan.count(k) for k in KINDS}, "sft": summary,
            "flops": training_flops(params, summary["tokens"]),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def _rich_bar() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())


# --------------------------------------------------------------------------- check


def check_base(base: Base, bench: Any, n: int, *, backend: Any = None) -> dict[str, Any]:
    """Greedy accuracies of the base on the first ``n`` **validation** problems, through the same
    :func:`mlmt_bench.rollout.episodes.rollout` / :func:`mlmt_bench.evaluate.evaluate` every run uses.

    The base plays solver and critic. ``acc@t1`` is the first attempt; ``acc@t2_critic`` the
    refinement after the base's own feedback (with its correction / regression rates and
    feedback effect), ``acc@t2_null`` after g∅ (a new attempt), ``acc@t2_oracle`` after the
    oracle's feedback (what the refinement skill can do with perfect feedback).
    """
    from mlmt_bench import registry
    from mlmt_bench.evaluate import evaluate
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.episodes import Actors, Program, Sampling

    problems = bench.load("validation")[:n]
    if not problems:
        raise UserError(f"base: benchmark {base.report['config']['benchmark']!r} has no validation problems")
    verifier_name = bench.default_verifier
    verifier = registry.verifiers.get(verifier_name)()
    backend = backend or registry.backends.get("hf")()
    t0 = time.perf_counter()
    with quiet_transformers():
        model, tok = load_checkpoint(base.model_dir)
    policy = _Actor(model, tok)
    length = max(len(bench.solution(p)) for p in problems) + 16  # characters: a solution, feedback or revision
    sampling = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=length, feedback_max_new_tokens=length)
    actors = Actors(policy, policy, backend, bench.templates, verifier, bench.oracle_feedback)
    out: dict[str, Any] = {"split": "validation", "n": len(problems)}
    for source in ("critic", "oracle"):
        res = evaluate(Program(attempts=1, feedback=source), actors, problems, sampling, verifier_name=verifier_name,
                       feedback_metrics=(source == "critic"), n_samples=0, protocols=("refine_all",))
        m = res.metrics
        out["acc@t1"] = m["acc@t1"]
        out[f"acc@t2_{source}"] = m["acc@t2"]
        out[f"correction_rate_{source}"] = m.get("correction_rate")
        out[f"regression_rate_{source}"] = m.get("regression_rate")
        if source == "critic":
            out.update({k: m.get(k) for k in ("acc@t2_null", "feedback_effect", "leakage_rate", "feedback_tokens")})
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


@dataclass
class _Actor:
    """What :class:`Actors` needs of a policy: a model and its tokenizer."""

    model: Any
    tokenizer: Any
