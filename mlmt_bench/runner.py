"""Compose a :class:`RunSpec` into components and run it; resume a killed run.

spec ──build──▶ benchmark, verifier, backend, algorithm ──roles──▶ policies ──▶ Trainer(run_dir).train()

The algorithm's roles (``Algorithm.roles()``) say which policies to build: a ``trained`` or
``frozen`` role loads its ``policies.<role>`` spec (tiny models from the shared base), a
``shared`` role is the solver itself, an ``absent`` one is None.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlmt_bench import registry
from mlmt_bench.benchmarks.base import OracleBenchmark
from mlmt_bench.errors import UserError
from mlmt_bench.io.notes import note, tell, warn
from mlmt_bench.machine.cpus import cpu_budget
from mlmt_bench.spec import RunSpec, dump_yaml, load_any, load_run_spec
from mlmt_bench.tracking import NO_SPACE, RunDir, code_fingerprint
from mlmt_bench.types import PromptTemplates
from mlmt_bench.verifiers.io import build_verifier

if TYPE_CHECKING:
    from mlmt_bench.algorithms.base import Algorithm
    from mlmt_bench.benchmarks.base import Benchmark
    from mlmt_bench.machine.dist import Dist
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.rollout.backend import Backend
    from mlmt_bench.trainer import Trainer
    from mlmt_bench.types import Problem
    from mlmt_bench.verifiers.base import Verifier
    from mlmt_bench.warmstart.pretrained_base import WarmStart
    from mlmt_bench.warmstart.shared_base import Base, BaseConfig


@dataclass
class Components:
    benchmark: Benchmark
    templates: PromptTemplates
    verifier: Verifier
    backend: Backend
    policies: dict[str, Policy | None]
    algorithm: Algorithm
    train_problems: list[Problem]
    eval_problems: list[Problem]
    base: Base | None
    base_critic: Policy | None = None  # eval.base_critic: the frozen starting point as a test-time critic
    warm_start: WarmStart | None = None  # the warm-started checkpoint the roles that load spec.warm_start.model load


def needs_cpu_pin(spec: RunSpec) -> bool:
    """Whether a run needs the CPU pin (:mod:`mlmt_bench.machine.reproducible`): some policy's model
    factory makes its weights from a seed (``ModelFactory.needs_cpu_pin``: the shared base, a tiny
    model); not when every policy loads pretrained weights from a checkpoint. Imports no torch."""
    from mlmt_bench.models.factory import model_factory

    policies = [p for p in (spec.policies.solver, spec.policies.critic) if p is not None]
    return any(model_factory(p.model).needs_cpu_pin(p) for p in policies)


def pretrained_roles(spec: RunSpec) -> list[str]:
    """The roles whose models load pretrained weights (their factory needs no CPU pin)."""
    from mlmt_bench.models.factory import model_factory

    return [r for r in ("solver", "critic") if (p := getattr(spec.policies, r)) is not None
            and not model_factory(p.model).needs_cpu_pin(p)]


def cpu_dtype(spec: RunSpec) -> dict[str, Any]:
    """The manifest's ``cpu_dtype``: the setting (``train.cpu_dtype``), what CPU matmuls run in
    (``dtype``: :func:`mlmt_bench.machine.cpus.resolve_cpu_dtype`) and the CPU's bfloat16 instructions."""
    from mlmt_bench.machine.cpus import bf16_instructions, resolve_cpu_dtype

    bf16 = bf16_instructions()
    dtype = resolve_cpu_dtype(spec.train.cpu_dtype, bf16, needs_cpu_pin(spec))
    return {"setting": spec.train.cpu_dtype, "dtype": dtype, "bf16_instructions": bf16}


def cpu_autocast(spec: RunSpec) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast of CPU ops where :func:`cpu_dtype` says bfloat16 (weights, optimiser
    states and losses stay in their dtype; a GPU's ops are untouched), else nothing.

    Measured on SmolLM2-135M, one thread of a Zen 4 EPYC (``perf/cpu_dtype_speed.py``): 1.5x the
    tokens per CPU second in generation and in a training pass; a frozen weight (a LoRA base) is
    cast again in every forward, so LoRA generation gains only 1.07x (bfloat16 base weights,
    ``policies.<role>.dtype: bfloat16``, gain 1.47x there)."""
    if cpu_dtype(spec)["dtype"] != "bfloat16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def cast_frozen_for_autocast(spec: RunSpec, policies: list[Any]) -> None:
    """Where :func:`cpu_autocast` runs CPU matmuls in bfloat16, store the frozen linear weights of
    ``policies`` (LoRA base layers, frozen critics) in bfloat16 once, rather than autocast casting
    them on every call: bit-identical outputs inside the autocast region, which every forward of a
    training run is in (:func:`mlmt_bench.models.frozen_cast.cast_frozen_linears`)."""
    if cpu_dtype(spec)["dtype"] != "bfloat16":
        return
    import torch

    from mlmt_bench.models.frozen_cast import cast_frozen_linears

    for model in {id(p.model): p.model for p in policies if p is not None}.values():
        cast_frozen_linears(model, torch.bfloat16)


def configure_torch(spec: RunSpec) -> None:
    import torch

    torch.set_num_threads(spec.train.threads or min(cpu_budget(), 8))
    if spec.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(spec.seed)


def templates_for(spec: RunSpec, benchmark: Benchmark) -> PromptTemplates:
    overrides = {k: v for k, v in spec.benchmark.templates.model_dump().items() if v is not None}
    return PromptTemplates(**{**benchmark.templates.__dict__, **overrides})


def base_config(spec: RunSpec) -> BaseConfig:
    """The spec's ``base:`` section as a BaseConfig with the run's seed (unless it names one). Where
    the section names no benchmark, the base trains on the run's own benchmark and options if that
    benchmark has an oracle critic, so that it learns the kind of problem the run is evaluated on.
    The critic gate (METHOD v4) samples the critic at the spec's critic training temperature
    (``critic_temperature``, not part of the key) unless the section names one."""
    from mlmt_bench.trainer import training_temperatures
    from mlmt_bench.warmstart.shared_base import BaseConfig

    raw = dict(spec.base or {})
    if "benchmark" not in raw:
        if issubclass(registry.benchmarks.get(spec.benchmark.name), OracleBenchmark):
            raw["benchmark"] = spec.benchmark.name
            raw.setdefault("benchmark_options", dict(spec.benchmark.options))
    raw.setdefault("critic_temperature", training_temperatures(spec)["critic"])
    return BaseConfig.model_validate(raw).with_seed(spec.seed)  # the section itself is checked by spec.validate_run


def needs_base(spec: RunSpec, algorithm: Algorithm) -> bool:
    """Whether a role the algorithm builds starts from the shared base (its model factory says so:
    ``tiny`` without a path)."""
    from mlmt_bench.models.factory import model_factory

    for role in algorithm.roles().built():
        p = getattr(spec.policies, role)
        if p is not None and model_factory(p.model).starts_from_base(p):
            return True
    return False


def ensure_run_base(spec: RunSpec, progress: bool = True) -> Base:
    """The shared base of ``spec`` (built and checked on first use, then reused from the cache)."""
    from mlmt_bench.warmstart.shared_base import ensure_base

    if spec.base is None:
        raise UserError("policies: a tiny model without `path` starts from the shared base; the spec needs a "
                        "`base:` section (`base: {}` for the defaults)")
    return ensure_base(base_config(spec), progress=progress)


@dataclass
class Setup:
    """What a run needs before any model: the benchmark and its splits, the verifier, the backend
    and the algorithm (with the params the spec validated)."""

    benchmark: Benchmark
    train: list[Problem]
    evals: list[Problem]
    verifier: Verifier
    backend: Backend
    algorithm: Algorithm


def build(spec: RunSpec, progress: bool = True, *, gate: bool = True) -> Components:
    """The components of a run, in three steps read top to bottom: what needs no model
    (:func:`setup`: cheap, so bad input fails before anything is built), the checkpoint the roles
    start from (the shared base when a role starts from it, ``warmstart/shared_base.py``; the
    warm start of a pretrained model, ``warmstart/pretrained_base.py``: each built once, then
    cached), and the policies on it (:func:`assemble`). ``gate``: check a warm start's critic gate
    on the assembled policies and refuse one that fails it (:func:`check_warm_start_gate`); the
    probes, which measure an invalid start too, build without it."""
    parts = setup(spec)
    base = ensure_run_base(spec, progress) if needs_base(spec, parts.algorithm) else None
    warm = ensure_run_warm_start(spec, parts, progress) if spec.warm_start is not None else None
    comp = assemble(on_warm_start(spec, warm), parts, base, progress)
    comp.warm_start = warm
    if warm is not None and gate:
        check_warm_start_gate(spec, comp, progress)
    return comp


def check_warm_start_gate(spec: RunSpec, comp: Components, progress: bool = True) -> None:
    """METHOD v4's critic gate on the warm start every role of ``spec`` starts from, measured on the
    assembled step-0 policies (:func:`_gate_on`: the first ``warm_start.gate_problems`` validation
    problems, the warm start's own seed, the run's training temperatures and token limits) once per
    such setting and kept beside the checkpoint (:func:`~mlmt_bench.warmstart.shared_base.cached_gate`);
    then refused in one line unless ``warm_start.allow_invalid``. Every arm and seed on it reads
    the same gate."""
    from mlmt_bench.trainer import training_temperatures
    from mlmt_bench.warmstart.pretrained_base import WarmStartConfig
    from mlmt_bench.warmstart.shared_base import cached_gate

    warm = comp.warm_start
    assert warm is not None
    cfg = WarmStartConfig.model_validate(spec.warm_start)
    temps, b = training_temperatures(spec), spec.backend
    slot = (f"n={cfg.gate_problems},solver_T={temps['solver']:g},critic_T={temps['critic']:g},"
            f"tokens={b.max_new_tokens}/{b.feedback_max_new_tokens or b.max_new_tokens},seed={cfg.seed}")

    def measure() -> dict[str, Any]:
        problems = (comp.benchmark.load("validation")[:cfg.gate_problems]
                    if "validation" in comp.benchmark.splits else [])
        if not problems:
            return {}  # no validation problem: the gate cannot be measured, so it fails
        if progress:
            tell(f"checking the critic gate of warm start {warm.record['key']} on {len(problems)} validation "
                 f"problems (greedy, and solver T={temps['solver']:g}, critic T={temps['critic']:g}) ...")
        import torch

        # the gate seeds torch: a run that measures it and one that reads it cached go on from the same state
        with torch.random.fork_rng(devices=[]):
            return _gate_on(spec, comp, problems, seed=cfg.seed)[0]

    warm.gate = cached_gate(warm.directory, slot, measure)
    warm.require_valid(cfg.allow_invalid)


def ensure_run_warm_start(spec: RunSpec, parts: Setup, progress: bool = True) -> WarmStart:
    """The warm start of ``spec``'s ``warm_start:`` section, for the run's benchmark and prompt
    templates (built on first use, then reused from the cache)."""
    from mlmt_bench.warmstart.pretrained_base import WarmStartConfig, ensure_warm_start

    cfg = WarmStartConfig.model_validate(spec.warm_start)  # the section itself is checked by spec.validate_run
    return ensure_warm_start(cfg, templates_for(spec, parts.benchmark), spec.benchmark.name,
                             dict(spec.benchmark.options), progress=progress)


def on_warm_start(spec: RunSpec, warm: WarmStart | None) -> RunSpec:
    """``spec`` with every role that loads the warm start's pretrained model (its ``path``) loading
    the warm-started checkpoint instead; ``spec`` itself when there is none."""
    if warm is None:
        return spec
    model = warm.record["config"]["model"]
    policies = spec.policies.model_copy(update={
        role: p.model_copy(update={"path": str(warm.model_dir)})
        for role in ("solver", "critic") if (p := getattr(spec.policies, role)) is not None and p.path == model})
    return spec.model_copy(update={"policies": policies})


def setup(spec: RunSpec) -> Setup:
    """The benchmark (its train and eval splits, non-empty), verifier, backend and algorithm of ``spec``."""
    b = spec.benchmark
    benchmark = registry.benchmarks.get(b.name)(path=b.path, **b.options)
    train = benchmark.load(b.train_split)[: b.train_limit]
    evals = benchmark.load(b.eval_split)[: spec.eval.limit or b.eval_limit]
    if not train or not evals:
        raise UserError(f"benchmark {b.name}: empty split ({b.train_split}: {len(train)}, "
                        f"{b.eval_split}: {len(evals)})")
    verifier = build_verifier(b.verifier or benchmark.default_verifier, options=b.verifier_options)
    backend = registry.backends.get(spec.backend.name)(**spec.backend.options)

    algo_cls = registry.algorithms.get(spec.algorithm.name)
    algorithm = algo_cls(spec.algorithm.validated_params(), spec.train.steps)  # validated once, by the spec
    if algorithm.roles().feedback == "oracle" and not isinstance(benchmark, OracleBenchmark):
        raise UserError(f"algorithm {spec.algorithm.name}: oracle feedback needs a benchmark with an oracle critic "
                        f"(synthetic-*), not {b.name}")
    return Setup(benchmark, train, evals, verifier, backend, algorithm)


def assemble(spec: RunSpec, parts: Setup, base: Base | None, progress: bool = True) -> Components:
    """The policies of ``spec`` (on ``base``, the shared base, where a role starts from it) joined
    to ``parts``: the run's :class:`Components`."""
    b, benchmark, algorithm = spec.benchmark, parts.benchmark, parts.algorithm
    roles = algorithm.roles()
    if progress and not isinstance(benchmark, OracleBenchmark):  # what each model factory says on a real benchmark
        from mlmt_bench.models.factory import model_factory

        built = [getattr(spec.policies, r) for r in roles.built() if getattr(spec.policies, r) is not None]
        for text in dict.fromkeys(model_factory(p.model).real_benchmark_note(b.name) for p in built):
            if text:
                note(text)
    base_dir = base.model_dir if base is not None else None
    device = _device()
    role_specs = {}
    for role in roles.built():
        role_spec = getattr(spec.policies, role)
        role_specs[role] = role_spec.model_copy(update={"trainable": False}) if roles.mode(role) == "frozen" \
            else role_spec
    made = one_base_policies(role_specs, base_dir, device) if spec.policies.share_base else {
        role: registry.models.get(s.model)(role, s, base_dir, device) for role, s in role_specs.items()}
    policies: dict[str, Any] = {}
    for role in ("solver", "critic"):
        mode = roles.mode(role)
        policies[role] = policies["solver"] if mode == "shared" else None if mode == "absent" else made[role]
    if policies["solver"] is not None:  # refinements trained as responses to x: the benchmark's full responses
        from mlmt_bench.algorithms.base import ResponseToX

        algorithm.response_to_x = ResponseToX(benchmark.full_response, policies["solver"].tokenizer)
    base_critic = None
    if spec.eval.base_critic and algorithm.eval_program().feedback == "none":
        base_critic = frozen_start(spec, base_dir, device)
    return Components(benchmark, templates_for(spec, benchmark), parts.verifier, parts.backend, policies,
                      algorithm, parts.train, parts.evals, base, base_critic)


def one_base_policies(role_specs: dict[str, Any], base_dir: Path | None, device: str | None) -> dict[str, Policy]:
    """``policies.share_base``: the roles' policies as LoRA adapters on one frozen base, loaded once
    by the first role's model factory (``spec.validate_run`` checked that the roles agree on it)."""
    from mlmt_bench.models.policy import adapters_on_one_base

    first, first_spec = next(iter(role_specs.items()))
    base_spec = first_spec.model_copy(update={"trainable": False, "lora": None})
    base = registry.models.get(base_spec.model)(first, base_spec, base_dir, device)
    return adapters_on_one_base(base, role_specs)


def _probe_critic(spec: RunSpec, comp: Any) -> tuple[Any, str]:
    """The critic a probe uses, and where it comes from: the spec's own ("spec"), or, where the
    algorithm has none, the frozen starting point ("base": the shared base, or the solver's
    pretrained checkpoint)."""
    critic = comp.policies["critic"]
    if critic is not None:
        return critic, "spec"
    return frozen_start(on_warm_start(spec, comp.warm_start), comp.base.model_dir if comp.base is not None else None,
                        _device()), "base"


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


def make_trainer(spec: RunSpec, comp: Components, run_dir: RunDir, dist: Dist | None = None) -> Trainer:
    """The trainer of a built run, communicating through ``dist``, the run's one Dist (default: a
    Dist of the processes ``accelerate launch`` started, if any)."""
    from mlmt_bench.machine.dist import Dist
    from mlmt_bench.rollout.episodes import Actors
    from mlmt_bench.trainer import Trainer

    solver = cast("Policy", comp.policies["solver"])  # every algorithm's programs start with the solver's attempts
    actors = Actors(solver, comp.policies["critic"], comp.backend, comp.templates, comp.verifier,
                    comp.benchmark.oracle_feedback if isinstance(comp.benchmark, OracleBenchmark) else None,
                    comp.benchmark.feedback_verdict,
                    redact=comp.benchmark.redact_feedback if spec.feedback.redact else None,  # METHOD v4
                    stated_answer=comp.benchmark.stated_answer, stated_values=comp.benchmark.stated_values,
                    verdict_by_keywords=comp.benchmark.verdict_by_keywords if comp.benchmark.verdict_fallback else None)
    return Trainer(spec, comp.algorithm, actors, comp.policies, comp.train_problems, comp.eval_problems, run_dir,
                   dist=dist if dist is not None else Dist(), base_critic=comp.base_critic,
                   after_train=end_of_run_probe(spec, comp.benchmark) if actors.critic is not None else None)


def run_manifest(spec: RunSpec, comp: Components) -> dict[str, Any]:
    """What the manifest records about a run's components: the algorithm's roles, the policies'
    sizes, the sampling temperatures, where each built policy's weights came from (``weights``: its
    model factory says: a shipped model's alias and sha256, a hub name, a directory; or the warm
    start), the warm start (``warm_start``: its key, data, SFT cost and weights sha256), the shared
    base (its weights' sha256, data, tokens and seed, identical for every arm of an experiment) and
    what the floats depend on (:func:`mlmt_bench.machine.reproducible.record`: the CPU pin, the CPU model,
    library versions)."""
    from mlmt_bench.machine import reproducible
    from mlmt_bench.trainer import training_temperatures

    roles = comp.algorithm.roles()
    built = {r: getattr(spec.policies, r) for r, p in comp.policies.items() if p is not None and p.role == r}
    return {"roles": {"solver": roles.solver, "critic": roles.critic, "feedback": roles.feedback},
            "temperatures": {**training_temperatures(spec), "eval": spec.eval.temperature},
            "params": {r: p.n_params for r, p in comp.policies.items() if p is not None},
            "weights": {r: _weights_source(s, comp.warm_start) for r, s in built.items()},
            "base": comp.base.summary() if comp.base is not None else None,
            **({"warm_start": comp.warm_start.summary()} if comp.warm_start is not None else {}),
            **({"share_base": one_base_record(spec, comp)} if spec.policies.share_base else {}),
            "cpu_dtype": cpu_dtype(spec), "environment": reproducible.record()}


def _weights_source(role_spec: Any, warm: WarmStart | None) -> dict[str, Any] | None:
    """Where a role's weights came from: the warm start when it replaced the role's pretrained
    model (its key, weights sha256, and what it started from), else what its model factory says."""
    from mlmt_bench.models.factory import model_factory

    if warm is not None and role_spec.path == warm.record["config"]["model"]:
        return {"source": "warm start", "key": warm.record["key"], "sha256": warm.record["sha256"],
                "from": warm.record["from"], "path": str(warm.model_dir)}
    return model_factory(role_spec.model).weights_source(role_spec)


def one_base_record(spec: RunSpec, comp: Components) -> dict[str, Any]:
    """What the manifest says of roles on one base (``policies.share_base``): the base once (its
    path; a warm-start base's sha256 is under ``base``) and each role's adapter: its LoRA config,
    learning rate, whether it trains, its parameter count."""
    built = {role: p for role, p in comp.policies.items() if p is not None and p.role == role}
    first = next(iter(built.values()))
    return {"base": {"path": first.init_path, "dtype": first.dtype, "params": first.n_params},
            "adapters": {role: {**getattr(spec.policies, role).lora.model_dump(), "lr": p.lr, "trainable": p.trainable,
                                "params": sum(x.numel() for x in p.model.adapter_state().values())}
                         for role, p in built.items()}}


def run(spec: RunSpec, progress: bool = True, *, extra_manifest: dict[str, Any] | None = None,
        on_eval: Any = None, bar: Any = None, tracking_group: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train and evaluate ``spec`` in a fresh run directory; returns the final metrics + run_dir.

    ``on_eval(record)`` is called after every evaluation; an exception it raises ends the run
    with the manifest status given by the exception's ``run_status`` attribute (else "failed").
    ``bar``: an object with rich Progress's ``add_task`` / ``update`` that is told the training
    steps instead of a bar of the run's own (a sweep's per-trial progress).
    The main process holds the run directory's lock (:meth:`RunDir.lock`) from its creation to
    the end of the run; a full disk ends the run with one line, its manifest marked failed.
    ``tracking_group``: the experiment's or sweep's tracker group (:meth:`mlmt_bench.trackers.Group.to_json`),
    whose trackers were checked when it was opened; a lone run checks its own before anything is built.
    """
    from mlmt_bench.machine.dist import Dist, NullRunDir

    configure_torch(spec)
    dist = Dist()
    if spec.tracking.report_to and tracking_group is None and dist.is_main:
        from mlmt_bench.trackers import preflight

        preflight(spec.tracking.report_to, spec.tracking.options, Path(spec.output_dir))
    comp = _build_in_turn(spec, dist, progress)
    run_dir: Any = None
    try:
        if dist.is_main:
            with _no_space(spec.output_dir):
                run_dir = RunDir.create(spec.output_dir, spec.name, dump_yaml(spec), spec.seed)
            run_dir.lock()  # one process per run directory, held until finish()
            run_dir.update_manifest(**(extra_manifest or {}), **run_manifest(spec, comp),
                                    **_sandbox_record(comp.verifier), world_size=dist.world)
            start_trackers(spec, run_dir, extra_manifest or {}, tracking_group, None, None)
        path = dist.broadcast(str(run_dir.path) if run_dir else None)
        run_dir = run_dir or NullRunDir(Path(path))
        trainer = make_trainer(spec, comp, run_dir, dist)  # may refuse a setting (e.g. FSDP with vLLM)
    except BaseException as exc:
        comp.backend.close()
        if run_dir is not None:
            _end_with(run_dir, exc, "failed")
        raise
    trainer.on_eval = on_eval
    try:
        return _train(trainer, run_dir, progress and dist.is_main, bar if dist.is_main else None)
    finally:
        comp.backend.close()


def start_trackers(spec: RunSpec, run_dir: RunDir, fields: dict[str, Any], group: dict[str, Any] | None,
                   resume: Any, saved: dict[str, Any] | None) -> None:
    """Attach the spec's trackers (``tracking.report_to``) to ``run_dir`` and record them in its
    manifest (``trackers``: each one's run id or directory; ``tracking_group``). ``fields``: the
    manifest's experiment, arm, sweep and trial, which become the tags (with the seed);
    ``resume``: the :class:`~mlmt_bench.trackers.Axes` a resumed run continues from, else None;
    ``saved``: the manifest's ``trackers`` of that run. A tracker that fails to start is a warning."""
    if not spec.tracking.report_to:
        return
    from mlmt_bench.trackers import Group, RunInfo, RunTrackers

    tags = {k: str(fields[k]) for k in ("experiment", "arm", "sweep", "trial") if fields.get(k) is not None}
    info = RunInfo(run_dir.path, Path(spec.output_dir), spec.model_dump(mode="json"), {**tags, "seed": str(spec.seed)},
                   Group.from_json(group), resume)
    hub = RunTrackers.start(spec.tracking.report_to, spec.tracking.options, info, saved)
    run_dir.trackers = hub
    run_dir.update_manifest(trackers=hub.state(), tracking_group=group)


def _sandbox_record(verifier: Verifier) -> dict[str, Any]:
    """``{"sandbox_disabled": [...]}`` for a verifier with a sandbox (``Verifier.sandbox_disabled``
    not None; printed when not empty: a weakened sandbox is never silent), else ``{}``."""
    disabled = verifier.sandbox_disabled
    if disabled is None:
        return {}
    if disabled:
        warn(f"code sandbox weakened: {', '.join(disabled)} switched off "
                   "(benchmark.verifier_options.sandbox_disable)")
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
    """Continue a run from its newest intact checkpoint; log lines written after it are dropped
    and redone. Under ``accelerate launch`` every process loads the checkpoint and the main one
    writes, holding the run directory's lock (:meth:`RunDir.lock`) until the run ends.

    Refused with one line, before anything is written: a ``spec.resolved.yaml`` edited since the
    run started (:meth:`RunDir.check_spec`), a run directory another process holds, a completed
    run, checkpoints none of which is intact. Warnings (a run from before spec hashes, corrupt
    checkpoints skipped) are printed only once the resume goes ahead."""
    from mlmt_bench.machine.dist import Dist

    if (Path(path) / "experiment.json").is_file() and not (Path(path) / "manifest.json").exists():
        raise UserError(f"{path}: an experiment directory, not a run: continue it with `mlmt-bench run "
                        f"EXPERIMENT_SPEC --resume {path}` (the spec it was started from)")
    run_dir = RunDir.open(path)
    notes = [n for n in [run_dir.check_spec()] if n]  # before the spec is even parsed
    spec = load_run_spec(run_dir.path / "spec.resolved.yaml")
    configure_torch(spec)
    dist = Dist()
    if dist.is_main:
        run_dir.lock()
    try:
        with _no_space(run_dir.path):
            return _resume(run_dir, spec, dist, notes, progress)
    finally:
        run_dir.unlock()  # held by now only when the resume failed before training


def _other_code(manifest: dict[str, Any], checkpoint: str | None) -> list[str]:
    """The warning a resume prints when this mlmt-bench's source is not the one the run started with
    (the manifest's ``code``; runs from before it was recorded are not compared): what follows the
    checkpoint runs this code, with its defaults for any setting the run's ``spec.resolved.yaml``
    predates. Every resume's code is kept in the manifest's ``resumed_code``."""
    started, now = manifest.get("code"), code_fingerprint()
    if not isinstance(started, str) or started == now:
        return []
    after = f"after {checkpoint}" if checkpoint else "from the start"
    return [f"warning: this run started with other mlmt-bench code (source sha256 {started[:12]}, this one "
            f"{now[:12]}); what it computes {after} comes from this code, with its defaults for any setting the run's "
            "spec.resolved.yaml does not name (manifest: resumed_code)"]


def _resume(run_dir: RunDir, spec: RunSpec, dist: Any, notes: list[str], progress: bool) -> dict[str, Any]:
    from mlmt_bench.machine.dist import NullRunDir

    manifest = run_dir.manifest()  # read under the lock: a run that just finished is complete
    if manifest.get("status") == "completed":
        raise UserError(f"{run_dir.path}: the run is complete; nothing to resume")
    comp = _build_in_turn(spec, dist, progress)
    writer: Any = run_dir if dist.is_main else NullRunDir(run_dir.path)
    try:
        trainer = make_trainer(spec, comp, writer, dist)
        ckpt = _load_newest_intact(trainer, run_dir, notes)
        writer.truncate_logs_after(trainer.counters.step if ckpt is not None else -1)
        unhashed = {} if "spec_sha256" in manifest else {"spec_sha256": run_dir.spec_sha256()}
        notes.extend(_other_code(manifest, ckpt.name if ckpt is not None else None))
        resumed_code = manifest.get("resumed_code")
        resumed_code = resumed_code if isinstance(resumed_code, list) else []
        writer.update_manifest(status="running", resumed_from=manifest.get("resumed_from", []) + [
            ckpt.name if ckpt is not None else None], resumed_code=resumed_code + [code_fingerprint()], **unhashed)
        if dist.is_main:
            from mlmt_bench.trackers import Axes

            c = trainer.counters
            at = Axes(c.step, c.gen_tokens, c.flops) if ckpt is not None else Axes(-1, -1, -1.0)
            start_trackers(spec, run_dir, manifest, manifest.get("tracking_group"), at, manifest.get("trackers"))
    except BaseException:
        comp.backend.close()
        raise
    for line in notes if dist.is_main else []:
        tell(line)
    try:
        return _train(trainer, writer, progress and dist.is_main)
    finally:
        comp.backend.close()


def _load_newest_intact(trainer: Trainer, run_dir: RunDir, notes: list[str]) -> Path | None:
    """Load the newest checkpoint that is intact (:meth:`Trainer.check_checkpoint`) and return
    it; None when there is none at all. Skipped ones add a warning to ``notes``; when every
    checkpoint is corrupt, a UserError with the newest one's fault."""
    from mlmt_bench.io.bounded_input import shorten

    skipped: list[tuple[Path, UserError]] = []
    for ckpt in reversed(list(run_dir.iter_checkpoints())):
        try:
            trainer.load_checkpoint(ckpt)  # checks everything before it changes anything
        except UserError as exc:
            skipped.append((ckpt, exc))
            continue
        if skipped:
            why = "; ".join(f"{p.name}: {shorten(_fault(p, e), 200)}" for p, e in skipped)
            notes.append(f"warning: {run_dir.checkpoints}: resuming from {ckpt.name}, the newest intact checkpoint; "
                         f"skipped {len(skipped)} corrupt ({why})")
        return ckpt
    if skipped:
        raise UserError(f"{run_dir.checkpoints}: no intact checkpoint to resume from (the newest, "
                        f"{skipped[0][0].name}: {_fault(*skipped[0])})")
    return None


def _fault(ckpt: Path, exc: UserError) -> str:
    """``exc``'s message with the checkpoint's own path left out (the caller names it)."""
    return str(exc).replace(f"{ckpt}/", "").replace(f"{ckpt}: ", "")


@contextlib.contextmanager
def _no_space(where: Path | str) -> Any:
    """A full disk (ENOSPC, EDQUOT) as one line rather than a traceback."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise _no_space_error(where, exc) from None


def _no_space_error(where: Path | str, exc: OSError, run_dir: Any = None) -> UserError:
    """The one line for a full disk; with ``run_dir``, also what its manifest says now."""
    what = (exc.strerror or "no space left on device").lower() + (f" (writing {exc.filename})" if exc.filename else "")
    if run_dir is None:
        return UserError(f"{where}: {what}")
    try:
        status = run_dir.manifest().get("status")
    except (UserError, OSError, AttributeError):  # AttributeError: a NullRunDir's manifest is None
        status = None
    marked = (f"the run is marked {status}" if status not in (None, "running")
              else "manifest.json could not be updated (it may still say running)")
    return UserError(f"{where}: {what}; {marked}; free space, then `mlmt-bench run --resume {where}` continues from "
                     "its last checkpoint")


def _end_with(run_dir: Any, exc: BaseException, status: str) -> None:
    """After ``exc`` stopped a run: record ``status`` if the disk still allows it (and release
    the lock); a full disk is re-raised as one line, anything else is left to the caller."""
    with contextlib.suppress(OSError):
        run_dir.finish(status)
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        raise _no_space_error(run_dir.path, exc, run_dir) from None


def _train(trainer: Any, run_dir: RunDir, progress: bool, bar: Any = None) -> dict[str, Any]:
    from mlmt_bench.io.progress import progress_bar

    try:
        with contextlib.nullcontext(bar) if bar is not None else progress_bar(enabled=progress) as bar:
            with cpu_autocast(trainer.spec):
                cast_frozen_for_autocast(trainer.spec, [*trainer.policies.values(), trainer.base_critic])
                final = trainer.train(bar)
    except KeyboardInterrupt as exc:
        _end_with(run_dir, exc, "interrupted")
        raise
    except BaseException as exc:
        _end_with(run_dir, exc, getattr(exc, "run_status", "failed"))
        raise
    try:
        run_dir.finish("completed")
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise _no_space_error(run_dir.path, exc, run_dir) from None
    if progress:
        from mlmt_bench.io.progress import print_summary

        print_summary(final, run_dir.path)
    return {**final, "run_dir": str(run_dir.path)}


def bases_from_spec(path: Path, overrides: list[str], *, progress: bool) -> list[dict[str, Any]]:
    """Build (or find in the cache) the shared base of every arm × seed of a run or experiment spec;
    returns each distinct base's summary and its check on the validation split."""
    from mlmt_bench.warmstart.shared_base import ensure_base

    loaded = load_any(path, overrides)
    specs = [loaded] if isinstance(loaded, RunSpec) else [s.model_copy(update={"seed": seed})
                                                          for s in loaded[1].values() for seed in loaded[0].seeds]
    configs: dict[tuple[str, float | None], BaseConfig] = {}
    for spec in specs:
        if spec.base is not None:
            cfg = base_config(spec)
            configs.setdefault((cfg.key(), cfg.critic_temperature), cfg)  # one gate per critic temperature
    if not configs:
        raise UserError(f"{path}: no `base:` section")
    out = []
    for cfg in configs.values():
        base = ensure_base(cfg, progress=progress, require_valid=False)
        out.append({**base.summary(), "check": base.report.get("check"), "allow_invalid": cfg.allow_invalid})
    return out


def refuse_invalid_bases(bases: list[dict[str, Any]]) -> None:
    """After ``mlmt-bench base`` showed every base: refuse the first that fails METHOD v3's
    critic-validity thresholds or METHOD v4's critic gate, unless its spec allows it
    (``base.allow_invalid``)."""
    from mlmt_bench.warmstart.shared_base import Base

    for b in bases:
        Base(Path(b["path"]), {"key": b["key"], "config": b["config"], "check": b["check"],
                               "gate": b.get("gate")}).require_valid(b["allow_invalid"])


def probe_from_spec(spec: RunSpec, split: str = "test", limit: int | None = None, redact: bool | None = None,
                    progress: bool = True) -> dict[str, Any]:
    """The feedback perturbation probe (:mod:`mlmt_bench.probe`) on the solver and critic ``spec``
    builds at step 0 (as a run builds them: tiny policies from the seed's shared base), on the first
    ``limit`` problems of ``split``, sampled as evaluation samples (``eval.temperature``, greedy by
    default). The critic is the spec's own; where its algorithm has none, the frozen starting point
    (the shared base, or the solver's pretrained checkpoint) plays it. ``redact``: None for the
    spec's ``feedback.redact``. Returns the probe's result with ``spec``, ``seed``, ``split``,
    ``critic`` (``spec`` or ``base``) and ``limit`` added."""
    configure_torch(spec)
    comp = build(spec, progress=progress, gate=False)
    try:
        critic, source = _probe_critic(spec, comp)
        return _probe_built(spec, comp, cast("Policy", comp.policies["solver"]), critic, source, split, limit, redact,
                            progress)
    finally:
        comp.backend.close()


def probe_from_run_dir(path: Path | str, split: str = "test", limit: int | None = None, redact: bool | None = None,
                       progress: bool = True) -> dict[str, Any]:
    """:func:`probe_from_spec` on a run directory's policies: its spec (``spec.resolved.yaml``) and
    its newest intact checkpoint (the final policies of a completed run); ``critic`` is ``run``, or
    ``base`` where the run's algorithm has no critic. Adds ``run_dir`` and ``step``."""
    from mlmt_bench.machine.dist import NullRunDir

    run_dir = RunDir.open(path)
    spec = load_run_spec(run_dir.path / "spec.resolved.yaml")
    configure_torch(spec)
    comp = build(spec, progress=progress, gate=False)
    try:
        trainer = make_trainer(spec, comp, cast("RunDir", NullRunDir(run_dir.path)))
        if _load_newest_intact(trainer, run_dir, []) is None:
            raise UserError(f"{run_dir.path}: no checkpoint to probe (the run saved none yet)")
        critic, source = trainer.actors.critic, "run"
        if critic is None:
            critic = frozen_start(on_warm_start(spec, comp.warm_start),
                                  comp.base.model_dir if comp.base is not None else None, _device())
            source = "base"
        result = _probe_built(spec, comp, trainer.actors.solver, critic, source, split, limit, redact, progress)
    finally:
        comp.backend.close()
    return {**result, "run_dir": str(run_dir.path), "step": trainer.counters.step}


def probe_oracle(spec: RunSpec, benchmark: Any) -> Callable[[Problem, str], str] | None:
    """The feedback probe's ``oracle`` row in the form the run's critic was taught: a warm start
    with ``critique: worked`` teaches the oracle's worked feedback, and a refiner taught on it
    (redacted) is asked about that form, not the plain one; None (the benchmark's own) otherwise."""
    from mlmt_bench.benchmarks.base import OracleBenchmark

    if (spec.warm_start or {}).get("critique") == "worked" and isinstance(benchmark, OracleBenchmark):
        return benchmark.worked_feedback
    return None


def _probe_built(spec: RunSpec, comp: Components, solver: Any, critic: Any, source: str, split: str,
                 limit: int | None, redact: bool | None, progress: bool) -> dict[str, Any]:
    from mlmt_bench.io.progress import progress_bar
    from mlmt_bench.probe import probe_feedback
    from mlmt_bench.rollout.episodes import Actors
    from mlmt_bench.trainer import eval_sampling

    comp.benchmark.check_split(split)
    problems = comp.benchmark.load(split)[:limit]
    if not problems:
        raise UserError(f"benchmark {spec.benchmark.name}: no {split} problems to probe")
    actors = Actors(solver, critic, comp.backend, comp.templates, comp.verifier)
    with progress_bar(enabled=progress) as bar:
        result = probe_feedback(comp.benchmark, actors, problems, eval_sampling(spec),
                                redact=spec_redacts(spec) if redact is None else redact, bar=bar,
                                oracle=probe_oracle(spec, comp.benchmark))
    return {"spec": spec.name, "seed": spec.seed, "benchmark": spec.benchmark.name, "split": split, "limit": limit,
            "critic": source, **result}


def value_probe_from_spec(spec: RunSpec, rows: int = 4096, steps: int = 1000,
                          progress: bool = True) -> dict[str, Any]:
    """The value probe (:mod:`mlmt_bench.warmstart.value_probe`, METHOD v4) on the solver and critic
    ``spec`` builds at step 0 (the critic as in :func:`probe_from_spec`), on its training problems
    at its training temperatures, ``group_size`` attempts a problem where its algorithm has one
    (else 8). Returns the probe's result with ``spec``, ``seed``, ``critic`` and ``group_size``."""
    from mlmt_bench.io.progress import progress_bar
    from mlmt_bench.rollout.episodes import Actors
    from mlmt_bench.trainer import train_sampling
    from mlmt_bench.warmstart.value_probe import value_probe

    configure_torch(spec)
    comp = build(spec, progress=progress, gate=False)
    group = comp.algorithm.params.sample_factors().get("group_size", 8)
    try:
        critic, source = _probe_critic(spec, comp)
        actors = Actors(cast("Policy", comp.policies["solver"]), critic, comp.backend, comp.templates, comp.verifier)
        with progress_bar(enabled=progress) as bar:
            result = value_probe(actors, comp.train_problems, train_sampling(spec), rows=rows, group_size=group,
                                 seed=spec.seed, steps=steps, micro_batch_tokens=spec.train.micro_batch_tokens,
                                 bar=bar)
    finally:
        comp.backend.close()
    return {"spec": spec.name, "seed": spec.seed, "critic": source, "group_size": group, **result}


def critic_gate_from_spec(spec: RunSpec, split: str = "validation", limit: int | None = 200,
                          progress: bool = True) -> dict[str, Any]:
    """METHOD v4's critic gate on the solver and critic ``spec`` builds at step 0 (the critic as in
    :func:`probe_from_spec`: the spec's own, else the frozen starting point): the solver's own
    attempts on the first ``limit`` problems of ``split``, judged by the critic greedy and at the
    roles' training temperatures (:func:`mlmt_bench.warmstart.shared_base.detection_on_own_attempts`),
    with the backend's token limits; ``failures`` lists what fails the gate (empty: it passes)."""
    import time

    from mlmt_bench.warmstart.shared_base import critic_gate

    configure_torch(spec)
    comp = build(spec, progress=progress, gate=False)
    try:
        comp.benchmark.check_split(split)
        problems = comp.benchmark.load(split)[:limit]
        if not problems:
            raise UserError(f"benchmark {spec.benchmark.name}: no {split} problems to judge")
        t0 = time.perf_counter()
        gate, source = _gate_on(spec, comp, problems, seed=spec.seed)
    finally:
        comp.backend.close()
    return {"spec": spec.name, "seed": spec.seed, "benchmark": spec.benchmark.name, "split": split,
            "n": len(problems), "critic": source, **gate, "failures": critic_gate(gate),
            "seconds": round(time.perf_counter() - t0, 1)}


def _gate_on(spec: RunSpec, comp: Components, problems: list[Problem], *, seed: int) -> tuple[dict[str, Any], str]:
    """The critic gate's two passes (:func:`~mlmt_bench.warmstart.shared_base.detection_on_own_attempts`)
    on ``comp``'s step-0 solver and critic (as :func:`_probe_critic` picks it) over ``problems``, at
    the roles' training temperatures and the backend's token limits, sampled with ``seed``; and
    where the critic came from."""
    from mlmt_bench.trainer import training_temperatures
    from mlmt_bench.warmstart.shared_base import detection_on_own_attempts

    critic, source = _probe_critic(spec, comp)
    temps, b = training_temperatures(spec), spec.backend
    with cpu_autocast(spec):
        gate = detection_on_own_attempts(
            comp.policies["solver"], critic, comp.backend, comp.benchmark, comp.verifier, problems,
            solver_temperature=temps["solver"], critic_temperature=temps["critic"],
            max_new_tokens=b.max_new_tokens, feedback_max_new_tokens=b.feedback_max_new_tokens or b.max_new_tokens,
            seed=seed, templates=comp.templates)
    return gate, source


def spec_redacts(spec: RunSpec) -> bool:
    """Whether the refiner sees the critic's feedback redacted (the spec's ``feedback.redact``)."""
    return spec.feedback.redact


def end_of_run_probe(spec: RunSpec, benchmark: Benchmark) -> Callable[[Trainer], None] | None:
    """What a run with a critic does after training (``Trainer.after_train``): the feedback probe on
    its final solver and critic, the first ``eval.probe_problems`` validation problems, sampled as
    evaluation samples and redacted as the run is; written to ``probe.json`` in the run directory.
    None when ``eval.probe_problems`` is 0 or the benchmark has no validation split."""
    n = spec.eval.probe_problems
    if not n or "validation" not in benchmark.splits:
        return None

    def probe(trainer: Trainer) -> None:
        import json

        from mlmt_bench.probe import probe_feedback
        from mlmt_bench.tracking import atomic_write_text

        problems = benchmark.load("validation")[:n]
        if not problems:
            return
        result = probe_feedback(benchmark, trainer.actors, problems, trainer.eval_sampling, redact=spec_redacts(spec),
                                oracle=probe_oracle(spec, benchmark))
        record = {"spec": spec.name, "seed": spec.seed, "benchmark": spec.benchmark.name, "split": "validation",
                  "limit": n, "critic": "final", "step": trainer.counters.step, **result}
        atomic_write_text(Path(trainer.run_dir.path) / "probe.json", json.dumps(record, indent=2) + "\n")

    return probe
