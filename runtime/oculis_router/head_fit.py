"""Fits a complexity head on a user's own labelled outcomes: `oculis classifier fit`. Pure functions.

Never imported by the router at serve time (it needs scipy); the head it writes is an ordinary `.npz`
that `classify.Head.load` reads with numpy alone, and it is scored by the same per-request path as the
packaged head: one tokenisation, a gather, a mean over word pieces, blended with length.

The model, warm-started from the base (packaged) head:

    logit P(strong right and weak wrong) = a * base_z + ell * len_z + c + mean over the prompt's pieces of d[piece]

`base_z` is the base head's own score, standardised on the user's prompts, so with d = 0 the fit
only re-weighs the base and length (a is pulled towards 1 and ell towards 0); `d` is a per-piece
correction, L2-penalised towards 0 (i.e. towards the base head), learnt only for pieces that occur
in the suite. Because everything is linear after
the mean, it folds back into one weight per piece plus a length weight: the head format does not
change. RouteLLM's lesson (and ours, `bench/classifier_quality.py`): on topics a router never saw it
is near random, and a few hundred in-domain labels lift it; the piece corrections are where the
topic's vocabulary gets its weight.

The penalty is fixed (chosen once on the shared split, see PENALTY), so the cross-validated APGR of
base vs fitted printed for a user's suite involves no choice made on that suite. Folds are random
(the suite's own topics: what the route will serve) and, where lines carry a `group` (e.g. a subject),
also grouped (new topics: what the head does on traffic unlike the suite).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oculis_router.classify import Head, Pieces

FloatArray = NDArray[np.float64]
# L2 on the per-piece corrections, as a prior over the whole suite (sum of log-losses + PENALTY/2 |d|^2;
# on the mean-over-pieces scale a topic word in a 100-piece prompt needs a large correction, so it is
# small). Chosen on the packaged head's subject folds 0-3 of the shared split (fit on 5/20/50% of each
# unseen subject's rows, scored on the rest; fold 4 kept out): 3e-5 per row at ~440 rows won or tied
# at every label count, smaller did better with more rows and larger with fewer, as a fixed prior
# predicts; an inner-CV choice per fit was noisier (APGR on a few hundred rows jumps between grid ends).
PENALTY = 0.013
FOLDS = 5
KNOTS = 101
MIN_ROWS = 40
# Pull of the base weight towards 1 and the extra length weight towards 0: with a few hundred labels
# the two dense weights swing with noise (an unpulled fit lost to the base on one of four folds);
# chosen on the same folds 0-3 as PENALTY.
TAU = 44.0  # 0.1 per row at ~440 rows, like PENALTY


@dataclass(frozen=True)
class Suite:
    """Labelled prompts: what each was seen as by the router, and whether each model was right."""

    pieces: list[Pieces]
    weak: NDArray[np.bool_]
    strong: NDArray[np.bool_]
    groups: NDArray[np.str_] | None  # e.g. a subject per line; None when no line says

    @property
    def target(self) -> FloatArray:
        """Where routing to the strong model gains: it is right and the weak one is wrong."""
        out: FloatArray = (self.strong & ~self.weak).astype(np.float64)
        return out

    def subset(self, idx: NDArray[np.int64]) -> Suite:
        return Suite([self.pieces[i] for i in idx], self.weak[idx], self.strong[idx],
                     None if self.groups is None else self.groups[idx])


@dataclass(frozen=True)
class Design:
    """The fit's inputs for some prompts: the piece-mean matrix and the two dense features."""

    x: Any  # scipy.sparse CSR, (n, vocab): 1/len per piece occurrence (the mean the router takes)
    base_raw: FloatArray  # the base head's final score
    len_z: FloatArray  # the base head's standardised log length


@dataclass(frozen=True)
class Fitted:
    a: float  # weight of the standardised base score
    ell: float  # extra weight of length
    c: float
    d: FloatArray  # (vocab,) per-piece corrections
    base_mu: float  # standardisation of the base score, on the training prompts
    base_sd: float
    penalty: float

    def logit(self, z: Design) -> FloatArray:
        out: FloatArray = (self.a * (z.base_raw - self.base_mu) / self.base_sd + self.ell * z.len_z + self.c
                           + z.x @ self.d)
        return out


def design(base: Head, pieces: Sequence[Pieces]) -> Design:
    from scipy import sparse

    vocab = base.token_weights.shape[1]
    lens = np.array([len(p.ids) for p in pieces], dtype=np.int64)
    cols = np.concatenate([p.ids for p in pieces]) if len(pieces) else np.zeros(0, np.int64)
    rows = np.repeat(np.arange(len(pieces)), lens)
    vals = np.repeat(1.0 / np.maximum(lens, 1), lens)
    x = sparse.csr_matrix((vals, (rows, cols)), shape=(len(pieces), vocab))
    x.sum_duplicates()
    base_raw = np.empty(len(pieces))
    len_z = np.empty(len(pieces))
    for i, p in enumerate(pieces):
        len_z[i] = (math.log1p(p.n_len) - base.len_mu) / base.len_sd
        base_raw[i] = base.raw(p.ids, p.n_len)[0] if len(p.ids) else (1 - base.blend) * len_z[i]
    return Design(x, base_raw, len_z)


def _take(z: Design, idx: NDArray[np.int64]) -> Design:
    return Design(z.x[idx], z.base_raw[idx], z.len_z[idx])


def fit(z: Design, y: FloatArray, penalty: float, fixed: tuple[float, float] | None = None,
        base_std: tuple[float, float] | None = None) -> Fitted:
    """Penalised logistic regression by L-BFGS; `fixed` pins (a, l) (fold heads share the final
    head's length weight, which the head format has once)."""
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    mu, sd = base_std or (float(z.base_raw.mean()), float(z.base_raw.std()) or 1.0)
    used = np.unique(z.x.indices)
    xu = z.x[:, used]
    xut = xu.T.tocsr()
    dense = np.stack([(z.base_raw - mu) / sd, z.len_z, np.ones(len(y))], axis=1)
    n = len(y)
    k = 1 if fixed else 3
    offset = dense[:, :2] @ np.array(fixed) if fixed else 0.0
    # Priors are per suite, not per row: on the mean loss they weaken as rows grow, so a small suite
    # stays near the base head and a large one may move far from it.
    lam, tau = penalty / n, TAU / n

    def loss(theta: FloatArray) -> tuple[float, FloatArray]:
        head, d = theta[:k], theta[k:]
        f = offset + (dense[:, 2:] if fixed else dense) @ head + xu @ d
        # -[y log s(f) + (1-y) log s(-f)], stable for any f
        value = -float(np.sum(y * log_expit(f) + (1 - y) * log_expit(-f))) / n + 0.5 * lam * float(d @ d)
        g = (expit(f) - y) / n
        grad = np.concatenate([(dense[:, 2:] if fixed else dense).T @ g, xut @ g + lam * d])
        if not fixed:
            pull = head[:2] - np.array([1.0, 0.0])
            value += 0.5 * tau * float(pull @ pull)
            grad[:2] += tau * pull
        return value, grad

    theta0 = np.zeros(k + len(used))
    if not fixed:
        theta0[0] = 1.0  # start at the base head
    res = minimize(loss, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 500})
    d = np.zeros(z.x.shape[1])
    d[used] = res.x[k:]
    a, ell = fixed if fixed else (float(res.x[0]), float(res.x[1]))
    return Fitted(a, ell, float(res.x[k - 1]), d, mu, sd, penalty)


def folds_of(n: int, groups: NDArray[np.str_] | None, k: int, seed: int) -> NDArray[np.int64]:
    """Fold index per row: whole groups per fold (largest first, into the smallest fold) when
    `groups` is given, else a seeded random split."""
    out = np.empty(n, dtype=np.int64)
    if groups is None:
        out[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
        return out
    names, counts = np.unique(groups, return_counts=True)
    sizes = np.zeros(k)
    for j in np.lexsort((names, -counts)):
        f = int(np.argmin(sizes))
        out[groups == names[j]] = f
        sizes[f] += counts[j]
    return out


def cross_validate(z: Design, suite: Suite, grouped: bool, penalty: float = PENALTY,
                   seed: int = 0) -> dict[str, FloatArray]:
    """Out-of-fold scores of the base head, prompt length and the fitted head."""
    y = suite.target
    fold = folds_of(len(y), suite.groups if grouped else None, FOLDS, seed)
    oof = np.empty(len(y))
    for f in range(FOLDS):
        tr, te = np.nonzero(fold != f)[0], np.nonzero(fold == f)[0]
        oof[te] = fit(_take(z, tr), y[tr], penalty).logit(_take(z, te))
    return {"base": z.base_raw, "prompt length": z.len_z, "fitted": oof}


def to_head(base: Head, final: Fitted, folds: list[Fitted], z: Design, meta: dict[str, str]) -> Head:
    """Folds a fit (and its fold fits, for confidence) back into the head format."""
    b0, mu0, sd0 = float(base.biases[0]), base.emb_mu, base.emb_sd
    w0 = base.token_weights[0].astype(np.float64)

    def row(f: Fitted) -> tuple[FloatArray, float]:
        scale = f.a * base.blend / (f.base_sd * sd0)
        bias = f.a * base.blend * (b0 - mu0) / (f.base_sd * sd0) - f.a * f.base_mu / f.base_sd + f.c
        return scale * w0 + f.d, bias

    alpha = final.a * (1 - base.blend) / final.base_sd + final.ell  # the length weight, in logit units
    s = abs(alpha) + 1.0
    blend = s / (s + alpha)  # raw = (alpha * len_z + mean w + bias) / (s + alpha): same order as the logit
    rows = [row(f) for f in [final, *folds]]
    weights = np.stack([w for w, _ in rows]).astype(np.float16).astype(np.float32)  # half the file
    biases = np.array([b for _, b in rows])
    emb = np.stack([z.x @ weights[i].astype(np.float64) for i in range(len(rows))], axis=1) + biases
    raw = (1 - blend) * z.len_z[:, None] + blend * emb / s
    knots = np.maximum.accumulate(np.quantile(raw[:, 0], np.linspace(0, 1, KNOTS)))
    spread = np.interp(raw[:, 1:], knots, np.linspace(0, 1, KNOTS)).std(axis=1) if len(folds) > 1 else np.ones(1)
    return Head(token_weights=weights, biases=biases, len_mu=base.len_mu, len_sd=base.len_sd, emb_mu=0.0,
                emb_sd=s, blend=blend, knots=knots, spread_ref=max(float(np.quantile(spread, 0.9)), 1e-3),
                meta=meta)


def fit_head(base: Head, suite: Suite, penalty: float = PENALTY, seed: int = 0) -> tuple[Head, Fitted]:
    """The final head on all rows, with one fold head per fold (their disagreement is `confidence`)."""
    z = design(base, suite.pieces)
    y, pen = suite.target, penalty
    final = fit(z, y, pen)
    fold = folds_of(len(y), suite.groups, FOLDS, seed)
    folds = [fit(_take(z, np.nonzero(fold != f)[0]), y[fold != f], pen, fixed=(final.a, final.ell),
                 base_std=(final.base_mu, final.base_sd)) for f in range(FOLDS)]
    meta = {"target": "strong correct and weak wrong", "rows": str(len(y)), "penalty": f"{pen:g}",
            "base": str(base.meta.get("name", "")) or "packaged", "recipe": "oculis classifier fit (warm start)"}
    return to_head(base, final, folds, z, meta), final


def save_head(head: Head, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    arrays: dict[str, Any] = {
        "token_weights": head.token_weights.astype(np.float16), "biases": head.biases, "len_mu": head.len_mu,
        "len_sd": head.len_sd, "emb_mu": head.emb_mu, "emb_sd": head.emb_sd, "blend": head.blend,
        "knots": head.knots, "spread_ref": head.spread_ref, **{f"meta_{k}": v for k, v in head.meta.items()},
        **_guard(head)}
    with tmp.open("wb") as f:  # a router watching the path never sees half a file
        np.savez_compressed(f, **arrays)
    tmp.replace(path)


def _guard(head: Head) -> dict[str, NDArray[Any]]:
    """The head's kind guard as arrays to save (none for a head without one)."""
    if head.guard_weights is None:
        return {}
    return {"guard_weights": head.guard_weights.astype(np.float16), "guard_bias": np.asarray(head.guard_bias)}


def head_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def apgr(score: FloatArray, weak: FloatArray, strong: FloatArray, seed: int = 0) -> float:
    """RouteLLM's APGR (training/routing_eval.py's definition): area under the share of the weak-to-strong
    quality gap recovered, over the share of strong calls, sending the highest scores first (ties at
    random, seeded); random routing scores 0.5. NaN when both models are equally good."""
    n = len(score)
    gap = float(strong.mean() - weak.mean())
    if n == 0 or gap == 0:
        return float("nan")
    x, pgr = pgr_curve(score, weak, strong, seed)
    return float(np.trapezoid(pgr, x))


def pgr_curve(score: FloatArray, weak: FloatArray, strong: FloatArray, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """(share of strong calls, share of the weak-to-strong gap recovered) at every cut of the prompts
    sorted by descending score (ties at random, seeded). Needs a non-zero gap."""
    n = len(score)
    gap = float(strong.mean() - weak.mean())
    order = np.lexsort((np.random.default_rng(seed).random(n), -score))
    gain = np.concatenate([[0.0], np.cumsum((strong - weak)[order])]) / n
    return np.arange(n + 1) / n, gain / gap


def cpt(score: FloatArray, weak: FloatArray, strong: FloatArray, target: float = 0.5, seed: int = 0) -> float:
    """CPT(target): the smallest share of strong calls that recovers `target` of the quality gap (random
    routing: about `target`); NaN when both models are equally good."""
    if len(score) == 0 or float(strong.mean() - weak.mean()) == 0:
        return float("nan")
    x, pgr = pgr_curve(score, weak, strong, seed)
    hit = np.nonzero(pgr >= target - 1e-12)[0]
    return float(x[hit[0]]) if len(hit) else 1.0


def bootstrap(scores: dict[str, FloatArray], weak: FloatArray, strong: FloatArray, n_boot: int = 300,
              seed: int = 0) -> dict[str, tuple[float, float]]:
    """95% intervals of each method's APGR over the same resamples of prompts."""
    rng = np.random.default_rng(seed)
    vals: dict[str, list[float]] = {k: [] for k in scores}
    for i in range(n_boot):
        idx = rng.integers(0, len(weak), len(weak))
        if strong[idx].mean() == weak[idx].mean():
            continue
        for k, s in scores.items():
            vals[k].append(apgr(s[idx], weak[idx], strong[idx], seed=i))
    return {k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) if v else (math.nan, math.nan)
            for k, v in vals.items()}


def paired_wins(a: FloatArray, b: FloatArray, weak: FloatArray, strong: FloatArray, n_boot: int = 300,
                seed: int = 1) -> float:
    """Share of paired resamples where score `a` has the higher APGR."""
    rng = np.random.default_rng(seed)
    wins = total = 0
    for i in range(n_boot):
        idx = rng.integers(0, len(weak), len(weak))
        if strong[idx].mean() == weak[idx].mean():
            continue
        total += 1
        wins += apgr(a[idx], weak[idx], strong[idx], i) > apgr(b[idx], weak[idx], strong[idx], i)
    return wins / max(total, 1)


# The fitted head replaces the base only when it wins this share of paired resamples of the user's rows:
# adaptation must not make a route worse than the shipped default on the user's own evidence.
WIN_SHARE = 0.9


@dataclass(frozen=True)
class Choice:
    keep_base: bool
    base_apgr: float
    fitted_apgr: float
    wins: float  # share of paired resamples where the fitted head's APGR is higher
    reason: str


def choose(base: FloatArray, fitted: FloatArray, weak: FloatArray, strong: FloatArray, folds: str,
           n_boot: int = 300) -> Choice:
    """Base (as served) vs fitted (out-of-fold) on the same rows: the fitted head is taken only when its
    APGR is higher and it wins at least WIN_SHARE of paired resamples; otherwise the base is kept."""
    a, b = apgr(base, weak, strong), apgr(fitted, weak, strong)
    if math.isnan(a) or math.isnan(b):
        return Choice(True, a, b, 0.0, "the weak and the strong model are equally good on these rows: nothing to "
                                       "learn; kept the base")
    wins = paired_wins(fitted, base, weak, strong, n_boot)
    if b > a and wins >= WIN_SHARE:
        return Choice(False, a, b, wins, f"the fitted head is better by {folds} cross-validation (APGR {b:.3f} vs "
                                         f"the base's {a:.3f}, higher in {wins:.0%} of paired resamples): wrote it")
    return Choice(True, a, b, wins, f"the fitted head is not shown better by {folds} cross-validation (APGR {b:.3f} "
                                    f"vs the base's {a:.3f}, higher in {wins:.0%} of paired resamples, needs "
                                    f"{WIN_SHARE:.0%}): kept the base, wrote it unchanged")
