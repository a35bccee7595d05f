"""`oculis serve --redis-url`: a config without a server section (as the operator renders it) gets its
response cache and its rate limiter in that Redis, on the first load and on every reload; the memory
settings of the file stay in force without the flag."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from oculis_router.cache import MemoryStore, RedisStore
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder

URL = "redis://127.0.0.1:9/0"  # never dialled: building a store or limiter opens no connection


def write(path: Path, rpm: int, server: dict[str, object] | None = None) -> None:
    doc: dict[str, object] = {
        "upstreams": [{"name": "ok", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "routes": [{"name": "r", "tiers": [{"name": "a", "upstream": "ok"}], "cache": {"enabled": True},
                    "limits": {"requests_per_minute": rpm}}]}
    if server is not None:
        doc["server"] = server
    path.write_text(yaml.safe_dump({"oculis": doc}))


def backends(holder: ConfigHolder) -> tuple[type, str]:
    rt = holder.current
    assert rt.limiter is not None
    return type(rt.routes["r"].store), rt.limiter.backend.name


def test_redis_url_puts_cache_and_limiter_of_every_loaded_config_in_redis(tmp_path: Path) -> None:
    path = tmp_path / "oculis-config.yaml"
    write(path, 10)
    holder = ConfigHolder(path, Metrics(), redis_url=URL)
    assert backends(holder) == (RedisStore, "redis")
    assert holder.current.config.server.redis_url == URL
    write(path, 20, {"cache_backend": "memory", "limiter": {"backend": "memory"}})  # the flag wins over the file
    assert holder.reload()
    assert backends(holder) == (RedisStore, "redis")
    asyncio.run(holder.close())


def test_without_redis_url_the_files_memory_backends_stay(tmp_path: Path) -> None:
    path = tmp_path / "oculis-config.yaml"
    write(path, 10)
    assert backends(ConfigHolder(path, Metrics())) == (MemoryStore, "memory")
