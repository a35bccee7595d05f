"""The sandbox's endpoint map: which 127.0.0.1 ports serve each in-cluster host now, and which pod each is.

The pod stand-in (e2e/podstandin.py) writes it, atomically, on every pod change. Two readers: the router
(`oculis serve --endpoints FILE`) dials a Service's pods at these ports instead of resolving its name,
and the operator (OCULIS_ENGINE_ENDPOINTS) reaches each pod's engine API to load LoRA adapters. One
parser for both, here in the schema package both images carry.

File (JSON or YAML): `{HOST: {ports: [PORT, ...], namespace: NS, pods: [{pod: NAME, port: PORT,
kv_events: tcp://127.0.0.1:PORT}, ...]}}`; other keys (upstream, pid) are notes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import yaml


class EndpointMapError(ValueError):
    """One line naming the file, the field, the value and the fix."""


class PodPort(NamedTuple):
    pod: str
    port: int
    kv_events: str | None  # its KV-event publisher (tcp://127.0.0.1:PORT), if any


class Served(NamedTuple):
    namespace: str
    ports: tuple[int, ...]  # possibly none: the host is known but nothing serves it right now
    pods: tuple[PodPort, ...]  # the listed pods whose port is one of `ports`


def parse(text: str, source: str) -> dict[str, Served]:
    """host (lowercase, no trailing dot) -> what serves it; a malformed map is refused whole."""
    try:
        doc: Any = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise EndpointMapError(f"{source}: not YAML or JSON ({str(exc).splitlines()[0]}); fix the file") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise EndpointMapError(f"{source}: must be a mapping of host -> {{ports: [...]}}, not a "
                               f"{type(doc).__name__}")
    out: dict[str, Served] = {}
    for host, entry in doc.items():
        ports = entry.get("ports") if isinstance(entry, dict) else None
        if not isinstance(host, str) or not host or not isinstance(ports, list):
            raise EndpointMapError(f"{source}: {host!r}: each entry must be {{ports: [PORT, ...]}}, got {entry!r}")
        for i, port in enumerate(ports):
            if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                raise EndpointMapError(f"{source}: {host}.ports[{i}]={port!r} is not a port; give 1-65535")
        listed = entry.get("pods")
        pods = tuple(PodPort(str(p["pod"]), p["port"], p["kv_events"] if isinstance(p.get("kv_events"), str) else None)
                     for p in (listed if isinstance(listed, list) else ())
                     if isinstance(p, dict) and p.get("pod") and p.get("port") in ports)
        out[host.lower().rstrip(".")] = Served(str(entry.get("namespace", "")), tuple(ports), pods)
    return out
