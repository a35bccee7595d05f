"""The picker: replica states and a request in, a replica and the reason out. Pure apart from its own
memory (the approximate prefix memory, the KV-event index, the session keys, the round-robin position, the
last load-decided pick and a seeded RNG for `random`).

Strategies
- `random`: uniform over the eligible replicas (seeded).
- `round-robin`: the next eligible replica in id order.
- `least-loaded`: the least work (`load.py`): this request's own wait on each replica, the prefill queued
  ahead of it (the router's own not-yet-prefilled prompts, counted at dispatch, plus the waiting requests
  the gauges show beyond the router's count at the scrape) and its own prefill (less the engine's recent
  prefix-cache hit share), in token-budget steps each reading the replica's decode context. Waits within
  two decode steps of the best are ties, taken in rotation (`_rotate`).
- `prefix`: the same score with each replica's cached prefix (what the router remembers sending there,
  approximate) taken off this request's prefill there, under the saturation guard below.
- `kv-events`: the same with the prefix each engine says it holds (its KV events); a replica that has
  published nothing is scored from the approximate memory instead (reason `fallback`).

Sticky until saturated, for both prefix strategies. A replica is saturated for a request when admitting it
would exceed the replica's own capacity: its KV tokens (router-held tokens or the scraped usage, plus this
request's uncached prompt and expected output, above `kv_blocks x block_size`) or its sequence slots
(`max_num_seqs`). Unsaturated replicas come first (a session key or a cached prefix never holds a request
on a saturated one); among them the lowest wait wins, so a cached prefix holds the request exactly while
its prefill saving outweighs the extra work queued on its holder, past the two-step band of noise; where
nothing is shared every replica's wait is its load and the pick is `least-loaded`'s. A session key
(`PickRequest.session`) credits the conversation's last replica with what its last turn left there when no
replica is known to hold any of the prompt. No constant is tuned: the conversions are the replica's
step-time model (`prefill_token_s`, `context_token_s`, `step_s`, `max_num_batched_tokens`; the fleet
simulator passes its engine's; a router without it uses DEFAULT_PREFILL_RATIO and one mean request's
context as a step's fixed part). The earlier fleet-cost score (`Picker.cost`, kept for callers) multiplied
a hit's saving by every request it would stall and weighed a long answer's decode; on traffic with nothing
shared it left `prefix` 17-29 % behind round-robin at TTFT p90 (issue 30).

LoRA adapters (`lora.py`): a request for an adapter is picked among the replicas that list it only, every
strategy. `least-loaded`, `prefix` and `kv-events` are sticky to the adapter until saturated: a replica
where it would wait for a LoRA slot counts as saturated, and among the unsaturated ones a replica running
the adapter comes before one with a free slot, whatever their loads (then load, or the prefix cost,
decides within the class). Measured in bench/lora_picking.py (8 adapters, max_loras 2, 4 replicas):
ordering by load first and by slot class only among equal loads let an adapter spread to a second
replica, taking a slot another adapter then lacked everywhere; its requests starved behind running
adapters (TTFT p99 ~60 s); so did an "affinity guard" that let load override a running adapter (as the
TTFT guard does a cached prefix). Strict classes: each adapter loaded once, no slot wait, TTFT p99 60 ms.
The price: a hot adapter's traffic stays on the replica running it until that one saturates
(--skew 3, one adapter 83 % of requests: E2E p90 4.7 s against 2.8 s blind, TTFT p99 130 ms against 9 s).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from oculis_router.picking import load
from oculis_router.picking.events import EventBatch
from oculis_router.picking.hashing import DEFAULT_BLOCK_SIZE
from oculis_router.picking.index import KVIndex, PrefixMemory
from oculis_router.picking.load import DEFAULT_PREFILL_RATIO
from oculis_router.picking.lora import SLOT_RANK, Slot, holders, slot

Strategy = Literal["random", "round-robin", "least-loaded", "prefix", "kv-events"]
Reason = Literal["prefix", "load", "fallback", "random", "round-robin"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
PREFIX_STRATEGIES: tuple[Strategy, ...] = ("prefix", "kv-events")
SESSIONS = 100_000  # session keys remembered per upstream (a bound on memory, ~10 MB; the oldest go first)
__all__ = ["DEFAULT_PREFILL_RATIO", "PREFIX_STRATEGIES", "STRATEGIES", "Pick", "PickRequest", "Picker", "Reason",
           "ReplicaState", "Strategy"]


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as the router sees it at the moment of the pick."""

    id: str
    revision: str = "stable"
    in_flight: int = 0  # requests this router has sent there and not seen finish
    in_flight_tokens: int = 0  # KV tokens those requests need (uncached prompt + expected output), router-estimated
    queued_tokens: int = 0  # prefill tokens of those requests still before their first token, router-estimated
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped, may lag)
    running: float = 0.0  # vllm:num_requests_running
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    kv_blocks: int | None = None  # vllm:cache_config_info num_gpu_blocks (or the capacity plan); None: unknown
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per KV block of that engine
    max_num_seqs: int | None = None
    ready: bool = True
    draining: bool = False  # terminating or NotReady: no new requests, in-flight ones finish
    # (added after the first release: keep these last so positional construction stays valid)
    context_tokens: int = 0  # prompt + expected output tokens of the router's in-flight requests: what decode reads
    prefill_token_s: float | None = None  # step-time model: seconds of prefill compute per uncached token
    context_token_s: float | None = None  # seconds one decode step spends reading one context token (KV)
    # LoRA (lora.py): the adapters its engine lists in /v1/models (None: not read yet), the scraped
    # vllm:lora_requests_info (running/waiting adapters, max_lora), the adapters of the router's in-flight calls
    adapters: frozenset[str] | None = None
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    in_flight_adapters: frozenset[str] = frozenset()
    max_loras: int | None = None
    # token-aware load (load.py): the router's own in-flight count when the gauges were scraped (None: not
    # known, the gauges are a floor), the step-time model's fixed part of a step and the token budget
    scraped_in_flight: int | None = None
    step_s: float | None = None  # seconds of a decode step that reads no context (weights)
    max_num_batched_tokens: int | None = None

    @property
    def eligible(self) -> bool:
        return self.ready and not self.draining

    @property
    def kv_tokens(self) -> int | None:
        return None if self.kv_blocks is None else self.kv_blocks * self.block_size

    @property
    def requests(self) -> float:
        """The replica's request load: the router's own count plus what other routers add (load.requests)."""
        return load.requests(self)


@dataclass(frozen=True, slots=True)
class PickRequest:
    block_hashes: tuple[object, ...]  # chained hashes of the prompt's full blocks (hashing.block_hashes)
    prompt_tokens: int
    expected_output_tokens: int = 0  # max_tokens when given, else the router's running mean
    adapter: str | None = None  # the LoRA adapter asked for (None: the base model)
    session: str | None = None  # a conversation's key (OpenAI `user`, or a header): affinity before a prefix is known


@dataclass(frozen=True, slots=True)
class Pick:
    replica: str
    reason: Reason
    cached_blocks: int  # leading blocks of the prompt the picker believes the chosen replica holds
    strategy: Strategy  # the strategy asked for
    slot: Slot | None = None  # a request for an adapter: what the chosen replica's LoRA slots meant for it


class Picker:
    """One per upstream (its replicas share one memory). `pick` also records the dispatch in the prefix
    memory; `apply_events` feeds the KV-event index; `forget` drops a replica that is gone."""

    def __init__(self, strategy: Strategy, *, seed: int = 0, block_size: int = DEFAULT_BLOCK_SIZE,
                 lora_affinity: bool = True) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"picker: {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        # the load-aware strategies weigh LoRA slots (lora.py); False: adapter-blind (holders only), to compare
        self.lora_affinity = lora_affinity
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.memory = PrefixMemory()
        self.index = KVIndex(block_size)
        self.turn = 0
        self.last = ""  # the id of the last load-decided pick (ties rotate from it)
        self.mean_uncached = 0.0  # running mean of uncached prompt tokens per pick (what a waiting request costs)
        self.mean_context = 0.0  # running mean of prompt + expected output per pick (what a running request reads)
        self.picks = 0
        # session key -> (replica, tokens its last turn left there), least recently used first
        self.sessions: OrderedDict[str, tuple[str, int]] = OrderedDict()

    # ---- inputs besides the pick -------------------------------------------------------------------
    def apply_events(self, replica: str, batch: EventBatch) -> None:
        self.index.apply(replica, batch)

    def forget(self, replica: str) -> None:
        self.memory.forget(replica)
        self.index.clear(replica)
        self.index.batches.pop(replica, None)
        for key in [k for k, (rid, _) in self.sessions.items() if rid == replica]:
            del self.sessions[key]

    # ---- the pick ----------------------------------------------------------------------------------
    def pick(self, req: PickRequest, replicas: Sequence[ReplicaState]) -> Pick | None:
        """The replica for `req` among `replicas` (one revision's); None when none is ready and not draining,
        or, for an adapter, none of those can serve it (lora.holders)."""
        cands = sorted((r for r in replicas if r.eligible), key=lambda r: r.id)
        if req.adapter is not None:
            cands = holders(req.adapter, cands)
        if not cands:
            return None
        if not self.picks:  # what an unknown request costs, until the running means have one pick
            self.mean_uncached = float(req.prompt_tokens)
            self.mean_context = float(req.prompt_tokens + req.expected_output_tokens)
        s = self.strategy
        if s == "random":
            choice, reason, hit = self.rng.choice(cands), "random", 0
        elif s == "round-robin":
            choice, reason, hit = cands[self.turn % len(cands)], "round-robin", 0
            self.turn += 1
        elif s == "least-loaded":
            choice, reason, hit = self._least_loaded(cands, req), "load", 0
        else:
            choice, reason, hit = self._by_prefix(req, cands)
        self._record(req, choice, hit)
        lora = None if req.adapter is None else slot(choice, req.adapter)
        return Pick(choice.id, reason, hit, s, lora)  # type: ignore[arg-type]

    def slot_ranks(self, req: PickRequest, cands: Sequence[ReplicaState]) -> dict[str, int]:
        """Per replica 0 active, 1 free slot, 2 wait (lora.py); all 0 for the base model or an adapter-blind
        picker."""
        if req.adapter is None or not self.lora_affinity:
            return dict.fromkeys((r.id for r in cands), 0)
        return {r.id: SLOT_RANK[slot(r, req.adapter)] for r in cands}

    def matches(self, req: PickRequest, cands: Sequence[ReplicaState]) -> tuple[dict[str, int], set[str]]:
        """Cached leading blocks per replica, and the replicas scored from the approximate memory as a
        fallback (kv-events strategy, replica silent)."""
        ids = [r.id for r in cands]
        if self.strategy != "kv-events":
            return self.memory.match(req.block_hashes, ids), set()
        heard = [i for i in ids if self.index.heard(i)]
        silent = [i for i in ids if not self.index.heard(i)]
        out = self.index.match(req.block_hashes, heard) if heard else {}
        if silent:
            out.update(self.memory.match(req.block_hashes, silent))
        return out, set(silent)

    def _least_loaded(self, cands: Sequence[ReplicaState], req: PickRequest) -> ReplicaState:
        # Work, not requests (load.py): the prefill queued ahead of this request and the context each step
        # reads there, from the router's counts as of this very pick (a burst sees each earlier pick) plus
        # what the gauges add. Waits within two steps of the best rotate (`_rotate`). An adapter: the replicas
        # running it first (within the affinity guard), then those with a free LoRA slot, then the rest.
        ranks = self.slot_ranks(req, cands)
        adapter = req.adapter is not None and self.lora_affinity  # sticky to the adapter until saturated
        # the request's own prefill is its whole prompt on every replica: a cache-blind strategy cannot know
        # where its prefix is. Crediting the engines' recent prefix-cache hit share (scraped) fed on itself
        # (2 replicas, 1k-token prefixes, 3,000-token answers: 90 % of requests on one), and discounting the
        # queued prefill by it made the multi-turn shape worse (TTFT p99 1.9 -> 3.2 s): left out.
        key = [((adapter and ranks[r.id] == 2) or self.saturated(r, req.prompt_tokens, req), ranks[r.id],
                self.wait(r, req.prompt_tokens)) for r in cands]
        return self._rotate(cands, key)

    def _rotate(self, cands: Sequence[ReplicaState], key: Sequence[tuple[bool, int, float]],
                hits: dict[str, int] | None = None) -> ReplicaState:
        """The best-scored replica, where every replica within two decode steps of the best counts as tied,
        and ties go round-robin (the next after the last pick, in id order). Each replica's wait is known to
        within one step: the router cannot see where in its step an engine is (a request joins at the next
        step boundary), and its queue count drops only when a first token arrives, at the end of a step. So
        two waits differ by more than noise only past two steps; taking the strict minimum instead herds a
        burst onto the replica whose queue just emptied, i.e. whose step just began (4 replicas at 90 % load,
        50-token answers: TTFT p50 34.0 ms against round-robin's 30.3). Among equals, rotation spaces each
        replica's arrivals as evenly as round-robin does. `hits` (prefix strategies): among the tied, the
        longest cached prefix that saves more than the band first (sticky until its holder's wait is two
        steps past the best), then rotation among equal hits."""
        best = min(key)
        tol = 2 * min(self.step(r) for r in cands)
        tied = [r for r, k in zip(cands, key, strict=True) if k[:2] == best[:2] and k[2] <= best[2] + tol]
        # a cached prefix whose prefill saving is itself within that noise is no reason to break the rotation
        # (a 128-token system prompt: bursts of its group herded onto its holder, TTFT p90 +10 % on
        # round-robin); one that saves more holds the request among the tied
        strong = [r for r in tied if hits and load.ratio(r) * hits.get(r.id, 0) * self.block_size > tol]
        if strong:
            most = max(hits.get(r.id, 0) for r in strong)  # type: ignore[union-attr]
            tied = [r for r in strong if hits.get(r.id, 0) == most]  # type: ignore[union-attr]
        after = [r for r in tied if r.id > self.last]
        choice = after[0] if after else tied[0]
        self.last = choice.id
        return choice

    def saturated(self, r: ReplicaState, uncached: int, req: PickRequest) -> bool:
        """Admitting `req` would exceed r's own capacity: its sequence slots or its KV tokens."""
        if r.max_num_seqs is not None and r.requests + 1 > r.max_num_seqs:
            return True
        cap = r.kv_tokens
        if cap is None:
            return False
        held = max(float(r.in_flight_tokens), r.kv_usage * cap)
        return held + uncached + req.expected_output_tokens > cap

    def queue_tokens(self, r: ReplicaState) -> float:
        """Prefill work ahead of a new request on r, in tokens (load.queued)."""
        return load.queued(r, self.mean_uncached)

    def cost(self, r: ReplicaState, uncached: int, req: PickRequest) -> float:
        """What sending `req` to r adds to the fleet's time, in decode-step context-token reads (kept for
        callers; the picks use `wait`): its uncached prefill, after the prefill queued there, stalls every
        request running on r as long; its decode reads r's context each step and is read by the others."""
        out = req.expected_output_tokens
        busy = r.requests
        ctx = load.context(r, self.mean_context)
        prefill = self._ratio(r) * (self.queue_tokens(r) + uncached * (1.0 + busy))
        return prefill + out * (ctx + (req.prompt_tokens + out / 2) * busy)

    def wait(self, r: ReplicaState, uncached: int) -> float:
        """This request's own time to first token on r, in context-token reads (load.wait)."""
        return load.wait(r, uncached, self.mean_uncached, self.mean_context)

    def step(self, r: ReplicaState) -> float:
        """One decode step of r in context-token reads (load.step)."""
        return load.step(r, self.mean_context)

    def _ratio(self, r: ReplicaState) -> float:
        return load.ratio(r)

    def _session_hits(self, req: PickRequest, cands: Sequence[ReplicaState]) -> dict[str, int]:
        """Where no replica is known to hold any of the prompt, the conversation's last replica is credited
        with what its last turn left there (prompt + output, at most this prompt less one token), in blocks;
        the saturation guard and the load score then decide as for a remembered prefix."""
        if req.session is None:
            return {}
        last = self.sessions.get(req.session)
        if last is None or last[0] not in {r.id for r in cands}:
            return {}
        # only where the picker cannot see that replica's cache: a prompt it could not hash, a memory that
        # holds nothing of the replica (a restarted router), an engine that publishes no events. Where it
        # sees the cache and finds nothing, the history was evicted: crediting it anyway held conversations
        # behind queues for a prefill they then paid in full (2 replicas, 3,000-token answers, multi-turn:
        # kv-events TTFT p99 4.9 s against round-robin's 1.1)
        if req.block_hashes and not self._blind_to(last[0]):
            return {}
        self.sessions.move_to_end(req.session)
        return {last[0]: min(last[1], max(req.prompt_tokens - 1, 0)) // self.block_size}

    def _blind_to(self, replica: str) -> bool:
        """The picker knows nothing of `replica`'s cache: no KV events from it and nothing in the memory."""
        if self.strategy == "kv-events" and self.index.heard(replica):
            return False
        return self.memory.size(replica) == 0

    def _by_prefix(self, req: PickRequest, cands: list[ReplicaState]) -> tuple[ReplicaState, Reason, int]:
        hits, fallback = self.matches(req, cands)
        if not any(hits.values()):
            hits = {**hits, **self._session_hits(req, cands)}
        bs = self.block_size
        uncached_of: dict[str, int] = {}
        for r in cands:
            uncached_of[r.id] = req.prompt_tokens - min(hits.get(r.id, 0) * bs, max(req.prompt_tokens - 1, 0))
        # a replica where an adapter would wait for a LoRA slot counts as saturated (lora.py)
        ranks = self.slot_ranks(req, cands)
        sat = {r.id: self.saturated(r, uncached_of[r.id], req) or ranks[r.id] == 2 for r in cands}
        # Sticky until saturated, by the token-load scorer: each replica is scored by this request's own
        # wait there (load.wait), its cached prefix taken off its own prefill. A cached prefix therefore
        # holds the request exactly while the prefill it saves outweighs the extra work queued on its
        # holder; where nothing is shared every replica's wait is its load, and this is `least-loaded`.
        r = self._rotate(cands, [(sat[c.id], ranks[c.id], self.wait(c, uncached_of[c.id])) for c in cands], hits)
        hit = hits.get(r.id, 0)
        if hit == 0 or hit < max(hits.get(c.id, 0) for c in cands):
            reason: Reason = "load"  # not the longest cached prefix: load decided
        else:
            reason = "fallback" if r.id in fallback else "prefix"
        return r, reason, hit

    def _record(self, req: PickRequest, r: ReplicaState, hit: int) -> None:
        uncached = max(req.prompt_tokens - hit * self.block_size, 1)
        self.picks += 1
        self.mean_uncached += (uncached - self.mean_uncached) / min(self.picks, 1000)
        context = req.prompt_tokens + req.expected_output_tokens
        self.mean_context += (context - self.mean_context) / min(self.picks, 1000)
        if self.strategy in PREFIX_STRATEGIES and req.block_hashes:
            cap = None if r.kv_tokens is None else r.kv_tokens // self.block_size
            self.memory.remember(r.id, req.block_hashes, cap)
        if req.session is not None and self.strategy in PREFIX_STRATEGIES:
            self.sessions[req.session] = (r.id, context)
            self.sessions.move_to_end(req.session)
            while len(self.sessions) > SESSIONS:
                self.sessions.popitem(last=False)
