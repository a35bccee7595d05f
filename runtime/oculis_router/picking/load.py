"""Load as work, not requests: what a replica has to do before a new request's first token, in one unit.

The unit is one context token read by one decode step (the replica's KV-read cost), as `Picker.cost` used
before; the conversions are the replica's own step-time model (`ReplicaState.prefill_token_s`,
`context_token_s`, `step_s`, `max_num_batched_tokens`), never a tuned constant.

Two sources, each for what it knows best:
- the router's own counts, exact for its own traffic and updated at dispatch (so a burst of arrivals
  sees each earlier pick at once and spreads, instead of herding onto the replica that emptied last);
- the engine's gauges (`vllm:num_requests_waiting`/`running`), a scrape old, which alone see other
  routers' traffic. With `scraped_in_flight` (the router's own count at the moment the gauges were read)
  only the gauges' excess over it is added: that is the load the router did not send. Without it the
  gauges are taken as a floor of the router's counts, as before (a stale gauge then over-counts a
  replica that emptied since the scrape: the herding the issue measured).

Pure functions over `ReplicaState`; the picker keeps the running means they need (`mean_uncached`,
`mean_context`: what an unknown request costs on average).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oculis_router.picking.picker import ReplicaState

# Prefill seconds per token over KV-read seconds per context token per step, when the replica's step-time
# model is not given: Llama-3.1-8B on an H100 in the simulator's model (Qwen3-32B TP2 H100 ~940, 70B TP4
# ~1,640, 8B A100 ~1,010, 8B L40S ~390).
DEFAULT_PREFILL_RATIO = 442.0


def foreign(r: ReplicaState) -> tuple[float, float]:
    """(waiting, running) requests on r that the router did not send (other routers, other clients): the
    gauges' excess over the router's own count when they were read; 0 when that count is not known (the
    gauges are then a floor, `requests`)."""
    if r.scraped_in_flight is None:
        return 0.0, 0.0
    extra = max(0.0, r.waiting + r.running - r.scraped_in_flight)
    waiting = min(r.waiting, extra)
    return waiting, extra - waiting


def requests(r: ReplicaState) -> float:
    """Requests on r: the router's own now, plus the ones it did not send (or, without `scraped_in_flight`,
    the engine's count when larger)."""
    if r.scraped_in_flight is None:
        return max(float(r.in_flight), r.running + r.waiting)
    w, run = foreign(r)
    return r.in_flight + w + run


def ratio(r: ReplicaState) -> float:
    """Prefill seconds per token in context-token reads: the replica's compute-bound prefill against its
    bandwidth-bound KV reads (400-1,600 across models and GPUs)."""
    p, d = r.prefill_token_s, r.context_token_s
    return p / d if p and d else DEFAULT_PREFILL_RATIO


def queued(r: ReplicaState, mean_uncached: float) -> float:
    """Prefill tokens queued ahead of a new request on r: the router's own not yet prefilled, plus the
    foreign waiting requests at the mean uncached prompt (without `scraped_in_flight`: the larger of the
    router's count and the gauge's)."""
    if r.scraped_in_flight is None:
        return max(float(r.queued_tokens), r.waiting * mean_uncached)
    return r.queued_tokens + foreign(r)[0] * mean_uncached


def context(r: ReplicaState, mean_context: float) -> float:
    """Context tokens r's decode steps read: the router's in-flight prompts + expected outputs (at the mean
    context when a caller counts requests but not their tokens), plus the foreign requests at the mean
    context (without `scraped_in_flight`: the larger of the two views)."""
    own = float(r.context_tokens) if r.context_tokens or not r.in_flight else r.in_flight * mean_context
    if r.scraped_in_flight is None:
        return max(own, r.running * mean_context)
    w, run = foreign(r)
    return own + (w + run) * mean_context


def step(r: ReplicaState, mean_context: float) -> float:
    """One decode step of r: its fixed part (weights read once a step, `step_s`; unknown: one mean request's
    context) plus the context it reads."""
    fixed = r.step_s / r.context_token_s if r.step_s and r.context_token_s else mean_context
    return fixed + context(r, mean_context)


def wait(r: ReplicaState, uncached: int, mean_uncached: float, mean_context: float) -> float:
    """A new request's own time to first token on r: the prefill queued ahead of it plus its own uncached
    prefill (compute), in as many steps as the token budget (`max_num_batched_tokens`) needs, each reading
    r's context. The load score of every load-aware strategy."""
    ahead = queued(r, mean_uncached) + uncached
    steps = max(1, math.ceil(ahead / r.max_num_batched_tokens)) if r.max_num_batched_tokens else 1
    return ratio(r) * ahead + steps * step(r, mean_context)
