"""vLLM's KV-cache events as typed values, and their wire form (msgpack over ZMQ PUB).

vLLM (`vllm/distributed/kv_events.py`) publishes three-frame ZMQ messages: topic, an 8-byte big-endian
sequence number, and a msgpack payload. The payload is an `EventBatch` encoded by msgspec with
`array_like=True`: `[ts, events, data_parallel_rank]`; each event is a tagged array, the tag first:
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]
Block hashes are ints (older vLLM) or bytes (newer); trailing fields newer versions add are ignored, and
missing trailing optional fields read as None. This module is pure: `from_wire` takes the decoded
object; `kvwire` does the msgpack/ZMQ part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]  # block_size x len(block_hashes) ids, or () when the engine sends none
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


class EventFormatError(ValueError):
    pass


def _hashes(where: str, value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(h, int | bytes) for h in value):
        raise EventFormatError(f"{where}: {value!r:.80} is not a list of block hashes (int or bytes)")
    return tuple(value)


def _event(obj: Any) -> KVEvent:
    if not isinstance(obj, list | tuple) or not obj or not isinstance(obj[0], str):
        raise EventFormatError(f"event: {obj!r:.80} is not a tagged array [\"BlockStored\", ...]")
    tag, fields = obj[0], list(obj[1:])
    if tag == "BlockStored":
        fields += [None] * (6 - len(fields))
        hashes, parent, ids, size, lora, medium = fields[:6]
        if parent is not None and not isinstance(parent, int | bytes):
            raise EventFormatError(f"BlockStored.parent_block_hash: {parent!r:.80} is not a block hash")
        ids = ids or []
        if not isinstance(ids, list | tuple) or not all(isinstance(t, int) for t in ids):
            raise EventFormatError(f"BlockStored.token_ids: {ids!r:.80} is not a list of ints")
        if not isinstance(size, int) or size < 1:
            raise EventFormatError(f"BlockStored.block_size: {size!r} is not a positive int")
        return BlockStored(_hashes("BlockStored.block_hashes", hashes), parent, tuple(ids), size,
                           lora if isinstance(lora, int) else None, medium if isinstance(medium, str) else None)
    if tag == "BlockRemoved":
        fields += [None] * (2 - len(fields))
        medium = fields[1]
        return BlockRemoved(_hashes("BlockRemoved.block_hashes", fields[0]),
                            medium if isinstance(medium, str) else None)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise EventFormatError(f"event tag {tag!r}: not BlockStored, BlockRemoved or AllBlocksCleared")


def from_wire(obj: Any) -> EventBatch:
    """An EventBatch from the decoded msgpack payload; EventFormatError naming the bad field otherwise."""
    if not isinstance(obj, list | tuple) or len(obj) < 2 or not isinstance(obj[0], int | float):
        raise EventFormatError(f"payload: {obj!r:.80} is not [ts, events, data_parallel_rank]")
    if not isinstance(obj[1], list | tuple):
        raise EventFormatError(f"payload.events: {obj[1]!r:.80} is not a list")
    rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
    return EventBatch(float(obj[0]), tuple(_event(e) for e in obj[1]), rank)


def to_wire(batch: EventBatch) -> list[Any]:
    """The array msgspec writes for vLLM's KVEventBatch (omit_defaults: a None rank is left off)."""
    events: list[Any] = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            events.append(["BlockStored", list(e.block_hashes), e.parent_block_hash, list(e.token_ids),
                           e.block_size, e.lora_id, e.medium])
        elif isinstance(e, BlockRemoved):
            events.append(["BlockRemoved", list(e.block_hashes), e.medium])
        else:
            events.append(["AllBlocksCleared"])
    out: list[Any] = [batch.ts, events]
    if batch.data_parallel_rank is not None:
        out.append(batch.data_parallel_rank)
    return out
