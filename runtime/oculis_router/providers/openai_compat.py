"""OpenAI-compatible upstreams (vLLM, OpenAI, any /v1 server): the request passes through with the
upstream's model id; streams are relayed byte for byte. Stable-first message order is kept as sent,
which is all OpenAI's automatic prompt caching needs."""

from __future__ import annotations

from typing import Any

from oculis import Upstream
from oculis_router.flowcontrol.standing import REQUEST_PRIORITY, engine_priority
from oculis_router.upstream_keys import key_of

PATHS = {"chat": "/chat/completions", "completions": "/completions"}


def build_request(up: Upstream, endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
    headers = {"content-type": "application/json"}
    key = key_of(up)
    if key:
        headers["authorization"] = f"Bearer {key}"
    out = dict(body)
    if up.model:
        out["model"] = up.model
    if up.priority_scheduling:  # the router's priority, never the client's own field: no queue jumping
        out.pop("priority", None)
        if (priority := REQUEST_PRIORITY.get()) is not None:
            out["priority"] = engine_priority(priority)
    opts = out.get("stream_options", {})
    if out.get("stream") and isinstance(opts, dict):
        # Always, whatever the client asked: a stream is metered (tokens, cost, budgets) by its usage
        # chunk; the relay strips that chunk again for a client that did not ask for it.
        out["stream_options"] = {**opts, "include_usage": True}
    return up.url + PATHS[endpoint], headers, out


def parse_response(endpoint: str, data: dict[str, Any]) -> dict[str, Any]:
    return data
