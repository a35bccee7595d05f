"""vLLM's KV-cache events as typed values, and their wire form (msgpack over ZMQ PUB).

vLLM (`vllm/distributed/kv_events.py`) publishes three-frame ZMQ messages: topic, an 8-byte big-endian
sequence number, and a msgpack payload. The payload is an `EventBatch` encoded by msgspec with
`array_like=True`: `[ts, events, data_parallel_rank]`. Each event is a tagged struct; vLLM 0.32 (as
measured from a real engine: tests/realengine/test_router_kv_events_real.py) writes it as a map, the tag
in `type`, defaults omitted:
    {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
     "medium", "lora_name", ...}
    {"type": "BlockRemoved", "block_hashes", "medium"}
    {"type": "AllBlocksCleared"}
and earlier releases (`array_like` events) as a tagged array, the tag first:
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]
`from_wire` reads both; `to_wire` writes 0.32's maps. Block hashes are ints or bytes (vLLM 0.32 sends
ints); fields newer versions add are ignored, and missing optional fields read as None. This module is
pure: `from_wire` takes the decoded object; `kvwire` does the msgpack/ZMQ part.
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
    lora_name: str | None = None  # the LoRA adapter the blocks were computed for (vLLM 0.32 names it)


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


STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
REMOVED_FIELDS = ("block_hashes", "medium")


def _event(obj: Any) -> KVEvent:
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):  # vLLM 0.32: a map, the tag in `type`
        tag = obj["type"]
        names = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else ()
        fields = [obj.get(n) for n in names]
    elif isinstance(obj, list | tuple) and obj and isinstance(obj[0], str):  # earlier: a tagged array
        tag, fields = obj[0], list(obj[1:])
    else:
        raise EventFormatError(f"event: {obj!r:.80} is neither {{\"type\": \"BlockStored\", ...}} nor "
                               "[\"BlockStored\", ...]")
    if tag == "BlockStored":
        fields += [None] * (7 - len(fields))
        hashes, parent, ids, size, lora, medium, lora_name = fields[:7]
        if parent is not None and not isinstance(parent, int | bytes):
            raise EventFormatError(f"BlockStored.parent_block_hash: {parent!r:.80} is not a block hash")
        ids = ids or []
        if not isinstance(ids, list | tuple) or not all(isinstance(t, int) for t in ids):
            raise EventFormatError(f"BlockStored.token_ids: {ids!r:.80} is not a list of ints")
        if not isinstance(size, int) or size < 1:
            raise EventFormatError(f"BlockStored.block_size: {size!r} is not a positive int")
        return BlockStored(_hashes("BlockStored.block_hashes", hashes), parent, tuple(ids), size,
                           lora if isinstance(lora, int) else None, medium if isinstance(medium, str) else None,
                           lora_name if isinstance(lora_name, str) and lora_name else None)
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
    """What vLLM 0.32's msgspec writes for its KVEventBatch: the batch an array (a None rank left off), each
    event a map tagged by `type` (the fields without defaults always, `lora_name` None for the base model)."""
    events: list[Any] = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            events.append({"type": "BlockStored", "block_hashes": list(e.block_hashes),
                           "parent_block_hash": e.parent_block_hash, "token_ids": list(e.token_ids),
                           "block_size": e.block_size, "lora_id": e.lora_id, "medium": e.medium,
                           "lora_name": e.lora_name})
        elif isinstance(e, BlockRemoved):
            events.append({"type": "BlockRemoved", "block_hashes": list(e.block_hashes), "medium": e.medium})
        else:
            events.append({"type": "AllBlocksCleared"})
    out: list[Any] = [batch.ts, events]
    if batch.data_parallel_rank is not None:
        out.append(batch.data_parallel_rank)
    return out
