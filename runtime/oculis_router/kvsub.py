"""The `kv-events` picker's ears: a ZMQ SUB socket per replica that publishes vLLM KV-cache events
(`--kv-events-config`), each batch fed to its upstream's picker (`Picker.apply_events`), so the
picker knows which replica holds which block exactly, evictions included. Every router replica
subscribes to every engine, so all of them share one view.

A replica that publishes nothing (no address, or silent for `SILENT_AFTER_S`) is scored from the
router's own prefix memory instead (the picker's `fallback` reason), with one warning: a request is
never refused or delayed for missing events. A malformed message is counted and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from oculis_router.metrics import Metrics
from oculis_router.pick import Fleet
from oculis_router.picking import EventFormatError

log = logging.getLogger("oculis.router")
SILENT_AFTER_S = 10.0

Key = tuple[str, str, str]  # upstream, replica, publisher address


class Subscriptions:
    def __init__(self, fleet: Fleet, metrics: Metrics) -> None:
        self.fleet, self.metrics = fleet, metrics
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        self.since: dict[Key, float] = {}
        self.warned: set[tuple[str, str]] = set()
        self._ctx: Any = None

    def sync(self) -> None:
        """Subscribe to the publishers of kv-events pools' replicas; drop the ones gone."""
        want: set[Key] = set()
        now = time.monotonic()
        for name, pool in self.fleet.pools.items():
            if pool.strategy != "kv-events":
                continue
            silent = 0
            for r in pool.replicas.values():
                if r.kv_events:
                    want.add((name, r.id, r.kv_events))
                    quiet = now - self.since.get((name, r.id, r.kv_events), now) > SILENT_AFTER_S
                    if quiet and not pool.picker.index.heard(r.id):
                        silent += 1
                        self._fallback(name, r.id, f"no KV event from {r.kv_events} in {SILENT_AFTER_S:g} s")
                else:
                    silent += 1
                    self._fallback(name, r.id, "it has no KV-event publisher (kv_events / --kv-events-config)")
            # The operator reads it (Prometheus) into the GPUUpstream's KVEvents condition.
            self.metrics.kv_events_silent.labels(name).set(silent)
        for key in want - self.tasks.keys():
            self.tasks[key] = asyncio.get_running_loop().create_task(self._listen(*key))
            self.since[key] = now
        for key in self.tasks.keys() - want:
            self.tasks.pop(key).cancel()
            self.since.pop(key, None)

    def _fallback(self, upstream: str, replica: str, why: str) -> None:
        if (upstream, replica) not in self.warned:
            self.warned.add((upstream, replica))
            log.warning("upstream %s: picker kv-events scores replica %s from the router's prefix memory "
                        "(fallback): %s", upstream, replica, why)

    async def _listen(self, upstream: str, replica: str, address: str) -> None:
        import zmq
        import zmq.asyncio

        from oculis_router.picking import kvwire

        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        try:
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(address)  # connects (and reconnects) in the background: never blocks the router
            while True:
                frames = await sock.recv_multipart()
                try:
                    _, batch = kvwire.decode(frames)
                except EventFormatError as exc:
                    self.metrics.kv_event_batches.labels(upstream, "malformed").inc()
                    log.debug("upstream %s replica %s: KV-event message skipped: %s", upstream, replica, exc)
                    continue
                pool = self.fleet.pools.get(upstream)
                if pool is not None and replica in pool.replicas:
                    pool.picker.apply_events(replica, batch)
                    self.metrics.kv_event_batches.labels(upstream, "applied").inc()
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
