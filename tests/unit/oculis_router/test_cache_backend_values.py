"""A Redis value the router cannot read back (written by something else under our prefix, or cut short)
is a miss and a counted backend error, never a 500 for the request that looked it up."""

from __future__ import annotations

from typing import Any

import pytest

from oculis_router.cache import RedisStore


class OneValue:
    """The one call the store makes on a get, answering a fixed value (a redis.asyncio stand-in)."""

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw

    async def get(self, key: str) -> bytes | None:
        return self.raw

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("raw", [b"not json", b'{"cut": ', b"[1, 2, 3]", b"null", b"[" * 100_000 + b"]" * 100_000])
async def test_an_unreadable_cached_value_is_a_miss_and_counted(raw: bytes) -> None:
    errors: list[str] = []
    store = RedisStore("redis://127.0.0.1:1/0", 60, client=OneValue(raw), on_error=errors.append)
    assert await store.get("oculis:rc:x") is None
    assert errors == ["get"] or raw in (b"[1, 2, 3]", b"null")  # valid JSON of the wrong shape: a plain miss


async def test_a_stored_answer_reads_back() -> None:
    store = RedisStore("redis://127.0.0.1:1/0", 60, client=OneValue(b'{"id": "a"}'))
    value: Any = await store.get("oculis:rc:x")
    assert value == {"id": "a"}
