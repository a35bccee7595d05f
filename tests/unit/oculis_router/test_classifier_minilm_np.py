"""The numpy MiniLM forward (`training/minilm_np.py`, what `make classifier` distils with instead of
torch) computes BERT: checked on a tiny random config against a direct per-token, per-head reference."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "training"))
from minilm_np import Bert, batches, padded, sentence_embeddings  # noqa: E402

HIDDEN, HEADS, LAYERS, FFN, VOCAB, POS = 8, 2, 2, 12, 20, 16


def tiny_bert(seed: int = 0) -> Bert:
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(VOCAB, HIDDEN), "embeddings.position_embeddings.weight": r(POS, HIDDEN),
         "embeddings.token_type_embeddings.weight": r(2, HIDDEN),
         "embeddings.LayerNorm.weight": 1 + r(HIDDEN), "embeddings.LayerNorm.bias": r(HIDDEN)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        for name, (o, n) in {"attention.self.query": (HIDDEN, HIDDEN), "attention.self.key": (HIDDEN, HIDDEN),
                             "attention.self.value": (HIDDEN, HIDDEN), "attention.output.dense": (HIDDEN, HIDDEN),
                             "intermediate.dense": (FFN, HIDDEN), "output.dense": (HIDDEN, FFN)}.items():
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = r(o, n), r(o)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = 1 + r(HIDDEN), r(HIDDEN)
    return Bert(w, HEADS, LAYERS, 1e-12)


def reference_hidden(bert: Bert, ids: list[int]) -> np.ndarray:
    """BERT written out one token and one head at a time, in float64 (no padding: the sequence alone)."""
    w = {k: v.astype(np.float64) for k, v in bert.weights.items()}

    def norm(v: np.ndarray, name: str) -> np.ndarray:
        mu, var = v.mean(), ((v - v.mean()) ** 2).mean()
        out: np.ndarray = (v - mu) / math.sqrt(var + bert.eps) * w[f"{name}.weight"] + w[f"{name}.bias"]
        return out

    def lin(v: np.ndarray, name: str) -> np.ndarray:
        out: np.ndarray = w[f"{name}.weight"] @ v + w[f"{name}.bias"]
        return out

    xs = [norm(w["embeddings.word_embeddings.weight"][t] + w["embeddings.position_embeddings.weight"][i]
               + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm") for i, t in enumerate(ids)]
    d = HIDDEN // HEADS
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"
        q = [lin(x, f"{p}.attention.self.query") for x in xs]
        k = [lin(x, f"{p}.attention.self.key") for x in xs]
        v = [lin(x, f"{p}.attention.self.value") for x in xs]
        new = []
        for i, x in enumerate(xs):
            ctx = np.zeros(HIDDEN)
            for h in range(HEADS):
                sl = slice(h * d, (h + 1) * d)
                s = np.array([q[i][sl] @ k[j][sl] / math.sqrt(d) for j in range(len(xs))])
                a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                ctx[sl] = sum(a[j] * v[j][sl] for j in range(len(xs)))
            x = norm(x + lin(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            hid = lin(x, f"{p}.intermediate.dense")
            hid = np.array([0.5 * u * (1 + math.erf(u / math.sqrt(2))) for u in hid])
            new.append(norm(x + lin(hid, f"{p}.output.dense"), f"{p}.output.LayerNorm"))
        xs = new
    return np.stack(xs)


def test_numpy_bert_forward_matches_a_per_op_reference_and_ignores_padding() -> None:
    bert = tiny_bert()
    seqs = [[1, 5, 7, 2], [1, 3, 2], [1, 9, 11, 13, 4, 6, 2]]
    ids, mask = padded(seqs)
    hidden = bert.hidden(ids, mask)
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(hidden[i, : len(s)], reference_hidden(bert, s), rtol=1e-4, atol=1e-4)
    pooled = bert.pooled(ids, mask)
    for i, s in enumerate(seqs):  # padding neither attends nor is pooled
        np.testing.assert_allclose(pooled[i], reference_hidden(bert, s).mean(axis=0), rtol=1e-4, atol=1e-4)


def test_sentence_embeddings_are_in_input_order_and_unit_length_whatever_the_batching() -> None:
    bert = tiny_bert(1)
    seqs = [[1, *range(3, 3 + n), 2] for n in (9, 1, 5, 12, 3, 1)]
    one = sentence_embeddings(bert, seqs, tokens=1)  # one sequence per batch
    many = sentence_embeddings(bert, seqs, tokens=10_000)
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(one, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(one[2], bert.pooled(*padded([seqs[2]]))[0] / np.linalg.norm(bert.pooled(
        *padded([seqs[2]]))[0]), rtol=1e-5)
    assert sorted(np.concatenate(list(batches(seqs, 16))).tolist()) == list(range(len(seqs)))
