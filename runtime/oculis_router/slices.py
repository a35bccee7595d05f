"""In a cluster: the Ready pods behind each self-hosted upstream's Service, from its EndpointSlices,
watched over plain HTTPS with the router's ServiceAccount (no Kubernetes client in the router image).

Why a watch and not a headless Service's DNS: a watch event arrives within a fraction of a second of
a pod turning Ready or starting to terminate, while DNS answers are cached (CoreDNS serves the
kubernetes zone with a 5 s TTL, node-local caches add theirs), so "a candidate within 2 s of Ready"
and "no new request to a terminating pod" cannot be promised through DNS; the slice also names the
pod (the replica's identity in metrics and the decision log) and says `ready`, `serving` and
`terminating` separately. The cost is RBAC: `list` and `watch` on `endpointslices` in the upstreams'
namespace (the chart's router Role), nothing else.

An upstream's base_url names its Service as `http://SERVICE.NAMESPACE.svc[.cluster.local]:PORT/v1`
(what the operator renders); each endpoint whose `conditions.ready` is true is a replica at
`http://ADDRESS:PORT/v1`. A terminating pod's endpoint turns not ready: the pick drains it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from oculis.router_upstream import KV_EVENTS_PORT
from oculis_router.pick import Replica
from oculis_router.replicas import at_address

log = logging.getLogger("oculis.router")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_LABEL = "kubernetes.io/service-name"
RETRY_S = 2.0


def service_of(base_url: str) -> tuple[str, str] | None:
    """(namespace, service) a cluster-local base_url names, else None (an outside URL)."""
    labels = (urlsplit(base_url).hostname or "").split(".")
    if len(labels) >= 3 and labels[2] == "svc":
        return labels[1], labels[0]
    return None


def ready_endpoints(slice_: dict[str, Any]) -> list[tuple[str, str]]:
    """(pod name, address) of each ready endpoint of one EndpointSlice."""
    out = []
    for ep in slice_.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        addrs = ep.get("addresses") or []
        if cond.get("ready") is False or cond.get("terminating") or not addrs:
            continue
        pod = (ep.get("targetRef") or {}).get("name") or addrs[0]
        out.append((pod, addrs[0]))
    return out


def slice_port(slice_: dict[str, Any], wanted: int | None) -> int | None:
    ports = [p for p in slice_.get("ports") or [] if isinstance(p.get("port"), int)]
    for p in ports:
        if p.get("name") == "http" or p["port"] == wanted:
            return int(p["port"])
    return int(ports[0]["port"]) if ports else None


class SliceWatch:
    """EndpointSlices of the namespaces the config's upstreams live in, kept by list + watch."""

    def __init__(self, http: aiohttp.ClientSession, api: str, token_file: Path, ca_file: Path | None) -> None:
        self.http, self.api, self.token_file = http, api.rstrip("/"), token_file
        self.ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self.slices: dict[str, dict[str, dict[str, Any]]] = {}  # namespace -> slice name -> slice
        self.synced: set[str] = set()  # namespaces listed at least once
        self.wanted: set[str] = set()
        self._kick = asyncio.Event()

    def replicas(self, base_url: str, revision: str) -> list[Replica] | None:
        """The Service's ready pods as replicas; None for an outside URL or before the first list
        (then the base_url is called, as without discovery)."""
        svc = service_of(base_url)
        if svc is None:
            return None
        ns, name = svc
        if ns not in self.wanted:
            self.wanted.add(ns)
            self._kick.set()
        if ns not in self.synced:
            return None
        parts = urlsplit(base_url)
        out = []
        for s in self.slices.get(ns, {}).values():
            if (s.get("metadata", {}).get("labels") or {}).get(SERVICE_LABEL) != name:
                continue
            port = slice_port(s, parts.port)
            if port is None:
                continue
            out += [Replica(pod, at_address(base_url, addr, port).rstrip("/"), revision,
                            f"tcp://{addr}:{KV_EVENTS_PORT}") for pod, addr in ready_endpoints(s)]
        return out

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}  # re-read: tokens rotate

    async def run(self) -> None:
        watching: dict[str, asyncio.Task[None]] = {}
        while True:
            for ns in self.wanted - watching.keys():
                watching[ns] = asyncio.create_task(self._follow(ns))
            self._kick.clear()
            await self._kick.wait()

    async def _follow(self, ns: str) -> None:
        url = f"{self.api}/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
        said: str | None = None
        while True:
            try:
                async with self.http.get(url, headers=self._headers(), ssl=self.ssl) as resp:
                    if resp.status != 200:
                        raise OSError(f"list {url}: status {resp.status} ({(await resp.text())[:200]})")
                    doc = await resp.json()
                self.slices[ns] = {s["metadata"]["name"]: s for s in doc.get("items") or []}
                self.synced.add(ns)
                said = None
                await self._watch(url, ns, doc["metadata"]["resourceVersion"])
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as exc:
                if str(exc) != said:  # once per cause; the last slices keep serving meanwhile
                    log.warning("EndpointSlices of namespace %s: %s; retrying every %g s (check the router's "
                                "Role: list/watch endpointslices)", ns, exc, RETRY_S)
                said = str(exc)
                await asyncio.sleep(RETRY_S)

    async def _watch(self, url: str, ns: str, version: str) -> None:
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
        async with self.http.get(url, params=params, headers=self._headers(), ssl=self.ssl,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=330)) as resp:
            if resp.status != 200:
                raise OSError(f"watch {url}: status {resp.status}")
            buf = b""
            async for chunk in resp.content.iter_any():  # one JSON event per line, of any length
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip() and not self._apply(ns, json.loads(line)):
                        return

    def _apply(self, ns: str, event: dict[str, Any]) -> bool:
        """One watch event applied; False when the watch must start over (410 Gone: list again)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            return False
        name = (obj.get("metadata") or {}).get("name")
        if kind in ("ADDED", "MODIFIED") and name:
            self.slices.setdefault(ns, {})[name] = obj
        elif kind == "DELETED" and name:
            self.slices.get(ns, {}).pop(name, None)
        return True


def slice_watch(http: aiohttp.ClientSession) -> SliceWatch | None:
    """The watch when running in a cluster (the ServiceAccount's token is mounted), else None.
    `OCULIS_KUBE_API`, `OCULIS_KUBE_TOKEN_FILE` and `OCULIS_KUBE_CA_FILE` point it elsewhere (tests)."""
    api = os.environ.get("OCULIS_KUBE_API")
    token = Path(os.environ.get("OCULIS_KUBE_TOKEN_FILE", SA_DIR / "token"))
    ca: Path | None = Path(os.environ.get("OCULIS_KUBE_CA_FILE", SA_DIR / "ca.crt"))
    if api is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not token.exists():
            return None
        api = f"https://{host}:{port}"
    if ca is not None and not ca.exists():
        ca = None
    return SliceWatch(http, api, token, ca)
