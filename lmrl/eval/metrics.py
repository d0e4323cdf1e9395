"""Evaluation formulas as pure functions (no models, no I/O).

Sampled metrics take, per prompt, n samples with a 0/1 correctness (or a score) each:

    pass@k   = E_prompts[1 − C(n−c, k) / C(n, k)]    unbiased estimator, Chen et al. 2021 (Codex), eq. 1
    pass^k   = E_prompts[C(c, k) / C(n, k)]          all k trials succeed, τ-bench (Yao et al. 2024)
    maj@k    = E_prompts[1{majority answer of the first k samples is correct}]        (RLHF book §16, spec §8)
    Avg@k    = mean_j A_j, A_j = mean over prompts of sample j's score; ± std_j(A_j)  (spec §8, "Avg@32")

Judge metrics take verdicts of a model's answers against a baseline's:

    win rate    = (wins + ½·ties) / judged pairs
    LC win rate = σ(a) where logit P(win_i) = a + b·tanh(Δlen_i / sd(Δlen)) is fitted to the verdicts
                  (AlpacaEval 2's length-controlled GLM, Dubois et al. 2024, with one model: the win rate
                  the fit predicts at equal lengths)

Multiple choice by log-likelihood (pretraining-style evals, spec §8): the choice with the largest summed
log-probability, or the largest per-token mean (length-normalised).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k): the probability that at least one of k samples drawn without replacement from n
    (c correct) is correct. Computed as 1 − Π_{i=n−c+1}^{n} (1 − k/i) (Chen et al. 2021, numerically stable)."""
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """C(c, k)/C(n, k): the probability that all k samples drawn without replacement from n are correct."""
    _check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_counts(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k} (draw at least k samples).")


def majority_answer(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent non-None answer; a tie goes to the answer that appeared first. None if all are None."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """1.0 if the majority answer of the first k samples is correct, else 0.0 (one prompt).

    answers: parsed answers of the samples (None: unparsable, never votes); correct: whether each is correct.
    """
    if not 1 <= k <= len(answers) or len(answers) != len(correct):
        raise ValueError(
            f"maj@{k} needs k <= n samples with one correctness flag each, got {len(answers)} answers "
            f"and {len(correct)} flags."
        )
    winner = majority_answer(answers[:k])
    if winner is None:
        return 0.0
    return 1.0 if any(ok for a, ok in zip(answers[:k], correct[:k]) if a == winner) else 0.0


def avg_at_k(scores: Sequence[Sequence[float]], k: int) -> tuple[float, float | None]:
    """(Avg@k, std) over prompts × samples ``scores[i][j]``: A_j = mean_i scores[i][j] for j < k (one full eval per
    sample index), Avg@k = mean_j A_j, std = sqrt(Σ_j (A_j − Avg@k)² / (k − 1)) (None for k = 1)."""
    if not scores or any(len(row) < k for row in scores) or k < 1:
        raise ValueError(f"avg@{k} needs every prompt to have at least k = {k} samples.")
    runs = [sum(row[j] for row in scores) / len(scores) for j in range(k)]
    mean = sum(runs) / k
    if k == 1:
        return mean, None
    return mean, math.sqrt(sum((a - mean) ** 2 for a in runs) / (k - 1))


VERDICT_SCORE = {"A": 1.0, "tie": 0.5, "B": 0.0}
"""A judged pair's outcome for the model (answer A) against the baseline (answer B)."""


def win_rate(verdicts: Sequence[str | None]) -> tuple[float | None, int]:
    """((wins + ½·ties) / judged, judged): verdicts "A" (model wins), "B" (baseline wins), "tie"; None (judge
    failure) is left out. The rate is None when no pair was judged."""
    outcomes = [VERDICT_SCORE[v] for v in verdicts if v is not None]
    return (sum(outcomes) / len(outcomes) if outcomes else None), len(outcomes)


def lc_win_rate(
    verdicts: Sequence[str | None],
    model_lengths: Sequence[float],
    baseline_lengths: Sequence[float],
    l2: float = 1e-4,
    iters: int = 100,
) -> float | None:
    """Length-controlled win rate: σ(a) of the logistic fit logit P(win_i) = a + b·x_i, x_i = tanh(Δ_i / sd(Δ)),
    Δ_i = model length − baseline length, to outcomes y_i ∈ {1, ½, 0} (ties as ½) by Newton's method with a small
    L2 penalty ``l2`` (keeps a separable fit finite). With all Δ_i equal to 0 it is the plain win rate.
    Judge failures (None) are left out; None when nothing was judged."""
    rows = [
        (VERDICT_SCORE[v], m - b)
        for v, m, b in zip(verdicts, model_lengths, baseline_lengths, strict=True)
        if v is not None
    ]
    if not rows:
        return None
    ys = [y for y, _ in rows]
    deltas = [d for _, d in rows]
    mean_d = sum(deltas) / len(deltas)
    sd = math.sqrt(sum((d - mean_d) ** 2 for d in deltas) / len(deltas))
    xs = [math.tanh(d / sd) if sd > 0 else 0.0 for d in deltas]
    a = b = 0.0
    for _ in range(iters):
        ga, gb = -l2 * a, -l2 * b  # gradient of the penalised log-likelihood
        haa, hab, hbb = l2, 0.0, l2  # minus its Hessian
        for y, x in zip(ys, xs):
            p = _sigmoid(a + b * x)
            w = p * (1 - p)
            ga, gb = ga + (y - p), gb + (y - p) * x
            haa, hab, hbb = haa + w, hab + w * x, hbb + w * x * x
        det = haa * hbb - hab * hab
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) + abs(db) < 1e-12:
            break
    return _sigmoid(a)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def choose(choice_logps: Sequence[float], choice_tokens: Sequence[int], normalise: bool) -> int:
    """Index of the chosen option: argmax of Σ log p(choice tokens | context), or with ``normalise`` of that sum
    divided by the choice's token count (a tie goes to the first option)."""
    if not choice_logps or len(choice_logps) != len(choice_tokens) or min(choice_tokens) < 1:
        raise ValueError("choose: one log-prob sum and a token count >= 1 per choice are needed.")
    values = [s / t for s, t in zip(choice_logps, choice_tokens)] if normalise else list(choice_logps)
    return max(range(len(values)), key=lambda i: (values[i], -i))
