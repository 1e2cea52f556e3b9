"""Warm start of the tiny solver and critic on a synthetic benchmark (``mlmt-bench bootstrap``).

RL needs a starting point that already speaks the formats and is right some of the time.
This module supervised-fine-tunes freshly built tiny models (``models/tiny.py``):

**Solver** (one conversation kind per step, drawn with ``refine_frac`` /
``solver_critique_frac``):

- turn 1 ``[user: attempt prompt, assistant: solution]``, loss on the solution;
- refinement ``[user: problem, assistant: attempt, user: refine prompt with feedback,
  assistant: revision]``, loss on the revision only (and on the attempt when it is the taught
  solution). The feedback is the oracle's, or for a share ``null_feedback_frac`` the null
  feedback g∅. The revision is what changes (``apply_feedback(..., revision=True)``): the
  corrected step copied from the feedback and the steps after it (``3+9=12;12+1=13;#13``),
  or just the final line when nothing changes. Attempts are right, carry injected errors,
  or (from ``onpolicy_start`` on, a share ``onpolicy_frac``) are the solver's own greedy
  attempts, regenerated every ``pool_every`` steps through the HF backend: its own
  systematic mistakes are the ones feedback has to override;
- a few critic conversations, so that the solver can also play the critic (``shared_policy``).

Two devices make a ~0.5M-parameter model *use* the feedback within the budget instead of
recomputing its own belief: a share ``counterfactual_frac`` of the corrective feedbacks states
a made-up value that the target follows (only reading the feedback predicts it), and the tokens
the feedback dictates weigh ``feedback_token_weight`` in the loss.

How often the solver starts right is set by ``misconceptions``: that share of the operations
(e.g. ``+7``) it is taught one too high, everywhere it computes by itself. Errors are then
systematic (as a real model's are), the level does not hinge on stopping training at the right
moment, and there is something for feedback and RL to fix.

**Critic**: critic conversations ``[user: feedback prompt (problem + attempt), assistant:
oracle feedback]`` on right, injected-error and the final solver's own attempts
(``critic_wrong_frac`` wrong), a share ``critic_noise`` of the targets replaced by wrong or
unhelpful feedback. By default it starts from the trained solver's weights
(``critic_init: solver``), as both levels of MLMT-RL start from one base model.

Everything is deterministic for a config (seeded init, data order and pools). Each config is
cached under ``<cache_dir>/<sha256(config json)[:16]>/``: ``solver/``, ``critic/`` and
``tokenizer/`` (ordinary HF directories) and ``bootstrap.json`` (the report). The directory is
written under a temporary name and renamed into place, so a cache entry is complete or
absent. The default cache is ``$MLMT_BENCH_CACHE`` or ``~/.cache/mlmt-bench/bootstrap``.

:func:`evaluate_bootstrap` measures the four numbers that show the warm start is a sensible
RL starting point: solver accuracy at turn 1 and at turn 2 after oracle, warm-critic and null
feedback (greedy, refine-all, through the project's HF generation backend).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlmt_bench.benchmarks.synthetic import OK_FEEDBACK, STEP_OK, STEP_SEP, feedback_is_ok, step_feedback
from mlmt_bench.errors import UserError

#: Bumped whenever a change here would change the weights a config produces (part of the key).
BOOTSTRAP_FORMAT = 1


class BootstrapConfig(BaseModel):
    """What the warm start trains and how well each model starts. Every field but ``threads``
    is in the cache key."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str = Field("synthetic-arith", description="registry name of a synthetic benchmark with an oracle critic")
    benchmark_options: dict[str, Any] = Field(default_factory=dict,
                                              description="options of the benchmark (as in the run spec's benchmark.options)")
    seed: int = Field(0, description="seeds model initialisation, data sampling and error injection")
    solver_preset: str = Field("tiny-0.5m", description="tiny model preset of the solver (registry/models/)")
    critic_preset: str = Field("tiny-0.5m", description="tiny model preset of the critic (registry/models/)")
    solver_steps: int = Field(1600, ge=0, description="solver SFT optimizer steps")
    solver_batch: int = Field(16, ge=1, description="solver conversations per step")
    solver_lr: float = Field(2e-3, gt=0, description="solver peak learning rate (AdamW, warmup then cosine to 10%)")
    critic_init: Literal["solver", "scratch"] = Field(
        "solver", description="start the critic from the trained solver's weights (same preset only) or from scratch")
    critic_steps: int = Field(600, ge=0, description="critic SFT optimizer steps")
    critic_batch: int = Field(16, ge=1, description="critic conversations per step")
    critic_lr: float = Field(2e-3, gt=0, description="critic peak learning rate")
    warmup_frac: float = Field(0.05, ge=0, le=1, description="share of steps with linear learning-rate warmup")
    n_problems: int | None = Field(None, ge=1, description="use only the first N training problems (None: all)")
    misconceptions: float = Field(
        0.3, ge=0, le=1, description="share of the operations (op, operand), e.g. '+7', that the solver is taught to "
                                     "get one too high: systematic errors that set how often it starts right")
    solver_error_rate: float = Field(0.1, ge=0, le=1,
                                     description="share of turn-1 targets with injected (random) errors")
    refine_frac: float = Field(0.45, ge=0, le=1, description="share of solver steps on refinement conversations")
    solver_critique_frac: float = Field(0.1, ge=0, le=1,
                                        description="share of solver steps on critic conversations (so that the "
                                                    "solver can also play the critic: shared_policy, critic_init)")
    refine_correct_frac: float = Field(0.3, ge=0, le=1,
                                       description="share of refinement attempts that are right (target: keep it)")
    null_feedback_frac: float = Field(0.1, ge=0, le=1, description="share of refinements shown the null feedback")
    null_target: Literal["keep", "gold"] = Field(
        "keep", description="after the null feedback: 'keep' a right attempt (g∅ carries no information) or "
                            "write the 'gold' solution after any attempt (self-correction by imitation)")
    counterfactual_frac: float = Field(
        0.3, ge=0, le=1, description="share of corrective refinements whose feedback states a made-up value that the "
                                     "target follows: teaches the solver to read feedback rather than recompute")
    feedback_token_weight: float = Field(
        3.0, ge=0, description="loss weight of the revision tokens dictated by the context (the corrected value "
                               "stated by the feedback; the final answer a revision keeps)")
    critic_wrong_frac: float = Field(0.5, ge=0, le=1, description="share of critic attempts with injected errors")
    critic_noise: float = Field(0.1, ge=0, le=1,
                                description="share of critic targets replaced by wrong or unhelpful feedback")
    critic_token_weight: float = Field(3.0, ge=0, description="loss weight of the critic's decisions: each verdict's "
                                                              "first character and the values it computes")
    onpolicy_frac: float = Field(0.5, ge=0, le=1,
                                 description="share of refinement and critic attempts that are the solver's own greedy "
                                             "attempts (the rest: gold or injected errors)")
    onpolicy_start: float = Field(0.3, ge=0, le=1, description="share of solver steps before the first own attempts")
    pool_size: int = Field(256, ge=1, description="own attempts generated per refresh (x4 once for the critic)")
    pool_every: int = Field(100, ge=1, description="solver steps between refreshes of the own-attempt pool")
    threads: int | None = Field(
        None, ge=1, description="torch CPU threads; None: measured while training, 1 or 2, whichever is faster "
                                "on this machine now. Speed only: not part of the cache key")

    @field_validator("benchmark_options")
    @classmethod
    def _json_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(v, sort_keys=True)
        except TypeError as exc:
            raise ValueError(f"must be JSON-serialisable ({exc})") from None
        return v

    @model_validator(mode="after")
    def _fractions(self) -> "BootstrapConfig":
        if self.refine_frac + self.solver_critique_frac > 1:
            raise ValueError("refine_frac + solver_critique_frac must be at most 1 (the rest is turn-1 steps)")
        return self

    def key(self) -> str:
        """First 16 hex digits of the sha256 of the canonical config JSON (and the format version)."""
        payload = json.dumps({"format": BOOTSTRAP_FORMAT, **self.model_dump(mode="json", exclude={"threads"})},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class BootstrapResult:
    solver_dir: Path
    critic_dir: Path
    tokenizer_dir: Path
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> BootstrapConfig:
        return BootstrapConfig.model_validate(self.report["config"])


def default_cache_dir() -> Path:
    env = os.environ.get("MLMT_BENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mlmt-bench" / "bootstrap"


# --------------------------------------------------------------------------- entry point


def ensure_bootstrap(cfg: BootstrapConfig, cache_dir: Path | None = None, progress: bool = True) -> BootstrapResult:
    """The warm-start checkpoints of ``cfg``: built on first use, reused (instantly) afterwards."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cfg.key()
    final = cache_dir / key
    cached = _load_cached(final)
    if cached is not None:
        return cached
    bench = _benchmark(cfg)  # fail on a bad benchmark before any work
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache_dir))
    try:
        report = _build(cfg, bench, tmp, progress)
        report["key"] = key
        (tmp / "bootstrap.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished the same config first: keep theirs.
            if _load_cached(final) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result = _load_cached(final)
    assert result is not None
    return result


def _load_cached(directory: Path) -> BootstrapResult | None:
    meta = directory / "bootstrap.json"
    if not meta.is_file():
        return None
    report = json.loads(meta.read_text())
    return BootstrapResult(directory / "solver", directory / "critic", directory / "tokenizer", report)


def _benchmark(cfg: BootstrapConfig) -> Any:
    from mlmt_bench import registry

    bench = registry.benchmarks.get(cfg.benchmark)(**cfg.benchmark_options)
    missing = [m for m in ("solution", "oracle_feedback", "inject_errors") if not hasattr(bench, m)]
    if missing:
        raise UserError(f"bootstrap.benchmark: {cfg.benchmark!r} has no oracle critic ({', '.join(missing)} missing); "
                        "the warm start needs a synthetic benchmark such as synthetic-arith")
    return bench


# --------------------------------------------------------------------------- data


#: ids, and [start, end) spans of trained positions with their loss weight (later spans win).
Example = tuple[list[int], list[tuple[int, int, float]]]


class _Data:
    """Conversations for SFT as :data:`Example` s, sampled from seeded RNGs."""

    def __init__(self, cfg: BootstrapConfig, bench: Any, tokenizer: Any) -> None:
        from mlmt_bench.models.tokenizer import encode
        from mlmt_bench.rollout.chat import chat_ids

        self.cfg = cfg
        self.bench = bench
        self.tok = tokenizer
        self.chat_ids = chat_ids
        self.encode = lambda text: encode(tokenizer, text)
        self.templates = bench.templates
        problems = bench.load("train")
        self.problems = problems[: cfg.n_problems] if cfg.n_problems else problems
        if not self.problems:
            raise UserError(f"bootstrap: benchmark {cfg.benchmark!r} has no training problems")
        self.max_new_tokens = max(len(bench.solution(p)) for p in self.problems[:2000]) + 8
        self.beliefs = Misconceptions(cfg.misconceptions, cfg.seed, getattr(bench, "ops", "+-*"),
                                      getattr(bench, "max_operand", 9))
        self.pool: dict[bool, list[tuple[Any, str]]] = {True: [], False: []}  # right / wrong own attempts

    def refresh_pool(self, model: Any, backend: Any, rng: random.Random, size: int) -> None:
        """Greedy attempts of ``model`` (the solver as it is now) on ``size`` random training problems."""
        problems = [rng.choice(self.problems) for _ in range(size)]
        prompts = [self.chat_ids(self.tok, [{"role": "user", "content": self.templates.render_attempt(p)}],
                                 add_generation_prompt=True) for p in problems]
        gens = backend.generate(model, self.tok, prompts, max_new_tokens=self.max_new_tokens, temperature=0.0)
        self.pool = {True: [], False: []}
        for p, g in zip(problems, gens):
            self.pool[feedback_is_ok(self.bench.oracle_feedback(p, g.text))].append((p, g.text))

    def believed(self, problem: Any) -> str:
        """The solution the warm solver is taught: the gold one, except where a misconception hits."""
        return self.beliefs.solution(problem)

    def _attempt(self, rng: random.Random, right_frac: float) -> tuple[Any, str, bool]:
        """(problem, attempt, attempt is the taught solution): own or synthetic.

        With probability ``right_frac`` the attempt is the taught solution (right unless a
        misconception hits) or an own attempt that is right; otherwise it carries injected
        errors or is an own wrong attempt. Own attempts are drawn from the right or the wrong
        half of the pool, so that the solver's own (systematic) mistakes are well represented
        even when it is mostly right.
        """
        right = rng.random() < right_frac
        if rng.random() < self.cfg.onpolicy_frac and self.pool[right]:
            p, attempt = rng.choice(self.pool[right])
            return p, attempt, False
        p = rng.choice(self.problems)
        taught = self.believed(p)
        return p, taught if right else self.bench.inject_errors(taught, rng), right

    def _conv(self, messages: list[dict[str, str]], trained: tuple[int, ...] = (-1,)) -> Example:
        """Ids of the conversation and the spans of the assistant messages at indices ``trained``.

        A span covers the message's content and its EOS: what the model emits after
        ``<|assistant|>``.
        """
        ids = self.chat_ids(self.tok, messages)
        spans = []
        for i in sorted(j % len(messages) for j in trained):
            assert messages[i]["role"] == "assistant"
            start = len(self.chat_ids(self.tok, messages[:i], add_generation_prompt=True))
            end = len(self.chat_ids(self.tok, messages[: i + 1]))
            spans.append((start, end, 1.0))
        return ids, spans

    def solver_turn1(self, rng: random.Random) -> Example:
        p = rng.choice(self.problems)
        target = self.believed(p)
        if rng.random() < self.cfg.solver_error_rate:
            target = self.bench.inject_errors(target, rng)
        return self._conv([{"role": "user", "content": self.templates.render_attempt(p)},
                           {"role": "assistant", "content": target}])

    def solver_refine(self, rng: random.Random) -> Example:
        """Three turns; loss on the refinement, and on the attempt too when it is the gold solution."""
        null = rng.random() < self.cfg.null_feedback_frac
        keep = null and self.cfg.null_target == "keep"
        p, attempt, right = self._attempt(rng, 1.0 if keep else self.cfg.refine_correct_frac)
        if null:
            feedback = self.templates.null_feedback
            target = self.bench.apply_feedback(p, attempt, feedback, revision=True) if keep else self.believed(p)
        else:
            feedback = self.bench.oracle_feedback(p, attempt)
            if "wrong: " in feedback and "#" not in feedback and rng.random() < self.cfg.counterfactual_frac:
                feedback = counterfactual_feedback(p, feedback, rng)
            # The corrected step is copied from the feedback; the steps after it are the solver's own.
            target = self.bench.apply_feedback(p, attempt, feedback, revision=True, arithmetic=self.beliefs.op)
        ids, spans = self._conv([{"role": "user", "content": self.templates.render_attempt(p)},
                                 {"role": "assistant", "content": attempt},
                                 {"role": "user", "content": self.templates.render_refine(feedback)},
                                 {"role": "assistant", "content": target}], trained=(1, 3) if right else (3,))
        # Up-weight the tokens dictated by the context rather than computed: the corrected value
        # the feedback states, or the final answer a revision keeps (from the attempt) or takes
        # (from `answer wrong: #N`). They teach the solver to read instead of recomputing its own
        # (possibly wrong) belief, or falling back on a habitual answer.
        if self.cfg.feedback_token_weight != 1.0 and not (null and not keep):
            lo_char = hi_char = -1
            if "wrong: " in feedback and "#" not in feedback:
                fixed = feedback.split("wrong: ", 1)[-1]
                at = target.find(fixed)
                if at >= 0:
                    lo_char, hi_char = at + fixed.rindex("=") + 1, at + len(fixed)
            elif target.startswith("#"):
                lo_char, hi_char = 1, len(target)
            if 0 <= lo_char < hi_char:
                base = spans[-1][0]
                lo = base + len(self.encode(target[:lo_char]))
                hi = base + len(self.encode(target[:hi_char]))
                spans.append((lo, hi, self.cfg.feedback_token_weight))
        return ids, spans

    def critic(self, rng: random.Random) -> Example:
        p, attempt, _ = self._attempt(rng, 1 - self.cfg.critic_wrong_frac)
        feedback = self.bench.oracle_feedback(p, attempt)
        if rng.random() < self.cfg.critic_noise:
            feedback = noisy_feedback(p, attempt, feedback, rng, self.templates.null_feedback)
        ids, spans = self._conv([{"role": "user", "content": self.templates.render_feedback(p, attempt)},
                                 {"role": "assistant", "content": feedback}])
        # Up-weight the decisions: the first character of each verdict (ok / wrong / answer) and
        # the values the critic computes; the rest (separators, copied operands) is easy.
        w = self.cfg.critic_token_weight
        if w != 1.0:
            base = spans[-1][0]
            for lo_char, hi_char in _decision_chars(feedback):
                lo = base + len(self.encode(feedback[:lo_char]))
                hi = base + len(self.encode(feedback[:hi_char]))
                spans.append((lo, hi, w))
        return ids, spans


def _decision_chars(feedback: str) -> list[tuple[int, int]]:
    """[start, end) character spans of a walk feedback's verdicts and computed values."""
    import re

    out = [(m.start(1), m.start(1) + 1) for m in re.finditer(r"(?:^|;)\s*(ok|wrong|answer)", feedback)]
    out += [(m.start(1), m.end(1)) for m in re.finditer(r"[=#]\s*(-?\d+)", feedback)]
    return out


class Misconceptions:
    """A solver's systematic arithmetic errors: ``round(rate x #operations)`` of the operations
    ``(op, b)`` (e.g. ``+7``) are believed to give one more than they do (``x+7`` taken as
    ``x+8``), chosen deterministically from the seed. Rate 0 is the true arithmetic.

    The errors all go the same way, so two of them never cancel into a right answer.
    """

    def __init__(self, rate: float, seed: int, ops: str, max_operand: int) -> None:
        rng = random.Random(f"bootstrap:{seed}:misconceptions")
        operations = [(op, b) for op in ops for b in range(1, max_operand + 1)]
        k = min(len(operations), int(round(rate * len(operations))))
        self.wrong: dict[tuple[str, int], int] = {o: 1 for o in rng.sample(operations, k)}

    def op(self, a: int, op: str, b: int, modulus: int) -> int:
        from mlmt_bench.benchmarks.synthetic import apply_op

        return (apply_op(a, op, b, modulus) + self.wrong.get((op, b), 0)) % modulus

    def solution(self, problem: Any) -> str:
        from mlmt_bench.benchmarks.synthetic import format_solution, parse_problem, solve

        if not self.wrong:
            return str(problem.metadata.get("solution")) if problem.metadata.get("solution") else \
                format_solution(solve(*parse_problem(problem.prompt), _modulus_of(problem)))
        first, ops = parse_problem(problem.prompt)
        return format_solution(solve(first, ops, _modulus_of(problem), self.op))


def _modulus_of(problem: Any) -> int:
    return int(problem.metadata.get("modulus", 100))


def counterfactual_feedback(problem: Any, feedback: str, rng: random.Random) -> str:
    """``ok;...;wrong: a<op>b=r`` with ``r`` replaced by a nearby wrong value."""
    from mlmt_bench.benchmarks.synthetic import _modulus, _slip

    head, _, value = feedback.rpartition("=")
    return f"{head}={_slip(int(value), rng, _modulus(problem))}"


def noisy_feedback(problem: Any, attempt: str, true_feedback: str, rng: random.Random, null_feedback: str) -> str:
    """Wrong or unhelpful feedback for ``attempt`` (a miss, a false alarm, a wrong step or value)."""
    from mlmt_bench.benchmarks.synthetic import _gold_steps, _modulus, _slip

    gold = _gold_steps(problem)
    modulus = _modulus(problem)
    n = len(gold)
    options: list[Callable[[], str]] = [lambda: null_feedback]
    i = rng.randrange(n)
    a, op, b, r = gold[i]
    slipped = step_feedback(i + 1, (a, op, b, _slip(r, rng, modulus)))
    options.append(lambda: slipped)  # a wrong value (a false alarm if the attempt is right)
    if not feedback_is_ok(true_feedback):
        options.append(lambda: f"{STEP_OK}{STEP_SEP}" * n + OK_FEEDBACK)  # a miss
        flagged = true_feedback.split("wrong:")[0].count(STEP_OK)
        others = [j for j in range(n) if j != flagged]
        if others:
            j = rng.choice(others)
            options.append(lambda: step_feedback(j + 1, gold[j]))  # the wrong step
    return rng.choice(options)()


# --------------------------------------------------------------------------- training


def auto_threads(threads: int | None) -> int:
    """``threads`` if set; else 2 (at most the CPU count), or 1 if other work keeps the cores busy.

    Tiny models gain ~1.6x from a second thread on an idle machine but run ~4x slower with two
    threads on an oversubscribed one (the threads wait for each other). On the CPUs tested the
    weights do not depend on the thread count.
    """
    if threads:
        return threads
    cpus = os.cpu_count() or 1
    n = min(2, cpus)
    try:
        if os.getloadavg()[0] > cpus - 0.5:
            n = 1
    except OSError:  # pragma: no cover - no load average on this platform
        pass
    return n


class ThreadTuner:
    """Picks the torch thread count by measurement while training, unless one is configured.

    Every ``every`` steps it times ``probe`` steps at each candidate count (1 and 2) and keeps
    the faster per token until the next probe: two threads win on an idle machine, one wins
    by far once other processes compete for the cores. The weights do not depend on the
    count (checked bit for bit on the CPUs this was developed on), so this only changes speed.
    """

    def __init__(self, fixed: int | None, every: int = 100, probe: int = 3) -> None:
        cpus = os.cpu_count() or 1
        self.choices = [fixed] if fixed else sorted({1, min(2, cpus)})
        self.best = fixed or auto_threads(None)
        self.every, self.probe = every, probe
        self._timings: dict[int, list[float]] = {}
        self.used: dict[int, int] = {}

    def threads_for(self, step: int) -> int:
        k = step % self.every
        if len(self.choices) > 1 and k < self.probe * len(self.choices):
            return self.choices[k // self.probe]
        return self.best

    def record(self, step: int, threads: int, seconds: float, tokens: int) -> None:
        self.used[threads] = self.used.get(threads, 0) + 1
        k = step % self.every
        n = self.probe * len(self.choices)
        if len(self.choices) > 1 and k < n:
            self._timings.setdefault(threads, []).append(seconds / max(1, tokens))
            if k == n - 1:
                self.best = min(self._timings, key=lambda t: sorted(self._timings[t])[len(self._timings[t]) // 2])
                self._timings = {}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    import torch

    n = auto_threads(n)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _collate(batch: list[Example], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded ids, next-token targets and their loss weights (0 = not trained).

    No attention mask is needed: with right padding and causal attention, padding only
    follows the real tokens, so it never influences them.
    """
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, (ids, spans) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        for start, end, w in spans:
            weights[row, start:end] = w
    # Position t predicts token t+1.
    return input_ids, input_ids[:, 1:], weights[:, 1:]


def _loss(model: Any, input_ids: Any, targets: Any, weights: Any) -> Any:
    """Weighted mean next-token cross-entropy over the trained positions."""
    import torch.nn.functional as F

    logits = model(input_ids=input_ids).logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum().clamp_min(1e-8)


def _lr_at(step: int, steps: int, peak: float, warmup_frac: float) -> float:
    warm = max(1, int(round(warmup_frac * steps)))
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _sft(model: Any, make_example: Callable[[random.Random, int], Example], *, steps: int, batch: int,
         lr: float, warmup_frac: float, rng: random.Random, pad_id: int, on_step: Callable[[float], None],
         before_step: Callable[[int], None] | None = None, threads: int | None = None) -> dict:
    """Plain SFT loop: AdamW, warmup + cosine, grad-norm clip 1. Returns a summary."""
    import torch

    tuner = ThreadTuner(threads)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    losses: list[float] = []
    tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(steps):
        n_threads = tuner.threads_for(step)
        if torch.get_num_threads() != n_threads:
            torch.set_num_threads(n_threads)
        t_step = time.perf_counter()
        if before_step is not None:
            before_step(step)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr, warmup_frac)
        examples = [make_example(rng, step) for _ in range(batch)]
        input_ids, targets, weights = _collate(examples, pad_id)
        loss = _loss(model, input_ids, targets, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        tokens += int(input_ids.numel())
        tuner.record(step, n_threads, time.perf_counter() - t_step, int(input_ids.numel()))
        on_step(losses[-1])
    tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
    return {"steps": steps, "batch": batch, "lr": lr, "first_loss": losses[0] if losses else None,
            "final_loss": sum(tail) / len(tail), "tokens": tokens, "seconds": round(time.perf_counter() - t0, 2),
            "cpu_seconds": round(time.process_time() - c0, 2),
            "steps_by_threads": {str(k): v for k, v in sorted(tuner.used.items())}}


def _build(cfg: BootstrapConfig, bench: Any, out: Path, progress: bool) -> dict[str, Any]:
    import torch
    import transformers

    from mlmt_bench.models.tiny import build_tiny_model, num_parameters, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer, save_tokenizer
    from mlmt_bench.rollout.hf_backend import HFBackend

    t0 = time.perf_counter()
    tok = build_char_tokenizer()
    data = _Data(cfg, bench, tok)
    report: dict[str, Any] = {
        "config": cfg.model_dump(mode="json"),
        "format": BOOTSTRAP_FORMAT,
        "n_problems": len(data.problems),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    backend = HFBackend()
    with torch_threads(cfg.threads), _quiet_transformers(), _progress(progress) as bar:
        save_tokenizer(tok, out / "tokenizer")

        def stage(role: str, steps: int) -> Callable[[float], None]:
            task = bar.add_task(f"{role} SFT", total=steps, loss=float("nan")) if bar is not None else None

            def on_step(loss: float) -> None:
                if bar is not None:
                    bar.update(task, advance=1, loss=loss)
            return on_step

        # Solver: turn-1, refinement and (a few) critique conversations; one kind per step keeps
        # padding small. From `onpolicy_start` on, refinement attempts are partly its own.
        solver = build_tiny_model(cfg.solver_preset, tok, seed=cfg.seed)
        kinds = random.Random(f"bootstrap:{cfg.seed}:solver-kinds")
        weights = (1 - cfg.refine_frac - cfg.solver_critique_frac, cfg.refine_frac, cfg.solver_critique_frac)
        makers = (data.solver_turn1, data.solver_refine, data.critic)
        plan = [kinds.choices(range(3), weights=weights)[0] for _ in range(cfg.solver_steps)]
        first = int(cfg.onpolicy_start * cfg.solver_steps)
        pool_rng = random.Random(f"bootstrap:{cfg.seed}:pool")

        def refresh(step: int) -> None:
            if cfg.onpolicy_frac > 0 and step >= first and (step - first) % cfg.pool_every == 0:
                data.refresh_pool(solver, backend, pool_rng, cfg.pool_size)

        summary = _sft(solver, lambda r, step: makers[plan[step]](r), steps=cfg.solver_steps,
                       batch=cfg.solver_batch, lr=cfg.solver_lr, warmup_frac=cfg.warmup_frac,
                       rng=random.Random(f"bootstrap:{cfg.seed}:solver"), pad_id=tok.pad_token_id,
                       on_step=stage("solver", cfg.solver_steps), before_step=refresh, threads=cfg.threads)
        summary.update(preset=cfg.solver_preset, params=num_parameters(solver),
                       steps_by_kind={k: plan.count(i) for i, k in enumerate(("turn1", "refine", "critique"))})
        report["solver"] = summary
        solver.eval()
        save_checkpoint(solver, tok, out / "solver")

        # Critic: critique conversations on gold, injected-error and the final solver's own attempts.
        if cfg.onpolicy_frac > 0:
            data.refresh_pool(solver, backend, pool_rng, cfg.pool_size * 4)
        if cfg.critic_init == "solver":
            if cfg.critic_preset != cfg.solver_preset:
                raise UserError("bootstrap.critic_init: 'solver' needs critic_preset == solver_preset "
                                f"(got {cfg.critic_preset!r} and {cfg.solver_preset!r}); use 'scratch'")
            critic = solver  # continue from the solver's weights (saved above)
        else:
            critic = build_tiny_model(cfg.critic_preset, tok, seed=cfg.seed + 1)
        summary = _sft(critic, lambda r, step: data.critic(r), steps=cfg.critic_steps, batch=cfg.critic_batch,
                       lr=cfg.critic_lr, warmup_frac=cfg.warmup_frac, rng=random.Random(f"bootstrap:{cfg.seed}:critic"),
                       pad_id=tok.pad_token_id, on_step=stage("critic", cfg.critic_steps), threads=cfg.threads)
        summary.update(preset=cfg.critic_preset, params=num_parameters(critic), init=cfg.critic_init)
        report["critic"] = summary
        critic.eval()
        save_checkpoint(critic, tok, out / "critic")
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    bar = Progress(TextColumn("[bold]bootstrap[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    with bar:
        yield bar


# --------------------------------------------------------------------------- evaluation


def evaluate_bootstrap(result: BootstrapResult, n_eval: int = 200, *, backend: Any = None) -> dict[str, Any]:
    """Greedy accuracies of the warm start on the first ``n_eval`` eval problems.

    ``acc_t1``: the solver's first attempt. ``acc_t2_oracle`` / ``acc_t2_critic`` /
    ``acc_t2_null``: the solver's refinement (refine-all protocol) after the oracle's feedback,
    the warm critic's feedback and the null feedback ``g∅``, on the same attempts.
    ``critic_exact``: share of critic feedbacks identical to the oracle's.
    Generation goes through the HF backend (``mlmt_bench.rollout.hf_backend``).
    """
    from mlmt_bench import registry
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.chat import chat_ids, close_turn

    cfg = result.config
    bench = _benchmark(cfg)
    problems = bench.load("validation")[:n_eval]
    if not problems:
        raise UserError(f"bootstrap: benchmark {cfg.benchmark!r} has no eval problems")
    verifier = registry.verifiers.get(bench.default_verifier)()
    if backend is None:
        backend = registry.backends.get("hf")()
    templates = bench.templates
    t0 = time.perf_counter()
    with torch_threads(cfg.threads), _quiet_transformers():
        solver, tok = load_checkpoint(result.solver_dir)
        critic, ctok = load_checkpoint(result.critic_dir)
        # Character-level tokens: a solution is len(text) + EOS. Feedback (3 characters per
        # step walked, then one step or the final line) fits in the same bound.
        sol_len = max(len(bench.solution(p)) for p in problems) + 16
        fb_len = sol_len

        def user(text: str) -> list[int]:
            return chat_ids(tok, [{"role": "user", "content": text}], add_generation_prompt=True)

        def acc(gens: list[Any]) -> tuple[float, list[bool]]:
            ok = [v.correct for v in verifier.score_batch(problems, [g.text for g in gens])]
            return sum(ok) / len(ok), ok

        p1 = [user(templates.render_attempt(p)) for p in problems]
        g1 = backend.generate(solver, tok, p1, max_new_tokens=sol_len, temperature=0.0)
        acc_t1, ok1 = acc(g1)
        attempts = [g.text for g in g1]
        critic_prompts = [chat_ids(ctok, [{"role": "user", "content": templates.render_feedback(p, a)}],
                                   add_generation_prompt=True) for p, a in zip(problems, attempts)]
        critic_fb = [g.text for g in backend.generate(critic, ctok, critic_prompts, max_new_tokens=fb_len,
                                                       temperature=0.0)]
        oracle_fb = [bench.oracle_feedback(p, a) for p, a in zip(problems, attempts)]
        feedbacks = {"oracle": oracle_fb, "critic": critic_fb, "null": [templates.null_feedback] * len(problems)}
        out: dict[str, Any] = {"n": len(problems), "acc_t1": acc_t1}
        for source, fbs in feedbacks.items():
            prompts = [p + close_turn(tok, g.ids) + user(templates.render_refine(fb))
                       for p, g, fb in zip(p1, g1, fbs)]
            g2 = backend.generate(solver, tok, prompts, max_new_tokens=sol_len, temperature=0.0)
            out[f"acc_t2_{source}"], ok2 = acc(g2)
            out[f"correction_rate_{source}"] = _rate(ok1, ok2, False)
            out[f"regression_rate_{source}"] = 1 - _rate(ok1, ok2, True) if any(ok1) else 0.0
    out["critic_exact"] = sum(c == o for c, o in zip(critic_fb, oracle_fb)) / len(problems)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _rate(ok1: list[bool], ok2: list[bool], first: bool) -> float:
    """Share of problems correct at turn 2 among those whose turn-1 correctness is ``first``."""
    pairs = [b for a, b in zip(ok1, ok2) if a == first]
    return sum(pairs) / len(pairs) if pairs else 0.0
