"""Does any signal of the packaged head's kind route better than random on kinds of traffic it never saw?
(issue 25; README "Per kind of traffic"). Three tables over the 16 kinds of ../shared/data/routing
(MMLU and GSM8K: Mixtral vs GPT-4; llmrouter's 14 task kinds: mistral-7b vs nemotron-51b, graded 0-1):

1. the head's two parts blended at weights 0 (length only) .. 1 (embedding only); MMLU and GSM8K scored
   by the fold head that never saw the prompt's subject or bucket, llmrouter by the final head;
2. leave-one-kind-out: a ridge on the static MiniLM embedding (PCA 32) and length, fitted within kinds
   (features and gain centred per kind, so it learns what ranks prompts inside a kind) on all other kinds;
3. the share of prompts below 0.6 confidence, as shipped and with a familiarity factor
   exp(-distance of the score beyond the training scores' 1st-99th percentile).

Kinds where the strong model is not 0.03 better than the weak one are left out (APGR needs a gap).

    OCULIS_ROUTING_DATA=../shared/data/routing .venv/bin/python training/kind_transfer.py
(the `train` extra; the static table is distilled once, ~4 min, and cached in ~/.cache/oculis)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from distill import distill
from routing_data import load_llmrouter, load_rows
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge

from oculis_router import classify
from oculis_router import head_fit as hf

CACHE = Path.home() / ".cache" / "oculis" / "minilm_static.npy"
BLENDS = (0.0, 0.3, 0.5, 0.7, 1.0)


def table() -> np.ndarray:
    if not CACHE.exists():
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        np.save(CACHE, distill())
    return np.load(CACHE)


def centred(x: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    x = x.astype(float).copy()
    for k in set(kinds.tolist()):
        x[kinds == k] -= x[kinds == k].mean(axis=0)
    return x


def main() -> None:
    head = classify.ComplexityClassifier.packaged().head
    with np.load(classify.model_file(classify.DEFAULT_MODEL)) as z:
        fold_of = dict(zip(z["fold_groups"].tolist(), z["fold_index"].tolist(), strict=True))
    # (prompt, kind, weak, strong, row of the packaged head that never saw it: a fold head, or the final one)
    data = [(r.prompt, r.dataset, float(r.weak_correct), float(r.strong_correct), 1 + fold_of[r.group])
            for r in load_rows()]
    data += [(g.prompt, f"llmrouter:{g.kind}", g.weak, g.strong, 0) for g in load_llmrouter()]
    prompts, kinds = [d[0] for d in data], [d[1] for d in data]
    k_arr, w, s = np.array(kinds), np.array([d[2] for d in data]), np.array([d[3] for d in data])
    rows_of_head = [d[4] for d in data]
    tab = table()
    emb = np.zeros((len(prompts), tab.shape[1]))
    len_z, emb_z, conf, conf_f = (np.zeros(len(prompts)) for _ in range(4))
    for i, p in enumerate(prompts):
        pc = classify.prompt_pieces(p)
        emb[i] = tab[pc.ids].mean(axis=0) if len(pc.ids) else 0.0
        row = rows_of_head[i]
        e = head.token_weights[row, pc.ids].mean(dtype=np.float64) + head.biases[row]
        len_z[i] = (math.log1p(pc.n_len) - head.len_mu) / head.len_sd
        emb_z[i] = (e - head.emb_mu) / head.emb_sd
        raw = head.raw(pc.ids, pc.n_len)
        conf[i] = head.confidence(raw, pc.unk)
        beyond = max(0.0, head.knots[1] - raw[0], raw[0] - head.knots[-2])
        conf_f[i] = conf[i] * math.exp(-beyond)
    judged = [k for k in sorted(set(kinds)) if s[k_arr == k].mean() - w[k_arr == k].mean() >= 0.03]

    pca = PCA(32, random_state=0).fit(emb)
    x = np.hstack([pca.transform(emb), len_z[:, None]])
    loko = {}
    for k in judged:
        tr, te = k_arr != k, k_arr == k
        xt, yt = centred(x[tr], k_arr[tr]), centred((s - w)[tr, None], k_arr[tr])[:, 0]
        mu, sd = xt.mean(axis=0), xt.std(axis=0) + 1e-9
        model = Ridge(alpha=10.0).fit((xt - mu) / sd, yt)
        loko[k] = hf.apgr(model.predict((x[te] - mu) / sd), w[te], s[te])

    print(f"{'kind':32} {'n':>5}" + "".join(f"  blend {b:.1f}" for b in BLENDS)
          + "  within-kind ridge (LOKO)  conf<0.6 shipped  with familiarity")
    for k in judged:
        m = k_arr == k
        cells = "".join(f"  {hf.apgr((1 - b) * len_z[m] + b * emb_z[m], w[m], s[m]):9.3f}" for b in BLENDS)
        print(f"{k:32} {int(m.sum()):5d}{cells}  {loko[k]:24.3f}  {np.mean(conf[m] < 0.6):16.2f}"
              f"  {np.mean(conf_f[m] < 0.6):15.2f}")
    print("blend b: (1-b) x length z + b x embedding z of the shipped head (b=0.3 is the shipped score); random 0.5")


if __name__ == "__main__":
    main()
