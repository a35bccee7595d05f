"""The V1 scheduler on small hand-checked cases: budget, chunking, max_num_seqs, preemption order,
prefix hits, speculative-decoding bookkeeping."""

from oculis_sim.scheduler import Request, Scheduler
from oculis_sim.specdecode import AcceptanceSampler, expected_tokens_per_step


def sched(blocks: int = 1000, seqs: int = 16, budget: int = 8192, k: int = 0) -> Scheduler:
    return Scheduler(blocks, seqs, budget, max_model_len=4096, num_speculative_tokens=k)


def step(s: Scheduler) -> dict[int, int]:
    plan = s.schedule()
    s.update(plan)
    return {r.rid: n for r, n in plan.scheduled}


def test_token_budget_chunks_the_prefill_that_does_not_fit_and_serves_running_first() -> None:
    s = sched(budget=150)
    for i in range(3):
        s.add(Request(i, 100, 10))
    assert step(s) == {0: 100, 1: 50}  # request 1's prompt is chunked; request 2 waits
    assert step(s) == {0: 1, 1: 50, 2: 99}  # running first: 0 decodes, 1 finishes its prefill, 2 starts
    assert step(s) == {0: 1, 1: 1, 2: 1}


def test_a_prefill_chunk_samples_no_token_until_the_prompt_is_done() -> None:
    s = sched(budget=40)
    r = Request(0, 100, 5)
    s.add(r)
    for _ in range(2):
        emitted, _ = s.update(s.schedule())
        assert emitted == []
    plan = s.schedule()
    assert plan.scheduled == [(r, 20)]  # the last chunk: 40 + 40 + 20
    emitted, _ = s.update(plan)
    assert [(q.rid, n) for q, n in emitted] == [(0, 1)] and r.num_computed == 100


def test_max_num_seqs_caps_the_running_batch() -> None:
    s = sched(seqs=2)
    for i in range(3):
        s.add(Request(i, 10, 10))
    assert set(step(s)) == {0, 1} and [r.rid for r in s.waiting] == [2]


def test_preemption_takes_the_newest_running_request_and_puts_it_at_the_front_of_the_queue() -> None:
    s = sched(blocks=5, seqs=8)  # 4 usable blocks (one is vLLM's null block)
    reqs = [Request(i, 16, 50) for i in range(3)]
    for r in reqs:
        s.add(r)
    late = Request(9, 16, 5)
    assert step(s) == {0: 16, 1: 16, 2: 16}  # one block each
    s.add(late)
    plan = s.schedule()  # each needs a second block for token 17: only one is free
    assert plan.preempted == [reqs[2]]
    assert {r.rid for r, _ in plan.scheduled} == {0, 1}
    assert plan.admitted == []  # nothing is admitted in a step that preempted
    assert [r.rid for r in s.waiting] == [2, 9]
    assert reqs[2].num_computed == 0 and reqs[2].blocks == 0 and s.preemptions == 1
    s.update(plan)
    # the preempted request keeps its generated token and recomputes prompt + output when it returns
    assert reqs[2].num_tokens == 17


def test_prefix_cache_reuses_the_leading_full_blocks_of_a_shared_prompt() -> None:
    s = sched()
    shared = ("a", "b")
    first = Request(0, 40, 5, hashes=shared)
    s.add(first)
    step(s)
    second = Request(1, 40, 5, hashes=shared)
    s.add(second)
    plan = s.schedule()
    assert dict((r.rid, n) for r, n in plan.scheduled)[1] == 8  # 32 of 40 tokens were cached
    assert plan.prefix_queries == 40 and plan.prefix_hits == 32
    assert s.pool.refs == {"a": 2, "b": 2}


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    s = sched()
    s.add(Request(0, 32, 5, hashes=("a", "b")))
    step(s)
    s.add(Request(1, 32, 5, hashes=("a", "b")))
    plan = s.schedule()
    assert plan.prefix_hits == 16  # the second block would leave nothing to compute
    assert dict((r.rid, n) for r, n in plan.scheduled)[1] == 16


def test_finished_requests_leave_their_blocks_cached_until_evicted() -> None:
    s = sched(blocks=6)  # 5 usable
    s.add(Request(0, 32, 1, hashes=("a", "b")))
    step(s)
    assert not s.has_work() and s.pool.evictable == {"a": None, "b": None} and s.usage() == 0
    s.add(Request(1, 70, 1))  # needs all 5 blocks: both cached blocks are evicted
    step(s)
    assert s.pool.refs == {}


def test_preemption_drops_the_victims_own_cached_blocks() -> None:
    s = sched(blocks=4, seqs=8)  # 3 usable
    a = Request(0, 16, 50, hashes=("x",))
    b = Request(1, 16, 50, hashes=("y",))
    s.add(a)
    s.add(b)
    step(s)
    assert set(s.pool.refs) == {"x", "y"}
    s.add(Request(2, 1, 1))
    plan = s.schedule()  # a takes the last block; b cannot grow and is the newest: preempted
    assert plan.preempted == [b]
    assert "y" not in s.pool.refs  # re-prefill after preemption is not free (BLIS #1121)


def test_speculative_decoding_schedules_drafts_and_uncomputes_the_rejected_ones() -> None:
    s = sched(k=3)
    r = Request(0, 10, 20)
    s.add(r)
    step(s)  # prefill
    plan = s.schedule()
    assert dict((q.rid, n) for q, n in plan.scheduled) == {0: 4}  # 1 + k
    emitted, _ = s.update(plan, {0: 2})
    assert [(q.rid, n) for q, n in emitted] == [(0, 3)]  # 2 accepted + the bonus token
    assert r.num_output == 4 and r.num_computed == r.num_tokens - 1


def test_drafts_never_run_past_the_requested_output() -> None:
    s = sched(k=4)
    r = Request(0, 10, 3)
    s.add(r)
    step(s)
    plan = s.schedule()
    assert dict((q.rid, n) for q, n in plan.scheduled) == {0: 2}  # one more token may follow the bonus
    _, finished = s.update(plan, {0: 1})
    assert finished == [r] and r.num_output == 3


def test_acceptance_per_position_gives_the_published_tokens_per_step() -> None:
    alpha, k = 0.7, 4
    got = AcceptanceSampler(alpha, seed=7).draw([k] * 40000)
    mean_tokens = 1 + sum(got) / len(got)
    assert abs(mean_tokens - expected_tokens_per_step(alpha, k)) < 0.03
    # per-position counts are non-increasing (position i is reached only if i-1 was accepted)
    per_pos = [sum(1 for a in got if a > i) for i in range(k)]
    assert per_pos == sorted(per_pos, reverse=True)
    assert AcceptanceSampler(0.0, 1).draw([3, 3]) == [0, 0] and AcceptanceSampler(1.0, 1).draw([3, 2]) == [3, 2]


def test_workload_stages_give_exact_counts_and_reproducible_arrivals() -> None:
    from oculis_sim import workload

    spec = {"prompt_tokens": {"mean": 100, "stdev": 30, "min": 1, "max": 200}, "output_tokens": 10,
            "stages": [{"rate": 5, "requests": 40}, {"rate": "inf", "requests": 7}], "seed": 4}
    a, b = workload.parse(spec), workload.parse(spec)
    assert len(a) == 47 and (a.arrivals == b.arrivals).all() and (a.prompt_tokens == b.prompt_tokens).all()
    assert a.arrivals[0] == 0 and (a.arrivals[40:] == a.arrivals[39]).all()  # the burst follows the stage
    assert a.prompt_tokens.min() >= 1 and a.prompt_tokens.max() <= 200
    c = workload.parse({**spec, "shared_prefix_tokens": 64})
    assert (c.prompt_tokens == a.prompt_tokens + 64).all()


def test_block_accounting_stays_exact_under_preemption_pressure_and_every_request_finishes() -> None:
    import random

    rnd = random.Random(5)
    s = Scheduler(40, 12, 96, max_model_len=400, num_speculative_tokens=2)
    shared = tuple(("p", i) for i in range(3))
    reqs = [Request(i, rnd.randint(1, 120), rnd.randint(1, 60), hashes=shared if i % 2 else ())
            for i in range(60)]
    pending = list(reqs)
    steps = 0
    while pending or s.has_work():
        for _ in range(rnd.randint(0, 2)):
            if pending:
                s.add(pending.pop(0))
        if not s.has_work():
            continue
        plan = s.schedule()
        s.update(plan, {r.rid: rnd.randint(0, r.spec_scheduled) for r, _ in plan.scheduled})
        pool = s.pool
        held = [*s.running, *s.waiting]
        assert pool.private == sum(r.blocks for r in held)
        for h, n in pool.refs.items():
            assert n == sum(r.shared.count(h) for r in held)
            assert (n == 0) == (h in pool.evictable)
        assert 0 <= pool.used <= pool.total
        steps += 1
        assert steps < 10000, "livelock"
    assert all(r.finished for r in reqs) and s.preemptions > 0
