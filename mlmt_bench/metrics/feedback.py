"""Feedback metrics and cost accounting (METHOD.md "Metrics").

Pure functions over per-problem / per-sample arrays (Python sequences or numpy
arrays). Log-probabilities are in nats; token counts are integers; FLOPs are
floating-point operations (approximate, see `flops_estimate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mlmt_bench.verifiers.leaks import LeakKind, is_leak


def feedback_effect(
    correct_with_g: Sequence[float] | np.ndarray, correct_with_null: Sequence[float] | np.ndarray
) -> float:
    """Causal value of feedback: paired mean of acc(y_hat | x, z, g) - acc(y_hat | x, z, g_null).

    correct_with_g:    [N] correctness (bool / 0-1, or a mean reward in [0, 1]) of the
                       refinement given the learned feedback g, per (x, z).
    correct_with_null: [N] the same for the null feedback g_null on the *same* (x, z).
    returns: mean over the N pairs of the difference, in [-1, 1] (accuracy points / 100).
    """
    a = np.asarray(correct_with_g, dtype=float)
    b = np.asarray(correct_with_null, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"need two 1-D arrays of equal length, got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("feedback_effect of no pairs is undefined")
    return float(np.mean(a - b))


def feedback_sensitivity(
    logp_with_g: Sequence[float] | np.ndarray,
    logp_with_null: Sequence[float] | np.ndarray,
    n_tokens: Sequence[int] | np.ndarray,
) -> float:
    """How much the solver listens: mean per-token log pi_L(y|x,z,g) - log pi_L(y|x,z,g_null).

    logp_with_g:    [S] log-prob (nats) of each sampled refinement y (sampled with g),
                    summed over its tokens, under the context with g.
    logp_with_null: [S] log-prob of the same token ids under the context with g_null.
    n_tokens:       [S] number of tokens of each y (> 0).
    returns: mean over the S samples of (logp_g - logp_null) / n_tokens, in nats/token.
             Each sample weighs the same regardless of its length.
    """
    lg = np.asarray(logp_with_g, dtype=float)
    ln = np.asarray(logp_with_null, dtype=float)
    n = np.asarray(n_tokens, dtype=float)
    if lg.ndim != 1 or lg.shape != ln.shape or lg.shape != n.shape:
        raise ValueError(
            f"need three 1-D arrays of equal length, got {lg.shape}, {ln.shape}, {n.shape}"
        )
    if lg.size == 0:
        raise ValueError("feedback_sensitivity of no samples is undefined")
    if (n <= 0).any():
        raise ValueError("n_tokens must be positive for every sample")
    return float(np.mean((lg - ln) / n))


# --------------------------------------------------------------------------- leakage

def leakage_rate(feedbacks: Sequence[str], golds: Sequence[str | None],
                 kind: LeakKind | Callable[[str, str | None], bool | None]) -> float:
    """Share of feedbacks that contain the gold answer (reward hacking by the critic).

    feedbacks: [F] feedback texts; golds: [F] the gold answer of each one's problem (None
    where there is none; ignored for kind "code").
    kind:      a rule of `is_leak`, or a check ``(feedback, gold) -> bool | None`` (a
               verifier's ``leaks``).
    returns: leaked / judged in [0, 1], where judged excludes feedbacks the check returns None
             for (no gold); NaN when nothing could be judged.
    """
    if len(feedbacks) != len(golds):
        raise ValueError(f"{len(feedbacks)} feedbacks but {len(golds)} golds")
    check = kind if callable(kind) else (lambda f, g: is_leak(f, g, kind))
    verdicts = [check(f, g) for f, g in zip(feedbacks, golds)]
    judged = [v for v in verdicts if v is not None]
    if not judged:
        return float("nan")
    return sum(judged) / len(judged)


# --------------------------------------------------------------------------- cost


def feedback_length_stats(
    feedback_token_counts: Sequence[int] | np.ndarray,
    all_generated_token_counts: Sequence[int] | np.ndarray,
) -> dict[str, float | None]:
    """Feedback length and its share of the generation budget.

    feedback_token_counts:      [F] tokens generated per feedback g.
    all_generated_token_counts: [E] tokens generated per episode by every policy (first
                                attempt + feedback + refinement), so it includes the
                                feedback tokens; the two arrays need not align.
    returns: {"feedback_tokens": mean tokens per feedback (None if F = 0),
              "feedback_share": sum(feedback) / sum(all) in [0, 1] (None if sum(all) = 0)}.
    """
    fb = np.asarray(feedback_token_counts, dtype=float)
    total = float(np.sum(np.asarray(all_generated_token_counts, dtype=float)))
    fb_sum = float(fb.sum())
    if fb_sum > total:
        raise ValueError(
            f"feedback tokens ({fb_sum:.0f}) exceed all generated tokens ({total:.0f}); "
            "all_generated_token_counts must include the feedback"
        )
    return {
        "feedback_tokens": float(fb.mean()) if fb.size else None,
        "feedback_share": fb_sum / total if total > 0 else None,
    }


def flops_estimate(params: int, generated_tokens: int, trained_tokens: int) -> float:
    """Approximate compute: 2*P per generated token (forward) + 6*P per trained token
    (forward + backward), P the parameter count of the model that ran. Returns FLOPs.

    Attention FLOPs and prompt (prefill) tokens are ignored unless the caller counts them
    in generated_tokens; call once per model and sum for MLMT's two levels.
    """
    if min(params, generated_tokens, trained_tokens) < 0:
        raise ValueError("params and token counts must be non-negative")
    return 2.0 * params * generated_tokens + 6.0 * params * trained_tokens


# --------------------------------------------------------------------------- copy channel (METHOD v4)


def redacted_share(shares: Sequence[float] | np.ndarray) -> float | None:
    """``feedback/redacted_share``: mean over the feedbacks of the share of each one's characters
    that its benchmark's redaction rule removed (``Redaction.share``, each in [0, 1]).

    shares: [F], one per redacted feedback. returns: their mean in [0, 1]; None when F = 0.
    """
    s = np.asarray(shares, dtype=float)
    if s.ndim != 1:
        raise ValueError(f"need a 1-D array of shares, got shape {s.shape}")
    if s.size and ((s < 0).any() or (s > 1).any()):
        raise ValueError("a redacted share lies in [0, 1]")
    return float(s.mean()) if s.size else None


def critic_as_solver(stated_correct: Sequence[bool | None]) -> dict[str, float]:
    """The critic scored as a second solver: the answer each feedback states
    (``Benchmark.stated_answer``), scored by the verifier directly, with no refinement.

    stated_correct: [F], one per feedback (one per problem in an evaluation): True / False for
                    the verifier's verdict on the stated answer, None where the feedback states none
                    (counted as not solved).
    returns: {"acc_critic_as_solver": share of the F that the stated answer solves,
              "critic_states_answer_rate": share of the F that state an answer}, both in [0, 1].
    """
    n = len(stated_correct)
    if n == 0:
        raise ValueError("critic_as_solver of no feedbacks is undefined")
    return {"acc_critic_as_solver": sum(1 for c in stated_correct if c) / n,
            "critic_states_answer_rate": sum(1 for c in stated_correct if c is not None) / n}


def copy_rate(copied: Sequence[bool | None]) -> float | None:
    """``copy_rate``: share of refinements whose final answer equals a value stated in the feedback
    the refiner was shown (the redacted one under ``feedback.redact``).

    copied: [R], one per refinement: True / False, or None where it cannot be judged (the
            benchmark reads no values from feedback, e.g. code). returns: copied / judged in
            [0, 1]; None when nothing could be judged.
    """
    judged = [c for c in copied if c is not None]
    return sum(judged) / len(judged) if judged else None
