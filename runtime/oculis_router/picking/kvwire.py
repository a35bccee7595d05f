"""vLLM's KV-event framing on ZMQ: [topic, 8-byte big-endian sequence number, msgpack payload].

Needs msgpack (the `router` and `sim` extras); the picker core itself does not. The ZMQ sockets belong to
the caller (the simulator's publisher, the router's subscriber): this module only builds and reads frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from oculis_router.picking.events import EventBatch, EventFormatError, from_wire, to_wire

DEFAULT_TOPIC = ""  # vLLM's KVEventsConfig.topic default: subscribers subscribe to b"" (everything)


def encode(topic: str, seq: int, batch: EventBatch) -> list[bytes]:
    return [topic.encode(), seq.to_bytes(8, "big"), msgpack.packb(to_wire(batch), use_bin_type=True)]


def decode(frames: Sequence[bytes]) -> tuple[int, EventBatch]:
    """(sequence number, batch) from one multipart message; EventFormatError when it is not vLLM's form."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise EventFormatError(f"message: {len(frames)} frames, expected [topic, seq (8 bytes), payload]")
    try:
        obj = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise EventFormatError(f"payload: not msgpack ({exc})") from None
    return int.from_bytes(frames[1], "big"), from_wire(obj)
