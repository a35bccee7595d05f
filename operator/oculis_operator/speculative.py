"""Speculative-decoding guard: measured acceptance over a window -> keep or turn off. Pure.

Acceptance rate = accepted / draft tokens (vllm:spec_decode_num_accepted_tokens_total over
vllm:spec_decode_num_draft_tokens_total) across the upstream's pods over the window; mean accepted
length = 1 + accepted / drafts (tokens one verification step yields). Below `acceptanceThreshold`
speculation costs more than it saves (the seed: about 0.5). The guard is deliberately slow to act and
never flaps: it needs `MIN_DRAFT_TOKENS` in the window to judge at all, the rate must stay below the
threshold for one whole window (since `lowSince`), a dip is forgotten only once the rate is back
`HYSTERESIS` above the threshold, and once it turned speculation off for a spec generation it stays
off until the user changes the spec (vLLM reads speculative_config once at start: on/off is a restart).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal

Decision = Literal["Keep", "Watching", "Disable", "Disabled", "TooFewTokens", "NoData"]
MIN_DRAFT_TOKENS = 200  # fewer draft tokens in the window say too little about acceptance
HYSTERESIS = 0.05  # the rate must climb this far above the threshold to clear a dip


@dataclass(frozen=True)
class Sample:
    """Sums over the upstream's pods over the window; None where the metric had no series."""

    draft_tokens: float | None
    accepted_tokens: float | None
    drafts: float | None = None
    accepted_total: float | None = None  # the running total (for oculis_speculative_tokens_accepted_total)


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    acceptance_rate: float | None
    mean_accepted_length: float | None
    draft_tokens: float | None
    low_since: str | None
    message: str


def _seconds_between(earlier: str, later: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.datetime.strptime(later, fmt) - datetime.datetime.strptime(earlier, fmt)).total_seconds()


def rates(sample: Sample | None) -> tuple[float | None, float | None]:
    """(acceptance rate, mean accepted length) of the window, None where undefined."""
    if sample is None or not sample.draft_tokens or sample.accepted_tokens is None:
        return None, None
    rate = max(0.0, min(1.0, sample.accepted_tokens / sample.draft_tokens))
    length = 1 + sample.accepted_tokens / sample.drafts if sample.drafts else None
    return rate, length


def decide(threshold: float | None, auto_disable: bool, sample: Sample | None, window_s: int,
           low_since: str | None, now: str, already_disabled: bool = False) -> Verdict:
    """What the guard does now. `low_since`: when the rate first fell below the threshold (the last
    verdict's), `already_disabled`: the guard turned this generation's speculation off before."""
    rate, length = rates(sample)
    drafts = sample.draft_tokens if sample is not None else None
    if already_disabled:
        return Verdict("Disabled", rate, length, drafts, low_since,
                       "speculation was turned off for this spec generation for low acceptance; change the spec to "
                       "turn it on again")
    if sample is None or sample.draft_tokens is None:
        return Verdict("NoData", None, None, None, low_since,
                       "no speculative-decoding metrics for the window (not scraped yet, or Prometheus unreachable); "
                       "nothing decided")
    if rate is None or (drafts or 0) < MIN_DRAFT_TOKENS:
        return Verdict("TooFewTokens", rate, length, drafts, low_since,
                       f"{drafts or 0:g} draft tokens in {window_s}s, at least {MIN_DRAFT_TOKENS} needed to judge")
    figures = f"acceptance {rate:.3f} over {window_s}s ({drafts:g} draft tokens)"
    if threshold is None:
        return Verdict("Keep", rate, length, drafts, None, f"{figures}; no acceptanceThreshold set")
    if rate >= threshold + HYSTERESIS or (rate >= threshold and low_since is None):
        return Verdict("Keep", rate, length, drafts, None, f"{figures}, threshold {threshold:g}")
    if rate >= threshold:  # back above, but not by the margin: keep watching, never flap
        return Verdict("Watching", rate, length, drafts, low_since,
                       f"{figures}: back above threshold {threshold:g} but not by {HYSTERESIS:g} yet")
    since = low_since or now
    below_for = _seconds_between(since, now)
    if below_for >= window_s and auto_disable:
        return Verdict("Disable", rate, length, drafts, since,
                       f"{figures}, below threshold {threshold:g} since {since}: speculation turned off")
    tail = ("autoDisable is off: speculation stays on" if not auto_disable
            else f"below threshold {threshold:g} for {below_for:g}s of {window_s}s")
    return Verdict("Watching", rate, length, drafts, since, f"{figures}, below threshold {threshold:g}; {tail}")


def queries(namespace: str, name: str, window_s: int) -> dict[str, str]:
    """Sample field -> PromQL over every engine pod of the upstream (stable and canary)."""
    sel = f'namespace="{namespace}",pod=~"{name}-vllm-.+"'
    return {
        "draft_tokens": f"sum(increase(vllm:spec_decode_num_draft_tokens_total{{{sel}}}[{window_s}s]))",
        "accepted_tokens": f"sum(increase(vllm:spec_decode_num_accepted_tokens_total{{{sel}}}[{window_s}s]))",
        "drafts": f"sum(increase(vllm:spec_decode_num_drafts_total{{{sel}}}[{window_s}s]))",
        "accepted_total": f"sum(vllm:spec_decode_num_accepted_tokens_total{{{sel}}})",
    }
