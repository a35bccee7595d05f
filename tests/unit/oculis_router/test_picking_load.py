"""Token-aware load (picking/load.py): bursts spread, stale gauges do not herd, other routers' load counts,
the saturation guard, session keys, and prefix strategies that equal least-loaded where nothing is shared."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from oculis_router.picking import Picker, PickRequest, ReplicaState, block_hashes
from oculis_router.picking import load as loadmath

BS = 16
# the simulator's Llama-3.1-8B on H100: seconds per prefill token, per context token read, fixed step
MODEL = {"prefill_token_s": 3.35e-5, "context_token_s": 5.29e-8, "step_s": 6.0e-3, "max_num_batched_tokens": 8192}


def rep(rid: str, **kw: object) -> ReplicaState:
    return ReplicaState(rid, block_size=BS, kv_blocks=10_000, max_num_seqs=64, **{**MODEL, **kw})  # type: ignore[arg-type]


def req(tokens: list[int], out: int = 100, session: str | None = None) -> PickRequest:
    return PickRequest(block_hashes(tokens, BS), len(tokens), out, session=session)


def dispatch(states: dict[str, ReplicaState], rid: str, r: PickRequest, cached: int = 0) -> None:
    """What the router's shell does at a pick: count the request's work on its replica at once."""
    s = states[rid]
    states[rid] = replace(s, in_flight=s.in_flight + 1, queued_tokens=s.queued_tokens + r.prompt_tokens - cached,
                          in_flight_tokens=s.in_flight_tokens + r.prompt_tokens - cached + r.expected_output_tokens,
                          context_tokens=s.context_tokens + r.prompt_tokens + r.expected_output_tokens)


def test_a_burst_spreads_over_idle_replicas_instead_of_herding() -> None:
    for strategy in ("least-loaded", "prefix", "kv-events"):
        p = Picker(strategy, seed=3, block_size=BS)  # type: ignore[arg-type]
        states = {k: rep(k) for k in "abcd"}
        got = Counter()
        for i in range(8):  # 8 arrivals at the same instant, 2,000 unique tokens each
            r = req(list(range(i * 10_000, i * 10_000 + 2000)))
            pick = p.pick(r, list(states.values()))
            assert pick is not None
            got[pick.replica] += 1
            dispatch(states, pick.replica, r)
        assert sorted(got.values()) == [2, 2, 2, 2], (strategy, got)


def test_stale_gauges_do_not_herd_but_load_the_router_did_not_send_counts() -> None:
    # a emptied since the scrape (gauges 8 running; the router had 8 in flight then, 0 now); b has 2 of its own
    a = rep("a", running=8.0, scraped_in_flight=8)
    b = rep("b", in_flight=2, queued_tokens=1000, context_tokens=2400, running=2.0, scraped_in_flight=2)
    p = Picker("least-loaded", block_size=BS)
    assert p.pick(req(list(range(500))), [a, b]).replica == "a"  # type: ignore[union-attr]
    assert loadmath.requests(a) == 0 and loadmath.requests(b) == 2
    # 6 waiting requests on a that another router sent: prefill queued there that this router never counted
    busy = replace(a, waiting=6.0, running=0.0, scraped_in_flight=0)
    assert loadmath.foreign(busy) == (6.0, 0.0)
    assert p.pick(req(list(range(500))), [busy, b]).replica == "b"  # type: ignore[union-attr]


def test_a_cached_prefix_never_holds_a_request_on_a_saturated_replica() -> None:
    prefix = list(range(4000))
    p = Picker("prefix", block_size=BS)
    p.memory.remember("a", block_hashes(prefix, BS), None)
    free = rep("b")
    assert p.pick(req([*prefix, 1, 2, 3]), [rep("a"), free]).replica == "a"  # type: ignore[union-attr]
    full = rep("a", in_flight=64, context_tokens=64 * 500)  # every sequence slot taken
    pick = p.pick(req([*prefix, 1, 2, 3]), [full, free])
    assert pick is not None and (pick.replica, pick.reason) == ("b", "load")


def test_a_session_key_guides_affinity_before_a_prefix_is_known_but_never_onto_a_saturated_replica() -> None:
    p = Picker("prefix", block_size=BS)
    states = [rep("a"), rep("b"), rep("c")]
    first = p.pick(req(list(range(3000)), session="user-1"), states)
    assert first is not None
    p.memory.forget(first.replica)  # the prefix memory lost it (a restart, an eviction it did not see)
    # the next turn shares nothing the memory knows, yet goes back to the session's replica
    again = p.pick(req(list(range(50_000, 53_500)), session="user-1"), states)
    assert again is not None and again.replica == first.replica and again.cached_blocks > 0
    # where the picker sees the replica's cache (its memory holds other prompts there) and finds nothing of
    # this one, the history was evicted: no credit, load decides
    seen = Picker("prefix", block_size=BS)
    pick0 = seen.pick(req(list(range(3000)), session="user-2"), states)
    assert pick0 is not None
    seen.memory.forget(pick0.replica)
    seen.memory.remember(pick0.replica, block_hashes(list(range(90_000, 91_000)), BS), None)
    later = seen.pick(req(list(range(70_000, 73_500)), session="user-2"), states)
    assert later is not None and later.cached_blocks == 0
    # the session's replica is saturated: the session does not hold the request there
    full = [replace(s, in_flight=64) if s.id == first.replica else s for s in states]
    moved = p.pick(req(list(range(60_000, 63_500)), session="user-1"), full)
    assert moved is not None and moved.replica != first.replica
    # least-loaded ignores sessions (cache-blind by definition)
    blind = Picker("least-loaded", block_size=BS)
    assert blind.pick(req(list(range(10)), session="user-1"), states) is not None
    assert not blind.sessions


def test_where_nothing_is_shared_the_prefix_pickers_pick_as_least_loaded() -> None:
    pickers = {s: Picker(s, seed=1, block_size=BS) for s in ("least-loaded", "prefix", "kv-events")}  # type: ignore[misc]
    states = {s: {k: rep(k) for k in "abcde"} for s in pickers}
    seqs: dict[str, list[str]] = {s: [] for s in pickers}
    for i in range(40):
        r = req(list(range(i * 100_000, i * 100_000 + 300 + 37 * (i % 7))))
        for s, p in pickers.items():
            pick = p.pick(r, list(states[s].values()))
            assert pick is not None
            seqs[s].append(pick.replica)
            dispatch(states[s], pick.replica, r)
            if i % 3 == 0:  # some finish their prefill
                done = states[s][pick.replica]
                states[s][pick.replica] = replace(done, queued_tokens=0)
    assert seqs["least-loaded"] == seqs["prefix"] == seqs["kv-events"]


def test_the_wait_counts_prefill_in_token_budget_steps_each_reading_the_context() -> None:
    r = rep("a", queued_tokens=10_000, context_tokens=50_000)
    # 10,000 queued + 500 own = 10,500 tokens: two steps of 8,192; each reads the 50,000-token context
    ratio = MODEL["prefill_token_s"] / MODEL["context_token_s"]
    fixed = MODEL["step_s"] / MODEL["context_token_s"]
    assert abs(loadmath.wait(r, 500, 0.0, 0.0) - (ratio * 10_500 + 2 * (fixed + 50_000))) < 1e-6


def test_the_router_takes_the_session_from_the_openai_user_field_or_the_caller() -> None:
    from oculis_router.pick import pick_request

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "alice"}
    assert pick_request(body, "chat", BS).session == "alice"
    assert pick_request(body, "chat", BS, session="from-header").session == "from-header"
    assert pick_request({**body, "user": 7}, "chat", BS).session is None  # not a string: no session

