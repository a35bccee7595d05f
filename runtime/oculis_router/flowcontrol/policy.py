"""The queue discipline of flow control, pure: which waiting request goes next when a seat frees.

- One queue per flow (the fairness key: a tenant by default), each request with a priority.
- Strict priority: a higher priority is always served before a lower one (batch work, at the lowest
  priority, runs only when no interactive request waits).
- Among the flows of one priority, weighted fair sharing by start-time fair queuing (SFQ, Goyal et al.
  1996): each request gets a virtual start tag max(V, the previous finish tag of its flow) and a finish
  tag start + cost / weight; the head with the smallest start tag goes next and V becomes its start tag.
  A flow with weight 2 gets twice the dispatches of a flow with weight 1 while both wait; a flow that
  was idle starts at V, so it neither banks credit while idle nor waits behind a busy flow's backlog.
- Bounded: a request past its deadline (the route's queue TTL) is shed, and so is one that would take
  its route's queue past the route's size bound. Removing a request (its client left) is O(queue).

No clock, no asyncio: the shell (`gate.py`) passes `now` and acts on what comes back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

ShedReason = Literal["queue_full", "ttl"]


@dataclass(frozen=True, slots=True)
class Item:
    """One waiting request."""

    id: int
    flow: str  # the fairness key's value (a tenant, a key digest, a route)
    priority: int  # higher first
    route: str  # whose size bound it counts against
    enqueued_at: float
    deadline: float  # shed once now >= deadline
    weight: float = 1.0  # its flow's share weight
    cost: float = 1.0  # dispatches are the unit of fairness: one request, one seat


@dataclass(slots=True)
class _Flow:
    queue: deque[tuple[float, float, Item]] = field(default_factory=deque)  # (start, finish, item)
    last_finish: float = 0.0


@dataclass(slots=True)
class _Band:
    """The flows of one priority."""

    virtual: float = 0.0
    flows: dict[str, _Flow] = field(default_factory=dict)


class FlowQueues:
    """Every waiting request of one resource (an upstream's seats), by priority band and flow."""

    def __init__(self) -> None:
        self._bands: dict[int, _Band] = {}
        self._per_route: dict[str, int] = {}
        self._where: dict[int, Item] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, item_id: int) -> bool:
        return item_id in self._where

    def route_length(self, route: str) -> int:
        return self._per_route.get(route, 0)

    def lengths(self) -> dict[tuple[str, int], int]:
        """Waiting requests per (flow, priority)."""
        return {(name, p): len(f.queue) for p, band in self._bands.items() for name, f in band.flows.items()
                if f.queue}

    def offer(self, item: Item, max_route_queue: int) -> ShedReason | None:
        """Queue `item`; or why it is refused (its route's queue already holds `max_route_queue`)."""
        if self._per_route.get(item.route, 0) >= max_route_queue:
            return "queue_full"
        band = self._bands.setdefault(item.priority, _Band())
        flow = band.flows.setdefault(item.flow, _Flow())
        start = max(band.virtual, flow.last_finish)
        finish = start + item.cost / max(item.weight, 1e-9)
        flow.queue.append((start, finish, item))
        flow.last_finish = finish
        self._per_route[item.route] = self._per_route.get(item.route, 0) + 1
        self._where[item.id] = item
        return None

    def _next(self) -> tuple[int, str, float] | None:
        """(priority, flow, start tag) of the next request: highest priority, then the smallest start tag
        (ties: the earlier enqueued, then the flow's name, so the order is deterministic)."""
        for p in sorted(self._bands, reverse=True):
            band = self._bands[p]
            heads = [(f.queue[0][0], f.queue[0][2].enqueued_at, name) for name, f in band.flows.items() if f.queue]
            if heads:
                start, _, name = min(heads)
                return p, name, start
        return None

    def peek(self) -> Item | None:
        """The request `pop` would return, left in place."""
        nxt = self._next()
        return None if nxt is None else self._bands[nxt[0]].flows[nxt[1]].queue[0][2]

    def pop(self) -> Item | None:
        """Take out the next request to dispatch; None when empty."""
        nxt = self._next()
        if nxt is None:
            return None
        p, name, start = nxt
        band = self._bands[p]
        _, _, item = band.flows[name].queue.popleft()
        band.virtual = max(band.virtual, start)
        self._forget(item)
        self._tidy(p)
        return item

    def remove(self, item_id: int) -> bool:
        """Take a request out (its client left); False when it is not waiting (already dispatched or shed)."""
        item = self._where.get(item_id)
        if item is None:
            return False
        band = self._bands[item.priority]
        flow = band.flows[item.flow]
        flow.queue = deque(e for e in flow.queue if e[2].id != item_id)
        self._rebase(flow)
        self._forget(item)
        self._tidy(item.priority)
        return True

    def expired(self, now: float) -> list[Item]:
        """Take out and return every request whose deadline has passed."""
        gone = [i for i in self._where.values() if i.deadline <= now]
        for i in gone:
            self.remove(i.id)
        return gone

    def next_deadline(self) -> float | None:
        return min((i.deadline for i in self._where.values()), default=None)

    def _rebase(self, flow: _Flow) -> None:
        """After a removal the flow's later requests keep their tags (never earlier than they were: no
        flow gains by its clients leaving); its last finish is that of its last request still waiting."""
        flow.last_finish = flow.queue[-1][1] if flow.queue else flow.last_finish

    def _forget(self, item: Item) -> None:
        del self._where[item.id]
        left = self._per_route[item.route] - 1
        if left:
            self._per_route[item.route] = left
        else:
            del self._per_route[item.route]

    def _tidy(self, priority: int) -> None:
        band = self._bands[priority]
        if not any(f.queue for f in band.flows.values()):
            # an idle band forgets its flows: V and tags restart from 0 when work comes back
            del self._bands[priority]
