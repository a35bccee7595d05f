"""`--scheduling-policy priority` in the simulated V1 scheduler, as vLLM's: WAITING by (priority, arrival),
lower first; under KV pressure the running request with the largest (priority, arrival) is preempted,
even one already scheduled in the step (its tokens go back to the budget); fcfs is unchanged."""

from oculis_sim.api_request import parse
from oculis_sim.scheduler import Request, Scheduler


def step(s: Scheduler) -> dict[int, int]:
    plan = s.schedule()
    s.update(plan)
    return {r.rid: n for r, n in plan.scheduled}


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    s = Scheduler(1000, 1, 8192, max_model_len=4096, policy="priority")
    for rid, (prio, at) in enumerate([(5, 0.0), (0, 1.0), (5, 2.0), (-3, 3.0)]):
        s.add(Request(rid, 10, 1, arrival=at, priority=prio))
    order = [next(iter(step(s))) for _ in range(4)]
    assert order == [3, 1, 0, 2]


def test_fcfs_ignores_priority() -> None:
    s = Scheduler(1000, 1, 8192, max_model_len=4096)
    for rid, prio in enumerate([5, 0, -3]):
        s.add(Request(rid, 10, 1, arrival=float(rid), priority=prio))
    assert [next(iter(step(s))) for _ in range(3)] == [0, 1, 2]


def test_the_lowest_priority_running_request_is_preempted_not_the_newest() -> None:
    s = Scheduler(5, 8, 8192, max_model_len=4096, policy="priority")  # 4 usable blocks
    batch = Request(0, 16, 50, arrival=0.0, priority=10)  # a batch line, running first
    inter = [Request(i, 16, 50, arrival=float(i), priority=0) for i in (1, 2)]
    for r in (batch, *inter):
        s.add(r)
    assert step(s) == {1: 16, 2: 16, 0: 16}  # one block each, interactive first
    plan = s.schedule()  # each needs a second block: one is free
    assert plan.preempted == [batch]
    assert {r.rid for r, _ in plan.scheduled} == {1, 2}
    assert [r.rid for r in s.waiting] == [0] and batch.num_computed == 0


def test_a_victim_already_scheduled_in_the_step_gives_its_tokens_back() -> None:
    s = Scheduler(5, 8, 8192, max_model_len=4096, policy="priority")  # 4 usable blocks
    low = Request(0, 16, 50, arrival=0.0, priority=0)
    s.add(low)
    assert step(s) == {0: 16}
    high = Request(1, 24, 50, arrival=1.0, priority=-5)
    s.add(high)
    assert step(s) == {0: 1, 1: 24}  # two blocks each: the cache is full
    for _ in range(40):
        plan = s.schedule()
        if plan.preempted:
            break
        s.update(plan)
    # high needs a third block first; low, scheduled before it in the step, is the victim and unscheduled
    assert plan.preempted == [low]
    assert [r for r, _ in plan.scheduled] == [high]
    assert plan.decode_tokens == 1 and plan.context_tokens == high.num_computed


def test_a_priority_without_the_policy_is_taken_and_ignored_as_vllm_0_32_does() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "priority": 3}
    assert parse(body, True, ("m",), 4096).priority == 0  # accepted (real vLLM 0.32 answers 200), no effect
    assert parse(body, True, ("m",), 4096, priority_scheduling=True).priority == 3
