"""Modelled logprobs of the simulator's answers, in vLLM's two shapes. Pure.

A token's logprob is drawn from an exponential with the configured mean (`--sim-mean-logprob`, default
-0.4: a confident model; -2.5 makes answers that a router's `min_mean_logprob` check escalates). The draw
depends only on the simulator's seed and the request's (or its running number), so the same request
gets the same values. The sampled token is the most likely one; the alternatives share what is left of
the probability mass, halving rank by rank, so the figures are plausible (probabilities sum below 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from oculis_sim.tokens import WORDS

DEFAULT_MEAN_LOGPROB = -0.4
FLOOR = -9999.0  # vLLM's stand-in for -inf


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]  # the sampled token first, then alternatives (vLLM's dict order)


def draw(tokens: list[str], mean: float, seed: tuple[int, ...], top: int, offset: int = 0) -> list[TokenLogprob]:
    """Logprobs of `tokens` (an answer's tokens from position `offset` on) with `top` alternatives each."""
    rng = np.random.default_rng([abs(s) for s in seed] + [offset])
    scale = max(abs(mean), 1e-6)
    values = -rng.exponential(scale, len(tokens)) if mean < 0 else np.zeros(len(tokens))
    out: list[TokenLogprob] = []
    for i, (tok, lp) in enumerate(zip(tokens, values, strict=True)):
        lp = max(float(lp), FLOOR)
        rest = -math.expm1(lp)  # 1 - p of the sampled token
        alts: list[tuple[str, float]] = [(tok, lp)]
        lead = " " if tok.startswith(" ") else ""
        for rank in range(1, top + 1):
            word = WORDS[(offset + i + 7 * rank) % len(WORDS)]
            if lead + word == tok:
                word = word.upper()
            share = rest * 0.5**rank
            alts.append((lead + word, max(math.log(share), FLOOR) if share > 0 else FLOOR))
        out.append(TokenLogprob(tok, lp, tuple(alts)))
    return out


def chat_content(items: list[TokenLogprob], top_logprobs: int) -> list[dict[str, Any]]:
    """Chat's `logprobs.content`: vLLM lists the first `top_logprobs` entries of the token's dict."""
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
             "top_logprobs": [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}
                              for tok, lp in t.top[:top_logprobs]]} for t in items]


def completion_logprobs(items: list[TokenLogprob], top: int, text_offset: int) -> dict[str, Any]:
    """Completions' `{text_offset, token_logprobs, tokens, top_logprobs}`: vLLM's dict holds the sampled
    token and the `top` best (top + 1 entries)."""
    offsets: list[int] = []
    pos = text_offset
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"text_offset": offsets, "token_logprobs": [t.logprob for t in items], "tokens": [t.token for t in items],
            "top_logprobs": [dict(t.top[:top + 1]) for t in items]}


def mean(items: list[TokenLogprob]) -> float:
    return sum(t.logprob for t in items) / len(items) if items else 0.0
