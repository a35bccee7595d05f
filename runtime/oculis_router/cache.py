"""Response cache: which requests may be cached, their tenant-scoped keys, and two stores.

A key always carries the tenant and the upstream (name and revision) besides the configured parts,
so one tenant never gets another's answer and a replaced model never serves its predecessor's.
Memory store: bounded LRU with TTL (cachetools). Redis store: shared by router replicas; TTL per
key; its size is bounded by the Redis server's maxmemory with an LRU eviction policy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, Protocol

from cachetools import TTLCache

from oculis import ResponseCache, Upstream

OPENAI_DEFAULT_TEMPERATURE = 1.0
log = logging.getLogger("oculis.router")


def cacheable(cfg: ResponseCache, body: dict[str, Any]) -> bool:
    if not cfg.enabled:
        return False
    limit = cfg.only_when.temperature_below
    if limit is not None:
        temperature = body.get("temperature", OPENAI_DEFAULT_TEMPERATURE)
        if not isinstance(temperature, int | float) or not temperature < limit:
            return False
    return bool(body.get("n", 1) == 1)


def cache_key(cfg: ResponseCache, body: dict[str, Any], tenant: str, upstream: Upstream, endpoint: str) -> str:
    parts: dict[str, Any] = {p: body.get(p) for p in cfg.key}
    parts.update(tenant=tenant, upstream=upstream.name, revision=upstream.revision, model=upstream.model,
                 endpoint=endpoint, route_model=body.get("model"))
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "oculis:rc:" + hashlib.sha256(blob.encode()).hexdigest()


class Store(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def set(self, key: str, value: dict[str, Any]) -> None: ...
    async def close(self) -> None: ...


class MemoryStore:
    def __init__(self, max_entries: int, ttl_seconds: float) -> None:
        self._data: TTLCache[str, bytes] = TTLCache(maxsize=max_entries, ttl=ttl_seconds)

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = self._data.get(key)
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        self._data[key] = json.dumps(value).encode()

    async def close(self) -> None:
        self._data.clear()


class RedisStore:
    """A cache is an optimisation: when Redis is down or slow, requests go on as misses (a warning
    at most every 10 s), never failing or waiting long because of it."""

    TIMEOUT_S = 0.25
    WARN_EVERY_S = 10.0

    def __init__(self, url: str, ttl_seconds: int) -> None:
        import redis.asyncio as redis

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
        self._redis = redis.from_url(url, socket_timeout=self.TIMEOUT_S, socket_connect_timeout=self.TIMEOUT_S)
        self._ttl = ttl_seconds
        self._warned_at = -self.WARN_EVERY_S

    def _unavailable(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at >= self.WARN_EVERY_S:
            self._warned_at = now
            log.warning("response cache (redis) unavailable, serving without it: %s: %s", type(exc).__name__, exc)

    async def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = await self._redis.get(key)
        except self._errors as exc:
            self._unavailable(exc)
            return None
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        try:
            await self._redis.set(key, json.dumps(value), ex=self._ttl)
        except self._errors as exc:
            self._unavailable(exc)

    async def close(self) -> None:
        await self._redis.aclose()


def sse_from_response(resp: dict[str, Any]) -> list[bytes]:
    """A cached chat completion replayed as a valid OpenAI SSE stream."""
    base = {"id": resp.get("id", "chatcmpl-cached"), "object": "chat.completion.chunk",
            "created": resp.get("created", 0), "model": resp.get("model", "")}
    out = []
    for choice in resp.get("choices", []):
        msg = choice.get("message", {})
        delta = {"role": msg.get("role", "assistant"), "content": msg.get("content", "")}
        out.append({**base, "choices": [{"index": choice.get("index", 0), "delta": delta, "finish_reason": None}]})
        out.append({**base, "choices": [{"index": choice.get("index", 0), "delta": {},
                                         "finish_reason": choice.get("finish_reason", "stop")}]})
    if resp.get("usage"):
        out.append({**base, "choices": [], "usage": resp["usage"]})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]
