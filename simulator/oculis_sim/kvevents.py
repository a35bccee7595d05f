"""`oculis sim serve --kv-events-config JSON`: the engine's KV-cache events, published as vLLM publishes
them (msgpack over ZMQ PUB, `oculis_router.picking.events` for the schema), so a router's `kv-events`
picker can be tested against simulators.

The config is vLLM's `KVEventsConfig` JSON: `enable_kv_cache_events` (false: nothing is published),
`publisher` (`zmq`, or `null`), `endpoint` (default `tcp://*:5557`; a wildcard or ipc address is bound,
another connected, as vLLM does), `topic` (default ""); vLLM's queueing knobs (`buffer_steps`, `hwm`,
`max_queue_size`, `replay_endpoint`) are accepted and not modelled (no replay socket).

After each engine step the blocks that entered the prefix cache are one BlockStored per chain (block
hashes, the parent's hash, the blocks' token ids, the block size) and the evicted ones a BlockRemoved, in
the order they happened, in one EventBatch. Token ids are the CRC-32 of the simulator's word tokens:
`oculis_router.picking.approx_token_ids` of the same prompt text gives the same ids, so a router keys
these blocks as it keys its requests.
"""

from __future__ import annotations

import json
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from oculis_router.picking import BlockRemoved, BlockStored, EventBatch
from oculis_sim.engine import EngineCore

_KNOWN = {"enable_kv_cache_events", "publisher", "endpoint", "topic", "replay_endpoint", "buffer_steps", "hwm",
          "max_queue_size"}
PENDING_BLOCKS = 1 << 20  # token ids kept for blocks not yet stored (oldest dropped first)


class KVEventsError(ValueError):
    pass


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str
    topic: str


def parse_config(raw: str) -> KVEventsConfig | None:
    """The config, or None when events are off; KVEventsError naming the field otherwise."""
    flag = "--kv-events-config"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise KVEventsError(f"{flag}: not JSON ({exc.msg}); e.g. '{{\"enable_kv_cache_events\": true, "
                            "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'") from None
    if not isinstance(data, dict):
        raise KVEventsError(f"{flag}: {raw!r} must be a JSON object such as {{\"enable_kv_cache_events\": true}}")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise KVEventsError(f"{flag}: unknown field {unknown[0]!r}; use {', '.join(sorted(_KNOWN))}")
    enabled = data.get("enable_kv_cache_events", False)
    if not isinstance(enabled, bool):
        raise KVEventsError(f"{flag}: enable_kv_cache_events {enabled!r} must be true or false")
    publisher = data.get("publisher") or ("zmq" if enabled else "null")
    if publisher not in ("zmq", "null"):
        raise KVEventsError(f"{flag}: publisher {publisher!r} is not zmq or null")
    endpoint = data.get("endpoint", "tcp://*:5557")
    topic = data.get("topic", "")
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise KVEventsError(f"{flag}: endpoint {endpoint!r} must be a ZMQ address such as tcp://*:5557")
    if not isinstance(topic, str):
        raise KVEventsError(f"{flag}: topic {topic!r} must be a string")
    if not enabled or publisher == "null":
        return None
    return KVEventsConfig(endpoint, topic)


class Publisher:
    """One engine's PUB socket: `note` each request's blocks, `publish` after each step."""

    def __init__(self, cfg: KVEventsConfig, block: int, sock: Any) -> None:
        self.cfg = cfg
        self.block = block
        self.sock = sock
        self.seq = 0
        self.pending: OrderedDict[object, tuple[object | None, tuple[int, ...]]] = OrderedDict()

    @classmethod
    def bind(cls, cfg: KVEventsConfig, block: int) -> Publisher:
        """KVEventsError (one line) when the address cannot be bound."""
        import zmq

        sock: Any = zmq.Context.instance().socket(zmq.PUB)
        addr = cfg.endpoint
        try:
            if "*" in addr or "::" in addr or addr.startswith(("ipc://", "inproc://")):
                sock.bind(addr)
            else:
                sock.connect(addr)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise KVEventsError(f"--kv-events-config: endpoint {addr}: {exc}") from None
        return cls(cfg, block, sock)

    def attach(self, core: EngineCore) -> None:
        core.scheduler.pool.log = []

    def note(self, hashes: tuple[object | None, ...], words: list[str]) -> None:
        """Remember the parent and token ids of a request's full prompt blocks until they are stored."""
        bs = self.block
        pending = self.pending
        parent: object | None = None
        crc = zlib.crc32
        for i, h in enumerate(hashes):
            if h is None:
                break
            if h not in pending:
                pending[h] = (parent, tuple(crc(w.encode()) for w in words[i * bs:(i + 1) * bs]))
            parent = h
        while len(pending) > PENDING_BLOCKS:
            pending.popitem(last=False)

    def batch(self, log: list[tuple[bool, object]]) -> EventBatch:
        events: list[BlockStored | BlockRemoved] = []
        stored: list[object] = []
        ids: list[int] = []
        parent: object | None = None
        removed: list[object] = []

        def flush() -> None:
            nonlocal stored, ids, removed
            if stored:
                events.append(BlockStored(tuple(stored), parent, tuple(ids), self.block))  # type: ignore[arg-type]
                stored, ids = [], []
            if removed:
                events.append(BlockRemoved(tuple(removed)))  # type: ignore[arg-type]
                removed = []

        for is_stored, h in log:
            if not is_stored:
                if stored:
                    flush()
                removed.append(h)
                continue
            if removed:
                flush()
            p, toks = self.pending.pop(h, (None, ()))
            if len(toks) != self.block:  # its tokens are unknown: alone, without token ids
                flush()
                events.append(BlockStored((h,), p, (), self.block))  # type: ignore[arg-type]
                continue
            if stored and p != stored[-1]:  # not the next block of this chain: a new BlockStored
                flush()
            if not stored:
                parent = p
            stored.append(h)
            ids.extend(toks)
        flush()
        return EventBatch(time.time(), tuple(events))

    def publish(self, core: EngineCore) -> None:
        from oculis_router.picking import kvwire

        log = core.scheduler.pool.log
        if not log:
            return
        frames = kvwire.encode(self.cfg.topic, self.seq, self.batch(log))
        log.clear()
        self.seq += 1
        self.sock.send_multipart(frames)  # a PUB socket drops rather than blocks when a subscriber lags

    def close(self) -> None:
        self.sock.close(0)
