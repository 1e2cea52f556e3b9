"""Compose a :class:`RunSpec` into components and run it; resume a killed run.

spec ──build──▶ benchmark, verifier, backend, algorithm ──roles──▶ policies ──▶ Trainer(run_dir).train()

The algorithm's roles (``Algorithm.roles()``) say which policies to build: a ``trained`` or
``frozen`` role loads its ``policies.<role>`` spec (tiny models from the shared base), a
``shared`` role is the solver itself, an ``absent`` one is None.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.spec import RunSpec, dump_yaml, load_any, load_run_spec
from mlmt_bench.tracking import RunDir
from mlmt_bench.types import PromptTemplates
from mlmt_bench.verifiers.io import build_verifier

if TYPE_CHECKING:
    from mlmt_bench.algorithms.base import Algorithm
    from mlmt_bench.benchmarks.base import Benchmark
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.models.shared_base import Base, BaseConfig
    from mlmt_bench.rollout.backend import Backend
    from mlmt_bench.trainer import Trainer
    from mlmt_bench.types import Problem
    from mlmt_bench.verifiers.base import Verifier


@dataclass
class Components:
    benchmark: Benchmark
    templates: PromptTemplates
    verifier: Verifier
    verifier_name: str
    backend: Backend
    policies: dict[str, Policy | None]
    algorithm: Algorithm
    train_problems: list[Problem]
    eval_problems: list[Problem]
    base: Base | None
    base_critic: Policy | None = None  # eval.base_critic: the frozen starting point as a test-time critic


def configure_torch(spec: RunSpec) -> None:
    import torch

    torch.set_num_threads(spec.train.threads or min(os.cpu_count() or 1, 8))
    if spec.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(spec.seed)


def templates_for(spec: RunSpec, benchmark: Benchmark) -> PromptTemplates:
    overrides = {k: v for k, v in spec.benchmark.templates.model_dump().items() if v is not None}
    return PromptTemplates(**{**benchmark.templates.__dict__, **overrides})


def base_config(spec: RunSpec) -> BaseConfig:
    """The spec's ``base:`` section as a BaseConfig with the run's seed (unless it names one). Where
    the section names no benchmark, the base trains on the run's own benchmark and options if that
    benchmark has an oracle critic, so that it learns the kind of problem the run is evaluated on."""
    from mlmt_bench.models.shared_base import BaseConfig

    raw = dict(spec.base or {})
    if "benchmark" not in raw:
        bench_cls = registry.benchmarks.get(spec.benchmark.name)
        if all(hasattr(bench_cls, m) for m in ("solution", "oracle_feedback", "inject_errors")):
            raw["benchmark"] = spec.benchmark.name
            raw.setdefault("benchmark_options", dict(spec.benchmark.options))
    return BaseConfig.model_validate(raw).with_seed(spec.seed)  # the section itself is checked by spec.validate_run


def needs_base(spec: RunSpec, algorithm: Algorithm) -> bool:
    """Whether a role the algorithm builds is a tiny model without a path (it starts from the base)."""
    for role in algorithm.roles().built():
        p = getattr(spec.policies, role)
        if p is not None and p.model == "tiny" and not p.path:
            return True
    return False


def ensure_run_base(spec: RunSpec, progress: bool = True) -> Base:
    """The shared base of ``spec`` (built and checked on first use, then reused from the cache)."""
    from mlmt_bench.models.shared_base import ensure_base

    if spec.base is None:
        raise UserError("policies: a tiny model without `path` starts from the shared base; the spec needs a "
                        "`base:` section (`base: {}` for the defaults)")
    return ensure_base(base_config(spec), progress=progress)


def build(spec: RunSpec, progress: bool = True) -> Components:
    b = spec.benchmark
    benchmark = registry.benchmarks.get(b.name)(path=b.path, **b.options)
    train = benchmark.load(b.train_split)[: b.train_limit]
    evals = benchmark.load(b.eval_split)[: spec.eval.limit or b.eval_limit]
    if not train or not evals:
        raise UserError(f"benchmark {b.name}: empty split ({b.train_split}: {len(train)}, {b.eval_split}: {len(evals)})")
    verifier_name = b.verifier or benchmark.default_verifier
    verifier = build_verifier(verifier_name, options=b.verifier_options)
    backend = registry.backends.get(spec.backend.name)(**spec.backend.options)

    algo_cls = registry.algorithms.get(spec.algorithm.name)
    algorithm = algo_cls(algo_cls.Params.model_validate(spec.algorithm.params), spec.train.steps)
    roles = algorithm.roles()
    if roles.feedback == "oracle" and not hasattr(benchmark, "oracle_feedback"):
        raise UserError(f"algorithm {spec.algorithm.name}: oracle feedback needs a benchmark with an oracle critic "
                        f"(synthetic-*), not {b.name}")
    base = ensure_run_base(spec, progress) if needs_base(spec, algorithm) else None
    if progress and not hasattr(benchmark, "oracle_feedback") and any(
            getattr(spec.policies, r) is not None and getattr(spec.policies, r).model == "tiny" for r in roles.built()):
        sys.stderr.write(f"note: tiny models on {b.name} are a smoke test of the pipeline, not a measurement: they are "
                         "trained on synthetic arithmetic and read one token per character with 512 positions, so "
                         "most prompts are longer than their context (transformers says so once) and accuracy stays "
                         "near 0\n")
    base_dir = base.model_dir if base is not None else None
    device = _device()
    policies: dict[str, Any] = {}
    for role in ("solver", "critic"):
        mode = roles.mode(role)
        if mode == "shared":
            policies[role] = policies["solver"]
        elif mode == "absent":
            policies[role] = None
        else:
            role_spec = getattr(spec.policies, role)
            if mode == "frozen":
                role_spec = role_spec.model_copy(update={"trainable": False})
            policies[role] = registry.models.get(role_spec.model)(role, role_spec, base_dir, device)
    if policies["solver"] is not None:  # refinements trained as responses to x: the benchmark's full responses
        from mlmt_bench.algorithms.base import ResponseToX

        algorithm.response_to_x = ResponseToX(benchmark.full_response, policies["solver"].tokenizer)
    base_critic = None
    if spec.eval.base_critic and algorithm.eval_program().feedback == "none":
        base_critic = frozen_start(spec, base_dir, device)
    return Components(benchmark, templates_for(spec, benchmark), verifier, verifier_name, backend, policies,
                      algorithm, train, evals, base, base_critic)


def frozen_start(spec: RunSpec, base_dir: Path | None, device: str | None) -> Policy:
    """A frozen copy of where every policy starts (the shared base, or the solver's pretrained
    checkpoint without its adapter), to play the critic at test time (``eval.base_critic``)."""
    role_spec = (spec.policies.critic or spec.policies.solver).model_copy(update={"trainable": False, "lora": None})
    return registry.models.get(role_spec.model)("critic", role_spec, base_dir, device)


def _device() -> str | None:
    """This process's GPU (``LOCAL_RANK`` under accelerate), or None for the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def make_trainer(spec: RunSpec, comp: Components, run_dir: RunDir) -> Trainer:
    from mlmt_bench.rollout.episodes import Actors
    from mlmt_bench.trainer import Trainer

    actors = Actors(comp.policies["solver"], comp.policies["critic"], comp.backend, comp.templates, comp.verifier,
                    getattr(comp.benchmark, "oracle_feedback", None), comp.benchmark.feedback_verdict)
    return Trainer(spec, comp.algorithm, actors, comp.policies, comp.train_problems, comp.eval_problems, run_dir,
                   comp.verifier_name, base_critic=comp.base_critic)


def run_manifest(spec: RunSpec, comp: Components) -> dict[str, Any]:
    """What the manifest records about a run's components: the algorithm's roles, the policies'
    sizes, the sampling temperatures, the shared base (its weights' sha256, data, tokens and seed,
    identical for every arm of an experiment) and what the floats depend on
    (:func:`mlmt_bench.reproducible.record`: the CPU pin, the CPU model, library versions)."""
    from mlmt_bench import reproducible
    from mlmt_bench.trainer import training_temperatures

    roles = comp.algorithm.roles()
    return {"roles": {"solver": roles.solver, "critic": roles.critic, "feedback": roles.feedback},
            "temperatures": {**training_temperatures(spec), "eval": spec.eval.temperature},
            "params": {r: p.n_params for r, p in comp.policies.items() if p is not None},
            "base": comp.base.summary() if comp.base is not None else None,
            "environment": reproducible.record()}


def run(spec: RunSpec, progress: bool = True, *, extra_manifest: dict[str, Any] | None = None,
        on_eval: Any = None, bar: Any = None) -> dict[str, Any]:
    """Train and evaluate ``spec`` in a fresh run directory; returns the final metrics + run_dir.

    ``on_eval(record)`` is called after every evaluation; an exception it raises ends the run
    with the manifest status given by the exception's ``run_status`` attribute (else "failed").
    ``bar``: an object with rich Progress's ``add_task`` / ``update`` that is told the training
    steps instead of a bar of the run's own (a sweep's per-trial progress).
    """
    from mlmt_bench.dist import Dist, NullRunDir

    configure_torch(spec)
    dist = Dist()
    comp = _build_in_turn(spec, dist, progress)
    run_dir: Any = None
    if dist.is_main:
        run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
        run_dir.update_manifest(**(extra_manifest or {}), **run_manifest(spec, comp), **_sandbox_record(comp.verifier),
                                world_size=dist.world)
    path = dist.broadcast(str(run_dir.path) if run_dir else None)
    run_dir = run_dir or NullRunDir(Path(path))
    try:
        trainer = make_trainer(spec, comp, run_dir)  # may refuse a setting (e.g. FSDP with vLLM)
    except BaseException:
        run_dir.finish("failed")
        comp.backend.close()
        raise
    trainer.dist, trainer.on_eval = dist, on_eval
    try:
        return _train(trainer, run_dir, progress and dist.is_main, bar if dist.is_main else None)
    finally:
        comp.backend.close()


def _sandbox_record(verifier: Any) -> dict[str, Any]:
    """``{"sandbox_disabled": [...]}`` for a verifier with a sandbox (printed when not empty: a
    weakened sandbox is never silent), else ``{}``."""
    disabled = getattr(verifier, "sandbox_disabled", None)
    if disabled is None:
        return {}
    if disabled:
        sys.stderr.write(f"warning: code sandbox weakened: {', '.join(disabled)} switched off "
                         "(benchmark.verifier_options.sandbox_disable)\n")
    return {"sandbox_disabled": list(disabled)}


def _build_in_turn(spec: RunSpec, dist: Any, progress: bool) -> Components:
    """Build on the main process first (it may run the warm start), then on the others (cache hit)."""
    if dist.is_main:
        comp = build(spec, progress=progress)
        dist.barrier()
    else:
        dist.barrier()
        comp = build(spec, progress=False)
    return comp


def resume_run(path: Path | str, progress: bool = True) -> dict[str, Any]:
    """Continue a run from its last checkpoint; log lines written after it are dropped and redone.
    Under ``accelerate launch`` every process loads the checkpoint and the main one writes."""
    from mlmt_bench.dist import Dist, NullRunDir

    run_dir = RunDir.open(path)
    if run_dir.manifest().get("status") == "completed":
        raise UserError(f"{run_dir.path}: the run is complete; nothing to resume")
    spec = load_run_spec(run_dir.path / "spec.resolved.yaml")
    configure_torch(spec)
    dist = Dist()
    comp = _build_in_turn(spec, dist, progress)
    ckpt = run_dir.latest_checkpoint()
    resumes = run_dir.manifest().get("resumed_from", [])
    if not dist.is_main:
        run_dir = NullRunDir(run_dir.path)
    trainer = make_trainer(spec, comp, run_dir)
    trainer.dist = dist
    if ckpt is not None:
        trainer.load_checkpoint(ckpt)
        run_dir.truncate_logs_after(trainer.counters.step)
    else:
        run_dir.truncate_logs_after(-1)
    run_dir.update_manifest(status="running", resumed_from=resumes + [ckpt.name if ckpt else None])
    try:
        return _train(trainer, run_dir, progress and dist.is_main)
    finally:
        comp.backend.close()


def _train(trainer: Any, run_dir: RunDir, progress: bool, bar: Any = None) -> dict[str, Any]:
    from mlmt_bench.progress import progress_bar

    try:
        with contextlib.nullcontext(bar) if bar is not None else progress_bar(enabled=progress) as bar:
            final = trainer.train(bar)
    except KeyboardInterrupt:
        run_dir.finish("interrupted")
        raise
    except BaseException as exc:
        run_dir.finish(getattr(exc, "run_status", "failed"))
        raise
    run_dir.finish("completed")
    if progress:
        from mlmt_bench.progress import print_summary

        print_summary(final, run_dir.path)
    return {**final, "run_dir": str(run_dir.path)}


def bases_from_spec(path: Path, overrides: list[str], *, progress: bool) -> list[dict[str, Any]]:
    """Build (or find in the cache) the shared base of every arm × seed of a run or experiment spec;
    returns each distinct base's summary and its check on the validation split."""
    from mlmt_bench.models.shared_base import ensure_base

    loaded = load_any(path, overrides)
    specs = [loaded] if isinstance(loaded, RunSpec) else [s.model_copy(update={"seed": seed})
                                                          for s in loaded[1].values() for seed in loaded[0].seeds]
    configs = {}
    for spec in specs:
        if spec.base is not None:
            cfg = base_config(spec)
            configs.setdefault(cfg.key(), cfg)
    if not configs:
        raise UserError(f"{path}: no `base:` section")
    out = []
    for cfg in configs.values():
        base = ensure_base(cfg, progress=progress, require_valid=False)
        out.append({**base.summary(), "check": base.report.get("check"), "allow_invalid": cfg.allow_invalid})
    return out


def refuse_invalid_bases(bases: list[dict[str, Any]]) -> None:
    """After ``mlmt-bench base`` showed every base: refuse the first that fails METHOD v3's
    critic-validity thresholds, unless its spec allows it (``base.allow_invalid``)."""
    from mlmt_bench.models.shared_base import Base

    for b in bases:
        Base(Path(b["path"]), {"key": b["key"], "config": b["config"], "check": b["check"]}).require_valid(
            b["allow_invalid"])
