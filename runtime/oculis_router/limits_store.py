"""Where the limits' counts live, and the thin shell that admits and settles requests with them.

Two backends behind one protocol, both applying `limits.fits` atomically to all of a request's
counters at once (all admit, or none is charged):
- memory: this replica only (one event loop, no await between check and add, so atomic);
- redis: shared by every replica, through two server-side Lua scripts registered with redis-py's
  `register_script` (EVALSHA, reloaded by redis-py after a Redis restart empties its script cache).
A key is a hash of slice -> amount; reserving drops the slices that left the window, sums the rest and
adds the reservation only if every counter has room; settling adds the difference between the real
usage and the reservation to the same slice, so concurrent requests overshoot by at most the error
of one reservation, never by how many are in flight.
When Redis fails, `server.limiter.on_backend_error` decides (allow: admit uncounted; deny: 429), a
warning is logged at most every WARN_EVERY_S and `oculis_limiter_backend_errors_total` counts it;
never a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from oculis.router import Route, ServerSettings
from oculis.router_upstream import Pricing
from oculis_router import limits as L
from oculis_router.answer_check import Grading
from oculis_router.cache import drop_idle, new_redis_client
from oculis_router.usage import Usage

log = logging.getLogger("oculis.router")

RESERVE_LUA = """
-- KEYS: one hash per counter (slice -> amount). ARGV: per counter slot, oldest, limit, amount, ttl.
-- Admit only if every counter has room; then add each amount to its slot. Returns {admitted, states}:
-- admitted, each counter's {total before, newest slot} (all the headers need: a short reply to parse);
-- refused, each counter's slices (flat: slot, amount, ...), to say when the request would fit. Strings.
local admitted = 1
local states = {}
local totals = {}
for i = 1, #KEYS do
  local b = (i - 1) * 5
  local oldest = tonumber(ARGV[b + 2])
  local flat = redis.call('HGETALL', KEYS[i])
  local used = 0
  local newest = -1
  local kept = {}
  for j = 1, #flat, 2 do
    local slot = tonumber(flat[j])
    if slot < oldest then
      redis.call('HDEL', KEYS[i], flat[j])
    else
      used = used + tonumber(flat[j + 1])
      if slot > newest then newest = slot end
      kept[#kept + 1] = flat[j]
      kept[#kept + 1] = flat[j + 1]
    end
  end
  if used + tonumber(ARGV[b + 4]) > tonumber(ARGV[b + 3]) + 1e-9 then
    admitted = 0
  end
  states[i] = kept
  totals[i] = {tostring(used), tostring(newest)}
end
if admitted == 1 then
  for i = 1, #KEYS do
    local b = (i - 1) * 5
    redis.call('HINCRBYFLOAT', KEYS[i], ARGV[b + 1], ARGV[b + 4])
    redis.call('EXPIRE', KEYS[i], ARGV[b + 5])
  end
  return {admitted, totals}
end
return {admitted, states}
"""

SETTLE_LUA = """
-- KEYS: the counters a request reserved. ARGV: per counter slot, delta, oldest. The delta goes to the
-- reservation's slot while that still counts (else it has left the window: nothing to correct).
-- Returns each counter's total afterwards, as a string.
local out = {}
for i = 1, #KEYS do
  local b = (i - 1) * 3
  local delta = tonumber(ARGV[b + 2])
  if delta ~= 0 and redis.call('HEXISTS', KEYS[i], ARGV[b + 1]) == 1 then
    local v = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], ARGV[b + 1], ARGV[b + 2]))
    if v <= 1e-12 then
      redis.call('HDEL', KEYS[i], ARGV[b + 1])
    end
  end
  local flat = redis.call('HGETALL', KEYS[i])
  local total = 0
  for j = 1, #flat, 2 do
    if tonumber(flat[j]) >= tonumber(ARGV[b + 3]) then
      total = total + tonumber(flat[j + 1])
    end
  end
  out[i] = tostring(total)
end
return out
"""


class Backend(Protocol):
    """`reserve` answers whether all counters had room (and were charged) with their slices before it;
    when admitted those may be summarised as one slice {newest slot: total}, all the headers read."""

    name: str

    async def reserve(self, counters: Sequence[L.Counter],
                      amounts: Sequence[float]) -> tuple[bool, list[dict[int, float]]]: ...
    async def settle(self, counters: Sequence[L.Counter], deltas: Sequence[float]) -> list[float]: ...
    async def close(self) -> None: ...


class MemoryBackend:
    """Counts of this process only: with several replicas each admits up to the whole limit."""

    name = "memory"
    SWEEP_EVERY = 1000

    def __init__(self) -> None:
        self._data: dict[str, tuple[float, dict[int, float]]] = {}  # key -> (expires at, slices)
        self._ops = 0

    def _slices(self, c: L.Counter, now: float) -> dict[int, float]:
        found = self._data.get(c.key)
        slices = found[1] if found and found[0] > now else {}
        for s in [s for s in slices if s < c.oldest]:
            del slices[s]
        return slices

    async def reserve(self, counters: Sequence[L.Counter],
                      amounts: Sequence[float]) -> tuple[bool, list[dict[int, float]]]:
        now = time.time()
        self._ops += 1
        if self._ops % self.SWEEP_EVERY == 0:  # keys of tenants that went quiet: memory stays bounded
            self._data = {k: v for k, v in self._data.items() if v[0] > now}
        states = [self._slices(c, now) for c in counters]
        before = [dict(s) for s in states]
        ok = all(L.fits(s, c, a) for c, s, a in zip(counters, states, amounts, strict=True))
        if ok:
            for c, s, a in zip(counters, states, amounts, strict=True):
                s[c.slot] = s.get(c.slot, 0.0) + a
                self._data[c.key] = (now + c.ttl_s, s)
        return ok, before

    async def settle(self, counters: Sequence[L.Counter], deltas: Sequence[float]) -> list[float]:
        now = time.time()
        out = []
        for c, d in zip(counters, deltas, strict=True):
            s = self._slices(c, now)
            if d and c.slot in s:
                s[c.slot] += d
                if s[c.slot] <= 1e-12:
                    del s[c.slot]
            out.append(L.used(s, c))
        return out

    async def close(self) -> None:
        self._data.clear()


class RedisBackend:
    TIMEOUT_S = 0.25  # as the cache's: a slow Redis must not hold every request

    name = "redis"

    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
        self._redis = new_redis_client(url)  # the cache's timeouts (TIMEOUT_S) and its recycling pool
        self._reserve = self._redis.register_script(RESERVE_LUA)
        self._settle = self._redis.register_script(SETTLE_LUA)

    async def reserve(self, counters: Sequence[L.Counter],
                      amounts: Sequence[float]) -> tuple[bool, list[dict[int, float]]]:
        args: list[Any] = []
        for c, a in zip(counters, amounts, strict=True):
            args += [c.slot, c.oldest, repr(c.limit), repr(a), c.ttl_s]
        try:
            admitted, states = await self._reserve(keys=[c.key for c in counters], args=args)
        except self.errors:
            await drop_idle(self._redis)  # a restarted Redis left every idle connection dead
            raise
        if int(admitted):  # {total, newest slot}: one slice standing for all, as far as headers go
            return True, [{int(newest): float(total)} if float(total) > 0 else {} for total, newest in states]
        return False, [{int(flat[j]): float(flat[j + 1]) for j in range(0, len(flat), 2)} for flat in states]

    async def settle(self, counters: Sequence[L.Counter], deltas: Sequence[float]) -> list[float]:
        args: list[Any] = []
        for c, d in zip(counters, deltas, strict=True):
            args += [c.slot, repr(d), c.oldest]
        try:
            totals = await self._settle(keys=[c.key for c in counters], args=args)
        except self.errors:
            await drop_idle(self._redis)
            raise
        return [float(t) for t in totals]

    async def close(self) -> None:
        await self._redis.aclose()


class BudgetGauge(Collector):
    """`oculis_budget_remaining_dollars{scope, subject}` for the TOP_N subjects closest to their
    budget: a bounded number of series however many tenants there are (subjects are digests)."""

    TOP_N = 20
    REMEMBER = 2000

    def __init__(self) -> None:
        self._last: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # -> (remaining, ends)

    def observe(self, c: L.Counter, total: float) -> None:
        k = (c.scope, c.subject)
        self._last[k] = (max(c.limit - total, 0.0), c.period_end)
        self._last.move_to_end(k)
        while len(self._last) > self.REMEMBER:
            self._last.popitem(last=False)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("oculis_budget_remaining_dollars", f"Dollars left in the current budget period, "
                              f"for the {self.TOP_N} tenants, keys or routes with the least left",
                              labels=["scope", "subject"])
        now = time.time()
        live = [(v[0], k) for k, v in self._last.items() if v[1] > now]
        for remaining, (scope, subject) in sorted(live)[: self.TOP_N]:
            g.add_metric([scope, subject], remaining)
        yield g


class LimitMetrics:
    """The limiter's metrics, once per registry (a reload builds a new limiter, not new metrics)."""

    _per_registry: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, LimitMetrics]] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rate_limited = Counter("oculis_rate_limited", "Requests refused by a rate limit or budget",
                                    ["route", "kind"], registry=registry)
        self.backend_errors = Counter("oculis_limiter_backend_errors", "Limiter store (Redis) calls that failed",
                                      ["backend", "op"], registry=registry)
        self.budget = BudgetGauge()
        registry.register(self.budget)

    @classmethod
    def of(cls, registry: CollectorRegistry) -> LimitMetrics:
        found = cls._per_registry.get(registry)
        if found is None:
            found = cls._per_registry[registry] = cls(registry)
        return found


class NotTried(ConnectionError):
    """The store failed a moment ago, so this call was not made."""


class Limiter:
    """Admits and settles requests against the policy of the config in force (passed per call, so a
    reload changes limits without losing counts: they live in the backend, kept across reloads)."""

    WARN_EVERY_S = 10.0
    # After a failure the store is left alone this long: an unreachable Redis (packets dropped, not
    # refused) would otherwise cost every request its socket timeout.
    BACK_OFF_S = 1.0

    def __init__(self, backend: Backend, metrics: LimitMetrics, on_backend_error: str) -> None:
        self.backend, self.metrics, self.on_backend_error = backend, metrics, on_backend_error
        self._warned_at = -self.WARN_EVERY_S
        self._down_until = 0.0
        self._settling: set[asyncio.Task[None]] = set()  # settlements under way (kept: the loop holds weak refs)

    def _failed(self, op: str, exc: BaseException) -> None:
        self.metrics.backend_errors.labels(self.backend.name, op).inc()
        now = time.monotonic()
        if not isinstance(exc, NotTried):  # a real failure: only that starts (or extends) the pause
            self._down_until = now + self.BACK_OFF_S
        if now - self._warned_at >= self.WARN_EVERY_S:
            self._warned_at = now
            log.warning("rate limiter store (%s) failed on %s, %s: %s: %s", self.backend.name, op,
                        "refusing requests (on_backend_error: deny)" if self.on_backend_error == "deny" and
                        op == "reserve" else "serving uncounted", type(exc).__name__, exc)

    async def admit(self, server: ServerSettings, route: Route | None, route_label: str, who: L.Identity,
                    body: Mapping[str, Any], prompt_tokens: int | None, prices: Sequence[Pricing],
                    replaceable: Sequence[bool] = (), graded: Sequence[Grading | None] = (),
                    free: bool = False) -> Hold | None:
        """A hold to settle at the request's end, None when no limit applies; raises the 429.
        `prompt_tokens`: the classifier's count, when the request was classified (else estimated here);
        `replaceable[i]`: tier i's answer may be replaced by the next one's, so both are billed;
        `graded[i]`: a verifier grades tier i's answer (limits.worst_cost); `free`: an answer that
        spends nothing (a cache hit), checked and counted by the request limits only."""
        policy = L.policy_for(server, route, who)
        now = time.time()
        counters = [c for c in L.counters_for(policy, who, route_label, now)
                    if not free or c.kind == "requests_per_minute"]
        if not counters:
            return None
        if prompt_tokens is None:
            prompt_tokens = prompt_tokens_of(body)
        res = L.reservation(body, prompt_tokens, server.limiter.reserve_max_tokens, prices, replaceable, graded)
        amounts = [L.amount(c, res) for c in counters]
        try:
            if time.monotonic() < self._down_until:
                raise NotTried(f"failed less than {self.BACK_OFF_S:g} s ago; not tried")
            admitted, states = await self.backend.reserve(counters, amounts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # whatever the store does, a request gets an answer, not a 500
            self._failed("reserve", exc)
            if self.on_backend_error == "deny":
                self.metrics.rate_limited.labels(route_label, "backend_error").inc()
                raise L.backend_down_error(self.backend.name) from None
            return Hold(self, L.Ticket(counters, amounts, res, {}, counted=False))
        verdict = L.judge(counters, states, amounts, admitted, now)
        if not verdict.admitted:
            err = L.refusal_error(verdict, route_label, now)
            self.metrics.rate_limited.labels(route_label, err.kind).inc()
            raise err
        for c, s, a in zip(counters, states, amounts, strict=True):
            if c.kind == "budget":
                self.metrics.budget.observe(c, L.used(s, c) + a)
        return Hold(self, L.Ticket(counters, amounts, res, verdict.headers))

    async def settle(self, ticket: L.Ticket | None) -> None:
        """Replace the reservation by what was used; once per ticket, never raises."""
        if ticket is None or ticket.settled:
            return
        ticket.settled = True
        if not ticket.counted:
            return
        try:
            totals = await self.backend.settle(ticket.counters, L.settlement(ticket))
        except Exception as exc:  # the count stays reserved: it leaves with its window
            self._failed("settle", exc)
            return
        for c, total in zip(ticket.counters, totals, strict=True):
            if c.kind == "budget":
                self.metrics.budget.observe(c, total)

    def settle_soon(self, ticket: L.Ticket) -> None:
        task = asyncio.get_running_loop().create_task(self.settle(ticket))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def close(self) -> None:
        if self._settling:  # what is under way lands before the connection goes
            await asyncio.wait(self._settling, timeout=5)
        await self.backend.close()


def build_limiter(server: ServerSettings, registry: CollectorRegistry) -> Limiter:
    backend_name = server.limiter.backend or server.cache_backend
    backend: Backend
    if backend_name == "redis":
        assert server.redis_url  # ServerSettings refuses redis without a URL
        backend = RedisBackend(server.redis_url)
    else:
        backend = MemoryBackend()
    return Limiter(backend, LimitMetrics.of(registry), server.limiter.on_backend_error)


@dataclass
class Hold:
    """What the HTTP handler holds for one admitted request: record the answer's usage where it is
    accounted, then settle once (shielded: a client leaving mid-settle does not leave it half done)."""

    limiter: Limiter
    ticket: L.Ticket

    @property
    def headers(self) -> dict[str, str]:
        return self.ticket.headers

    def record(self, pricing: Pricing, usage: Usage | None) -> None:
        self.ticket.record(pricing, usage)

    def relayed(self, chunk: bytes) -> None:
        self.ticket.events += chunk.count(b"data:")

    async def settle(self) -> None:
        """Started, not awaited: the answer goes out without waiting on Redis (a round trip saved per
        request), and a client leaving cannot cancel it. Until it lands the count holds the
        reservation, which only errs on the side of the limit."""
        if self.ticket.settled:
            return
        if isinstance(self.limiter.backend, MemoryBackend):  # no I/O to wait on: settled in place
            await self.limiter.settle(self.ticket)
        else:
            self.limiter.settle_soon(self.ticket)


def prompt_tokens_of(body: Mapping[str, Any]) -> int:
    """Prompt tokens of a request no route classified (one naming an upstream), by the classifier's
    own tokenizer (one loaded copy) and its estimate for images and audio."""
    from oculis_router.classify import MEDIA_PART_TOKENS, media_parts, piece_ids
    from oculis_router.content import content_text

    messages = body.get("messages")
    if isinstance(messages, list):
        text = "\n".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))
        return piece_ids(text)[1] + media_parts(messages) * MEDIA_PART_TOKENS
    prompt = body.get("prompt")
    return piece_ids("\n".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt or ""))[1]


