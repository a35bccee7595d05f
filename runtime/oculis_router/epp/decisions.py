"""The endpoint picker's decisions, pure: what a request is, which replicas may serve it, how the pick
is written back (a single `ip:port` or an ordered fallback list), and when to shed. No gRPC here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from oculis_router import strictjson
from oculis_router.errors import APIError, bad_request
from oculis_router.inbound import check_body

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
Endpoint = Literal["chat", "completions"]


def endpoint_of(path: str) -> Endpoint | None:
    """Which OpenAI endpoint a request path names (its query string ignored); None: any other path, whose
    body (if any) the picker passes through untouched."""
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith("/chat/completions"):
        return "chat"
    if p.endswith("/completions"):
        return "completions"
    return None


def too_large(size: int, limit: int, declared: bool = False) -> APIError:
    """The router's 413 (inbound.read_body), word for word where it can be."""
    what = f"request body of {size} bytes exceeds" if declared else "request body exceeds"
    return APIError(413, f"{what} the limit of {limit} bytes (server.max_body_bytes)", code="request_too_large")


def parse_body(raw: bytes, endpoint: Endpoint, max_messages: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the body as sent, the body as the router checks it) or the router's OpenAI-shaped 400: not JSON,
    not an object, no `model`, no `messages` (chat) or `prompt` (completions)."""
    try:
        body = strictjson.loads(raw, "the request body")
    except ValueError as exc:
        raise bad_request(str(exc), code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body, check_body(body, endpoint, max_messages)


def address_of(url: str) -> str:
    """A replica's `ip:port` (what the proxy dials) from its base URL."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowed(addresses: Mapping[str, str], up: Iterable[str], subset: Sequence[str] | None) -> set[str]:
    """The replica ids that may serve: reachable (`up`) and, when the proxy sent a subset hint, listed in
    it (by `ip:port`). `addresses`: replica id -> its ip:port."""
    ok = set(up) & set(addresses)
    if subset is not None:
        wanted = set(subset)
        ok = {rid for rid in ok if addresses[rid] in wanted}
    return ok


def fallback_order(picked: str, others: Iterable[tuple[str, float]], count: int) -> list[str]:
    """The destination list: the pick first, then up to `count` other replicas, least loaded first
    (`others`: (address, load) pairs); the proxy walks it in order on retries."""
    rest = [a for a, _ in sorted(others, key=lambda o: (o[1], o[0])) if a != picked]
    return [picked, *rest[:max(0, count)]]


def shed(waiting: Iterable[float], max_waiting: float | None) -> bool:
    """Whether to refuse with 429: every candidate replica already has `max_waiting` or more requests
    waiting in its engine queue (None: never shed)."""
    if max_waiting is None:
        return False
    queues = list(waiting)
    return bool(queues) and min(queues) >= max_waiting


def no_replica(target: str, subset: Sequence[str] | None, known: int) -> APIError:
    """503 when nothing may serve, saying why."""
    if subset is not None:
        why = (f"none of the {len(subset)} endpoints of the proxy's subset hint ({', '.join(subset[:8]) or 'empty'}) "
               f"is a reachable replica of {target}")
    elif known:
        why = f"none of the {known} replicas of {target} is reachable; they are probed every second"
    else:
        why = f"{target} has no replica (its endpoints, endpoint map or EndpointSlices list none)"
    return APIError(503, f"no replica can take this request: {why}; retry shortly", type_="service_unavailable",
                    code="no_replica", headers={"retry-after": "1"})


def shedding(target: str, max_waiting: float) -> APIError:
    return APIError(429, f"every replica of {target} has {max_waiting:g} or more requests waiting (oculis epp "
                    "--shed-waiting); retry after Retry-After", type_="rate_limit_exceeded", code="overloaded",
                    headers={"retry-after": "1"})


@dataclass(frozen=True)
class Answer:
    """What the picker tells the proxy for one request: where to send it, the headers to set, and the body
    to forward (None: unchanged)."""

    destinations: list[str]
    headers: dict[str, str]
    body: bytes | None = None

    @property
    def value(self) -> str:
        """The header and the `envoy.lb` metadata entry: identical, as the protocol requires."""
        return ",".join(self.destinations)
