"""LoRA adapters in the picker core, on small hand-checked states: only replicas listing the adapter, the
maxLoras slot classes, and what each strategy does with them."""

from __future__ import annotations

import pytest

from oculis_router.picking import (
    BlockStored,
    EventBatch,
    Picker,
    PickRequest,
    ReplicaState,
    adapter_root,
    block_hashes,
    from_wire,
    holders,
    slot,
    to_wire,
)

BS = 4
F = frozenset


def rep(rid: str, **kw: object) -> ReplicaState:
    return ReplicaState(rid, block_size=BS, **kw)  # type: ignore[arg-type]


def req(adapter: str | None, tokens: list[int] | None = None, out: int = 0) -> PickRequest:
    ids = tokens or [1, 2, 3]
    return PickRequest(block_hashes(ids, BS, adapter_root(adapter)), len(ids), out, adapter)


def test_holders_are_the_replicas_listing_the_adapter_else_the_unread_ones() -> None:
    a, b = rep("a", adapters=F({"sql"})), rep("b", adapters=F({"support"}))
    new = rep("new")  # its /v1/models not read yet
    assert [r.id for r in holders("sql", [a, b, new])] == ["a"]  # a lists it: the unread one is not risked
    assert [r.id for r in holders("style", [a, b, new])] == ["new"]  # nobody lists it: the unread may have it
    assert holders("style", [a, b]) == []  # every list read, none has it


@pytest.mark.parametrize(("running", "waiting", "mine", "max_loras", "expected"), [
    ({"sql"}, set(), set(), 2, "active"),  # runs there now
    ({"sql", "x"}, set(), set(), 2, "active"),  # slots full, but one of them is this adapter
    ({"x"}, set(), set(), 2, "free"),  # x + sql = 2 <= 2
    ({"x", "y"}, set(), set(), 2, "wait"),  # both slots taken by others
    ({"x"}, {"y"}, set(), 2, "wait"),  # the free slot is claimed by y, already waiting
    ({"x"}, set(), {"y"}, 2, "wait"),  # ... or by the router's own call for y, not scraped yet
    (set(), set(), {"sql"}, 1, "active"),  # the router's call for sql holds the one slot
    ({"x", "sql"}, {"sql"}, set(), 1, "active"),  # running (over the limit as scraped): joins the batch
    (set(), {"sql", "x"}, set(), 1, "wait"),  # sql waits there behind x for the one slot
    ({"sql", "x"}, {"y"}, set(), 2, "wait"),  # sql runs, but y waits for a slot: more sql would starve y
    ({"sql", "x"}, {"x"}, set(), 2, "active"),  # only running adapters wait (for batch room): none starves
    ({"x", "y", "z"}, set(), set(), None, "free"),  # max_lora not scraped yet: no reason to expect a wait
])
def test_slot_classes(running: set[str], waiting: set[str], mine: set[str], max_loras: int | None,
                      expected: str) -> None:
    r = rep("a", lora_running=F(running), lora_waiting=F(waiting), in_flight_adapters=F(mine), max_loras=max_loras)
    assert slot(r, "sql") == expected


@pytest.mark.parametrize("strategy", ["random", "round-robin", "least-loaded", "prefix", "kv-events"])
def test_every_strategy_keeps_to_the_replicas_listing_the_adapter(strategy: str) -> None:
    p = Picker(strategy, seed=3, block_size=BS)  # type: ignore[arg-type]
    rs = [rep("a", adapters=F({"support"})), rep("b", adapters=F({"sql", "support"}), in_flight=9),
          rep("c", adapters=F({"sql"}), in_flight=5), rep("d")]
    picks = {p.pick(req("sql", [i, i + 1]), rs).replica for i in range(30)}  # type: ignore[union-attr]
    assert picks <= {"b", "c"} and picks  # a lacks it (vLLM would 404), d is unread while others list it
    assert p.pick(req("style"), rs).replica == "d"  # type: ignore[union-attr]  # listed nowhere: the unread one
    assert p.pick(req("style"), rs[:3]) is None  # listed nowhere, every list read: no replica
    base = {p.pick(req(None, [i]), rs).replica for i in range(40)}  # type: ignore[union-attr]
    assert "a" in base  # the base model: every replica


def test_least_loaded_is_sticky_to_a_running_adapter_until_it_would_wait_or_saturate() -> None:
    p = Picker("least-loaded", block_size=BS)
    both = F({"sql", "x", "y"})
    busy_other = rep("a", adapters=both, in_flight=1, lora_running=F({"x", "y"}), max_loras=2)  # sql would wait
    active = rep("b", adapters=both, in_flight=3, lora_running=F({"sql"}), max_loras=2)
    free = rep("c", adapters=both, in_flight=2, lora_running=F({"x"}), max_loras=2)
    pick = p.pick(req("sql"), [busy_other, active, free])
    assert pick is not None and (pick.replica, pick.slot) == ("b", "active")  # running it beats lighter loads
    blind = Picker("least-loaded", block_size=BS, lora_affinity=False)
    assert blind.pick(req("sql"), [busy_other, active, free]).replica == "a"  # type: ignore[union-attr]
    full = rep("b", adapters=both, in_flight=4, lora_running=F({"sql"}), max_loras=2, max_num_seqs=4)
    pick = p.pick(req("sql"), [busy_other, full, free])
    assert pick is not None and (pick.replica, pick.slot) == ("c", "free")  # b saturated: the free slot
    starving = rep("b", adapters=both, in_flight=3, lora_running=F({"sql", "x"}), lora_waiting=F({"y"}),
                   max_loras=2)  # y waits on b for a slot: more sql there would keep it waiting
    pick = p.pick(req("sql"), [busy_other, starving, free])
    assert pick is not None and (pick.replica, pick.slot) == ("c", "free")
    all_wait = [busy_other, rep("d", adapters=both, in_flight=4, queued_tokens=400, lora_running=F({"x", "y"}),
                                max_loras=2)]
    pick = p.pick(req("sql"), all_wait)
    assert pick is not None and (pick.replica, pick.slot) == ("a", "wait")  # every replica waits: load decides


def test_prefix_treats_a_slot_wait_as_saturation() -> None:
    p = Picker("prefix", block_size=BS)
    prompt = list(range(100, 120))  # 5 blocks
    both = F({"sql", "x", "y"})
    holder = rep("a", adapters=both, lora_running=F({"x", "y"}), max_loras=2)  # has the prefix, sql would wait
    other = rep("b", adapters=both, lora_running=F({"x"}), max_loras=2)
    p.memory.remember("a", block_hashes(prompt, BS, adapter_root("sql")), None)
    pick = p.pick(req("sql", prompt, out=16), [holder, other])
    assert pick is not None and (pick.replica, pick.reason, pick.slot) == ("b", "load", "free")
    p = Picker("prefix", block_size=BS)  # afresh: the pick above taught the memory that b holds it too
    p.memory.remember("a", block_hashes(prompt, BS, adapter_root("sql")), None)
    freed = rep("a", adapters=both, lora_running=F({"x"}), max_loras=2)  # a slot freed on a: the prefix wins
    pick = p.pick(req("sql", prompt, out=16), [freed, other])
    assert pick is not None and (pick.replica, pick.reason) == ("a", "prefix")


def test_an_adapters_prefix_is_not_the_base_models() -> None:
    prompt = list(range(100, 120))
    assert block_hashes(prompt, BS, adapter_root("sql")) != block_hashes(prompt, BS)
    assert block_hashes(prompt, BS, adapter_root("sql")) != block_hashes(prompt, BS, adapter_root("support"))
    p = Picker("prefix", block_size=BS)
    p.memory.remember("a", block_hashes(prompt, BS, adapter_root("sql")), None)
    pick = p.pick(req(None, prompt), [rep("a"), rep("b")])
    assert pick is not None and pick.cached_blocks == 0  # the base model reuses nothing an adapter cached


def test_kv_events_keep_an_adapters_blocks_apart_from_the_base_models() -> None:
    prompt = list(range(100, 108))  # 2 blocks
    p = Picker("kv-events", block_size=BS)
    p.apply_events("a", EventBatch(0.0, (BlockStored((11, 12), None, tuple(prompt), BS, 7),)))  # lora_id 7
    p.apply_events("b", EventBatch(0.0, (BlockStored((21, 22), None, tuple(prompt), BS),)))
    hits, _ = p.matches(req(None, prompt), [rep("a"), rep("b")])
    assert hits == {"a": 0, "b": 2}  # the base prompt matches b's base blocks only


def test_kv_events_naming_an_adapter_match_that_adapters_requests() -> None:
    prompt = list(range(100, 108))
    p = Picker("kv-events", block_size=BS)
    wire = to_wire(EventBatch(0.0, (BlockStored((11, 12), None, tuple(prompt), BS, 3, None, "sql"),)))
    p.apply_events("a", from_wire(wire))  # vLLM 0.32 names the adapter in lora_name
    p.apply_events("b", EventBatch(0.0, (BlockStored((21, 22), None, tuple(prompt), BS),)))
    hits, _ = p.matches(req("sql", prompt), [rep("a"), rep("b")])
    assert hits == {"a": 2, "b": 0}
    hits, _ = p.matches(req("support", prompt), [rep("a"), rep("b")])
    assert hits == {"a": 0, "b": 0}
