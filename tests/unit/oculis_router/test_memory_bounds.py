"""Memory held per request is bounded by bytes, not by a count of entries of any size."""

from __future__ import annotations

import asyncio

from oculis_router.cache import MemoryStore
from oculis_router.classify import ComplexityClassifier


def test_the_memory_response_cache_is_bounded_by_bytes_and_entries() -> None:
    store = MemoryStore(max_entries=1000, ttl_seconds=60, max_bytes=10 * 2**20)
    big = {"choices": [{"message": {"content": "x" * 2**20}}]}  # a 1 MB answer

    async def fill() -> None:
        for i in range(50):
            await store.set(f"k{i}", big)
        await store.set("huge", {"content": "y" * 20 * 2**20})  # larger than the whole store: not kept

    asyncio.run(fill())
    assert sum(len(v) for v in store._data.values()) <= 10 * 2**20
    assert 0 < len(store._data) < 50 and "huge" not in store._data
    assert asyncio.run(store.get("k49")) == big  # the most recent answers stay

    small = MemoryStore(max_entries=10, ttl_seconds=60, max_bytes=10 * 2**20)
    for i in range(100):
        asyncio.run(small.set(f"k{i}", {"a": i}))
    assert len(small._data) <= 10  # and max_entries still binds for small answers


def test_the_classifier_memo_is_keyed_by_a_digest_not_the_prompt() -> None:
    clf = ComplexityClassifier.packaged()
    prompt = "why is the sky blue? " * 150_000  # 3 MB
    first = clf.score_text(prompt, "earlier turns")
    assert clf.score_text(prompt, "earlier turns") == first  # memoised
    assert clf._memo is not None and all(len(k) <= 64 for k in clf._memo)
