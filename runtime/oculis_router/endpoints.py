"""Endpoint overrides (`oculis serve --endpoints FILE`): dial an upstream's base_url host at loopback
ports instead of resolving its name.

For a router run on a developer's machine in front of the sandbox cluster (e2e/podstandin.py), where
the in-cluster Service names the operator writes into the router config (`llama-8b-vllm.demo.svc`)
do not resolve and each pod is a local simulator process. The file maps a host to the 127.0.0.1
ports serving it now; it is re-read whenever it changes, so a rolling update moves traffic to the new
pods without a restart. An override only ever yields 127.0.0.1: pod and Service IPs are never dialled.
Hosts the file does not name resolve as usual.

File (JSON or YAML): `{HOST: {ports: [PORT, ...], pods: [{pod: NAME, port: PORT}, ...]}}`; other keys
(upstream, namespace) are notes. `pods` names each port's pod: the router's replica picker (pick.py)
then sees each pod as its own replica (without it, each port is one, named HOST:PORT).
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


Pod = tuple[str, int, str | None]  # name, loopback port, its KV-event publisher (tcp://127.0.0.1:PORT) if any


def pods_of(text: str, ports: dict[str, tuple[int, ...]]) -> dict[str, list[Pod]]:
    """host -> [(pod, port, kv_events)] of a map `parse_endpoints` accepted: its `pods` entries naming
    one of the host's ports, else each port as HOST:PORT."""
    try:  # read again: a rewrite in between is another valid map (written atomically), or nothing
        doc: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        doc = {}
    entries = {str(h).lower().rstrip("."): e for h, e in doc.items()} if isinstance(doc, dict) else {}
    out: dict[str, list[Pod]] = {}
    for key, served in ports.items():
        entry = entries.get(key)
        listed = entry.get("pods") if isinstance(entry, dict) else None
        named: list[Pod] = [(str(p["pod"]), p["port"], p["kv_events"] if isinstance(p.get("kv_events"), str) else None)
                            for p in listed if isinstance(p, dict) and p.get("pod") and p.get("port") in served] \
            if isinstance(listed, list) else []
        out[key] = named if {n[1] for n in named} == set(served) else [(f"{key}:{p}", p, None) for p in served]
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
        self._pods: dict[str, list[Pod]]
        self._pods = pods_of(path.read_text(encoding="utf-8"), self._table)
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
                table = load_endpoints(self.path)
                self._pods = pods_of(self.path.read_text(encoding="utf-8"), table)
                self._table, self._stamp, self._rejected = table, stamp, None
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
