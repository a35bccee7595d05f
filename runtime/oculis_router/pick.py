"""Step 2 of the request path (plan -> pick -> call -> relay): which replica of the tier's upstream
serves this call. The choice itself is the pure picker core (`oculis_router.picking`); this module is
its shell: it keeps each upstream's replicas per revision (stable, canary) with what the router knows
of them, leases one per attempt and learns from the outcome.

- Replicas come from `replicas.py` (the config's `endpoints`, the sandbox endpoint map, or the
  Kubernetes EndpointSlices of the upstream's Service). A replica that leaves the set is drained: no
  new requests, its in-flight ones finish, and it is forgotten once they have.
- Load: the router's own in-flight count per replica (and the tokens those requests hold and still
  have to prefill), plus the engine's gauges scraped from its /metrics (`scrape.py`).
- A replica that refuses the connection, resets it or answers 5xx is set aside for `ASIDE_S`: the
  next attempt of the same call (and other calls meanwhile) goes to another replica. With every
  replica set aside the picker still picks among them: a request is never refused for it.
- An upstream with no replica source (a hosted provider, a plain base_url) is called at its
  base_url as before: its Service spreads connections.
- LoRA adapters (`picking/lora.py`): a call for an adapter goes only to replicas whose engine lists it
  (their `/v1/models`, read every `replicas.MODELS_S`), weighing each one's `maxLoras` slots (the scraped
  `vllm:lora_requests_info` plus the adapters of the router's own calls in flight there). When no replica
  of the revision lists it, `AdapterMissing` says so (the caller makes it a 503 with Retry-After, or the
  next tier), never a call that vLLM would answer with a 404.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from oculis import Upstream
from oculis_router import model_tokens
from oculis_router.metrics import Metrics
from oculis_router.model_tokens import ModelTokens
from oculis_router.picking import (
    DEFAULT_BLOCK_SIZE,
    PREFIX_STRATEGIES,
    LoraSlots,
    Pick,
    Picker,
    PickRequest,
    ReplicaState,
    adapter_root,
    approx_token_ids,
    block_hashes,
    chat_parts,
    holders,
)

log = logging.getLogger("oculis.router")
ASIDE_S = 5.0  # how long a replica that failed a call gets no new requests (unless no other is left)
DEFAULT_OUTPUT_TOKENS = 256  # expected output of a request without max_tokens, until the router has seen some


@dataclass
class Replica:
    """One replica of one revision of an upstream: what the router knows of it."""

    id: str  # the pod's name (Kubernetes, endpoint map) or the endpoint's URL (config)
    url: str  # its base URL (…/v1), dialled directly
    revision: str = "stable"
    kv_events: str | None = None  # its KV-event publisher (ZMQ), if it has one
    in_flight: int = 0
    in_flight_tokens: int = 0
    queued_tokens: int = 0
    context_tokens: int = 0  # prompt + expected output of the in-flight calls: what their decode steps read
    scraped_in_flight: int | None = None  # in_flight when the gauges were read: their excess is others' load
    gauges: dict[str, float] = field(default_factory=dict)  # waiting, running, kv_usage (scrape.py)
    kv_blocks: int | None = None
    block_size: int | None = None
    aside_until: float = 0.0
    draining: bool = False
    serves_adapters: bool = False  # its upstream declares LoRA adapters: its /v1/models is read (replicas.py)
    api_key_env: str | None = None  # its upstream's key variable or file: an engine run with --api-key guards
    api_key_file: str | None = None  # /v1/models (upstream_keys.read_key)
    adapters: frozenset[str] | None = None  # the adapters its engine lists (None: not read yet)
    models_read_at: float = 0.0  # monotonic time of that read
    lora_slots: LoraSlots = field(default_factory=LoraSlots)  # its vllm:lora_requests_info, scraped
    in_flight_adapters: Counter[str] = field(default_factory=Counter)  # adapters of the router's calls there

    def state(self, now: float, aside_ok: bool) -> ReplicaState:
        g, lora = self.gauges, self.lora_slots
        return ReplicaState(self.id, self.revision, in_flight=self.in_flight, in_flight_tokens=self.in_flight_tokens,
                            queued_tokens=self.queued_tokens, waiting=g.get("waiting", 0.0),
                            running=g.get("running", 0.0), kv_usage=g.get("kv_usage", 0.0), kv_blocks=self.kv_blocks,
                            block_size=self.block_size or DEFAULT_BLOCK_SIZE,
                            ready=aside_ok or self.aside_until <= now, draining=self.draining,
                            context_tokens=self.context_tokens, adapters=self.adapters, lora_running=lora.running,
                            lora_waiting=lora.waiting, in_flight_adapters=frozenset(+self.in_flight_adapters),
                            max_loras=lora.max_loras, scraped_in_flight=self.scraped_in_flight)


class AdapterMissing(Exception):
    """No replica of the revision lists the adapter a call asks for (vLLM would answer 404): the caller
    turns it into a 503 with Retry-After (the adapter is declared: the operator may still be loading it)
    or the next tier."""

    def __init__(self, upstream: str, adapter: str, revision: str, listed: list[frozenset[str] | None]) -> None:
        seen = sorted({a for names in listed for a in names or ()})
        # The router cannot tell a config the operator rendered from a hand-written one (the same schema),
        # so the hint names both: the engines' own list, and the GPUUpstream's status when there is one.
        super().__init__(f"adapter {adapter!r} is loaded on none of the {len(listed)} {revision} replicas of "
                         f"upstream {upstream!r} (their engines' /v1/models list: "
                         f"{', '.join(seen[:20]) or 'no adapter'}); load it on the engines (vLLM --lora-modules), "
                         f"or, if a GPUUpstream manages {upstream!r}, `kubectl get gu {upstream}` (ADAPTERS) and "
                         "its status say whether it is still loading or failed")
        self.upstream, self.adapter = upstream, adapter


def adapter_of(up: Upstream) -> str | None:
    """The LoRA adapter a call to `up` asks for: its model when that is one of its adapters (adapters.with_adapter
    sets it so), else None (the base model)."""
    return up.model if up.adapters and up.model in up.adapters else None


@dataclass
class Lease:
    """One attempt's hold on a replica: counted in flight until `release`; `failed` sets it aside."""

    pool: Pool
    replica: Replica
    pick: Pick
    tokens: int  # KV tokens the request holds there (uncached prompt + expected output)
    queued: int  # its prefill still ahead of its first token
    context: int  # prompt + expected output
    adapter: str | None = None  # the LoRA adapter it asked for (counted in the replica's in-flight adapters)
    released: bool = False

    @property
    def url(self) -> str:
        return self.replica.url

    def first_token(self) -> None:
        """Its prefill is done: no longer queued work on the replica."""
        self.replica.queued_tokens = max(0, self.replica.queued_tokens - self.queued)
        self.queued = 0

    def failed(self, retry_after: float | None = None) -> None:
        """Set the replica aside for ASIDE_S, or as long as its engine asked (a 503/429's Retry-After)."""
        aside = max(ASIDE_S, retry_after or 0.0)
        self.replica.aside_until = time.monotonic() + aside
        self.pool.metrics.replica_failures.labels(self.pool.name, self.replica.id).inc()
        log.warning("replica %s of upstream %s failed a call: set aside for %g s", self.replica.id,
                    self.pool.name, aside)
        self.release()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.first_token()
        r = self.replica
        r.in_flight = max(0, r.in_flight - 1)
        r.in_flight_tokens = max(0, r.in_flight_tokens - self.tokens)
        r.context_tokens = max(0, r.context_tokens - self.context)
        if self.adapter is not None:
            r.in_flight_adapters[self.adapter] -= 1
            if r.in_flight_adapters[self.adapter] <= 0:
                del r.in_flight_adapters[self.adapter]
        self.pool.metrics.replica_in_flight.labels(self.pool.name, r.id).set(r.in_flight)
        if r.draining and r.in_flight == 0:
            self.pool.drop(r)


@dataclass(frozen=True)
class Tokenized:
    """A prompt's model token ids, computed before the pick (`Fleet.tokenize`, off the event loop for a long
    prompt); `ids` None: the chat template refused the request, so its text is hashed."""

    ids: list[int] | None


def pick_request(body: dict[str, Any], endpoint: str, block_size: int, hashed: bool = True,
                 adapter: str | None = None, tokens: ModelTokens | None = None,
                 tokenized: Tokenized | None = None, session: str | None = None) -> PickRequest:
    """The request as the picker sees it: the token ids of its prompt, their chained block hashes (an
    adapter's apart from the base model's, as vLLM keeps them), its expected output and its LoRA adapter.
    With the upstream's `tokens` (its `tokenizer`) the ids are the model's own, chat template applied as
    vLLM does (`model_tokens.py`), so they equal real vLLM's KV events; without, or when the template
    cannot render the request, approximate ids (the same rendering the engine simulator counts). Without
    `hashed` (strategies that ignore prefixes) the prompt is only sized, at ~4 characters a token: hashing
    a 6,000-token prompt costs ~7 ms of the event loop, which only the prefix strategies repay.
    `session`: the conversation's key (a header the caller read); without it the body's OpenAI `user` field."""
    if session is None and isinstance(body.get("user"), str) and body["user"]:
        session = body["user"]
    return replace(_pick_request(body, endpoint, block_size, hashed, adapter, tokens, tokenized), session=session)


def _pick_request(body: dict[str, Any], endpoint: str, block_size: int, hashed: bool, adapter: str | None,
                  tokens: ModelTokens | None, tokenized: Tokenized | None) -> PickRequest:
    chat = endpoint == "chat" or "messages" in body
    if (tokens is not None or tokenized is not None) and hashed:
        ids = tokenized.ids if tokenized is not None else tokens.ids(body, chat) if tokens is not None else None
        if ids is not None:
            return PickRequest(block_hashes(ids, block_size, adapter_root(adapter)), len(ids),
                               _expected_output(body), adapter)
    if chat:
        messages = body.get("messages")
        texts = chat_parts(messages if isinstance(messages, list) else [])
    else:
        prompt = body.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt or [] if isinstance(p, str)]
    expected = _expected_output(body)
    if not hashed:
        return PickRequest((), sum(map(len, texts)) // 4, expected, adapter)
    ids = approx_token_ids(texts)
    return PickRequest(block_hashes(ids, block_size, adapter_root(adapter)), len(ids), expected, adapter)


def _expected_output(body: dict[str, Any]) -> int:
    out = body.get("max_completion_tokens") or body.get("max_tokens")
    return out if isinstance(out, int) and not isinstance(out, bool) and out > 0 else DEFAULT_OUTPUT_TOKENS


class Pool:
    """The replicas of one upstream, per revision, and its picker (one memory for all its replicas)."""

    def __init__(self, name: str, strategy: str, metrics: Metrics) -> None:
        self.name, self.metrics = name, metrics
        self.picker = Picker(strategy, seed=zlib.crc32(name.encode()))  # type: ignore[arg-type]
        self.replicas: dict[str, Replica] = {}

    @property
    def strategy(self) -> str:
        return self.picker.strategy

    def members(self, revision: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.revision == revision]

    def sync(self, found: Iterable[Replica]) -> None:
        """The replicas now found (all revisions): new ones join, missing ones drain."""
        seen = {r.id: r for r in found}
        for rid, new in seen.items():
            old = self.replicas.get(rid)
            if old is None:
                self.replicas[rid] = new
                log.info("upstream %s: replica %s (%s) joined at %s", self.name, rid, new.revision, new.url)
            else:  # back, or moved (a pod keeps its name, a map entry its port): take the new address
                old.url, old.revision, old.kv_events, old.draining = new.url, new.revision, new.kv_events, False
                old.serves_adapters, old.api_key_env, old.api_key_file = new.serves_adapters, new.api_key_env, \
                    new.api_key_file
        for rid, r in list(self.replicas.items()):
            if rid not in seen and not r.draining:
                r.draining = True
                log.info("upstream %s: replica %s left; draining (%d in flight)", self.name, rid, r.in_flight)
                if r.in_flight == 0:
                    self.drop(r)

    def drop(self, r: Replica) -> None:
        if self.replicas.get(r.id) is r:
            del self.replicas[r.id]
            self.picker.forget(r.id)
            self.metrics.replica_in_flight.remove(self.name, r.id)

    def block_size(self) -> int:
        """The engines' block size: scraped (cache_config_info), else as their KV events carry it."""
        scraped = next((r.block_size for r in self.replicas.values() if r.block_size), None)
        return scraped or self.picker.index.block_size_seen or DEFAULT_BLOCK_SIZE

    def lease(self, body: dict[str, Any], endpoint: str, revision: str, tried: set[str],
              adapter: str | None = None, tokenizer: ModelTokens | None = None,
              tokenized: Tokenized | None = None, only: Collection[str] | None = None) -> Lease | None:
        """A replica of `revision` for this attempt (not one this call already tried, while another is
        left), leased; None when the revision has no replica at all (then the base URL is called).
        `adapter`: only replicas that list it (AdapterMissing when none does). `tokenizer`: the
        upstream's, when it names one; `tokenized`: the prompt's ids with it, computed beforehand.
        `only`: the replica ids that may serve (the endpoint picker's reachable ones and subset hint)."""
        members = self.members(revision)
        if only is not None:
            members = [r for r in members if r.id in only]
        if not members:
            return None
        now = time.monotonic()
        if adapter is not None:
            live = [r for r in members if not r.draining]
            held = {s.id for s in holders(adapter, [r.state(now, True) for r in live])}
            if not held:
                raise AdapterMissing(self.name, adapter, revision, [r.adapters for r in live])
            members = [r for r in members if r.id in held]
        bs = self.block_size()
        if self.picker.block_size != bs:  # the engines' block size, once scraped (hashes follow it)
            self.picker.block_size = self.picker.index.block_size = bs
        req = pick_request(body, endpoint, bs, self.strategy in PREFIX_STRATEGIES, adapter, tokenizer, tokenized)
        fresh = [r for r in members if r.id not in tried and not r.draining]
        cands = fresh or [r for r in members if not r.draining] or members
        states = [r.state(now, aside_ok=False) for r in cands]
        if not any(s.eligible for s in states):  # every one set aside (or draining): better one than none
            states = [replace(s, ready=True, draining=False) for s in (r.state(now, True) for r in cands)]
        p = self.picker.pick(req, states)
        assert p is not None  # at least one state is eligible
        r = self.replicas[p.replica]
        cached = min(p.cached_blocks * bs, req.prompt_tokens)
        tokens = req.prompt_tokens - cached + req.expected_output_tokens
        r.in_flight += 1
        r.in_flight_tokens += tokens
        r.queued_tokens += req.prompt_tokens - cached
        r.context_tokens += req.prompt_tokens + req.expected_output_tokens
        m = self.metrics
        m.picks.labels(self.name, self.strategy, p.reason).inc()
        if adapter is not None:
            r.in_flight_adapters[adapter] += 1
            m.adapter_picks.labels(self.name, adapter, p.slot or "free").inc()
        m.replica_in_flight.labels(self.name, r.id).set(r.in_flight)
        m.pick_prompt_tokens.labels(self.name).inc(req.prompt_tokens)
        m.pick_cached_tokens.labels(self.name).inc(cached)
        return Lease(self, r, p, tokens, req.prompt_tokens - cached, req.prompt_tokens + req.expected_output_tokens,
                     adapter)


class Fleet:
    """The pools of every upstream with replicas; kept across config reloads (memories stay warm)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.pools: dict[str, Pool] = {}
        # Re-reads the replica sources now (the app sets it): a retry after a failed replica looks again
        # rather than wait for the next periodic sync, as a pod that just went is why attempts fail.
        self.refresh: Callable[[], None] | None = None

    def pool(self, up: Upstream) -> Pool | None:
        p = self.pools.get(up.name)
        return p if p is not None and p.replicas else None

    def sync(self, found: dict[str, tuple[str, list[Replica]]]) -> None:
        """upstream -> (strategy, its replicas now). A pool whose strategy changed starts afresh; one whose
        upstream has no replica source any more is dropped once its in-flight calls end."""
        for name, (strategy, replicas) in found.items():
            pool = self.pools.get(name)
            if pool is None or pool.strategy != strategy:
                old, pool = pool, Pool(name, strategy, self.metrics)
                if old is not None:  # carry the in-flight counts: those calls still end on these objects
                    pool.replicas = old.replicas
                self.pools[name] = pool
            pool.sync(replicas)
        for name in [n for n in self.pools if n not in found]:
            self.pools[name].sync([])
            if not self.pools[name].replicas:
                del self.pools[name]

    async def tokenize(self, up: Upstream, body: dict[str, Any], endpoint: str) -> Tokenized | None:
        """The prompt's model token ids for `up`'s prefix picker, before any pick (a long prompt in a worker
        thread: model_tokens.prompt_ids); None when there is nothing to compute (no replicas to pick, no
        tokenizer, or a strategy that ignores prefixes)."""
        pool = self.pool(up)
        if pool is None or not up.tokenizer or pool.strategy not in PREFIX_STRATEGIES:
            return None
        tokens = model_tokens.load(up.tokenizer)  # loaded when the config was built (state.py): a lookup
        return Tokenized(await model_tokens.prompt_ids(tokens, body, endpoint == "chat" or "messages" in body))

    def lease(self, up: Upstream, body: dict[str, Any], endpoint: str, revision: str,
              tried: set[str], tokenized: Tokenized | None = None) -> Lease | None:
        if tried and self.refresh is not None:
            self.refresh()
        pool = self.pool(up)
        if pool is None:
            return None
        # loaded when the config was built (state.py), so this is a dict lookup; unused with `tokenized`
        tokenizer = model_tokens.load(up.tokenizer) if up.tokenizer and tokenized is None else None
        return pool.lease(body, endpoint, revision, tried, adapter_of(up), tokenizer, tokenized)
