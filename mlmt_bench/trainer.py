"""The training loop every algorithm shares: rollout → value → credit → update → log → eval → checkpoint.

Read it top to bottom: :meth:`Trainer.train` is the whole story; the algorithm (GRPO,
self_correct, MLMT) only decides the roles, the episode program, the credit and who updates
when. Cost is counted as METHOD.md v2 says (mlmt_bench/metrics/cost.py): prompts as prefill,
whole trained sequences, and every extra forward pass.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mlmt_bench.algorithms.base import Algorithm, Credit, CreditInputs, verdict_matches
from mlmt_bench.algorithms.update import LossConfig, update_policy
from mlmt_bench.evaluate import EvalResult, evaluate, generated_clipped, redaction_metrics
from mlmt_bench.fsdp import Sharding
from mlmt_bench.io import eval_memo
from mlmt_bench.io.notes import warn
from mlmt_bench.io.progress import announce, duration
from mlmt_bench.machine import memory
from mlmt_bench.machine.dist import Dist
from mlmt_bench.metrics.completions import truncation_warnings
from mlmt_bench.metrics.cost import forward_flops, rollout_flops, training_flops
from mlmt_bench.models.forward import last_hidden_states
from mlmt_bench.rollout.backend import backend_class
from mlmt_bench.rollout.episodes import Actors, Program, Rollout, Sampling, merge_rollouts, refine_again, rollout
from mlmt_bench.tracking import RunDir
from mlmt_bench.types import Problem

if TYPE_CHECKING:
    from mlmt_bench.models.policy import Policy
    from mlmt_bench.spec import RunSpec


@dataclass
class Counters:
    """Cumulative cost of training so far (saved in checkpoints)."""

    step: int = 0
    gen_tokens: int = 0
    trained_tokens: int = 0
    flops: float = 0.0
    wall_s: float = 0.0


@dataclass
class Trainer:
    spec: RunSpec
    algorithm: Algorithm
    actors: Actors
    policies: dict[str, Policy | None]  # role -> policy ("critic" may be the solver itself, or None)
    train_problems: list[Problem]
    eval_problems: list[Problem]
    run_dir: RunDir
    counters: Counters = field(default_factory=Counters)
    optimizers: dict[int, Any] = field(default_factory=dict)  # id(policy) -> (optimizer, scheduler)
    on_eval: Callable[[dict[str, Any]], None] | None = None  # e.g. a sweep's pruning callback
    dist: Dist = field(default_factory=Dist)  # data parallelism under `accelerate launch`
    base_critic: Policy | None = None  # eval.base_critic: a frozen critic for the single-turn arm's refine evaluation
    after_train: Callable[[Trainer], None] | None = None  # run by the main process on the final policies (a probe)

    def __post_init__(self) -> None:
        t = self.spec.train
        name = self.spec.backend.name  # FSDP under accelerate's fsdp.yaml, if the backend declares it can
        self.sharding = Sharding(self.dist, name, backend_class(name).traits)
        self.sharding.shard(self._trainable())
        for policy in self._trainable():
            opt = torch.optim.AdamW(policy.trainable_parameters(), lr=policy.lr, weight_decay=t.weight_decay)
            self.optimizers[id(policy)] = (opt, _schedule(opt, t.schedule, t.warmup_steps, max(t.steps, 1),
                                                         self.algorithm.params.loss_terms().epochs))
        self.sampling = train_sampling(self.spec)
        self.eval_sampling = eval_sampling(self.spec)
        self._warned: set[str] = set()  # the truncation warnings said (each once a run)
        self.loss_cfg = LossConfig(**dataclasses.asdict(self.algorithm.params.loss_terms()), grad_accum=t.grad_accum,
                                   grad_clip=t.grad_clip, micro_batch_tokens=t.micro_batch_tokens,
                                   share_prompts=t.share_prompts)
        value = self.algorithm.value_model
        if value is not None:  # the run's seed initialises the value model and draws its minibatches (METHOD v4:
            value.seed = self.spec.seed  # with one base for every seed, the seed varies everything after it)
            value.gen.manual_seed(self.spec.seed)  # before its first fit; a resume restores its generator's state

    # ------------------------------------------------------------------------------------------
    def train(self, progress: Any = None) -> dict[str, Any]:
        """Train until ``train.steps`` or a budget (tokens, FLOPs) is spent; returns the final evaluation."""
        t = self.spec.train
        started = time.perf_counter() - self.counters.wall_s
        task = progress.add_task("train", total=100, completed=100 * self.frac_done()) if progress else None

        def say(text: str) -> None:
            if progress:
                progress.update(task, completed=100 * self.frac_done(), description=text)

        def run_eval(final: bool) -> None:  # announced as it starts and when it is done (a gap of a minute else)
            n, at = len(self.eval_problems), self.counters.step
            what = f"evaluating {n} {self.spec.benchmark.eval_split} problems at step {at}"
            say(what)
            announce(progress, what + ("" if at else " (the starting point)") + " ...")
            t0 = time.perf_counter()
            rec = self.evaluate(started, final=final)
            if rec is not None:
                took = duration(time.perf_counter() - t0)
                announce(progress, f"evaluated step {at}: {n}/{n} problems (100%) in {took}, acc@t1 "
                                   f"{rec['acc@t1']:.1%}, acc@t2 {rec['acc@t2']:.1%}")

        if self.eval_due() and self.dist.any(self.dist.is_main and not self.evaluated_here()):
            run_eval(final=self.done())  # step 0, or a resume from a checkpoint whose evaluation did not finish
        while not self.done():
            step = self.counters.step
            problems = self.batch(step)
            torch.manual_seed(_step_seed(self.spec.seed, step) + self.dist.rank)
            plan = self.algorithm.step_plan(step)

            with self.sharding.full_params():  # FSDP: generation and the value pass need whole weights
                with memory.phase("rollout"):
                    ro = rollout(plan.program(), self.actors, problems, self.sampling)
                    ro, resampled = self.dynamic_sampling(step, ro)
                feats, values, value_tokens = self.value_predictions(ro)
            verdict = self.actors.verdict  # Benchmark.feedback_verdict: critic_reward helpfulness+verdict reads it
            matches = verdict_matches(ro, verdict) if verdict is not None and ro.of_kind("feedback") else None
            credit = self.algorithm.credit(ro, step, CreditInputs(self.frac_done(), values,
                                                                  self.sampling.max_new_tokens, matches))
            plan.check(credit.items)  # nothing trains that the plan does not declare

            t0 = time.perf_counter()
            updated, update_stats = self.update(credit, self.algorithm.updates(step))
            train_s = time.perf_counter() - t0
            stats = {**credit.stats, **self.fit_value(ro, feats), **resampled, **redaction_metrics(ro),
                     **generated_clipped(ro)}
            stats = self.dist.mean_each(stats)  # over the processes that have each statistic

            gen = self.count_cost(ro, update_stats, value_tokens)
            if self.dist.enabled:
                stats["replica_spread"] = max(self.dist.replica_spread(p.trainable_parameters())
                                              for p in self._trainable())
            self.counters.wall_s = time.perf_counter() - started
            trained = sum(s.get("trained_tokens", 0) for s in update_stats.values())
            self.run_dir.log_metrics({
                "kind": "train", **self._counters(), **stats, "updated": sorted(updated),
                **{f"{k}/{role}": v for role, s in update_stats.items() for k, v in s.items()},
                **{f"len/{kind}": _mean_len(ro, kind) for kind in ("attempt", "feedback", "refine")},
                "gen_tok_per_s": gen / max(ro.seconds, 1e-9), "train_tok_per_s": trained / max(train_s, 1e-9),
                "peak_mem_mb": memory.TRACKER.peak_mb(), "mem/source": memory.TRACKER.source,
                **memory.TRACKER.take(memory.TRAIN_PHASES, self.dist.max),
            })
            say(f"train step {self.counters.step} r={stats.get('reward_mean', 0):.2f} tok={self.counters.gen_tokens}")
            self.warn_truncation(trained, stats)
            last = self.done()
            if last or (t.checkpoint_every and self.counters.step % t.checkpoint_every == 0):
                self.save_checkpoint()  # before the evaluation: a crash in it resumes into it, not before the step
            if self.eval_due():
                run_eval(final=last)
        final = self.run_dir.metrics()
        evals = [r for r in final if r["kind"] == "eval"]
        summary = {**evals[-1], "kind": "final"} if evals else {"kind": "final", **self._counters()}
        self.run_dir.log_metrics(summary)
        if self.after_train is not None:  # e.g. the feedback probe on the final solver and critic (runner.py)
            with self.sharding.full_params():
                if self.dist.is_main:
                    self.after_train(self)
                self.dist.barrier()
        return summary

    def warn_truncation(self, trained: float, stats: dict[str, Any]) -> None:
        """Say once a run, one line each, that a step trained no token or that more than half of
        its completions hit the length limit (:func:`~mlmt_bench.metrics.completions.truncation_warnings`)."""
        if not self.dist.is_main:
            return
        for key, line in truncation_warnings(self.counters.step, trained, stats).items():
            if key not in self._warned:
                self._warned.add(key)
                warn(line)

    # ------------------------------------------------------------------------------------------
    def dynamic_sampling(self, step: int, ro: Rollout) -> tuple[Rollout, dict[str, float]]:
        """DAPO's dynamic sampling (``dynamic_sampling`` in the algorithm's params): roll out more
        problems, from a second seeded order, until ``problems_per_step`` of them carry a gradient
        (:meth:`Algorithm.informative`) or the rounds run out. Every token generated counts."""
        max_rounds = self.algorithm.params.extra_rollout_rounds()
        if not max_rounds:
            return ro, {}
        want = len(ro.problems)
        rounds = 0
        while len(self.algorithm.informative(ro)) < want and rounds < max_rounds:
            rounds += 1
            extra = self.batch(step, round_=rounds)[: want - len(self.algorithm.informative(ro))]
            ro = merge_rollouts(ro, rollout(self.algorithm.program(step), self.actors, extra, self.sampling))
        return ro, {"dynamic_sampling/rounds": float(rounds),
                    "dynamic_sampling/informative": float(len(self.algorithm.informative(ro)))}

    def value_predictions(self, ro: Rollout) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """The value model's features and predictions for the contexts the algorithm names (a
        forward pass of the current solver), and the tokens that pass read."""
        model = self.algorithm.value_model
        if model is None:
            return None, None, 0
        contexts = self.algorithm.value_contexts(ro)
        if not contexts:
            return None, None, 0
        solver = self.policies["solver"]
        assert solver is not None
        with memory.phase("value"):
            feats = last_hidden_states(solver.model, solver.tokenizer.pad_token_id, contexts,
                                       self.spec.train.micro_batch_tokens, spans=self.algorithm.value_spans(ro))
        return feats, model.predict(feats), sum(len(c) for c in contexts)

    def fit_value(self, ro: Rollout, feats: torch.Tensor | None) -> dict[str, Any]:
        """Fit the value model on this step's refinements (after it was scored on them). Under data
        parallelism every process fits on every process's refinements (in rank order), so the
        value models stay replicas, as the policies do, and the checkpoint's is every process's."""
        model = self.algorithm.value_model
        if model is None:
            return {}
        x, y = None, None
        if feats is not None:
            index, targets = self.algorithm.value_targets(ro)
            x, y = feats[index], targets
        x, y = self.dist.cat_rows(x), self.dist.cat_rows(y)
        return model.fit(x, y) if x is not None and y is not None else {}

    def count_cost(self, ro: Rollout, update_stats: dict[str, dict[str, float]], value_tokens: int) -> int:
        """Add this step's tokens and FLOPs to the counters; returns the tokens generated (all processes)."""
        c = self.counters
        gen_by_role = {role: int(self.dist.sum(n)) for role, n in sorted(ro.gen_tokens.items())}
        prompt_by_role = {role: int(self.dist.sum(n)) for role, n in sorted(ro.prompt_tokens.items())}
        flops = rollout_flops({role: self._params(role) for role in gen_by_role}, prompt_by_role, gen_by_role)
        for role, s in update_stats.items():
            p = self._params(role)
            flops += (training_flops(p, int(s.get("sequence_tokens", 0)))
                      + forward_flops(p, int(s.get("forward_tokens", 0))))
        flops += forward_flops(self._params("solver"), int(self.dist.sum(value_tokens)))
        gen = sum(gen_by_role.values())
        c.step += 1
        c.gen_tokens += gen
        c.trained_tokens += int(sum(s.get("trained_tokens", 0) for s in update_stats.values()))
        c.flops += flops
        return gen

    # ------------------------------------------------------------------------------------------
    def batch(self, step: int, round_: int = 0) -> list[Problem]:
        """This process's problems of ``step``: its share of consecutive slices of a per-epoch seeded
        permutation (so the order depends only on the step: resumable). ``round_ > 0``: the extra
        problems of dynamic sampling, from another permutation per round."""
        n, k = len(self.train_problems), self.spec.train.problems_per_step
        out = []
        for j in range(step * k, step * k + k):
            epoch, pos = divmod(j, n)
            seed = self.spec.seed * 7919 + epoch + 1_000_003 * round_
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
            out.append(self.train_problems[int(perm[pos])])
        return self.dist.shard(out)

    def update(self, credit: Credit, roles: set[str]) -> tuple[set[str], dict[str, dict[str, float]]]:
        """One optimiser update per distinct trainable model (a shared model gets both roles' items)."""
        by_model: dict[int, tuple[str, Any, list, float]] = {}
        for role in sorted(roles):
            policy = self.policies.get(role)
            if policy is None or not policy.trainable or not self.dist.any(bool(credit.items.get(role))):
                continue
            name, _, acc, norm = by_model.get(id(policy), (role, policy, [], 0.0))
            acc.extend(credit.items.get(role, []))
            by_model[id(policy)] = (name, policy, acc, norm + self._max_new(role) * credit.sampled.get(role, 0))
        stats, updated = {}, set()
        for name, policy, its, norm in by_model.values():
            opt, sched = self.optimizers[id(policy)]
            stats[name] = update_policy(policy, opt, sched, its, self.loss_cfg, self.dist, constant_norm=norm)
            self.actors.backend.sync_weights(policy.model)  # generation engines see the new weights
            updated |= {r for r in roles if self.policies.get(r) is policy}
        return updated, stats

    def _max_new(self, role: str) -> int:
        """The longest turn ``role`` may generate: the constant of ``constant_norm``."""
        return self.sampling.feedback_max_new_tokens if role == "critic" else self.sampling.max_new_tokens

    def evaluate(self, started: float, final: bool = False) -> dict[str, Any] | None:
        """Held-out evaluation on the main process (the others wait). ``final``: the run's last
        evaluation, which logs every problem's episode when ``eval.final_samples`` is on."""
        with self.sharding.full_params():  # FSDP: every process gathers the weights, the main one evaluates
            return self._evaluate(started, final)

    def _evaluate(self, started: float, final: bool) -> dict[str, Any] | None:
        if not self.dist.is_main:
            self.dist.barrier()
            return None
        e = self.spec.eval
        with memory.phase("eval"):
            res = self._evaluate_once(self.algorithm.eval_program(), self.actors,
                                      len(self.eval_problems) if final and e.final_samples else e.samples,
                                      keep_attempts=self.base_critic is not None)
            extra, rows = self._evaluate_with_base_critic(res, final)
            unredacted, by_pid = self._evaluate_unredacted(res, self.algorithm.eval_program(), self.actors, final)
            extra = {**extra, **{f"unredacted/{k}": v for k, v in unredacted.items()}}
            rows = [{**row, "t2_unredacted": u} for row, u in zip(rows, by_pid)] if by_pid else rows
        self.counters.wall_s = time.perf_counter() - started
        test_flops = rollout_flops({role: self._params(role) for role in res.gen_tokens}, res.prompt_tokens,
                                   res.gen_tokens)  # METHOD v4: test-time compute beside training's
        record = {"kind": "eval", **self._counters(), **res.metrics, "test_flops_eval": test_flops, **extra,
                  **memory.TRACKER.take(("eval",))}
        self.run_dir.log_eval_problems([{"step": self.counters.step, "gen_tokens": self.counters.gen_tokens, **row}
                                        for row in rows])
        for s in res.samples:
            self.run_dir.log_sample({"step": self.counters.step, **s})
        self.run_dir.log_metrics(record)  # last: the record says the evaluation's rows are all written
        if self.on_eval is not None:
            self.on_eval(record)
        self.dist.barrier()
        return record

    def _evaluate_with_base_critic(self, first: EvalResult, final: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Equal test-time compute (METHOD v3, ``eval.base_critic``): the single-turn arm's solver in
        the refine protocol with the frozen base as critic, on ``first``'s own attempts (not
        generated again). Its metrics are logged under ``base_critic/``; each problem row gains
        ``t2_base_critic``, and, where the final evaluation is repeated without redaction
        (:meth:`_evaluate_unredacted`), ``base_critic/unredacted/`` and ``t2_base_critic_unredacted``."""
        rows = first.per_problem
        if self.base_critic is None:
            return {}, rows
        actors = dataclasses.replace(self.actors, critic=self.base_critic)
        program = Program(attempts=1, feedback="critic")
        res = self._evaluate_once(program, actors, 0, "base_critic", first.rollout)
        extra = {f"base_critic/{k}": v for k, v in res.metrics.items() if k != "n"}
        params = {"solver": self._params("solver"), "critic": self.base_critic.n_params}
        extra["base_critic/test_flops_eval"] = rollout_flops(params, res.prompt_tokens, res.gen_tokens)
        unredacted, by_pid = self._evaluate_unredacted(res, program, actors, final, params)
        extra.update({f"base_critic/unredacted/{k}": v for k, v in unredacted.items()})
        return extra, [{**row, "t2_base_critic": bc["t2"],
                        **({"t2_base_critic_solver": bc["t2_critic_solver"]} if "t2_critic_solver" in bc else {}),
                        **({"t2_base_critic_unredacted": by_pid[i]} if by_pid else {})}
                       for i, (row, bc) in enumerate(zip(rows, res.per_problem))]

    def _evaluate_once(self, program: Program, actors: Actors, n_samples: int, which: str = "eval",
                       attempts_of: Rollout | None = None, keep_attempts: bool = False) -> EvalResult:
        """``evaluate`` of ``program`` on the eval problems, read from the memo of step-0 evaluations
        (:mod:`mlmt_bench.io.eval_memo`) where this run starts from weights, problems and settings an
        earlier run evaluated greedily. A read one is recorded in the manifest's ``eval_memo``
        (``{which: key}``), one this run stored in ``eval_memo_stored`` (``report --raw`` publishes
        both): the logged metrics are the same either way. ``attempts_of``: an
        evaluation's rollout whose attempts this one refines (``rollout``'s ``attempts_of``);
        ``keep_attempts``: a later pass will (the base critic's)."""
        e = self.spec.eval

        def run(n: int) -> EvalResult:
            episodes = None
            if attempts_of is not None:
                episodes = rollout(program, actors, self.eval_problems, self.eval_sampling, attempts_of=attempts_of)
            return evaluate(program, actors, self.eval_problems, self.eval_sampling,
                            feedback_metrics=e.feedback_metrics, n_samples=n, protocols=e.protocols,
                            micro_batch_tokens=self.spec.train.micro_batch_tokens, episodes=episodes,
                            keep_attempts=keep_attempts)

        key = self._memo_key(program, actors)
        res, read = eval_memo.evaluate_once(key, n_samples, len(self.eval_problems), run, EvalResult)
        entry = eval_memo.entry_path(key) if key is not None and not read else None
        stored = entry is not None and entry.is_file()
        if read or stored:
            field = "eval_memo" if read else "eval_memo_stored"
            self.run_dir.update_manifest(**{field: {**(self.run_dir.manifest().get(field) or {}), which: key}})
        return res

    def _memo_key(self, program: Program, actors: Actors) -> str | None:
        """The memo key of a step-0 greedy evaluation (None: none applies; :func:`eval_memo.memo_key`)."""
        e, spec = self.spec.eval, self.spec
        if self.counters.step or self.counters.gen_tokens or e.temperature or not e.memo or self.sharding.enabled:
            return None  # FSDP: the parameters are shards (DTensors), not the weights to key by
        roles = {"solver": actors.solver, **({"critic": actors.critic} if actors.critic is not None else {})}
        identities = {role: eval_memo.actor_identity(a) for role, a in roles.items()}
        if any(i is None for i in identities.values()):
            return None
        return eval_memo.memo_key({
            "program": dataclasses.asdict(program), "actors": identities,
            "problems": [[p.id, p.prompt, p.answer] for p in self.eval_problems],
            "sampling": dataclasses.asdict(self.eval_sampling), "feedback_metrics": e.feedback_metrics,
            "protocols": list(e.protocols), "micro_batch_tokens": spec.train.micro_batch_tokens,
            "templates": dataclasses.asdict(actors.templates), "redact": actors.redact is not None,
            "benchmark": spec.benchmark.model_dump(mode="json"), "feedback": spec.feedback.model_dump(mode="json"),
            "backend": spec.backend.model_dump(mode="json"), "autocast": [torch.is_autocast_enabled("cpu"),
                                                                          str(torch.get_autocast_dtype("cpu"))]})

    def _evaluate_unredacted(self, first: EvalResult, program: Program, actors: Actors, final: bool,
                             params: dict[str, int] | None = None) -> tuple[dict[str, Any], list[bool]]:
        """METHOD v4 (``feedback.eval_unredacted``): the final evaluation ``first`` (of ``program``
        by ``actors``) repeated with redaction off, on the same policies and problems (the report's
        ``<arm> without redaction`` row; for ``eval.base_critic``, ``<arm> + base critic without
        redaction``). Returns its metrics (the caller logs them under its prefix, with
        ``test_flops_eval`` at ``params``, default the run's roles) and each problem's t2; ({}, [])
        when there is nothing to repeat. The repeat refines ``first``'s own attempts after the same
        feedbacks, shown as written (:func:`refine_again`; g∅'s outcomes are ``first``'s): only the
        refinements are generated again, and the two rows differ by what the refiner was shown and
        nothing else."""
        if not (final and self.spec.feedback.eval_unredacted and actors.redact is not None
                and program.feedback in ("critic", "oracle")):
            return {}, []
        e = self.spec.eval
        actors = dataclasses.replace(actors, redact=None)
        episodes = nulls = None
        if first.rollout is not None:  # None: read from the step-0 memo, so evaluated afresh
            episodes = refine_again(program, first.rollout, actors, self.eval_sampling)
            known = [row["t2_null"] for row in first.per_problem]
            nulls = None if None in known else known
        res = evaluate(program, actors, self.eval_problems, self.eval_sampling,
                       feedback_metrics=e.feedback_metrics, n_samples=0, protocols=e.protocols,
                       micro_batch_tokens=self.spec.train.micro_batch_tokens, episodes=episodes, null_outcomes=nulls)
        metrics = {k: v for k, v in res.metrics.items() if k != "n"}
        metrics["test_flops_eval"] = rollout_flops(params or {role: self._params(role) for role in res.gen_tokens},
                                                   res.prompt_tokens, res.gen_tokens)
        return metrics, [bool(u["t2"]) for u in res.per_problem]

    # checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        # id(policy) -> (model state or None, optimiser state); FSDP gathers them on every process
        states = {k: self.sharding.full_state(self._by_id(k), o) for k, (o, _) in self.optimizers.items()}
        if not self.dist.is_main:
            self.dist.barrier()
            return None
        tmp = self.run_dir.begin_checkpoint(self.counters.step)
        try:
            self._write_checkpoint(tmp, states)
        except BaseException as exc:
            self.run_dir.discard_checkpoint(tmp)  # a full disk leaves no half checkpoint behind
            from mlmt_bench.io.checkpoint_state import os_error_of

            os_error = os_error_of(exc)
            if os_error is not None and os_error is not exc:  # safetensors' own error for a full disk
                raise os_error from None
            raise
        path = self.run_dir.commit_checkpoint(tmp, self.counters.step)
        self.run_dir.prune_checkpoints(self.spec.train.keep_checkpoints, self.counters.step)
        self.dist.barrier()
        return path

    def _write_checkpoint(self, tmp: Path, states: dict[int, Any]) -> None:
        saved: dict[int, str] = {}
        for role, policy in self.policies.items():
            if policy is None or id(policy) in saved:
                continue
            policy.save(tmp / role, states.get(id(policy), (None, None))[0])
            saved[id(policy)] = role
        from mlmt_bench.io.checkpoint_state import save_state

        save_state(tmp, {  # safetensors + JSON: loading it back runs no code (mlmt_bench/io/checkpoint_state.py)
            "counters": self.counters.__dict__,
            "optimizers": {saved[k]: (states[k][1], s.state_dict() if s else None)
                           for k, (o, s) in self.optimizers.items()},
            "algorithm": self.algorithm.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
        })

    def load_checkpoint(self, ckpt: Path) -> None:
        """Continue from ``ckpt``. Everything is checked before anything is loaded: a checkpoint
        that is not intact (:meth:`check_checkpoint`) is a UserError that leaves the trainer as it
        was, so that a resume can try an older one."""
        state, counters = self.check_checkpoint(ckpt)
        loaded: set[int] = set()
        for role, policy in self.policies.items():
            if policy is None or id(policy) in loaded or not (ckpt / role).exists():
                continue
            self.sharding.load_weights(policy, ckpt / role)
            self.actors.backend.sync_weights(policy.model)
            loaded.add(id(policy))
        for role, (opt_state, sched_state) in state["optimizers"].items():
            opt, sched = self.optimizers[id(self.policies[role])]
            self.sharding.load_optimizer(self.policies[role], opt, opt_state)
            if sched is not None and sched_state is not None:
                sched.load_state_dict(sched_state)
        self.algorithm.load_state_dict(state["algorithm"])
        self.counters = counters
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])

    def check_checkpoint(self, ckpt: Path) -> tuple[dict[str, Any], Counters]:
        """(trainer state, counters) of ``ckpt`` if it is intact: the state file parses and holds
        every section, its optimisers are this run's trained policies, and each trained policy's
        weights (and any other policy's that are there) are complete safetensors files. A one-line
        UserError naming the first thing missing or corrupt otherwise."""
        from mlmt_bench.errors import UserError
        from mlmt_bench.io.checkpoint_state import check_state, check_weights, load_state

        state = load_state(ckpt)  # no pickle: data only, whoever wrote the run directory
        check_state(ckpt, state)
        trained = {role for role, p in self.policies.items() if p is not None and id(p) in self.optimizers}
        unknown = sorted(str(r) for r in state["optimizers"] if r not in trained)
        if unknown or any(not isinstance(v, (tuple, list)) or len(v) != 2 for v in state["optimizers"].values()):
            raise UserError(f"{ckpt}: its optimiser state is not this run's (roles {unknown or 'malformed'}; "
                            f"trained here: {sorted(trained)})")
        seen: set[int] = set()
        for role, policy in self.policies.items():
            if policy is not None and id(policy) not in seen and (role in trained or (ckpt / role).exists()):
                check_weights(ckpt / role, policy.is_lora)
                policy.check_weights_fit(ckpt / role)  # names, shapes and dtypes of this run's model
                seen.add(id(policy))
        try:
            counters = Counters(**state["counters"])
        except TypeError:
            raise UserError(f"{ckpt}: malformed counters in the checkpoint state") from None
        named = ckpt.name.removeprefix("step-")
        if not named.isdigit() or counters.step != int(named):  # a state moved or planted under another step
            raise UserError(f"{ckpt}: its trainer state is at step {counters.step}, not the step its name says")
        return state, counters

    # helpers ----------------------------------------------------------------------------------
    def _trainable(self) -> list[Policy]:
        seen, out = set(), []
        for p in self.policies.values():
            if p is not None and p.trainable and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _by_id(self, key: int) -> Policy:
        return next(p for p in self._trainable() if id(p) == key)

    def _params(self, role: str) -> int:
        p = self.policies.get(role)
        return p.n_params if p is not None else 0

    def eval_due(self) -> bool:
        """Whether the step reached (``counters.step``) is evaluated: step 0, the last step, and every
        ``eval.every`` steps."""
        every, step = self.spec.eval.every, self.counters.step
        return step == 0 or self.done() or bool(every and step % every == 0)

    def evaluated_here(self) -> bool:
        """Whether the run directory holds an evaluation of the step reached (a resumed run whose
        checkpoint was saved before an evaluation that then finished)."""
        step = self.counters.step
        return any(r.get("kind") == "eval" and r.get("step") == step for r in self.run_dir.metrics())

    def done(self) -> bool:
        """``train.steps`` taken, or a budget (generated tokens, FLOPs) spent."""
        return self.frac_done() >= 1.0

    def frac_done(self) -> float:
        """Share of training done: steps, or the share of a budget spent, whichever is further."""
        t, c = self.spec.train, self.counters
        f = c.step / t.steps if t.steps else 1.0
        if t.token_budget:
            f = max(f, c.gen_tokens / t.token_budget)
        if t.flop_budget:
            f = max(f, c.flops / t.flop_budget)
        return min(f, 1.0)

    def _counters(self) -> dict[str, Any]:
        c = self.counters
        return {"step": c.step, "gen_tokens": c.gen_tokens, "trained_tokens": c.trained_tokens,
                "flops": c.flops, "wall_s": round(c.wall_s, 3)}


def training_temperatures(spec: RunSpec) -> dict[str, float]:
    """Each role's sampling temperature in training (METHOD v3): ``policies.<role>.temperature``,
    else ``backend.temperature``."""
    default = spec.backend.temperature
    solver, critic = spec.policies.solver, spec.policies.critic
    return {"solver": default if solver.temperature is None else solver.temperature,
            "critic": default if critic is None or critic.temperature is None else critic.temperature}


def train_sampling(spec: RunSpec) -> Sampling:
    """How training rollouts sample: each role at its training temperature
    (:func:`training_temperatures`), the backend's top-p, token limits and stop strings."""
    b = spec.backend
    temps = training_temperatures(spec)
    return Sampling(temps["solver"], b.top_p, b.max_new_tokens, b.feedback_max_new_tokens or b.max_new_tokens,
                    b.stop, feedback_temperature=temps["critic"])


def eval_sampling(spec: RunSpec) -> Sampling:
    """How evaluation samples (both roles): ``eval.temperature`` (default greedy), top-p 1, the
    backend's token limits and stop strings."""
    b = spec.backend
    return Sampling(spec.eval.temperature, 1.0, b.max_new_tokens, b.feedback_max_new_tokens or b.max_new_tokens, b.stop)


def _schedule(opt: Any, kind: str, warmup: int, total_steps: int, epochs: int) -> Any:
    """LR multiplier per optimiser step: linear warmup, then constant or cosine to 0."""
    import math

    total = total_steps * epochs

    def factor(i: int) -> float:
        if warmup and i < warmup:
            return (i + 1) / warmup
        if kind == "cosine":
            progress = min(1.0, (i - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**31 - 1)


def _mean_len(ro: Any, kind: str) -> float | None:
    lens = [len(t.ids) for t in ro.turns if t.kind == kind and t.ids]
    return sum(lens) / len(lens) if lens else None
