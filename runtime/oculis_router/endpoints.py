"""Endpoint overrides (`oculis serve --endpoints FILE`): dial an upstream's base_url host at loopback
ports instead of resolving its name.

For a router run on a developer's machine in front of the sandbox cluster (e2e/podstandin.py), where
the in-cluster Service names the operator writes into the router config (`llama-8b-vllm.demo.svc`)
do not resolve and each pod is a local simulator process. The file maps a host to the 127.0.0.1
ports serving it now; it is re-read whenever it changes, so a rolling update moves traffic to the new
pods without a restart. An override only ever yields 127.0.0.1: pod and Service IPs are never dialled.
Hosts the file does not name resolve as usual.

File (JSON or YAML): `{HOST: {ports: [PORT, ...], ...}}`; other keys (upstream, namespace) are notes.
"""

from __future__ import annotations

import itertools
import logging
import socket
from pathlib import Path
from typing import Any

import yaml
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

log = logging.getLogger("oculis.router")
LOOPBACK = "127.0.0.1"


class EndpointsError(ValueError):
    """One line naming the file, the field, the value and the fix."""


def parse_endpoints(text: str, source: str) -> dict[str, tuple[int, ...]]:
    """host -> loopback ports (possibly none: the host is known but nothing serves it right now)."""
    try:
        doc: Any = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise EndpointsError(f"{source}: not YAML or JSON ({str(exc).splitlines()[0]}); fix the file") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise EndpointsError(f"{source}: must be a mapping of host -> {{ports: [...]}}, not a "
                             f"{type(doc).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for host, entry in doc.items():
        ports = entry.get("ports") if isinstance(entry, dict) else None
        if not isinstance(host, str) or not host or not isinstance(ports, list):
            raise EndpointsError(f"{source}: {host!r}: each entry must be {{ports: [PORT, ...]}}, got {entry!r}")
        for i, port in enumerate(ports):
            if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                raise EndpointsError(f"{source}: {host}.ports[{i}]={port!r} is not a port; give 1-65535")
        out[host.lower().rstrip(".")] = tuple(ports)
    return out


def load_endpoints(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EndpointsError(f"--endpoints {path}: cannot read it ({exc}); give an existing endpoint map") from None
    return parse_endpoints(text, str(path))


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
        self._table: dict[str, tuple[int, ...]] = load_endpoints(path)  # a bad file fails at start
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
                self._table = load_endpoints(self.path)
                self._stamp, self._rejected = stamp, None
            except EndpointsError as exc:
                if str(exc) != self._rejected:
                    log.error("endpoint map not applied, keeping the previous one: %s", exc)
                self._rejected = str(exc)
        return self._table

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
