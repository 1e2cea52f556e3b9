"""The value probe (METHOD v4, "Value gate"): can the learned value V_L(x, z, g) predict r2 at all?

The v3 audit fitted the value model's input (one hidden state at the last context token) on
4,096 base rollouts and found held-out explained variance −0.006: a value term with no signal.
This probe repeats that measurement on any spec's starting policies: it rolls out ``rows``
episodes (attempt, the critic's feedback, one refinement) on training problems at the training
temperatures, computes the solver's features of every refinement context once, and fits a fresh
:class:`~mlmt_bench.algorithms.value.ValueModel` per feature set on 80% of the problems, scoring
it on the other 20% (:func:`~mlmt_bench.algorithms.value.holdout_explained_variance`)::

    train problems ──rollout (G attempts, 1 feedback, 1 refinement each)──▶ contexts (x, z, g), r2
        ──solver forward──▶ features: last (v3) │ feedback_pool (v4: + mean over g's tokens)
        ──fit on 80% of problems──▶ held-out EV on 20%

A report states a learned-vs-none result only for runs whose mean EV reaches 0.1; this probe
says, before any run, whether the features could get there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from mlmt_bench.algorithms.value import VALUE_FEATURES, holdout_explained_variance, refinement_contexts
from mlmt_bench.errors import UserError
from mlmt_bench.models.forward import last_hidden_states
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, rollout
from mlmt_bench.types import Problem

#: METHOD v4: the probe fits on at least this many rollouts
MIN_ROWS = 4000
#: problems per rollout call (bounded generation memory)
CHUNK_PROBLEMS = 64


def value_probe(actors: Actors, problems: Sequence[Problem], sampling: Sampling, *, rows: int = 4096,
                group_size: int = 8, seed: int = 0, steps: int = 1000, micro_batch_tokens: int | None = None,
                bar: Any = None) -> dict[str, Any]:
    """Roll out ``rows`` episodes (``group_size`` attempts on each of the first ``ceil(rows /
    group_size)`` of ``problems``, one feedback and one refinement each) and fit the value on each
    feature set (:data:`~mlmt_bench.algorithms.value.VALUE_FEATURES`), held out by problem.

    Returns ``rows`` (refinements), ``problems``, ``r2_mean`` (mean refinement reward),
    ``features`` ({name: :func:`holdout_explained_variance`'s result}), ``steps``, ``seed`` and
    ``seconds`` (wall, rollouts included)."""
    need = math.ceil(rows / group_size)
    if len(problems) < need:
        raise UserError(f"value probe: {rows} rollouts at {group_size} attempts a problem need {need} training "
                        f"problems, the benchmark has {len(problems)}")
    import torch

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    feats, targets, groups = [], [], []
    task = bar.add_task("value probe: rollouts", total=need) if bar is not None else None
    solver = actors.solver
    for start in range(0, need, CHUNK_PROBLEMS):
        chunk = list(problems[start:min(start + CHUNK_PROBLEMS, need)])
        ro = rollout(Program(attempts=group_size, feedback="critic"), actors, chunk, sampling)
        contexts, spans = refinement_contexts(ro, "feedback_pool")
        with torch.no_grad():
            feats.append(last_hidden_states(solver.model, solver.tokenizer.pad_token_id, contexts,
                                            micro_batch_tokens, spans=spans))
        for f in ro.of_kind("feedback"):
            refine = ro.turns[ro.turns[f].children[0]]
            targets.append(float(refine.scored_reward))
            groups.append(start + refine.problem)
        if bar is not None:
            bar.update(task, advance=len(chunk))
    x, y = torch.cat(feats)[:rows], torch.tensor(targets[:rows])
    groups = groups[:rows]
    width = x.shape[1] // 2  # feedback_pool: [last | pooled]; last alone is its first half
    by_kind = {"last": x[:, :width], "feedback_pool": x}
    assert set(by_kind) == set(VALUE_FEATURES)
    return {"rows": len(y), "problems": len(set(groups)), "r2_mean": float(y.mean()),
            "features": {k: holdout_explained_variance(v, y, groups, steps=steps, seed=seed)
                         for k, v in by_kind.items()},
            "steps": steps, "seed": seed, "seconds": round(time.perf_counter() - t0, 2)}
