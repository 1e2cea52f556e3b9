"""The warm-started checkpoint of a pretrained chat model (METHOD v4, issue 33): one supervised warm
start of the run's pretrained model on every role's skill, shared by every arm and every seed.

A spec's ``warm_start:`` section (:class:`WarmStartConfig`) names the pretrained model (an alias
such as ``smollm2-135m-instruct``, a directory or a hub name), the oracle benchmark whose
conversations it learns (:mod:`mlmt_bench.warmstart.chat_curriculum`), and the SFT budget. The
build:

1. draws the curriculum's problems: the run benchmark's ``train`` split and, per entry of
   ``levels``, the train split of the benchmark at those options, dropping every problem whose
   :meth:`OracleBenchmark.identity` is in the run's ``validation`` or ``test`` split;
2. samples the model's own attempts at them (``own_samples`` each, at ``own_temperature``): the
   ``own`` source of the critique, refine and resolve conversations, so the critic learns to
   judge the errors this model makes;
3. trains one LoRA adapter (``lora``) on conversations drawn from ``mix`` and ``sources``
   (AdamW, warmup then cosine, clip 1; bfloat16 autocast where the CPU has bfloat16 instructions);
4. saves the adapter (``adapter/``) and merges it into the weights exactly
   (:mod:`mlmt_bench.warmstart.lora_merge`: the same checkpoint from the same adapter on any
   CPU), then saves an ordinary HF checkpoint with its tokenizer.

The entry ``<cache>/<key>/`` holds ``model/``, ``adapter/`` and ``warm_start.json`` (the config, the pretrained
weights it started from, the data's counts and sha256, the SFT summary with its CPU seconds, the
weights' sha256, the CPU and library versions). The key is the sha256 of the config, the prompt
templates and the pretrained weights' identity, so a run's spec picks out its entry; the seed is
the warm start's own (default 0), never the run's: every seed of every arm starts from the same
checkpoint. An entry is written under a temporary name and renamed into place (complete or
absent), and one process builds a key at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlmt_bench.benchmarks.base import OracleBenchmark, verdict_line
from mlmt_bench.errors import UserError
from mlmt_bench.io.notes import tell
from mlmt_bench.models.policy_spec import LoraSpec
from mlmt_bench.types import Problem, PromptTemplates
from mlmt_bench.warmstart.chat_curriculum import KINDS, SOURCES, conversation, draw, token_example
from mlmt_bench.warmstart.shared_base import critic_gate
from mlmt_bench.warmstart.shipped_warm_starts import ADAPTER_DIR, RECORD

#: Bumped whenever a change here would change the weights a config produces (part of the key).
WARM_START_FORMAT = 5
# RECORD: the entry's record; ADAPTER_DIR: the trained LoRA adapter beside the merged ``model/``
# (:mod:`mlmt_bench.warmstart.lora_merge`); both as shipped entries name them


class WarmStartConfig(BaseModel):
    """What the warm start trains on and how. Every field that changes the weights is in the key
    (``_NOT_IN_KEY``: those that do not; ``_KEYED_OFF_DEFAULT``: later ones, only off their default)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="the pretrained model every role loads (its policies' `path`): an alias such "
                                   "as smollm2-135m-instruct, a directory or a hub name")
    benchmark: str | None = Field(None, description="registry name of a benchmark with an oracle critic; default the "
                                                    "run's")
    benchmark_options: dict[str, Any] | None = Field(None, description="its options; default the run's")
    levels: list[dict[str, Any]] = Field(default_factory=list,
                                         description="more curriculum problems: per entry, the train split of the "
                                                     "benchmark with these options on top (e.g. other operations)")
    seed: int = Field(0, ge=0, description="the warm start's own seed (data, sampling, adapter init): one checkpoint "
                                           "for every seed of every arm")
    steps: int = Field(300, ge=0, description="SFT optimiser steps")
    batch: int = Field(8, ge=1, description="conversations per step")
    lr: float = Field(2e-4, gt=0, description="peak learning rate (AdamW, warmup then cosine to 10%)")
    warmup_frac: float = Field(0.05, ge=0, le=1)
    lora: LoraSpec = Field(default_factory=lambda: LoraSpec(r=16, alpha=32),
                           description="the adapter trained, then merged into the weights")
    mix: dict[str, float] = Field(default_factory=lambda: {"solve": 0.25, "critique": 0.4, "refine": 0.25,
                                                           "resolve": 0.1},
                                  description=f"share of conversations of each kind ({', '.join(KINDS)})")
    sources: dict[str, float] = Field(default_factory=lambda: {"own": 0.5, "gold": 0.25, "slip": 0.25},
                                      description="where the attempts of critique, refine and resolve come from "
                                                  f"({', '.join(SOURCES)})")
    critique: Literal["oracle", "worked"] = Field(
        "oracle", description="the critique target: the oracle's answer-free feedback, or the same with its working "
                              "shown (each step recomputed by steps the model can trust, then judged; the refine "
                              "conversations then read it redacted, and a run on it must set feedback.redact)")
    refine: Literal["gold", "worked"] = Field(
        "gold", description="the refine target after feedback that flags an error: the gold solution, or the same with "
                            "the flagged step worked out before its result (the working a worked critique shows, "
                            "which the refiner reads redacted); needs critique: worked")
    own_samples: int = Field(2, ge=0, description="the model's own attempts sampled per curriculum problem")
    own_temperature: float = Field(0.7, gt=0, description="their sampling temperature")
    max_new_tokens: int = Field(128, ge=1, description="length limit of an own attempt")
    gate_problems: int = Field(96, ge=1, description="validation problems of the critic gate (METHOD v4) a run "
                                                     "checks on the warm start before training; not in the key")
    allow_invalid: bool = Field(False, description="run on a warm start that fails the critic gate (its manifest "
                                                   "and every report then say so at the top); not in the key")

    @field_validator("mix")
    @classmethod
    def _kinds(cls, v: dict[str, float]) -> dict[str, float]:
        return _weights(v, KINDS, "mix")

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: dict[str, float]) -> dict[str, float]:
        return _weights(v, SOURCES, "sources")

    @model_validator(mode="after")
    def _worked_refine(self) -> WarmStartConfig:
        if self.refine == "worked" and self.critique != "worked":
            raise ValueError("refine: worked fills in the working a worked critique shows; set critique: worked")
        return self

    @field_validator("levels", "benchmark_options")
    @classmethod
    def _json(cls, v: Any) -> Any:
        try:
            json.dumps(v, sort_keys=True)
        except TypeError as exc:
            raise ValueError(f"must be JSON-serialisable ({exc})") from None
        return v

    def key(self, templates: PromptTemplates, weights: str, benchmark: str, options: dict[str, Any]) -> str:
        """First 16 hex digits of the sha256 of the config, the prompt templates the conversations
        are rendered with, ``weights`` (the identity of the pretrained weights: a shipped model's
        sha256, else its path) and the benchmark and options it is for (the run's where the
        config names none: its held-out splits decide the curriculum)."""
        config = self.model_dump(mode="json", exclude=_NOT_IN_KEY)
        for name, default in _KEYED_OFF_DEFAULT.items():
            if config[name] == default:
                del config[name]
        payload = json.dumps({"format": WARM_START_FORMAT, "config": config,
                              "templates": templates.__dict__, "weights": weights,
                              "benchmark": {"name": benchmark, "options": options}}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


#: WarmStartConfig fields that do not change the weights: outside the key (adding one keeps every key).
_NOT_IN_KEY = {"gate_problems", "allow_invalid"}
#: fields added after warm starts were built, in the key only when set off their default (so every earlier key,
#: and the weights it names, stays what it was)
_KEYED_OFF_DEFAULT = {"refine": "gold"}


def _weights(v: dict[str, float], names: tuple[str, ...], field: str) -> dict[str, float]:
    unknown = sorted(set(v) - set(names))
    if unknown:
        raise ValueError(f"unknown {field} key(s) {', '.join(unknown)}; known: {', '.join(names)}")
    if any(w < 0 for w in v.values()) or sum(v.values()) <= 0:
        raise ValueError(f"{field} weights must be >= 0 with a positive sum")
    return {k: float(v[k]) for k in names if k in v}


@dataclass
class WarmStart:
    """A built warm start: ``directory`` with ``model/`` (HF checkpoint + tokenizer) and its record;
    ``gate``: its critic gate as a run measured it (:func:`mlmt_bench.runner.check_warm_start_gate`),
    None until then."""

    directory: Path
    record: dict[str, Any]
    gate: dict[str, Any] | None = None

    @property
    def model_dir(self) -> Path:
        return self.directory / "model"

    def invalid_because(self) -> list[str]:
        """Why the warm start fails METHOD v4's critic gate (empty: it passes; a gate not measured
        fails)."""
        return critic_gate(self.gate)

    def summary(self) -> dict[str, Any]:
        """What a run manifest records: key, the pretrained weights it started from, the merged
        weights' sha256, data counts and sha256, SFT tokens and CPU seconds, the path, and its
        critic gate with what fails it (where measured)."""
        r = self.record
        gate = {} if self.gate is None else {"gate": self.gate, "invalid_because": self.invalid_because()}
        return {"key": r["key"], "from": r["from"], "sha256": r["sha256"], "data": r["data"],
                "sft": {k: r["sft"].get(k) for k in ("steps", "batch", "first_loss", "final_loss", "tokens",
                                                     "trained_tokens", "cpu_seconds", "seconds")},
                "own_attempts": r["own_attempts"], "config": r["config"], "path": str(self.model_dir), **gate}

    def require_valid(self, allow_invalid: bool) -> None:
        """Refuse (one line, naming the numbers) a warm start that fails the critic gate, unless allowed."""
        failures = self.invalid_because()
        if failures and not allow_invalid:
            raise UserError(f"warm start {self.record['key']} fails the critic gate (METHOD v4): {'; '.join(failures)}"
                            "; change its curriculum (warm_start.mix, sources, steps), or set "
                            "warm_start.allow_invalid: true to run on it anyway (every report then says so)")


def default_cache_dir() -> Path:
    """``$MLMT_BENCH_CACHE/warm-start``, else ``~/.cache/mlmt-bench/warm-start``."""
    from mlmt_bench.tracking import cache_env_dir

    env = cache_env_dir()
    return (env / "warm-start") if env is not None else Path.home() / ".cache" / "mlmt-bench" / "warm-start"


def oracle_benchmark(name: str, options: dict[str, Any]) -> OracleBenchmark:
    from mlmt_bench import registry

    bench = registry.benchmarks.get(name)(**options)
    if not isinstance(bench, OracleBenchmark):
        raise UserError(f"warm_start.benchmark: {name!r} has no oracle critic (it is not an OracleBenchmark); the "
                        "warm start's targets are the oracle's")
    return bench


def curriculum_problems(name: str, options: dict[str, Any], levels: list[dict[str, Any]]) -> list[Problem]:
    """The run benchmark's train split, then each level's train split (``options`` with the level's
    on top), without any problem whose identity is in the run's validation or test split, and
    without repeats; ids are prefixed by the level (``L1/train/000003``)."""
    run = oracle_benchmark(name, options)
    held_out = {run.identity(p) for split in ("validation", "test") for p in run.load(split)}
    out: list[Problem] = []
    seen: set[str] = set()
    for i, level in enumerate([{}, *levels]):
        bench = run if not level else oracle_benchmark(name, {**options, **level})
        for p in bench.load("train"):
            ident = bench.identity(p)
            if ident in held_out or ident in seen:
                continue
            seen.add(ident)
            out.append(dataclasses.replace(p, id=f"L{i}/{p.id}") if i else p)
    if not out:
        raise UserError(f"warm_start: benchmark {name!r} and its levels give no training problem outside the "
                        "validation and test splits")
    return out


def pretrained_identity(model: str) -> str:
    """What the key knows of the pretrained weights: a shipped alias's converted weights sha256
    (converted on first use), else the path or hub name as written."""
    from mlmt_bench.models import pretrained

    if pretrained.lookup(model) is not None:
        return str(pretrained.ensure_converted(model, progress=False).record["weights_sha256"])
    return model


def ensure_warm_start(cfg: WarmStartConfig, templates: PromptTemplates, bench_name: str,
                      bench_options: dict[str, Any], cache_dir: Path | None = None,
                      progress: bool = True) -> WarmStart:
    """The warm start of ``cfg`` (for a run on ``bench_name`` with ``bench_options`` unless ``cfg``
    names its own): on first use installed from the package's copy where one is shipped
    (:mod:`mlmt_bench.warmstart.shipped_warm_starts`), else built; reused afterwards."""
    name = cfg.benchmark or bench_name
    options = dict(cfg.benchmark_options if cfg.benchmark_options is not None else bench_options)
    oracle_benchmark(name, options)  # fail on a bad benchmark before any work
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cfg.key(templates, pretrained_identity(cfg.model), name, options)
    final = cache_dir / key
    found = load(final)
    if found is not None:
        return found
    cache_dir.mkdir(parents=True, exist_ok=True)
    from mlmt_bench.tracking import one_at_a_time, remove_abandoned_temporaries, rename_into_place
    from mlmt_bench.warmstart import shipped_warm_starts

    def waiting(pid: str) -> None:
        if progress:
            tell(f"warm start {key}: process {pid} is building it; waiting to reuse it ...")

    with one_at_a_time(cache_dir / f".lock-{key}", f"the warm start {key}", waiting):
        found = load(final)
        if found is not None:
            return found
        remove_abandoned_temporaries(cache_dir, _TMP)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{key}-", dir=cache_dir))
        try:
            shipped = shipped_warm_starts.install(key, tmp, lambda d: _materialize(d, progress))
            if not shipped:
                record = build(cfg, templates, name, options, tmp, progress)
                record["key"] = key
                (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            rename_into_place(tmp, final, lambda d: load(d) is not None)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    built = load(final)
    assert built is not None
    if progress and shipped:
        tell(f"warm start {key}: installed from the package's copy (its adapter merged here, weights checked), "
             f"cached at {final}")
    elif progress:
        s = built.record["sft"]
        tell(f"warm start {key} built ({s['steps']} steps, {s['cpu_seconds']:.0f} CPU s for the SFT, "
             f"{built.record['own_attempts']['cpu_seconds']:.0f} for its own attempts), cached at {final}")
    return built


#: ``.tmp-<pid>-<key>-<mkdtemp's suffix>``
_TMP = re.compile(r"\.tmp-([0-9]+)-[0-9a-f]{16}-[A-Za-z0-9_]+")


def load(directory: Path) -> WarmStart | None:
    """The entry at ``directory`` after checking its weights' sha256 (None: no entry there); a
    changed file or an unreadable record is one UserError."""
    record_path = directory / RECORD
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text())
        want = record["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{record_path}: unreadable ({exc}); delete {directory} to build the warm start again") \
            from None
    from mlmt_bench.machine.reproducible import weights_sha256

    try:
        got = weights_sha256(directory / "model")
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type is not an OSError
        raise UserError(f"{directory / 'model'}: unreadable weights ({exc}); delete {directory} to build the warm "
                        "start again") from None
    if got != want:
        raise UserError(f"{directory / 'model'}: weights sha256 {got[:16]}… is not the {want[:16]}… recorded when "
                        f"the warm start was built; delete {directory} to build it again")
    return WarmStart(directory, record)


# --------------------------------------------------------------------------- the build


def build(cfg: WarmStartConfig, templates: PromptTemplates, name: str, options: dict[str, Any], out: Path,
          progress: bool) -> dict[str, Any]:
    """Train and save the warm start of ``cfg`` into ``out``; returns its record without key."""
    import torch

    from mlmt_bench.machine import reproducible
    from mlmt_bench.machine.cpus import bf16_instructions, resolve_cpu_dtype
    from mlmt_bench.models import pretrained
    from mlmt_bench.warmstart import lora_merge
    from mlmt_bench.warmstart.sft import sft, sft_bar

    bench = oracle_benchmark(name, options)
    problems = curriculum_problems(name, options, cfg.levels)
    torch.manual_seed(cfg.seed)
    policy = _pretrained_policy(cfg, progress)
    tokenizer = policy.tokenizer
    dtype = resolve_cpu_dtype("auto", bf16_instructions(), False)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    with autocast:
        own, own_record = own_attempts(policy, bench, templates, problems, cfg, progress)
    data = Data(bench, templates, tokenizer, problems, own, cfg)
    rng = random.Random(f"warm-start:{cfg.seed}:data")
    if progress:
        tell(f"warm start: {cfg.steps} SFT steps of {cfg.batch} conversations on {len(problems)} problems "
             f"({dtype} on the CPU) ...")
    from mlmt_bench.io.progress import stage_progress

    losses: list[float] = []
    with autocast, stage_progress(progress, sft_bar) as bar:
        task = bar.add_task("warm start SFT", total=cfg.steps, loss=float("nan")) if bar else None

        def on_step(step: int, loss: float) -> None:
            losses.append(round(loss, 4))
            if bar is not None:
                bar.update(task, advance=1, loss=loss)

        summary = sft(policy.model, data.example, steps=cfg.steps, batch=cfg.batch, lr=cfg.lr,
                      warmup_frac=cfg.warmup_frac, rng=rng, pad_id=_pad_id(tokenizer), on_step=on_step)
    summary["losses"] = losses  # a step's weighted mean over its conversations' target tokens (nats)
    pairs = lora_merge.lora_pairs(policy.model)
    lora_merge.save_adapter(pairs, out / ADAPTER_DIR)
    model_dir = _save_merged(policy, pairs, out)
    source = pretrained.weights_source(cfg.model) if pretrained.lookup(cfg.model) is not None else {"path": cfg.model}
    return {"config": cfg.model_dump(mode="json"), "benchmark": {"name": name, "options": options},
            "templates": templates.__dict__, "from": source, "cpu_dtype": dtype,
            "own_attempts": own_record, "data": data.record(), "sft": summary,
            "sha256": reproducible.weights_sha256(model_dir), "environment": reproducible.record()}


def _pretrained_policy(cfg: WarmStartConfig, progress: bool) -> Any:
    """The pretrained model of ``cfg`` wrapped with its (fresh) LoRA adapter, and its tokenizer."""
    from mlmt_bench.models import pretrained
    from mlmt_bench.models.hf_quiet import quiet_transformers
    from mlmt_bench.models.policy import build_policy
    from mlmt_bench.models.policy_spec import PolicySpec

    spec = PolicySpec(model="hf", path=cfg.model, lora=cfg.lora, lr=cfg.lr)
    with quiet_transformers():
        return build_policy("solver", spec, pretrained.resolve(cfg.model, progress=progress))


def _save_merged(policy: Any, pairs: dict[str, Any], entry: Path) -> Path:
    """Merge ``pairs`` exactly into ``policy``'s pretrained weights; save them with the tokenizer as
    ``entry/model`` (returned)."""
    from mlmt_bench.models.hf_quiet import quiet_transformers
    from mlmt_bench.warmstart import lora_merge

    merged = policy.model.unload()  # the pretrained weights, unchanged; the adapter is added exactly below
    lora_merge.merge_exact(merged, pairs)
    model_dir = entry / "model"
    with quiet_transformers():
        merged.save_pretrained(model_dir, safe_serialization=True)
        policy.tokenizer.save_pretrained(model_dir)
    return model_dir


def rebuild_model(entry: Path, progress: bool) -> None:
    """Write ``entry/model`` from ``entry``'s record and ``adapter/`` (a shipped entry carries no
    merged weights): the pretrained model of its config plus the adapter, merged as the build did.
    :func:`load` then checks the weights against the record's sha256."""
    from mlmt_bench.warmstart import lora_merge

    cfg = WarmStartConfig.model_validate(json.loads((entry / RECORD).read_text())["config"])
    _save_merged(_pretrained_policy(cfg, progress), lora_merge.load_adapter(entry / ADAPTER_DIR), entry)


def _materialize(entry: Path, progress: bool) -> None:
    """A shipped entry's ``model/`` (:func:`rebuild_model`), checked against its record (:func:`load`)."""
    rebuild_model(entry, progress)
    load(entry)


def _pad_id(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


def own_attempts(policy: Any, bench: OracleBenchmark, templates: PromptTemplates, problems: list[Problem],
                 cfg: WarmStartConfig, progress: bool) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """The model's own attempts (``cfg.own_samples`` per problem at ``cfg.own_temperature``), by
    problem id, before any training, and what they cost and scored (the benchmark's verifier)."""
    from mlmt_bench import registry
    from mlmt_bench.rollout.episodes import attempt_prompt
    from mlmt_bench.rollout.hf_backend import HFBackend

    t0, c0 = time.perf_counter(), time.process_time()
    jobs = [p for p in problems for _ in range(cfg.own_samples)]
    out: dict[str, list[str]] = {p.id: [] for p in problems}
    right = tokens = clipped = 0
    if jobs:
        if progress:
            tell(f"warm start: sampling {len(jobs)} own attempts (T={cfg.own_temperature:g}) ...")
        backend = HFBackend(batch_size=64)
        verifier = registry.verifiers.get(bench.default_verifier)()
        policy.model.eval()
        adapter_off = getattr(policy.model, "disable_adapter", None)  # the pretrained model as it is
        with adapter_off() if adapter_off is not None else contextlib.nullcontext():
            gens = backend.generate(policy.model, policy.tokenizer,
                                    [attempt_prompt(policy.tokenizer, templates, p) for p in jobs],
                                    max_new_tokens=cfg.max_new_tokens, temperature=cfg.own_temperature, top_p=1.0,
                                    stop=None)
        for p, g in zip(jobs, gens):
            out[p.id].append(g.text)
            right += int(verifier.score(p, g.text).correct)
            tokens += len(g.ids)
            clipped += int(g.finish_reason == "length")
    return out, {"n": len(jobs), "temperature": cfg.own_temperature, "accuracy": right / len(jobs) if jobs else None,
                 "tokens": tokens, "clipped": clipped, "seconds": round(time.perf_counter() - t0, 2),
                 "cpu_seconds": round(time.process_time() - c0, 2)}


class Data:
    """Draws the warm start's token examples (one conversation each) and counts what it drew."""

    def __init__(self, bench: OracleBenchmark, templates: PromptTemplates, tokenizer: Any, problems: list[Problem],
                 own: dict[str, list[str]], cfg: WarmStartConfig) -> None:
        self.bench, self.templates, self.tokenizer = bench, templates, tokenizer
        self.problems, self.own, self.cfg = problems, own, cfg
        self.counts: dict[str, int] = {}
        self.hash = hashlib.sha256()
        self.verdicts = {"correct": 0, "incorrect": 0}

    def example(self, rng: random.Random, step: int) -> Any:
        kind = draw(self.cfg.mix, rng)
        problem = self.problems[rng.randrange(len(self.problems))]
        source = draw(self.cfg.sources, rng)
        c = conversation(self.bench, self.templates, kind, problem, source,  # type: ignore[arg-type]
                         self.own.get(problem.id, []), rng, worked=self.cfg.critique == "worked",
                         worked_refine=self.cfg.refine == "worked")
        label = kind if c.source is None else f"{kind}/{c.source}"
        self.counts[label] = self.counts.get(label, 0) + 1
        if kind == "critique":
            self.verdicts["correct" if verdict_line(c.target) else "incorrect"] += 1
        ids, spans = token_example(self.tokenizer, self.templates, c)
        self.hash.update(json.dumps([ids, spans]).encode())
        return ids, spans

    def record(self) -> dict[str, Any]:
        return {"problems": len(self.problems), "conversations": dict(sorted(self.counts.items())),
                "critique_verdicts": self.verdicts, "sha256": self.hash.hexdigest()}
