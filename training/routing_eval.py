"""RouteLLM's evaluation protocol for a router score, as pure functions.

Prompts at or above a threshold go to the strong model. Sweeping the threshold over the score's
quantiles traces (share of strong calls, quality); PGR is the share of the weak-to-strong quality
gap recovered; APGR is the area under PGR over the strong-call share (random routing: 0.5); CPT(x)
is the smallest strong-call share that recovers x of the gap.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def pgr_curve(score: FloatArray, weak: FloatArray, strong: FloatArray, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """(strong-call share, PGR) for every cut of the prompts sorted by descending score.

    Ties are broken at random (seeded) so a constant score behaves like random routing."""
    n = len(score)
    tiebreak = np.random.default_rng(seed).random(n)
    order = np.lexsort((tiebreak, -score))
    gain = (strong - weak)[order]
    quality = (weak.sum() + np.concatenate([[0.0], np.cumsum(gain)])) / n
    q_weak, q_strong = weak.mean(), strong.mean()
    pgr = (quality - q_weak) / (q_strong - q_weak)
    return np.arange(n + 1) / n, pgr


def apgr(score: FloatArray, weak: FloatArray, strong: FloatArray, seed: int = 0) -> float:
    x, pgr = pgr_curve(score, weak, strong, seed)
    return float(np.trapezoid(pgr, x))


def cpt(score: FloatArray, weak: FloatArray, strong: FloatArray, target: float, seed: int = 0) -> float:
    x, pgr = pgr_curve(score, weak, strong, seed)
    hit = np.nonzero(pgr >= target)[0]
    return float(x[hit[0]]) if len(hit) else 1.0


def bootstrap_apgr(
    score: FloatArray, weak: FloatArray, strong: FloatArray, n_boot: int = 300, seed: int = 0
) -> tuple[float, float]:
    """95% interval of APGR over prompts resampled with replacement."""
    rng = np.random.default_rng(seed)
    vals = []
    for i in range(n_boot):
        idx = rng.integers(0, len(score), len(score))
        if strong[idx].mean() == weak[idx].mean():
            continue
        vals.append(apgr(score[idx], weak[idx], strong[idx], seed=i))
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)
