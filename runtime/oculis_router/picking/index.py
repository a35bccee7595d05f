"""Who holds which block: the approximate memory (what the router sent where) and the precise index (what
the engines said they stored). Both answer `match`: per replica, how many leading blocks of a request's
chained hashes it holds.

A chained hash names its whole prefix, so a replica holding block i of a request holds that request's
prefix up to i; the scan stops at the first block no candidate holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from oculis_router.picking.events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch
from oculis_router.picking.hashing import ROOT, adapter_root, chain


class _Holders:
    """block key -> the replicas holding it; the shared half of both indexes."""

    def __init__(self) -> None:
        self.holders: dict[object, set[str]] = {}

    def _add(self, key: object, replica: str) -> None:
        s = self.holders.get(key)
        if s is None:
            self.holders[key] = {replica}
        else:
            s.add(replica)

    def _drop(self, key: object, replica: str) -> None:
        s = self.holders.get(key)
        if s is not None:
            s.discard(replica)
            if not s:
                del self.holders[key]

    def match(self, hashes: Sequence[object], replicas: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each replica holds (0 for replicas holding none)."""
        out = dict.fromkeys(replicas, 0)
        alive = set(out)
        holders = self.holders
        i = 0
        for i, h in enumerate(hashes):
            hold = holders.get(h)
            if hold is None:
                break
            if not alive <= hold:
                for r in alive - hold:
                    out[r] = i
                alive &= hold
                if not alive:
                    break
        else:
            i = len(hashes)
        for r in alive:
            out[r] = i
        return out


class PrefixMemory(_Holders):
    """Approximate affinity: per replica an LRU of the block hashes the router sent there, bounded by that
    replica's KV capacity in blocks (the engine cannot hold more; it evicts least recently used blocks,
    as this memory does). Wrong after evictions it did not see: that is what the precise index is for."""

    def __init__(self) -> None:
        super().__init__()
        self.lru: dict[str, OrderedDict[object, None]] = {}

    def remember(self, replica: str, hashes: Sequence[object], capacity_blocks: int | None) -> None:
        lru = self.lru.get(replica)
        if lru is None:
            lru = self.lru[replica] = OrderedDict()
        move = lru.move_to_end
        for h in hashes:
            if h in lru:
                move(h)
            else:
                lru[h] = None
                self._add(h, replica)
        if capacity_blocks is not None:
            while len(lru) > max(capacity_blocks, 0):
                old, _ = lru.popitem(last=False)
                self._drop(old, replica)

    def forget(self, replica: str) -> None:
        for h in self.lru.pop(replica, {}):
            self._drop(h, replica)

    def size(self, replica: str) -> int:
        return len(self.lru.get(replica, ()))


class KVIndex(_Holders):
    """Precise affinity: the blocks each engine reported in its KV events.

    Keys are the picker's own chained hashes recomputed from the events' token ids (engines salt their
    hashes per process, so the router cannot compute theirs); an engine hash -> key map per replica serves
    BlockRemoved. An event without token ids is keyed by the engine's hash as given (the fleet simulator
    hashes requests and blocks alike, so they match). Blocks whose size differs from the picker's are
    counted in `mismatched` but kept: the engine's block size (`block_size_seen`) is the one the router
    hashes with when it has not scraped `cache_config_info` yet, and events arrive before the first scrape."""

    def __init__(self, block_size: int) -> None:
        super().__init__()
        self.block_size = block_size
        self.keys: dict[str, dict[BlockHash, object]] = {}
        self.batches: dict[str, int] = {}  # batches heard per replica: a replica that published nothing has none
        self.mismatched = 0
        self.block_size_seen: int | None = None  # the block size of the last BlockStored heard

    def heard(self, replica: str) -> bool:
        return self.batches.get(replica, 0) > 0

    def apply(self, replica: str, batch: EventBatch) -> None:
        self.batches[replica] = self.batches.get(replica, 0) + 1
        keys = self.keys.setdefault(replica, {})
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(replica, keys, ev)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    key = keys.pop(h, None)
                    if key is not None:
                        self._drop(key, replica)
            elif isinstance(ev, AllBlocksCleared):
                self.clear(replica)
                keys = self.keys.setdefault(replica, {})

    def _stored(self, replica: str, keys: dict[BlockHash, object], ev: BlockStored) -> None:
        self.block_size_seen = ev.block_size
        if ev.block_size != self.block_size:
            self.mismatched += len(ev.block_hashes)
        if not ev.token_ids:
            for h in ev.block_hashes:
                keys[h] = h
                self._add(h, replica)
            return
        bs = ev.block_size
        if ev.parent_block_hash is None:  # an adapter's blocks stand apart from the base model's, as vLLM's
            if ev.lora_name is not None:  # named (vLLM 0.32): keyed as the router hashes that adapter's prompts
                parent: object = adapter_root(ev.lora_name)
            else:  # only the engine's own number: apart, matched by no request
                parent = ROOT if ev.lora_id is None else chain(ROOT, [-1 - ev.lora_id])
        else:
            parent = keys.get(ev.parent_block_hash, ev.parent_block_hash)  # unknown parent: keys match nothing
        for i, h in enumerate(ev.block_hashes):
            ids = ev.token_ids[i * bs:(i + 1) * bs]
            key: object = chain(parent, ids) if isinstance(parent, int) and len(ids) == bs else ("engine", h)
            keys[h] = key
            self._add(key, replica)
            parent = key

    def clear(self, replica: str) -> None:
        for key in self.keys.pop(replica, {}).values():
            self._drop(key, replica)

    def size(self, replica: str) -> int:
        return len(self.keys.get(replica, ()))
