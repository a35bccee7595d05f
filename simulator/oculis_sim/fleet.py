"""`oculis sim fleet`: a workload through N simulated engines and the router's picker, in virtual time.

Each replica is the replay's engine core (V1 scheduler, prefix cache with LRU eviction, step times); the
picker is the router's own (`oculis_router.picking`), fed what a router would see: its own in-flight count
per replica (and the tokens it estimates those requests hold and have yet to prefill), the engines'
`num_requests_waiting`, `num_requests_running` and `kv_cache_usage_perc` as of the last scrape
(`scrape_interval`), KV capacity and block size (`cache_config_info`), and, for `kv-events`, each engine's
BlockStored/BlockRemoved events as of the end of the step that caused them. The router does not know a
request's output length: it expects the mean of the outputs it has seen so far.

LoRA adapters (`adapters`: one per request, or None for the base model; `max_loras` slots per engine, every
engine serving every adapter): each engine's slots are `fleetlora.Slots` (a request waits for a slot, a first
use loads its adapter), the picker sees them as `vllm:lora_requests_info` as of the last scrape plus its own
calls' adapters, and `lora_affinity=False` makes it adapter-blind (to compare).

Event-driven: the clock jumps from one event (an arrival, a request reaching its engine after the API
server's delay, a step's end, a scrape) to the next, so idle time costs nothing. Figures are the
client's, as `sim replay` gives them; `per_replica` says how the picker spread the work.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oculis_measure.figures import Absent, absent, rate, ratio, share
from oculis_router.picking import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    Picker,
    PickRequest,
    ReplicaState,
    Strategy,
)
from oculis_sim import decoderun
from oculis_sim.config import Settings
from oculis_sim.engine import EngineCore, StepResult
from oculis_sim.fleetlora import Slots
from oculis_sim.replay import NO_REQUESTS, stats_ms
from oculis_sim.scheduler import Request
from oculis_sim.tokenrecorder import Rec, TokenRecorder
from oculis_sim.workload import Workload

_STEP, _ENTER, _SCRAPE = 0, 1, 2
_UNIQUE = 1 << 50  # picker-side keys for blocks nobody shares (the engine keys them None), consecutive from here


class _Replica:
    __slots__ = ("adapters", "busy", "context", "core", "gen", "id", "in_flight", "in_flight_tokens", "kv",
                 "lora", "lora_seen", "queued_tokens", "requests", "res", "run", "running", "scraped_in_flight",
                 "waiting")

    def __init__(self, rid: str, core: EngineCore) -> None:
        self.id = rid
        self.core = core
        self.busy = False
        self.res: StepResult | None = None  # the step whose end is pending (None: nothing left to report)
        self.run: decoderun.DecodeRun | None = None  # a pure-decode run in progress
        self.gen = 0  # bumps when a pending step-end event is superseded
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.queued_tokens = 0
        self.context = 0
        self.requests = 0
        self.waiting = 0.0  # as last scraped
        self.running = 0.0
        self.kv = 0.0
        self.scraped_in_flight = 0  # the router's own count when the gauges were read
        self.lora = Slots(1)  # its LoRA slots (run() sets max_loras)
        self.lora_seen: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # as last scraped
        self.adapters: Counter[str] = Counter()  # adapters of the router's calls in flight there


class _Rec(Rec):
    """Also what the router counted for the request on its replica (taken back as it progresses)."""

    __slots__ = ("context", "need", "replica", "uncached")

    def __init__(self, send: float, replica: _Replica, need: int, uncached: int, context: int) -> None:
        super().__init__(send)
        self.replica = replica
        self.need = need
        self.uncached = uncached
        self.context = context


NO_LOOKUP = "no prefix-cache lookup (no request was scheduled)"


@dataclass
class FleetResult:
    summary: dict[str, Any]  # exactly the `-o json` keys
    refused: int
    # each request's TTFT in seconds, by its index in the workload (NaN: refused or never served), so runs
    # on several seeds can be pooled and compared request by request (bench/picker_sweep.py)
    ttft_s: np.ndarray | None = None


def weighted_stats_ms(values: np.ndarray, weights: np.ndarray) -> dict[str, float] | Absent:
    """stats_ms over values each counted `weights` times (a decode run's gaps are one value per step,
    shared by the whole batch); absent when there are none (never 0.0)."""
    if len(values) == 0 or weights.sum() == 0:
        return absent("no request produced a second token")
    order = np.argsort(values, kind="stable")
    v = values[order] * 1000.0
    cw = np.cumsum(weights[order])
    total = cw[-1]
    pct = [v[min(int(np.searchsorted(cw, q * total, side="left")), len(v) - 1)] for q in (0.5, 0.9, 0.99)]
    mean = float((v * weights[order]).sum() / total)
    return {"mean": round(mean, 3), "p50": round(float(pct[0]), 3), "p90": round(float(pct[1]), 3),
            "p99": round(float(pct[2]), 3)}


def token_costs(core: EngineCore) -> tuple[float, float, float]:
    """The replica's marginal step-time costs, read off its own step-time model: seconds per prefilled token
    (a long prefill, compute-bound), per context token a decode step reads (a large batch), and the fixed
    part of a step (one request decoding with no context: the weights read once a step)."""
    step = core.cost.step_seconds

    def prefill(n: int) -> float:
        return step(n, n * n / 2, 0, 0.0, 0, 1)

    def decode(c: int, b: int = 64) -> float:
        return step(0, 0.0, b, b * (c + 0.5), b * c, b)

    return (prefill(8192) - prefill(4096)) / 4096, (decode(8192) - decode(4096)) / (64 * 4096), decode(0, 1)


def _events(log: list[tuple[bool, object]], ts: float, block: int) -> EventBatch:
    """The step's cache changes as vLLM batches them: runs of BlockStored / BlockRemoved, in order."""
    out: list[BlockStored | BlockRemoved] = []
    run: list[object] = []
    kind = log[0][0]
    for stored, h in log:
        if stored != kind:
            out.append(BlockStored(tuple(run), None, (), block) if kind else BlockRemoved(tuple(run)))  # type: ignore[arg-type]
            run, kind = [], stored
        run.append(h)
    out.append(BlockStored(tuple(run), None, (), block) if kind else BlockRemoved(tuple(run)))  # type: ignore[arg-type]
    return EventBatch(ts, tuple(out))


def run(settings: Settings, wl: Workload, replicas: int, strategy: Strategy, *, scrape_interval: float = 1.0,
        seed: int = 0, decode_runs: bool = True, adapters: Sequence[str | None] | None = None, max_loras: int = 1,
        lora_affinity: bool = True) -> FleetResult:
    """decode_runs=False steps every engine one step at a time (the reference the fast path must equal)."""
    block = settings.block_size
    picker = Picker(strategy, seed=seed, block_size=block, lora_affinity=lora_affinity)
    fleet = [_Replica(f"replica-{k}", EngineCore(settings)) for k in range(replicas)]
    lora_of = list(adapters) if adapters is not None else None
    served = frozenset(a for a in lora_of or () if a is not None) or None  # every engine lists every adapter
    for r in fleet:
        r.lora = Slots(max_loras)
    events = strategy == "kv-events"
    if events:
        for r in fleet:
            r.core.scheduler.pool.log = []
    keys = wl.block_keys(block)
    unique = _UNIQUE
    cost = fleet[0].core.cost
    api = cost.api_s
    limit = settings.max_model_len
    kv_blocks = settings.num_blocks
    seqs = settings.max_num_seqs
    prefill_s, context_s, step_s = token_costs(fleet[0].core)
    budget = settings.max_num_batched_tokens
    arrivals = wl.arrivals.tolist()
    prompts = wl.prompt_tokens.tolist()
    outputs = wl.output_tokens.tolist()
    # a user's requests (a conversation, or a client repeating its prompt) carry one session key, as the
    # OpenAI `user` field would: the picker's affinity hint before any prefix is known
    users = wl.prompt_ids.tolist() if wl.prompt_ids is not None else None
    groups = wl.prefix_groups.tolist() if wl.prefix_groups is not None else None
    n = len(arrivals)
    rec: TokenRecorder[_Rec] = TokenRecorder(n, cost.per_token_s, cost.finish_s)
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    refused = 0
    mean_out = 0.0
    done_n = 0

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    def start(r: _Replica, t: float) -> None:
        r.busy = True
        r.gen += 1
        k = decoderun.max_steps(r.core) if decode_runs else 0
        if k:
            run_ = decoderun.DecodeRun(r.core, t, k, next_scrape)
            r.run, r.res = run_, None
            push(run_.ends[-1], _STEP, (r, r.gen))
            return
        res = r.core.step(t)
        # a step that only preempted is progress; one that could never schedule its head is not
        if not res.plan.scheduled and (not res.plan.preempted or r.core.scheduler.refuse_unfittable()):
            raise RuntimeError("engine made no progress: a request needs more KV blocks than exist")
        r.res = res
        push(res.end, _STEP, (r, r.gen))

    def settle(r: _Replica, t: float) -> float:
        """Apply a decode run up to the step in progress at t; returns when that step ends."""
        run_ = r.run
        assert run_ is not None
        j = run_.in_progress(t) + 1
        run_.apply(j)
        r.run = None
        end = run_.ends[j - 1]
        rec.decode_run(run_.durations[:j], run_.batch, end, run_.reqs)
        if events:
            log = r.core.scheduler.pool.log
            if log:
                picker.apply_events(r.id, _events(log, t, block))
                log.clear()
        return end

    def states() -> list[ReplicaState]:
        return [ReplicaState(r.id, in_flight=r.in_flight, in_flight_tokens=r.in_flight_tokens,
                             queued_tokens=r.queued_tokens, waiting=r.waiting, running=r.running, kv_usage=r.kv,
                             context_tokens=r.context, kv_blocks=kv_blocks, block_size=block, max_num_seqs=seqs,
                             prefill_token_s=prefill_s, context_token_s=context_s, adapters=served,
                             lora_running=r.lora_seen[0], lora_waiting=r.lora_seen[1],
                             in_flight_adapters=frozenset(r.adapters), max_loras=max_loras if served else None,
                             scraped_in_flight=r.scraped_in_flight, step_s=step_s, max_num_batched_tokens=budget,
)
                for r in fleet]

    next_scrape = float(arrivals[0]) if n else 0.0
    if n:
        push(next_scrape, _SCRAPE, None)
    i = 0
    while i < n or heap:
        if i < n and (not heap or arrivals[i] <= heap[0][0]):
            t = float(arrivals[i])
            p, o = prompts[i], outputs[i]
            if p + o > limit:  # vLLM answers 400 before the engine sees it
                refused += 1
                i += 1
                continue
            ek = keys(i)
            hashes: tuple[object, ...] = ek
            rest = p // block - len(ek)
            if rest > 0:  # the router hashes unique content too (it costs it memory, never a hit)
                hashes = ek + tuple(range(unique, unique + rest))
                unique += rest
            expect = round(mean_out)
            adapter = lora_of[i] if lora_of is not None else None
            session = None if users is None else f"{groups[i] if groups is not None else 0}/{users[i]}"
            pick = picker.pick(PickRequest(hashes, p, expect, adapter, session), states())
            assert pick is not None  # every simulated replica is ready
            r = fleet[int(pick.replica.rsplit("-", 1)[1])]
            if adapter is not None:
                r.adapters[adapter] += 1
            uncached = max(p - pick.cached_blocks * block, 1)
            need = uncached + expect
            r.in_flight += 1
            r.in_flight_tokens += need
            r.queued_tokens += uncached
            r.context += p + expect
            r.requests += 1
            rec.recs[i] = _Rec(t, r, need, uncached, p + expect)
            push(t + api, _ENTER, (r, Request(i, p, o, t, ek)))
            i += 1
            continue
        t, _, kind, payload = heapq.heappop(heap)
        if kind == _ENTER:
            r, req, *admitted = payload
            adapter = lora_of[req.rid] if lora_of is not None else None
            if adapter is not None and not admitted:  # a LoRA slot first (a wait, or a load)
                delay = r.lora.admit(adapter, (r, req, True))
                if delay is None:
                    continue
                if delay:
                    push(t + delay, _ENTER, (r, req, True))
                    continue
            if r.run is not None:  # the engine plans it once the step running now has ended
                end = settle(r, t)
                r.gen += 1
                push(end, _STEP, (r, r.gen))
            r.core.add(req, t)
            if not r.busy:
                start(r, t)
        elif kind == _STEP:
            r, gen = payload
            if gen != r.gen:
                continue
            if r.run is not None:
                settle(r, t)
            res = r.res
            r.res = None
            if res is not None:
                for first in rec.emitted(t, res.emitted):
                    r.queued_tokens -= first.uncached
                for req in res.finished:
                    done = rec.finished(req)
                    r.in_flight -= 1
                    r.in_flight_tokens -= done.need
                    r.context -= done.context
                    if lora_of is not None and (adapter := lora_of[req.rid]) is not None:
                        r.adapters[adapter] -= 1
                        r.adapters = +r.adapters
                        for item, delay in r.lora.release(adapter):
                            push(t + delay, _ENTER, item)
                    done_n += 1
                    mean_out += (req.num_output - mean_out) / min(done_n, 1000)
            if events:
                log = r.core.scheduler.pool.log
                if log:
                    picker.apply_events(r.id, _events(log, t, block))
                    log.clear()
            if r.core.has_work():
                start(r, t)
            else:
                r.busy = False
        else:  # a scrape: the gauges the router reads until the next one
            for r in fleet:
                if r.run is not None:
                    end = settle(r, t)
                    r.gen += 1
                    push(end, _STEP, (r, r.gen))
                sched = r.core.scheduler
                r.waiting = float(len(sched.waiting))
                r.running = float(len(sched.running))
                r.kv = sched.usage()
                r.scraped_in_flight = r.in_flight
                r.lora_seen = r.lora.state()
            if i < n or any(r.busy for r in fleet):
                next_scrape = t + scrape_interval
                push(next_scrape, _SCRAPE, None)
            else:
                next_scrape = float("inf")
    start_t = float(arrivals[0]) if n else 0.0
    duration = rec.last_done - start_t if len(rec.e2e) else 0.0  # no request completed: no window
    q = sum(r.core.counters.prefix_queries for r in fleet)
    h = sum(r.core.counters.prefix_hits for r in fleet)
    per = []
    for r in fleet:
        c = r.core.counters
        per.append({"replica": r.id, "requests": r.requests,
                    "prefix_hit_share": share(c.prefix_hits, c.prefix_queries, NO_LOOKUP, 4),
                    "peak_kv_usage": round(c.peak_kv_usage, 4), "preemptions": c.preemptions})
    counts = [r.requests for r in fleet]
    mean_count = sum(counts) / len(counts) if counts else 0.0
    summary = {
        "picker": strategy,
        "replicas": replicas,
        "ttft_ms": stats_ms(np.frombuffer(rec.ttft, dtype=np.float64)),
        "itl_ms": weighted_stats_ms(np.frombuffer(rec.itl, dtype=np.float64),
                                    np.frombuffer(rec.itl_w, dtype=np.float64)),
        "e2e_ms": stats_ms(np.frombuffer(rec.e2e, dtype=np.float64)),
        "output_tokens_per_s": rate(rec.out_tokens, duration, NO_REQUESTS, 2),
        "requests_per_s": rate(len(rec.e2e), duration, NO_REQUESTS, 4),
        "requests": len(rec.e2e),
        "prefix_hit_share": share(h, q, NO_LOOKUP, 4),
        "load_spread": ratio(max(counts, default=0), mean_count, "no request reached a replica", 3),
        "preemptions": sum(r.core.counters.preemptions for r in fleet),
        "per_replica": per,
    }
    if served:
        summary["lora"] = {"max_loras": max_loras,  # random and round-robin are adapter-blind by nature
                           "affinity": lora_affinity and strategy not in ("random", "round-robin"),
                           "adapter_loads": sum(r.lora.loads for r in fleet),
                           "slot_waits": sum(r.lora.waits for r in fleet)}
    ttft_s = np.array([x.first - x.send if x is not None and x.first >= 0 else np.nan for x in rec.recs])
    return FleetResult(summary, refused, ttft_s)
