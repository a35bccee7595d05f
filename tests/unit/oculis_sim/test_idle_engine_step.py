"""The root cause of `sim serve`'s "engine made no progress" crash (made defensive in 34afc27): with async
scheduling (vLLM >= 0.12) a request waits in the core's inbox until the step it can be planned in, and an
idle core stepped at the previous step's end (as `sim serve` does when it comes round within 50 ms of it)
had nothing arrived by then, so it planned an empty step. An idle core's step starts when the next request
reaches it."""

import dataclasses

from test_engine_cases import engine

from oculis_sim.scheduler import Request


def test_an_idle_core_stepped_before_its_next_arrival_starts_at_that_arrival() -> None:
    core = engine()
    core.cost = dataclasses.replace(core.cost, overlap=True)  # vLLM >= 0.12: async scheduling
    a = Request(0, 16, 1, 0.0)
    core.add(a)
    end = core.step(0.0).end
    assert a.finished and not core.scheduler.has_work()  # idle from `end`
    b = Request(1, 16, 2, end + 0.002)  # reaches the core 2 ms after it went idle
    core.add(b)
    res = core.step(end)  # stepped back-to-back at the last end
    assert [r.rid for r, _ in res.plan.scheduled] == [1]  # was [] (no progress)
    assert res.start == b.arrival and res.end > res.start
    busy = Request(2, 16, 5, res.end + 0.001)  # a busy core keeps its one-step lag (planned at the step start)
    core.add(busy)
    assert [r.rid for r, _ in core.step(res.end).plan.scheduled] == [1]
