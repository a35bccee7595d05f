"""The flow-control queue discipline (oculis_router.flowcontrol.policy) and its asyncio gate: strict
priority, weighted fair shares among the flows of one priority, TTL and size shedding, and a client
that leaves taken out at once. Ordering and counts only, no timings."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from oculis_router.flowcontrol import FlowControl, FlowQueues, Item, Shed, Ticket

ids = itertools.count(1)


def item(flow: str, priority: int = 0, route: str = "r", at: float = 0.0, ttl: float = 100.0,
         weight: float = 1.0) -> Item:
    return Item(next(ids), flow, priority, route, at, at + ttl, weight)


def drain(q: FlowQueues) -> list[Item]:
    out = []
    while (i := q.pop()) is not None:
        out.append(i)
    return out


def test_higher_priority_always_first_whatever_the_arrival_order() -> None:
    q = FlowQueues()
    for n, p in enumerate([0, -5, 3, 0, 3, -101]):
        assert q.offer(item(f"t{n}", p, at=n), 100) is None
    assert [i.priority for i in drain(q)] == [3, 3, 0, 0, -5, -101]


def test_flows_of_one_priority_alternate_however_deep_one_backlog_is() -> None:
    q = FlowQueues()
    for n in range(50):  # the heavy tenant's burst arrives first
        q.offer(item("heavy", at=n), 1000)
    for n in range(5):
        q.offer(item("light", at=100 + n), 1000)
    first = [i.flow for i in drain(q)][:10]
    assert first.count("light") == 5  # the light tenant's five are served within the first ten
    assert first[:2] in (["heavy", "light"], ["light", "heavy"])


def test_weights_give_proportional_shares_while_both_wait() -> None:
    q = FlowQueues()
    for n in range(300):
        q.offer(item("gold", at=n, weight=3.0), 1000)
        q.offer(item("basic", at=n, weight=1.0), 1000)
    served = Counter(i.flow for i in drain(q)[:200])
    assert served["gold"] == 150 and served["basic"] == 50


def test_an_idle_flow_banks_no_credit() -> None:
    q = FlowQueues()
    for n in range(20):
        q.offer(item("a", at=n), 1000)
    for _ in range(10):
        q.pop()  # a alone for a while
    for n in range(20):
        q.offer(item("b", at=50 + n), 1000)
    nxt = [i.flow for i in drain(q)[:10]]
    # b starts at the current virtual time: it alternates with a, it does not get ten in a row
    assert nxt.count("b") <= 6 and nxt.count("a") >= 4


def test_size_bound_is_per_route_and_frees_as_requests_leave() -> None:
    q = FlowQueues()
    assert q.offer(item("t", route="chat"), 2) is None
    assert q.offer(item("u", route="chat"), 2) is None
    assert q.offer(item("t", route="chat"), 2) == "queue_full"
    assert q.offer(item("t", route="other"), 2) is None  # another route has its own bound
    q.pop()
    assert q.offer(item("t", route="chat"), 2) is None


def test_expired_requests_are_taken_out_and_returned() -> None:
    q = FlowQueues()
    a, b, c = item("t", at=0, ttl=5), item("t", at=1, ttl=50), item("u", at=2, ttl=3)
    for i in (a, b, c):
        q.offer(i, 10)
    assert {i.id for i in q.expired(5.0)} == {a.id, c.id}
    assert len(q) == 1 and q.pop() == b
    assert q.next_deadline() is None


def test_removal_takes_a_request_out_and_the_rest_keep_their_order() -> None:
    q = FlowQueues()
    items = [item("t", at=n) for n in range(4)] + [item("u", at=10)]
    for i in items:
        q.offer(i, 10)
    assert q.remove(items[1].id) and not q.remove(items[1].id)
    assert items[1].id not in q and q.route_length("r") == 4
    order = [i.id for i in drain(q)]
    assert items[1].id not in order and order.index(items[0].id) < order.index(items[2].id) < order.index(items[3].id)


# ---- the gate: seats, waiting, release, cancellation -------------------------------------------------

def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def test_gate_holds_requests_past_the_seats_and_serves_them_by_priority() -> None:
    async def main() -> None:
        fc = FlowControl(CollectorRegistry())
        seats = 1

        def free(n: int, batch: bool) -> bool:
            return n < seats

        first = await fc.acquire("up", free, flow="t", priority=0, route="r", ttl=60, max_queue=10)
        order: list[str] = []

        async def wait(name: str, prio: int) -> None:
            t = await fc.acquire("up", free, flow=name, priority=prio, route="r", ttl=60, max_queue=10)
            order.append(name)
            t.release()

        tasks = [asyncio.create_task(wait(n, p)) for n, p in (("batch", -101), ("low", 0), ("high", 5))]
        await until(lambda: len(fc.gates["up"].queues) == 3, "three waiting")
        assert order == []
        first.release()
        await asyncio.gather(*tasks)
        assert order == ["high", "low", "batch"]
        assert fc.gates["up"].in_flight == 0

    run(main())


def test_gate_sheds_past_the_queue_bound_and_a_cancelled_waiter_leaves_at_once() -> None:
    async def main() -> None:
        fc = FlowControl(CollectorRegistry())

        def free(n: int, batch: bool) -> bool:
            return n < 1

        held = await fc.acquire("up", free, flow="t", priority=0, route="r", ttl=60, max_queue=1)
        waiting = asyncio.create_task(fc.acquire("up", free, flow="t", priority=0, route="r", ttl=60, max_queue=1))
        await until(lambda: len(fc.gates["up"].queues) == 1, "one waiting")
        with pytest.raises(Shed) as shed:
            await fc.acquire("up", free, flow="u", priority=0, route="r", ttl=60, max_queue=1)
        assert shed.value.reason == "queue_full" and 1 <= shed.value.retry_after <= 60
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(fc.gates["up"].queues) == 0  # out of the queue at once
        held.release()
        assert fc.gates["up"].in_flight == 0  # the cancelled one took no seat

    run(main())


def test_gate_sheds_a_request_past_its_ttl() -> None:
    async def main() -> None:
        fc = FlowControl(CollectorRegistry())
        now = [0.0]

        def free(n: int, batch: bool) -> bool:
            return n < 1

        held = await fc.acquire("up", free, flow="t", priority=0, route="r", ttl=5, max_queue=10)
        gate = fc.gates["up"]
        gate.clock = lambda: now[0]
        waiting = asyncio.create_task(fc.acquire("up", free, flow="t", priority=0, route="r", ttl=5, max_queue=10))
        await until(lambda: len(gate.queues) == 1, "one waiting")
        now[0] = 1e9  # far past any deadline, whatever the item's own clock reading was
        gate.pump()
        with pytest.raises(Shed) as shed:
            await waiting
        assert shed.value.reason == "ttl"
        held.release()
        assert gate.in_flight == 0

    run(main())


def test_batch_lines_never_keep_an_interactive_request_waiting_but_wait_for_every_seat_themselves() -> None:
    async def main() -> None:
        fc = FlowControl(CollectorRegistry())

        def free(n: int, batch: bool) -> bool:
            return n < 2

        def take(priority: int) -> asyncio.Task[Ticket]:
            return asyncio.create_task(fc.acquire("up", free, flow="t", priority=priority, route="r", ttl=60,
                                                  max_queue=10))

        batch = [await take(-101) for _ in range(2)]  # both seats, to batch work
        gate = fc.gates["up"]
        assert gate.in_flight == 2 and gate.in_flight_batch == 2
        third = take(-101)
        await until(lambda: len(gate.queues) == 1, "a third batch line waiting")
        interactive = [await take(0) for _ in range(2)]  # straight through, beside the batch lines
        assert not third.done()
        late = take(0)
        await until(lambda: len(gate.queues) == 2, "the third interactive waiting: its two seats are held")
        for b in batch:
            b.release()
        await asyncio.sleep(0)
        assert not late.done() and not third.done()  # interactive seats still full; batch counts them all
        interactive[0].release()
        await until(lambda: late.done(), "the interactive one first")
        assert not third.done()
        interactive[1].release()
        late.result().release()
        await until(lambda: third.done(), "the batch line once every seat is free")
        third.result().release()
        assert gate.in_flight == 0 and gate.in_flight_batch == 0

    run(main())
