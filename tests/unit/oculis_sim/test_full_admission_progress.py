"""Full-sequence admission (vLLM >= 0.19) under KV pressure, hand-checked on 5 usable blocks of 16 tokens: a
waiting request whose whole sequence cannot fit while another runs waits (every step still schedules the
running one) and is admitted once blocks free up; only a request that needs more blocks than the cache has,
with nothing running, is taken out (refused), and the requests behind it go on."""

from oculis_sim.scheduler import Request, Scheduler


def sched() -> Scheduler:
    return Scheduler(num_blocks=6, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=80,
                     full_sequence_admission=True)  # 5 usable blocks (one null block)


def test_a_request_that_cannot_fit_while_another_runs_waits_then_runs() -> None:
    s = sched()
    a = Request(0, 40, 30)  # 3 blocks for its prompt, 5 (70 tokens) by its end
    b = Request(1, 40, 8)  # 3 blocks: never fits beside a (2 then fewer free)
    s.add(a)
    s.add(b)
    steps: list[list[int]] = []
    while s.has_work():
        assert s.refuse_unfittable() is None  # b fits an empty cache: it only waits
        plan = s.schedule()
        assert plan.scheduled  # a step always makes progress
        steps.append([r.rid for r, _ in plan.scheduled])
        s.update(plan)
    assert steps[:30] == [[0]] * 30  # a's prefill, then its 29 more tokens, alone
    assert steps[30] == [1]  # b admitted the step after a finished
    assert len(steps) == 38 and s.preemptions == 0
    assert a.finished and b.finished


def test_only_a_request_bigger_than_the_cache_is_refused_and_the_rest_go_on() -> None:
    s = sched()
    big = Request(0, 90, 1)  # 6 blocks > 5: can never run
    c = Request(1, 20, 2)
    s.add(big)
    s.add(c)
    plan = s.schedule()
    assert not plan.scheduled and not plan.preempted
    assert s.refuse_unfittable() is big
    assert s.refuse_unfittable() is None and list(s.waiting) == [c]
    while s.has_work():
        plan = s.schedule()
        assert plan.scheduled
        s.update(plan)
    assert c.finished and s.pool.used == 0
