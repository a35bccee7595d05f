"""How far the approximate `prefix` picker drifts when two router replicas each keep their own memory,
against one router, and against two routers on `kv-events` (one view: the engines' own events).

    .venv/bin/python bench/prefix_drift.py [--replicas 4] [--groups 24] [--prefix-blocks 40]
                                           [--capacity-blocks 400] [--requests 6000] [--seed 1] [--json]

The router replicas sit behind a Service: each request reaches one of them at random. The engines are
LRU prefix caches of `--capacity-blocks` blocks each (vLLM's eviction order for freed blocks); a hit
is the leading blocks of the prompt present on the chosen replica. Each request is one of `--groups`
shared prefixes (`--prefix-blocks` blocks) plus two unique blocks. Load is left out on purpose (every
replica idle at each pick), so the figure isolates affinity: with one memory a group lives on one
replica; with two memories the second router places a group it has not seen without knowing where
the first put it. Printed side by side: the engines' hit share, the replicas each group ended up on
(1.0 = no drift) and the share of picks where the two routers' memories disagreed about the best
replica. The picker is the router's own core (oculis_router.picking).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import OrderedDict
from typing import Any

from oculis_router.picking import BlockRemoved, BlockStored, EventBatch, Picker, PickRequest, ReplicaState
from oculis_router.picking.hashing import chain

BS = 16


class Engine:
    """One replica's prefix cache: an LRU of chained block keys, publishing what it stores and evicts."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()

    def serve(self, blocks: tuple[int, ...]) -> tuple[int, EventBatch]:
        hit = 0
        for b in blocks:
            if b not in self.lru:
                break
            hit += 1
        stored, removed = [], []
        for b in blocks:
            if b in self.lru:
                self.lru.move_to_end(b)
            else:
                self.lru[b] = None
                stored.append(b)
        while len(self.lru) > self.capacity:
            removed.append(self.lru.popitem(last=False)[0])
        events: list[Any] = []
        if stored:  # keyed by the picker's own hashes: no token ids, so the index takes them as given
            events.append(BlockStored(tuple(stored), None, (), BS))
        if removed:
            events.append(BlockRemoved(tuple(removed)))
        return hit, EventBatch(0.0, tuple(events))


def workload(groups: int, prefix_blocks: int, n: int, rng: random.Random) -> list[tuple[int, tuple[int, ...]]]:
    out = []
    for i in range(n):
        g = rng.randrange(groups)
        h, blocks = 0, []
        for j in range(prefix_blocks + 2):
            h = chain(h, [g, j] if j < prefix_blocks else [g, j, i])
            blocks.append(h)
        out.append((g, tuple(blocks)))
    return out


def run(strategy: str, routers: int, args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    reqs = workload(args.groups, args.prefix_blocks, args.requests, rng)
    engines = {f"r{i}": Engine(args.capacity_blocks) for i in range(args.replicas)}
    pickers = [Picker(strategy, seed=args.seed + k, block_size=BS) for k in range(routers)]  # type: ignore[arg-type]
    states = [ReplicaState(r, kv_blocks=args.capacity_blocks, block_size=BS) for r in engines]
    hits = total = disagree = 0
    placed: dict[int, set[str]] = {}
    for g, blocks in reqs:
        req = PickRequest(blocks, len(blocks) * BS, 0)
        k = rng.randrange(routers)
        if routers > 1:  # what each memory believes the longest cached prefix is, before the pick
            best = [max(p.matches(req, states)[0].items(), key=lambda kv: kv[1], default=("", 0)) for p in pickers]
            disagree += int(len({b[0] for b in best if b[1]}) > 1)
        pick = pickers[k].pick(req, states)
        assert pick is not None
        hit, batch = engines[pick.replica].serve(blocks)
        if strategy == "kv-events":
            for p in pickers:  # every router subscribes to every engine
                p.apply_events(pick.replica, batch)
        hits += hit
        total += len(blocks)
        placed.setdefault(g, set()).add(pick.replica)
    return {"hit_share": hits / total, "replicas_per_group": sum(map(len, placed.values())) / len(placed),
            "memories_disagree": disagree / len(reqs) if routers > 1 else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--prefix-blocks", type=int, default=40)
    ap.add_argument("--capacity-blocks", type=int, default=400)
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = {f"{s}, {n} router{'s' if n > 1 else ''}": run(s, n, args)
            for s, n in (("random", 1), ("prefix", 1), ("prefix", 2), ("kv-events", 2))}
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    fill = args.groups * args.prefix_blocks / (args.replicas * args.capacity_blocks)
    print(f"{args.replicas} replicas x {args.capacity_blocks} blocks, {args.groups} groups x {args.prefix_blocks} "
          f"prefix blocks (prefix demand {fill:.0%} of the fleet's KV), {args.requests} requests")
    print(f"{'':22s} {'engine hit share':>16s} {'replicas/group':>15s} {'memories disagree':>18s}")
    for name, r in rows.items():
        print(f"{name:22s} {r['hit_share']:16.3f} {r['replicas_per_group']:15.2f} {r['memories_disagree']:18.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
