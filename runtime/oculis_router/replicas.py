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
still steers the pick. For an upstream that declares LoRA adapters, each replica's `/v1/models` is read
every `MODELS_S` (and as soon as it joins): the adapters its engine lists (entries with a `parent`) are
the ones it can serve; `vllm:lora_requests_info` (its latest label set) says which run and wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from oculis import RouterConfig, Upstream
from oculis.router_upstream import EXTERNAL_PROVIDERS
from oculis_router.endpoints import LOOPBACK, EndpointResolver
from oculis_router.pick import Fleet, Replica
from oculis_router.picking import LoraSlots, slots_from_labels
from oculis_router.upstream_keys import read_key

log = logging.getLogger("oculis.router")
SYNC_S = 0.25
SCRAPE_S = 1.0
SCRAPE_TIMEOUT_S = 0.8
MODELS_S = 5.0  # how often a replica's adapter list (/v1/models) is re-read: adapters change rarely
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
    for up in config.upstreams:  # its replicas' /v1/models say which adapters each one serves
        for r in out.get(up.name, ("", []))[1]:
            r.serves_adapters, r.api_key_env, r.api_key_file = bool(up.adapters), up.api_key_env, up.api_key_file
    return out


def engine_figures(text: str) -> tuple[dict[str, float], int | None, int | None, LoraSlots | None]:
    """(gauges waiting/running/kv_usage, block_size, num_gpu_blocks, LoRA slots) from a vLLM /metrics page;
    sums over the engine's label sets (one per served model name or data-parallel rank). The LoRA slots
    are `vllm:lora_requests_info`'s latest label set (vLLM keeps every set it has shown, each valued at the
    time it last held); None without it (no --enable-lora)."""
    names = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
             "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage"}
    gauges: dict[str, float] = {}
    block_size = blocks = None
    lora: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = names.get(s.name)
            if key == "kv_usage":  # a share: the fullest engine's, not a sum
                gauges[key] = max(gauges.get(key, 0.0), s.value)
            elif key is not None:
                gauges[key] = gauges.get(key, 0.0) + s.value
            elif s.name == "vllm:lora_requests_info" and (lora is None or s.value > lora[0]):
                lora = (s.value, s.labels)
            elif s.name == "vllm:cache_config_info" and block_size is None:
                try:
                    block_size = int(s.labels.get("block_size", ""))
                    blocks = int(s.labels.get("num_gpu_blocks", ""))
                except ValueError:
                    pass
    return gauges, block_size, blocks, None if lora is None else slots_from_labels(lora[1])


def listed_adapters(payload: Any) -> frozenset[str]:
    """The LoRA adapters a vLLM /v1/models answer lists: its entries with a `parent` (the base model's
    have none). Raises ValueError for an answer that is no model list."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("not a model list")
    return frozenset(str(m["id"]) for m in data if isinstance(m, dict) and m.get("parent") and m.get("id"))


def metrics_url(base_url: str) -> str:
    """A replica's /metrics: vLLM serves it at the root, beside /v1."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/metrics", "", ""))


async def scrape(http: aiohttp.ClientSession, r: Replica) -> bool:
    """Read r's engine gauges; whether its engine answered at all (the endpoint picker's probe: a replica
    that does not answer is not picked)."""
    try:
        async with http.get(metrics_url(r.url), timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return True  # it answered (a /metrics off or guarded is no sign of a dead engine)
            text = await resp.text()
        gauges, block_size, blocks, lora = engine_figures(text)
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return False  # keep the last figures; the in-flight count still steers
    except ValueError:
        return True  # answered, with a page that is not Prometheus text
    r.gauges = gauges
    r.scraped_in_flight = r.in_flight  # the gauges' excess over it is load this router did not send
    if block_size:
        r.block_size, r.kv_blocks = block_size, blocks
    if lora is not None:
        r.lora_slots = lora
    now = time.monotonic()
    if r.serves_adapters and (r.adapters is None or now - r.models_read_at >= MODELS_S):
        await read_adapters(http, r, now)
    return True


async def read_adapters(http: aiohttp.ClientSession, r: Replica, now: float) -> None:
    """The adapters r's engine lists (its /v1/models); a failed read keeps the last list."""
    key = read_key(r.api_key_env, r.api_key_file)  # never logged
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with http.get(f"{r.url}/models", headers=headers,
                            timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return
            payload = await resp.json(content_type=None)
        r.adapters, r.models_read_at = listed_adapters(payload), now
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError):
        return


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
