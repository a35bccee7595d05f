"""Where the replicas of each self-hosted upstream are (kept current in `pick.Fleet`), and what their
engines say about their load (each replica's /metrics, scraped).

Sources, per upstream and revision, the first that applies:
1. the config's `endpoints` (outside Kubernetes: the replicas of one model, listed);
2. the endpoint map (`oculis serve --endpoints`, the sandbox): the base_url's host -> its pods and
   their loopback ports, each pod its own replica;
3. in a cluster, the EndpointSlices of the base_url's Service (`slices.py`, a watch over HTTPS with
   the router's ServiceAccount): each Ready, non-terminating endpoint is a replica, named by its pod.
An upstream with none of them is called at its base_url (its Service), as before.

The set is re-read every `SYNC_S` (a pod is a candidate well within 2 s of Ready); the engines'
gauges every `SCRAPE_S`. A scrape that fails keeps the last figures: the router's own in-flight count
still steers the pick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from oculis import RouterConfig, Upstream
from oculis.router import EXTERNAL_PROVIDERS
from oculis_router.endpoints import LOOPBACK, EndpointResolver
from oculis_router.pick import Fleet, Replica

log = logging.getLogger("oculis.router")
SYNC_S = 0.25
SCRAPE_S = 1.0
SCRAPE_TIMEOUT_S = 0.8
Found = dict[str, tuple[str, list[Replica]]]  # upstream -> (picker strategy, its replicas now)


class SliceSource(Protocol):
    def replicas(self, base_url: str, revision: str) -> list[Replica] | None: ...


def at_address(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced (scheme and path kept)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, parts.fragment))


def revision_urls(up: Upstream) -> list[tuple[str, str]]:
    out = [("stable", up.base_url)] if up.base_url else []
    if up.canary is not None:
        out.append(("canary", up.canary.base_url))
    return out


def found(config: RouterConfig, resolver: EndpointResolver | None, slices: SliceSource | None) -> Found:
    """Each self-hosted upstream's replicas now, from the first source that knows them."""
    out: Found = {}
    for up in config.upstreams:
        if up.provider in EXTERNAL_PROVIDERS:
            continue
        if up.endpoints:
            out[up.name] = (up.picker_name, [Replica(e.url, e.url.rstrip("/"), "stable", e.kv_events)
                                             for e in up.replica_endpoints])
            continue
        reps: list[Replica] = []
        known = False
        for rev, url in revision_urls(up):
            host = urlsplit(url).hostname or ""
            pods = resolver.pods(host) if resolver is not None else None
            if pods is not None:
                known = True
                reps += [Replica(pod, at_address(url, LOOPBACK, port).rstrip("/"), rev, events)
                         for pod, port, events in pods]
            elif slices is not None and (listed := slices.replicas(url, rev)) is not None:
                known = True
                reps += listed
        if known:
            out[up.name] = (up.picker_name, reps)
    return out


def engine_figures(text: str) -> tuple[dict[str, float], int | None, int | None]:
    """(gauges waiting/running/kv_usage, block_size, num_gpu_blocks) from a vLLM /metrics page; sums
    over the engine's label sets (one per served model name or data-parallel rank)."""
    names = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
             "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage"}
    gauges: dict[str, float] = {}
    block_size = blocks = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = names.get(s.name)
            if key == "kv_usage":  # a share: the fullest engine's, not a sum
                gauges[key] = max(gauges.get(key, 0.0), s.value)
            elif key is not None:
                gauges[key] = gauges.get(key, 0.0) + s.value
            elif s.name == "vllm:cache_config_info" and block_size is None:
                try:
                    block_size = int(s.labels.get("block_size", ""))
                    blocks = int(s.labels.get("num_gpu_blocks", ""))
                except ValueError:
                    pass
    return gauges, block_size, blocks


def metrics_url(base_url: str) -> str:
    """A replica's /metrics: vLLM serves it at the root, beside /v1."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/metrics", "", ""))


async def scrape(http: aiohttp.ClientSession, r: Replica) -> None:
    try:
        async with http.get(metrics_url(r.url), timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return
            text = await resp.text()
        gauges, block_size, blocks = engine_figures(text)
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError):
        return  # keep the last figures; the in-flight count still steers
    r.gauges = gauges
    if block_size:
        r.block_size, r.kv_blocks = block_size, blocks


async def keep_synced(fleet: Fleet, config: Callable[[], RouterConfig], resolver: EndpointResolver | None,
                      slices: SliceSource | None, on_sync: Callable[[], Any] | None = None) -> None:
    """Follow the replica sources for as long as the router runs."""
    failing: str | None = None
    while True:
        try:
            fleet.sync(found(config(), resolver, slices))
            if on_sync is not None:
                on_sync()
            failing = None
        except Exception as exc:  # a source's bad data must not end the loop: logged once per cause
            if str(exc) != failing:
                log.exception("replica discovery failed (keeping the last replicas): %s", exc)
            failing = str(exc)
        await asyncio.sleep(SYNC_S)


async def keep_scraping(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    while True:
        replicas = [r for pool in list(fleet.pools.values()) for r in list(pool.replicas.values())]
        if replicas:
            await asyncio.gather(*(scrape(http, r) for r in replicas))
        await asyncio.sleep(SCRAPE_S)
