"""Flow control on the request path: after admission (limits, budgets), before the upstream call, a
request takes a seat of its first tier's upstream, waiting for one in its flow's queue when the
replicas are full; the seat is given back when its answer ends (a stream's when the stream does)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine
from typing import Any

from starlette.responses import Response, StreamingResponse

from oculis import ServerSettings
from oculis_router.errors import APIError
from oculis_router.flowcontrol.gate import FlowControl, Shed, Ticket
from oculis_router.flowcontrol.seats import free_seat
from oculis_router.flowcontrol.standing import BATCH_PRIORITY, Standing
from oculis_router.pick import Fleet
from oculis_router.plan import Plan

BATCH_LINE_TTL_S = 3600.0  # a batch line shed past it is tried again by its runner (batch/runner.py)


async def take_seat(flow: FlowControl, fleet: Fleet, server: ServerSettings, plan: Plan, route_label: str,
                    who: Standing, left: Callable[[], Awaitable[None]] | None) -> Ticket | None:
    """A seat of the plan's first upstream (None: flow control is off); an APIError 429 with Retry-After
    when the route's queue is full or the wait passes its TTL. `left` returns when the client goes away:
    the wait then ends at once (its queue place is given up) and CancelledError is raised."""
    fc = server.flow_control
    if not fc.enabled:
        return None
    up = plan.tiers[0]
    seats = fc.seats_per_replica
    rfc = plan.route.route.flow_control if plan.route else None
    ttl = rfc.queue_ttl_seconds if rfc is not None and rfc.queue_ttl_seconds is not None else fc.queue_ttl_seconds
    bound = rfc.max_queue if rfc is not None and rfc.max_queue is not None else fc.max_queue
    if who.priority == BATCH_PRIORITY:  # a batch line: its runner bounds how many wait; it may wait long
        ttl, bound = BATCH_LINE_TTL_S, 1 << 30

    def free(in_flight: int, batch: bool) -> bool:
        return free_seat(fleet, up, in_flight, seats, batch)

    gate = flow.gate(up.name, free)
    wait = flow.acquire(up.name, free, flow=who.flow, priority=who.priority, route=route_label, ttl=ttl,
                        max_queue=bound, weight=who.weight)
    try:
        if gate.try_now(who.priority) or left is None:
            return await wait
        return await _unless(wait, left())
    except Shed as shed:
        raise APIError(429, f"{shed}", type_="rate_limit_error", code="fleet_saturated",
                       headers={"retry-after": str(shed.retry_after),
                                "retry-after-ms": str(shed.retry_after * 1000),
                                "x-oculis-flow-control": shed.reason}) from None


async def _unless(wait: Coroutine[Any, Any, Ticket], left: Awaitable[None]) -> Ticket:
    """`wait`, unless the client leaves first (then the wait is cancelled and CancelledError raised)."""
    task = asyncio.ensure_future(wait)
    watcher = asyncio.ensure_future(left)
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:  # dispatched in the same turn: give the seat back
        task.result().release()
    raise asyncio.CancelledError


class _Releasing:
    """A stream's body that gives its seat back when it ends, fails, is closed, or is dropped unstarted."""

    def __init__(self, inner: AsyncIterable[Any], ticket: Ticket) -> None:
        self.inner, self.ticket = aiter(inner), ticket

    def __aiter__(self) -> _Releasing:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.inner.__anext__()
        except BaseException:
            self.ticket.release()
            raise

    async def aclose(self) -> None:
        self.ticket.release()
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()

    def __del__(self) -> None:
        self.ticket.release()


async def seated(ticket: Ticket | None, work: Coroutine[Any, Any, Response]) -> Response:
    """`work`'s answer; the seat given back once it ends (a stream's when its body does)."""
    if ticket is None:
        return await work
    try:
        resp = await work
    except BaseException:
        ticket.release()
        raise
    if isinstance(resp, StreamingResponse):
        resp.body_iterator = _Releasing(resp.body_iterator, ticket)
    else:
        ticket.release()
    return resp
