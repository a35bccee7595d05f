"""The picker core on small hand-checked states: each strategy, the saturation guard, the KV-event index."""

from __future__ import annotations

import pytest

from oculis_router.picking import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventFormatError,
    Picker,
    PickRequest,
    ReplicaState,
    block_hashes,
    chat_token_ids,
    from_wire,
    to_wire,
)

BS = 4  # small blocks keep the hand-checked states small


def req(tokens: list[int], out: int = 0) -> PickRequest:
    return PickRequest(block_hashes(tokens, BS), len(tokens), out)


def reps(*ids: str, **kw: object) -> list[ReplicaState]:
    return [ReplicaState(i, block_size=BS, **kw) for i in ids]  # type: ignore[arg-type]


PREFIX = list(range(100, 116))  # 16 tokens = 4 blocks


def test_hashes_are_chained_and_stable() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], BS)
    b = block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS)
    assert len(a) == 2  # the partial third block is not hashed
    assert a[0] == b[0] and a[1] != b[1]
    assert block_hashes([5, 6, 7, 8], BS) != (a[1],)  # the same tokens under another parent differ
    assert a == block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)  # no per-process salt
    assert chat_token_ids([{"role": "user", "content": "Hi there!"}]) == chat_token_ids(
        [{"role": "user", "content": [{"type": "text", "text": "Hi there!"}]}])


def test_random_and_round_robin_are_deterministic_and_skip_draining() -> None:
    rs = [*reps("a", "b", "c"), ReplicaState("d", draining=True), ReplicaState("e", ready=False)]
    p1, p2 = Picker("random", seed=7), Picker("random", seed=7)
    seq1 = [p1.pick(req([i]), rs) for i in range(20)]
    seq2 = [p2.pick(req([i]), rs) for i in range(20)]
    assert seq1 == seq2
    assert {p.replica for p in seq1 if p} <= {"a", "b", "c"}
    rr = Picker("round-robin")
    assert [rr.pick(req([1]), rs).replica for _ in range(4)] == ["a", "b", "c", "a"]  # type: ignore[union-attr]
    assert Picker("prefix").pick(req([1]), rs[3:]) is None  # only draining / not-ready replicas: no pick


def test_least_loaded_uses_router_count_and_scraped_gauges() -> None:
    p = Picker("least-loaded")
    # without scraped_in_flight the gauges are a floor of the router's counts: b's 3 waiting requests queue
    # prefill (at the mean prompt) ahead of a new one; a and c queue the prefill the router counts there
    rs = [ReplicaState("a", in_flight=5, queued_tokens=5), ReplicaState("b", in_flight=1, running=4, waiting=3),
          ReplicaState("c", in_flight=2, running=2, queued_tokens=2)]
    assert p.pick(req([1]), rs).replica == "c"  # type: ignore[union-attr]  # a: 5, b: max(1, 7) = 7, c: 2


@pytest.mark.parametrize("strategy", ["prefix", "kv-events"])
def test_longest_cached_prefix_wins(strategy: str) -> None:
    p = Picker(strategy, block_size=BS)  # type: ignore[arg-type]
    rs = reps("a", "b", "c")
    p.memory.remember("a", block_hashes(PREFIX[:8], BS), None)  # 2 blocks
    p.memory.remember("b", block_hashes(PREFIX, BS), None)  # all 4 blocks
    pick = p.pick(req([*PREFIX, 1, 2, 3, 4, 5]), rs)
    assert pick is not None and (pick.replica, pick.cached_blocks) == ("b", 4)
    assert pick.reason == ("prefix" if strategy == "prefix" else "fallback")  # kv-events: nobody published


def test_ties_go_to_the_less_loaded_replica() -> None:
    p = Picker("prefix", block_size=BS)
    for r in ("a", "b", "c"):
        p.memory.remember(r, block_hashes(PREFIX, BS), None)
    # token-aware load: each in-flight request still has 50 prompt tokens to prefill there
    rs = [ReplicaState("a", in_flight=3, queued_tokens=150, block_size=BS),
          ReplicaState("b", in_flight=1, queued_tokens=50, block_size=BS),
          ReplicaState("c", in_flight=2, queued_tokens=100, block_size=BS)]
    assert p.pick(req([*PREFIX, 9]), rs).replica == "b"  # type: ignore[union-attr]
    # no prefix anywhere: the least loaded
    assert p.pick(req([7, 7, 7, 7, 7]), rs).replica == "b"  # type: ignore[union-attr]


def test_saturation_switches_to_load() -> None:
    def pick(*states: ReplicaState) -> tuple[str, str]:
        p = Picker("prefix", block_size=BS)  # fresh each time: a pick is remembered
        p.memory.remember("a", block_hashes(PREFIX, BS), None)
        got = p.pick(req([*PREFIX, 1, 2, 3, 4], out=8), states)  # 20 tokens, 16 cached on a: 4 + 8 KV tokens there
        assert got is not None
        return got.replica, got.reason

    b = ReplicaState("b", block_size=BS, kv_blocks=10)
    # 10 blocks = 40 KV tokens: 28 held + 12 fits, 29 + 12 does not
    assert pick(ReplicaState("a", block_size=BS, kv_blocks=10, in_flight_tokens=28, in_flight=2), b) == ("a", "prefix")
    assert pick(ReplicaState("a", block_size=BS, kv_blocks=10, in_flight_tokens=29, in_flight=2), b) == ("b", "load")
    assert pick(ReplicaState("a", block_size=BS, kv_blocks=10, kv_usage=0.75), b) == ("b", "load")  # scraped: 30 held
    # sequence slots saturate too
    assert pick(ReplicaState("a", block_size=BS, max_num_seqs=4, running=3, waiting=1), b) == ("b", "load")
    # prefill queued ahead on a outweighs the 16 tokens the hit saves: load decides
    assert pick(ReplicaState("a", block_size=BS, queued_tokens=17), b) == ("b", "load")
    assert pick(ReplicaState("a", block_size=BS, queued_tokens=15), b) == ("a", "prefix")
    # everything saturated: the cost alone decides; prefill queued ahead of the prefix holder sends it elsewhere
    assert pick(ReplicaState("a", block_size=BS, max_num_seqs=1, in_flight=3),
                ReplicaState("b", block_size=BS, max_num_seqs=1, in_flight=2)) == ("a", "prefix")
    assert pick(ReplicaState("a", block_size=BS, max_num_seqs=1, in_flight=3, queued_tokens=100),
                ReplicaState("b", block_size=BS, max_num_seqs=1, in_flight=2)) == ("b", "load")


def test_capacity_bound_evicts_least_recently_sent() -> None:
    p = Picker("prefix", block_size=BS)
    rs = [ReplicaState("a", block_size=BS, kv_blocks=4), ReplicaState("b", block_size=BS, kv_blocks=4)]
    first = PREFIX  # 4 blocks
    p.pick(req(first), rs[:1])
    assert p.matches(req(first), rs)[0] == {"a": 4, "b": 0}
    p.pick(req([7] * 8), rs[:1])  # 2 other blocks on a: a's 4-block memory drops first's 2 oldest
    assert p.memory.size("a") == 4
    assert p.matches(req(first), rs)[0] == {"a": 0, "b": 0}  # the chain breaks at its first block


def test_eviction_events_remove_affinity() -> None:
    p = Picker("kv-events", block_size=BS)
    rs = reps("a", "b")
    toks = [*PREFIX, 1, 2, 3, 4]
    engine = [1001, 1002, 1003, 1004]  # the engine's own (salted) hashes
    p.apply_events("a", EventBatch(0.0, (BlockStored(tuple(engine), None, tuple(PREFIX), BS),)))
    p.apply_events("b", EventBatch(0.0, ()))  # b publishes, holds nothing
    pick = p.pick(req(toks), rs)
    assert pick is not None and (pick.replica, pick.reason, pick.cached_blocks) == ("a", "prefix", 4)
    p.apply_events("a", EventBatch(1.0, (BlockRemoved((1003, 1004)),)))
    hits, _ = p.matches(req(toks), rs)
    assert hits == {"a": 2, "b": 0}
    p.apply_events("a", EventBatch(2.0, (AllBlocksCleared(),)))
    hits, _ = p.matches(req(toks), rs)
    assert hits == {"a": 0, "b": 0}
    # a BlockStored continuing a known parent chains onto it
    p.apply_events("b", EventBatch(3.0, (BlockStored((2001,), None, tuple(PREFIX[:4]), BS),
                                         BlockStored((2002,), 2001, tuple(PREFIX[4:8]), BS))))
    assert p.matches(req(toks), rs)[0] == {"a": 0, "b": 2}


def test_kv_events_fall_back_to_memory_for_silent_replicas() -> None:
    p = Picker("kv-events", block_size=BS)
    rs = reps("a", "b")
    p.apply_events("a", EventBatch(0.0, ()))  # a publishes (nothing cached); b never published
    p.memory.remember("b", block_hashes(PREFIX, BS), None)
    pick = p.pick(req([*PREFIX, 1]), rs)
    assert pick is not None and (pick.replica, pick.reason) == ("b", "fallback")


def test_wire_form_round_trips_vllm_032_maps_and_reads_the_older_arrays() -> None:
    batch = EventBatch(12.5, (BlockStored((1, 2), None, tuple(range(8)), BS, None, "GPU"), BlockRemoved((b"\x01",)),
                              AllBlocksCleared()), 0)
    wire = to_wire(batch)
    # as a real vLLM 0.32 engine sent it (tests/realengine/test_router_kv_events_real.py)
    assert wire[1][0] == {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
                          "token_ids": list(range(8)), "block_size": BS, "lora_id": None, "medium": "GPU",
                          "lora_name": None}
    assert wire[1][2] == {"type": "AllBlocksCleared"}
    assert from_wire(wire) == batch
    newer = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": 7, "token_ids": list(range(BS)),
             "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
    assert from_wire([1.0, [newer]]).events == (BlockStored((1,), 7, tuple(range(BS)), BS, None, "GPU"),)
    assert from_wire([1.0, [["BlockStored", [1, 2], None, list(range(8)), BS, None, "GPU"], ["AllBlocksCleared"]]]
                     ).events == batch.events[:1] + batch.events[2:]  # before 0.32: tagged arrays
    assert from_wire([1.0, [["BlockRemoved", [5]]]]).events == (BlockRemoved((5,)),)  # no rank, no medium
    with pytest.raises(EventFormatError, match=r"BlockStored\.block_size"):
        from_wire([1.0, [["BlockStored", [1], None, [], 0, None, None]]])
    with pytest.raises(EventFormatError, match=r"BlockStored\.block_size"):
        from_wire([1.0, [{"type": "BlockStored", "block_hashes": [1]}]])
    with pytest.raises(EventFormatError, match="tag"):
        from_wire([1.0, [["Bogus"]]])
    with pytest.raises(EventFormatError, match="neither"):
        from_wire([1.0, [{"no": "type"}]])


def test_kvwire_frames() -> None:
    from oculis_router.picking import kvwire

    batch = EventBatch(1.0, (BlockRemoved((7,)),))
    frames = kvwire.encode("kv", 42, batch)
    assert frames[0] == b"kv" and frames[1] == (42).to_bytes(8, "big")
    assert kvwire.decode(frames) == (42, batch)
    with pytest.raises(EventFormatError):
        kvwire.decode([b"", b"x", b""])


def test_bad_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        Picker("nearest")  # type: ignore[arg-type]


def test_a_cached_prefix_holds_until_the_prefill_queued_on_its_holder_outweighs_what_it_saves() -> None:
    # a holds the 16-token prefix of a 20-token prompt and runs 3 requests (500 context tokens); b is idle;
    # one prefill token = 500 context-token reads. Token-load scoring (load.wait): this request's own wait.
    def pick(queued: int, out: int = 200) -> str:
        a = ReplicaState("a", block_size=BS, in_flight=3, context_tokens=500, queued_tokens=queued,
                         prefill_token_s=40e-6, context_token_s=80e-9)
        b = ReplicaState("b", block_size=BS, prefill_token_s=40e-6, context_token_s=80e-9)
        p = Picker("prefix", block_size=BS)
        p.memory.remember("a", block_hashes(PREFIX, BS), None)
        got = p.pick(req([*PREFIX, 1, 2, 3, 4], out=out), [a, b])
        assert got is not None
        return got.replica

    # nothing queued on a: 500 x 4 uncached + a's step (500 read) beats b's 500 x 20: the prefix holds, whatever
    # the answer's length (the decode a long answer adds is the same on either replica)
    assert pick(0, out=2) == pick(0, out=200) == "a"
    # 16 prefill tokens queued on a: 500 x 20 + 500 > b's 500 x 20: the saving no longer pays, load decides
    assert pick(16) == "b"


def test_a_short_hit_behind_a_queued_prefill_loses_to_a_replica_without_a_queue_a_long_hit_still_wins() -> None:
    # a and b each run 3 requests (500 context tokens); a also has a 40-token prefill queued; 1 prefill token
    # = 500 context-token reads; no output, so only prefill counts
    cost = {"prefill_token_s": 40e-6, "context_token_s": 80e-9}
    a = ReplicaState("a", block_size=BS, in_flight=3, queued_tokens=40, context_tokens=500, **cost)  # type: ignore[arg-type]
    b = ReplicaState("b", block_size=BS, in_flight=3, context_tokens=500, **cost)  # type: ignore[arg-type]

    def pick(prefix: list[int], question: int) -> str:
        p = Picker("prefix", block_size=BS)
        p.memory.remember("a", block_hashes(prefix, BS), None)
        got = p.pick(req([*prefix, *range(1, question + 1)]), [a, b])
        assert got is not None
        return got.replica

    # 16 of 36 tokens cached on a. Fleet cost alone: a 500 x (40 + 20 x 4) = 60,000 < b 500 x 36 x 4 = 72,000,
    # the 16 saved tokens counted for all 4 it would stall. Its own wait: a 500 x (40 + 20) + 500 = 30,500,
    # b 500 x 36 + 500 = 18,500, over one step (500) worse: a's hit does not count there, and b wins
    assert pick(PREFIX, 20) == "b"
    # 64 of 68 cached: a's wait 500 x (40 + 4) + 500 = 22,500 beats b's 34,500, so the hit counts and wins
    assert pick(list(range(100, 164)), 4) == "a"
