"""Endpoint overrides (`oculis serve --endpoints FILE`): dial an upstream's base_url host at loopback
ports instead of resolving its name.

For a router run on a developer's machine in front of the sandbox cluster (e2e/podstandin.py), where
the in-cluster Service names the operator writes into the router config (`llama-8b-vllm.demo.svc`)
do not resolve and each pod is a local simulator process. The file maps a host to the 127.0.0.1
ports serving it now; it is re-read whenever it changes, so a rolling update moves traffic to the new
pods without a restart. An override only ever yields 127.0.0.1: pod and Service IPs are never dialled.
Hosts the file does not name resolve as usual.

The file's format and its parser are `oculis.endpoint_map`'s (the operator reads the same map). `pods`
names each port's pod: the router's replica picker (pick.py) then sees each pod as its own replica
(without it, each port is one, named HOST:PORT).
"""

from __future__ import annotations

import itertools
import logging
import socket
from pathlib import Path

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from oculis.endpoint_map import EndpointMapError, PodPort, Served, parse

log = logging.getLogger("oculis.router")
LOOPBACK = "127.0.0.1"

EndpointsError = EndpointMapError  # the router's name for it (cli serve, tests)
Pod = PodPort


def ports_of(served: dict[str, Served]) -> dict[str, tuple[int, ...]]:
    """host -> loopback ports (possibly none: the host is known but nothing serves it right now)."""
    return {host: s.ports for host, s in served.items()}


def parse_endpoints(text: str, source: str) -> dict[str, tuple[int, ...]]:
    return ports_of(parse(text, source))


def replicas_of(served: dict[str, Served]) -> dict[str, list[Pod]]:
    """host -> [(pod, port, kv_events)]: its `pods` when they name every port, else each port as HOST:PORT."""
    return {host: list(s.pods) if {p.port for p in s.pods} == set(s.ports)
            else [PodPort(f"{host}:{p}", p, None) for p in s.ports] for host, s in served.items()}


def load_endpoints(path: Path) -> dict[str, Served]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EndpointsError(f"--endpoints {path}: cannot read it ({exc}); give an existing endpoint map") from None
    return parse(text, str(path))


def results(host: str, ports: tuple[int, ...], start: int) -> list[ResolveResult]:
    """Every port, rotated by `start` so new connections spread over the pods as a Service does."""
    order = ports[start % len(ports):] + ports[:start % len(ports)] if ports else ()
    return [ResolveResult(hostname=host, host=LOOPBACK, port=p, family=socket.AF_INET, proto=0,
                          flags=socket.AI_NUMERICHOST) for p in order]


class EndpointResolver(AbstractResolver):
    """aiohttp resolver: hosts in the endpoint map go to 127.0.0.1 ports; the rest to DNS."""

    def __init__(self, path: Path, fallback: AbstractResolver | None = None) -> None:
        self.path = path
        self.fallback = fallback or DefaultResolver()
        self._stamp: tuple[int, int] | None = None
        served = load_endpoints(path)  # a bad file fails at start
        self._table, self._pods = ports_of(served), replicas_of(served)
        self._stamp = self._stat()
        self._rejected: str | None = None
        self._turn = itertools.count()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def table(self) -> dict[str, tuple[int, ...]]:
        """The map in force: re-read on change; a broken rewrite keeps the last good map (said once)."""
        stamp = self._stat()
        if stamp is not None and stamp != self._stamp:
            try:
                served = load_endpoints(self.path)
                self._table, self._pods = ports_of(served), replicas_of(served)
                self._stamp, self._rejected = stamp, None
            except EndpointsError as exc:
                if str(exc) != self._rejected:
                    log.error("endpoint map not applied, keeping the previous one: %s", exc)
                self._rejected = str(exc)
        return self._table

    def pods(self, host: str) -> list[Pod] | None:
        """The (pod, loopback port, kv_events) serving `host` now; None when the map does not name it."""
        self.table()
        return self._pods.get(host.lower().rstrip("."))

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        table = self.table()
        key = host.lower().rstrip(".")
        if key not in table:
            return await self.fallback.resolve(host, port, family)
        if not table[key]:
            raise OSError(f"{host}: no pod serves it now (endpoint map {self.path})")
        return results(host, table[key], next(self._turn))

    async def close(self) -> None:
        await self.fallback.close()
