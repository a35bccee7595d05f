"""Response cache: which requests may be cached, their tenant-scoped keys, and two stores.

A key covers the whole request but a few fields known never to change the answer (ANSWER_NEUTRAL),
and always the tenant and the upstream (name, revision, model), so two different questions never
share an answer, one tenant never gets another's and a replaced model never serves its predecessor's.
Only answers that replay exactly, whole or as a stream, are stored (`storable`).
Memory store: bounded LRU with TTL (cachetools). Redis store: shared by router replicas; TTL per
key; its size is bounded by the Redis server's maxmemory with an LRU eviction policy.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from cachetools import TTLCache

from oculis import ResponseCache, Upstream
from oculis.router import CACHE_KEY_REQUIRED
from oculis_router.sse import StreamCollector, chunks_of, encode

OPENAI_DEFAULT_TEMPERATURE = 1.0
log = logging.getLogger("oculis.router")

# Request fields that never change the answer, so they stay out of every key; each with the reason.
# Every other field is in the key: a field the router does not know yet splits the cache (a miss at
# worst) instead of making two different questions share an answer. Keep `ResponseCache.ignore`'s
# description (crds/oculis/router.py) in step: a test compares them.
ANSWER_NEUTRAL: dict[str, str] = {
    "stream": "the cached answer is replayed whole or as a stream, whichever this request asks",
    "stream_options": "frames a stream only (whether a usage chunk ends it); a replay follows this request's own",
    "user": "an end-user id for the provider's abuse monitoring, not an input of the model",
    "safety_identifier": "the successor of `user`, for the same monitoring",
    "metadata": "tags for the provider's stored-completions dashboard, not seen by the model",
    "store": "whether the provider keeps a copy of the answer, not what the answer is",
    "prompt_cache_key": "picks which provider prompt cache serves the prefix: faster, the same answer",
}


def cacheable(cfg: ResponseCache, body: dict[str, Any]) -> bool:
    if not cfg.enabled:
        return False
    limit = cfg.only_when.temperature_below
    if limit is not None:
        temperature = body.get("temperature", OPENAI_DEFAULT_TEMPERATURE)
        if not isinstance(temperature, int | float) or not temperature < limit:
            return False
    return bool(body.get("n", 1) == 1)


def key_fields(cfg: ResponseCache, body: dict[str, Any]) -> dict[str, Any]:
    """What of a request its key covers: the whole body but the answer-neutral fields and the route's
    `cache.ignore` (which can never name the question itself: CACHE_KEY_REQUIRED). `null` is unset,
    as the OpenAI API reads it. `cache.key`, the old allow-list, is deprecated and not read: it let
    requests that differ in `prompt`, `response_format`, `tools`... share one answer."""
    left_out = (ANSWER_NEUTRAL.keys() | set(cfg.ignore)) - set(CACHE_KEY_REQUIRED)
    return {k: v for k, v in body.items() if k not in left_out and v is not None}


def cache_key(cfg: ResponseCache, body: dict[str, Any], tenant: str, upstream: Upstream, endpoint: str) -> str:
    parts: dict[str, Any] = {
        # `ignored` too: replicas sharing Redis mid-rollout of a changed `cache.ignore` never mix entries.
        "request": key_fields(cfg, body), "ignored": sorted(cfg.ignore), "endpoint": endpoint, "tenant": tenant,
        # What the upstream's config feeds into the answer besides the request.
        "upstream": upstream.name, "revision": upstream.revision, "provider": upstream.provider,
        "model": upstream.model, "default_max_tokens": upstream.default_max_tokens,
    }
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "oculis:rc:" + hashlib.sha256(blob.encode()).hexdigest()


def _pruned(value: Any) -> Any:
    """`value` without null, empty-list and empty-object fields: the ones a stream does not carry and a
    non-streamed answer writes out (`"refusal": null`, `"annotations": []`), which mean the same."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def storable(endpoint: str, answer: dict[str, Any]) -> bool:
    """Whether `answer` can be replayed exactly, whole and as a stream: it survives being cut into
    chunks and rebuilt from them. Not stored, because a replay would lose part of them: answers with
    fields a stream has no place for (`message.audio`, non-empty `annotations`, unknown structured
    fields), without usage or choices, or with a `tool_calls` finish but no calls; and streams (see
    StreamCollector.response) that did not finish, carried an error event or a chunk the rebuild
    cannot keep."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        return False
    # "tool_calls" with no call is an answer that lost its calls on the way (a lossy translation): an
    # agent replaying it would get an empty assistant turn, every time instead of once.
    for c in choices:
        msg = c.get("message")
        if c.get("finish_reason") == "tool_calls" and not (isinstance(msg, dict) and msg.get("tool_calls")):
            return False
    try:
        rebuilt = StreamCollector(endpoint)
        for chunk in encode(chunks_of(answer, endpoint)):
            rebuilt.feed(chunk)
        again = rebuilt.response()
        return again is not None and _pruned(again) == _pruned(answer)
    except RecursionError:  # nested too deep to serialise again: not worth keeping
        return False


def stream_wants_usage(body: dict[str, Any]) -> bool:
    """Whether the client's stream ends with a usage chunk, live, buffered or replayed: only when it set
    `stream_options.include_usage`, as OpenAI does (the router asks upstreams for one regardless)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


class Store(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def set(self, key: str, value: dict[str, Any]) -> None: ...
    async def close(self) -> None: ...


MEMORY_STORE_MAX_BYTES = 128 * 1024 * 1024  # per route: 100 000 entries of long answers would be gigabytes


class MemoryStore:
    """At most `max_entries` answers and at most `max_bytes` of them, whichever binds first: each
    entry weighs its bytes plus an equal share of `max_bytes` (the least-recently-used go first)."""

    def __init__(self, max_entries: int, ttl_seconds: float, max_bytes: int = MEMORY_STORE_MAX_BYTES) -> None:
        share = max(max_bytes // max(max_entries, 1), 1)
        self._data: TTLCache[str, bytes] = TTLCache(maxsize=max_bytes, ttl=ttl_seconds,
                                                    getsizeof=lambda v: len(v) + share)

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = self._data.get(key)
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        with contextlib.suppress(ValueError):  # one answer larger than the whole store: not cached
            self._data[key] = json.dumps(value).encode()

    async def close(self) -> None:
        self._data.clear()


class RedisStore:
    """A cache is an optimisation: when Redis is down or slow, requests go on as misses (a warning
    at most every 10 s), never failing or waiting long because of it."""

    TIMEOUT_S = 0.25
    WARN_EVERY_S = 10.0

    def __init__(self, url: str, ttl_seconds: int, client: Any = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        """`client`: a redis.asyncio client shared with other stores (their owner closes it); without
        one the store makes and closes its own. `on_error(op)` counts each failed get/set."""
        import redis.asyncio as redis

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
        self._owned = client is None
        self._redis = client if client is not None else new_redis_client(url)
        self._ttl = ttl_seconds
        self._warned_at = -self.WARN_EVERY_S
        self._on_error = on_error

    def _unavailable(self, exc: BaseException, op: str) -> None:
        if self._on_error is not None:
            self._on_error(op)
        now = time.monotonic()
        if now - self._warned_at >= self.WARN_EVERY_S:
            self._warned_at = now
            log.warning("response cache (redis) unavailable, serving without it: %s: %s", type(exc).__name__, exc)

    async def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = await self._redis.get(key)
        except self._errors as exc:
            self._unavailable(exc, "get")
            await drop_idle(self._redis)
            return None
        if raw is None:
            return None
        try:  # a value someone else wrote under our prefix, or cut short: a miss, never a 500
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self._unavailable(exc, "get")
            return None
        return value if isinstance(value, dict) else None

    async def set(self, key: str, value: dict[str, Any]) -> None:
        try:
            await self._redis.set(key, json.dumps(value), ex=self._ttl)
        except self._errors as exc:
            self._unavailable(exc, "set")
            await drop_idle(self._redis)

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()


def new_redis_client(url: str) -> Any:
    """The router's Redis client (cache and limits): short timeouts, and a pool that closes every idle
    connection once it finds one the server closed (_recycling_pool)."""
    import redis.asyncio as redis

    pool = _recycling_pool().from_url(url, socket_timeout=RedisStore.TIMEOUT_S,
                                      socket_connect_timeout=RedisStore.TIMEOUT_S)
    return redis.Redis.from_pool(pool)


@functools.cache
def _recycling_pool() -> Any:
    """A redis.asyncio ConnectionPool class (made on first use: redis is imported only where a store uses it).

    When Redis restarts it closes every connection; the pool finds that out only for the one it hands
    out next, which redis-py reconnects quietly (no error, so drop_idle never ran), and every other idle
    connection stayed open in CLOSE_WAIT for good. Here a connection found closed by the server closes the
    pool's other idle ones with it: they were all closed by the same restart."""
    import redis.asyncio as redis

    class RecyclingPool(redis.ConnectionPool):
        async def ensure_connection(self, connection: Any) -> None:
            # can_read (redis-py 8) is what can_read_destructive was (5 to 7): data or EOF waiting.
            can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
            try:
                closed = connection.is_connected and await can_read()
            except (redis.ConnectionError, OSError, TimeoutError):
                closed = True
            if closed:
                with contextlib.suppress(Exception):
                    await self.disconnect(inuse_connections=False)
            await super().ensure_connection(connection)

    return RecyclingPool


async def drop_idle(client: Any) -> None:
    """After a failed call, close the pool's idle connections: when Redis restarted they are all dead
    (CLOSE_WAIT), and a pool only finds that out for the few it hands out again, so the rest stayed
    open for good (bench/soak.py saw the fds grow by the pool's peak size at each restart)."""
    with contextlib.suppress(Exception):
        await client.connection_pool.disconnect(inuse_connections=False)


def sse_from_response(resp: dict[str, Any], endpoint: str = "chat", include_usage: bool = True) -> list[bytes]:
    """A cached answer replayed as the stream its endpoint sends (`chat.completion.chunk` with
    tool-call deltas and logprobs, or `text_completion` chunks)."""
    return encode(chunks_of(resp, endpoint, include_usage))
