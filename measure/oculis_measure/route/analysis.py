"""What a route would do with a sample of real traffic, and the thresholds that would give a wanted
split: pure functions over (complexity, confidence, tier) results, no I/O.

Why: the packaged classifier's complexity is a quantile of its *training* prompts (MMLU/GSM8K), so
on other traffic (short chat turns, say) the seed thresholds can send nearly everything to one tier.
Scoring a sample of one's own prompts and reading off thresholds recalibrates the route."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from oculis import Route
from oculis.router_upstream import Upstream
from oculis_measure.route import cascade


@dataclass(frozen=True)
class Scored:
    complexity: float
    confidence: float
    tier: str
    escalated: bool
    tier_index: int = 0
    prompt_tokens: int = 0  # by the classifier's tokenizer, as the router counts them for max_prompt_tokens


def parse_shares(raw: str, n_tiers: int) -> list[float]:
    """`0.5,0.3,0.2` -> one share per tier, summing to 1; ValueError naming the problem otherwise."""
    try:
        shares = [float(x) for x in raw.split(",")]
    except ValueError:
        raise ValueError(f"{raw!r} is not a comma-separated list of numbers") from None
    if len(shares) != n_tiers:
        raise ValueError(f"{len(shares)} shares given for a route of {n_tiers} tiers; give one per tier")
    if not all(math.isfinite(s) and s >= 0 for s in shares):  # NaN passes every comparison below
        raise ValueError(f"shares {raw} must be finite non-negative numbers, such as 0.5,0.3,0.2")
    if abs(sum(shares) - 1) > 1e-6:
        raise ValueError(f"shares {raw} must sum to 1 (they sum to {sum(shares):g})")
    return shares


def threshold_for(cx: Any, share: float) -> float | None:
    """The `complexity_below` that sends about `share` of the sample `cx` (sorted or not) below it.

    The quantile at the share, clamped into (0, 1] where the schema wants thresholds (ties at 0 then
    stay in the first tier). A share of all must include the maximum too, which `complexity < max`
    leaves out: then a step above it, or None (no complexity rule: `match: {}`) when the maximum
    is already 1.0, the highest threshold there is."""
    if share < 1 - 1e-6:  # the tolerance parse_shares allows in the sum
        return round(min(max(float(np.quantile(cx, share)), 1e-4), 1.0), 4)
    top = float(np.max(cx))
    return None if top >= 1.0 else round(min(top + 1e-4, 1.0), 4)


def analyze(route: Route, scored: list[Scored], shares: list[float] | None = None) -> dict[str, Any]:
    n = len(scored)
    if n == 0:
        return {"prompts": 0}
    cx = np.array([s.complexity for s in scored])
    tiers = Counter(s.tier for s in scored)
    escalated = Counter(s.tier for s in scored if s.escalated)
    out: dict[str, Any] = {
        "prompts": n,
        "tiers": [{"tier": t.name, "upstream": t.upstream, "share": round(tiers[t.name] / n, 4),
                   "escalated_share": round(escalated[t.name] / n, 4)} for t in route.tiers],
        "complexity_quantiles": {f"p{q}": round(float(np.quantile(cx, q / 100)), 4) for q in (10, 25, 50, 75, 90)},
        "low_confidence_share": round(sum(s.confidence < route.escalation.confidence_threshold
                                          for s in scored) / n, 4),
    }
    if shares is not None:
        # Tier i (all but the last) gets the prompts below the threshold at the cumulative share.
        cuts = np.cumsum(shares)[:-1]
        out["suggested_complexity_below"] = {
            t.name: threshold_for(cx, float(c)) for t, c in zip(route.tiers[:-1], cuts, strict=True)}
        out["note"] = ("complexity only: max_prompt_tokens rules and low-confidence escalation still move "
                       "prompts up, so the split is a starting point; score the sample again after changing it")
    return out


def sample_cascade(route: Route, upstreams: Mapping[str, Upstream], scored: list[Scored], rate: float | None,
                   output_tokens: int) -> dict[str, Any]:
    """Routed-only vs cascade cost of the sample: each prompt's own tokens, `output_tokens` per answer,
    p_esc from the flag (a sample has no answers to measure it on) or 0."""
    p, what_if, source = cascade.resolve_rate(route, None, "", rate)
    tiers, why = cascade.tiers_for(route, upstreams, p, what_if)
    requests = [cascade.Request(s.tier_index, s.prompt_tokens, output_tokens) for s in scored]
    return cascade.report(tiers, requests, source, f"prompt tokens of each sampled prompt by the classifier's "
                          f"tokenizer; {output_tokens} output tokens per answer assumed (--output-tokens)", why)
