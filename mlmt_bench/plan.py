"""``mlmt-bench plan SPEC``: what a run will cost, before it starts.

Everything is read offline: the spec, each policy's architecture (:mod:`mlmt_bench.models.configs`:
a preset, a local config.json, or a ``registry/models`` file for a hub name), the algorithm's own
episode program (G attempts, K feedbacks, M refinements) and update schedule, the benchmark's
prompts when its data is on disk (else an estimate, labelled). Nothing is downloaded or loaded.

Reported, per GPU (a process under data parallelism gets ``problems_per_step / gpus`` problems):

- parameters per policy, and the trainable ones (LoRA adapters counted from the wrapped layers);
- per training step, as **upper bounds** (every turn runs to its ``max_new_tokens``): sequences,
  prefill / generated / trained / extra-forward tokens and FLOPs by METHOD.md v2
  (:mod:`mlmt_bench.metrics.cost`, as the trainer counts them: prompts as prefill, whole trained
  sequences every epoch, every extra forward pass once: reference log-probs when β > 0, old
  log-probs when epochs > 1, the learned value's features, self_distill's KL teacher);
- the same for the whole run (``train.steps``, or fewer if the token budget ends it first at these
  lengths) and its evaluations;
- estimated peak memory: weights, LoRA adapters, gradients and AdamW states (in the parameters'
  dtype; LoRA adapters are float32, peft's default), the frozen reference copy (full fine-tuning
  with β > 0), the generation engine (vLLM: ``gpu_memory_utilization`` × device memory per model;
  hf static decode: its KV-cache budget; hf generate: the KV cache of the largest call), and the
  larger of the generation phase (prefill activations, KV of plain generate) and the training
  phase (activations of the largest micro-batch as ``train.micro_batch_tokens`` and
  ``grad_accum`` split the update, checkpointed with ``gradient_checkpointing``, and the float32
  log-softmax over the vocabulary of the trained positions) and the log-prob phase before it
  (π_ref / π_old logits), plus a fixed runtime overhead. Not included: allocator
  fragmentation, the learned value's feature pass, vLLM's own compile workspace, DAPO dynamic
  sampling's extra rounds, other processes. Treat it as ±30 %.
- estimated time from measured tokens/s (``mlmt_bench/data/throughput.yaml``, keyed by device and
  model; the nearest model size on the device is scaled by parameter count).

A spec whose estimated peak exceeds the device's memory is refused (one-line error, exit 2)
unless ``--force``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.metrics import cost

GB = 1e9
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: CUDA context, cuBLAS workspaces, allocator slack (GPU); Python + torch (CPU)
RUNTIME_OVERHEAD = {"gpu": 1.0 * GB, "cpu": 0.5 * GB}
TABLE = Path(__file__).resolve().parent / "data" / "throughput.yaml"


# ----------------------------------------------------------------------------------------------
# devices and the throughput table


@dataclass
class Device:
    kind: str
    memory: float | None  # bytes
    description: str
    gpu: bool


def load_table(path: Path = TABLE) -> dict[str, Any]:
    from mlmt_bench.bounded_input import load_yaml, read_text

    data = load_yaml(read_text(path), str(path))
    if not isinstance(data, dict) or "devices" not in data or "rows" not in data:
        raise UserError(f"{path}: expected 'devices:' and 'rows:'")
    return data


def resolve_device(name: str, table: dict[str, Any]) -> Device:
    """``auto`` (this machine's first CUDA GPU, else its CPU), or a device key of the table."""
    devices = table["devices"]
    if name == "auto":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            lowered = props.name.lower().replace(" ", "")
            kind = next((k for k, d in devices.items() if d.get("match") and d["match"] in lowered), "cuda")
            return Device(kind, float(props.total_memory), f"{props.name} (this machine)", True)
        name = "cpu"
    if name not in devices:
        raise UserError(f"--device {name!r}: unknown device (known: auto, {', '.join(devices)})")
    d = devices[name]
    memory = d.get("memory_gb")
    if name == "cpu":
        import psutil

        memory = psutil.virtual_memory().total / GB
    return Device(name, None if memory is None else float(memory) * GB, d.get("description", name), name != "cpu")


def _backend_key(spec: Any) -> str:
    if spec.backend.name == "vllm":
        return "vllm"
    return "hf-static" if spec.backend.options.get("decode") == "static" else "hf-generate"


def throughput(table: dict[str, Any], device: str, params: int, backend: str) -> dict[str, Any] | None:
    """Generated and trained tokens/s for a model of ``params`` on ``device``: the row of the nearest
    model size (log scale), scaled by parameter count (both phases are bound by reading or
    multiplying every weight once per token). None if the table has no row for the device."""
    rows = [r for r in table["rows"] if r["device"] == device]
    if not rows:
        return None
    row = min(rows, key=lambda r: abs(math.log(r["params"] / params)))
    scale = row["params"] / params
    gen_key = backend if backend in row["gen"] else next(k for k in ("vllm", "hf-static", "hf-generate")
                                                          if k in row["gen"])
    note = "" if gen_key == backend else f" (no {backend} figure: {gen_key}'s, so likely slower than {backend} will be)"
    return {"gen": row["gen"][gen_key] * scale, "train": row["train"] * scale, "row": row["model"],
            "row_params": row["params"], "scale": scale, "backend": gen_key + note, "source": row["source"]}


# ----------------------------------------------------------------------------------------------
# the run's shape


@dataclass
class PlannedPolicy:
    """A policy as the plan sees it: its spec, its architecture, and whether it is updated."""

    role: str
    spec: Any  # PolicySpec
    shape: Any  # ModelShape
    lora_params: int
    trains: bool  # updated at some step
    shared: bool = False  # the critic is the solver's model

    @property
    def bytes(self) -> int:
        return _DTYPE_BYTES[self.spec.dtype]

    @property
    def trainable(self) -> int:
        if not self.trains:
            return 0
        return self.lora_params if self.spec.lora is not None else self.shape.params


@dataclass
class Lengths:
    """Mean prompt tokens of each turn, beyond the generated text they embed."""

    attempt: float
    feedback_extra: float  # critic prompt without the attempt's text
    refine_extra: float  # the refinement's user message and chat markup, without the feedback text
    #                      (the EOS that closes the attempt is counted with the attempt)
    null_feedback: float  # tokens of g∅
    eval_problems: int | None
    source: str


@dataclass
class Turn:
    """One kind of generated turn in a step: who, how many, prompt and generated tokens each."""

    kind: str
    role: str
    count: int
    prompt: float
    new: int
    trained: bool = False


@dataclass
class Work:
    """Tokens per role (as the trainer counts them): prefill and generated of every generated
    sequence, trained sequence tokens (prompt + completion, every epoch), extra forward passes."""

    prefill: dict[str, float] = field(default_factory=dict)
    generated: dict[str, float] = field(default_factory=dict)
    trained: dict[str, float] = field(default_factory=dict)
    forward: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, role: str, tokens: float) -> None:
        if tokens:
            d = getattr(self, kind)
            d[role] = d.get(role, 0.0) + tokens

    def scaled(self, k: float) -> Work:
        return Work(*({r: v * k for r, v in getattr(self, f).items()} for f in ("prefill", "generated", "trained",
                                                                                 "forward")))

    def flops(self, params: dict[str, int]) -> dict[str, float]:
        return {"generation": sum(cost.generation_flops(params[r], int(self.prefill.get(r, 0)), int(v))
                                  for r, v in self.generated.items()),
                "training": sum(cost.training_flops(params[r], int(v)) for r, v in self.trained.items()),
                "forward": sum(cost.forward_flops(params[r], int(v)) for r, v in self.forward.items())}


def _policies(spec: Any, algorithm: Any) -> dict[str, PlannedPolicy]:
    """The policies the algorithm builds (its roles: trained, frozen, shared with the solver), with
    whether each is updated at some step of the run."""
    from mlmt_bench.models.configs import policy_shape

    roles = algorithm.roles()
    updated = set().union(*(algorithm.updates(s) for s in range(min(max(1, spec.train.steps), 1000))))
    out: dict[str, PlannedPolicy] = {}
    for role in ("solver", "critic"):
        mode = roles.mode(role)
        if mode == "absent":
            continue
        if mode == "shared":
            solver = out["solver"]
            out[role] = PlannedPolicy(role, solver.spec, solver.shape, solver.lora_params,
                               solver.spec.trainable and role in updated, shared=True)
            continue
        pspec = getattr(spec.policies, role)
        if pspec is None:
            raise UserError(f"policies.{role}: required by algorithm {spec.algorithm.name}")
        shape = policy_shape(role, pspec, spec.base)
        out[role] = PlannedPolicy(role, pspec, shape, shape.lora_params(pspec.lora),
                           mode == "trained" and pspec.trainable and role in updated)
    return out


def _tokenizer(policy: Any) -> Any:
    """The policy's tokenizer if it can be read without a download, else None."""
    if policy.model == "tiny" and not policy.path:
        from mlmt_bench.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    if policy.path and Path(policy.path).expanduser().is_dir():
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(Path(policy.path).expanduser()))
        except (OSError, ValueError):
            return None
    return None


#: estimate for a tokenizer that cannot be read offline: characters per token, chat-template tokens per message
_CHARS_PER_TOKEN, _TEMPLATE_TOKENS = 4.0, 32


def _lengths(spec: Any) -> Lengths:
    """Mean prompt tokens from up to 256 training problems, measured with the solver's tokenizer when
    it can be read offline, else estimated from characters."""
    from mlmt_bench import registry
    from mlmt_bench.runner import templates_for

    b = spec.benchmark
    why = "empty split"
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # never download to plan
    try:
        bench = registry.benchmarks.get(b.name)(path=b.path, **b.options)
        tpl = templates_for(spec, bench)
        problems = bench.load(b.train_split)[: min(b.train_limit or 256, 256)]
        try:
            n_eval = len(bench.load(b.eval_split))
        except UserError:
            n_eval = None
    except UserError as exc:
        problems, tpl, n_eval, why = [], None, None, str(exc)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    limit = spec.eval.limit or b.eval_limit
    n_eval = min(n_eval, limit) if n_eval is not None and limit else (limit or n_eval)
    if not problems:
        return Lengths(256, 256 + _TEMPLATE_TOKENS, 24 + _TEMPLATE_TOKENS, 24, n_eval,
                       f"guessed (benchmark data not on disk: {why.splitlines()[0][:120]})")
    tok = _tokenizer(spec.policies.solver)
    if tok is not None:
        from mlmt_bench.rollout.chat import chat_ids, continuation_ids
        from mlmt_bench.rollout.episodes import attempt_prompt

        def user(text: str) -> int:
            return len(chat_ids(tok, [{"role": "user", "content": text}], add_generation_prompt=True))

        attempt = sum(len(attempt_prompt(tok, tpl, p)) for p in problems) / len(problems)
        feedback = sum(user(tpl.render_feedback(p, "")) for p in problems) / len(problems)
        history = [{"role": "user", "content": tpl.render_attempt(problems[0])}, {"role": "assistant", "content": ""}]
        refine = len(continuation_ids(tok, history, [{"role": "user", "content": tpl.render_refine("")}]))
        null = len(tok(tpl.null_feedback, add_special_tokens=False)["input_ids"])
        return Lengths(attempt, feedback, refine, null, n_eval,
                       f"measured with the solver's tokenizer on {len(problems)} {b.name} problems")

    def est(text: str) -> float:
        return len(text) / _CHARS_PER_TOKEN

    attempt = sum(est(tpl.render_attempt(p)) for p in problems) / len(problems) + _TEMPLATE_TOKENS
    feedback = sum(est(tpl.render_feedback(p, "")) for p in problems) / len(problems) + _TEMPLATE_TOKENS
    return Lengths(attempt, feedback, est(tpl.render_refine("")) + _TEMPLATE_TOKENS, est(tpl.null_feedback), n_eval,
                   f"estimated from {len(problems)} {b.name} problems at {_CHARS_PER_TOKEN:g} characters per token "
                   f"+ {_TEMPLATE_TOKENS} chat-template tokens per message (the tokenizer is not read offline)")


#: how each algorithm trains each kind of generated turn: on the context it was generated from
#: ("own"), or as a response to the problem alone ("as_attempt": refinements joining the group in
#: critique_grpo, distilled in self_distill). A plugin's algorithm is planned as training every
#: turn on its own context (an upper bound).
TRAINED_TURNS: dict[str, dict[str, str]] = {
    "grpo": {"attempt": "own"},
    "self_correct": {"attempt": "own", "refine": "own"},
    "mlmt": {"attempt": "own", "feedback": "own", "refine": "own"},
    "critique_grpo": {"attempt": "own", "refine": "as_attempt"},
    "self_distill": {"attempt": "own", "feedback": "own", "refine": "as_attempt"},
}
_EVERY_TURN = {"attempt": "own", "feedback": "own", "refine": "own"}


def _turns(program: Any, n: int, lengths: Lengths, t_new: int, t_fb: int) -> list[Turn]:
    """The generated turns of one rollout over ``n`` problems (``program``: the algorithm's Program)."""
    g, k, m = program.attempts, program.feedbacks, program.refinements
    out = [Turn("attempt", "solver", n * g, lengths.attempt, t_new)]
    if program.feedback == "none":
        return out
    if program.feedback == "critic":
        out.append(Turn("feedback", "critic", n * g * k, lengths.feedback_extra + t_new, t_fb))
        fb = t_fb
    else:
        fb = lengths.null_feedback if program.feedback == "null" else t_fb  # oracle text: bounded by t_fb
    refine_prompt = lengths.attempt + t_new + 1 + lengths.refine_extra + fb
    out.append(Turn("refine", "solver", n * g * k * m, refine_prompt, t_new))
    return out


def _trained(turns: list[Turn], algorithm: str, policies: dict[str, PlannedPolicy], lengths: Lengths) -> list[Turn]:
    """The sequences each updated role trains on in a step (upper bound: every one has a gradient):
    the turns of :data:`TRAINED_TURNS` with the context they are trained in."""
    how = TRAINED_TURNS.get(algorithm, _EVERY_TURN)
    out = []
    for t in turns:
        mode = how.get(t.kind)
        if mode is None or not (t.role in policies and policies[t.role].trains):
            continue
        prompt = lengths.attempt if mode == "as_attempt" else t.prompt
        out.append(Turn(t.kind, t.role, t.count, prompt, t.new, trained=True))
    return out


def _step_work(turns: list[Turn], trained: list[Turn], params: Any, value_contexts: float) -> Work:
    """Tokens of one step as the trainer counts them: prefill and generated per generated turn;
    trained sequences (prompt + completion) every epoch; extra forward passes over them once each
    for π_ref (β > 0, or self_correct's β₂) and π_old (epochs > 1); ``value_contexts`` tokens for
    the learned value's features (METHOD.md v2)."""
    w = Work()
    for t in turns:
        w.add("prefill", t.role, t.count * t.prompt)
        w.add("generated", t.role, t.count * t.new)
    epochs = getattr(params, "epochs", 1)
    ref = getattr(params, "beta", 0) > 0 or getattr(params, "beta2", 0) > 0
    for t in trained:
        seq = t.count * (t.prompt + t.new)
        w.add("trained", t.role, seq * epochs)
        w.add("forward", t.role, seq * (int(ref) + int(epochs > 1)))
    if value_contexts:
        w.add("forward", "solver", value_contexts)
    return w


def _eval_work(program: Any, e: int, lengths: Lengths, t_new: int, t_fb: int, feedback_metrics: bool) -> Work:
    turns = _turns(program, e, lengths, t_new, t_fb)
    w = _step_work(turns, [], None, 0)
    if program.feedback in ("critic", "oracle") and feedback_metrics:
        refine = next(t for t in turns if t.kind == "refine")
        null_prompt = refine.prompt - t_fb + lengths.null_feedback
        w.add("prefill", "solver", e * null_prompt)
        w.add("generated", "solver", e * t_new)
        w.add("forward", "solver", e * (refine.prompt + null_prompt + 2 * t_new))  # feedback sensitivity
    return w


def _evaluations(steps: int, every: int) -> int:
    """Evaluations the trainer runs: before the first step, every ``every`` steps, and after the last."""
    marks = {s for s in range(1, steps + 1) if every and s % every == 0} | ({steps} if steps else set())
    return 1 + len(marks)


# ----------------------------------------------------------------------------------------------
# memory


def _ladder(n: int) -> int:
    from mlmt_bench.rollout.static_decode import _length_ladder

    return _length_ladder(n)


def _act_bytes_per_token(shape: Any, b: int, checkpointing: bool) -> float:
    """Bytes autograd keeps per token for backward, all layers, for a Llama-style layer in dtype
    ``b``: the four SwiGLU tensors (4·I), the hidden-size tensors around attention and the norms
    (about 7·h in dtype and 2.5·h in float32), rotated queries and keys and the values (h + 2·kv).
    Calibrated against the storages autograd saves (tests/test_plan.py)."""
    per_layer = b * (4 * shape.intermediate + 7 * shape.hidden + 2 * shape.kv_dim) + 10 * shape.hidden
    if checkpointing:  # only each layer's input, plus one layer recomputed in backward
        return shape.layers * b * shape.hidden + per_layer
    return shape.layers * per_layer + 2 * b * shape.hidden + 8 * shape.hidden


def _logit_bytes_per_token(shape: Any, b: int) -> float:
    """Per trained position: the float32 log-softmax kept for backward (4·V) plus what is alive
    around it, the logits in dtype and the float32 temporaries of the entropy (2 × 4·V)."""
    return shape.vocab * (4 + b + 8)


def _micro_batches(trained: list[Turn], roles: list[str], grad_accum: int,
                   mb_tokens: int | None) -> list[tuple[int, float, float]]:
    """(rows, padded length, logit positions per row) of each micro-batch of an update over the
    trained sequences of ``roles``, split as the update splits them (models/forward.py:
    at most ``train.micro_batch_tokens`` padded tokens and at least ``grad_accum`` micro-batches)."""
    from mlmt_bench.models.forward import micro_batches

    seqs = [(t.prompt, t.new) for t in trained if t.role in roles for _ in range(t.count)]
    if not seqs:
        return []
    lengths = [int(math.ceil(p + n)) for p, n in seqs]
    out = []
    for mb in micro_batches(lengths, mb_tokens, max_rows=-(-len(seqs) // grad_accum)):
        length = max(lengths[i] for i in mb)
        out.append((len(mb), length, length - min(seqs[i][0] for i in mb)))
    return out


def _memory(spec: Any, policies: dict[str, PlannedPolicy], turns: list[Turn], trained: list[Turn],
            eval_turns: list[Turn], device: Device) -> dict[str, Any]:
    items: dict[str, dict[str, float]] = {"persistent": {}, "generation": {}, "logprobs": {}, "training": {}}

    def add(phase: str, what: str, nbytes: float) -> None:
        if nbytes:
            items[phase][what] = items[phase].get(what, 0.0) + nbytes

    distinct = [p for p in policies.values() if not p.shared]
    needs_ref = spec.algorithm.params.get("beta", 0) > 0 or spec.algorithm.params.get("beta2", 0) > 0
    for p in distinct:
        add("persistent", f"weights ({p.role})", p.shape.params * p.bytes)
        trains = p.trains or any(q.trains for q in policies.values() if q.shared)
        if p.spec.lora is not None:
            add("persistent", f"LoRA adapter ({p.role}, float32)", p.lora_params * 4)
        if trains:
            t = p.lora_params if p.spec.lora is not None else p.shape.params
            tb = 4 if p.spec.lora is not None else p.bytes
            add("persistent", f"gradients ({p.role})", t * tb)
            add("persistent", f"AdamW states ({p.role})", 2 * t * tb)
            if needs_ref and p.spec.lora is None:
                add("persistent", f"reference copy ({p.role})", p.shape.params * p.bytes)

    # generation engines and caches, per model that generates
    backend = spec.backend
    opts = backend.options
    all_turns = turns + eval_turns
    for p in distinct:
        roles = {p.role} | {q.role for q in policies.values() if q.shared}
        gen = [t for t in all_turns if t.role in roles]
        if not gen:
            continue
        kvb = 2 * p.shape.layers * p.shape.kv_dim * p.bytes  # K and V per row and cache slot
        batch = int(opts.get("batch_size", 256))
        rows = min(batch, max(t.count for t in gen))
        length = max(t.prompt + t.new for t in gen)
        if backend.name == "vllm":
            if device.memory is None:
                continue
            util = float(opts.get("gpu_memory_utilization", 0.3))
            add("persistent", f"vLLM engine ({p.role}: {util:g} x device memory)", util * device.memory)
            continue
        if opts.get("decode") == "static":
            on_gpu = device.gpu
            buckets = opts.get("buckets", "auto")
            buckets = on_gpu if buckets == "auto" else bool(buckets)
            cache_len = _ladder(int(math.ceil(length))) if buckets else math.ceil(length)
            budget = opts.get("max_cache_mb", "auto")
            budget = (4096 if on_gpu else None) if budget == "auto" else budget
            kv = rows * cache_len * kvb
            if budget is not None:
                kv = min(kv, budget * 2 ** 20)
            add("persistent", f"static KV cache ({p.role}, kept between calls)", kv)
        else:
            add("generation", f"KV cache of generate ({p.role})", rows * length * kvb)
        prompt = max(t.prompt for t in gen)
        add("generation", f"prefill activations ({p.role})",
            rows * prompt * (2 * p.shape.intermediate + 4 * p.shape.hidden) * p.bytes)
        add("generation", f"sampling logits ({p.role})", rows * p.shape.vocab * 4 * 4)

    # the update: the largest micro-batch of each model's update (policies update one after
    # another); before it, the no-grad log-prob passes (π_ref, π_old) over the same micro-batches
    mb_tokens = spec.train.micro_batch_tokens
    epochs = spec.algorithm.params.get("epochs", 1)
    worst: dict[str, tuple[float, dict[str, float]]] = {"training": (0.0, {}), "logprobs": (0.0, {})}
    for p in distinct:
        roles = [r for r, q in policies.items() if (q is p or (q.shared and p.role == "solver")) and q.trains]
        ckpt = p.spec.gradient_checkpointing
        for rows, length, logit_pos in _micro_batches(trained, roles, spec.train.grad_accum, mb_tokens):
            act = rows * length * _act_bytes_per_token(p.shape, p.bytes, ckpt)
            logits = rows * logit_pos * _logit_bytes_per_token(p.shape, p.bytes)
            if act + logits > worst["training"][0]:
                worst["training"] = (act + logits, {
                    f"activations ({p.role}, {rows} sequences x {int(length)} tokens"
                    f"{', checkpointed' if ckpt else ''})": act,
                    f"logits + float32 log-softmax ({p.role})": logits})
            if needs_ref or epochs > 1:  # no graph kept: the logits, and one row's float32 log-softmax
                lp = rows * logit_pos * p.shape.vocab * p.bytes + logit_pos * p.shape.vocab * 8
                if lp > worst["logprobs"][0]:
                    worst["logprobs"] = (lp, {f"reference / old log-prob logits ({p.role})": lp})
    for phase, (_, parts) in worst.items():
        for what, nbytes in parts.items():
            add(phase, what, nbytes)
    add("persistent", "runtime (CUDA context, workspaces)" if device.gpu else "runtime (Python, torch)",
        RUNTIME_OVERHEAD["gpu" if device.gpu else "cpu"])
    persistent = sum(items["persistent"].values())
    phases = {k: sum(items[k].values()) for k in ("generation", "logprobs", "training")}
    peak = persistent + max(phases.values())
    return {"items": items, "persistent": persistent, "generation_phase": phases["generation"],
            "logprobs_phase": phases["logprobs"], "training_phase": phases["training"], "peak": peak,
            "device": device.memory, "fits": device.memory is None or peak <= device.memory}


# ----------------------------------------------------------------------------------------------
# the plan


def plan_run(spec: Any, device: Device, gpus: int = 1, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan of one validated :class:`~mlmt_bench.spec.RunSpec` (a JSON-able dict)."""
    from mlmt_bench import registry

    if gpus < 1:
        raise UserError(f"--gpus must be ≥ 1, got {gpus}")
    table = table if table is not None else load_table()
    algo_cls = registry.algorithms.get(spec.algorithm.name)
    params = algo_cls.Params.model_validate(spec.algorithm.params)
    algorithm = algo_cls(params, spec.train.steps)
    policies = _policies(spec, algorithm)
    lengths = _lengths(spec)
    b = spec.backend
    t_new, t_fb = b.max_new_tokens, b.feedback_max_new_tokens or b.max_new_tokens
    n = max(1, math.ceil(spec.train.problems_per_step / gpus))
    program = algorithm.program(0)
    turns = _turns(program, n, lengths, t_new, t_fb)
    trained = _trained(turns, spec.algorithm.name, policies, lengths)
    value_tokens = 0.0
    if getattr(algorithm, "value_model", None) is not None:  # features of each feedback's refinement context
        refine = next((t for t in turns if t.kind == "refine"), None)
        feedback = next((t for t in turns if t.kind == "feedback"), None)
        if refine is not None and feedback is not None:
            value_tokens = feedback.count * refine.prompt
    step = _step_work(turns, trained, params, value_tokens)
    if spec.algorithm.name == "self_distill" and getattr(params, "distill", "") == "kl":
        refine = next(t for t in turns if t.kind == "refine")  # the teacher reads the refinement in its context
        step.add("forward", "solver", refine.count * (refine.prompt + refine.new))
    model_params = {r: p.shape.params for r, p in policies.items()}

    gen_per_step = sum(step.generated.values()) * gpus
    steps = spec.train.steps
    budget_steps = None
    if spec.train.token_budget and gen_per_step:
        budget_steps = math.ceil(spec.train.token_budget / gen_per_step)
        steps = min(steps, budget_steps)
    if spec.train.flop_budget:
        flops_per_step = sum(step.flops(model_params).values()) * gpus
        flop_steps = math.ceil(spec.train.flop_budget / flops_per_step) if flops_per_step else steps
        budget_steps = flop_steps if budget_steps is None else min(budget_steps, flop_steps)
        steps = min(steps, flop_steps)
    n_eval_runs = _evaluations(steps, spec.eval.every)
    e = lengths.eval_problems or 0
    eval_program = algorithm.eval_program()
    eval_turns = _turns(eval_program, e, lengths, t_new, t_fb)
    one_eval = _eval_work(eval_program, e, lengths, t_new, t_fb, spec.eval.feedback_metrics)
    train_total = step.scaled(steps)
    eval_total = one_eval.scaled(n_eval_runs)

    memory = _memory(spec, policies, turns, trained, eval_turns, device)
    time_est = _time(table, device, policies, step, one_eval, steps, n_eval_runs, _backend_key(spec))
    return {
        "spec": spec.name, "algorithm": spec.algorithm.name,
        "device": {"kind": device.kind, "memory_bytes": device.memory, "description": device.description},
        "gpus": gpus,
        "policies": [{"role": r, "model": p.spec.path or p.shape.name, "source": p.shape.source,
                      "params": p.shape.params, "trainable": p.trainable, "lora_params": p.lora_params,
                      "dtype": p.spec.dtype, "shared_with_solver": p.shared,
                      "fine_tuning": ("LoRA r %d" % p.spec.lora.r) if p.spec.lora else "full",
                      "updated": p.trains} for r, p in policies.items()],
        "program": {"problems_per_step": spec.train.problems_per_step, "problems_per_gpu": n,
                    "attempts": program.attempts, "feedback": program.feedback, "feedbacks": program.feedbacks,
                    "refinements": program.refinements, "max_new_tokens": t_new, "feedback_max_new_tokens": t_fb},
        "prompt_tokens": {"attempt": lengths.attempt, "feedback_extra": lengths.feedback_extra,
                          "refine_extra": lengths.refine_extra, "source": lengths.source},
        "per_step": {"sequences": {f"{t.kind} ({t.role})": t.count for t in turns},
                     "tokens": vars(step), "flops": step.flops(model_params)},
        "run": {"steps": steps, "steps_in_spec": spec.train.steps, "budget_steps": budget_steps,
                "evaluations": n_eval_runs, "eval_problems": e,
                "train_tokens": vars(train_total), "eval_tokens": vars(eval_total),
                "train_flops": train_total.flops(model_params), "eval_flops": eval_total.flops(model_params)},
        "memory": memory,
        "time": time_est,
        "upper_bounds": "every turn runs to its max_new_tokens; every trained turn is trained "
                        "(zero-advantage groups are skipped in practice)",
    }


def _time(table, device, policies, step: Work, one_eval: Work, steps: int, n_eval: int, backend: str):
    rates = {r: throughput(table, device.kind, p.shape.params, backend) for r, p in policies.items()}
    if any(v is None for v in rates.values()):
        return {"available": False,
                "why": f"no measured throughput for device {device.kind!r} in {TABLE.name}; add a row "
                       f"(benchmarks/plan_throughput.py prints them)"}

    def seconds(w: Work) -> float:
        s = 0.0
        for r, v in w.generated.items():
            s += v / rates[r]["gen"]
        for r, v in w.trained.items():
            s += v / rates[r]["train"]
        for r, v in w.forward.items():
            s += v / (3 * rates[r]["train"])  # a forward is about a third of forward + backward
        return s

    per_step = seconds(step)
    per_eval = seconds(one_eval)
    return {"available": True, "per_step_s": per_step, "train_s": per_step * steps, "per_eval_s": per_eval,
            "eval_s": per_eval * n_eval, "total_s": per_step * steps + per_eval * n_eval,
            "basis": {r: {k: v[k] for k in ("row", "row_params", "scale", "backend", "gen", "train", "source")}
                      for r, v in rates.items()}}


def plan_spec(path: Path, overrides: list[str], device: str = "auto", gpus: int = 1) -> dict[str, Any]:
    """Plan a run spec, or every arm of an experiment spec."""
    from mlmt_bench import spec as specs

    table = load_table()
    dev = resolve_device(device, table)
    loaded = specs.load_any(path, overrides)
    if isinstance(loaded, tuple):
        exp, arms = loaded
        plans = {arm: plan_run(s, dev, gpus, table) for arm, s in arms.items()}
        return {"kind": "experiment", "spec": str(path), "name": exp.name, "arms": plans,
                "fits": all(p["memory"]["fits"] for p in plans.values())}
    result = plan_run(loaded, dev, gpus, table)
    return {"kind": "run", "spec": str(path), **result, "fits": result["memory"]["fits"]}


def refusal(result: dict[str, Any]) -> str | None:
    """The one-line reason a planned spec does not fit, or None."""
    plans = result["arms"].items() if result["kind"] == "experiment" else [(None, result)]
    for arm, p in plans:
        m = p["memory"]
        if not m["fits"]:
            biggest = max(((k, v) for phase in m["items"].values() for k, v in phase.items()), key=lambda kv: kv[1])
            where = f"arm {arm}: " if arm else ""
            unit = "process" if p["device"]["kind"] == "cpu" else "GPU"
            return (f"{result['spec']}: {where}estimated peak memory {m['peak'] / GB:.1f} GB per {unit} exceeds the "
                    f"{m['device'] / GB:.0f} GB of {p['device']['kind']} (largest part: {biggest[0]} "
                    f"{biggest[1] / GB:.1f} GB); use --force to plan it anyway")
    return None


# ----------------------------------------------------------------------------------------------
# text


def _n(x: float) -> str:
    for unit, k in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= k:
            return f"{x / k:.3g}{unit}"
    return f"{x:.3g}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.1f} MB"


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def render(result: dict[str, Any]) -> str:
    if result["kind"] == "experiment":
        return "\n\n".join(f"== arm {arm}\n" + _render_run(p, result["spec"]) for arm, p in result["arms"].items())
    return _render_run(result, result["spec"])


def _tokens_line(t: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{k} {_n(sum(v.values()))}" + (f" ({', '.join(f'{r} {_n(x)}' for r, x in v.items())})"
                                                     if len(v) > 1 else "")
                     for k, v in t.items() if v)


def _render_run(p: dict[str, Any], spec_path: str) -> str:
    d = p["device"]
    mem = p["memory"]
    unit = "GPU" if d["kind"] != "cpu" else "process"
    lines = [f"plan: {spec_path} (run {p['spec']}, {p['algorithm']}) on {d['kind']} "
             f"({_gb(d['memory_bytes']) if d['memory_bytes'] else 'memory unknown'}; {d['description']})"
             f" x {p['gpus']} {unit}{'es' if unit == 'process' and p['gpus'] > 1 else 's' if p['gpus'] > 1 else ''}",
             "policies:"]
    for q in p["policies"]:
        shared = ", the solver's model" if q["shared_with_solver"] else ""
        lines.append(f"  {q['role']:6} {q['model']}: {_n(q['params']).replace('G', 'B')} parameters, {q['fine_tuning']}"
                     f"{' (adapter ' + _n(q['lora_params']) + ')' if q['lora_params'] else ''}, {q['dtype']}, "
                     f"{'trained' if q['updated'] else 'frozen'}{shared}  [{_relative(q['source'])}]")
    pr = p["program"]
    lines.append(f"per step and {unit} ({pr['problems_per_gpu']} of {pr['problems_per_step']} problems; upper bounds: "
                 f"every turn runs to max_new_tokens {pr['max_new_tokens']}"
                 f"{'/' + str(pr['feedback_max_new_tokens']) if pr['feedback'] == 'critic' else ''}):")
    lines.append("  sequences: " + ", ".join(f"{v} {k}" for k, v in p["per_step"]["sequences"].items()))
    lines.append("  tokens: " + _tokens_line(p["per_step"]["tokens"]))
    f = p["per_step"]["flops"]
    lines.append(f"  FLOPs: {sum(f.values()):.3g} (generation {f['generation']:.3g}, training {f['training']:.3g}, "
                 f"extra forwards {f['forward']:.3g})")
    lines.append(f"  prompt tokens: {p['prompt_tokens']['source']}")
    r = p["run"]
    budget = (f"; the token budget ends the run after {r['budget_steps']} steps at these lengths"
              if r["budget_steps"] is not None and r["budget_steps"] < r["steps_in_spec"] else "")
    lines.append(f"run: {r['steps']} steps (train.steps {r['steps_in_spec']}{budget}), {r['evaluations']} evaluations "
                 f"of {r['eval_problems']} problems")
    lines.append("  training tokens: " + _tokens_line(r["train_tokens"]))
    lines.append("  evaluation tokens: " + _tokens_line(r["eval_tokens"]))
    tf, ef = sum(r["train_flops"].values()), sum(r["eval_flops"].values())
    lines.append(f"  FLOPs: {tf + ef:.3g} (training steps {tf:.3g}, evaluations {ef:.3g})")
    dev = f" of {_gb(mem['device'])}" if mem["device"] else ""
    lines.append(f"memory per {unit} (estimate, ±30 %): peak {_gb(mem['peak'])}{dev} "
                 f"({'fits' if mem['fits'] else 'DOES NOT FIT'}) = always held {_gb(mem['persistent'])} "
                 f"+ max(generation {_gb(mem['generation_phase'])}, log-probs {_gb(mem['logprobs_phase'])}, "
                 f"update {_gb(mem['training_phase'])})")
    for phase, title in (("persistent", "held"), ("generation", "generation"), ("logprobs", "log-probs"),
                         ("training", "update")):
        if mem["items"][phase]:
            lines.append(f"  {title}: " + ", ".join(f"{k} {_gb(v)}" for k, v in mem["items"][phase].items()))
    t = p["time"]
    if t["available"]:
        lines.append(f"time (estimate): {t['per_step_s']:.2f} s/step, {_dur(t['train_s'])} training + "
                     f"{_dur(t['eval_s'])} evaluation = {_dur(t['total_s'])}")
        for role, bsis in t["basis"].items():
            lines.append(f"  {role}: from {bsis['row']} ({_n(bsis['row_params'])} params) on {d['kind']}, "
                         f"{bsis['backend']}: {_n(bsis['gen'])} generated tok/s, {_n(bsis['train'])} trained tok/s "
                         f"after scaling by parameters (x{bsis['scale']:.3g}); source: {bsis['source']}")
    else:
        lines.append(f"time: {t['why']}")
    return "\n".join(lines)
