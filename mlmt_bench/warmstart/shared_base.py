"""The shared base (METHOD.md v2, "Where every policy starts"): one tiny model per seed, trained
on the union of every role's skill, from which every policy of every arm starts.

Real runs start every policy from one pretrained checkpoint; the tiny CPU setting mirrors that
with a base trained by supervised fine-tuning on the curriculum of
:mod:`mlmt_bench.benchmarks.synthetic_curriculum` (solve, refine after feedback, re-solve after
g∅, write feedback). The solver, the critic, and the single policy of GRPO and self_correct
all load the same weights; roles differ only by their prompts. A parameter-matched arm trains
a larger preset on exactly the same conversations (the data never depends on a model).

Reproducible: a base is a pure function of its :class:`BaseConfig` — seeded initialisation,
data and order, and a number of torch CPU threads (the float summation order, hence the
weights, depends on it), all in the cache key (a build with the default batch runs on 1 or 2 threads, as idle cores
allow, which give the same weights: :mod:`mlmt_bench.warmstart.build_threads`); and, under the CPU pin of
:mod:`mlmt_bench.machine.reproducible` (on unless ``MLMT_BENCH_CPU_PIN=0``), the same on machines of
one CPU vendor with AVX2 (not across vendors: an Intel Xeon and an AMD EPYC build other weights
from one config, measured). ``base.json`` records the weights' sha256 and the build's environment (CPU,
pin, library versions) so that a base built elsewhere is told apart. It is cached under
``<cache_dir>/<key>/`` with ``model/`` (an ordinary HF checkpoint with its tokenizer) and
``base.json`` (the config, what it was trained on, and its check on the validation split),
written under a temporary name and renamed into place, so an entry is complete or absent; the
temporary folder of a build that was killed is removed by the next build. One process builds a
key at a time (it holds ``<cache_dir>/.lock-<key>``): a concurrent build of the same key waits and
reuses the entry. The default cache is
``$MLMT_BENCH_CACHE`` or ``~/.cache/mlmt-bench/bootstrap``. A base whose entry ships with the
package (:mod:`mlmt_bench.warmstart.shipped_bases`: the quickstart's) is copied from it instead
of being built.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlmt_bench.benchmarks.base import OracleBenchmark
from mlmt_bench.errors import UserError
from mlmt_bench.io.notes import tell
from mlmt_bench.models.hf_quiet import quiet_transformers
from mlmt_bench.warmstart import shipped_bases
from mlmt_bench.warmstart.build_threads import ThreadGovernor

#: Bumped whenever a change here would change the weights a config produces (part of the key).
#: 4: built under the CPU pin (mlmt_bench.machine.reproducible), which changes the weights on every machine.
BASE_FORMAT = 4


class BaseMix(BaseModel):
    """Share of SFT steps on each kind of conversation (one kind per step; they need not sum to 1)."""

    model_config = ConfigDict(extra="forbid")

    solve: float = Field(0.3, ge=0, description="turn-1 solutions")
    refine: float = Field(0.3, ge=0, description="revisions after the oracle's feedback")
    resolve: float = Field(0.1, ge=0, description="new attempts after the null feedback g∅")
    critique: float = Field(0.3, ge=0, description="feedback on attempts (the critic's skill)")

    @model_validator(mode="after")
    def _some(self) -> BaseMix:
        if self.solve + self.refine + self.resolve + self.critique <= 0:
            raise ValueError("at least one mixture weight must be positive")
        return self


class CritiqueMix(BaseModel):
    """Where the critique examples' attempts come from (METHOD v3: the testbed offers no shortcut).

    Never the base's own misconceived solver: every source spreads its errors evenly over the
    operations, so a critic can only learn to check the arithmetic, not to recall which
    operations one solver gets wrong."""

    model_config = ConfigDict(extra="forbid")

    gold: float = Field(0.4, ge=0, description="gold solutions (the critic must approve them)")
    slip: float = Field(0.3, ge=0, description="gold with one random slip at a uniformly random step")
    other: float = Field(0.3, ge=0, description="solutions of solvers with other, freshly drawn misconception sets")

    @model_validator(mode="after")
    def _some(self) -> CritiqueMix:
        if self.gold + self.slip + self.other <= 0:
            raise ValueError("at least one critique source weight must be positive")
        return self


class BaseConfig(BaseModel):
    """What the shared base is trained on and how. Every field is in the cache key."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str = Field("synthetic-arith",
                           description="registry name of a synthetic benchmark with an oracle critic")
    benchmark_options: dict[str, Any] = Field(default_factory=dict,
                                              description="options of the benchmark (as in the run spec's "
                                                          "benchmark.options)")
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
                                       description="share of refine/resolve conversations whose attempt is the "
                                                   "taught one")
    counterfactual_frac: float = Field(
        0.3, ge=0, le=1, description="share of corrective feedbacks stating a made-up value that the revision follows")
    feedback_token_weight: float = Field(3.0, ge=0,
                                         description="loss weight of the revision tokens the feedback dictates")
    critique_mix: CritiqueMix = Field(default_factory=CritiqueMix,
                                      description="where the critique examples' attempts come from")
    critic_noise: float = Field(0.1, ge=0, le=1, description="share of critique targets replaced by wrong feedback")
    critic_token_weight: float = Field(3.0, ge=0,
                                       description="loss weight of the critic's verdicts and computed values")
    threads: int = Field(1, ge=1, description="torch CPU threads whose float summation order the weights follow: "
                                               "part of the key; with 1 or 2 here and the default batch the build "
                                               "runs on 1 or 2 threads as idle cores allow (the same weights)")
    check_problems: int = Field(200, ge=1, description="validation problems of the base's check")
    check_temperature: float = Field(1.0, ge=0, description="the check also runs at this sampling temperature "
                                                             "(both roles): what RL sees; the critic gate samples "
                                                             "the solver's attempts at it")
    critic_temperature: float | None = Field(
        None, ge=0, description="the critic gate's sampled pass runs the critic at this temperature (METHOD v4); "
                                "default: the critic's training temperature in the spec that uses the base "
                                "(policies.critic.temperature, else backend.temperature), else check_temperature; "
                                "not part of the key")
    allow_invalid: bool = Field(False, description="run on a base that fails METHOD v3's critic-validity thresholds "
                                                   "or METHOD v4's critic gate (every report then says so at the "
                                                   "top); not part of the key")

    @field_validator("benchmark_options")
    @classmethod
    def _json_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(v, sort_keys=True)
        except TypeError as exc:
            raise ValueError(f"must be JSON-serialisable ({exc})") from None
        return v

    def with_seed(self, seed: int) -> BaseConfig:
        """This config with ``seed`` filled in when it names none."""
        return self if self.seed is not None else self.model_copy(update={"seed": seed})

    def key(self) -> str:
        """First 16 hex digits of the sha256 of the canonical config JSON, the format version and
        whether the CPU pin is in this process's environment (it changes the weights: an unpinned
        build, e.g. from a Python caller that never ran :func:`reproducible.apply`, never passes for
        a pinned one in the cache)."""
        from mlmt_bench.machine import reproducible

        if self.seed is None:
            raise ValueError("a base's key needs its seed (BaseConfig.with_seed)")
        pin = reproducible.PIN if reproducible.in_environment() else "off"
        payload = json.dumps({"format": BASE_FORMAT, **({} if pin == reproducible.PIN else {"cpu_pin": pin}),
                              **self.model_dump(mode="json", exclude=_NOT_IN_KEY)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


#: BaseConfig fields that do not change the weights: outside the key (adding one keeps every key).
_NOT_IN_KEY = {"allow_invalid", "critic_temperature"}


@dataclass
class Base:
    """A built base: ``model_dir`` (HF checkpoint + tokenizer) and its ``report`` (base.json)."""

    directory: Path
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        return self.directory / "model"

    def invalid_because(self) -> list[str]:
        """Why the base fails METHOD v3's critic-validity thresholds or METHOD v4's critic gate
        (``report["gate"]``, :func:`critic_gate`) (empty: it is valid)."""
        return validity_failures(self.report.get("check") or {}) + critic_gate(self.report.get("gate"))

    def summary(self) -> dict[str, Any]:
        """What a run records about its base: key, weights sha256 and the build's environment (CPU,
        pin, library versions), seed, preset, parameters, data and tokens, and whether it is a
        valid testbed."""
        r = self.report
        return {"key": r["key"], "sha256": r.get("sha256"), "environment": r.get("environment"),
                "seed": r["config"]["seed"], "preset": r["config"]["preset"], "params": r["params"],
                "tokens": r["sft"]["tokens"], "trained_tokens": r["sft"]["trained_tokens"],
                "flops": r["flops"], "steps_by_kind": r["steps_by_kind"], "config": r["config"],
                "path": str(self.directory), "gate": r.get("gate"), "invalid_because": self.invalid_because()}

    def require_valid(self, allow_invalid: bool) -> None:
        """Refuse (one line, naming the numbers) a base that fails the thresholds, unless allowed."""
        failures = self.invalid_because()
        if failures and not allow_invalid:
            r = self.report
            raise UserError(f"base {r['key']} ({r['config']['preset']}, seed {r['config']['seed']}) is not a valid "
                            f"testbed (METHOD v4): {'; '.join(failures)}; train a larger preset or more data, or set "
                            "base.allow_invalid: true to run on it anyway (every report then says so)")


def default_cache_dir() -> Path:
    """``$MLMT_BENCH_CACHE`` (checked: :func:`mlmt_bench.tracking.cache_env_dir`), else
    ``~/.cache/mlmt-bench/bootstrap``."""
    from mlmt_bench.tracking import cache_env_dir

    return cache_env_dir() or Path.home() / ".cache" / "mlmt-bench" / "bootstrap"


def synthetic_benchmark(name: str, options: dict[str, Any]) -> OracleBenchmark:
    """The benchmark, checked to have the oracle critic the curriculum needs."""
    from mlmt_bench import registry

    bench = registry.benchmarks.get(name)(**options)
    if not isinstance(bench, OracleBenchmark):
        raise UserError(f"base.benchmark: {name!r} has no oracle critic (it is not an OracleBenchmark); "
                        "the shared base needs a synthetic benchmark such as synthetic-arith")
    return bench


# --------------------------------------------------------------------------- cache


def is_cached(cfg: BaseConfig, cache_dir: Path | None = None) -> bool:
    """Whether the base of ``cfg`` is built (in the cache)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _load(cache_dir / cfg.key()) is not None


def ensure_base(cfg: BaseConfig, cache_dir: Path | None = None, progress: bool = True, *,
                require_valid: bool = True) -> Base:
    """The base of ``cfg`` (its seed set): built and checked on first use, reused afterwards, with
    its critic gate (METHOD v4, :func:`gate_check`) at ``cfg``'s temperatures in ``report["gate"]``.
    ``require_valid``: refuse a base that fails METHOD v3's thresholds or the gate unless
    ``cfg.allow_invalid`` (it is cached all the same: the check is part of the entry)."""
    base = _ensure_built(cfg, cache_dir, progress)
    if require_valid:
        base.require_valid(cfg.allow_invalid)
    return base


def _ensure_built(cfg: BaseConfig, cache_dir: Path | None, progress: bool) -> Base:
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cfg.key()
    final = cache_dir / key
    cached = _load(final)
    if cached is not None:
        return _with_gate(cached, cfg, progress)
    shipped = shipped_bases.install(key, cache_dir)
    if shipped is not None:
        base = _load(shipped)
        assert base is not None
        _with_gate(base, cfg, progress)
        if progress:
            r, why = base.report, base.invalid_because()
            cpu = (r.get("environment") or {}).get("cpu")
            tell(f"shared base {key}: the copy shipped with mlmt-bench (built on {cpu}, weights sha256 "
                 f"{str(r.get('sha256'))[:16]}, every file checked), installed at {final}: "
                 f"{check_line(r.get('check') or {})}; "
                 + ("INVALID testbed: " + "; ".join(why) if why else "valid testbed"))
        return base
    bench = synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)  # fail on a bad benchmark before any work
    cache_dir.mkdir(parents=True, exist_ok=True)
    from mlmt_bench.tracking import one_at_a_time

    def waiting(pid: str) -> None:
        if progress:
            tell(f"shared base {key}: process {pid} is building it; waiting to reuse it ...")

    # one build per key at a time: a concurrent build of the same key (three runs of one seed
    # started together) waits for the first and reuses its entry instead of building it again
    with one_at_a_time(cache_dir / f".lock-{key}", f"the shared base {key}", waiting):
        meanwhile = _load(final)
        t0 = time.perf_counter()
        if meanwhile is None:
            _build_entry(cfg, bench, cache_dir, progress)
    if meanwhile is not None:
        if progress:
            tell(f"shared base {key}: built by another process meanwhile, reused from {final}")
        return _with_gate(meanwhile, cfg, progress)
    result = _load(final)
    assert result is not None
    seconds = time.perf_counter() - t0  # the build and its check: the gate's passes are said on their own
    _with_gate(result, cfg, progress)
    if progress:
        from mlmt_bench.io.progress import duration

        why = result.invalid_because()
        tell(f"shared base {key} built in {duration(seconds)}{_on_threads(result.report)}, cached at "
             f"{final} (later runs reuse it): {check_line(result.report.get('check') or {})}; "
             + ("INVALID testbed: " + "; ".join(why) if why else "valid testbed"))
    return result


def _build_entry(cfg: BaseConfig, bench: Any, cache_dir: Path, progress: bool) -> None:
    """Build and check the base of ``cfg`` in a temporary folder of ``cache_dir``, then rename it
    to its entry ``cache_dir/<key>`` (nothing is left of a build that fails)."""
    key = cfg.key()
    _remove_abandoned(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=cache_dir))
    try:
        report = _build(cfg, bench, tmp, progress)
        report["key"] = key
        if progress:
            tell(f"checking base {key} on {cfg.check_problems} validation problems (greedy and at T="
                 f"{cfg.check_temperature:g}) ...")
        with torch_threads(cfg.threads):  # restores the caller's count afterwards
            ThreadGovernor(cfg.threads, cfg.batch).start()
            report["check"] = check_base(Base(tmp, report), bench, cfg.check_problems,
                                         temperature=cfg.check_temperature)
        (tmp / "base.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        from mlmt_bench.tracking import rename_into_place

        rename_into_place(tmp, cache_dir / key, lambda d: _load(d) is not None)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _on_threads(report: dict[str, Any]) -> str:
    """' on 2 threads' (or ' on 1-2 threads' when the count changed during the build)."""
    used = sorted(int(t) for t in (report.get("build_threads") or {}).get("steps") or {})
    if not used:
        return ""
    span = str(used[0]) if len(used) == 1 else f"{used[0]}-{used[-1]}"
    return f" on {span} thread{'s' if used[-1] > 1 else ''}"


def check_line(check: dict[str, Any]) -> str:
    """A base's check (:func:`check_base`) in one line: validation accuracy of the first attempt and
    after each feedback, as percentages."""
    def pct(key: str) -> str:
        v = check.get(key)
        return "–" if v is None else f"{100 * v:.1f}%"

    return (f"validation acc@t1 {pct('acc@t1')}, acc@t2 after its own feedback {pct('acc@t2_critic')}, after g∅ "
            f"{pct('acc@t2_null')}, after the oracle's {pct('acc@t2_oracle')}")


def _load(directory: Path) -> Base | None:
    """The cached base in ``directory`` (None when there is none), trusted only once checked: the
    entry is this user's (an entry another uid planted in a shared cache is refused), ``base.json``
    is a bounded JSON object, the model holds no pickle file, and its weights hash to the sha256
    ``base.json`` records (:func:`verified_weights_sha256`). Anything else is one line."""
    from mlmt_bench.io import bounded_input

    meta = directory / "base.json"
    if not os.path.lexists(meta):
        return None
    owner = os.lstat(directory).st_uid
    if owner != os.getuid():
        raise UserError(f"{directory}: a cached base owned by uid {owner}, not this user's ({os.getuid()}); refused "
                        "(set MLMT_BENCH_CACHE to a cache of your own)")
    bounded_input.check_plain_file(meta)  # not a link, not a device
    report = bounded_input.read_json(meta)
    if not isinstance(report, dict) or not isinstance(report.get("config"), dict) or "key" not in report:
        raise UserError(f"{meta}: not a base's record (a JSON object with its key and config); remove "
                        f"{directory} and it is built again")
    base = Base(directory, report)
    pickles = sorted(p.name for p in base.model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt"))
    if pickles:
        raise UserError(f"{base.model_dir}: holds {', '.join(pickles[:3])} (pickle files run code when loaded); "
                        "refused: a base's weights are safetensors only")
    got = verified_weights_sha256(base.model_dir)
    if report.get("sha256") is not None and got != report["sha256"]:
        raise UserError(f"{base.model_dir}: weights sha256 {got[:16]} differ from the {str(report['sha256'])[:16]} "
                        f"its base.json records (changed or corrupt); remove {directory} and it is built again")
    report["sha256"] = got  # what a run records is the hash of the weights it loads
    return base


#: model directory -> (the stat of its *.safetensors files, their weights sha256): a base is
#: hashed once per process until its files change
_VERIFIED: dict[str, tuple[tuple[tuple[str, int, int, int], ...], str]] = {}


def verified_weights_sha256(model_dir: Path) -> str:
    """:func:`mlmt_bench.machine.reproducible.weights_sha256` of ``model_dir``, memoised on the files'
    (name, inode, size, mtime); unreadable weights are one line."""
    from mlmt_bench.machine import reproducible

    try:
        files = sorted(model_dir.glob("*.safetensors"))
        sig = tuple((f.name, st.st_ino, st.st_size, st.st_mtime_ns) for f in files for st in [os.stat(f)])
    except OSError as exc:
        raise UserError(f"{model_dir}: cannot read ({exc.strerror or exc})") from None
    memo = _VERIFIED.get(str(model_dir))
    if memo is not None and memo[0] == sig:
        return memo[1]
    try:
        sha = reproducible.weights_sha256(model_dir)
    except Exception as exc:  # noqa: BLE001 - a corrupt safetensors file raises many kinds
        raise UserError(f"{model_dir}: unreadable weights ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    _VERIFIED[str(model_dir)] = (sig, sha)
    return sha


#: ``.tmp-<key>-<pid>-<mkdtemp's suffix>``: the temporary folder of a base build (and only that:
#: another program's ``.tmp-x-123-y`` in a shared cache such as /tmp does not match)
_BUILD_TMP = re.compile(r"\.tmp-[0-9a-f]{16}-([0-9]+)-[A-Za-z0-9_]+")


def _remove_abandoned(cache_dir: Path) -> None:
    """Temporary folders of this user's base builds whose process is gone."""
    from mlmt_bench.tracking import remove_abandoned_temporaries

    remove_abandoned_temporaries(cache_dir, _BUILD_TMP)


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


def _build(cfg: BaseConfig, bench: Any, out: Path, progress: bool,
           governor: ThreadGovernor | None = None) -> dict[str, Any]:
    """Trains and saves the base of ``cfg`` into ``out``; returns its ``base.json`` without key
    and check. ``governor``: the torch thread count step by step (default: as many idle cores as
    give the same weights, :mod:`mlmt_bench.warmstart.build_threads`)."""
    import torch
    import transformers

    from mlmt_bench.benchmarks.synthetic_curriculum import KINDS, Curriculum
    from mlmt_bench.io.progress import stage_progress
    from mlmt_bench.machine import reproducible
    from mlmt_bench.metrics.cost import training_flops
    from mlmt_bench.models.tiny import build_tiny_model, num_parameters, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.warmstart.sft import sft, sft_bar

    assert cfg.seed is not None
    tok = build_char_tokenizer()
    data = Curriculum(cfg, bench, tok, cfg.seed)
    weights = [getattr(cfg.mix, k) for k in KINDS]
    kinds_rng = random.Random(f"base:{cfg.seed}:kinds")
    plan = [kinds_rng.choices(KINDS, weights=weights)[0] for _ in range(cfg.steps)]
    governor = governor or ThreadGovernor(cfg.threads, cfg.batch)
    # torch_threads saves the caller's count first and restores it afterwards (a run that built its
    # base goes on with its own train.threads); the governor sets the count inside it
    with torch_threads(cfg.threads), quiet_transformers(), stage_progress(progress, sft_bar) as bar:
        governor.start()
        model = build_tiny_model(cfg.preset, tok, seed=cfg.seed)
        what = f"building shared base {cfg.preset} seed {cfg.seed} (first run only: cached for every later run)"
        task = bar.add_task(what, total=cfg.steps, loss=float("nan")) if bar else None

        def on_step(step: int, loss: float) -> None:
            governor.step()
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
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "sha256": reproducible.weights_sha256(out / "model"), "environment": reproducible.record(),
            "build_threads": governor.record()}


# --------------------------------------------------------------------------- check


#: METHOD v3: a base whose critic false-alarms on more than 10% of gold solutions, or whose
#: shortcut gap (false alarms on problems with a misconception operation minus the others)
#: exceeds 5 points, is not a valid base. Judged on the greedy check.
MAX_FALSE_ALARM = 0.10
MAX_SHORTCUT_GAP = 0.05


def check_base(base: Base, bench: Any, n: int, *, backend: Any = None, temperature: float = 1.0) -> dict[str, Any]:
    """The base on the first ``n`` **validation** problems, through the same
    :func:`mlmt_bench.rollout.episodes.rollout` / :func:`mlmt_bench.evaluate.evaluate` every run uses,
    greedy and at the training ``temperature`` (both roles).

    The base plays solver and critic. ``acc@t1`` is the first attempt; ``acc@t2_critic`` the
    refinement after the base's own feedback (with its correction / regression rates and
    feedback effect), ``acc@t2_null`` after g∅ (a new attempt), ``acc@t2_oracle`` after the
    oracle's feedback (what the refinement skill can do with perfect feedback). ``critic``: the
    critic's validity (METHOD v3, :func:`critic_validity`); the same under ``"sampled"`` at
    ``temperature``.
    """
    t0 = time.perf_counter()
    problems, verifier, backend, policy = _on_validation(base, bench, n, backend)
    cfg = base.report["config"]
    beliefs = _beliefs(cfg, bench)
    out: dict[str, Any] = {"split": "validation", "n": len(problems)}
    out.update(_check_at(policy, bench, verifier, backend, problems, beliefs, 0.0, cfg["seed"]))
    sampled = _check_at(policy, bench, verifier, backend, problems, beliefs, temperature, cfg["seed"])
    out["sampled"] = {"temperature": temperature, **sampled}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _beliefs(cfg: dict[str, Any], bench: OracleBenchmark) -> Any:
    from mlmt_bench.benchmarks.synthetic_curriculum import Misconceptions

    return Misconceptions(cfg["misconceptions"], cfg["seed"], bench.ops, bench.max_operand)


def _check_at(policy: Any, bench: Any, verifier: Any, backend: Any, problems: list[Any], beliefs: Any,
              temperature: float, seed: int) -> dict[str, Any]:
    """Accuracies and critic validity at one temperature (0: greedy)."""
    import torch

    from mlmt_bench.evaluate import evaluate
    from mlmt_bench.rollout.episodes import Actors, Program, Sampling

    torch.manual_seed(seed)  # the sampled check is reproducible
    length = max(len(bench.solution(p)) for p in problems) + 16  # characters: a solution or revision
    # a feedback recomputes every step and judges it (synthetic.oracle_feedback): up to twice as long
    sampling = Sampling(temperature=temperature, top_p=1.0, max_new_tokens=length, feedback_max_new_tokens=2 * length)
    actors = Actors(policy, policy, backend, bench.templates, verifier, bench.oracle_feedback, bench.feedback_verdict)
    out: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for source in ("critic", "oracle"):
        res = evaluate(Program(attempts=1, feedback=source), actors, problems, sampling,
                       feedback_metrics=(source == "critic"), n_samples=0,
                       protocols=("refine_all",))
        m = res.metrics
        out["acc@t1"] = m["acc@t1"]
        out[f"acc@t2_{source}"] = m["acc@t2"]
        out[f"correction_rate_{source}"] = m.get("correction_rate")
        out[f"regression_rate_{source}"] = m.get("regression_rate")
        if source == "critic":
            out.update({k: m.get(k) for k in ("acc@t2_null", "feedback_effect", "leakage_rate", "feedback_tokens")})
            own = {k: m.get(k) for k in ("false_alarm_rate", "miss_rate", "exact_correction_rate",
                                         "verdict_accuracy")}
    out["critic"] = {**critic_validity(policy, bench, backend, problems, beliefs, sampling, seed), "own": own}
    return out


def critic_validity(critic: Any, bench: Any, backend: Any, problems: list[Any], beliefs: Any, sampling: Any,
                    seed: int) -> dict[str, Any]:
    """Does the critic check, or recall (METHOD v3, "The testbed must not offer shortcuts")?

    Probes the critic on attempts no solver wrote: ``gold``, the gold solutions (every verdict
    should approve: its false-alarm rate overall, on problems that use one of the seed's
    misconception operations (``in``) and on the others (``out``), and the ``shortcut_gap`` in −
    out); ``slip``, gold with one random slip at a uniformly random step (seeded: its miss and
    exact-correction rates). ``own`` (added by the caller) is the same on the base solver's own
    attempts. Rates in [0, 1].
    """
    import random

    from mlmt_bench.metrics.critic import critic_diagnostics, shortcut_gap
    from mlmt_bench.rollout.episodes import critique

    gold = [bench.solution(p) for p in problems]
    rng = random.Random(f"base-check:{seed}:slips")
    slipped = [bench.inject_errors(g, rng, second_error_rate=0.0) for g in gold]
    texts = critique(critic, backend, bench.templates, problems + problems, gold + slipped, sampling)
    on_gold, on_slip = texts[: len(problems)], texts[len(problems):]
    gap = shortcut_gap([bench.feedback_verdict(t) for t in on_gold], [beliefs.hits(p) for p in problems])
    slip = critic_diagnostics([bench.feedback_verdict(t) for t in on_slip], [False] * len(problems),
                              [t.strip() == bench.oracle_feedback(p, a).strip()
                               for t, p, a in zip(on_slip, problems, slipped)])
    return {"gold": {k: gap[k] for k in ("false_alarm_rate", "false_alarm_rate_in", "false_alarm_rate_out",
                                         "shortcut_gap", "n_in", "n_out")},
            "slip": {k: slip[k] for k in ("miss_rate", "exact_correction_rate")}}


def validity_failures(check: dict[str, Any]) -> list[str]:
    """What makes a checked base invalid under METHOD v3's thresholds (empty: valid), each a
    phrase naming the number. Judged on the greedy check; a check without critic probes (a base
    built before v3) is reported as such."""
    gold = (check.get("critic") or {}).get("gold")
    if not gold:
        return ["its check has no critic probes (built before METHOD v3)"]
    out = []
    fa, gap = gold.get("false_alarm_rate"), gold.get("shortcut_gap")
    if fa is not None and fa > MAX_FALSE_ALARM:
        out.append(f"false-alarm rate on gold solutions {100 * fa:.1f}% > {100 * MAX_FALSE_ALARM:.0f}%")
    if gap is not None and gap > MAX_SHORTCUT_GAP:
        out.append(f"shortcut gap {100 * gap:+.1f} points > {100 * MAX_SHORTCUT_GAP:.0f}")
    return out


# --------------------------------------------------------------------------- critic gate (METHOD v4)


#: METHOD v4's critic gate: on the base solver's own attempts (validation split), greedy and at the
#: critic's training temperature, the critic's detection J = recall − false-alarm rate must reach
#: MIN_DETECTION_J with false alarms (on the right attempts) at most MAX_OWN_FALSE_ALARM. An
#: approve-all critic (J = 0) and a flag-all critic (false alarms 100%) both fail it.
MIN_DETECTION_J = 0.20
MAX_OWN_FALSE_ALARM = 0.10
#: the gate's records of a cache entry, one per (problems, solver and critic temperature); written
#: beside base.json on first use, so a shipped entry's files (and their manifest) stay as built
GATE_FILE = "gate.json"


def _on_validation(base: Base, bench: Any, n: int, backend: Any) -> tuple[list[Any], Any, Any, _Actor]:
    """What a check of ``base`` runs on: the first ``n`` validation problems (a one-line error when
    there are none), the benchmark's verifier, the backend (``hf`` unless given) and the base
    loaded as one policy that plays solver and critic."""
    from mlmt_bench import registry
    from mlmt_bench.models.tiny import load_checkpoint

    problems = bench.load("validation")[:n]
    if not problems:
        raise UserError(f"base: benchmark {base.report['config']['benchmark']!r} has no validation problems")
    verifier = registry.verifiers.get(bench.default_verifier)()
    with quiet_transformers():
        model, tok = load_checkpoint(base.model_dir)
    return problems, verifier, backend or registry.backends.get("hf")(), _Actor(model, tok)


def gate_check(base: Base, bench: Any, n: int, *, solver_temperature: float, critic_temperature: float,
               backend: Any = None) -> dict[str, Any]:
    """The critic gate's measurement (METHOD v4) of ``base``: :func:`detection_on_own_attempts` with
    the base playing solver and critic on the first ``n`` validation problems, turns as long as the
    longest gold solution + 16 characters (feedback twice that), seeded by the base's seed."""
    t0 = time.perf_counter()
    problems, verifier, backend, policy = _on_validation(base, bench, n, backend)
    length = max(len(bench.solution(p)) for p in problems) + 16  # as the check's (_check_at)
    out: dict[str, Any] = {"split": "validation", "n": len(problems)}
    out.update(detection_on_own_attempts(policy, policy, backend, bench, verifier, problems,
                                         solver_temperature=solver_temperature,
                                         critic_temperature=critic_temperature, max_new_tokens=length,
                                         feedback_max_new_tokens=2 * length, seed=base.report["config"]["seed"]))
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def detection_on_own_attempts(solver: Any, critic: Any, backend: Any, bench: Any, verifier: Any,
                              problems: Sequence[Any], *, solver_temperature: float, critic_temperature: float,
                              max_new_tokens: int, feedback_max_new_tokens: int, seed: int,
                              templates: Any = None) -> dict[str, Any]:
    """The critic gate's two passes (METHOD v4): ``solver``'s own attempt at each problem, judged by
    ``critic`` (its verdict read by ``bench.feedback_verdict``; an unreadable verdict is "not
    flagged"), scored by :func:`mlmt_bench.metrics.critic.detection`, under ``"greedy"`` (both roles
    greedy) and ``"sampled"`` (attempts at ``solver_temperature``, feedback at
    ``critic_temperature``; torch seeded with ``seed`` before each pass). ``templates``: the
    prompts (default the benchmark's). Each pass records its two temperatures; rates in [0, 1]."""
    import torch

    from mlmt_bench.metrics.critic import detection
    from mlmt_bench.rollout.episodes import Actors, Program, Sampling, critique, rollout

    templates = templates if templates is not None else bench.templates
    out: dict[str, Any] = {}
    for label, t_solver, t_critic in (("greedy", 0.0, 0.0), ("sampled", solver_temperature, critic_temperature)):
        torch.manual_seed(seed)  # the sampled pass is reproducible
        sampling = Sampling(temperature=t_solver, top_p=1.0, max_new_tokens=max_new_tokens,
                            feedback_max_new_tokens=feedback_max_new_tokens, feedback_temperature=t_critic)
        oracle = bench.oracle_feedback if isinstance(bench, OracleBenchmark) else None
        actors = Actors(solver, None, backend, templates, verifier, oracle, bench.feedback_verdict)
        attempts = rollout(Program(attempts=1), actors, problems, sampling).turns  # feedback "none": attempts only
        texts = critique(critic, backend, templates, problems, [a.text for a in attempts], sampling)
        correct = [bool(a.verdict.correct) if a.verdict else False for a in attempts]
        out[label] = {"solver_temperature": t_solver, "critic_temperature": t_critic,
                      **detection([bench.feedback_verdict(t) for t in texts], correct)}
    return out


def critic_gate(gate: dict[str, Any] | None) -> list[str]:
    """What makes a base fail METHOD v4's critic gate (empty: it passes), each a phrase naming the
    numbers. ``gate``: a :func:`gate_check` record, ``{"greedy": {...}, "sampled": {...}}`` with
    each pass's ``J``, ``recall``, ``false_alarm_rate``, ``n_right``, ``n_wrong`` and (sampled)
    ``critic_temperature``. Pure. A pass whose J could not be measured (no wrong or no right
    attempt) fails, as does a missing record."""
    if not gate:
        return ["its check has no critic-gate detection on its solver's own attempts (METHOD v4)"]
    out = []
    for label in ("greedy", "sampled"):
        d = gate.get(label) or {}
        t = d.get("critic_temperature")
        where = "greedy" if label == "greedy" else (f"critic at T={t:g}" if isinstance(t, (int, float)) else "sampled")
        j, recall, fa = d.get("J"), d.get("recall"), d.get("false_alarm_rate")
        if j is None or recall is None or fa is None:
            out.append(f"critic detection on its solver's own attempts ({where}) cannot be measured "
                       f"({d.get('n_wrong', 0)} wrong, {d.get('n_right', 0)} right)")
            continue
        if j < MIN_DETECTION_J:
            out.append(f"critic detection J {j:+.3f} < {MIN_DETECTION_J:.2f} on its solver's own attempts ({where}: "
                       f"recall {100 * recall:.1f}% of {d.get('n_wrong')} wrong, false alarms {100 * fa:.1f}% of "
                       f"{d.get('n_right')} right)")
        if fa > MAX_OWN_FALSE_ALARM:
            out.append(f"critic false alarms on its solver's right attempts {100 * fa:.1f}% > "
                       f"{100 * MAX_OWN_FALSE_ALARM:.0f}% ({where})")
    return out


def gate_line(label: str, d: dict[str, Any]) -> str:
    """One pass of a :func:`gate_check` record in one line: its temperatures, J, recall and false
    alarms (percentages) with their counts, and the unreadable verdicts."""
    def pct(v: Any) -> str:
        return "–" if v is None else f"{100 * v:.1f}%"

    j = d.get("J")
    temps = ("greedy" if label == "greedy"
             else f"solver T={d.get('solver_temperature'):g}, critic T={d.get('critic_temperature'):g}")
    return (f"{temps}: J {'–' if j is None else f'{j:+.3f}'} (needs >= {MIN_DETECTION_J:.2f}), recall "
            f"{pct(d.get('recall'))} of {d.get('n_wrong')} wrong attempts, false alarms "
            f"{pct(d.get('false_alarm_rate'))} of {d.get('n_right')} right (needs <= "
            f"{100 * MAX_OWN_FALSE_ALARM:.0f}%), unreadable verdicts {pct(d.get('unreadable'))}")


def gate_temperatures(cfg: BaseConfig) -> tuple[float, float]:
    """(solver, critic) temperatures of the gate's sampled pass for ``cfg``: the solver at
    ``check_temperature``, the critic at ``critic_temperature`` (the spec's critic training
    temperature, filled in by :func:`mlmt_bench.runner.base_config`), else ``check_temperature``."""
    critic = cfg.check_temperature if cfg.critic_temperature is None else cfg.critic_temperature
    return cfg.check_temperature, critic


def _with_gate(base: Base, cfg: BaseConfig, progress: bool) -> Base:
    """``base`` with ``report["gate"]`` at ``cfg``'s temperatures (:func:`cached_gate`: measured
    once by :func:`gate_check`). A base built before METHOD v4 (the shipped ones) gets its gate on
    first use this way, its base.json and weights untouched (so their key and a shipped entry's
    manifest stay valid)."""
    t_solver, t_critic = gate_temperatures(cfg)

    def measure() -> dict[str, Any]:
        if progress:
            tell(f"checking the critic gate of base {base.report.get('key')} on {cfg.check_problems} validation "
                 f"problems (its solver's own attempts, greedy and with the critic at T={t_critic:g}) ...")
        bench = synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)
        with torch_threads(cfg.threads):
            return gate_check(base, bench, cfg.check_problems, solver_temperature=t_solver,
                              critic_temperature=t_critic)

    base.report["gate"] = cached_gate(base.directory, f"n={cfg.check_problems},solver_T={t_solver:g},"
                                                      f"critic_T={t_critic:g}", measure)
    return base


def cached_gate(directory: Path, slot: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The critic gate of the checkpoint entry at ``directory`` under ``slot`` (what it was measured
    at): read from its :data:`GATE_FILE`, else ``measure()`` and added there. The file is written
    under a temporary name and renamed; a damaged file is measured again; an entry that cannot be
    written (read-only) keeps the gate in memory only. Never touches the entry's weights or record."""
    from mlmt_bench.io import bounded_input

    path = directory / GATE_FILE
    gates: dict[str, Any] = {}
    if os.path.lexists(path):
        bounded_input.check_plain_file(path)  # not a link: read like the entry's record
        try:
            gates = bounded_input.read_json(path)
        except UserError:
            gates = {}
        if not isinstance(gates, dict) or not all(isinstance(v, dict) for v in gates.values()):
            gates = {}
    if slot not in gates:
        gates[slot] = measure()
        with contextlib.suppress(OSError):
            tmp = path.with_name(f".{GATE_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(gates, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)
    return dict(gates[slot])


@dataclass
class _Actor:
    """What :class:`Actors` needs of a policy: a model and its tokenizer."""

    model: Any
    tokenizer: Any
