"""The asyncio shell of flow control: one gate per upstream holds requests that find no free seat and
lets them through, in the order the queue policy (`policy.py`) says, as seats free. A request's seat
is held from its dispatch until its answer ends (`Ticket.release`); a request whose client leaves is
taken out of its queue at once (its task is cancelled); one past its deadline or its route's queue
bound is refused with `Shed` (the router answers 429 with Retry-After)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from oculis_router.flowcontrol.policy import FlowQueues, Item, ShedReason
from oculis_router.flowcontrol.standing import BATCH_PRIORITY

log = logging.getLogger("oculis.router")
RECHECK_S = 0.1  # while requests wait, the seats are re-read this often (scraped engine load changes too)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)


class Shed(Exception):
    """A request flow control refused: its route's queue was full, or it waited past its TTL."""

    def __init__(self, reason: ShedReason, upstream: str, retry_after: int, waited: float) -> None:
        what = ("the route's queue of requests waiting for a free seat is full" if reason == "queue_full"
                else f"no seat of upstream {upstream!r} freed within the route's queue TTL ({waited:.1f} s waited)")
        super().__init__(f"{what}: the fleet is saturated; retry after {retry_after} s")
        self.reason, self.upstream, self.retry_after = reason, upstream, retry_after


class FlowMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.queued = Gauge("oculis_flow_queue_length", "Requests waiting for a free seat, by upstream, flow and "
                            "priority", ["upstream", "flow", "priority"], registry=r)
        self.wait = Histogram("oculis_flow_queue_wait_seconds", "Time requests waited for a seat before dispatch",
                              ["upstream", "flow", "priority"], buckets=WAIT_BUCKETS, registry=r)
        self.dispatches = Counter("oculis_flow_dispatches", "Requests let through to an upstream by flow control "
                                  "(at once or after waiting)", ["upstream", "flow", "priority"], registry=r)
        self.sheds = Counter("oculis_flow_sheds", "Requests refused by flow control (429): queue_full or ttl",
                             ["upstream", "route", "priority", "reason"], registry=r)
        self.left = Counter("oculis_flow_abandoned", "Waiting requests whose client left (taken out of the queue)",
                            ["upstream", "priority"], registry=r)
        self.in_flight = Gauge("oculis_flow_in_flight", "Requests flow control let through and not seen finish",
                               ["upstream"], registry=r)


@dataclass
class Ticket:
    """A dispatched request's seat, held until `release` (idempotent)."""

    gate: Gate
    scavenger: bool = False  # a batch line's seat
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate.done(self.scavenger)


def scavenger(priority: int) -> bool:
    """Batch work: it takes only seats nothing else holds, and holds none against interactive requests."""
    return priority <= BATCH_PRIORITY


@dataclass
class Gate:
    """The seats of one upstream and the requests waiting for them."""

    name: str
    # (the requests in flight that count against it, whether it is batch work) -> may one more go now?
    free: Callable[[int, bool], bool]
    metrics: FlowMetrics
    clock: Callable[[], float] = time.monotonic
    in_flight: int = 0
    in_flight_batch: int = 0
    queues: FlowQueues = field(default_factory=FlowQueues)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    ticker: asyncio.Task[None] | None = None

    def can_go(self, priority: int) -> bool:
        """Seats: batch work counts every request in flight (it runs only on seats all others leave free);
        an interactive request counts the interactive ones only, so batch lines already running never
        keep it waiting: the engine runs it beside them (its max_num_seqs above the seats) and, with
        priority scheduling, preempts them first when KV blocks run out."""
        scav = scavenger(priority)
        return self.free(self.in_flight if scav else self.in_flight - self.in_flight_batch, scav)

    async def acquire(self, item: Item, max_queue: int) -> Ticket:
        if self.try_now(item.priority):  # nothing before it waits and its seat is free: straight through
            self._dispatch(item)
            return Ticket(self, scavenger(item.priority))
        why = self.queues.offer(item, max_queue)
        if why is not None:
            raise self._shed(item, why)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[item.id] = fut
        self._queued(item, +1)
        self.pump()
        self._tick()
        try:
            await fut
        except asyncio.CancelledError:  # the client left (or shutdown): out of the queue, or its seat back
            if self.queues.remove(item.id):
                self._queued(item, -1)
                self.metrics.left.labels(self.name, str(item.priority)).inc()
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                self.done(scavenger(item.priority))  # dispatched just as it was cancelled: its seat back
            raise
        finally:
            self.waiters.pop(item.id, None)
        return Ticket(self, scavenger(item.priority))

    def try_now(self, priority: int) -> bool:
        """Whether a request may go straight through (nothing of its priority or above waits, and a seat
        it may take is free)."""
        head = self.queues.peek()
        return (head is None or head.priority < priority) and self.can_go(priority)

    def done(self, scav: bool = False) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if scav:
            self.in_flight_batch = max(0, self.in_flight_batch - 1)
        self.metrics.in_flight.labels(self.name).set(self.in_flight)
        self.pump()

    def pump(self) -> None:
        """Let waiting requests through while seats are free; shed those past their deadline."""
        now = self.clock()
        for item in self.queues.expired(now):
            self._queued(item, -1)
            fut = self.waiters.get(item.id)
            if fut is not None and not fut.done():
                fut.set_exception(self._shed(item, "ttl"))
        # the head goes first; when it cannot, nothing behind it can (a lower priority counts as many seats)
        while (head := self.queues.peek()) is not None and self.can_go(head.priority):
            nxt = self.queues.pop()
            assert nxt is not None
            item = nxt
            self._queued(item, -1)
            fut = self.waiters.get(item.id)
            if fut is None or fut.done():
                continue  # its task is gone: no seat for it
            self._dispatch(item)
            fut.set_result(None)

    def _dispatch(self, item: Item) -> None:
        self.in_flight += 1
        if scavenger(item.priority):
            self.in_flight_batch += 1
        p = str(item.priority)
        self.metrics.in_flight.labels(self.name).set(self.in_flight)
        self.metrics.dispatches.labels(self.name, item.flow, p).inc()
        self.metrics.wait.labels(self.name, item.flow, p).observe(max(0.0, self.clock() - item.enqueued_at))

    def _shed(self, item: Item, why: ShedReason) -> Shed:
        self.metrics.sheds.labels(self.name, item.route, str(item.priority), why).inc()
        ttl = item.deadline - item.enqueued_at
        # Come back when the queue may have moved: the TTL a request may wait, at least 1 s, at most 60 s
        # (the OpenAI SDK honours Retry-After up to 60 s)
        return Shed(why, self.name, min(60, max(1, math.ceil(ttl))), self.clock() - item.enqueued_at)

    def _queued(self, item: Item, delta: int) -> None:
        g = self.metrics.queued.labels(self.name, item.flow, str(item.priority))
        g.inc(delta)

    def _tick(self) -> None:
        """Re-read the seats while anything waits: engine load the router does not count (other routers,
        a scrape) frees seats too, and deadlines pass without any release."""
        if self.ticker is None or self.ticker.done():
            self.ticker = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.queues:
            await asyncio.sleep(RECHECK_S)
            try:
                self.pump()
            except Exception:  # never let the ticker die with requests waiting
                log.exception("flow control gate %s: pump failed", self.name)


class FlowControl:
    """The gates of every upstream (kept across config reloads: their waiting requests and seats stay)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.metrics = FlowMetrics(registry)
        self.gates: dict[str, Gate] = {}
        self.ids = itertools.count(1)

    def gate(self, upstream: str, free: Callable[[int, bool], bool]) -> Gate:
        g = self.gates.get(upstream)
        if g is None:
            g = self.gates[upstream] = Gate(upstream, free, self.metrics)
        g.free = free  # the config's seats may have changed
        return g

    async def acquire(self, upstream: str, free: Callable[[int, bool], bool], *, flow: str, priority: int, route: str,
                      ttl: float, max_queue: int, weight: float = 1.0) -> Ticket:
        g = self.gate(upstream, free)
        now = g.clock()
        return await g.acquire(Item(next(self.ids), flow, priority, route, now, now + ttl, weight), max_queue)

    def close(self) -> None:
        for g in self.gates.values():
            if g.ticker is not None:
                g.ticker.cancel()
