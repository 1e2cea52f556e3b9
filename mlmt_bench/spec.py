"""Run specs: pydantic models, YAML loading with ``extends:``, ``--set a.b=c`` overrides.

Every error is a :class:`UserError` whose message names the file, the field path, the bad
value and what was expected, e.g.
``registry/runs/x.yaml: algorithm.params.group_size: must be ≥ 2, got 1``.

The fields that size a run's work and memory have upper limits (``MAX_NEW_TOKENS`` ...: the table
above their definitions says why each is generous), a step's sequences are bounded in all
(``MAX_SEQUENCES_PER_STEP``), seeds lie in numpy's range, and every float must be finite: a spec
that could not run is refused when it is validated, before anything is allocated.
"""

from __future__ import annotations

import copy
import math
import os
import string
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast

import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from mlmt_bench.errors import UserError
from mlmt_bench.io import bounded_input
from mlmt_bench.models.policy_spec import PolicySpec, SpecSection as _Spec

if TYPE_CHECKING:
    from mlmt_bench.algorithms.params import LossParams

_M = TypeVar("_M", bound=BaseModel)

# Upper limits of the fields that size a run's work and memory, checked when a spec is validated so
# that a typo (``1e9`` for ``1e3``) is a one-line error instead of a MemoryError or a run that never
# ends after minutes of setup. Each is far beyond what a real GPU run uses:
#
# =========================  ===================================================================
# ``MAX_NEW_TOKENS``         131,072 (2**17) tokens per turn (``backend.max_new_tokens``,
#                            ``feedback_max_new_tokens``): the longest context of current open
#                            models (128k); reasoning runs sample 8k-64k.
# ``MAX_PROBLEMS_PER_STEP``  100,000 problems per step (``train.problems_per_step``): large RL
#                            runs use 64-2,048.
# ``MAX_SEQUENCES_PER_STEP`` 1,048,576 (2**20) sequences in a step's largest turn:
#                            problems_per_step × group_size × feedbacks × refinements (a
#                            billion tokens at 1k tokens each; large runs sample ~10^4).
# ``MAX_SEED``               2**32 - 1 (``seed``, an experiment's ``seeds``, from 0): numpy's seed
#                            range; torch takes more, but the trainer derives seeds from it
#                            (``seed * 7919 + ...`` must stay below torch.Generator's 2**63).
# ``MAX_LORA_RANK``          16,384 (``lora.r``): the hidden size of the largest models
#                            (defined with ``LoraSpec``, :mod:`mlmt_bench.models.policy_spec`).
# ``MAX_THREADS``            1,024 torch CPU threads (``train.threads``).
# ``MAX_STEPS``              10,000,000 training steps (``train.steps``): large RL runs take
#                            10^3-10^5; the trainer derives per-step seeds from it.
# =========================  ===================================================================
#
# Every float of a spec must be finite: ``.inf`` and ``.nan`` are refused in typed fields
# (``allow_inf_nan=False``) and in free-form sections (options, params, ``base``) alike
# (:func:`_check_finite`). The algorithms' own limits: :mod:`mlmt_bench.algorithms.params`.
MAX_NEW_TOKENS = 1 << 17
MAX_PROBLEMS_PER_STEP = 100_000
MAX_SEQUENCES_PER_STEP = 1 << 20
MAX_SEED = 2**32 - 1
MAX_THREADS = 1024
MAX_STEPS = 10_000_000

Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


#: the placeholders each template may use (:class:`mlmt_bench.types.PromptTemplates`)
TEMPLATE_FIELDS = {"attempt": ("problem",), "feedback": ("problem", "attempt"), "refine": ("feedback",),
                   "null_feedback": ()}


class TemplateSpec(_Spec):
    """Overrides of a benchmark's prompt templates (see :class:`mlmt_bench.types.PromptTemplates`)."""

    attempt: str | None = None
    feedback: str | None = None
    refine: str | None = None
    null_feedback: str | None = None

    @field_validator("attempt", "feedback", "refine", "null_feedback")
    @classmethod
    def _placeholders(cls, v: str | None, info: ValidationInfo) -> str | None:
        """Only the template's own placeholders, bare: ``{prompt}`` in place of ``{problem}`` failed
        with a KeyError when the run started, and ``{problem:>900000000}`` aborted it at 5 GB."""
        if v is None:
            return v
        allowed = TEMPLATE_FIELDS[str(info.field_name)]
        try:
            parts = list(string.Formatter().parse(v))
        except ValueError as exc:
            raise ValueError(f"not a format template ({exc}; write a literal brace as {{{{ or }}}})") from None
        for _, field, spec, conversion in parts:
            if field is None:
                continue
            if field not in allowed:
                known = ", ".join("{" + a + "}" for a in allowed) or "none"
                raise ValueError(f"unknown placeholder {{{field}}} (this template's: {known}; a literal brace "
                                 "is {{ or }})")
            if spec or conversion:
                raise ValueError(f"placeholder {{{field}}} takes no format spec or conversion")
        return v


class BenchmarkSpec(_Spec):
    name: str
    path: str | None = Field(None, description="data file or directory; default: search (see README)")
    options: dict[str, Any] = Field(default_factory=dict, description="benchmark-specific options")
    train_split: str = "train"
    eval_split: str = Field("test", description="split evaluated during and after training (sweeps: validation)")
    train_limit: int | None = Field(None, ge=1)
    eval_limit: int | None = Field(None, ge=1)
    verifier: str | None = Field(None, description="default: the benchmark's own")
    verifier_options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the verifier "
                                             "(code: timeout_s, memory_mb, sandbox_disable ...)")
    templates: TemplateSpec = Field(default_factory=TemplateSpec)


class PoliciesSpec(_Spec):
    solver: PolicySpec = Field(default_factory=PolicySpec)
    critic: PolicySpec | None = Field(None, description="the feedback writer; required when the algorithm builds one")
    share_base: bool = Field(False, description="every role a named LoRA adapter (its own lora, lr, optimiser) on "
                             "one frozen copy of the base model (mlmt_bench/models/adapters.py)")

    @model_serializer(mode="wrap")
    def _drop_default_share_base(self, handler: Any) -> dict[str, Any]:
        """``share_base: false`` is left out of dumps, so that a resolved spec (and its hash) of a
        run without it reads as before the field existed."""
        out: dict[str, Any] = handler(self)
        if not self.share_base:
            out.pop("share_base", None)
        return out


class BackendSpec(_Spec):
    name: str = "hf"
    options: dict[str, Any] = Field(default_factory=dict)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(48, ge=1, le=MAX_NEW_TOKENS, description="per turn")
    feedback_max_new_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS,
                                                description="critic turn; default max_new_tokens")
    stop: list[str] | None = None


class AlgorithmSpec(_Spec):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    # what validated_params returned, and the params dicts it stands for: (a copy of) the one it
    # was read from and its dump (what validate_run puts in their place)
    _validated: tuple[list[dict[str, Any]], LossParams] | None = PrivateAttr(default=None)

    def validated_params(self, source: str = "spec") -> LossParams:
        """``params`` as the algorithm's own ``Params`` (:func:`algorithm_params_model`), validated
        once: ``validate_run`` validates them (a bad value is a one-line UserError, ``source:
        algorithm.params.<field>: ...``) and the runner and ``plan`` reuse the same object; it is
        validated again only if ``params`` changed since."""
        if self._validated is not None and self.params in self._validated[0]:
            return self._validated[1]
        params_model = algorithm_params_model(self.name)
        try:
            params = params_model.model_validate(self.params)
        except ValidationError as exc:
            raise UserError(format_validation_error(source, exc, "algorithm.params", params_model)) from None
        self._validated = ([copy.deepcopy(self.params), params.model_dump()], params)
        return params


class TrainSpec(_Spec):
    steps: int = Field(20, ge=0, le=MAX_STEPS)
    problems_per_step: int = Field(8, ge=1, le=MAX_PROBLEMS_PER_STEP)
    grad_accum: int = Field(1, ge=1, description="at least this many micro-batches per update")
    micro_batch_tokens: int | None = Field(
        32768, ge=1, description="padded tokens (rows × longest row) per forward/backward of an update, "
        "log-prob, value or evaluation pass; gradients are accumulated to the full-batch update; "
        "null: the whole batch at once. The default keeps every tiny registry run in one micro-batch; "
        "lower it for large models (activation memory grows with it)")
    share_prompts: bool = Field(True, description="in an update, read each distinct prompt of a micro-batch once "
                                "and its rows' completions after its KV cache (a group's G samples share one prompt): "
                                "the same log-probs and gradients up to float rounding, fewer tokens read; a "
                                "micro-batch then counts distinct prompts × longest prompt + rows × longest "
                                "completion against micro_batch_tokens; off (read and counted row by row) under "
                                "FSDP and gradient checkpointing; "
                                "false: every row reads its prompt (perf/share_prompts_train.py measures both)")
    grad_clip: float = Field(1.0, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0 = only at the end")
    keep_checkpoints: int | None = Field(None, ge=1, description="after each checkpoint, delete all but the newest "
                                         "N; null = keep all")
    token_budget: int | None = Field(None, ge=1, description="stop once this many tokens were generated")
    flop_budget: float | None = Field(None, gt=0, description="stop once this many FLOPs were spent (METHOD.md v2 "
                                                               "counting: prompts, trained sequences, extra passes)")
    deterministic: bool = True
    threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="torch CPU threads; default all cores")
    cpu_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="what CPU matmuls run in (training and generation; weights stay in the policy's dtype): "
        "bfloat16 = bfloat16 autocast, float32 = none; auto = bfloat16 on a CPU with bfloat16 instructions (AMX, "
        "AVX512-BF16) for a run whose models all load pretrained weights (no CPU pin), else float32. The "
        "manifest's cpu_dtype says what ran")

    @model_serializer(mode="wrap")
    def _drop_default_cpu_dtype(self, handler: Any) -> dict[str, Any]:
        """``cpu_dtype: auto`` is left out of dumps, so that a resolved spec (and its hash) of a
        run without it reads as before the field existed."""
        out: dict[str, Any] = handler(self)
        if self.cpu_dtype == "auto":
            out.pop("cpu_dtype", None)
        return out


EvalProtocol = Literal["refine_all", "oracle_gated"]


def _all_protocols() -> list[EvalProtocol]:
    return ["refine_all", "oracle_gated"]


class EvalSpec(_Spec):
    every: int = Field(10, ge=0, description="steps between evaluations; 0 = only before and after")
    limit: int | None = Field(None, ge=1, description="evaluate the first N problems of the split; wins over "
                              "benchmark.eval_limit (e.g. --set eval.limit=4 to shorten a run)")
    temperature: float = Field(0.0, ge=0.0)
    protocols: list[EvalProtocol] = Field(default_factory=_all_protocols)
    feedback_metrics: bool = Field(True, description="also run the paired null-feedback pass")
    samples: int = Field(8, ge=0, description="full episodes written to samples.jsonl per evaluation")
    final_samples: bool = Field(True, description="the final evaluation writes every problem's episode to "
                                "samples.jsonl (the report's examples where arms disagree), not only `samples`")
    base_critic: bool = Field(False, description="equal test-time compute (METHOD v3): an arm that answers in one "
                              "turn is also evaluated in the refine protocol with the frozen shared base as its "
                              "critic (the report's `<arm> + base critic` row)")
    memo: bool = Field(True, description="a greedy step-0 evaluation of weights, problems and settings that an "
                       "earlier run on this machine evaluated is read from its memo (mlmt_bench/io/eval_memo.py: every "
                       "arm and seed on one warm start starts from the same weights); false: always evaluate")
    probe_problems: int = Field(0, ge=0, description="after training, a run with a critic runs the feedback "
                                "perturbation probe (METHOD v4; `mlmt-bench probe feedback`) on its final solver "
                                "and critic on this many validation problems and writes probe.json; 0: none (the "
                                "default: about one evaluation's generation time, ~10% of a tiny test run)")


class FeedbackSpec(_Spec):
    """What the refiner is shown of a feedback (METHOD v4, "Feedback, not answers")."""

    redact: bool = Field(False, description="answer-free feedback: the refiner sees every critic or oracle feedback "
                         "through the benchmark's redaction rule (Benchmark.redact_feedback: maths, numbers in "
                         "neither problem nor attempt; synthetic-arith, a check's numbers become the attempt's own "
                         "at that place; code, code blocks and inline code; multiple choice, option letters and "
                         "texts), at training and at evaluation; the critic's reward is computed on "
                         "those refinements")
    eval_unredacted: bool = Field(False, description="with redact: also refine the final evaluation's attempts after "
                                  "the same feedbacks unredacted (the report's `<arm> without redaction` row)")

    @model_validator(mode="after")
    def _unredacted_needs_redact(self) -> FeedbackSpec:
        if self.eval_unredacted and not self.redact:
            raise ValueError("eval_unredacted: needs redact: true (without it every evaluation is unredacted)")
        return self


class TrackingSpec(_Spec):
    """Experiment trackers that receive every ``metrics.jsonl`` record (mlmt_bench/trackers/)."""

    report_to: list[str] = Field(default_factory=list, description="tracker registry names: tensorboard, mlflow, "
                                 "wandb (any subset; pip install 'mlmt-bench[trackers]')")
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="each tracker's options, by name "
                                               "(its Options model: mlmt_bench/trackers/<name>.py)")


#: a run directory is NAME-s<seed>-<UTC stamp>[-<n>]: within the 255 bytes of a file name
MAX_NAME_CHARS = 200


class RunSpec(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=MAX_NAME_CHARS)
    seed: Seed = 0
    output_dir: str = "runs"
    benchmark: BenchmarkSpec
    policies: PoliciesSpec = Field(default_factory=PoliciesSpec)
    backend: BackendSpec = Field(default_factory=BackendSpec)
    algorithm: AlgorithmSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    base: dict[str, Any] | None = Field(None, description="the shared base every tiny policy starts from "
                                                         "(warmstart/shared_base.py BaseConfig); seed: the run's")
    warm_start: dict[str, Any] | None = Field(
        None, description="one supervised warm start of the pretrained model the roles load, shared by every arm "
                          "and seed (warmstart/pretrained_base.py WarmStartConfig)")
    description: str = ""
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="experiment trackers (TensorBoard, "
                                   "MLflow, W&B); they change nothing the run computes")
    feedback: FeedbackSpec = Field(default_factory=FeedbackSpec, description="what the refiner is shown of a "
                                   "feedback (METHOD v4: feedback.redact)")

    @model_serializer(mode="wrap")
    def _drop_default_tracking(self, handler: Any) -> dict[str, Any]:
        """No ``tracking:`` in dumps when no tracker is used, so that a resolved spec (and its
        hash) of a run without trackers reads as before the field existed."""
        out: dict[str, Any] = handler(self)
        if not self.tracking.report_to and not self.tracking.options:
            out.pop("tracking", None)
        if self.feedback == FeedbackSpec():  # likewise ``feedback:`` at its defaults
            out.pop("feedback", None)
        return out


class ExperimentSpec(_Spec):
    """Several arms (run-spec overrides of one base) × seeds, compared in one report."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=MAX_NAME_CHARS)
    base: dict[str, Any] | str = Field(description="a run spec, inline or as a path relative to this file")
    arms: dict[str, dict[str, Any]] = Field(min_length=1)
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    output_dir: str = "runs"
    budget: Literal["tokens", "flops", "none"] = Field(
        "tokens", description="what every arm must spend equally: train.token_budget (generated tokens), "
                              "train.flop_budget (FLOPs), or none (no check)")
    description: str = ""


class SweepSpec(_Spec):
    """An Optuna study over a run spec: ``space`` maps dotted field paths to distributions."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=MAX_NAME_CHARS)
    run: str = Field(description="path of the run spec to tune, relative to this file")
    metric: str = "acc@t2"
    direction: Literal["maximize", "minimize"] = "maximize"
    n_trials: int = Field(20, ge=1)
    storage: str | None = Field(None, description="Optuna storage URL; default sqlite in the output dir")
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    pruner: Literal["median", "none"] = "median"
    eval_split: str = Field("validation", description="the split trials are evaluated on (METHOD.md v2: tuning "
                                                      "reads validation; the best spec's runs and reports read test)")
    space: dict[str, dict[str, Any]] = Field(min_length=1)


# ----------------------------------------------------------------------------------------------
# Loading


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse one YAML file into a mapping, with one-line errors for every way it can be wrong
    (and within the limits of :mod:`mlmt_bench.io.bounded_input`: size, depth, alias expansion)."""
    data = bounded_input.load_yaml(bounded_input.read_text(path), str(path))
    if data is None:
        raise UserError(f"{path}: empty file, expected a YAML mapping")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; nested mappings merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_raw(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A spec file with its ``extends:`` chain resolved (paths relative to the extending file)."""
    path = Path(path)
    resolved = bounded_input.resolved(path)  # a symlink loop: one line naming the file, no RuntimeError
    if resolved in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, resolved))
        raise UserError(f"{path}: circular extends: {cycle}")
    if len(_chain) >= bounded_input.MAX_EXTENDS:
        raise UserError(f"{path}: extends: chain of more than {bounded_input.MAX_EXTENDS} files")
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise UserError(f"{path}: extends: expected a file path, got {bounded_input.short_repr(parent)}")
    parent_path = (path.parent / parent)
    if not os.path.lexists(parent_path):
        raise UserError(f"{path}: extends: file not found: {bounded_input.shorten(str(parent_path), 200)}")
    try:
        bounded_input.resolved(parent_path)
    except UserError as exc:  # a symlink loop: blamed on the extends: that names it
        raise UserError(f"{path}: extends: {exc}") from None
    return deep_merge(load_raw(parent_path, (*_chain, resolved)), data)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], value); the value is parsed as YAML (1 -> int, true -> bool),
    within the limits of :mod:`mlmt_bench.io.bounded_input`; text that is not YAML stays a string."""
    shown = bounded_input.shorten(text)
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {shown}: expected KEY.PATH=VALUE")
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise UserError(f"--set {shown}: empty component in field path {bounded_input.short_repr(key)}")
    if len(parts) > bounded_input.MAX_DEPTH:
        raise UserError(f"--set {shown}: field path of more than {bounded_input.MAX_DEPTH} components")
    try:
        value = bounded_input.load_yaml(raw, f"--set {bounded_input.shorten(key)}") if raw.strip() else ""
    except bounded_input.InvalidYAML:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str], model: type[BaseModel]) -> dict[str, Any]:
    """Apply ``--set`` overrides; a path that names no field of ``model`` is an error.

    Works on an unshared copy: a YAML alias (``*anchor``) becomes its own copy, so setting a field
    under one alias never changes the others (``copy.deepcopy`` would keep them one object)."""
    out: dict[str, Any] = _unshared(data)  # a copy of the dict
    for text in overrides:
        parts, value = parse_override(text)
        _check_path(model, parts, text)
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


def _unshared(value: Any) -> Any:
    """A deep copy in which no two places share a mapping or list (alias expansion is bounded by
    :mod:`mlmt_bench.io.bounded_input` when the YAML is read)."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return copy.deepcopy(value)


def _check_path(model: type[BaseModel], parts: list[str], text: str) -> None:
    current: Any = model
    for i, part in enumerate(parts):
        fields = getattr(current, "model_fields", None)
        if fields is None:
            return  # inside a free-form mapping (options, params): checked when validated
        if part not in fields:
            hint = bounded_input.did_you_mean(part, fields) or f" (fields: {', '.join(fields)})"
            where = bounded_input.shorten(".".join(parts[:i])) or "the spec"
            raise UserError(f"--set {bounded_input.shorten(text)}: {where} has no field "
                            f"{bounded_input.short_repr(part)}{hint}")
        current = _model_of(fields[part].annotation)


def _model_of(annotation: Any) -> Any:
    """The pydantic model inside ``X``, ``X | None``; None for scalars and dicts."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


# pydantic error type -> (symbol shown, key of the bound in the error context)
_BOUNDS = {"greater_than_equal": ("≥", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("≤", "le"), "less_than": ("<", "lt")}


def format_validation_error(source: str, exc: ValidationError, prefix: str = "",
                            model: type[BaseModel] | None = None) -> str:
    """The first pydantic error as ``source: field.path: what, got value``, naming the file of the
    ``extends:`` chain the value came from when it is another. Keys and values are file content:
    a key that is not a field-like name and a value that is not plain are described, not shown
    (:func:`~mlmt_bench.io.bounded_input.echo`), so no error prints a line of someone's file."""
    err = exc.errors()[0]
    full = (prefix.split(".") if prefix else []) + list(err["loc"])
    named = next((i for i, x in enumerate(full) if not bounded_input.is_name(x)), len(full))
    loc = ".".join(str(x) for x in full[:named])  # a key that is no field name is not shown: it is file content
    if named < len(full):
        loc = "a key that is not a field name" + (f" under {loc}" if loc else "")
    loc = bounded_input.shorten(loc, 2 * bounded_input.MAX_ECHO_CHARS)
    ctx = err.get("ctx") or {}
    kind = err["type"]
    got = bounded_input.echo(err.get("input"))
    if kind == "missing":
        what = "required field is missing"
    elif kind == "extra_forbidden":
        what = "unknown field" + _field_hint(model, list(err["loc"]))
    elif kind in _BOUNDS:
        symbol, key = _BOUNDS[kind]
        what = f"must be {symbol} {ctx.get(key)}, got {got}"
    elif kind == "literal_error":
        what = f"must be one of {ctx.get('expected')}, got {got}"
    elif kind == "string_pattern_mismatch":
        what = f"must match {ctx.get('pattern')}, got {got}"
    elif kind == "value_error" and ctx.get("error") is not None:
        what = f"{ctx['error']}, got {got}"
    else:
        what = f"{err['msg'][0].lower()}{err['msg'][1:]}, got {got}"
    origin = _defined_in(source, full) if kind != "missing" else None
    where = f" ({_ORIGIN} {bounded_input.shorten(origin, 200)}, through extends:)" if origin else ""
    return f"{source}: {loc}: {what}{where}" if loc else f"{source}: {what}{where}"


_ORIGIN = "set in"


def _defined_in(source: str, loc: list[Any]) -> str | None:
    """The file of ``source``'s ``extends:`` chain whose value of the field at ``loc`` the merge
    kept (the nearest file that sets it), when it is not ``source`` itself; else None."""
    path = Path(source)
    try:
        if not path.is_file():
            return None
    except (OSError, ValueError):
        return None
    chain: list[tuple[Path, Any]] = []
    while len(chain) <= bounded_input.MAX_EXTENDS:
        try:
            data = read_yaml(path)
        except UserError:
            break
        chain.append((path, data))
        parent = data.get("extends")
        if not isinstance(parent, str) or any(p.resolve() == (path.parent / parent).resolve() for p, _ in chain):
            break
        path = path.parent / parent
    for file, data in chain:
        node = data
        for key in loc:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            return None if file == chain[0][0] else str(file)
    return None


def _field_hint(model: type[BaseModel] | None, loc: list[Any]) -> str:
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return ""
        current = _model_of(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    if not fields:
        return ""
    hint = bounded_input.did_you_mean(loc[-1], fields) if bounded_input.is_name(loc[-1]) else ""  # only if shown
    return hint or f" (expected one of: {', '.join(fields)})"


def validate_run(data: dict[str, Any], source: str, overrides: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """A :class:`RunSpec` with its registry names and algorithm parameters checked. An error in a
    field that a ``--set`` override wrote is blamed on that override, not on the file."""
    try:
        return _validate_run(data, source)
    except UserError as exc:
        raise _blame_override(exc, source, overrides) from None


def _blame_override(exc: UserError, source: str, overrides: list[str] | tuple[str, ...]) -> UserError:
    msg = str(exc)
    if not msg.startswith(source + ": "):
        return exc
    rest = msg[len(source) + 2:]
    field = rest.split(":", 1)[0].strip()
    for text in overrides:
        key = text.partition("=")[0].strip()
        if field == key or field.startswith(key + ".") or key.startswith(field + "."):
            rest = rest.split(f" ({_ORIGIN} ", 1)[0]  # the value is the override's, not a file's
            return UserError(f"--set {bounded_input.shorten(text)}: {rest}")
    return exc


def _check_finite(data: Any, source: str) -> None:
    """UserError naming the first float of ``data`` (a raw spec) that is ``inf`` or ``nan``, in
    any section, typed or free-form (a learning rate of ``.inf`` trains to nan; a plugin's option
    of ``.nan`` compares false with everything)."""
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    while stack:
        node, loc = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            named = next((i for i, x in enumerate(loc) if not bounded_input.is_name(x)), len(loc))
            where = ".".join(str(x) for x in loc[:named]) + (" (under a key that is not a field name)"
                                                             if named < len(loc) else "")
            origin = _defined_in(source, loc)
            extra = f" ({_ORIGIN} {bounded_input.shorten(origin, 200)}, through extends:)" if origin else ""
            raise UserError(f"{source}: {bounded_input.shorten(where, 2 * bounded_input.MAX_ECHO_CHARS)}: "
                            f"must be a finite number, got {node!r}{extra}")
        if isinstance(node, dict):
            stack.extend((v, [*loc, k]) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, [*loc, i]) for i, v in reversed(list(enumerate(node))))


def _check_step_size(spec: RunSpec, params: BaseModel, source: str) -> None:
    """UserError when a step's largest turn would sample more than ``MAX_SEQUENCES_PER_STEP``
    sequences (problems_per_step × the per-problem counts the algorithm's parameters declare,
    ``sample_factors``: G, K, M): refused before anything is built, not found out of memory mid-run."""
    from mlmt_bench.algorithms.params import AlgorithmParams

    factors = [("train.problems_per_step", spec.train.problems_per_step)]
    declared = params.sample_factors() if isinstance(params, AlgorithmParams) else {}
    factors += [(f"algorithm.params.{name}", value) for name, value in declared.items() if value > 1]
    total = math.prod(v for _, v in factors)
    if total > MAX_SEQUENCES_PER_STEP:
        names = " × ".join(n for n, _ in factors)
        raise UserError(f"{source}: {names} = {total:,} sequences per step, more than the limit of "
                        f"{MAX_SEQUENCES_PER_STEP:,}")


def _validate_run(data: dict[str, Any], source: str) -> RunSpec:
    from mlmt_bench import registry

    _check_finite(data, source)
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(source, exc, model=RunSpec)) from None
    from mlmt_bench.tracking import check_output_root

    try:  # where the run will write: checked now, not after minutes of setup
        check_output_root(spec.output_dir, "")
    except UserError as exc:
        raise UserError(f"{source}: output_dir: {exc}") from None
    checks: list[tuple[str, registry.Registry[Any], str]] = [
        ("benchmark.name", registry.benchmarks, spec.benchmark.name),
        ("backend.name", registry.backends, spec.backend.name),
        ("algorithm.name", registry.algorithms, spec.algorithm.name),
        ("policies.solver.model", registry.models, spec.policies.solver.model)]
    if spec.benchmark.verifier is not None:
        checks.append(("benchmark.verifier", registry.verifiers, spec.benchmark.verifier))
    if spec.policies.critic is not None:
        checks.append(("policies.critic.model", registry.models, spec.policies.critic.model))
    for where, reg, name in checks:
        if name not in reg:
            raise UserError(f"{source}: {where}: {reg.unknown_message(name)}")
    from mlmt_bench.rollout.backend import reject_unknown_options

    try:
        backend_cls = registry.backends.get(spec.backend.name)
        reject_unknown_options(backend_cls, spec.backend.name, spec.backend.options)
        backend_cls.check_values(**spec.backend.options)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    params = spec.algorithm.validated_params(source)
    spec.algorithm.params = params.model_dump()  # defaults filled in: what the run records
    _check_step_size(spec, params, source)
    if spec.benchmark.path is not None:  # a device or FIFO is refused here too, not after the setup
        from mlmt_bench.benchmarks.data import data_path_problem

        problem = data_path_problem(spec.benchmark.path)
        if problem is not None:
            raise UserError(f"{source}: benchmark.path: {bounded_input.echo_path(spec.benchmark.path)} {problem}")
    if spec.base is not None:
        from mlmt_bench.warmstart.shared_base import BaseConfig

        try:
            base_cfg = BaseConfig.model_validate(spec.base)
        except ValidationError as exc:
            raise UserError(format_validation_error(source, exc, "base", BaseConfig)) from None
        if base_cfg.seed is not None and not 0 <= base_cfg.seed <= MAX_SEED:  # the run's seed's range
            raise UserError(f"{source}: base.seed: must be in [0, {MAX_SEED}], got {bounded_input.echo(base_cfg.seed)}")
    from mlmt_bench.algorithms.params import AlgorithmParams

    roles = params.roles() if isinstance(params, AlgorithmParams) else None
    if spec.warm_start is not None:
        _check_warm_start(spec, roles.built() if roles is not None else ["solver"], source)
    for role in roles.built() if roles is not None else ["solver"]:
        if getattr(spec.policies, role) is None:
            mode = roles.mode(role) if roles is not None else "trained"
            raise UserError(f"{source}: policies.{role}: required by algorithm {spec.algorithm.name} ({role} {mode})")
    if spec.policies.share_base:
        _check_share_base(spec, roles.built() if roles is not None else ["solver"], source)
    _check_model_paths(spec, source)
    if spec.tracking.report_to or spec.tracking.options:
        from mlmt_bench.trackers import check_tracking

        try:
            check_tracking(spec.tracking.report_to, spec.tracking.options, Path(spec.output_dir))
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
    return spec


def _check_model_paths(spec: RunSpec, source: str) -> None:
    """A role's ``path`` that looks local (absolute, ``./``, ``../``, ``~``, or under a folder that
    exists here) and does not exist: one line now, not a hub lookup at load time
    (:func:`mlmt_bench.models.hub.missing_local`). Hub names are not looked up here."""
    from mlmt_bench.models import pretrained
    from mlmt_bench.models.hub import missing_local

    for role in ("solver", "critic"):
        policy = getattr(spec.policies, role)
        problem = missing_local(policy.path) if policy is not None and policy.path else None
        if problem:
            raise UserError(f"{source}: policies.{role}.path: {bounded_input.echo_path(policy.path)}: {problem}")
        shipped = pretrained.lookup(policy.path) if policy is not None and policy.path else None
        if shipped is not None and pretrained.cached(shipped.alias) is None:
            try:  # not converted yet: its wheel must be there to convert from (found, not read)
                pretrained.wheel_dir(shipped)
            except UserError as exc:
                raise UserError(f"{source}: policies.{role}.path: {exc}") from None


def _check_warm_start(spec: RunSpec, built: list[str], source: str) -> None:
    """One-line errors for a ``warm_start:`` section that cannot work: a malformed one, one whose
    model no built role loads (it would start nothing), or worked critiques read unredacted (a copy
    channel)."""
    from mlmt_bench.warmstart.pretrained_base import WarmStartConfig

    try:
        cfg = WarmStartConfig.model_validate(spec.warm_start)
    except ValidationError as exc:
        raise UserError(format_validation_error(source, exc, "warm_start", WarmStartConfig)) from None
    if not any((p := getattr(spec.policies, r)) is not None and p.path == cfg.model for r in built):
        raise UserError(f"{source}: warm_start.model: no role of the run loads {bounded_input.echo(cfg.model)} (its "
                        "`path`); the warm start replaces exactly the roles that load it")
    if cfg.critique == "worked" and not spec.feedback.redact:
        raise UserError(f"{source}: warm_start.critique: worked teaches a critic to state values (the answer among "
                        "them), so the refiner must read it redacted: set feedback.redact: true (METHOD v4)")


#: what every role's spec must agree on when the roles share one base model
_ONE_BASE_FIELDS = ("model", "path", "dtype", "gradient_checkpointing")


def _check_share_base(spec: RunSpec, built: list[str], source: str) -> None:
    """One-line errors for ``policies.share_base`` settings that cannot work: a role without a
    LoRA adapter (full fine-tuning would move the base the other role stands on), or roles whose
    base differs (model, path, dtype, gradient checkpointing)."""
    specs = {role: getattr(spec.policies, role) for role in built}
    for role, p in specs.items():
        if p.lora is None:
            raise UserError(f"{source}: policies.{role}.lora: share_base trains each role as a LoRA adapter on one "
                            "frozen base; full fine-tuning of a shared base cannot work (give the role a `lora:` "
                            "section, or set policies.share_base: false)")
    first, *rest = built
    for role in rest:
        for name in _ONE_BASE_FIELDS:
            a, b = getattr(specs[first], name), getattr(specs[role], name)
            if a != b:
                raise UserError(f"{source}: policies.{role}.{name}: share_base puts every role on one base, but "
                                f"{first} has {bounded_input.echo(a)} and {role} {bounded_input.echo(b)}")


def algorithm_params_model(name: str) -> type[LossParams]:
    """The parameters model the algorithm registered as ``name`` declares (its class's ``Params``,
    the one place an algorithm's parameters are written, built-in or plugin alike)."""
    from mlmt_bench import registry

    declared = registry.algorithms.declared_params(name)
    if declared is not None:  # read without importing the algorithm (and torch)
        return cast("type[LossParams]", declared)
    from mlmt_bench.algorithms.params import LossParams

    algo = registry.algorithms.get(name)  # an Algorithm subclass (the registry checks)
    if not (isinstance(algo.Params, type) and issubclass(algo.Params, LossParams)):
        raise UserError(f"algorithm {name!r}: its Params must subclass mlmt_bench.algorithms.params.LossParams")
    return algo.Params


def is_experiment(data: dict[str, Any]) -> bool:
    return "arms" in data


def load_run_spec(path: Path | str, overrides: list[str] | None = None) -> RunSpec:
    path = Path(path)
    data = apply_overrides(load_raw(path), overrides or [], RunSpec)
    return validate_run(data, str(path), overrides or [])


def load_validated(path: Path | str, model: type[_M]) -> _M:
    """A spec file (with its ``extends:`` chain) validated as ``model``, with one-line errors."""
    return _validated(load_raw(Path(path)), model, str(path))


def _validated(data: dict[str, Any], model: type[_M], source: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(source, exc, model=model)) from None


# ``--set`` paths that set an experiment's own fields; every other path sets a field of its runs
_EXPERIMENT_FIELDS = ("name", "output_dir", "seeds", "budget")
# fields of the runs that the experiment itself decides: run field -> the experiment's field
_EXPERIMENT_OWNED = {"seed": "seeds", "output_dir": "output_dir"}


def load_experiment(path: Path | str, overrides: list[str] | None = None) -> tuple[ExperimentSpec, dict[str, RunSpec]]:
    """An experiment and its arms, each arm validated as a run spec.

    ``--set`` on an experiment: ``name``, ``output_dir``, ``seeds`` and ``budget`` set the
    experiment's own fields; any other path sets that field of every arm, on top of the
    arm's own changes (so no arm silently undoes it). Setting ``seed`` is an error (each run's
    seed comes from ``seeds:``), and so is an arm that sets ``seed`` or ``output_dir``.
    """
    path = Path(path)
    exp_over: list[str] = []
    run_over: list[str] = []
    for text in overrides or []:
        head = parse_override(text)[0][0]
        if head == "seed":
            raise UserError(f"--set {bounded_input.shorten(text)}: an experiment gives each run its seed from its "
                            "seeds: list; use --set seeds=[...]")
        (exp_over if head in _EXPERIMENT_FIELDS else run_over).append(text)
    exp = _validated(apply_overrides(load_raw(path), exp_over, ExperimentSpec), ExperimentSpec, str(path))
    from mlmt_bench.tracking import check_output_root

    try:  # the experiment's own output_dir (every arm's), blamed on it rather than on the first arm
        check_output_root(exp.output_dir, "")
    except UserError as exc:
        raise _blame_override(UserError(f"{path}: output_dir: {exc}"), str(path), exp_over) from None
    base_raw = load_raw(path.parent / exp.base) if isinstance(exp.base, str) else exp.base
    exp.base = apply_overrides(base_raw, run_over, RunSpec)
    arms: dict[str, RunSpec] = {}
    for arm, over in exp.arms.items():
        where = f"{path}: arms.{bounded_input.shorten(arm)}"
        for field, owner in _EXPERIMENT_OWNED.items():
            if field in over:
                raise UserError(f"{where}: {field}: an arm cannot set it (the experiment's {owner}: applies to "
                                f"every run)")
        merged = apply_overrides(deep_merge(base_raw, over), run_over, RunSpec)
        merged["name"] = over.get("name", f"{exp.name}-{arm}")
        merged["output_dir"] = exp.output_dir
        arms[arm] = validate_run(merged, where, run_over)
    return exp, arms


def load_any(path: Path | str,
             overrides: list[str] | None = None) -> RunSpec | tuple[ExperimentSpec, dict[str, RunSpec]]:
    path = Path(path)
    data = load_raw(path)
    if is_experiment(data):
        return load_experiment(path, overrides)
    return validate_run(apply_overrides(data, overrides or [], RunSpec), str(path), overrides or [])


def dump_yaml(spec: BaseModel) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
