"""What one training step (and one evaluation) of a run generates, trains on and reads again.

From the algorithm's step plan (``algorithms/step_plan.py``: the turns a step generates and how
each is trained) and roles, the spec's lengths and the benchmark's prompts (measured with the
solver's tokenizer when it can be read offline, else estimated from characters): the generated
turns of a step, the sequences each updated role trains on, and the tokens of each kind as the
trainer counts them (:class:`Work`), all as upper bounds (every turn runs to its
``max_new_tokens``, every trained turn has a gradient).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlmt_bench.errors import UserError
from mlmt_bench.machine.environ import temporary_environ
from mlmt_bench.metrics import cost

if TYPE_CHECKING:
    from mlmt_bench.algorithms.params import LossParams
    from mlmt_bench.algorithms.step_plan import StepPlan, Training
    from mlmt_bench.models.policy_spec import PolicySpec
    from mlmt_bench.spec import RunSpec


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class PlannedPolicy:
    """A policy as the plan sees it: its spec, its architecture, and whether it is updated."""

    role: str
    spec: PolicySpec
    shape: Any  # ModelShape
    lora_params: int
    trains: bool  # updated at some step
    shared: bool = False  # the critic is the solver's model
    base_of: str | None = None  # policies.share_base: the role whose model's frozen weights this adapter sits on

    @property
    def bytes(self) -> int:
        return DTYPE_BYTES[self.spec.dtype]

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
    """One kind of generated turn in a step: who, how many, prompt and generated tokens each, and
    how the step plan trains it (None: not trained)."""

    kind: str
    role: str
    count: int
    prompt: float
    new: int
    training: Training | None = None
    siblings: int = 1  # turns of this kind that share one prompt (G attempts of a problem, K feedbacks of an attempt)
    context: str = ""  # which prompt: "x" (the problem's), else the turn's kind (its own context); "" = the kind

    @property
    def auxiliary(self) -> bool:
        """Trained in an auxiliary term ("sft" / "distill"): no π_old or π_ref pass over it."""
        return self.training is not None and self.training.auxiliary


#: the token counts of a :class:`Work`, in its fields' order
KINDS = ("prefill", "generated", "trained", "forward", "read")


@dataclass
class Work:
    """Tokens per role (as the trainer counts them): prefill and generated of every generated
    sequence, trained sequence tokens (prompt + completion, every epoch), extra forward passes;
    and ``read``, the tokens the update's forward and backward actually read (with
    ``train.share_prompts`` a prompt its siblings share once, else the trained tokens): the time
    estimate uses it, FLOPs stay METHOD's nominal count of ``trained``."""

    prefill: dict[str, float] = field(default_factory=dict)
    generated: dict[str, float] = field(default_factory=dict)
    trained: dict[str, float] = field(default_factory=dict)
    forward: dict[str, float] = field(default_factory=dict)
    read: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, role: str, tokens: float) -> None:
        if tokens:
            d = getattr(self, kind)
            d[role] = d.get(role, 0.0) + tokens

    def plus(self, other: Work) -> Work:
        """The tokens of both, role by role."""
        out = self.scaled(1)
        for kind in KINDS:
            for role, v in getattr(other, kind).items():
                out.add(kind, role, v)
        return out

    def scaled(self, k: float) -> Work:
        return Work(*({r: v * k for r, v in getattr(self, f).items()} for f in KINDS))

    def flops(self, params: dict[str, int]) -> dict[str, float]:
        return {"generation": sum(cost.generation_flops(params[r], int(self.prefill.get(r, 0)), int(v))
                                  for r, v in self.generated.items()),
                "training": sum(cost.training_flops(params[r], int(v)) for r, v in self.trained.items()),
                "forward": sum(cost.forward_flops(params[r], int(v)) for r, v in self.forward.items())}


def sharing_roles(spec: RunSpec, policies: dict[str, PlannedPolicy]) -> frozenset[str]:
    """The roles whose update reads each distinct prompt of a micro-batch once (``train.share_prompts``),
    as ``update.LossConfig.shares`` decides it: not on a model with gradient checkpointing. (Nor under
    FSDP, which a plan does not know of: there it counts the sharing the run will not do.)"""
    if not spec.train.share_prompts:
        return frozenset()
    return frozenset(r for r, p in policies.items() if not p.spec.gradient_checkpointing)


def planned_policies(spec: RunSpec, algorithm: Any) -> dict[str, PlannedPolicy]:
    """The policies the algorithm builds (its roles: trained, frozen, shared with the solver), with
    whether each is updated at some step of the run."""
    from mlmt_bench.models.factory import model_factory
    from mlmt_bench.warmstart.shared_base import BaseConfig

    roles = algorithm.roles()
    updated = set().union(*(algorithm.updates(s) for s in range(min(max(1, spec.train.steps), 1000))))
    out: dict[str, PlannedPolicy] = {}
    base_preset = None if spec.base is None else BaseConfig.model_validate(spec.base).preset
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
        shape = model_factory(pspec.model).shape(role, pspec, base_preset)
        out[role] = PlannedPolicy(role, pspec, shape, shape.lora_params(pspec.lora),
                           mode == "trained" and pspec.trainable and role in updated)
    if spec.policies.share_base:  # one frozen base: every other built role's adapter sits on the first one's
        first, *rest = [r for r, p in out.items() if not p.shared]
        for role in rest:
            out[role].base_of = first
    return out


def _offline_tokenizer(policy: Any) -> Any:
    """The policy's tokenizer if it can be read without a download, else None (its factory says)."""
    from mlmt_bench.models.factory import model_factory

    return model_factory(policy.model).offline_tokenizer(policy)


#: estimate for a tokenizer that cannot be read offline: characters per token, chat-template tokens per message
_CHARS_PER_TOKEN, _TEMPLATE_TOKENS = 4.0, 32


def prompt_lengths(spec: RunSpec) -> Lengths:
    """Mean prompt tokens from up to 256 training problems, measured with the solver's tokenizer when
    it can be read offline, else estimated from characters."""
    from mlmt_bench import registry
    from mlmt_bench.runner import templates_for

    b = spec.benchmark
    why = "empty split"
    try:
        with temporary_environ(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"):  # never download to plan
            bench = registry.benchmarks.get(b.name)(path=b.path, **b.options)
            tpl = templates_for(spec, bench)
            problems = bench.load(b.train_split)[: min(b.train_limit or 256, 256)]
            try:
                n_eval = len(bench.load(b.eval_split))
            except UserError:
                n_eval = None
    except UserError as exc:
        problems, tpl, n_eval, why = [], None, None, str(exc)
    limit = spec.eval.limit or b.eval_limit
    n_eval = min(n_eval, limit) if n_eval is not None and limit else (limit or n_eval)
    if not problems:
        return Lengths(256, 256 + _TEMPLATE_TOKENS, 24 + _TEMPLATE_TOKENS, 24, n_eval,
                       f"guessed (benchmark data not on disk: {why.splitlines()[0][:120]})")
    assert tpl is not None  # set with the problems
    tok = _offline_tokenizer(spec.policies.solver)
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




def step_turns(plan: StepPlan, n: int, lengths: Lengths, t_new: int, t_fb: int) -> list[Turn]:
    """The model-generated turns of one step over ``n`` problems, as ``plan`` declares them (counts
    down its tree, how each is trained), with the prompt the rollout builds for each kind: x; the
    critic's prompt around the attempt; x, z and the feedback (up to ``t_fb`` tokens from the
    critic or the oracle, g∅'s from the null rule) before a refinement."""
    out = []
    feedback = 0.0
    same_feedbacks = 1  # a rule (the oracle, g∅) writes one attempt's K feedbacks alike: its K·M refinements share
    for tp in plan.turns:
        count = plan.count(tp.kind, n)
        siblings = tp.per_parent
        if tp.kind == "feedback":
            feedback = lengths.null_feedback if tp.writer == "null" else t_fb  # oracle text: bounded by t_fb
            prompt, new = lengths.feedback_extra + t_new, t_fb
            same_feedbacks = 1 if tp.generated else tp.per_parent
        elif tp.kind == "refine":
            prompt, new = lengths.attempt + t_new + 1 + lengths.refine_extra + feedback, t_new
            siblings *= same_feedbacks
        else:
            prompt, new = lengths.attempt, t_new
        if tp.generated:
            out.append(Turn(tp.kind, tp.writer, count, prompt, new, tp.training, siblings=siblings,
                            context="x" if tp.kind == "attempt" else tp.kind))
    return out


def trained_sequences(turns: list[Turn], policies: dict[str, PlannedPolicy], lengths: Lengths,
                      problems: int = 1) -> list[Turn]:
    """The sequences each updated role trains on in a step over ``problems`` problems (upper bound:
    every one has a gradient): the turns the step plan trains, in the context it trains them in
    (their own, or x alone), with how many of them share each prompt."""
    out = []
    for t in turns:
        if t.training is None or not (t.role in policies and policies[t.role].trains):
            continue
        own = t.training.context == "own"
        # in x alone, every turn of this kind of one problem shares x: count / problems of them
        siblings = t.siblings if own else max(1, t.count // max(1, problems))
        out.append(Turn(t.kind, t.role, t.count, t.prompt if own else lengths.attempt, t.new, t.training, siblings,
                        t.context if own else "x"))
    return out


def step_work(turns: list[Turn], trained: list[Turn], params: LossParams | None, value_contexts: float,
              share_roles: Collection[str] = ()) -> Work:
    """Tokens of one step as the trainer counts them: prefill and generated per generated turn;
    trained sequences (prompt + completion) every epoch; extra forward passes over them once each
    for π_ref (β > 0, or self_correct's β₂) and π_old (epochs > 1), except over auxiliary ones
    (the update computes neither for "sft" / "distill" items), and a distillation teacher's pass
    over each "distill" turn in its own context; ``value_contexts`` tokens for the learned
    value's features (METHOD.md v2). ``read``: what the update reads of the trained sequences, a
    prompt once per ``siblings`` sequences for a role in ``share_roles`` (:func:`sharing_roles`)."""
    w = Work()
    for t in turns:
        w.add("prefill", t.role, t.count * t.prompt)
        w.add("generated", t.role, t.count * t.new)
    epochs = params.loss_terms().epochs if params is not None else 1
    ref = params is not None and params.needs_reference()
    prompts_read: set[tuple[str, str]] = set()  # (role, context): turns trained in one context share its prompts
    for t in trained:
        seq = t.count * (t.prompt + t.new)
        w.add("trained", t.role, seq * epochs)
        # the auxiliary terms ("sft", "distill") read every row whole (update._auxiliary_sum)
        if t.role in share_roles and not t.auxiliary:
            first = (t.role, t.context or t.kind) not in prompts_read
            prompts_read.add((t.role, t.context or t.kind))
            read = t.count * t.new + (t.count / t.siblings * t.prompt if first else 0.0)
        else:
            read = seq
        w.add("read", t.role, read * epochs)
        if not t.auxiliary:
            w.add("forward", t.role, seq * (int(ref) + int(epochs > 1)))
    for t in turns:  # the teacher reads the turn after its own context, once per step
        if t.training is not None and t.training.teacher and any(tr.kind == t.kind for tr in trained):
            w.add("forward", t.role, t.count * (t.prompt + t.new))
    if value_contexts:
        w.add("forward", "solver", value_contexts)
    return w


def eval_work(plan: StepPlan, e: int, lengths: Lengths, t_new: int, t_fb: int, feedback_metrics: bool) -> Work:
    """One evaluation of ``plan``'s eval program on ``e`` problems (``evaluate.py``): its turns,
    and with feedback metrics g∅'s refinements and the sensitivity's two forwards over each."""
    turns = step_turns(plan, e, lengths, t_new, t_fb)
    w = step_work(turns, [], None, 0)
    program = plan.program()
    if program.feedback in ("critic", "oracle") and feedback_metrics:
        refine = next(t for t in turns if t.kind == "refine")
        null_prompt = refine.prompt - t_fb + lengths.null_feedback
        w.add("prefill", "solver", e * null_prompt)
        w.add("generated", "solver", e * t_new)
        w.add("forward", "solver", e * (refine.prompt + null_prompt + 2 * t_new))  # feedback sensitivity
    return w


def unredacted_work(plan: StepPlan, e: int, lengths: Lengths, t_new: int, t_fb: int, feedback_metrics: bool) -> Work:
    """``feedback.eval_unredacted``'s second pass of the final evaluation (``trainer.py``): the
    same attempts refined again after the same feedbacks (``refine_again``), and the sensitivity's
    two forwards over each new refinement; g∅'s outcomes are the first pass's."""
    w = Work()
    refine = next((t for t in step_turns(plan, e, lengths, t_new, t_fb) if t.kind == "refine"), None)
    if refine is None:
        return w
    w.add("prefill", "solver", refine.count * refine.prompt)
    w.add("generated", "solver", refine.count * refine.new)
    if feedback_metrics:
        null_prompt = refine.prompt - t_fb + lengths.null_feedback
        w.add("forward", "solver", refine.count * (refine.prompt + null_prompt + 2 * t_new))
    return w


def base_critic_work(e: int, lengths: Lengths, t_new: int, t_fb: int, feedback_metrics: bool) -> Work:
    """``eval.base_critic``'s pass of every evaluation of a single-turn arm (``trainer.py``): the
    refine protocol with the frozen start as critic, on the evaluation's own attempts (not
    generated again). The frozen start is the solver's model, so its feedback is counted under the
    solver's role (same parameters, same throughput)."""
    from mlmt_bench.algorithms.step_plan import StepPlan

    w = eval_work(StepPlan.of(1, "critic", train={}), e, lengths, t_new, t_fb, feedback_metrics)
    w.add("prefill", "solver", -e * lengths.attempt)  # the attempts: the evaluation's own
    w.add("generated", "solver", -e * t_new)
    for kind in KINDS:
        d = getattr(w, kind)
        if "critic" in d:
            d["solver"] = d.get("solver", 0.0) + d.pop("critic")
    return w


def evaluations(steps: int, every: int) -> int:
    """Evaluations the trainer runs: before the first step, every ``every`` steps, and after the last."""
    marks = {s for s in range(1, steps + 1) if every and s % every == 0} | ({steps} if steps else set())
    return 1 + len(marks)
