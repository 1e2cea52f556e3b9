"""Compose a :class:`RunSpec` into components and run it; resume a killed run.

spec ──build──▶ benchmark, verifier, backend, policies, algorithm ──▶ Trainer(run_dir).train()
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.spec import RunSpec, dump_yaml, load_any, load_run_spec
from mlmt_bench.tracking import RunDir
from mlmt_bench.types import PromptTemplates
from mlmt_bench.verifiers.io import build_verifier


@dataclass
class Components:
    benchmark: Any
    templates: PromptTemplates
    verifier: Any
    verifier_name: str
    backend: Any
    policies: dict[str, Any]
    algorithm: Any
    train_problems: list
    eval_problems: list


def configure_torch(spec: RunSpec) -> None:
    import torch

    torch.set_num_threads(spec.train.threads or min(os.cpu_count() or 1, 8))
    if spec.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(spec.seed)


def templates_for(spec: RunSpec, benchmark: Any) -> PromptTemplates:
    overrides = {k: v for k, v in spec.benchmark.templates.model_dump().items() if v is not None}
    return PromptTemplates(**{**benchmark.templates.__dict__, **overrides})


def warm_start_config(spec: RunSpec) -> Any:
    """The spec's ``bootstrap:`` section as a BootstrapConfig. Where the section names no
    benchmark, the warm start uses the run's own benchmark and options if that benchmark has an
    oracle critic, so that it trains on the kind of problem the run is evaluated on."""
    from mlmt_bench.models.bootstrap import BootstrapConfig

    raw = dict(spec.bootstrap or {})
    if "benchmark" not in raw:
        bench_cls = registry.benchmarks.get(spec.benchmark.name)
        if all(hasattr(bench_cls, m) for m in ("solution", "oracle_feedback", "inject_errors")):
            raw["benchmark"] = spec.benchmark.name
            raw.setdefault("benchmark_options", dict(spec.benchmark.options))
    return BootstrapConfig.model_validate(raw)  # the section itself is checked by spec.validate_run


def bootstrap_dirs(spec: RunSpec, progress: bool = True, evaluate: bool = False) -> tuple[dict[str, Path], dict]:
    """Checkpoints of the warm start (built on first use, then reused from the cache)."""
    if spec.bootstrap is None:
        return {}, {}
    from mlmt_bench.models.bootstrap import ensure_bootstrap, evaluate_bootstrap

    result = ensure_bootstrap(warm_start_config(spec), progress=progress)
    report = dict(result.report)
    if evaluate:
        report["eval"] = evaluate_bootstrap(result)
    return {"solver": Path(result.solver_dir), "critic": Path(result.critic_dir)}, report


def build(spec: RunSpec, progress: bool = True) -> Components:
    b = spec.benchmark
    bench_cls = registry.benchmarks.get(b.name)
    benchmark = bench_cls(path=b.path, **b.options)
    train = benchmark.load(b.train_split)[: b.train_limit]
    evals = benchmark.load(b.eval_split)[: spec.eval.limit or b.eval_limit]
    if not train or not evals:
        raise UserError(f"benchmark {b.name}: empty split ({b.train_split}: {len(train)}, {b.eval_split}: {len(evals)})")
    verifier_name = b.verifier or benchmark.default_verifier
    verifier = build_verifier(verifier_name, options=b.verifier_options)
    backend = registry.backends.get(spec.backend.name)(**spec.backend.options)

    algo_cls = registry.algorithms.get(spec.algorithm.name)
    params = algo_cls.Params.model_validate(spec.algorithm.params)
    algorithm = algo_cls(params, spec.train.steps)

    dirs = {}
    if any(p is not None and p.model == "tiny" and not p.path for p in (spec.policies.solver, spec.policies.critic)):
        dirs, _ = bootstrap_dirs(spec, progress=progress)
    device = _device()
    solver = registry.models.get(spec.policies.solver.model)("solver", spec.policies.solver, dirs, device)
    policies: dict[str, Any] = {"solver": solver, "critic": None}
    variant = getattr(params, "variant", None)
    if variant == "shared_policy":
        policies["critic"] = solver
    elif spec.policies.critic is not None and spec.algorithm.name == "mlmt" and variant in ("full", "fixed_feedback"):
        critic_spec = spec.policies.critic
        if variant == "fixed_feedback":
            critic_spec = critic_spec.model_copy(update={"trainable": False})
        policies["critic"] = registry.models.get(critic_spec.model)("critic", critic_spec, dirs, device)
    if variant == "oracle_feedback" and not hasattr(benchmark, "oracle_feedback"):
        raise UserError(f"algorithm.params.variant: oracle_feedback needs a benchmark with an oracle critic "
                        f"(synthetic-*), not {b.name}")
    return Components(benchmark, templates_for(spec, benchmark), verifier, verifier_name, backend, policies,
                      algorithm, train, evals)


def _device() -> str | None:
    """This process's GPU (``LOCAL_RANK`` under accelerate), or None for the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def make_trainer(spec: RunSpec, comp: Components, run_dir: RunDir) -> Any:
    from mlmt_bench.rollout.episodes import Actors
    from mlmt_bench.trainer import Trainer

    actors = Actors(comp.policies["solver"], comp.policies["critic"], comp.backend, comp.templates, comp.verifier,
                    getattr(comp.benchmark, "oracle_feedback", None))
    return Trainer(spec, comp.algorithm, actors, comp.policies, comp.train_problems, comp.eval_problems, run_dir,
                   comp.verifier_name)


def run(spec: RunSpec, progress: bool = True, *, extra_manifest: dict[str, Any] | None = None,
        on_eval: Any = None) -> dict[str, Any]:
    """Train and evaluate ``spec`` in a fresh run directory; returns the final metrics + run_dir.

    ``on_eval(record)`` is called after every evaluation; an exception it raises ends the run
    with the manifest status given by the exception's ``run_status`` attribute (else "failed").
    """
    from mlmt_bench.dist import Dist, NullRunDir

    configure_torch(spec)
    dist = Dist()
    comp = _build_in_turn(spec, dist, progress)
    run_dir: Any = None
    if dist.is_main:
        run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
        run_dir.update_manifest(**(extra_manifest or {}), **_sandbox_record(comp.verifier), world_size=dist.world)
    path = dist.broadcast(str(run_dir.path) if run_dir else None)
    run_dir = run_dir or NullRunDir(Path(path))
    trainer = make_trainer(spec, comp, run_dir)
    trainer.dist, trainer.on_eval = dist, on_eval
    return _train(trainer, run_dir, progress and dist.is_main)


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
    """Continue a run from its last checkpoint; log lines written after it are dropped and redone."""
    run_dir = RunDir.open(path)
    spec = load_run_spec(run_dir.path / "spec.resolved.yaml")
    configure_torch(spec)
    comp = build(spec, progress=progress)
    trainer = make_trainer(spec, comp, run_dir)
    ckpt = run_dir.latest_checkpoint()
    if ckpt is not None:
        trainer.load_checkpoint(ckpt)
        run_dir.truncate_logs_after(trainer.counters.step)
    else:
        run_dir.truncate_logs_after(-1)
    resumes = run_dir.manifest().get("resumed_from", [])
    run_dir.update_manifest(status="running", resumed_from=resumes + [ckpt.name if ckpt else None])
    return _train(trainer, run_dir, progress)


def _train(trainer: Any, run_dir: RunDir, progress: bool) -> dict[str, Any]:
    from mlmt_bench.progress import progress_bar

    try:
        with progress_bar(enabled=progress) as bar:
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


def bootstrap_from_spec(path: Path, overrides: list[str], *, evaluate: bool, progress: bool) -> dict[str, Any]:
    loaded = load_any(path, overrides)
    specs = [loaded] if isinstance(loaded, RunSpec) else list(loaded[1].values())
    spec = next((s for s in specs if s.bootstrap is not None), None)
    if spec is None:
        raise UserError(f"{path}: no `bootstrap:` section")
    configure_torch(spec)
    dirs, report = bootstrap_dirs(spec, progress=progress, evaluate=evaluate)
    return {"solver_dir": str(dirs["solver"]), "critic_dir": str(dirs["critic"]), **report}
