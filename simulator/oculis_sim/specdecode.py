"""Speculative decoding: how many drafts the target accepts, and what proposing them costs.

Acceptance is drawn per position: each of the k drafts is accepted with probability alpha given that
the previous one was, so accepted tokens per verification step average (1 - alpha^(k+1)) / (1 - alpha)
including the bonus token (the i.i.d. result, ../shared/notes/simulator.md section 5). vLLM counts one
draft per request per step, k draft tokens, and the accepted ones (`vllm:spec_decode_*`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

# Default per-position acceptance when --acceptance-rate is not given (assumptions, chosen so the
# published batch-1 speed-ups come out: EAGLE-1 k=2 1.51x, EAGLE-3 k=2 1.65x on Llama-3.1-8B/H100,
# vllm#16937; n-gram depends on how repetitive the text is, vllm#24344 measured 0.81 on code edits).
DEFAULT_ACCEPTANCE = {"ngram": 0.4, "eagle": 0.55, "eagle3": 0.65, "mtp": 0.8, "draft_model": 0.7}
METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")


@dataclass(frozen=True)
class SpecConfig:
    method: str  # one of METHODS
    num_speculative_tokens: int
    draft_model: str | None
    head: str | None = None  # an EAGLE/EAGLE-3 head checkpoint (its weights are not planned: a layer or two)


class SpecConfigError(ValueError):
    pass


def parse(text: str) -> SpecConfig:
    """--speculative-config JSON as vLLM takes it: method and/or model, num_speculative_tokens."""
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecConfigError(f"not valid JSON ({exc.msg} at position {exc.pos}); e.g. "
                              '\'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
    if not isinstance(cfg, dict):
        raise SpecConfigError("must be a JSON object such as {\"method\": \"ngram\", \"num_speculative_tokens\": 4}")
    method = cfg.get("method")
    model = cfg.get("model")
    k = cfg.get("num_speculative_tokens")
    if method is None and model is None:
        raise SpecConfigError("needs `method` (ngram, eagle, eagle3, mtp) or a draft `model`")
    if method is None or method == "draft_model":
        method = "draft_model"
    elif method not in METHODS:
        raise SpecConfigError(f"method {method!r} is not simulated; use one of ngram, eagle, eagle3, mtp, "
                              "or a draft `model`")
    if method in ("eagle", "eagle3") and not model:  # vLLM refuses it at start, in these words
        raise SpecConfigError(f"method {method} needs `model`: num_speculative_tokens was provided but without "
                              "speculative model; name the EAGLE head checkpoint (e.g. \"model\": "
                              "\"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B\")")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SpecConfigError(f"num_speculative_tokens {k!r} must be a positive integer (vLLM requires it "
                              "when the draft config does not set it)")
    return SpecConfig(method, k, model if method == "draft_model" else None,
                      model if method in ("eagle", "eagle3") else None)


class AcceptanceSampler:
    """Seeded draws of accepted drafts per verification."""

    def __init__(self, alpha: float, seed: int) -> None:
        self.alpha = alpha
        self.rng = np.random.default_rng(seed)

    def draw(self, proposed: list[int]) -> list[int]:
        """For each request's proposed draft count, how many leading drafts were accepted."""
        if self.alpha <= 0:
            return [0] * len(proposed)
        if self.alpha >= 1:
            return list(proposed)
        # successes before the first rejection ~ geometric(1 - alpha) - 1, capped at the drafts proposed
        runs = self.rng.geometric(1.0 - self.alpha, size=len(proposed)) - 1
        return [min(int(r), k) for r, k in zip(runs, proposed, strict=True)]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    if alpha >= 1:
        return float(k + 1)
    return float((1 - alpha ** (k + 1)) / (1 - alpha))
