"""Whether an upstream has a free seat, read off the picker: its saturation guard (`Picker.saturated`)
on each live replica of the stable revision, with `seats_per_replica` as the replica's sequence slots.
The only place flow control looks into the picker, so the picker's load signal can change beneath it."""

from __future__ import annotations

import time
from dataclasses import replace

from oculis import Upstream
from oculis_router.pick import Fleet
from oculis_router.picking import PickRequest

_PROBE = PickRequest((), 0, 0)  # room for anything at all: saturation is the replica's own state


def free_seat(fleet: Fleet, up: Upstream, in_flight: int, seats_per_replica: int | None,
              batch: bool = False) -> bool:
    """Whether one more request of `up` may go now, `in_flight` being the requests flow control has let
    through to it and not yet seen finish that count against it (counted here, not by the replicas'
    leases: a dispatched request leases its replica a moment later, and the next dispatch must not see
    its seat as free). An interactive request counts interactive ones only, and meets the picker's guard
    on KV alone (the engine's load includes batch lines it may run beside); a batch line counts every
    request, and the engine's own running and waiting count too (seats anyone else holds are not free)."""
    pool = fleet.pool(up)
    if pool is None:  # no replica source (a plain base_url): one replica behind its Service
        return seats_per_replica is None or in_flight < seats_per_replica
    now = time.monotonic()
    live = [r for r in pool.members("stable") if not r.draining]
    if not live:
        return True  # nothing to wait for: the call path says what it says of an empty pool
    if seats_per_replica is not None and in_flight >= seats_per_replica * len(live):
        return False
    states = [replace(r.state(now, aside_ok=True), max_num_seqs=seats_per_replica if batch else None) for r in live]
    return any(not pool.picker.saturated(s, 0, _PROBE) for s in states)
