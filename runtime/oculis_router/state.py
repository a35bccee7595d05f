"""The router's configuration in force, and its hot reload.

A `Runtime` is an immutable snapshot built from one valid config: routes with their scorers and
cache stores. Each request takes the snapshot in force when it starts and keeps it to the end, so a
reload never drops or changes an in-flight request. A new file that does not parse or validate is
rejected (logged once, counted) and the last good snapshot keeps serving; the next good file
applies. A rejected file is not forgotten: it is tried again when a file it depends on changes (a
classifier head or an upstream's tokenizer that lands after the config, as ConfigMaps and volumes do),
when it is written again with the same bytes (`touch`), and every `RETRY_REJECTED_S`; it applies as
soon as it builds, and until then `/readyz` names it as rejected next to the config in force.
Whatever a write holds (invalid UTF-8,
YAML nested past the recursion limit, a schema error, a setting that fails to build) is a
rejection, never an exception that ends the watcher; should the watcher stop anyway,
`watch_stopped` says why and `/readyz` turns 503 naming it.
Stores and scorers whose settings did not change are carried over, so a reload keeps caches warm;
those a reload dropped are closed once in-flight requests of the old snapshot have had time to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oculis import ConfigError, Route, RouterConfig, Upstream, parse_config
from oculis_router import model_tokens
from oculis_router.cache import MemoryStore, RedisStore, Store, new_redis_client
from oculis_router.classify import DEFAULT_MODEL
from oculis_router.decide import RouteScorer, head_file
from oculis_router.decisionlog import sink_problem
from oculis_router.limits import limited_anywhere
from oculis_router.limits_store import Limiter, build_limiter
from oculis_router.metrics import Metrics
from oculis_router.upstream_keys import missing_key

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
    limiter: Limiter | None = None  # None when no route, override or server default sets a limit


MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a ConfigMap holds 1 MiB; anything far larger is not a config
RETIRE_AFTER_S = 600.0  # a dropped cache store outlives the longest in-flight request of the old snapshot
WAITING = ""  # the digest of the empty runtime served until a config file first appears
RETRY_REJECTED_S = 30.0  # a rejected config is tried again this often (its fault may lie outside the file)


@dataclass(frozen=True)
class Rejected:
    """A config file that did not build, kept to be tried again (ConfigHolder.retry_rejected)."""

    digest: str
    raw: bytes
    reason: str
    deps: dict[Path, tuple[int, int] | None]  # files it reads (classifier heads), by stamp when tried
    tried_at: float


def with_shared_redis(config: RouterConfig, redis_url: str | None) -> RouterConfig:
    """The config with its response cache and rate limiter both at `redis_url` (`oculis serve
    --redis-url`): the operator renders no server section, so replicas in a cluster share Redis only
    through the command line. Unchanged when no URL is given."""
    if not redis_url:
        return config
    s = config.server
    server = s.model_copy(update={"cache_backend": "redis", "redis_url": redis_url,
                                  "limiter": s.limiter.model_copy(update={"backend": "redis"})})
    return config.model_copy(update={"server": server})


def server_settings(raw: str, source: str = "--server-settings") -> dict[str, Any]:
    """`oculis serve --server-settings` (the chart's router.batch / router.flowControl): a JSON object of
    server sections (snake_case or camelCase), checked with the router's own schema; a ValueError naming
    the field, the value and the fix otherwise."""
    import json

    from pydantic import ValidationError

    from oculis.base import format_errors
    from oculis.router import ServerSettings

    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{source}: not JSON ({exc}); give an object such as "
                         '{"batch": {"enabled": true}, "flowControl": {"enabled": true}}') from None
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: {type(doc).__name__} given; give a JSON object of server sections")
    try:
        ServerSettings.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(format_errors(exc, "server").replace("\n", "; ")) from None
    return doc


def with_server_settings(config: RouterConfig, sections: dict[str, Any] | None) -> RouterConfig:
    """The config with each server section named in `sections` replaced by it (the operator renders no
    server section: in a cluster batch and flow control reach the router through the command line).
    Unchanged when none are given."""
    if not sections:
        return config
    from oculis.router import ServerSettings

    part = ServerSettings.model_validate(sections)
    merged = config.server.model_copy(update={name: getattr(part, name) for name in part.model_fields_set})
    server = ServerSettings.model_validate(merged.model_dump())  # the section-spanning checks, again
    return config.model_copy(update={"server": server})


class ConfigHolder:
    def __init__(self, path: Path | None, metrics: Metrics, config: RouterConfig | None = None,
                 wait_for_file: bool = False, redis_url: str | None = None,
                 server: dict[str, Any] | None = None) -> None:
        """`wait_for_file`: a missing file is not an error; serve "not ready" until it appears
        (in a cluster the ConfigMap is rendered once the first InferenceRoute exists).
        `redis_url`: every config loaded shares this Redis (with_shared_redis)."""
        self.path = path
        self.redis_url = redis_url
        self.server = server  # server sections from the command line (with_server_settings)
        self.metrics = metrics
        self._scorers: dict[str, RouteScorer] = {}
        self._heads: dict[Path, tuple[int, int] | None] = {}  # head files of the config in force, by stamp
        self._stores: dict[str, Store] = {}
        # One Redis client (one connection pool) per URL for all the cache stores: a reload that changes
        # a route's cache makes a new store, and a pool per store kept the dropped stores' connections
        # open until they were retired (RETIRE_AFTER_S), one pool more per reload (found by bench/soak.py).
        self._redis_clients: dict[str, Any] = {}
        self._retired: list[tuple[float, Store | Limiter]] = []  # (when dropped, store) by a reload, closed later
        self._limiter: tuple[str, Limiter] | None = None  # kept across reloads with its backend: counts survive
        self.rejected: Rejected | None = None  # the newest file refused, tried again until it applies
        self._unreadable: str | None = None  # the last read error, so a lasting one is logged once
        self.watch_stopped: str | None = None  # why the reload watcher ended, if it did
        if config is None:
            assert path is not None
            waiting = Runtime(RouterConfig.model_construct(upstreams=[], routes=[]), WAITING, {}, {})
            if wait_for_file and not path.exists():
                self.current = waiting
                self._stamp = None
                log.warning("no config at %s yet; not ready until it appears", path)
                return
            raw = path.read_bytes()
            digest = hashlib.sha256(raw).hexdigest()
            if wait_for_file:  # a config whose head files have not landed yet: not ready until it builds
                self.current, self._stamp = waiting, self._stat()
                if not self._try(raw, digest, loud=True):
                    log.warning("not ready until %s builds (retried when a file it reads changes)", path)
                return
            config = self._parse(raw)
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

    def _parse(self, raw: bytes) -> RouterConfig:
        """Every way a file can be unusable is a ConfigError naming it."""
        source = str(self.path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: not UTF-8 text (invalid byte at offset {exc.start}); "
                              "save the file as UTF-8") from None
        try:
            return parse_config(text, source)
        except RecursionError:
            raise ConfigError(f"{source}: nested too deeply to be a configuration") from None

    def _build(self, config: RouterConfig, digest: str) -> Runtime:
        """Built aside and adopted whole: a config that fails half-way leaves nothing behind."""
        config = with_shared_redis(with_server_settings(config, self.server), self.redis_url)
        for i, up in enumerate(config.upstreams):
            if up.tokenizer is not None:
                stamps = tuple(_file_stamp(f) for f in model_tokens.files_read(up.tokenizer))
                try:  # loaded here (again if its files changed), so a pick never waits on it (pick.py)
                    model_tokens.load(up.tokenizer, stamps)
                except ValueError as exc:
                    raise ConfigError(f"upstreams[{i}] ({up.name}).tokenizer: {exc}") from None
        scorers: dict[str, RouteScorer] = {}
        stores: dict[str, Store] = {}
        routes = {}
        config_dir = self.path.parent if self.path else None
        heads: dict[Path, tuple[int, int] | None] = {}
        for route in config.routes:
            skey = f"{route.name}:{route.classifier.model_dump_json()}:{route.tiers!r}:{route.escalation!r}"
            if route.classifier.head_path:  # a replaced head file is a new scorer, like a changed config
                hpath = head_file(route.classifier.head_path, config_dir)
                heads[hpath] = _file_stamp(hpath)
                skey += f":{heads[hpath]}"
            try:
                scorer = scorers.get(skey) or self._scorers.get(skey) or (
                    RouteScorer(route, config_dir) if route.classifier.head_path else RouteScorer(route))
            except ValueError as exc:  # a head file missing or not a head
                raise ConfigError(f"routes[{route.name}].classifier.head_path: {exc}") from None
            scorers[skey] = scorer
            if route.decision_log is not None and (why := sink_problem(route.decision_log.sink)):
                raise ConfigError(f"routes[{route.name}].decision_log.sink: {why}")
            store = None
            if route.cache.enabled:
                ckey = f"{route.name}:{route.cache.model_dump_json()}:{config.server.model_dump_json()}"
                store = stores.get(ckey) or self._stores.get(ckey) or self._new_store(config, route)
                stores[ckey] = store
            routes[route.name] = RouteRuntime(route, scorer, store)
        now = time.monotonic()
        limiter = self._limiter_for(config, now)  # before the swap: a limiter that fails to build must not
        # retire the stores the config in force still uses
        kept = {id(s) for s in stores.values()}
        self._retired += [(now, s) for s in self._stores.values() if id(s) not in kept]
        self._scorers, self._stores = scorers, stores
        self._heads = {**heads, **_tokenizer_stamps(config)}  # a replaced tokenizer is reloaded like a head
        for up in config.upstreams:
            if why := missing_key(up):
                log.warning("%s; requests to it will fail over to the next tier", why)
        for u in config.upstreams:
            # Every upstream's demand series exists at 0 before its first request: Prometheus's increase()
            # reads a series born at 1 as no increase, and that first request is the one that wakes an
            # upstream at zero.
            self.metrics.upstream_demand.labels(u.name)
        self.metrics.route_classifier.clear()
        for route in config.routes:
            self.metrics.route_classifier.labels(route.name, classifier_label(route)).set(1)
        return Runtime(config, digest, routes, {u.name: u for u in config.upstreams}, limiter)

    def _limiter_for(self, config: RouterConfig, now: float) -> Limiter | None:
        """The limiter of this config: the previous one while its backend settings are unchanged (the
        counts of a memory backend live in it), none at all when nothing is limited."""
        s = config.server
        lkey = f"{s.limiter.backend or s.cache_backend}:{s.redis_url}"
        if not limited_anywhere(s, config.routes):
            if self._limiter is not None:
                self._retired.append((now, self._limiter[1]))
            self._limiter = None
            return None
        if self._limiter is not None and self._limiter[0] == lkey:
            limiter = self._limiter[1]
        else:
            limiter = build_limiter(s, self.metrics.registry)  # first: a URL that fails keeps the old one
            if self._limiter is not None:
                self._retired.append((now, self._limiter[1]))
            self._limiter = (lkey, limiter)
        # Settings read per request (on_backend_error) follow the config in force.
        limiter.on_backend_error = s.limiter.on_backend_error
        return limiter

    def _new_store(self, config: RouterConfig, route: Route) -> Store:
        if config.server.cache_backend == "redis":
            url = config.server.redis_url
            assert url
            if url not in self._redis_clients:
                self._redis_clients[url] = new_redis_client(url)
            errors = self.metrics.cache_errors
            return RedisStore(url, route.cache.ttl_seconds, self._redis_clients[url],
                              on_error=lambda op: errors.labels("redis", op).inc())
        return MemoryStore(route.cache.max_entries, route.cache.ttl_seconds)

    def reload(self) -> bool:
        """Re-read the file if it changed (a new write of the same bytes too: it retries a rejected
        one), else retry a rejected file that is due (retry_rejected), else reload replaced head
        files; True when a new config took effect. Raises only OSError (the file could not be read:
        retried on the next tick)."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp or self.path is None:
            return self.retry_rejected() or self._reload_heads()
        too_large = stamp[1] > MAX_CONFIG_BYTES  # not even read
        raw = b"" if too_large else self.path.read_bytes()
        digest = f"too-large:{stamp}" if too_large else hashlib.sha256(raw).hexdigest()
        self._stamp = stamp
        self._unreadable = None
        if digest == self.current.digest:  # written back to the config in force: nothing is pending
            self.rejected = None
            return False
        return self._try(raw, digest, loud=True, too_large=stamp[1] if too_large else None)

    def retry_rejected(self, now: float | None = None) -> bool:
        """Try the rejected file again when a file it reads changed (a head that was missing or bad)
        or `RETRY_REJECTED_S` passed; True when it applied. Said again only if the reason changed."""
        r = self.rejected
        if r is None or r.digest.startswith("too-large:"):  # not read: only a new write can change it
            return False
        now = time.monotonic() if now is None else now
        if all(_file_stamp(p) == st for p, st in r.deps.items()) and now - r.tried_at < RETRY_REJECTED_S:
            return False
        return self._try(r.raw, r.digest, loud=False)

    def _try(self, raw: bytes, digest: str, loud: bool, too_large: int | None = None) -> bool:
        """Build and adopt the config in `raw`; on failure keep it as `rejected` (the previous config
        keeps serving), logged and counted when `loud` (a new write) or when its reason changed."""
        deps: dict[Path, tuple[int, int] | None] = {}
        try:
            if too_large is not None:
                raise ConfigError(f"{self.path}: {too_large} bytes is larger than any configuration "
                                  f"({MAX_CONFIG_BYTES} bytes at most)")
            config = self._parse(raw)
            deps = {**self._head_stamps(config), **_tokenizer_stamps(config)}
            runtime = self._build(config, digest)
        except Exception as exc:  # whatever a file holds, it must not stop the reloads
            reason = str(exc) if isinstance(exc, ConfigError | ValueError) else f"{type(exc).__name__}: {exc}"
            before = self.rejected
            self.rejected = Rejected(digest, raw, reason, deps, time.monotonic())
            if loud or before is None or (before.digest, before.reason) != (digest, reason):
                self.metrics.reloads.labels("rejected").inc()
                log.error("rejected new config %s, %s: %s (tried again when it or a file it reads changes, and "
                          "every %g s)", digest[:12], "still waiting for a config" if self.waiting
                          else "still serving the previous one", reason, RETRY_REJECTED_S)
            return False
        retried = self.rejected is not None and self.rejected.digest == digest
        self.current = runtime
        self.rejected = None
        self.metrics.reloads.labels("applied").inc()
        log.info("applied new config %s%s", digest[:12], " (rejected before)" if retried else "")
        return True

    def _head_stamps(self, config: RouterConfig) -> dict[Path, tuple[int, int] | None]:
        config_dir = self.path.parent if self.path else None
        return {p: _file_stamp(p) for p in (head_file(r.classifier.head_path, config_dir)
                                             for r in config.routes if r.classifier.head_path)}

    def _reload_heads(self) -> bool:
        """The config is unchanged but a route's head file or an upstream's tokenizer was replaced (a new
        `oculis classifier fit`, a ConfigMap update): rebuild the same config. One that does not load is a
        rejection, like a bad config: the previous head or tokenizer keeps serving."""
        if not self._heads or all(_file_stamp(p) == st for p, st in self._heads.items()):
            return False
        stamps = {p: _file_stamp(p) for p in self._heads}
        changed = ", ".join(str(p) for p, st in stamps.items() if st != self._heads[p])
        try:
            runtime = self._build(self.current.config, self.current.digest)
        except Exception as exc:
            self._heads = stamps  # said once per new file, not every tick
            self.metrics.reloads.labels("rejected").inc()
            log.error("rejected replaced file(s) %s, still serving the previous ones: %s", changed, exc)
            return False
        self.current = runtime
        self.metrics.reloads.labels("applied").inc()
        log.info("applied replaced file(s): %s", changed)
        return True

    def tick(self) -> None:
        """One look at the file; never raises."""
        try:
            self.reload()
        except OSError as exc:  # a ConfigMap swap can briefly remove the file
            if str(exc) != self._unreadable:
                log.warning("config file unreadable, keeping the current one: %s", exc)
            self._unreadable = str(exc)
        except Exception:  # a bug here must not end hot reload; said once per tick
            log.exception("config reload failed, keeping the current config")

    async def watch(self, interval: float = 1.0) -> None:
        try:
            while True:
                await asyncio.sleep(interval)
                self.tick()
                await self._close_retired(RETIRE_AFTER_S)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.watch_stopped = f"{type(exc).__name__}: {exc}"
            log.critical("config reload watcher stopped; config changes are ignored until restart: %s",
                         self.watch_stopped)
            raise

    async def _close_retired(self, after: float) -> None:
        now = time.monotonic()
        due = [s for t, s in self._retired if now - t >= after]
        self._retired = [(t, s) for t, s in self._retired if now - t < after]
        for store in due:
            try:
                await store.close()
            except Exception as exc:  # a store that fails to close is only a leak, said once
                log.warning("closing a cache store dropped by a reload failed: %s: %s", type(exc).__name__, exc)

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()
        if self._limiter is not None:
            await self._limiter[1].close()
        await self._close_retired(0)
        for client in self._redis_clients.values():
            await client.aclose()


def _tokenizer_stamps(config: RouterConfig) -> dict[Path, tuple[int, int] | None]:
    """The upstreams' tokenizer paths and the files load reads there: a config refused for a tokenizer
    not mounted yet (in a cluster the operator renders the path without seeing the router's files) is
    tried again on the next tick after it appears, not only every RETRY_REJECTED_S."""
    return {f: _file_stamp(f) for up in config.upstreams if up.tokenizer
            for f in model_tokens.files_read(up.tokenizer)}


def _file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def classifier_label(route: Route) -> str:
    """The classifier a route scores with, by its one name (or the fitted head's file)."""
    if route.classifier.head_path:
        return f"fitted:{Path(route.classifier.head_path).name}"
    return route.classifier.model or DEFAULT_MODEL


def describe(runtime: Runtime) -> list[dict[str, Any]]:
    """`GET /v1/models`: routes first (with the classifier that scores them), then upstreams."""
    out: list[dict[str, Any]] = [{"id": r, "object": "model", "owned_by": "oculis", "kind": "route",
                                  "classifier": classifier_label(rr.route)} for r, rr in runtime.routes.items()]
    out += [{"id": u.name, "object": "model", "owned_by": u.provider, "kind": "upstream", "model": u.model}
            for u in runtime.upstreams.values()]
    # each adapter as a client names it (oculis_router.adapters): <upstream>/<adapter>, its parent the upstream
    out += [{"id": f"{u.name}/{a}", "object": "model", "owned_by": u.provider, "kind": "adapter", "parent": u.name}
            for u in runtime.upstreams.values() for a in u.adapters or []]
    from oculis_router.adapters import route_adapters  # it imports this module

    # <route>/<adapter> is served too (the route's tiers whose upstream has it), so GET /v1/models/{id} finds it
    out += [{"id": f"{r}/{a}", "object": "model", "owned_by": "oculis", "kind": "adapter", "parent": r}
            for r, rr in runtime.routes.items() for a in route_adapters(runtime, rr)]
    return out
