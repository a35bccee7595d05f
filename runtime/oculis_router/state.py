"""The router's configuration in force, and its hot reload.

A `Runtime` is an immutable snapshot built from one valid config: routes with their scorers and
cache stores. Each request takes the snapshot in force when it starts and keeps it to the end, so a
reload never drops or changes an in-flight request. A new file that does not parse or validate is
rejected (logged, counted) and the last good snapshot keeps serving. Stores and scorers whose
settings did not change are carried over, so a reload keeps caches warm.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oculis import ConfigError, Route, RouterConfig, Upstream, parse_config
from oculis_router.cache import MemoryStore, RedisStore, Store
from oculis_router.decide import RouteScorer
from oculis_router.metrics import Metrics
from oculis_router.upstreams import missing_key

log = logging.getLogger("oculis.router")


@dataclass(frozen=True)
class RouteRuntime:
    route: Route
    scorer: RouteScorer
    store: Store | None


@dataclass(frozen=True)
class Runtime:
    config: RouterConfig
    digest: str
    routes: dict[str, RouteRuntime]
    upstreams: dict[str, Upstream]


WAITING = ""  # the digest of the empty runtime served until a config file first appears


class ConfigHolder:
    def __init__(self, path: Path | None, metrics: Metrics, config: RouterConfig | None = None,
                 wait_for_file: bool = False) -> None:
        """`wait_for_file`: a missing file is not an error; serve "not ready" until it appears
        (in a cluster the ConfigMap is rendered once the first InferenceRoute exists)."""
        self.path = path
        self.metrics = metrics
        self._scorers: dict[str, RouteScorer] = {}
        self._stores: dict[str, Store] = {}
        if config is None:
            assert path is not None
            if wait_for_file and not path.exists():
                self.current = Runtime(RouterConfig.model_construct(upstreams=[], routes=[]), WAITING, {}, {})
                self._stamp = None
                log.warning("no config at %s yet; not ready until it appears", path)
                return
            text = path.read_text()
            config = parse_config(text, str(path))
            digest = hashlib.sha256(text.encode()).hexdigest()
        else:
            digest = hashlib.sha256(config.model_dump_json().encode()).hexdigest()
        self.current = self._build(config, digest)
        self._stamp = self._stat()

    @property
    def waiting(self) -> bool:
        return self.current.digest == WAITING

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat() if self.path else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size) if st else None

    def _build(self, config: RouterConfig, digest: str) -> Runtime:
        routes = {}
        for route in config.routes:
            skey = f"{route.name}:{route.classifier.model_dump_json()}:{route.tiers!r}:{route.escalation!r}"
            scorer = self._scorers.get(skey) or RouteScorer(route)
            self._scorers[skey] = scorer
            store = None
            if route.cache.enabled:
                ckey = f"{route.name}:{route.cache.model_dump_json()}:{config.server.model_dump_json()}"
                store = self._stores.get(ckey) or self._new_store(config, route)
                self._stores[ckey] = store
            routes[route.name] = RouteRuntime(route, scorer, store)
        for up in config.upstreams:
            if why := missing_key(up):
                log.warning("%s; requests to it will fail over to the next tier", why)
        return Runtime(config, digest, routes, {u.name: u for u in config.upstreams})

    @staticmethod
    def _new_store(config: RouterConfig, route: Route) -> Store:
        if config.server.cache_backend == "redis":
            assert config.server.redis_url
            return RedisStore(config.server.redis_url, route.cache.ttl_seconds)
        return MemoryStore(route.cache.max_entries, route.cache.ttl_seconds)

    def reload(self) -> bool:
        """Re-read the file if it changed; True when a new config took effect."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp or self.path is None:
            return False
        self._stamp = stamp
        text = self.path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest == self.current.digest:
            return False
        try:
            config = parse_config(text, str(self.path))
            runtime = self._build(config, digest)
        except (ConfigError, ValueError) as exc:
            self.metrics.reloads.labels("rejected").inc()
            log.error("rejected new config, still serving the previous one: %s", exc)
            return False
        self.current = runtime
        self.metrics.reloads.labels("applied").inc()
        log.info("applied new config %s", digest[:12])
        return True

    async def watch(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload()
            except OSError as exc:  # a ConfigMap swap can briefly remove the file
                log.warning("config file unreadable, keeping the current one: %s", exc)

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()


def describe(runtime: Runtime) -> list[dict[str, Any]]:
    """`GET /v1/models`: routes first, then upstreams."""
    out: list[dict[str, Any]] = [{"id": r, "object": "model", "owned_by": "oculis", "kind": "route"}
                                 for r in runtime.routes]
    out += [{"id": u.name, "object": "model", "owned_by": u.provider, "kind": "upstream", "model": u.model}
            for u in runtime.upstreams.values()]
    return out
