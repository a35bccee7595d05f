"""Replay a workload through the engine core in virtual time and summarise what a client would see.

Client-side figures as `vllm bench serve` defines them: TTFT = first token - send, E2E = last token -
send, ITL = the gaps between successive streamed chunks (all requests pooled), throughput over the run's
duration. Request-level overheads outside the engine (BLIS alpha0/1/2: API server before the scheduler,
post-decode finish, per-token streaming; the vLLM era's figures) are added here, so the server and the
replay agree.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from oculis_measure.figures import Absent, dist, rate, share
from oculis_sim.config import Settings
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request
from oculis_sim.tokenrecorder import Rec, TokenRecorder
from oculis_sim.workload import Workload

NO_REQUESTS = "no request completed"


def stats_ms(values: np.ndarray, reason: str = NO_REQUESTS) -> dict[str, float] | Absent:
    """mean, p50, p90, p99 in ms of values in seconds; Absent(reason) when there are none (never 0.0)."""
    return dist(values, reason, percentiles=(50, 90, 99), scale=1000.0, digits=3)


@dataclass
class ReplayResult:
    summary: dict[str, Any]  # exactly the `-o json` keys
    peak_kv_usage: float
    refused: int
    prefix_hit_rate: float | Absent  # absent: no prefix-cache lookup
    duration_s: float
    output_tokens: int
    spec_acceptance_length: float | None
    tpot_ms: dict[str, float] | Absent  # per request (E2E - TTFT) / (output - 1), as vLLM bench's TPOT
    queue_ms: dict[str, float] | Absent  # waiting before first scheduled, as vllm:request_queue_time_seconds


def run(settings: Settings, wl: Workload) -> ReplayResult:
    core = EngineCore(settings)
    n = len(wl)
    block = settings.block_size
    hashes_of = wl.block_keys(block)  # a group's prefix, then a fixed prompt's or conversation's own blocks

    api = core.cost.api_s
    serial = core.cost.api_serial_s
    api_free = 0.0  # when the API server's event loop is next free (serial work per request)
    limit = settings.max_model_len
    conc = wl.max_concurrency
    arrivals = wl.arrivals.tolist()
    prompts = wl.prompt_tokens.tolist()
    outputs = wl.output_tokens.tolist()

    entering: list[tuple[float, int]] = []  # (time the scheduler sees it, request index)
    backlog = 0  # next request index not yet sent (max_concurrency gating)
    inflight = 0
    refused = 0
    rec: TokenRecorder[Rec] = TokenRecorder(n, core.cost.per_token_s, core.cost.finish_s)
    queue = array("d")
    queued_from: dict[int, float] = {}

    def send(i: int, at: float) -> None:
        nonlocal inflight, refused, api_free
        if prompts[i] + outputs[i] > limit:  # vLLM answers 400 before the engine sees it
            refused += 1
            return
        inflight += 1
        rec.recs[i] = Rec(at)
        if serial:
            api_free = max(at, api_free) + serial
            heapq.heappush(entering, (api_free + api, i))
        else:
            heapq.heappush(entering, (at + api, i))

    def release(now: float) -> None:
        """max_concurrency: send the next requests, in arrival order, as slots free up (vLLM bench's semaphore)."""
        nonlocal backlog
        while backlog < n and (conc is None or inflight < conc):
            send(backlog, max(arrivals[backlog], now))
            backlog += 1

    t = 0.0
    release(0.0)
    while True:
        while entering and entering[0][0] <= t:
            at, i = heapq.heappop(entering)
            core.add(Request(i, prompts[i], outputs[i], at, hashes_of(i)))
            queued_from[i] = t  # vLLM's queue time starts when the engine loop takes it in, between steps
        if not core.has_work():
            if entering:
                t = entering[0][0]
                continue
            break
        res = core.step(t)
        # a step that only preempted is progress; one that could never schedule its head is not
        if not res.plan.scheduled and (not res.plan.preempted or core.scheduler.refuse_unfittable()):
            raise RuntimeError("engine made no progress: a request needs more KV blocks than exist")
        for req in res.plan.admitted:
            if not req.preemptions:  # first admission (a preempted one is re-admitted later)
                queue.append(res.start - queued_from[req.rid])
        t = res.end
        rec.emitted(t, res.emitted)
        for req in res.finished:
            rec.finished(req)
            inflight -= 1
        if conc is not None and res.finished:
            release(t)
    completed = len(rec.e2e)
    start = float(wl.arrivals[0]) if n else 0.0
    duration = max(rec.last_done - start, 1e-9)
    window = rec.last_done - start if completed else 0.0  # no request completed: no window to divide by
    out_tokens = rec.out_tokens
    c = core.counters
    summary = {
        "ttft_ms": stats_ms(np.frombuffer(rec.ttft, dtype=np.float64)),
        "itl_ms": stats_ms(np.frombuffer(rec.itl, dtype=np.float64), "no request produced a second token"),
        "e2e_ms": stats_ms(np.frombuffer(rec.e2e, dtype=np.float64)),
        "output_tokens_per_s": rate(out_tokens, window, NO_REQUESTS, 2),
        "requests_per_s": rate(completed, window, NO_REQUESTS, 4),
        "preemptions": c.preemptions,
        "kv_blocks": settings.num_blocks,
        "requests": completed,
    }
    al = (1 + c.spec_accepted / c.spec_drafts) if c.spec_drafts else None
    hit_rate = share(c.prefix_hits, c.prefix_queries, "no prefix-cache lookup (no request was scheduled)")
    return ReplayResult(summary, c.peak_kv_usage, refused, hit_rate, duration, out_tokens, al,
                        stats_ms(np.frombuffer(rec.tpot, dtype=np.float64)),
                        stats_ms(np.frombuffer(queue, dtype=np.float64)))
