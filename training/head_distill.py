"""Distils the teacher's decision into one weight per word piece (issue 14, item 2).

The teacher is MiniLM's contextual sentence embedding + logistic regression on the routing labels:
about 200 ms a prompt, too slow to serve. The packaged head used to learn its own logistic regression
on the static table's pooled vectors, which keep little of what the teacher sees (mean cosine 0.24 to
its embedding). Here the student learns the teacher's logit instead, on the labelled prompts and on
unlabelled text from outside the split (`corpus.py`), so the words of traffic unlike MMLU and GSM8K
get the weight the teacher would give them:

1. ridge regression of the teacher's logit on the static table's pooled vectors, which gives every
   piece of the vocabulary a weight (its row times the fitted direction);
2. a per-piece correction fitted by damped least squares (LSQR) to what step 1 misses, learnt only
   for pieces that occur in the fitted texts and pulled towards 0 by `damp`.

The result is the shape the router already serves: one weight per piece and a bias, averaged over a
prompt's pieces. Pure functions of arrays; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.sparse.linalg import lsqr
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.preprocessing import StandardScaler

F = NDArray[np.float64]
TEACHER_C = 1.0  # the contextual candidates' C in select_classifier.py


def logistic_logit(x: F, y: NDArray[np.int64], c: float = TEACHER_C) -> Callable[[F], F]:
    """Logistic regression on standardised features; returns its logit. The teacher is this on
    MiniLM's contextual embeddings (and select_classifier's other candidates on their own features)."""
    scaler = StandardScaler().fit(x)
    lr = LogisticRegression(C=c, max_iter=5000).fit(scaler.transform(x), y)

    def logit(x: F) -> F:
        out: F = lr.decision_function(scaler.transform(x))
        return out
    return logit


def mean_pool(ids: list[NDArray[np.int64]], vocab: int) -> sp.csr_matrix:
    """Rows that average a text's pieces: `mean_pool(ids) @ table` is each text's mean vector."""
    lens = np.array([len(a) for a in ids])
    rows = np.repeat(np.arange(len(ids)), lens)
    vals = np.repeat(1.0 / np.maximum(lens, 1), lens)
    cols = np.concatenate(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(ids), vocab))


def distil(pool: sp.csr_matrix, target: F, static: F, damp: float) -> tuple[F, float]:
    """Per-piece weights w and bias b with pool @ w + b close to `target` (the teacher's logit)."""
    ridge = Ridge(alpha=1.0).fit(np.asarray(pool @ static), target)
    w: F = static @ ridge.coef_
    bias = float(ridge.intercept_)
    residual = target - (pool @ w + bias)
    w = w + lsqr(pool, residual, damp=damp, atol=1e-8, btol=1e-8, iter_lim=2000)[0]
    return w, bias
